//! A holder's asks to the members of its lock (F3, F5): one round of
//! `POST /v1/failsafe/{lock}`, to every member at once.
//!
//! During a store outage a failsafe holder keeps its licence on grants:
//! in every round it asks every member of the lock's failsafe set
//! directly, over the members' `--http` listeners, beside the round's store
//! renewal and with the same deadline (the store timeout, 2R/5: 40 ms at
//! R = 100 ms). The licence is extended by that round only when every
//! member granted — the core decides that, from the verdicts [`Asker`]
//! gives it, one per member, in the order of the members it was given.
//!
//! A member counts as granting ([`Verdict::Granted`]) only on an answer
//! that verifies under the shared key ([`super::auth`]) and repeats, field
//! for field, the very ask sent to it in this round: the lock, this
//! holder's node, machine and instance, the token, the round and the
//! member itself. A member's grant is worth a store renewal only for what
//! it names, so an answer to any other ask proves nothing about this one:
//! an old grant replayed names an old round, a grant another member gave
//! names that member, and both land in [`Verdict::Forged`] with what
//! differs. Anything else — a refusal and its signed why, a member that
//! does not answer by the deadline, one that cannot be reached, one that
//! rejects the ask with an HTTP error (401: the keys differ; 404: it runs
//! another lock or no failsafe; 409: it is another member; 503: its state
//! machine did not answer), an answer that is not a signed one — is a
//! verdict "not granted", never an error of the round: a round in which
//! one member did not grant simply extends nothing (F3), and the holder's
//! licence runs out as it would without failsafe.
//!
//! The asks go out concurrently, within one deadline for the round
//! (connect, send and the whole answer): a member that hangs costs the
//! round its deadline, no more, and spoils no other member's verdict. No
//! task is spawned: the asks are futures of the round's own, so a round
//! dropped by its caller drops its connections with it.
//!
//! HTTP/1.1 over plain TCP (TCP_NODELAY: an ask is one small write that
//! must not wait for an acknowledgement), `http://` only: nothing in an
//! ask or an answer is secret and the MAC protects both (the design's
//! mutual-TLS alternative to the key is not built); any other scheme is a
//! verdict "not granted" at once. An answer is read up to
//! [`MAX_ANSWER_BYTES`].

use std::fmt;
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::auth::{Answer, Ask, FailsafeKey, Holder, Peer, SignedAnswer};

/// The largest answer read: a signed answer is a few hundred bytes (its
/// ask, the member's why and a MAC); anything longer is not one.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A member to ask, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The member as the failsafe set names it; its ask names it so.
    pub member: Peer,
    /// Its endpoint in full: `http://10.0.0.2:8008/v1/failsafe/svc`.
    pub url: String,
}

/// What one member's answer to one ask comes to. Only [`Verdict::Granted`]
/// counts towards an extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A verified grant of exactly the ask sent.
    Granted,
    /// A verified refusal of exactly the ask sent, and the member's why.
    Refused(String),
    /// No answer: the member could not be connected to, the connection
    /// failed, or the round's deadline passed first.
    Unreachable(String),
    /// The member answered the ask with an HTTP error: its status and the
    /// error it gave.
    Rejected(u16, String),
    /// An answer that proves nothing about this ask: not a signed answer,
    /// one whose MAC does not verify under the key, or one to another ask
    /// (another round, member, token, holder or lock) — a replayed old
    /// grant lands here.
    Forged(String),
}

impl Verdict {
    /// Whether the member granted this very ask.
    pub fn is_grant(&self) -> bool {
        matches!(self, Verdict::Granted)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Granted => f.write_str("granted"),
            Verdict::Refused(why) => write!(f, "refused: {why}"),
            Verdict::Unreachable(why) => write!(f, "unreachable: {why}"),
            Verdict::Rejected(status, error) => write!(f, "rejected the ask ({status}): {error}"),
            Verdict::Forged(why) => write!(f, "no valid answer: {why}"),
        }
    }
}

/// A holder's side of failsafe: signs its asks and judges the answers.
#[derive(Clone, Debug)]
pub struct Asker {
    key: FailsafeKey,
    lock: String,
    holder: Holder,
}

