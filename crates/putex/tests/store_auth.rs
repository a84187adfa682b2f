//! NATS authentication and TLS against a real nats-server: every kind of
//! credentials the store URL takes, server TLS with a private CA, mutual
//! TLS, and what a refusal looks like (a configuration error, at once,
//! without the secret in the message). Also, on a 3-node cluster with an R3
//! bucket: a stream-leader change, and a server gone silent under a client.
//!
//! The certificates come from `putex_testkit::pki` and the nkeys from `nkeys`, made
//! fresh in each test: no external tool.

use std::path::Path;
use std::time::{Duration, Instant};

use putex::store::{AnyStore, ReadMode, Store, StoreError, StoreUrl};

use crate::common::nats_server::{NatsCluster, NatsServer};
use crate::store_contract::open_retrying;

/// The deadline for ordinary calls in these tests.
const T: Duration = Duration::from_secs(5);
/// A refusal must come back well within this (the connect timeout is 5 s;
/// the open deadline 15 s).
const PROMPT: Duration = Duration::from_secs(4);

/// Opens the store a URL names.
async fn open(url: &str) -> Result<AnyStore, StoreError> {
    AnyStore::open(&StoreUrl::parse(url)?).await
}

/// Opens, then a create / get round trip on a key of its own.
async fn round_trip(url: &str, key: &str) {
    let s = open(url)
        .await
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", shown(url)));
    let t = s.create(key, b"x", T).await.unwrap();
    let got = s.get(key, ReadMode::Leader, T).await.unwrap().unwrap();
    assert_eq!((got.value.as_slice(), got.token), (&b"x"[..], t));
}

/// The URL as putex shows it (secrets hidden), for panic messages.
fn shown(url: &str) -> String {
    StoreUrl::parse(url).map_or_else(|e| e.to_string(), |u| u.to_string())
}

/// Opening must be refused promptly with a configuration error whose
/// message holds none of `secrets`; returns the message.
async fn refused(url: &str, secrets: &[&str]) -> String {
    let started = Instant::now();
    let r = open(url).await;
    let took = started.elapsed();
    let msg = match r {
        Err(StoreError::Config { reason }) => reason,
        Err(e) => panic!("{}: want a configuration error, got {e:?}", shown(url)),
        Ok(_) => panic!("{}: opened, but should have been refused", shown(url)),
    };
    assert!(took < PROMPT, "{}: refused only after {took:?}", shown(url));
    for s in secrets {
        assert!(
            !msg.contains(s),
            "the message shows the secret {s:?}: {msg}"
        );
    }
    eprintln!("refused as wanted: {msg}");
    msg
}

fn host(server: &NatsServer) -> String {
    format!("127.0.0.1:{}", server.port())
}

/// User and password, in the user-info and in the query (with characters
/// that need percent-encoding); a wrong password or none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_auth_user_password() {
    let server = NatsServer::start_with_config(
        r#"authorization { users = [ { user: "putex", password: "p@ss:w/rd&x" } ] }"#,
    );
    let h = host(&server);
    round_trip(&format!("nats://putex:p%40ss%3Aw%2Frd%26x@{h}"), "lock.a").await;
    round_trip(
        &format!("nats://{h}?user=putex&password=p%40ss%3Aw%2Frd%26x"),
        "lock.b",
    )
    .await;
    let secrets = ["p@ss", "w/rd", "wr0ngpass"];
    let msg = refused(&format!("nats://putex:wr0ngpass@{h}"), &secrets).await;
    assert!(msg.contains("authorization violation"), "{msg}");
    refused(
        &format!("nats://{h}?user=putex&password=wr0ngpass"),
        &secrets,
    )
    .await;
    refused(&format!("nats://{h}"), &secrets).await;
}

