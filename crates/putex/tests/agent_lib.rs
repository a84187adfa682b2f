//! The failover agent as a library: agents run in this process through
//! [`putex::agent::run`], as a program that embeds putex runs them — the
//! keeper stays a separate process (the built `putex` binary, passed as
//! `keeper_exe`). What these tests check does not depend on a process
//! boundary: the entry point's shape (settings, a bound listener, a
//! [`Shutdown`]), its typed results, the clean handover, the keeper covering
//! an agent that stops without a release, and the HTTP endpoints on the
//! listener the caller bound. The process-level behaviour (signals, exit
//! codes, SIGKILL, SIGSTOP) stays with `agent_e2e` and `agent_faults`.
//!
//! Each agent has its own keeper directory, as if it ran on a host of its
//! own; the hooks append `start`/`stop` lines to one file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use putex::agent::{AgentError, AgentSettings, ServiceMode};
use putex::core::{ExitReason, TimingConfig};
use putex::shutdown::Shutdown;
use putex::store::StoreUrl;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::agent_http::http_get;
use crate::common::agent::{
    assert_no_overlap, bound, events, putex_bin, starts, timing_slot, wall_ns, Line, TimingSlot, R,
};
use crate::common::nats_server::NatsServer;
use crate::common::{n, runtime};