impl Asker {
    /// An asker for `lock`, asking as `holder` under `key`.
    pub fn new(key: FailsafeKey, lock: String, holder: Holder) -> Asker {
        Asker { key, lock, holder }
    }

    /// Asks every one of `targets` for a grant of `round` at `token`, all
    /// at once, and waits at most `within` for the lot. One verdict per
    /// target, in the order of `targets`.
    pub async fn ask_round(
        &self,
        token: &str,
        round: u64,
        targets: &[Target],
        within: Duration,
    ) -> Vec<(Peer, Verdict)> {
        // One deadline for the round, not one per ask from whenever it
        // happens to be polled first.
        let deadline = tokio::time::Instant::now() + within;
        let asks = targets.iter().map(|target| {
            let ask = Ask {
                lock: self.lock.clone(),
                holder: self.holder.clone(),
                token: token.to_string(),
                round,
                member: target.member.clone(),
            };
            async move {
                let verdict = tokio::time::timeout_at(deadline, self.ask(&target.url, &ask))
                    .await
                    .unwrap_or_else(|_| {
                        Verdict::Unreachable(format!("no answer within {within:?}"))
                    });
                (target.member.clone(), verdict)
            }
        });
        futures::future::join_all(asks).await
    }

    /// Sends `ask`, signed, to `url` and judges the answer.
    async fn ask(&self, url: &str, ask: &Ask) -> Verdict {
        let endpoint = match Endpoint::parse(url) {
            Ok(endpoint) => endpoint,
            Err(why) => return Verdict::Unreachable(why),
        };
        let body = match serde_json::to_vec(&self.key.sign_ask(ask)) {
            Ok(body) => body,
            Err(e) => return Verdict::Unreachable(format!("encoding the ask: {e}")),
        };
        match exchange(&endpoint, body).await {
            Ok((status, body)) => judge(&self.key, ask, status, body),
            Err(why) => Verdict::Unreachable(why),
        }
    }
}

/// Where an endpoint's URL says to connect, and what to send it.
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    /// The host to connect to, an IPv6 address without its brackets.
    host: String,
    port: u16,
    /// The `Host` header: the host as the URL spells it, and its port.
    authority: String,
    /// The request's target: the URL's path and query.
    path: String,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "{url}: a member is asked over http://, not {other}://"
                ))
            }
            None => {
                return Err(format!(
                    "{url:?} is not a URL (http://HOST:PORT/v1/failsafe/LOCK)"
                ))
            }
        }
        let Some(authority) = uri.authority() else {
            return Err(format!("{url:?} names no host"));
        };
        let spelled = authority.host();
        let host = spelled
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(spelled);
        let port = authority.port_u16().unwrap_or(80);
        Ok(Endpoint {
            host: host.to_string(),
            port,
            authority: match authority.port() {
                Some(port) => format!("{spelled}:{port}"),
                None => spelled.to_string(),
            },
            path: uri
                .path_and_query()
                .map_or_else(|| "/".to_string(), |p| p.as_str().to_string()),
        })
    }
}

/// An answer's body as read.
#[derive(Debug)]
enum Body {
    /// All of it.
    Read(Bytes),
    /// Longer than [`MAX_ANSWER_BYTES`]: not read.
    TooLarge,
}

/// One ask on a connection of its own: the status and the body of the
/// answer, or why there is none. A connection per ask costs a handshake
/// inside the round's deadline (well under a millisecond on a LAN); keeping
/// one open per member between rounds is for later, if ever needed.
async fn exchange(endpoint: &Endpoint, body: Vec<u8>) -> Result<(StatusCode, Body), String> {
    let at = &endpoint.authority;
    let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| format!("connecting to {at}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("connecting to {at}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("connecting to {at}: {e}"))?;
    let request = Request::post(endpoint.path.as_str())
        .header(HOST, at.as_str())
        .header(CONTENT_TYPE, "application/json")
        // This connection carries this one ask: the member may close it.
        .header(CONNECTION, "close")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("the ask to {at}: {e}"))?;
    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("asking {at}: {e}"))?;
        let status = response.status();
        Ok((status, read_capped(response.into_body(), at).await?))
    };
    // The connection does the reading and writing; it must be driven
    // beside the exchange, here rather than in a task of its own, so that
    // both end with the ask (the deadline drops them together).
    tokio::pin!(conn, exchange);
    tokio::select! {
        biased;
        answer = &mut exchange => answer,
        ended = &mut conn => {
            // Closed or failed: whatever it delivered, the exchange has.
            let answer = (&mut exchange).await;
            match (answer, ended) {
                (Err(_), Err(e)) => Err(format!("asking {at}: {e}")),
                (answer, _) => answer,
            }
        }
    }
}

