//! `putex run` under faults, end to end: real agent processes against a real
//! single-node nats-server and a real single-member etcd (every test runs
//! on both, `on_nats_and_etcd!`; etcd's takeovers wait longer, its store
//! clock reads in whole seconds: `bound_for`), fast timing (R = 100 ms,
//! F = 3, C = 1), hooks that append `start`/`stop` lines to a file (helpers
//! in `common/agent.rs`, shared with `agent_e2e.rs`, a few timing-sensitive tests at once).
//!
//! - health: K failed `active` checks step the holder down with a release;
//!   flapping checks under `--successes`/`--unhealthy` cause no transition;
//!   a service that fails everywhere rotates with back-off, not forever;
//! - the holder cut off from the store (the test kit's fault proxy in front
//!   of its store, cut: `Mode::Cut`), and the store itself paused shorter
//!   and longer than T;
//! - the store down (killed) and back: the holder stops by T, the service
//!   runs again within the bound of the store's return;
//! - the holder's agent frozen (SIGSTOP) while its keeper runs;
//! - a second machine with the same node id.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::store::nats::RECONNECT_DELAY_MAX;

use crate::common::agent::{
    assert_no_overlap, bound_for, dump, events, fast, hooks, start, starts, timing_slot, wait_for,
    wall_ns, Agent, Line, R,
};
use crate::common::proxy::{Mode, Proxy};
use crate::common::store::Backend;

/// A test on a real nats-server and on a real single-member etcd: a
/// module `$name` with the tests `nats` and `etcd`, each calling
/// `$body(&server)`.
macro_rules! on_nats_and_etcd {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn nats() {
                let store = Backend::nats();
                let _slot = timing_slot();
                $body(&store);
            }

            #[test]
            fn etcd() {
                let store = Backend::etcd();
                let _slot = timing_slot();
                $body(&store);
            }
        }
    };
}

/// T = F·R of the fast profile.
const T: Duration = Duration::from_millis(300);

/// Slack for a hook to run and write its line after the agent decided
/// (a fork of `sh` and `date` on a loaded two-core machine).
const HOOK_SLACK: Duration = Duration::from_millis(100);

fn ms(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// How long after `fault` (a [`wall_ns`] reading) the event at `ns`
/// happened; zero for one before it. Callers first make sure that the
/// events they measure came after the fault ([`lapsed_before`]).
fn after(fault: u128, ns: u128) -> Duration {
    ms(ns.saturating_sub(fault))
}

/// `Err` when `node`'s service stopped (a stop other than the start-up
/// one) before `fault`: the holder lapsed on its own — with R = 100 ms a
/// loaded machine (CI runs other work alongside) can delay a renewal past
/// T — so a test of what the fault does learns nothing from this try.
fn lapsed_before(c: &Cluster, node: &str, fault: u128, what: &str) -> Result<(), String> {
    match c
        .events()
        .iter()
        .find(|l| l.what == "stop" && l.node == node && l.extra != "startup" && l.ns < fault)
    {
        Some(l) => Err(format!(
            "{node} lapsed {:?} before the {what} ({} stop)\n{}",
            after(l.ns, fault),
            l.extra,
            c.dump()
        )),
        None => Ok(()),
    }
}

/// The keeper's stop of `node`'s service: its first stop line that is not
/// start-up's, waited for up to 2 s. The deactivate hook that writes it is
/// a shell the keeper starts at the licence's deadline, and on a loaded
/// machine its line can land after the next holder's start was seen (busy
/// run 2 of session 52). When the stop came is judged by the time the line
/// carries (the callers check it against the next start), never by when
/// it was read.
fn keepers_stop(c: &Cluster, node: &str) -> Line {
    let find = || {
        c.events()
            .into_iter()
            .find(|l| l.what == "stop" && l.node == node && l.extra != "startup")
    };
    let mut stop = None;
    wait_for(Duration::from_secs(2), || {
        stop = find();
        stop.is_some()
    });
    stop.unwrap_or_else(|| panic!("the keeper did not stop the service\n{}", c.dump()))
}

/// Runs `one_try` until it returns `Ok`, at most three times: a try that
/// returns `Err` (the holder lapsed before the fault, [`lapsed_before`];
/// nothing overlapped, every try checks that) says nothing about the fault.
fn tries(what: &str, mut one_try: impl FnMut() -> Result<(), String>) {
    for attempt in 1..=3 {
        match one_try() {
            Ok(()) => return,
            Err(why) => eprintln!("try {attempt}: {why}; trying again"),
        }
    }
    panic!("the holder lapsed before the {what} in three tries: the machine is too loaded");
}

/// A test's agents, events file and health control directory.
struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    ev: PathBuf,
    agents: Vec<Agent>,
}

impl Cluster {
    fn new(url: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ev = dir.path().join("events");
        let c = Cluster {
            url: url.into(),
            ev,
            agents: Vec::new(),
            dir,
        };
        std::fs::write(c.health_script(), HEALTH_SCRIPT.replace("@DIR@", &c.dir())).unwrap();
        c
    }

    fn dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn health_script(&self) -> PathBuf {
        self.dir.path().join("health.sh")
    }