/// The fast profile (R = 100 ms, F = 3, C = 1) with the hooks writing to
/// `events`, the keeper directory `keeper_dir` and the built binary as the
/// keeper.
fn settings(url: &str, lock: &str, node: &str, keeper_dir: &Path, events: &Path) -> AgentSettings {
    let e = events.display();
    let timing_config = TimingConfig {
        renew: R,
        failures: 3,
        confirm: 1,
        stop_timeout: Duration::from_secs(2),
        ..TimingConfig::default()
    };
    AgentSettings {
        lock: Some(n(lock)),
        store: StoreUrl::parse(url).unwrap(),
        node: node.parse().unwrap(),
        healthcheck: Some("true".into()),
        service: Some(ServiceMode::Hooks {
            activate: format!("echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"),
            deactivate: format!("echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
            fence: None,
        }),
        timing: timing_config.validate().unwrap(),
        timing_config,
        keeper_dir: keeper_dir.to_path_buf(),
        http: None,
        no_cgroup: false,
        keeper_exe: Some(putex_bin().to_path_buf()),
        operator: Default::default(),
        failsafe: None,
    }
}

/// One agent running in this process.
struct InProcess {
    node: String,
    shutdown: Shutdown,
    task: Option<JoinHandle<Result<ExitReason, AgentError>>>,
    port: u16,
}

impl InProcess {
    /// Binds a listener for its endpoints and starts `agent::run`.
    async fn start(url: &str, node: &str, dir: &Path, events: &Path) -> InProcess {
        let keeper_dir = dir.join(format!("keeper-{node}"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = Shutdown::new();
        let task = tokio::spawn(putex::agent::run(
            settings(url, "svc", node, &keeper_dir, events),
            Some(listener),
            shutdown.clone(),
        ));
        InProcess {
            node: node.to_owned(),
            shutdown,
            task: Some(task),
            port,
        }
    }

    /// Waits up to `within` for `agent::run` to return.
    async fn finished(&mut self, within: Duration) -> Result<ExitReason, AgentError> {
        let task = self.task.take().expect("still running");
        tokio::time::timeout(within, task)
            .await
            .unwrap_or_else(|_| panic!("{} did not return within {within:?}", self.node))
            .expect("agent::run does not panic")
    }

    /// `GET path` on its endpoints until it answers `want` (up to 2 s: the
    /// role changes just after the hook line is written); the last answer.
    async fn get_until(&self, path: &'static str, want: u16) -> Option<u16> {
        let mut last = None;
        for _ in 0..100 {
            last = self.get(path).await;
            if last == Some(want) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    }

    /// `GET path` on its endpoints: the status code.
    async fn get(&self, path: &'static str) -> Option<u16> {
        let port = self.port;
        tokio::task::spawn_blocking(move || http_get(port, path).map(|(status, _)| status))
            .await
            .unwrap()
    }
}

impl Drop for InProcess {
    /// Stops the agent's task (its keeper goes with the test's [`Sweep`]).
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Kills every process whose command line names the test's directory (the
/// keepers and what they run) when dropped — after the runtime (see
/// [`Bed`]), which stops every agent task first: a task still running
/// could start a keeper after the sweep.
struct Sweep(PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        for pid in putex::supervision::process::pids_matching(&self.0.display().to_string()) {
            putex_testkit::agent::sigkill(pid);
        }
    }
}

/// What each test runs on, torn down in this order: the runtime (every
/// agent task stops), the [`Sweep`] (their keepers), the nats-server, the
/// directory, and last its [`TimingSlot`] (a few such tests at once).
struct Bed {
    rt: tokio::runtime::Runtime,
    _sweep: Sweep,
    server: NatsServer,
    dir: tempfile::TempDir,
    /// The file the hooks append `start`/`stop` lines to.
    ev: PathBuf,
    _slot: TimingSlot,
}

impl Bed {
    fn new() -> Bed {
        let server = NatsServer::start();
        let slot = timing_slot();
        let dir = tempfile::tempdir().unwrap();
        Bed {
            rt: runtime(),
            _sweep: Sweep(dir.path().to_path_buf()),
            server,
            ev: dir.path().join("events"),
            dir,
            _slot: slot,
        }
    }

    /// Starts `node` against the test's nats-server.
    async fn start(&self, node: &str) -> InProcess {
        self.start_on(&self.server.url, node).await
    }

    /// Starts `node` against the store at `url`.
    async fn start_on(&self, url: &str, node: &str) -> InProcess {
        InProcess::start(url, node, self.dir.path(), &self.ev).await
    }

    /// Waits (up to 10 s) for the first service start.
    async fn first_start(&self) {
        assert!(
            wait_until(Duration::from_secs(10), || !starts(&self.ev).is_empty()).await,
            "nobody activated"
        );
    }
}

async fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < until {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    f()
}

/// `node`'s first stop line other than its start-up stop.
fn first_stop<'a>(lines: &'a [Line], node: &str) -> Option<&'a Line> {
    lines
        .iter()
        .find(|l| l.what == "stop" && l.node == node && l.extra != "startup")
}

/// Two agents in one process: one active, `/primary` answering on its
/// listener and not on the other's; a graceful shutdown returns
/// `Shutdown { released: true }` and the other starts within 100 ms of the
/// stop (S3), not before it.
#[test]
fn agent_lib_two_agents_in_one_process_hand_over_cleanly() {
    let bed = Bed::new();
    bed.rt.block_on(async {
        let mut agents = [bed.start("a").await, bed.start("b").await];
        bed.first_start().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = starts(&bed.ev);
        assert_eq!(s.len(), 1, "{s:?}");
        let holder = agents.iter().position(|a| a.node == s[0].node).unwrap();
        let other = 1 - holder;
        assert_eq!(agents[holder].get("/primary").await, Some(200));
        assert_eq!(agents[other].get("/primary").await, Some(503));
        assert_eq!(agents[other].get("/replica").await, Some(200));

        agents[holder].shutdown.request();
        let exit = agents[holder].finished(Duration::from_secs(5)).await;
        assert!(
            matches!(exit, Ok(ExitReason::Shutdown { released: true })),
            "{exit:?}"
        );
        assert!(
            wait_until(Duration::from_secs(3), || starts(&bed.ev).len() >= 2).await,
            "no handover: {:?}",
            events(&bed.ev)
        );
        let all = events(&bed.ev);
        let stop = first_stop(&all, &agents[holder].node).expect("a stop line");
        assert_eq!(stop.extra, "graceful", "{all:?}");
        let next = &starts(&bed.ev)[1];
        assert_eq!(next.node, agents[other].node);
        assert!(next.ns >= stop.ns, "started before the stop: {all:?}");
        let gap = Duration::from_nanos(u64::try_from(next.ns - stop.ns).unwrap());
        eprintln!("in-process graceful handover gap: {gap:?}");
        assert!(gap <= Duration::from_millis(100), "handover took {gap:?}");
        assert_eq!(
            agents[other].get_until("/primary", 200).await,
            Some(200),
            "the new holder's /primary"
        );

        agents[other].shutdown.request();
        let exit = agents[other].finished(Duration::from_secs(5)).await;
        assert!(matches!(exit, Ok(ExitReason::Shutdown { .. })), "{exit:?}");
        assert_no_overlap(&events(&bed.ev), &[], "");
    });
}

/// An abort (the second signal of the command line) makes an emergency stop
/// through the keeper and returns `AgentError::Aborted`; the other agent
/// starts after that stop and within B + 100 ms of the abort (at once when
/// the graceful stop the abort implies proved the service stopped and
/// released the lock before the emergency stop returned, after the stale
/// wait otherwise: both happen). Then an agent whose `run` future is simply dropped (a program
/// that gives up on it) is covered by its keeper the same way.
#[test]
fn agent_lib_an_abort_or_a_dropped_agent_is_covered_by_its_keeper() {
    let bed = Bed::new();
    bed.rt.block_on(async {
        let mut agents = vec![bed.start("a").await, bed.start("b").await];
        bed.first_start().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let holder = agents
            .iter()
            .position(|a| a.node == starts(&bed.ev)[0].node)
            .unwrap();
        let other = 1 - holder;

        let aborted = wall_ns();
        agents[holder].shutdown.abort();
        let exit = agents[holder].finished(Duration::from_secs(5)).await;
        assert!(matches!(exit, Err(AgentError::Aborted)), "{exit:?}");
        assert!(
            wait_until(Duration::from_secs(5), || starts(&bed.ev).len() >= 2).await,
            "no takeover: {:?}",
            events(&bed.ev)
        );
        let all = events(&bed.ev);
        let stop = first_stop(&all, &agents[holder].node).expect("a stop line");
        let next = starts(&bed.ev)[1].clone();
        assert_eq!(next.node, agents[other].node);
        assert!(next.ns >= stop.ns, "started before the stop: {all:?}");
        let took = Duration::from_nanos(u64::try_from(next.ns - aborted).unwrap());
        let latest = bound() + Duration::from_millis(100);
        eprintln!("in-process takeover after an abort: {took:?} (bound {latest:?})");
        assert!(took <= latest, "takeover took {took:?} > {latest:?}");

        // The new holder's future is dropped: its keeper's deadline stops
        // the service, and a third agent, up in standby, takes over.
        agents.push(bed.start("c").await);
        assert_eq!(
            agents[2].get_until("/replica", 200).await,
            Some(200),
            "c in standby"
        );
        let dropped = wall_ns();
        agents[other].task.take().unwrap().abort();
        assert!(
            wait_until(Duration::from_secs(5), || starts(&bed.ev).len() >= 3).await,
            "no takeover after the drop: {:?}",
            events(&bed.ev)
        );
        let all = events(&bed.ev);
        let third = starts(&bed.ev)[2].clone();
        assert_eq!(third.node, "c");
        let stops: Vec<&Line> = all
            .iter()
            .filter(|l| l.what == "stop" && l.node == agents[other].node && l.extra != "startup")
            .collect();
        assert!(
            stops.iter().any(|l| l.ns <= third.ns),
            "c started before the dropped agent's service stopped: {all:?}"
        );
        let took = Duration::from_nanos(u64::try_from(third.ns - dropped).unwrap());
        eprintln!("in-process takeover after a dropped agent: {took:?} (bound {latest:?})");
        assert!(took <= latest, "takeover took {took:?} > {latest:?}");
        assert_no_overlap(
            &all,
            &[(agents[other].node.clone(), dropped)],
            &format!("{all:?}"),
        );
    });
}

/// Library errors are typed: a second agent for the same lock and store in
/// the same keeper directory is `AlreadyRunning` (the lock file, S5), an
/// unreachable store is `StoreUnreachable`; neither runs anything.
#[test]
fn agent_lib_refusals_are_typed_errors() {
    let bed = Bed::new();
    bed.rt.block_on(async {
        let mut first = bed.start("h1").await;
        bed.first_start().await;
        let mut second = bed.start("h1").await;
        let refused = second.finished(Duration::from_secs(5)).await;
        assert!(
            matches!(&refused, Err(AgentError::AlreadyRunning { lock, .. }) if lock == "svc"),
            "{refused:?}"
        );
        assert_eq!(first.get_until("/primary", 200).await, Some(200));

        // A port nothing listens on: the store cannot be reached.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("nats://{}", free.local_addr().unwrap());
        drop(free);
        let mut unreachable = bed.start_on(&dead, "h2").await;
        let refused = unreachable.finished(Duration::from_secs(30)).await;
        assert!(
            matches!(refused, Err(AgentError::StoreUnreachable { .. })),
            "{refused:?}"
        );
        assert_eq!(starts(&bed.ev).len(), 1, "{:?}", events(&bed.ev));

        first.shutdown.request();
        let exit = first.finished(Duration::from_secs(5)).await;
        assert!(matches!(exit, Ok(ExitReason::Shutdown { .. })), "{exit:?}");
    });
}