/// The body, up to [`MAX_ANSWER_BYTES`].
async fn read_capped(body: Incoming, at: &str) -> Result<Body, String> {
    match Limited::new(body, MAX_ANSWER_BYTES).collect().await {
        Ok(collected) => Ok(Body::Read(collected.to_bytes())),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Ok(Body::TooLarge),
        Err(e) => Err(format!("reading the answer of {at}: {e}")),
    }
}

/// What an answer of `status` and `body` to `sent` comes to.
fn judge(key: &FailsafeKey, sent: &Ask, status: StatusCode, body: Body) -> Verdict {
    let body = match body {
        Body::Read(body) => body,
        Body::TooLarge if status == StatusCode::OK => {
            return Verdict::Forged(format!(
                "an answer of over {} KiB, not read",
                MAX_ANSWER_BYTES / 1024
            ))
        }
        Body::TooLarge => {
            return Verdict::Rejected(
                status.as_u16(),
                format!(
                    "(an error of over {} KiB, not read)",
                    MAX_ANSWER_BYTES / 1024
                ),
            )
        }
    };
    if status != StatusCode::OK {
        return Verdict::Rejected(status.as_u16(), error_text(&body));
    }
    let signed: SignedAnswer = match serde_json::from_slice(&body) {
        Ok(signed) => signed,
        Err(e) => return Verdict::Forged(format!("not a signed answer: {e}")),
    };
    let answer: &Answer = match key.verify_answer(&signed) {
        Ok(answer) => answer,
        Err(e) => return Verdict::Forged(e.to_string()),
    };
    if answer.ask != *sent {
        return Verdict::Forged(format!(
            "an answer to another ask: {}",
            differences(sent, &answer.ask)
        ));
    }
    if answer.granted {
        Verdict::Granted
    } else {
        Verdict::Refused(
            answer
                .why
                .clone()
                .unwrap_or_else(|| "no reason given".to_string()),
        )
    }
}

