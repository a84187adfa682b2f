//! Lock benchmark, part 3 of 3: a lock under contention. Not a test: it
//! prints figures for `docs/performance.md`. (Part 1, `lock_cost`,
//! measures the library uncontended; part 2, `lock_process`, the `putex
//! lock` command.)
//!
//! ```text
//! cargo run --release -p putex --example lock_contention -- [--quick] [--json FILE]
//! ```
//!
//! `--quick` (2 s of contention per run) takes about 15 seconds; the
//! default is 5 s per run. `RUST_LOG` turns on the library's logs (on
//! stderr). `--json FILE` also writes the figures as JSON (for
//! `scripts/bench`).
//!
//! 8 tokio tasks in this process loop on one lock — acquire, check that no
//! other task holds it and that the fencing token increased, release — for
//! a fixed time with the fast profile (R = 100 ms, F = 3, C = 1), three
//! ways: a one-shot `Lease::acquire` per turn, one standing [`Lock`] per
//! task, and the fair queue ([`Ticket`]: join, wait for the turn, acquire
//! with a standing [`Lock`] whose machine already watches the record — as
//! `putex lock` does, ready before its turn — release, leave). It prints acquisitions per second (and those that went
//! to another task than the previous holder), per-task counts, the wait of
//! each acquisition, and when watches started to fail.
//!
//! Each NATS run gets a fresh single-node nats-server on a loopback port
//! with a temporary store directory and the default fsync policy (the
//! binary is `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else
//! `nats-server` on `PATH`; `scripts/install-nats-server` installs it):
//! every watch is a JetStream consumer (deleted when the watch ends; one
//! that async-nats re-creates on its own lingers 30 s), and the server
//! allows 1000 per stream, so one run's leftovers must not weigh on the
//! next. The embedded SQLite store lives in a temporary file. The lock
//! names are used once, untimed, before anything is measured, so the
//! first-use wait of S4 is excluded.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

use putex::core::{TimingConfig, Token};
use putex::locks::lease::{LeaseOptions, Lock};
use putex::locks::queue::{Ticket, Waiter};
use putex::store::AnyStore;

use putex_testkit::bench::lock::{
    acquire, fast, first_use, lock_acquire, open_nats, open_sqlite, preamble, print_summary,
    report_watches, LOCK,
};
use putex_testkit::bench::{ms, ms_f, verdict, write_json, Summary, Table};
use putex_testkit::nats_server::NatsServer;
use putex_testkit::watch_failures::WatchFailures;

/// Tasks competing for one lock.
const WAITERS: usize = 8;
/// How long after the contention window a queue waiter keeps waiting for
/// its turn before it gives up.
const GIVE_UP: Duration = Duration::from_secs(2);

/// Lock benchmark, part 3 of 3: a lock under contention.
///
/// 8 tasks in one process loop on one lock for a fixed time (a one-shot
/// `Lease` per turn, a standing `Lock` each, the fair queue), on a fresh
/// single-node nats-server per run and on SQLite.
#[derive(Parser)]
#[command(name = "lock_contention")]
struct Args {
    /// A shorter run: 2 s of contention per run instead of 5 s
    #[arg(long)]
    quick: bool,
    /// Also write the figures as JSON to FILE (for scripts/bench)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let watch_failures = WatchFailures::install();
    let contend_for = Duration::from_secs(if args.quick { 2 } else { 5 });
    let started = Instant::now();

    let machine = preamble("a fresh single-node server for each run");
    println!("contention: {WAITERS} waiters, {contend_for:?} per run\n");

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = open_sqlite(dir.path().join("bench.db")).await;
    first_use("sqlite", &sqlite).await;
    let mut table = Table::default();
    // The figures for --json.
    let mut rows = Vec::new();

