//! Leaving a NATS server cut off from its cluster; noticing a silent one.
//!
//! async-nats stays on a server for as long as the connection lives, and
//! on a silent one until three pings go unanswered. Two failures keep a
//! client on a server although its calls go nowhere:
//!
//! - a server cut off from its cluster peers still answers the client's
//!   pings, but the JetStream requests it forwards go unanswered ("no
//!   responders", timeouts): the bucket's stream commits only with a
//!   majority, on the other side;
//! - a server that vanished without closing the connection (a host powered
//!   off, a route blackholed) answers nothing, and the client notices only
//!   at its third missed ping ([`PING_INTERVAL`] apart).
//!
//! An agent there cannot renew (a holder stops at its licence, H2: safe)
//! and a standby there cannot take over: if every agent sat on that server,
//! nobody would until it came back.
//!
//! So a handle whose writes — or whose reads — have all gone unanswered
//! for [`STUCK_AFTER`] (from the start of the first unanswered call), while
//! the client says it is connected, checks that the server still answers
//! at all: a message it publishes to a subject of its own must come back
//! within [`ECHO_WITHIN`]. If it does, the server is cut off from its
//! cluster, and the handle asks the client to reconnect — again every
//! [`STUCK_AFTER`] while the calls stay unanswered. If it does not, the
//! server (or the handle's own network) is silent, and the client's pings
//! decide ([`PING_INTERVAL`]): a reconnect into a cut network would wait
//! out a connection timeout past the cut's end. Writes and reads are
//! counted apart: a cut-off server that led the bucket's stream goes on
//! answering reads from its own copy (for a minute and more) while no
//! write commits.
//!
//! The reconnect goes to another server the handle knows — the URL's and
//! those the cluster advertises — the least failed, at random among those
//! ([`ServerChoice`]: the handle picks every server the client connects
//! to, so it knows the one to leave, and the address the server gives
//! itself is left too). An address that leads to the same server under yet
//! another name may be picked, and is left at the next round. A handle
//! that knows of no other server never reconnects this way. A
//! stream-leader election looks the same from every server for a few
//! seconds; the reconnects it causes cost a connection each (the watch
//! feed resumes from its last revision), nothing more.
//!
//! A server that is down (restarted, upgraded, its host rebooting) refuses
//! connections, and the client tries again after [`reconnect_delay`]:
//! never more than [`RECONNECT_DELAY_MAX`], so that a handle is back
//! within a quarter second of its server.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use async_nats::{ReconnectToServer, Server, ServerAddr};
use parking_lot::Mutex;

/// How long a handle's writes, or its reads, must have gone unanswered —
/// from the start of the first unanswered call — before it reconnects
/// (and then between two reconnects it asks for).
pub const STUCK_AFTER: Duration = Duration::from_secs(1);

/// How long a message the handle publishes to itself may take to come
/// back through its server, for the server to count as answering.
pub const ECHO_WITHIN: Duration = Duration::from_millis(500);

/// The longest wait between two tries to reconnect. async-nats doubles its
/// wait from 2 ms up to 4 s: after a store outage of 5 s, an agent found
/// its server back 3 to 4 s late, where a failover takes W + G' (0.4 s at
/// R = 100 ms). A try costs a TCP connection to a server that is down: a
/// hundred agents trying every 125-250 ms make under 800 a second.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_millis(250);

/// How long the client waits before its `attempts`-th try in a row to
/// connect: none before the first, then doubling from 2 ms as async-nats
/// does, and from [`RECONNECT_DELAY_MAX`] on a random wait between half of
/// it and all of it, so that the handles a restart disconnected together
/// do not all come back in the same millisecond.
pub fn reconnect_delay(attempts: usize) -> Duration {
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let doubling = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(20);
    let doubled = Duration::from_millis(1 << doubling);
    if doubled < RECONNECT_DELAY_MAX {
        return doubled;
    }
    let half = RECONNECT_DELAY_MAX / 2;
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(random % spread + 1)
}