/// A token, as `?token=` and as `nats://TOKEN@host` (the NATS clients'
/// form); a wrong one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_auth_token() {
    let server = NatsServer::start_with_config(r#"authorization { token: "t0ken-s3cret" }"#);
    let h = host(&server);
    round_trip(&format!("nats://{h}?token=t0ken-s3cret"), "lock.a").await;
    round_trip(&format!("nats://t0ken-s3cret@{h}"), "lock.b").await;
    let secrets = ["t0ken", "wr0ngtoken"];
    refused(&format!("nats://{h}?token=wr0ngtoken"), &secrets).await;
    refused(&format!("nats://wr0ngtoken@{h}"), &secrets).await;
    refused(&format!("nats://{h}"), &secrets).await;
}

/// A user nkey: the server knows the public key, putex signs the server's
/// nonce with the seed; another seed is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_auth_nkey() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let server = NatsServer::start_with_config(&format!(
        r#"authorization {{ users = [ {{ nkey: "{}" }} ] }}"#,
        user.public_key()
    ));
    let h = host(&server);
    round_trip(&format!("nats://{h}?nkey={seed}"), "lock.a").await;
    let other = nkeys::KeyPair::new_user().seed().unwrap();
    refused(&format!("nats://{h}?nkey={other}"), &[&seed, &other]).await;
    // Not a seed at all: refused too, and not echoed.
    refused(&format!("nats://{h}?nkey=SUNOTASEED"), &["SUNOTASEED"]).await;
}

/// A throwaway PKI: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, written as PEM files into `dir`.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let pki = putex_testkit::pki::Pki::new(dir, "putex test");
        let text = |p: std::path::PathBuf| p.display().to_string();
        Pki {
            ca: text(pki.ca),
            server_cert: text(pki.server_cert),
            server_key: text(pki.server_key),
            client_cert: text(pki.client_cert),
            client_key: text(pki.client_key),
        }
    }

    /// The server's `tls` block; `verify` demands client certificates.
    fn server_block(&self, verify: bool) -> String {
        format!(
            "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: {verify}, timeout: 2 }}",
            self.server_cert, self.server_key, self.ca
        )
    }
}

/// Server TLS with a private CA: trusting the CA (`tls://` or `nats://`
/// with `tls_ca`) works; without it the handshake fails, refused as a
/// configuration error that names the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_tls_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = NatsServer::start_with_config(&pki.server_block(false));
    let h = host(&server);
    round_trip(&format!("tls://{h}?tls_ca={}", pki.ca), "lock.a").await;
    round_trip(&format!("nats://{h}?tls_ca={}", pki.ca), "lock.b").await;
    // `localhost` is in the certificate too.
    let local = format!("localhost:{}", server.port());
    round_trip(&format!("tls://{local}?tls_ca={}", pki.ca), "lock.c").await;

    let msg = refused(&format!("tls://{h}"), &[]).await;
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
    // The server demands TLS: a plain nats:// URL is upgraded, and fails
    // the same way without the CA.
    let msg = refused(&format!("nats://{h}"), &[]).await;
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
    // A CA file that is not there.
    let msg = refused(&format!("tls://{h}?tls_ca=/nonexistent/ca.pem"), &[]).await;
    assert!(msg.contains("/nonexistent/ca.pem"), "{msg}");
}

/// Mutual TLS (`verify: true`): with the client certificate it works;
/// without one the server refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_tls_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = NatsServer::start_with_config(&pki.server_block(true));
    let h = host(&server);
    round_trip(
        &format!(
            "tls://{h}?tls_ca={}&tls_cert={}&tls_key={}",
            pki.ca, pki.client_cert, pki.client_key
        ),
        "lock.a",
    )
    .await;
    refused(&format!("tls://{h}?tls_ca={}", pki.ca), &[]).await;
}