    /// Sets `node`'s health: `ok`, `sick` (its `active` checks fail), or
    /// `flap` (every other check fails).
    fn set_health(&self, node: &str, mode: &str) {
        let p = self.dir.path().join(format!("health-{node}"));
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, format!("{mode}\n")).unwrap();
        std::fs::rename(tmp, p).unwrap();
    }

    /// Starts an agent for lock `svc` in hook mode with the health script,
    /// on `url` (the cluster's if `None`), with `extra` flags and `env`.
    fn start(
        &mut self,
        node: &str,
        url: Option<&str>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let mut flags = hooks(&self.ev);
        flags.push("--healthcheck".into());
        flags.push(format!("/bin/sh {}", self.health_script().display()));
        flags.extend(extra.iter().map(|s| s.to_string()));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let keeper_dir = self
            .dir
            .path()
            .join(format!("keeper-{node}-{}", self.agents.len()));
        let url = url.unwrap_or(&self.url).to_owned();
        self.agents.push(start(
            fast(self.dir.path(), &url, "svc", node, &flags)
                .keeper_dir(&keeper_dir)
                .env(env),
        ));
        self.agents.len() - 1
    }

    fn agent(&self, node: &str) -> &Agent {
        self.agents
            .iter()
            .rev()
            .find(|a| a.node() == node)
            .expect("agent")
    }

    fn events(&self) -> Vec<Line> {
        events(&self.ev)
    }

    fn starts(&self) -> Vec<Line> {
        starts(&self.ev)
    }

    fn dump(&self) -> String {
        dump(&self.agents.iter().collect::<Vec<_>>(), &self.ev)
    }

    /// Waits until `node`'s log holds `needle` at least `times` times.
    fn wait_log(&self, node: &str, needle: &str, times: usize, within: Duration) -> bool {
        let a = self.agent(node);
        wait_for(within, || a.log_text().matches(needle).count() >= times)
    }

    /// Waits until `node` has logged a transition to standby.
    fn wait_standby(&self, node: &str, within: Duration) {
        assert!(
            self.wait_log(node, "-> standby", 1, within),
            "{node} did not reach standby\n{}",
            self.dump()
        );
    }

    /// Starts `first` alone and waits for it to activate, then the others
    /// and waits for them to stand by: a steady state with `first` active.
    fn steady(&mut self, first: (&str, Option<&str>), others: &[&str], extra: &[&str]) {
        if let Err(e) = self.try_steady(first, others, extra) {
            panic!("{e}");
        }
    }

    /// [`Cluster::steady`], with `Err` if the first holder did not stay the
    /// only one (a lapse on a loaded machine; nothing overlapped).
    fn try_steady(
        &mut self,
        first: (&str, Option<&str>),
        others: &[&str],
        extra: &[&str],
    ) -> Result<(), String> {
        self.start(first.0, first.1, extra, &[]);
        assert!(
            wait_for(Duration::from_secs(5), || !self.starts().is_empty()),
            "{} did not activate\n{}",
            first.0,
            self.dump()
        );
        for n in others {
            self.start(n, None, extra, &[]);
        }
        for n in others {
            self.wait_standby(n, Duration::from_secs(5));
        }
        // A few renewals seen by everyone.
        std::thread::sleep(R * 3);
        assert_no_overlap(&self.events(), &[], &self.dump());
        if self.starts().len() != 1 {
            return Err(format!("not steady: more than one start\n{}", self.dump()));
        }
        Ok(())
    }

    /// Prints the events and logs when `PUTEX_E2E_DUMP` is set.
    fn maybe_dump(&self) {
        if std::env::var_os("PUTEX_E2E_DUMP").is_some() {
            eprintln!("{}", self.dump());
        }
    }

    /// Transition lines logged by every agent so far.
    fn transitions(&self) -> usize {
        self.agents
            .iter()
            .map(|a| a.log_text().matches("transition ").count())
            .sum()
    }

    /// Nodes whose service runs according to the events file.
    fn running(&self) -> Vec<String> {
        running(&self.events())
    }
}

/// Nodes that started and have not stopped since (start-up stops aside).
fn running(lines: &[Line]) -> Vec<String> {
    let mut on: Vec<String> = Vec::new();
    for l in lines {
        match l.what.as_str() {
            "start" => on.push(l.node.clone()),
            "stop" if l.extra != "startup" => on.retain(|n| *n != l.node),
            _ => {}
        }
    }
    on
}

/// The health check. Its mode comes from `health-$PUTEX_NODE` (default
/// `ok`); shell builtins only, so that it stays far inside its R/2 timeout.
const HEALTH_SCRIPT: &str = r#"mode=ok
[ -e "@DIR@/health-$PUTEX_NODE" ] && read mode < "@DIR@/health-$PUTEX_NODE"
case "$mode" in
  ok) exit 0 ;;
  sick) [ "$1" != active ] ;;
  flap)
    f="@DIR@/count-$PUTEX_NODE"
    n=0
    [ -e "$f" ] && read n < "$f"
    echo $((n + 1)) > "$f"
    [ $((n % 2)) -eq 0 ] ;;
  *) exit 1 ;;
esac
"#;

// ---------------------------------------------------------------------------
// Health.

on_nats_and_etcd!(
    agent_faults_k_failed_active_checks_step_down_with_a_release,
    k_failed_active_checks_step_down_with_a_release
);

fn k_failed_active_checks_step_down_with_a_release(server: &Backend) {
    tries("checks failed", || k_failed_try(server));
}

/// One try of the step-down test; `Err` when the holder lapsed before its
/// checks began to fail.
fn k_failed_try(server: &Backend) -> Result<(), String> {
    let mut c = Cluster::new(&server.url());
    // K = 2 < F = 3. With K = F the K-th failed check races the licence: the
    // holder skipped K − 1 renewals, so its licence ends just as the K-th
    // check is due, and it often lapses (an emergency stop, no release)
    // instead of stepping down.
    let extra = ["--start-grace", "0s", "--unhealthy", "2"];
    c.try_steady(("n1", None), &["n2", "n3"], &extra)?;

    let sick = wall_ns();
    c.set_health("n1", "sick");
    assert!(
        wait_for(Duration::from_secs(3), || c.starts().len() >= 2),
        "nobody took over from the unhealthy holder\n{}",
        c.dump()
    );
    std::thread::sleep(R * 3);
    lapsed_before(&c, "n1", sick, "checks failed")?;
    let all = c.events();
    let stop = all
        .iter()
        .find(|l| l.what == "stop" && l.node == "n1" && l.extra != "startup")
        .expect("n1 stopped")
        .clone();
    let next = c.starts()[1].clone();
    let detect = after(sick, stop.ns);
    let handover = ms(next.ns.saturating_sub(stop.ns));
    eprintln!(
        "K = 2 failed checks → {} stop after {detect:?}; next start {handover:?} later",
        stop.extra
    );
    // On a loaded machine the renewals of a holder stepping down can reach
    // its keeper too late: the licence ends during the stop and the keeper
    // fires (CI of 819bd8a: a 284 ms deactivate hook; a busy-loop run of
    // d82d65a: renewals that did not land within 100 ms). The release still
    // comes once the stop is proven, but the stop is then the keeper's
    // emergency one, and what is measured below (stop line to next start)
    // includes the slow hook: not the case under test. Judged before the
    // stop's kind, which it changes.
    if c.agent("n1")
        .log_text()
        .contains("the keeper's deadline passed")
    {
        return Err(format!(
            "n1's licence ended while it stepped down (its keeper fired)\n{}",
            c.dump()
        ));
    }
    assert_eq!(stop.extra, "graceful", "{}", c.dump());
    assert_ne!(next.node, "n1");
    // The second failed check in a row: at least R after the first one.
    assert!(detect >= R, "stepped down after {detect:?}\n{}", c.dump());
    assert!(
        detect <= R * 3 + HOOK_SLACK,
        "stepped down only after {detect:?}\n{}",
        c.dump()
    );
    // Released (S3): no staleness wait (W + G ≈ 400 ms) for the next one.
    assert!(next.ns >= stop.ns, "{}", c.dump());
    assert!(
        handover <= Duration::from_millis(200),
        "handover took {handover:?}: no release?\n{}",
        c.dump()
    );
    let log = c.agent("n1").log_text();
    assert!(log.contains("reason=Unhealthy"), "{log}");
    assert_no_overlap(&all, &[], &c.dump());
    assert_eq!(c.running(), vec![next.node.clone()], "{}", c.dump());
    // The unhealthy node stays up as a standby.
    assert!(c.agents[0].child.try_wait().unwrap().is_none(), "{log}");
    c.maybe_dump();
    Ok(())
}

on_nats_and_etcd!(
    agent_faults_flapping_health_changes_nothing_under_hysteresis,
    flapping_health_changes_nothing_under_hysteresis
);