/// How often the client pings its server: a server gone silent is left
/// after three unanswered pings (async-nats's default is 60 s, which left a
/// handle that only watches on a dead server for up to three minutes).
pub const PING_INTERVAL: Duration = Duration::from_secs(5);

/// Whether a handle's writes and reads are being answered, and when it
/// last asked for a reconnect.
#[derive(Debug, Default)]
pub(super) struct Stuck {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    writes: Kind,
    reads: Kind,
    /// The last reconnect asked for.
    asked: Option<Instant>,
}

/// The answers to one kind of call.
#[derive(Debug, Default)]
struct Kind {
    /// When the last answer came.
    answered: Option<Instant>,
    /// Since when this kind goes unanswered: the start of the first call
    /// unanswered since the last answer (no earlier than that answer).
    failing_since: Option<Instant>,
}

/// What kind of call an outcome is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Call {
    /// A publish (create, update, put, delete): only the stream's leader,
    /// with a majority, answers it.
    Write,
    /// A get, which a replica may answer.
    Read,
}

impl Stuck {
    /// Notes the outcome, at `now`, of one call `started` then: `answered`
    /// when the server gave an answer (a result or a conflict), not when
    /// the outcome is unknown. True when the handle should reconnect now:
    /// writes or reads have gone unanswered for [`STUCK_AFTER`].
    pub(super) fn note(&self, call: Call, answered: bool, started: Instant, now: Instant) -> bool {
        let mut s = self.state.lock();
        let kind = match call {
            Call::Write => &mut s.writes,
            Call::Read => &mut s.reads,
        };
        if answered {
            kind.answered = Some(now);
            kind.failing_since = None;
            return false;
        }
        let since = kind.answered.map_or(started, |a| started.max(a));
        if kind.failing_since.is_none_or(|f| since < f) {
            kind.failing_since = Some(since);
        }
        let oldest = [s.writes.failing_since, s.reads.failing_since]
            .into_iter()
            .flatten()
            .min();
        let due = oldest.is_some_and(|f| now.saturating_duration_since(f) >= STUCK_AFTER)
            && s.asked
                .is_none_or(|a| now.saturating_duration_since(a) >= STUCK_AFTER);
        if due {
            s.asked = Some(now);
        }
        due
    }
}

/// Which server the client connects to: the handle picks it itself, so
/// that it knows the one it is on and can leave it.
#[derive(Debug, Default)]
pub(super) struct ServerChoice {
    state: Mutex<Choice>,
}

#[derive(Debug, Default)]
struct Choice {
    /// The server last picked (the one connected to, once connected).
    picked: Option<ServerAddr>,
    /// The server to leave: the next picks avoid it until connected
    /// elsewhere.
    leaving: Option<ServerAddr>,
}

impl ServerChoice {
    /// The reconnect about to be asked for leaves the server connected to.
    pub(super) fn leave(&self) {
        let mut c = self.state.lock();
        c.leaving = c.picked.clone();
    }

    /// Connected, to the server last picked.
    pub(super) fn connected(&self) {
        self.state.lock().leaving = None;
    }