/// The error of a member's error answer: its `{"error": …}`, or the body
/// itself, cut short.
fn error_text(body: &[u8]) -> String {
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(body) {
        if let Some(serde_json::Value::String(error)) = fields.get("error") {
            return error.clone();
        }
    }
    const SHOWN: usize = 200;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(no error given)".to_string();
    }
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// How the ask an answer repeats differs from the one sent.
fn differences(sent: &Ask, got: &Ask) -> String {
    let mut out = Vec::new();
    if got.lock != sent.lock {
        out.push(format!("lock {:?}, not {:?}", got.lock, sent.lock));
    }
    if got.holder != sent.holder {
        let h = |h: &Holder| format!("{} ({}, instance {})", h.node, h.machine, h.instance);
        out.push(format!(
            "holder {}, not {}",
            h(&got.holder),
            h(&sent.holder)
        ));
    }
    if got.token != sent.token {
        out.push(format!("token {}, not {}", got.token, sent.token));
    }
    if got.round != sent.round {
        out.push(format!("round {}, not {}", got.round, sent.round));
    }
    if got.member != sent.member {
        let m = |m: &Peer| format!("{} ({})", m.node, m.machine);
        out.push(format!(
            "member {}, not {}",
            m(&got.member),
            m(&sent.member)
        ));
    }
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use futures::StreamExt;
    use putex_core::{FailsafeAnswer, FailsafeRefusal, Input};
    use tokio::net::TcpListener;

    use super::*;
    use crate::failsafe::auth::SignedAsk;
    use crate::failsafe::member::Gate;
    use crate::http::agent::{router, AgentSnapshot, AgentView};
    use crate::observe::metrics::Metrics;

    const LOCK: &str = "svc";
    const TOKEN: &str = "3:1042";
    const ROUND: u64 = 7;
    /// A deadline that nothing answering on loopback comes near, even on a
    /// loaded machine: the tests of answers are not tests of speed.
    const PATIENT: Duration = Duration::from_secs(5);
    /// How late after its deadline a round may end on a loaded machine.
    const MARGIN: Duration = Duration::from_millis(300);

    /// A key of `seed`'s bytes, through a key file as an agent reads one.
    fn key(seed: u8) -> FailsafeKey {
        use std::os::unix::fs::PermissionsExt;
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), [b'a' + seed; 40]).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        FailsafeKey::from_file(file.path()).unwrap()
    }

    fn holder() -> Holder {
        Holder {
            node: "db1".into(),
            machine: "m1".into(),
            instance: "i1".into(),
        }
    }

    fn peer(n: u8) -> Peer {
        Peer {
            node: format!("db{n}"),
            machine: format!("m{n}"),
        }
    }

    fn asker(key: FailsafeKey, lock: &str) -> Asker {
        Asker::new(key, lock.to_string(), holder())
    }

    fn target(member: Peer, at: SocketAddr, lock: &str) -> Target {
        Target {
            member,
            url: format!("http://{at}/v1/failsafe/{lock}"),
        }
    }

    /// The ask `asker` sends `member` in `ROUND`.
    fn ask_to(member: Peer) -> Ask {
        Ask {
            lock: LOCK.into(),
            holder: holder(),
            token: TOKEN.into(),
            round: ROUND,
            member,
        }
    }

    /// Serves `router` on a port of its own on loopback.
    async fn serve(router: axum::Router) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        at
    }

    struct View(Arc<Gate>);

    impl AgentView for View {
        fn snapshot(&self) -> AgentSnapshot {
            AgentSnapshot::default()
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn failsafe(&self) -> Option<Arc<Gate>> {
            Some(self.0.clone())
        }
    }

    /// A member's real endpoint (the agent's router and its gate) for
    /// `lock`, as `me` under `key`, whose core answers every ask `answer`.
    async fn member(key: FailsafeKey, lock: &str, me: Peer, answer: FailsafeAnswer) -> SocketAddr {
        let (inject, mut inputs) = crate::driver::input_channel();
        let gate = Arc::new(Gate::new(
            key,
            lock.to_string(),
            me,
            inject,
            Metrics::unregistered(),
        ));
        let core = gate.clone();
        tokio::spawn(async move {
            while let Some(input) = inputs.next().await {
                if let Input::Failsafe(request) = input {
                    core.deliver(request.id, answer.clone());
                }
            }
        });
        serve(router(Arc::new(View(gate)))).await
    }

    /// How a member of the tests' making answers an ask.
    type Respond = fn(SignedAsk) -> SignedAnswer;

    /// A member of its own making: answers every ask with `respond(ask)`.
    async fn fake(respond: Respond) -> SocketAddr {
        serve(axum::Router::new().route(
            "/v1/failsafe/{lock}",
            axum::routing::post(move |axum::Json(ask): axum::Json<SignedAsk>| async move {
                axum::Json(respond(ask))
            }),
        ))
        .await
    }

    /// An address where nothing listens (a port just let go).
    async fn nobody() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }

    /// A member that takes connections and never says a word.
    async fn silent() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        at
    }

    #[tokio::test]
    async fn members_that_grant_are_granted_in_the_order_asked() {
        let k = key(1);
        let db2 = member(k.clone(), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let db3 = member(k.clone(), LOCK, peer(3), FailsafeAnswer::Granted).await;
        let targets = [target(peer(3), db3, LOCK), target(peer(2), db2, LOCK)];
        let verdicts = asker(k, LOCK)
            .ask_round(TOKEN, ROUND, &targets, PATIENT)
            .await;
        assert_eq!(
            verdicts,
            [(peer(3), Verdict::Granted), (peer(2), Verdict::Granted)]
        );
        assert!(verdicts.iter().all(|(_, v)| v.is_grant()));
        let none = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[], PATIENT)
            .await;
        assert!(none.is_empty());
    }

    #[tokio::test]
    async fn a_refusal_comes_back_with_the_members_why() {
        let k = key(1);
        let db2 = member(k.clone(), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let refusal = FailsafeRefusal::Acquiring;
        let db3 = member(
            k.clone(),
            LOCK,
            peer(3),
            FailsafeAnswer::Refused(refusal.clone()),
        )
        .await;
        let targets = [target(peer(2), db2, LOCK), target(peer(3), db3, LOCK)];
        let verdicts = asker(k, LOCK)
            .ask_round(TOKEN, ROUND, &targets, PATIENT)
            .await;
        assert_eq!(
            verdicts,
            [
                (peer(2), Verdict::Granted),
                (peer(3), Verdict::Refused(refusal.to_string())),
            ]
        );
        assert!(!verdicts[1].1.is_grant());
        assert_eq!(
            verdicts[1].1.to_string(),
            "refused: this member is acquiring the lock"
        );
    }

    /// The member checks the ask first: under another key it never gets
    /// as far as answering, so the holder sees a 401, not a forged grant.
    #[tokio::test]
    async fn a_member_with_another_key_rejects_the_ask_with_401() {
        let db2 = member(key(2), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let verdicts = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(2), db2, LOCK)], PATIENT)
            .await;
        let [(_, Verdict::Rejected(401, error))] = &verdicts[..] else {
            panic!("{verdicts:?}");
        };
        assert!(
            error.contains("not signed with this failsafe key"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_grant_under_another_key_is_forged() {
        let db2 = fake(|signed| {
            key(2).sign_answer(&Answer {
                ask: signed.ask,
                granted: true,
                why: None,
            })
        })
        .await;
        let verdicts = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(2), db2, LOCK)], PATIENT)
            .await;
        assert_eq!(
            verdicts,
            [(
                peer(2),
                Verdict::Forged("not signed with this failsafe key, or altered".into())
            )]
        );
    }

    /// Valid grants, signed with the right key, of asks that are not this
    /// one: a replayed grant of the last round, another member's, another
    /// token's, another instance's, another lock's.
    #[tokio::test]
    async fn a_valid_grant_of_another_ask_is_forged() {
        fn grant(ask: Ask) -> SignedAnswer {
            key(1).sign_answer(&Answer {
                ask,
                granted: true,
                why: None,
            })
        }
        let cases: [(Respond, &str); 5] = [
            (
                |s| {
                    grant(Ask {
                        round: s.ask.round - 1,
                        ..s.ask
                    })
                },
                "round 6, not 7",
            ),
            (
                |s| {
                    grant(Ask {
                        member: peer(3),
                        ..s.ask
                    })
                },
                "member db3 (m3), not db2 (m2)",
            ),
            (
                |s| {
                    grant(Ask {
                        token: "3:1041".into(),
                        ..s.ask
                    })
                },
                "token 3:1041, not 3:1042",
            ),
            (
                |s| {
                    let mut ask = s.ask;
                    ask.holder.instance = "i0".into();
                    grant(ask)
                },
                "holder db1 (m1, instance i0), not db1 (m1, instance i1)",
            ),
            (
                |s| {
                    grant(Ask {
                        lock: "other".into(),
                        ..s.ask
                    })
                },
                "lock \"other\", not \"svc\"",
            ),
        ];
        for (respond, difference) in cases {
            let db2 = fake(respond).await;
            let verdicts = asker(key(1), LOCK)
                .ask_round(TOKEN, ROUND, &[target(peer(2), db2, LOCK)], PATIENT)
                .await;
            assert_eq!(
                verdicts,
                [(
                    peer(2),
                    Verdict::Forged(format!("an answer to another ask: {difference}"))
                )]
            );
        }
    }

    #[tokio::test]
    async fn a_lock_the_member_does_not_run_is_rejected_with_404() {
        let k = key(1);
        let db2 = member(k.clone(), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let verdicts = asker(k, "other")
            .ask_round(TOKEN, ROUND, &[target(peer(2), db2, "other")], PATIENT)
            .await;
        assert_eq!(
            verdicts,
            [(
                peer(2),
                Verdict::Rejected(404, "this agent runs lock \"svc\", not \"other\"".into())
            )]
        );
    }

    #[tokio::test]
    async fn an_ask_for_another_member_is_rejected_with_409() {
        let k = key(1);
        let db2 = member(k.clone(), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let verdicts = asker(k, LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(3), db2, LOCK)], PATIENT)
            .await;
        let [(member, Verdict::Rejected(409, _))] = &verdicts[..] else {
            panic!("{verdicts:?}");
        };
        assert_eq!(*member, peer(3));
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_at_once() {
        let at = nobody().await;
        let started = Instant::now();
        let verdicts = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(2), at, LOCK)], PATIENT)
            .await;
        assert!(started.elapsed() < Duration::from_secs(1), "{verdicts:?}");
        let [(_, Verdict::Unreachable(why))] = &verdicts[..] else {
            panic!("{verdicts:?}");
        };
        assert!(why.starts_with(&format!("connecting to {at}: ")), "{why}");
    }

    #[tokio::test]
    async fn a_member_that_never_answers_is_unreachable_at_the_deadline() {
        let within = Duration::from_millis(40);
        let at = silent().await;
        let started = Instant::now();
        let verdicts = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(2), at, LOCK)], within)
            .await;
        let elapsed = started.elapsed();
        assert!(elapsed >= within, "{elapsed:?}");
        assert!(elapsed < within + MARGIN, "{elapsed:?}");
        assert_eq!(
            verdicts,
            [(
                peer(2),
                Verdict::Unreachable("no answer within 40ms".into())
            )]
        );
    }

    /// Asked together: three silent members cost the round one deadline,
    /// not three, and take nothing from the grant of the fourth.
    #[tokio::test]
    async fn silent_members_spoil_no_other_members_grant() {
        let within = Duration::from_secs(1);
        let k = key(1);
        let db2 = member(k.clone(), LOCK, peer(2), FailsafeAnswer::Granted).await;
        let mut targets = vec![];
        for n in 3..6 {
            targets.push(target(peer(n), silent().await, LOCK));
        }
        targets.insert(1, target(peer(2), db2, LOCK));
        let started = Instant::now();
        let verdicts = asker(k, LOCK)
            .ask_round(TOKEN, ROUND, &targets, within)
            .await;
        let elapsed = started.elapsed();
        assert!(elapsed < within + MARGIN, "{elapsed:?}");
        let members: Vec<_> = verdicts.iter().map(|(m, _)| m.node.as_str()).collect();
        assert_eq!(members, ["db3", "db2", "db4", "db5"]);
        for (member, verdict) in &verdicts {
            if *member == peer(2) {
                assert_eq!(*verdict, Verdict::Granted);
            } else {
                assert!(matches!(verdict, Verdict::Unreachable(_)), "{verdict:?}");
            }
        }
    }

    #[tokio::test]
    async fn only_http_urls_are_asked() {
        for (url, says) in [
            (
                "https://127.0.0.1:1/v1/failsafe/svc",
                "over http://, not https://",
            ),
            ("127.0.0.1:1/v1/failsafe/svc", "is not a URL"),
            ("http://", "is not a URL"),
        ] {
            let started = Instant::now();
            let target = Target {
                member: peer(2),
                url: url.into(),
            };
            let verdicts = asker(key(1), LOCK)
                .ask_round(TOKEN, ROUND, &[target], PATIENT)
                .await;
            assert!(started.elapsed() < Duration::from_secs(1));
            let [(_, Verdict::Unreachable(why))] = &verdicts[..] else {
                panic!("{url}: {verdicts:?}");
            };
            assert!(why.contains(says), "{url}: {why}");
        }
    }

    #[tokio::test]
    async fn an_answer_too_large_is_not_read() {
        let at = serve(axum::Router::new().route(
            "/v1/failsafe/{lock}",
            axum::routing::post(|| async { "x".repeat(MAX_ANSWER_BYTES + 1) }),
        ))
        .await;
        let verdicts = asker(key(1), LOCK)
            .ask_round(TOKEN, ROUND, &[target(peer(2), at, LOCK)], PATIENT)
            .await;
        assert_eq!(
            verdicts,
            [(
                peer(2),
                Verdict::Forged("an answer of over 64 KiB, not read".into())
            )]
        );
    }

    #[test]
    fn answers_are_judged_by_their_status_signature_and_ask() {
        let k = key(1);
        let sent = ask_to(peer(2));
        let read = |json: &str| Body::Read(Bytes::from(json.to_string()));
        let signed = |answer: &Answer| serde_json::to_string(&k.sign_answer(answer)).unwrap();
        let grant = Answer {
            ask: sent.clone(),
            granted: true,
            why: None,
        };
        assert_eq!(
            judge(&k, &sent, StatusCode::OK, read(&signed(&grant))),
            Verdict::Granted
        );
        let refusal = Answer {
            granted: false,
            ..grant.clone()
        };
        assert_eq!(
            judge(&k, &sent, StatusCode::OK, read(&signed(&refusal))),
            Verdict::Refused("no reason given".into())
        );
        // A refusal turned into a grant on the way.
        let mut altered = k.sign_answer(&refusal);
        altered.answer.granted = true;
        let altered = serde_json::to_string(&altered).unwrap();
        assert_eq!(
            judge(&k, &sent, StatusCode::OK, read(&altered)),
            Verdict::Forged("not signed with this failsafe key, or altered".into())
        );
        // The holder's own signed ask sent back as its answer.
        let echoed = serde_json::to_string(&k.sign_ask(&sent)).unwrap();
        assert!(matches!(
            judge(&k, &sent, StatusCode::OK, read(&echoed)),
            Verdict::Forged(why) if why.starts_with("not a signed answer")
        ));
        assert!(matches!(
            judge(&k, &sent, StatusCode::OK, read("<html>")),
            Verdict::Forged(why) if why.starts_with("not a signed answer")
        ));
        // A grant with an error status counts for nothing either.
        assert!(matches!(
            judge(
                &k,
                &sent,
                StatusCode::SERVICE_UNAVAILABLE,
                read(&signed(&grant))
            ),
            Verdict::Rejected(503, _)
        ));
        assert_eq!(
            judge(
                &k,
                &sent,
                StatusCode::SERVICE_UNAVAILABLE,
                read(r#"{"error":"the agent did not answer within 1s"}"#)
            ),
            Verdict::Rejected(503, "the agent did not answer within 1s".into())
        );
        assert_eq!(
            judge(&k, &sent, StatusCode::BAD_GATEWAY, read("  bad gateway\n")),
            Verdict::Rejected(502, "bad gateway".into())
        );
        assert_eq!(
            judge(&k, &sent, StatusCode::BAD_GATEWAY, read("")),
            Verdict::Rejected(502, "(no error given)".into())
        );
        assert_eq!(
            judge(&k, &sent, StatusCode::NOT_FOUND, Body::TooLarge),
            Verdict::Rejected(404, "(an error of over 64 KiB, not read)".into())
        );
    }

    #[test]
    fn endpoints_are_parsed_for_connect_and_host() {
        let e = Endpoint::parse("http://10.0.0.2:8008/v1/failsafe/svc").unwrap();
        assert_eq!(
            e,
            Endpoint {
                host: "10.0.0.2".into(),
                port: 8008,
                authority: "10.0.0.2:8008".into(),
                path: "/v1/failsafe/svc".into(),
            }
        );
        let e = Endpoint::parse("http://[::1]:8008/v1/failsafe/svc").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 8008));
        assert_eq!(e.authority, "[::1]:8008");
        let e = Endpoint::parse("http://db2.example/v1/failsafe/svc").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("db2.example", 80));
        assert_eq!(e.authority, "db2.example");
    }

    #[test]
    fn verdicts_read_as_sentences() {
        for (verdict, text) in [
            (Verdict::Granted, "granted"),
            (
                Verdict::Refused("this member is standby".into()),
                "refused: this member is standby",
            ),
            (
                Verdict::Unreachable("no answer within 40ms".into()),
                "unreachable: no answer within 40ms",
            ),
            (
                Verdict::Rejected(401, "not signed with this failsafe key, or altered".into()),
                "rejected the ask (401): not signed with this failsafe key, or altered",
            ),
            (
                Verdict::Forged("an answer to another ask: round 6, not 7".into()),
                "no valid answer: an answer to another ask: round 6, not 7",
            ),
        ] {
            assert_eq!(verdict.to_string(), text);
        }
    }
}