/// A 3-node cluster, R3 bucket: the stream leader crashes. Writes succeed
/// again after the election (measured 4–8 s on an idle machine, below the
/// default T = 10 s; the test allows 20 s so that a loaded CI machine does
/// not turn it into a flake), and a compare-and-swap against a token taken
/// before the election is still a compare-and-swap: it succeeds on the
/// record that did not move, and conflicts on the one that did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_cluster_leader_change() {
    let started = Instant::now();
    let mut cluster = NatsCluster::start();
    let url = StoreUrl::parse(&format!("{}?bucket=putex_lc&replicas=3", cluster.url())).unwrap();
    let s = open_retrying(&url).await;
    let still = s.create("lock.still", b"1", T).await.unwrap();
    let moved = s.create("lock.moved", b"1", T).await.unwrap();
    let epoch = s.epoch();

    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let mut stream = async_nats::jetstream::new(n.client().clone())
        .get_stream("KV_putex_lc")
        .await
        .unwrap();
    let info = stream.info().await.unwrap();
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("the stream has a leader");
    eprintln!(
        "cluster up, bucket open after {:?}; killing the stream leader {leader}",
        started.elapsed()
    );
    let killed = Instant::now();
    cluster.kill_node(&leader);

    // Writes come back once a new leader is elected.
    let limit = Duration::from_secs(20);
    let mut attempts = 0;
    let moved2 = loop {
        attempts += 1;
        match s
            .update("lock.moved", b"2", moved, Duration::from_secs(1))
            .await
        {
            Ok(t) => break t,
            Err(e) if e.is_unknown() && killed.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // An unknown write may have landed: then the retry conflicts
            // and the record holds our value.
            Err(e) if e.is_conflict() => {
                let got = s
                    .get("lock.moved", ReadMode::Leader, T)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(got.value, b"2", "conflict, yet not our write: {e}");
                break got.token;
            }
            Err(e) => panic!("writes did not come back within {limit:?}: {e}"),
        }
    };
    let took = killed.elapsed();
    eprintln!("writes back after {took:?} ({attempts} attempts)");
    assert!(took < limit, "{took:?}");
    assert!(moved2 > moved);
    assert_eq!(s.epoch(), epoch, "a leader change is not a new bucket");

    let info = stream.info().await.unwrap();
    let new_leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
    assert_ne!(new_leader.as_deref(), Some(leader.as_str()));

    // The pre-election token of the record that moved: a conflict.
    let e = s.update("lock.moved", b"3", moved, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    // Of the record that did not: the CAS succeeds, exactly once.
    let still2 = s.update("lock.still", b"2", still, T).await.unwrap();
    assert!(still2 > still);
    let e = s.update("lock.still", b"3", still, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let e = s.delete("lock.moved", moved, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    s.delete("lock.moved", moved2, T).await.unwrap();
    eprintln!("done after {:?}", started.elapsed());
}

/// A NATS server that goes silent without closing the connection (a host
/// powered off, a blackholed route) keeps its clients until their third
/// unanswered ping: async-nats pings every 60 s by default, which left a
/// handle on a dead server for up to three minutes; putex pings every
/// `PING_INTERVAL` (5 s). Here the URL names only a proxy in front of one
/// server of three, the proxy is blackholed, and calls must work again —
/// through a server the cluster advertised — within three pings. The
/// other side: while calls are answered, the handle stays where it is.
/// (A server cut off from its cluster but still answering is left within
/// about a second: `scripts/chaos --scenario server-partitioned-r3`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_leaves_a_server_gone_silent() {
    use crate::common::proxy::{Mode, Proxy};
    use putex::store::nats::PING_INTERVAL;

    let cluster = NatsCluster::start();
    let target = format!("127.0.0.1:{}", cluster.servers[0].port());
    let proxy = Proxy::start(target.parse().unwrap()).await.unwrap();
    let url = format!("{}?bucket=putex_silent&replicas=3", proxy.url());
    let url = StoreUrl::parse(&url).unwrap();
    let s = open_retrying(&url).await;
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let mut token = s.create("lock.silent", b"0", T).await.unwrap();
    let call = Duration::from_millis(300);

    // Answered calls, for three seconds: no reconnect.
    let (up_before, _) = proxy.forwarded();
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0u32;
    while Instant::now() < until {
        i += 1;
        token = s
            .update("lock.silent", i.to_string().as_bytes(), token, T)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (up_after, _) = proxy.forwarded();
    assert!(
        up_after > up_before,
        "the calls did not go through the proxy"
    );
    assert_eq!(
        n.client().server_info().port,
        cluster.servers[0].port(),
        "left a server that answered"
    );

    // The server goes silent: calls must work again, through another.
    proxy.set(Mode::Blackhole);
    let silent = Instant::now();
    let limit = PING_INTERVAL * 3 + Duration::from_secs(6);
    let mut failures = 0;
    let took = loop {
        match s.get("lock.silent", ReadMode::Leader, call).await {
            Ok(Some(e)) if e.token == token => break silent.elapsed(),
            Ok(other) => panic!("read {other:?}, not the last write"),
            Err(e) if e.is_unknown() && silent.elapsed() < limit => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no call answered within {limit:?} of the silence: {e}"),
        }
    };
    eprintln!(
        "calls answered again {took:?} after the server went silent ({failures} unanswered), now on port {}",
        n.client().server_info().port
    );
    assert!(failures > 0, "the blackhole changed nothing");
    // And writes, which go to the stream leader.
    s.update("lock.silent", b"after", token, T).await.unwrap();
}

/// A signed NATS JWT (`ed25519-nkey`) with these claims, issued by `iss`
/// for `sub` (the public key of the subject).
fn jwt(iss: &nkeys::KeyPair, sub: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let header = b64.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("PUTEXTEST{iat}{name}").to_uppercase(),
        "iat": iat,
        "iss": iss.public_key(),
        "name": name,
        "sub": sub,
        "nats": nats,
    });
    let claims = b64.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let sig = b64.encode(iss.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{sig}")
}

/// A `.creds` file (decentralised auth: operator, account, user JWTs made
/// here and signed with fresh nkeys); a server in operator mode with the
/// account preloaded accepts it, and refuses a user of another account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_auth_creds_file() {
    use serde_json::json;
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let op_jwt = jwt(
        &operator,
        &operator.public_key(),
        "op",
        json!({"type": "operator", "version": 2}),
    );
    let limits = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let acct_jwt = jwt(
        &operator,
        &account.public_key(),
        "putex",
        json!({"limits": limits, "type": "account", "version": 2}),
    );
    // JetStream needs a system account.
    let system = nkeys::KeyPair::new_account();
    let sys_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        json!({"limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1,
                          "exports": -1, "wildcards": true, "conn": -1, "leaf": -1},
               "type": "account", "version": 2}),
    );
    let creds = |user: &nkeys::KeyPair, issuer: &nkeys::KeyPair| {
        let user_jwt = jwt(
            issuer,
            &user.public_key(),
            "putex",
            json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                   "type": "user", "version": 2}),
        );
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("putex.creds");
    std::fs::write(&good, creds(&user, &account)).unwrap();
    // Signed by an account the server does not know.
    let stranger = nkeys::KeyPair::new_account();
    let bad = dir.path().join("stranger.creds");
    std::fs::write(&bad, creds(&user, &stranger)).unwrap();

    let server = NatsServer::start_with_config(&format!(
        "operator: {op_jwt:?}\nsystem_account: {sys}\nresolver: MEMORY\n\
         resolver_preload: {{ {acct}: {acct_jwt:?}, {sys}: {sys_jwt:?} }}",
        acct = account.public_key(),
        sys = system.public_key(),
    ));
    let h = host(&server);
    round_trip(&format!("nats://{h}?creds={}", good.display()), "lock.a").await;
    let seed = user.seed().unwrap();
    refused(&format!("nats://{h}?creds={}", bad.display()), &[&seed]).await;
    refused(&format!("nats://{h}"), &[&seed]).await;
    let msg = refused(&format!("nats://{h}?creds=/nonexistent/x.creds"), &[]).await;
    assert!(msg.contains("/nonexistent/x.creds"), "{msg}");
}