fn flapping_health_changes_nothing_under_hysteresis(server: &Backend) {
    let mut c = Cluster::new(&server.url());
    // A flapping holder fails every other check. With K = 3, one passing
    // check that times out on a loaded machine (a timeout counts as a
    // failure; R = 100 ms leaves it 50 ms) sits between two failures and
    // makes three in a row (seen once in CI run ag): K = 5 needs two such
    // in one short stretch. F = 7: a failed check skips its renewal, so a
    // flapping holder renews every 2 R, and two slow checks make that 4 R,
    // all inside T = 7 R.
    let extra = [
        "--start-grace",
        "0s",
        "--successes",
        "3",
        "--unhealthy",
        "5",
        "--failures",
        "7",
    ];
    c.set_health("n2", "flap");
    c.steady(("n1", None), &["n2"], &extra);

    // The holder flaps too: pass, fail, pass, … never K failures in a row,
    // and its renewals every 2 R stay inside its licence.
    c.set_health("n1", "flap");
    let before = (c.events().len(), c.transitions());
    std::thread::sleep(Duration::from_secs(3));
    let after = (c.events().len(), c.transitions());
    eprintln!(
        "flapping for 3 s: {} new events, {} new transitions",
        after.0 - before.0,
        after.1 - before.1
    );
    assert_eq!(before, after, "transitions while flapping\n{}", c.dump());
    assert_eq!(c.running(), vec!["n1".to_string()], "{}", c.dump());

    // A free lock is not taken by a standby that never passes S = 3 checks
    // in a row, and is as soon as it does.
    let n1 = c.agents.iter_mut().find(|a| a.node() == "n1").unwrap();
    n1.sigterm();
    assert_eq!(n1.wait_exit(Duration::from_secs(5)), Some(0));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        c.starts().len(),
        1,
        "the flapping standby took the lock\n{}",
        c.dump()
    );
    let healed = wall_ns();
    c.set_health("n2", "ok");
    assert!(
        wait_for(Duration::from_secs(2), || c.starts().len() == 2),
        "n2 did not take the released lock once healthy\n{}",
        c.dump()
    );
    let took = ms(c.starts()[1].ns - healed);
    eprintln!("healthy standby acquired the released lock {took:?} after its checks recovered");
    // S = 3 good checks in a row. The first may be a passing check of the
    // flapping phase just before the healing, so at least two more, about
    // one R apart, follow it (minus the jitter of when each round's check
    // finishes): well over R/2 after the healing, never at the first check.
    assert!(took >= R / 2, "acquired after {took:?}\n{}", c.dump());
    c.maybe_dump();
}

/// One transition an agent logged: when (wall clock, ns), from, to.
struct Transition {
    ns: u128,
    from: String,
    to: String,
}

/// The transitions in an agent's log, in order.
fn transitions(log: &str) -> Vec<Transition> {
    log.lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(": transition ")?;
            let (from, rest) = rest.split_once(" -> ")?;
            let to = rest.split_once(' ').map_or(rest, |(to, _)| to);
            let at = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
            Some(Transition {
                ns: at.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos(),
                from: from.into(),
                to: to.into(),
            })
        })
        .collect()
}

on_nats_and_etcd!(
    agent_faults_a_service_failing_everywhere_rotates_with_back_off,
    a_service_failing_everywhere_rotates_with_back_off
);

/// A service whose `active` checks fail on every node: the lock keeps
/// moving (each holder steps down at its first failed check, K = 1), but
/// each node waits T after its first step-down, 2 T after its second, 4 T,
/// … before it acquires again. Both sides: no node acquires before its
/// back-off ends, and a free lock is taken soon after the first back-off in
/// force ends (so the back-off is T·2^k, not longer, and the lock is never
/// left idle for nothing). Timed from the agents' own decisions (their
/// logged transitions), not from hooks, whose delays a loaded machine
/// stretches.
fn a_service_failing_everywhere_rotates_with_back_off(server: &Backend) {
    let mut c = Cluster::new(&server.url());
    let extra = ["--start-grace", "0s", "--unhealthy", "1"];
    let nodes = ["n1", "n2", "n3"];
    // Sick from the start (a healthy phase first would meet K = 1 and a
    // health check timing out on a loaded machine).
    let sick = wall_ns();
    for n in nodes {
        c.set_health(n, "sick");
        c.start(n, None, &extra, &[]);
    }
    // Per node, since the service fell sick: step-down decisions (the
    // back-off starts there), releases, and acquisitions.
    let timeline = |c: &Cluster, node: &str, from: &str, to: &str| -> Vec<u128> {
        transitions(&c.agent(node).log_text())
            .into_iter()
            .filter(|t| t.ns >= sick && t.from == from && t.to == to)
            .map(|t| t.ns)
            .collect()
    };
    let started = |c: &Cluster, node: &str| timeline(c, node, "starting", "standby");
    let step_downs = |c: &Cluster, node: &str| timeline(c, node, "active", "stepping-down");
    let releases = |c: &Cluster, node: &str| timeline(c, node, "stepping-down", "standby");
    let acquisitions = |c: &Cluster, node: &str| timeline(c, node, "standby", "confirming");
    // Three step-downs on every node (back-offs T, 2 T and 4 T), and an
    // acquisition after the last of them (when the first of the back-offs
    // then in force ends).
    let observed = |c: &Cluster| {
        let last = nodes
            .iter()
            .filter_map(|n| step_downs(c, n).last().copied())
            .max();
        nodes.iter().all(|n| step_downs(c, n).len() >= 3)
            && last.is_some_and(|last| {
                nodes
                    .iter()
                    .any(|n| acquisitions(c, n).iter().any(|a| *a > last))
            })
    };
    assert!(
        wait_for(Duration::from_secs(20), || observed(&c)),
        "three step-downs on every node and an acquisition after them did not come within 20 s\n{}",
        c.dump()
    );
    let downs: Vec<Vec<u128>> = nodes.iter().map(|n| step_downs(&c, n)).collect();
    let taken: Vec<Vec<u128>> = nodes.iter().map(|n| acquisitions(&c, n)).collect();
    // Each release with its node's step-down before it: a waiter may log
    // its acquisition before the releasing process logs its release (the
    // release's compare-and-swap reached the waiter's watch first), never
    // before the step-down began.
    let mut freed: Vec<(u128, u128)> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| {
            let downs = &downs[i];
            releases(&c, n).into_iter().map(move |free| {
                let since = downs.iter().copied().filter(|d| *d <= free).max();
                (free, since.unwrap_or(free))
            })
        })
        .collect();
    freed.sort_unstable();
    let backoff = |k: usize| T * (1u32 << k.min(4));
    eprintln!(
        "service failing everywhere: {} step-downs, {} acquisitions in {:?}",
        downs.iter().map(Vec::len).sum::<usize>(),
        taken.iter().map(Vec::len).sum::<usize>(),
        ms(freed.last().map_or(sick, |(free, _)| *free) - sick)
    );

    // The safe side: after its k-th step-down a node stays out T·2^k (less
    // 1 % for clock rates).
    for (i, node) in nodes.iter().enumerate() {
        for (k, down) in downs[i].iter().enumerate() {
            let Some(next) = taken[i].iter().find(|a| **a > *down) else {
                continue;
            };
            let waited = ms(next - down);
            assert!(
                waited >= backoff(k).mul_f64(0.99),
                "{node} acquired {waited:?} after its step-down #{}, before its back-off {:?}\n{}",
                k + 1,
                backoff(k),
                c.dump()
            );
        }
    }
    // The live side: once all three run, the lock is released and the
    // first back-off in force has ended, some node takes it within a
    // hand-over (generous for a loaded machine: a store round trip or two).
    let all_up = nodes
        .iter()
        .filter_map(|n| started(&c, n).first().copied())
        .max()
        .unwrap_or(u128::MAX);
    for (free, since) in freed.iter().filter(|(f, _)| *f >= all_up) {
        let Some(next) = taken.iter().flatten().filter(|a| **a > *since).min() else {
            continue;
        };
        let out_of_backoff = (0..nodes.len())
            .map(|i| {
                let before: Vec<&u128> = downs[i].iter().filter(|d| **d <= *free).collect();
                before
                    .last()
                    .map_or(0, |d| **d + backoff(before.len() - 1).as_nanos())
            })
            .min()
            .unwrap_or(0);
        let late = ms(next.saturating_sub((*free).max(out_of_backoff)));
        assert!(
            late <= Duration::from_secs(1),
            "the lock lay free and out of back-off for {late:?}\n{}",
            c.dump()
        );
    }
    let all: Vec<Line> = c.events().into_iter().filter(|l| l.ns >= sick).collect();
    assert_no_overlap(&all, &[], &c.dump());
    c.maybe_dump();
}