    for label in ["nats", "sqlite"] {
        for mode in [Mode::Lease, Mode::Lock, Mode::Queue] {
            let what = mode.label();
            println!("== {label}: {WAITERS} waiters, {what} ==");
            // A fresh server each time: the consumers a run leaves behind
            // (see report_watches) must not weigh on the next.
            let server = (label == "nats").then(NatsServer::start);
            let store = match &server {
                Some(s) => {
                    let store = open_nats(s).await;
                    first_use(label, &store).await;
                    store
                }
                None => sqlite.clone(),
            };
            let failed = watch_failures.count();
            let c = contend(&store, mode, contend_for, fast(), &watch_failures).await;
            c.print();
            c.rows(label, what, &mut table);
            rows.push(c.to_json(label, mode));
            report_watches(&store, &watch_failures, failed).await;
            println!();
        }
    }

    print_summary(&machine, started, &table);
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({
                "bench": "lock_contention",
                "contention_s": contend_for.as_secs_f64(),
                "waiters": WAITERS,
                "nats_server": machine.nats_version,
                "contention": rows,
            }),
        );
    }
}

struct Contention {
    start: Instant,
    end: Instant,
    /// How long the tasks took to finish after the window.
    drained: Duration,
    /// Per task: when each acquisition was held, and how long it waited
    /// (from the start of the attempt: joining the queue, or acquire).
    held: Vec<Vec<(Instant, Duration)>>,
    /// Acquisitions in the window by the task that held the lock just before.
    repeats: usize,
    /// Queue waiters still without a turn [`GIVE_UP`] after the window.
    gave_up: usize,
    /// When the first watch failed to start.
    first_watch_failure: Option<Instant>,
}

/// How the contending tasks take the lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A one-shot `Lease` per acquisition.
    Lease,
    /// One standing [`Lock`] per task.
    Lock,
    /// A fair-queue [`Ticket`] per acquisition, with one standing [`Lock`]
    /// per task (ready before its turn).
    Queue,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Lease => "Lease::acquire",
            Mode::Lock => "Lock::acquire",
            Mode::Queue => "Ticket queue + standing Lock",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Lock => "lock",
            Mode::Queue => "queue",
        }
    }
}