    /// The server to try next: the least failed of `servers`, at random
    /// among those — but not the one being left, while another is known —
    /// after [`reconnect_delay`] (none for the first attempt). The
    /// one being left is the address picked for it and the address it
    /// gives itself (`host`, `port` of its last INFO), when both are in
    /// `servers` (a URL's alias or proxy, and the address the cluster
    /// advertised).
    pub(super) fn pick(
        &self,
        servers: &[Server],
        (host, port): (&str, u16),
    ) -> Option<ReconnectToServer> {
        let mut c = self.state.lock();
        let others: Vec<&Server> = match &c.leaving {
            None => servers.iter().collect(),
            Some(left) => servers
                .iter()
                .filter(|s| s.addr != *left && !(s.addr.host() == host && s.addr.port() == port))
                .collect(),
        };
        let pool = if others.is_empty() {
            servers.iter().collect()
        } else {
            others
        };
        let least = pool.iter().map(|s| s.failed_attempts).min()?;
        let best: Vec<&&Server> = pool.iter().filter(|s| s.failed_attempts == least).collect();
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let i = usize::try_from(random % best.len() as u64).unwrap_or(0);
        let addr = best[i].addr.clone();
        c.picked = Some(addr.clone());
        Some(ReconnectToServer { addr, delay: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_reconnect_waits_at_most_a_quarter_second() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        assert_eq!(reconnect_delay(2), 2 * MS);
        assert_eq!(reconnect_delay(8), 128 * MS);
        for attempts in [9, 10, 13, 64, usize::MAX] {
            let d = reconnect_delay(attempts);
            assert!(
                d > RECONNECT_DELAY_MAX / 2 && d <= RECONNECT_DELAY_MAX,
                "try {attempts}: {d:?}"
            );
        }
        let spread: std::collections::HashSet<Duration> =
            (0..20).map(|_| reconnect_delay(20)).collect();
        assert!(spread.len() > 1, "the same wait every time: {spread:?}");
    }

    /// A call of `kind` that started `at` and ended 200 ms later.
    fn ended(s: &Stuck, kind: Call, answered: bool, at: Instant) -> bool {
        s.note(kind, answered, at, at + 200 * MS)
    }

    #[test]
    fn answered_calls_never_ask_for_a_reconnect() {
        let (s, t0) = (Stuck::default(), Instant::now());
        for i in 0..100 {
            assert!(!ended(&s, Call::Write, true, t0 + i * 100 * MS));
            assert!(!ended(&s, Call::Read, true, t0 + i * 100 * MS));
        }
    }

    #[test]
    fn calls_unanswered_for_stuck_after_ask_once_then_once_per_stuck_after() {
        for call in [Call::Write, Call::Read] {
            let (s, t0) = (Stuck::default(), Instant::now());
            assert!(!ended(&s, call, false, t0));
            assert!(!ended(&s, call, false, t0 + 700 * MS));
            // Ends 1.2 s after the first unanswered call started.
            assert!(ended(&s, call, false, t0 + STUCK_AFTER));
            assert!(!ended(&s, call, false, t0 + STUCK_AFTER + 500 * MS));
            assert!(ended(&s, call, false, t0 + STUCK_AFTER * 2));
        }
    }

    #[test]
    fn one_answer_starts_the_count_again() {
        let (s, t0) = (Stuck::default(), Instant::now());
        assert!(!ended(&s, Call::Write, false, t0));
        assert!(!ended(&s, Call::Write, true, t0 + 700 * MS));
        // Started before the answer: counted from the answer (0.9 s).
        assert!(!s.note(Call::Write, false, t0 + 800 * MS, t0 + 1800 * MS));
        assert!(ended(&s, Call::Write, false, t0 + 1800 * MS));
    }

    /// A cut-off server that led the stream answers reads from its own copy
    /// while no write commits: the answered reads do not hide the writes.
    #[test]
    fn answered_reads_do_not_hide_unanswered_writes() {
        let (s, t0) = (Stuck::default(), Instant::now());
        assert!(!ended(&s, Call::Write, false, t0));
        assert!(!ended(&s, Call::Read, true, t0 + 500 * MS));
        assert!(ended(&s, Call::Write, false, t0 + 800 * MS));
    }

    /// A holder whose renewal went unanswered only reads (H4) until one is
    /// answered: those reads' failures count from the unanswered write.
    #[test]
    fn a_write_unanswered_then_reads_unanswered_count_from_the_write() {
        let (s, t0) = (Stuck::default(), Instant::now());
        assert!(!ended(&s, Call::Write, false, t0));
        assert!(!ended(&s, Call::Read, false, t0 + 500 * MS));
        assert!(ended(&s, Call::Read, false, t0 + 900 * MS));
    }

    #[test]
    fn a_handle_idle_for_long_does_not_ask_at_its_first_failure() {
        let (s, t0) = (Stuck::default(), Instant::now());
        assert!(!ended(&s, Call::Write, true, t0));
        assert!(!ended(
            &s,
            Call::Write,
            false,
            t0 + Duration::from_secs(600)
        ));
    }

    /// An INFO whose address is none of the pool's.
    const NO_INFO: (&str, u16) = ("0.0.0.0", 4222);

    #[test]
    fn leaving_also_leaves_the_address_the_server_gives_itself() {
        let c = ServerChoice::default();
        // The URL names a proxy; the cluster advertised 10.0.0.1, the same
        // server, and 10.0.0.2.
        let servers = pool(&[
            ("nats://127.0.0.1:9000", 0),
            ("nats://10.0.0.1:4222", 0),
            ("nats://10.0.0.2:4222", 0),
        ]);
        while c.pick(&servers, NO_INFO).unwrap().addr.port() != 9000 {}
        c.connected();
        c.leave();
        for _ in 0..50 {
            let to = c.pick(&servers, ("10.0.0.1", 4222)).unwrap();
            assert_eq!(to.addr.host(), "10.0.0.2");
        }
    }

    fn pool(addrs: &[(&str, usize)]) -> Vec<Server> {
        addrs
            .iter()
            .map(|(a, failed)| Server {
                addr: a.parse().unwrap(),
                failed_attempts: *failed,
                did_connect: false,
                is_discovered: true,
                last_error: None,
            })
            .collect()
    }

    #[test]
    fn leaving_picks_another_server_the_least_failed() {
        let c = ServerChoice::default();
        let servers = pool(&[
            ("nats://10.0.0.1:4222", 0),
            ("nats://10.0.0.2:4222", 1),
            ("nats://10.0.0.3:4222", 0),
        ]);
        // Connected to 10.0.0.1 (the only one of the least failed left
        // when 10.0.0.3 is taken out).
        let first = loop {
            let to = c.pick(&servers, NO_INFO).unwrap();
            if to.addr.host() == "10.0.0.1" {
                break to;
            }
        };
        assert_eq!(first.addr.host(), "10.0.0.1");
        c.connected();
        c.leave();
        for _ in 0..50 {
            assert_eq!(c.pick(&servers, NO_INFO).unwrap().addr.host(), "10.0.0.3");
        }
        c.connected();
        let picked: std::collections::BTreeSet<String> = (0..200)
            .map(|_| c.pick(&servers, NO_INFO).unwrap().addr.host().to_owned())
            .collect();
        assert_eq!(
            picked.into_iter().collect::<Vec<_>>(),
            ["10.0.0.1", "10.0.0.3"],
            "connected: the usual choice again"
        );
    }

    #[test]
    fn leaving_picks_at_random_among_the_equals() {
        let c = ServerChoice::default();
        let servers = pool(&[
            ("nats://10.0.0.1:4222", 0),
            ("nats://10.0.0.2:4222", 0),
            ("nats://10.0.0.3:4222", 0),
        ]);
        while c.pick(&servers, NO_INFO).unwrap().addr.host() != "10.0.0.1" {}
        c.connected();
        c.leave();
        let picked: std::collections::BTreeSet<String> = (0..200)
            .map(|_| c.pick(&servers, NO_INFO).unwrap().addr.host().to_owned())
            .collect();
        assert_eq!(
            picked.into_iter().collect::<Vec<_>>(),
            ["10.0.0.2", "10.0.0.3"]
        );
    }

    #[test]
    fn leaving_the_only_server_known_goes_back_to_it() {
        let c = ServerChoice::default();
        let servers = pool(&[("nats://10.0.0.1:4222", 0)]);
        c.pick(&servers, NO_INFO).unwrap();
        c.connected();
        c.leave();
        assert_eq!(c.pick(&servers, NO_INFO).unwrap().addr.host(), "10.0.0.1");
    }
}