// ---------------------------------------------------------------------------
// The store out of reach.

/// After a fault: one node runs the service and it stays so for a while.
fn assert_one_active_and_stable(c: &Cluster, within: Duration) {
    assert!(
        wait_for(within, || c.running().len() == 1),
        "not exactly one active: {:?}\n{}",
        c.running(),
        c.dump()
    );
    let n = c.events().len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(c.running().len(), 1, "{}", c.dump());
    assert_eq!(c.events().len(), n, "not stable\n{}", c.dump());
}

on_nats_and_etcd!(
    agent_faults_the_holder_cut_off_from_the_store_stops_before_anyone_starts,
    the_holder_cut_off_from_the_store_stops_before_anyone_starts
);

fn the_holder_cut_off_from_the_store_stops_before_anyone_starts(server: &Backend) {
    tries("cut", || cut_off_try(server));
}

/// One try of the cut-off test; `Err` when the holder lapsed before the cut.
/// A later try runs on the same store once the earlier try's agents are
/// gone: n1 takes their stale record over (after W + G) and goes on.
fn cut_off_try(server: &Backend) -> Result<(), String> {
    let url = server.url();
    // n1 reaches the store through a proxy: cut, it loses its connections
    // and new ones hang.
    let proxy = Proxy::start_blocking(server.addr()).unwrap();
    let via = server.url_via(proxy.addr());
    let mut c = Cluster::new(&url);
    c.try_steady(("n1", Some(&via)), &["n2", "n3"], &[])?;

    let cut = wall_ns();
    proxy.set(Mode::Cut);
    assert!(
        wait_for(bound_for(&url) * 3, || c.starts().len() >= 2),
        "nobody took over from the isolated holder\n{}",
        c.dump()
    );
    std::thread::sleep(R);
    let all = c.events();
    assert_no_overlap(&all, &[], &c.dump());
    lapsed_before(&c, "n1", cut, "cut")?;
    let stop = keepers_stop(&c, "n1");
    let next = c.starts()[1].clone();
    eprintln!(
        "cut off: n1 stopped ({}) {:?} after the cut; {} started {:?} after the cut",
        stop.extra,
        after(cut, stop.ns),
        next.node,
        after(cut, next.ns)
    );
    assert!(
        stop.ns < next.ns,
        "the new holder started first\n{}",
        c.dump()
    );
    // Its licence ended at most T after its last renewal, sent before the cut.
    assert!(
        after(cut, stop.ns) <= T + HOOK_SLACK,
        "the isolated holder stopped {:?} after the cut\n{}",
        after(cut, stop.ns),
        c.dump()
    );
    assert_no_overlap(&all, &[], &c.dump());

    // Healed: the old holder reconnects and stays a standby; one active.
    let healed = Instant::now();
    proxy.set(Mode::Pass);
    if url.starts_with("nats:") {
        assert!(
            c.wait_log("n1", "event: connected", 2, Duration::from_secs(8)),
            "n1 did not reconnect\n{}",
            c.dump()
        );
        eprintln!("n1 reconnected {:?} after healing", healed.elapsed());
    }
    assert!(
        wait_for(Duration::from_secs(8), || member_role(&c, "n1")
            == "standby"),
        "n1 is not a standby after healing\n{}",
        c.dump()
    );
    eprintln!("n1 a standby again {:?} after healing", healed.elapsed());
    assert_one_active_and_stable(&c, Duration::from_secs(2));
    assert_eq!(c.running(), vec![next.node.clone()], "{}", c.dump());
    assert_no_overlap(&c.events(), &[], &c.dump());
    c.maybe_dump();
    Ok(())
}