async fn contend(
    store: &AnyStore,
    mode: Mode,
    window: Duration,
    timing: TimingConfig,
    failures: &WatchFailures,
) -> Contention {
    let holders = Arc::new(AtomicUsize::new(0));
    // The last token handed out, and which task got it.
    let last: Arc<Mutex<Option<(Token, usize)>>> = Arc::new(Mutex::new(None));
    let repeats = Arc::new(AtomicUsize::new(0));
    let gave_up = Arc::new(AtomicUsize::new(0));
    failures.reset_first();
    let start = Instant::now();
    let end = start + window;
    let store_timeout = timing.validate().expect("timing").store_timeout();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (store, holders, last, repeats, gave_up, timing) = (
            store.clone(),
            holders.clone(),
            last.clone(),
            repeats.clone(),
            gave_up.clone(),
            timing.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let node = format!("waiter-{i}");
            let mut held = Vec::new();
            let mut lock = matches!(mode, Mode::Lock | Mode::Queue).then(|| {
                Lock::new(
                    store.clone(),
                    LeaseOptions::new(LOCK, &node, timing.clone()).unwrap(),
                )
                .expect("lock")
            });
            while Instant::now() < end {
                let t0 = Instant::now();
                let ticket = if mode == Mode::Queue {
                    let t = Ticket::join(
                        store.clone(),
                        Waiter {
                            name: LOCK.parse().expect("a name"),
                            node: node.parse().expect("a node id"),
                            instance: putex::identity::instance_name(),
                            renew: timing.renew,
                            store_timeout,
                            title: None,
                            asked: None,
                            patience: Duration::from_secs(5),
                        },
                    )
                    .await
                    .expect("join the queue");
                    let mut turn = t.turn();
                    // Waiting for a turn can be given up safely (unlike an
                    // acquisition under way): after the window, give up
                    // after GIVE_UP.
                    let give_up = tokio::time::Instant::from_std(end + GIVE_UP);
                    let waited = tokio::time::timeout_at(give_up, turn.wait_for(|t| *t))
                        .await
                        .map(|r| r.is_ok());
                    match waited {
                        Ok(ok) => assert!(ok, "the ticket ended before its turn"),
                        Err(_) => {
                            gave_up.fetch_add(1, Ordering::SeqCst);
                            t.leave().await;
                            break;
                        }
                    }
                    Some(t)
                } else {
                    None
                };
                let (lease, token) = match &mut lock {
                    Some(lock) => (None, lock_acquire(lock).await),
                    None => {
                        let lease = acquire(&store, LOCK, &node, timing.clone()).await;
                        let token = lease.token();
                        (Some(lease), token)
                    }
                };
                let held_at = Instant::now();
                assert_eq!(
                    holders.fetch_add(1, Ordering::SeqCst),
                    0,
                    "mutual exclusion violated: two tasks hold {LOCK} at once"
                );
                {
                    let mut last = last.lock().expect("last token");
                    assert!(
                        last.is_none_or(|(l, _)| token > l),
                        "fencing token did not increase: {token:?} after {:?}",
                        *last
                    );
                    if last.is_some_and(|(_, by)| by == i) && held_at <= end {
                        repeats.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = Some((token, i));
                }
                tokio::task::yield_now().await;
                let still = match (&lease, &lock) {
                    (Some(lease), _) => lease.is_held(),
                    (None, Some(lock)) => lock.is_held(),
                    (None, None) => unreachable!("a lease or a lock"),
                };
                assert!(still, "lease lost inside the critical section");
                holders.fetch_sub(1, Ordering::SeqCst);
                held.push((held_at, held_at - t0));
                // Out of line while releasing, not after: the next in
                // line, told its turn, finds the release on its way (the
                // queue only orders; the record decides).
                let release = async {
                    match (lease, &mut lock) {
                        (Some(lease), _) => lease.release().await,
                        (None, Some(lock)) => lock.release().await,
                        (None, None) => unreachable!("a lease or a lock"),
                    }
                };
                let leave = async {
                    if let Some(t) = ticket {
                        t.leave().await;
                    }
                };
                let (released, ()) = tokio::join!(release, leave);
                assert!(released.expect("release"), "released");
            }
            if let Some(lock) = lock {
                lock.close().await.expect("close");
            }
            held
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        held.push(t.await.expect("a waiter task panicked"));
    }
    Contention {
        start,
        end,
        drained: Instant::now() - end,
        held,
        repeats: repeats.load(Ordering::SeqCst),
        gave_up: gave_up.load(Ordering::SeqCst),
        first_watch_failure: failures.first(),
    }
}

impl Contention {
    fn window(&self) -> Duration {
        self.end - self.start
    }

    /// Acquisitions per task held within the window.
    fn per_task(&self) -> Vec<usize> {
        self.held
            .iter()
            .map(|v| v.iter().filter(|(at, _)| *at <= self.end).count())
            .collect()
    }

    fn total(&self) -> usize {
        self.per_task().iter().sum()
    }

    fn rate(&self) -> f64 {
        self.total() as f64 / self.window().as_secs_f64()
    }

    /// Acquisitions per second held in `[from, to)`.
    fn rate_between(&self, from: Instant, to: Instant) -> f64 {
        let n = self
            .held
            .iter()
            .flatten()
            .filter(|(at, _)| *at >= from && *at < to)
            .count();
        n as f64 / (to - from).as_secs_f64().max(1e-9)
    }

    fn fairness(&self) -> String {
        let per_task = self.per_task();
        let mean = (self.total() as f64 / per_task.len() as f64).max(f64::MIN_POSITIVE);
        let max = *per_task.iter().max().unwrap_or(&0) as f64;
        let min = *per_task.iter().min().unwrap_or(&0) as f64;
        format!(
            "per task max/mean {:.2}, min/mean {:.2}; {:.0}% by the task that held it just before",
            max / mean,
            min / mean,
            self.repeats as f64 * 100.0 / (self.total().max(1)) as f64
        )
    }

    /// Waits of every acquisition, those that ended after the window too.
    fn waits(&self) -> String {
        let waits: Vec<Duration> = self.held.iter().flatten().map(|(_, w)| *w).collect();
        if waits.is_empty() {
            return "no acquisitions".into();
        }
        let s = Summary::of(&waits);
        let mean = waits.iter().sum::<Duration>() / waits.len() as u32;
        format!(
            "wait mean {}, p99 {}, max {}",
            ms(mean),
            ms(s.p99),
            ms(s.max)
        )
    }

    fn watch_note(&self) -> String {
        let mut note = String::new();
        if let Some(f) = self.first_watch_failure.filter(|f| *f < self.end) {
            let f = f.max(self.start);
            note = format!(
                "; watches failing from {:.2} s on (consumer limit): {:.0}/s before, {:.0}/s after",
                (f - self.start).as_secs_f64(),
                self.rate_between(self.start, f),
                self.rate_between(f, self.end)
            );
        }
        if self.gave_up > 0 {
            note += &format!(
                "; {} waiter(s) still without a turn {GIVE_UP:?} after the window (given up)",
                self.gave_up
            );
        } else if self.drained > Duration::from_secs(1) {
            note += &format!(
                "; the last waiters took {:.1} s more after the window",
                self.drained.as_secs_f64()
            );
        }
        note
    }

    fn print(&self) {
        println!(
            "{} acquisitions in {:?}: {:.0}/s, {:.0}/s to another task; per task {:?}; {}; {}; no overlap, tokens increasing{}",
            self.total(),
            self.window(),
            self.rate(),
            (self.total() - self.repeats) as f64 / self.window().as_secs_f64(),
            self.per_task(),
            self.fairness(),
            self.waits(),
            self.watch_note()
        );
    }

    fn to_json(&self, store: &str, mode: Mode) -> serde_json::Value {
        let waits: Vec<Duration> = self.held.iter().flatten().map(|(_, w)| *w).collect();
        let s = (!waits.is_empty()).then(|| Summary::of(&waits));
        let failing = self.first_watch_failure.filter(|f| *f < self.end);
        let per_task = self.per_task();
        let mean = (self.total() as f64 / per_task.len() as f64).max(f64::MIN_POSITIVE);
        serde_json::json!({
            "store": store,
            "variant": mode.key(),
            "window_s": self.window().as_secs_f64(),
            "acquisitions": self.total(),
            "per_s": self.rate(),
            "to_another_task_per_s":
                (self.total() - self.repeats) as f64 / self.window().as_secs_f64(),
            "per_task": per_task,
            "fairness_max_mean": *per_task.iter().max().unwrap_or(&0) as f64 / mean,
            "fairness_min_mean": *per_task.iter().min().unwrap_or(&0) as f64 / mean,
            "wait_p99_ms": s.as_ref().map(|s| ms_f(s.p99)),
            "wait_max_ms": s.as_ref().map(|s| ms_f(s.max)),
            "watches_failing_from_s":
                failing.map(|f| (f.max(self.start) - self.start).as_secs_f64()),
            "per_s_before_watch_failures":
                failing.map(|f| self.rate_between(self.start, f.max(self.start))),
            "per_s_after_watch_failures":
                failing.map(|f| self.rate_between(f.max(self.start), self.end)),
            "gave_up": self.gave_up,
        })
    }

    fn rows(&self, store: &str, what: &str, table: &mut Table) {
        let target = if store == "nats" {
            format!("; target ≥ 1000/s: {}", verdict(self.rate() >= 1000.0))
        } else {
            String::new()
        };
        table.push(
            &format!("{WAITERS} waiters, one lock: {what} (R=100ms)"),
            store,
            format!(
                "{:.0} acquisitions/s ({:.0}/s to another task)",
                self.rate(),
                (self.total() - self.repeats) as f64 / self.window().as_secs_f64()
            ),
            format!(
                "{}; {}{}{target}",
                self.fairness(),
                self.waits(),
                self.watch_note()
            ),
        );
    }
}