/// Records every distinct version of `node`'s member record of lock `svc`
/// into `seen` until `done`.
fn poll_member(
    url: &str,
    node: &str,
    seen: &std::sync::Mutex<Vec<serde_json::Value>>,
    done: &AtomicBool,
) {
    use putex::store::{keys, AnyStore, ReadMode, Store, StoreUrl};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = AnyStore::open(&StoreUrl::parse(url).unwrap())
            .await
            .unwrap();
        let key = keys::member(&"svc".parse().unwrap(), &node.parse().unwrap());
        let mut last = None;
        while !done.load(Ordering::SeqCst) {
            if let Ok(Some(e)) = store
                .get(&key, ReadMode::Leader, Duration::from_secs(1))
                .await
            {
                if last != Some(e.token) {
                    last = Some(e.token);
                    if let Ok(v) = serde_json::from_slice(&e.value) {
                        seen.lock().unwrap().push(v);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
}

/// `putex status -o json` for lock `svc`.
fn status(c: &Cluster) -> serde_json::Value {
    crate::common::agent::status_json(&c.url, "svc")
}

/// `node`'s role in its member record.
fn member_role(c: &Cluster, node: &str) -> String {
    status(c)["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node"] == node)
        .and_then(|m| m["role"].as_str())
        .unwrap_or("")
        .to_owned()
}

on_nats_and_etcd!(
    agent_faults_a_store_pause_shorter_than_t_changes_nothing,
    a_store_pause_shorter_than_t_changes_nothing
);

fn a_store_pause_shorter_than_t_changes_nothing(server: &Backend) {
    // R = 500 ms (T = 1.5 s) and pauses of T/3: each pause outlasts a
    // renewal's turn, so a renewal is held or times out in it, and still
    // leaves a second of the licence for the store to answer again. With
    // R = 100 ms the same test measured a loaded machine more than the
    // pause (CI: the etcd holder lapsed once in a suite beside a build).
    let t = Duration::from_millis(1500);
    let mut c = Cluster::new(&server.url());
    c.steady(("n1", None), &["n2", "n3"], &["--renew", "500ms"]);
    let before = (c.events().len(), c.transitions());
    // Between pauses, T: renewals land (every R) and the licence is whole
    // again before the next pause.
    for _ in 0..3 {
        server.pause();
        std::thread::sleep(t / 3);
        server.resume();
        std::thread::sleep(t);
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = (c.events().len(), c.transitions());
    eprintln!(
        "store paused 3 × T/3: {} new events, {} new transitions",
        after.0 - before.0,
        after.1 - before.1
    );
    assert_eq!(
        before,
        after,
        "a store pause of T/3 caused transitions\n{}",
        c.dump()
    );
    assert_eq!(c.running(), vec!["n1".to_string()], "{}", c.dump());
    c.maybe_dump();
}

on_nats_and_etcd!(
    agent_faults_a_store_pause_longer_than_t_lapses_the_holder_then_one_active,
    a_store_pause_longer_than_t_lapses_the_holder_then_one_active
);

fn a_store_pause_longer_than_t_lapses_the_holder_then_one_active(server: &Backend) {
    tries("pause", || store_pause_try(server));
}

/// One try of the pause test; `Err` when the holder lapsed before the pause.
fn store_pause_try(server: &Backend) -> Result<(), String> {
    let url = server.url();
    let mut c = Cluster::new(&url);
    c.try_steady(("n1", None), &["n2", "n3"], &[])?;
    let paused = wall_ns();
    server.pause();
    std::thread::sleep(T * 3);
    let stopped_by_then = c
        .events()
        .into_iter()
        .find(|l| l.what == "stop" && l.node == "n1" && l.extra != "startup");
    server.resume();
    lapsed_before(&c, "n1", paused, "pause")?;
    let stop = stopped_by_then.unwrap_or_else(|| {
        panic!(
            "the holder did not lapse while the store was paused\n{}",
            c.dump()
        )
    });
    eprintln!(
        "store paused for 3 T: n1 stopped ({}) {:?} after the pause began",
        stop.extra,
        after(paused, stop.ns)
    );
    assert!(
        after(paused, stop.ns) <= T + HOOK_SLACK,
        "n1 stopped {:?} after the pause began\n{}",
        after(paused, stop.ns),
        c.dump()
    );
    assert_one_active_and_stable(&c, Duration::from_secs(5) + bound_for(&url));
    let all = c.events();
    assert!(
        all.iter()
            .filter(|l| l.what == "start")
            .all(|l| l.ns < paused || l.ns > stop.ns),
        "{}",
        c.dump()
    );
    assert_no_overlap(&all, &[], &c.dump());
    c.maybe_dump();
    Ok(())
}

// ---------------------------------------------------------------------------
// The store down and back.

/// A store outage: the server killed, and started again on its port and
/// data 3 s later. Both sides: the holder stops by T, as for a pause, and
/// nobody runs the service while the store is down; and the service runs
/// again within B + a quarter second (the standbys' clients try to
/// reconnect at least every 250 ms) + twice a hook's slack of the store's
/// return. async-nats alone backs off to 4 s between tries: after this
/// outage a standby on NATS started 1.5 s after the store's return (a
/// 5 s outage: 4.3 s at R = 100 ms, F = 10); with its tries at least every
/// 250 ms, 0.14-0.51 s.
mod agent_faults_after_a_store_outage_the_service_runs_again_within_the_bound {
    use super::*;

    #[test]
    fn nats() {
        let mut store = Backend::nats();
        let _slot = timing_slot();
        after_a_store_outage_the_service_runs_again_within_the_bound(&mut store);
    }

    #[test]
    fn etcd() {
        let mut store = Backend::etcd();
        let _slot = timing_slot();
        after_a_store_outage_the_service_runs_again_within_the_bound(&mut store);
    }
}

/// How long the store stays down.
const OUTAGE: Duration = Duration::from_secs(3);

fn after_a_store_outage_the_service_runs_again_within_the_bound(server: &mut Backend) {
    tries("outage", || store_outage_try(server));
}

/// One try of the outage test; `Err` when the holder lapsed before it.
fn store_outage_try(server: &mut Backend) -> Result<(), String> {
    let url = server.url();
    let mut c = Cluster::new(&url);
    c.try_steady(("n1", None), &["n2", "n3"], &[])?;
    let down = wall_ns();
    server.kill();
    std::thread::sleep(OUTAGE);
    let during = c.events();
    server.restart();
    let back = wall_ns();
    lapsed_before(&c, "n1", down, "outage")?;
    let stop = during
        .iter()
        .find(|l| l.what == "stop" && l.node == "n1" && l.extra != "startup")
        .unwrap_or_else(|| {
            panic!(
                "the holder did not stop while the store was down\n{}",
                c.dump()
            )
        })
        .clone();
    assert!(
        after(down, stop.ns) <= T + HOOK_SLACK,
        "n1 stopped {:?} after the store went down\n{}",
        after(down, stop.ns),
        c.dump()
    );
    assert!(
        !during.iter().any(|l| l.what == "start" && l.ns > down),
        "a service started while the store was down\n{}",
        c.dump()
    );
    let within = bound_for(&url) + RECONNECT_DELAY_MAX + HOOK_SLACK * 2;
    // A start after `down` came after the restart (none came during the
    // outage); on etcd maybe before `back`, which waits for etcdctl to say
    // the member is healthy.
    wait_for(within * 3, || {
        c.events().iter().any(|l| l.what == "start" && l.ns > down)
    });
    let next = c
        .events()
        .into_iter()
        .find(|l| l.what == "start" && l.ns > down)
        .unwrap_or_else(|| panic!("no service started after the store came back\n{}", c.dump()));
    eprintln!(
        "store down for {OUTAGE:?}: n1 stopped {:?} into it; {} started {:?} after it was back (at most {within:?})",
        after(down, stop.ns),
        next.node,
        after(back, next.ns)
    );
    assert!(
        after(back, next.ns) <= within,
        "{} started {:?} after the store was back (at most {within:?})\n{}",
        next.node,
        after(back, next.ns),
        c.dump()
    );
    assert_one_active_and_stable(&c, bound_for(&url));
    assert_no_overlap(&c.events(), &[], &c.dump());
    c.maybe_dump();
    Ok(())
}

// ---------------------------------------------------------------------------
// A frozen agent.

on_nats_and_etcd!(
    agent_faults_a_frozen_agent_is_covered_by_its_keeper,
    a_frozen_agent_is_covered_by_its_keeper
);

/// What it measures: SIGSTOP of the holder's agent (not of its keeper or
/// service) at `frozen`; the keeper alone must stop the service by the
/// licence's end, at most T after the freeze (its deadline is the last
/// renewal's send time + T, and that renewal was sent before the freeze),
/// and before anyone else starts it. A stop from before the freeze is no
/// keeper's work: the holder lapsed on its own, and the test tries again
/// (it once took that stop for the keeper's and underflowed computing
/// "stop − freeze").
fn a_frozen_agent_is_covered_by_its_keeper(server: &Backend) {
    tries("freeze", || frozen_agent_try(server));
}

/// One try of the freeze test; `Err` when the holder lapsed before it.
fn frozen_agent_try(server: &Backend) -> Result<(), String> {
    let url = server.url();
    let mut c = Cluster::new(&url);
    c.try_steady(("n1", None), &["n2", "n3"], &[])?;
    let pid = Pid::from_raw(c.agent("n1").pid());
    let frozen = wall_ns();
    kill(pid, Signal::SIGSTOP).unwrap();
    // Frozen until a standby took over (by the bound B; etcd's is longer).
    wait_for((T * 3).max(bound_for(&url) * 2), || {
        c.events()
            .iter()
            .any(|l| l.what == "start" && l.node != "n1")
    });
    let during = c.events();
    kill(pid, Signal::SIGCONT).unwrap();
    lapsed_before(&c, "n1", frozen, "freeze")?;
    let stop = keepers_stop(&c, "n1");
    let next = during.iter().find(|l| l.what == "start" && l.node != "n1");
    eprintln!(
        "agent frozen: the keeper stopped the service ({}) {:?} after SIGSTOP; next start {:?} after it",
        stop.extra,
        after(frozen, stop.ns),
        next.map(|n| after(frozen, n.ns))
    );
    assert_eq!(stop.extra, "emergency", "{}", c.dump());
    assert!(
        after(frozen, stop.ns) <= T + HOOK_SLACK,
        "the keeper stopped {:?} after the freeze\n{}",
        after(frozen, stop.ns),
        c.dump()
    );
    let next = next.unwrap_or_else(|| panic!("nobody took over within 2 B\n{}", c.dump()));
    assert!(stop.ns < next.ns, "{}", c.dump());

    // Thawed: the old agent finds itself displaced; one active.
    assert!(
        c.wait_log("n1", "-> standby", 2, Duration::from_secs(3)),
        "the thawed agent did not return to standby\n{}",
        c.dump()
    );
    assert_one_active_and_stable(&c, Duration::from_secs(2));
    assert_eq!(c.running(), vec![next.node.clone()], "{}", c.dump());
    assert_no_overlap(&c.events(), &[], &c.dump());
    c.maybe_dump();
    Ok(())
}

on_nats_and_etcd!(
    agent_faults_a_killed_agent_is_covered_by_its_keeper,
    a_killed_agent_is_covered_by_its_keeper
);

fn a_killed_agent_is_covered_by_its_keeper(server: &Backend) {
    tries("kill", || killed_agent_try(server));
}

/// One try of the kill test; `Err` when the holder lapsed before the kill.
fn killed_agent_try(server: &Backend) -> Result<(), String> {
    let url = server.url();
    let mut c = Cluster::new(&url);
    c.try_steady(("n1", None), &["n2", "n3"], &[])?;
    // kill -9 of the agent alone: its keeper and service live on, and
    // nothing restarts the agent.
    let killed = wall_ns();
    crate::common::agent::sigkill(c.agent("n1").pid());
    wait_for((T * 3).max(bound_for(&url) * 2), || {
        c.events()
            .iter()
            .any(|l| l.what == "start" && l.node != "n1")
    });
    lapsed_before(&c, "n1", killed, "kill")?;
    let stop = keepers_stop(&c, "n1");
    let lines = c.events();
    let next = lines
        .iter()
        .find(|l| l.what == "start" && l.node != "n1")
        .unwrap_or_else(|| panic!("nobody took over within 2 B\n{}", c.dump()))
        .clone();
    eprintln!(
        "agent killed: the keeper stopped the service ({}) {:?} after the kill; next start {:?} after it",
        stop.extra,
        after(killed, stop.ns),
        after(killed, next.ns)
    );
    assert_eq!(stop.extra, "emergency", "{}", c.dump());
    assert!(
        after(killed, stop.ns) <= T + HOOK_SLACK,
        "the keeper stopped {:?} after the kill\n{}",
        after(killed, stop.ns),
        c.dump()
    );
    assert!(
        stop.ns < next.ns,
        "the keeper's stop came after the next start\n{}",
        c.dump()
    );
    assert_no_overlap(&lines, &[], &c.dump());
    c.maybe_dump();
    Ok(())
}

// ---------------------------------------------------------------------------
// Identity.

on_nats_and_etcd!(
    agent_faults_a_duplicate_node_id_from_another_machine_is_refused,
    a_duplicate_node_id_from_another_machine_is_refused
);

fn a_duplicate_node_id_from_another_machine_is_refused(server: &Backend) {
    let mut c = Cluster::new(&server.url());
    c.start("n1", None, &[], &[("PUTEX_MACHINE_ID", "machine-a")]);
    assert!(
        wait_for(Duration::from_secs(5), || !c.starts().is_empty()),
        "{}",
        c.dump()
    );
    std::thread::sleep(R * 3);
    // Every version of n1's member record while the newcomer lives.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (url, seen, done) = (c.url.clone(), seen.clone(), done.clone());
        std::thread::spawn(move || poll_member(&url, "n1", &seen, &done))
    };
    std::thread::sleep(R);
    let i = c.start("n1", None, &[], &[("PUTEX_MACHINE_ID", "machine-b")]);
    let began = Instant::now();
    let code = c.agents[i].wait_exit(Duration::from_secs(5));
    eprintln!(
        "duplicate refused after {:?} with {code:?}",
        began.elapsed()
    );
    let log = c.agents[i].log_text();
    assert_eq!(code, Some(4), "{log}");
    assert!(log.contains("another machine (machine-a)"), "{log}");
    std::thread::sleep(R);
    done.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    // The refused agent did not mark the holder's member record exited.
    let dup = c.agents[i].pid();
    let seen = seen.lock().unwrap();
    let mine: Vec<&serde_json::Value> = seen.iter().filter(|m| m["pid"] == dup).collect();
    let roles: Vec<&str> = mine.iter().filter_map(|m| m["role"].as_str()).collect();
    // Known: before it sees the holder renew, the newcomer writes its own
    // `starting`/`standby` versions; the holder rewrites it within 3 R.
    eprintln!("the newcomer wrote n1's member record as {roles:?}");
    assert!(
        !mine.iter().any(|m| m["role"] == "exited"),
        "the refused newcomer marked the holder's member record exited: {mine:?}"
    );

    // The holder is undisturbed: still running, never stopped, still
    // renewing, and its member record still says active.
    std::thread::sleep(R * 5);
    assert!(
        c.agents[0].child.try_wait().unwrap().is_none(),
        "{}",
        c.dump()
    );
    let all = c.events();
    assert_eq!(
        all.iter().filter(|l| l.what == "start").count(),
        1,
        "{}",
        c.dump()
    );
    assert!(
        !all.iter().any(|l| l.what == "stop" && l.extra != "startup"),
        "{}",
        c.dump()
    );
    let st = status(&c);
    assert_eq!(st["holder"], "n1", "{st}");
    assert_eq!(st["state"], "active", "{st}");
    assert!(st["renewed_ago_ms"].as_u64().unwrap() < 300, "{st}");
    let member = &st["members"][0];
    assert_eq!(member["role"], "active", "{st}");
    c.maybe_dump();
}

// ---------------------------------------------------------------------------
// Keeper faults (subreaper mode: no cgroup to fall back on).

/// Child-mode flags for `node`'s service without cgroups: a shell that
/// starts a plain sleep and a double-forked daemon that leaves its session
/// (`(setsid sleep &)`), then becomes a third sleep. The sleeps' arguments
/// are `1000.<tag>1`…`3`.
fn subreaper_service(tag: &str) -> Vec<String> {
    vec![
        "--no-cgroup".into(),
        "--".into(),
        "/bin/sh".into(),
        "-c".into(),
        format!("sleep 1000.{tag}1 & (setsid sleep 1000.{tag}2 &) ; exec sleep 1000.{tag}3"),
    ]
}

fn service_sleeps(tag: &str) -> Vec<i32> {
    (1..=3)
        .flat_map(|i| crate::common::agent::sleeps(&format!("1000.{tag}{i}")))
        .collect()
}

fn service_runs(tag: &str) -> bool {
    (1..=3).all(|i| !crate::common::agent::sleeps(&format!("1000.{tag}{i}")).is_empty())
}

/// Samples which of two services run, every 2 ms, until stopped; returns
/// whether they ever ran at the same time: the old service `a` seen
/// running *after* the new service `b` was.
///
/// A sample reads `/proc` three times per service, which takes tens of
/// milliseconds on a loaded machine, so the order matters. `b` is looked
/// for first: once started it runs until the test ends, so `a` found after
/// it means both ran at that moment. (Looked for the other way round, an
/// `a` that stopped between the two looks counted as an overlap: a CI run
/// reported one while the test's own watch had seen `a` gone before `b`
/// started.)
fn overlap_monitor(a: String, b: String) -> (Arc<AtomicBool>, std::thread::JoinHandle<bool>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut both = false;
        while !s.load(Ordering::SeqCst) {
            if !service_sleeps(&b).is_empty() && !service_sleeps(&a).is_empty() {
                both = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        both
    });
    (stop, handle)
}

fn kill_all(pids: &[i32]) {
    for p in pids {
        crate::common::agent::sigkill(*p);
    }
}

on_nats_and_etcd!(
    agent_faults_r15_a_killed_keeper_without_cgroups_never_leaves_two_services,
    r15_a_killed_keeper_without_cgroups_never_leaves_two_services
);

/// Issue 14 item 1: without a cgroup the keeper owns the tree as its
/// subreaper; when the keeper is SIGKILLed (OOM), its orphans re-parent to
/// init. The holder must still find and stop all of them before anyone
/// else starts — or keep the lock. On the old code the holder reported the
/// stop proven with nothing killed, and the standby's service started
/// beside the old one.
fn r15_a_killed_keeper_without_cgroups_never_leaves_two_services(server: &Backend) {
    let (tag_a, tag_b) = (format!("81{}", server.tag()), format!("82{}", server.tag()));
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let a_flags = subreaper_service(&tag_a);
    let a_flags: Vec<&str> = a_flags.iter().map(String::as_str).collect();
    let a = start(fast(dir.path(), &url, "svc", "n1", &a_flags));
    assert!(
        wait_for(Duration::from_secs(5), || service_runs(&tag_a)),
        "n1's service did not start\n{}",
        a.log_text()
    );
    let b_flags = subreaper_service(&tag_b);
    let b_flags: Vec<&str> = b_flags.iter().map(String::as_str).collect();
    let b = start(fast(dir.path(), &url, "svc", "n2", &b_flags));
    // n2 stands by; n1's keeper has looked at its tree (≤ 500 ms).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(service_sleeps(&tag_b).is_empty(), "{}", b.log_text());
    let (stop, monitor) = overlap_monitor(tag_a.clone(), tag_b.clone());
    let keepers = a.keepers();
    assert!(!keepers.is_empty(), "n1 has a keeper");
    let killed = Instant::now();
    kill_all(&keepers);
    // The other side: the old service stops, and the new one starts.
    let gone = wait_for(Duration::from_secs(5), || service_sleeps(&tag_a).is_empty());
    let gone_after = killed.elapsed();
    let started = wait_for(Duration::from_secs(5), || service_runs(&tag_b));
    let started_after = killed.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let overlapped = monitor.join().unwrap();
    let logs = format!("--- n1:\n{}\n--- n2:\n{}", a.log_text(), b.log_text());
    kill_all(&service_sleeps(&tag_a));
    kill_all(&service_sleeps(&tag_b));
    eprintln!(
        "keeper killed: n1's tree gone after {gone_after:?}, n2's service up after {started_after:?}"
    );
    assert!(gone, "n1's tree survived its keeper\n{logs}");
    assert!(started, "n2 never took over\n{logs}");
    assert!(!overlapped, "two services ran at once\n{logs}");
}

on_nats_and_etcd!(
    agent_faults_r16_a_restarted_agent_kills_the_orphans_of_a_dead_keeper_first,
    r16_a_restarted_agent_kills_the_orphans_of_a_dead_keeper_first
);

/// Issue 14 item 1: a start-up stop proves a previous instance's tree gone
/// too. The agent and its keeper die together (the service's processes,
/// orphaned, live on); the restarted agent's fresh keeper knows nothing of
/// them, but the persisted snapshot does.
fn r16_a_restarted_agent_kills_the_orphans_of_a_dead_keeper_first(server: &Backend) {
    let (tag_a, tag_b) = (format!("83{}", server.tag()), format!("84{}", server.tag()));
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let keeper_dir = dir.path().join("keeper-n1");
    let flags = subreaper_service(&tag_a);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut a = start(fast(dir.path(), &url, "svc", "n1", &flags).keeper_dir(&keeper_dir));
    assert!(
        wait_for(Duration::from_secs(5), || service_runs(&tag_a)),
        "{}",
        a.log_text()
    );
    std::thread::sleep(Duration::from_millis(1500));
    // putex dies, the service does not.
    a.crash();
    std::thread::sleep(Duration::from_millis(200));
    let orphans = service_sleeps(&tag_a);
    assert_eq!(orphans.len(), 3, "the orphans live on: {orphans:?}");
    let flags = subreaper_service(&tag_b);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let b = start(fast(dir.path(), &url, "svc", "n1", &flags).keeper_dir(&keeper_dir));
    let gone = wait_for(Duration::from_secs(5), || service_sleeps(&tag_a).is_empty());
    let logs = b.log_text();
    kill_all(&service_sleeps(&tag_a));
    assert!(gone, "the previous tree survived the start-up stop\n{logs}");
    assert!(
        wait_for(Duration::from_secs(5), || service_runs(&tag_b)),
        "the restarted agent did not run its service\n{}",
        b.log_text()
    );
    kill_all(&service_sleeps(&tag_b));
}

on_nats_and_etcd!(
    agent_faults_r17_the_activate_hook_waits_for_the_keepers_arm,
    r17_the_activate_hook_waits_for_the_keepers_arm
);

/// Issue 14 item 3: in hook mode the activate hook runs only once the
/// keeper holds the deadline. A keeper that cannot answer (here SIGSTOPped)
/// keeps the node `confirming`; the hook runs once the keeper is back.
fn r17_the_activate_hook_waits_for_the_keepers_arm(server: &Backend) {
    let mut c = Cluster::new(&server.url());
    c.start("n1", None, &[], &[]);
    assert!(
        wait_for(Duration::from_secs(5), || c
            .agent("n1")
            .log_text()
            .contains("starting -> standby")),
        "{}",
        c.dump()
    );
    let keepers = c.agent("n1").keepers();
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    let keeper = Pid::from_raw(keepers[0]);
    kill(keeper, Signal::SIGSTOP).unwrap();
    // First use: W + G ≈ 0.41 s. Well past it, nothing has started.
    std::thread::sleep(Duration::from_millis(1500));
    let early = c.starts();
    let confirming = c.agent("n1").log_text().contains("standby -> confirming");
    kill(keeper, Signal::SIGCONT).unwrap();
    assert!(
        early.is_empty(),
        "the service started under a frozen keeper\n{}",
        c.dump()
    );
    assert!(confirming, "{}", c.dump());
    assert!(
        wait_for(Duration::from_secs(5), || !c.starts().is_empty()),
        "no start once the keeper answered\n{}",
        c.dump()
    );
    c.maybe_dump();
}

on_nats_and_etcd!(
    agent_faults_r18_a_keeper_still_stopping_is_not_resumed,
    r18_a_keeper_still_stopping_is_not_resumed
);

/// Issue 14 item 4: a restarted agent does not resume a tenure whose keeper
/// is still stopping the service: it makes its start-up stop instead.
fn r18_a_keeper_still_stopping_is_not_resumed(server: &Backend) {
    let tag = format!("1000.851{}", server.tag());
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let keeper_dir = dir.path().join("keeper-n1");
    // A service that ignores SIGTERM: a graceful stop waits --stop-timeout
    // before the SIGKILL. R = 1 s makes the licence T = 3 s: the keeper of
    // a dead agent fires (an emergency stop) and exits at most T after the
    // agent's last renewal, so the restarted agent must reach the keeper
    // before that; 3 s covers a slow start on a loaded machine (with
    // R = 100 ms, 300 ms did not).
    let flags = [
        "--renew",
        "1s",
        "--stop-timeout",
        "10s",
        "--",
        "/bin/sh",
        "-c",
        &format!("trap '' TERM; exec sleep {tag}"),
    ];
    let mut a = start(fast(dir.path(), &url, "svc", "n1", &flags).keeper_dir(&keeper_dir));
    assert!(
        wait_for(Duration::from_secs(15), || !crate::common::agent::sleeps(
            &tag
        )
        .is_empty()),
        "{}",
        a.log_text()
    );
    // SIGTERM: the graceful stop begins; then the agent dies mid-stop.
    a.sigterm();
    assert!(
        wait_for(Duration::from_secs(5), || a
            .log_text()
            .contains("-> stepping-down")),
        "{}",
        a.log_text()
    );
    std::thread::sleep(Duration::from_millis(100));
    crate::common::agent::sigkill(a.pid());
    let _ = a.child.wait();
    let b = start(fast(dir.path(), &url, "svc", "n1", &flags).keeper_dir(&keeper_dir));
    assert!(
        wait_for(Duration::from_secs(5), || b
            .log_text()
            .contains("adopted the running keeper")),
        "the restarted agent did not adopt the keeper\n{}\nthe first agent:\n{}",
        b.log_text(),
        a.log_text()
    );
    std::thread::sleep(Duration::from_millis(500));
    let log = b.log_text();
    kill_all(&crate::common::agent::sleeps(&tag));
    assert!(log.contains("stopping=true"), "{log}");
    assert!(
        !log.contains("starting -> active"),
        "resumed a tenure whose service is being stopped\n{log}"
    );
}

on_nats_and_etcd!(
    agent_faults_r19_an_unproven_stop_keeps_the_lease_until_a_stop_is_proven,
    r19_an_unproven_stop_keeps_the_lease_until_a_stop_is_proven
);

/// Issue 14 item 1, the other half: a stop that cannot be proven keeps the
/// lease. The holder's deactivate hook fails (as a wedged `systemctl stop`
/// would) until the operator fixes it: meanwhile the holder keeps renewing,
/// never releases, retries every round and says so in `putex status`; the
/// standby does not start, for many times W + G. Once a stop succeeds the
/// lock is released and the standby starts at once. (On the old code the
/// holder gave the lease up and the standby started beside the service.)
fn r19_an_unproven_stop_keeps_the_lease_until_a_stop_is_proven(server: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let ev = dir.path().join("events");
    let ok = dir.path().join("ok-to-stop");
    let deactivate = format!(
        "[ \"$PUTEX_STOP\" = startup ] || [ -f {ok} ] || exit 1; \
         echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {ev}",
        ok = ok.display(),
        ev = ev.display()
    );
    let activate = format!(
        "echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {}",
        ev.display()
    );
    // R = 250 ms (T = 750 ms) rather than 100 ms: what is tested is that
    // a holder that renews keeps its lease while its stop is unproven; a
    // renewal that a loaded machine (CI, etcd) delays past T would end the
    // licence for another reason.
    let flags = [
        "--activate",
        &activate,
        "--deactivate",
        &deactivate,
        "--renew",
        "250ms",
    ];
    let mut a = start(fast(dir.path(), &url, "svc", "n1", &flags));
    assert!(
        wait_for(Duration::from_secs(5), || starts(&ev).len() == 1),
        "{}",
        a.log_text()
    );
    let b = start(fast(dir.path(), &url, "svc", "n2", &flags));
    std::thread::sleep(Duration::from_millis(500));
    // Stop n1 on purpose: its graceful stop, and every retry, fail.
    a.sigterm();
    std::thread::sleep(Duration::from_secs(3));
    let status = crate::common::agent::status_json(&url, "svc");
    let log = format!("--- n1:\n{}\n--- n2:\n{}", a.log_text(), b.log_text());
    let before = starts(&ev);
    assert_eq!(
        before.len(),
        1,
        "n2 started while n1's stop was unproven\n{log}"
    );
    assert_eq!(status["holder"], "n1", "{status}\n{log}");
    let n1 = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node"] == "n1")
        .cloned()
        .unwrap_or_default();
    assert!(
        n1["alarm"]
            .as_str()
            .is_some_and(|a| a.contains("stop unproven")),
        "{status}\n{log}"
    );
    assert!(a.log_text().contains("STOP UNPROVEN"), "{log}");
    // The operator fixes it: the next retry proves the stop, the lock is
    // released, n1 exits and n2 starts.
    std::fs::write(&ok, "").unwrap();
    let fixed = Instant::now();
    assert!(
        wait_for(Duration::from_secs(5), || starts(&ev).len() == 2),
        "n2 did not take over once n1's stop was proven\n{}",
        dump(&[&a, &b], &ev)
    );
    let took = fixed.elapsed();
    eprintln!("stop proven and handed over {took:?} after the fix");
    assert_eq!(
        a.wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        a.log_text()
    );
    assert_no_overlap(&events(&ev), &[], &dump(&[&a, &b], &ev));
    assert!(took < Duration::from_secs(2), "{took:?}");
}
