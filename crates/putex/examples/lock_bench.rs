//! Lock benchmark: what a lock costs through the lease library, through the
//! `putex lock` command, and under contention. Not a test: it prints figures
//! and ratios for `docs/performance.md`.
//!
//! ```text
//! cargo run --release -p putex --example lock_bench -- [--iters N] [--quick] [--putex PATH]
//!     [--only uncontended|process|contention] [--json FILE]
//! ```
//!
//! `--quick` (50 iterations, 20 process runs, 2 s of contention) stays under
//! a minute; the default is 300 iterations, 30 runs and 5 s. `RUST_LOG`
//! turns on the library's logs, and `LOCK_BENCH_DUMP=1` prints every
//! message the NATS recorder saw (both on stderr). `--json FILE` also
//! writes the figures as JSON (for `scripts/bench`).
//!
//! Each section starts its own single-node nats-server on a loopback port
//! with a temporary store directory and the default fsync policy (the
//! binary is `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else
//! `nats-server` on `PATH`; `scripts/install-nats-server` installs it): every
//! watch is a JetStream consumer (deleted when the watch ends; one that
//! async-nats re-creates on its own lingers 30 s), and the server allows
//! 1000 per stream, so one section's leftovers must not weigh on the next. The embedded SQLite store lives in a temporary file. The
//! lock names are used once, untimed, before anything is measured, so the
//! first-use wait of S4 is excluded.
//!
//! 1. **Uncontended acquire + release** through the library — a standing
//!    [`Lock`] taken and given back again and again (the ≤ 1.15× target),
//!    and a one-shot [`Lease::acquire`] + [`Lease::release`], which starts an
//!    agent and a watch each time — with the fast profile R = 100 ms, F = 3,
//!    C = 1, and the default timing, against the two raw store operations
//!    `create` + `delete` of one key (the same key every iteration). The
//!    variants are interleaved, one of each per round with a 2 ms pause
//!    after each, so load from other work on the machine hits them alike;
//!    each standing lock has a name of its own. Then the store operations of
//!    one library acquire + release are **counted**: on both stores the
//!    writes, by the revision counter (a `put` of a scratch key before and
//!    after 20 acquire + release); on NATS every message too, by a second
//!    connection subscribed to `>` that classifies what it sees (writes to
//!    `$KV.<bucket>.<key>` by their headers, direct and leader reads,
//!    consumer creations for watches, watch deliveries), split into the
//!    acquire, release and after-release phases by marker round trips.
//! 2. **Whole-process `putex lock NAME -- true`** (the release binary beside
//!    this example, built if missing or without the `lock` command, or
//!    `--putex PATH`), default timing, against `flock FILE true` and, when
//!    `etcd` and `etcdctl` are on `PATH`, `etcdctl lock NAME true`.
//! 3. **Contention**: 8 tokio tasks in this process loop on one lock —
//!    acquire, check that no other task holds it and that the fencing token
//!    increased, release — for a fixed time, with plain [`Lease::acquire`]
//!    and with the fair queue ([`Ticket`]: join, wait for the turn, acquire,
//!    release, leave). It prints acquisitions per second (and those that
//!    went to another task than the previous holder), per-task counts, the
//!    wait of each acquisition, and when watches started to fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use putex::core::{TimingConfig, Token};
use putex::locks::lease::{Lease, LeaseOptions, Lock};
use putex::locks::queue::{Ticket, Waiter};
use putex::store::{AnyStore, SqliteStore, Store, StoreUrl};

use putex_testkit::nats_server::{nats_server_binary, NatsServer};
use putex_testkit::procfs::load_average;
use putex_testkit::watch_failures::WatchFailures;

/// The deadline of the raw store calls.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long one acquisition may take before the bench gives up.
const ACQUIRE_LIMIT: Duration = Duration::from_secs(60);
/// The lock the one-shot lease measurements use.
const LOCK: &str = "bench";
/// The locks the standing [`Lock`] measurements use (fast and default timing).
const LOCK_FAST: &str = "bench-lock-fast";
const LOCK_DEFAULT: &str = "bench-lock-default";
/// The lock the `putex lock` runs use.
const CLI_LOCK: &str = "clibench";
/// Tasks competing for one lock.
const WAITERS: usize = 8;
/// A pause after each timed pair, so that the background work a lease
/// leaves behind (its watch being torn down) does not land on the next
/// variant's clock.
const PAUSE: Duration = Duration::from_millis(2);
/// How long after the contention window a queue waiter keeps waiting for
/// its turn before it gives up.
const GIVE_UP: Duration = Duration::from_secs(2);
/// Iterations of the op-counting runs.
const COUNT_ITERS: usize = 20;

fn usage() -> ! {
    eprintln!(
        "usage: lock_bench [--iters N] [--quick] [--putex PATH] [--only uncontended|process|contention] [--json FILE]"
    );
    std::process::exit(2);
}

fn fast() -> TimingConfig {
    TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
}

#[tokio::main]
async fn main() {
    let mut iters: Option<usize> = None;
    let mut quick = false;
    let mut only: Option<String> = None;
    let mut putex_bin: Option<PathBuf> = None;
    let mut json: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iters" => {
                iters = Some(
                    args.next()
                        .and_then(|n| n.parse().ok())
                        .filter(|n| *n > 0)
                        .unwrap_or_else(|| usage()),
                )
            }
            "--quick" => quick = true,
            "--only" => match args.next().as_deref() {
                Some(s @ ("uncontended" | "process" | "contention")) => only = Some(s.to_owned()),
                _ => usage(),
            },
            "--putex" => putex_bin = Some(args.next().unwrap_or_else(|| usage()).into()),
            "--json" => json = Some(args.next().unwrap_or_else(|| usage()).into()),
            _ => usage(),
        }
    }
    let watch_failures = WatchFailures::install();
    let iters = iters.unwrap_or(if quick { 50 } else { 300 });
    let cli_runs = if quick { 20 } else { 30 };
    let contend_for = Duration::from_secs(if quick { 2 } else { 5 });
    let run = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let started = Instant::now();

    let nats_bin = nats_server_binary();
    let machine = Machine::read(&nats_bin);
    println!("{}", machine.describe());
    println!(
        "nats-server: {} ({}), a fresh single-node server for each section",
        nats_bin.display(),
        machine.nats_version
    );
    println!(
        "iterations: {iters} per variant; putex lock runs: {cli_runs}; contention: {contend_for:?} per run\n"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite: AnyStore = SqliteStore::open(dir.path().join("bench.db"))
        .await
        .expect("sqlite store")
        .into();
    first_use("sqlite", &sqlite).await;
    let mut table = Table::default();
    // The figures for --json: section → list of objects.
    let mut figures: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    let mut counts: Vec<(String, String, OpCounts)> = Vec::new();

    // 1. Uncontended acquire + release vs raw create + delete, and op counts.
    if run("uncontended") {
        let nats = NatsServer::start();
        let nats_store = open_nats(&nats).await;
        first_use("nats", &nats_store).await;
        for (label, store) in [("nats", &nats_store), ("sqlite", &sqlite)] {
            println!("== {label}: uncontended ==");
            let failed = watch_failures.count();
            let u = uncontended(store, iters).await;
            u.print();
            u.rows(label, &mut table);
            figures
                .entry("uncontended")
                .or_default()
                .push(u.to_json(label));
            for (profile, timing, standing) in [
                ("Lock, fast", fast(), true),
                ("Lease, fast", fast(), false),
                ("Lease, default", TimingConfig::default(), false),
            ] {
                let c = count_ops(store, timing, standing, &nats.url).await;
                c.print(label, profile);
                figures
                    .entry("op_counts")
                    .or_default()
                    .push(serde_json::json!({
                        "store": label,
                        "timing": profile,
                        "iters": c.iters,
                        "writes_per_acquire_release": c.per_iter(c.writes as usize),
                    }));
                counts.push((label.to_string(), profile.to_string(), c));
            }
            report_watches(store, &watch_failures, failed).await;
            println!();
        }
    }

    // 2. Whole-process `putex lock NAME -- true`.
    if run("process") {
        let nats = NatsServer::start();
        let rows = whole_process(&mut table, putex_bin, dir.path(), &nats.url, cli_runs);
        figures.insert("process", rows);
    }

    // 3. Contended hand-offs.
    if run("contention") {
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
                figures
                    .entry("contention")
                    .or_default()
                    .push(c.to_json(label, mode));
                report_watches(&store, &watch_failures, failed).await;
                println!();
            }
        }
    }

    println!(
        "== summary ({}, {} at the end; nats-server {}, single node, default fsync; total bench time {:.0} s) ==",
        machine.describe(),
        load_average(),
        machine.nats_version,
        started.elapsed().as_secs_f64()
    );
    table.print();
    if let Some(path) = &json {
        let mut out = serde_json::Map::new();
        out.insert("bench".into(), "lock".into());
        out.insert("iters".into(), iters.into());
        out.insert("process_runs".into(), cli_runs.into());
        out.insert("contention_s".into(), contend_for.as_secs_f64().into());
        out.insert("waiters".into(), WAITERS.into());
        out.insert("nats_server".into(), machine.nats_version.clone().into());
        for (k, v) in figures {
            out.insert(k.into(), v.into());
        }
        let text = serde_json::to_string_pretty(&out).expect("json");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    if !counts.is_empty() {
        println!();
        println!("store operations per library acquire + release (mean of {COUNT_ITERS}):");
        for (store, profile, c) in &counts {
            println!("  {store}, {profile}: {}", c.summary());
        }
    }
}

/// The first use of the lock name waits W + G (S4): once, untimed.
async fn first_use(label: &str, store: &AnyStore) {
    let t = Instant::now();
    for name in [LOCK, LOCK_FAST, LOCK_DEFAULT] {
        let lease = acquire(store, name, "bench-node", fast()).await;
        assert!(lease.release().await.expect("release"), "released");
    }
    println!(
        "{label}: first use of locks {LOCK:?}, {LOCK_FAST:?}, {LOCK_DEFAULT:?} (the S4 waits, \
         excluded from the figures): {:.2} s",
        t.elapsed().as_secs_f64()
    );
}

/// Prints the watches that failed since `since` and, on NATS, the consumers
/// left on the bucket's stream.
async fn report_watches(store: &AnyStore, failures: &WatchFailures, since: usize) {
    let failed = failures.count() - since;
    let consumers = consumers(store).await;
    if failed > 0 || consumers.is_some() {
        println!(
            "watches that failed to start: {failed}{}",
            consumers
                .map(|n| format!(
                    "; consumers on the bucket's stream now: {n} (each watch is one, deleted \
                     when it ends; the server allows 1000 per stream)"
                ))
                .unwrap_or_default()
        );
    }
}

// ---------------------------------------------------------------------------
// 1. Uncontended.

async fn acquire(store: &AnyStore, name: &str, node: &str, timing: TimingConfig) -> Lease {
    match tokio::time::timeout(
        ACQUIRE_LIMIT,
        Lease::acquire(
            store.clone(),
            LeaseOptions::new(name, node, timing).unwrap(),
        ),
    )
    .await
    {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => panic!("acquire {name}: {e}"),
        Err(_) => panic!("acquire {name}: not held within {ACQUIRE_LIMIT:?}"),
    }
}

#[derive(Default)]
struct Pairs {
    pair: Vec<Duration>,
    first: Vec<Duration>,
    second: Vec<Duration>,
}

impl Pairs {
    fn push(&mut self, t0: Instant, t1: Instant, t2: Instant) {
        self.pair.push(t2 - t0);
        self.first.push(t1 - t0);
        self.second.push(t2 - t1);
    }
}

struct Uncontended {
    raw: Pairs,
    /// Two CAS updates of one record: the floor of any lock on the store.
    cas: Pairs,
    /// A [`Lock`] kept across iterations.
    lock_fast: Pairs,
    lock_default: Pairs,
    /// One [`Lease`] per iteration.
    fast: Pairs,
    default: Pairs,
}

/// A standing [`Lock`] on `name`, taken once (untimed) so that it knows
/// the record.
async fn standing_lock(store: &AnyStore, name: &str, timing: TimingConfig) -> Lock {
    let mut lock = Lock::new(
        store.clone(),
        LeaseOptions::new(name, "bench-node", timing).unwrap(),
    )
    .expect("lock");
    lock_acquire(&mut lock).await;
    assert!(lock.release().await.expect("release"), "released");
    lock
}

async fn lock_acquire(lock: &mut Lock) -> Token {
    match tokio::time::timeout(ACQUIRE_LIMIT, lock.acquire()).await {
        Ok(Ok(token)) => token,
        Ok(Err(e)) => panic!("lock acquire: {e}"),
        Err(_) => panic!("lock acquire: not held within {ACQUIRE_LIMIT:?}"),
    }
}

async fn uncontended(store: &AnyStore, iters: usize) -> Uncontended {
    let key = "bench.raw";
    // Warm the raw path too (and leave no record behind).
    let t = store
        .create(key, b"{\"v\":1}", DEADLINE)
        .await
        .expect("create");
    store.delete(key, t, DEADLINE).await.expect("delete");
    let cas_key = "bench.cas";
    let mut at = store
        .put(cas_key, b"{\"v\":1}", DEADLINE)
        .await
        .expect("put");
    let mut u = Uncontended {
        raw: Pairs::default(),
        cas: Pairs::default(),
        lock_fast: Pairs::default(),
        lock_default: Pairs::default(),
        fast: Pairs::default(),
        default: Pairs::default(),
    };
    // Each standing lock has a name of its own: the others' writes must
    // not reach its watch.
    let mut lock_fast = standing_lock(store, LOCK_FAST, fast()).await;
    let mut lock_default = standing_lock(store, LOCK_DEFAULT, TimingConfig::default()).await;
    for _ in 0..iters {
        let t0 = Instant::now();
        let t = store
            .create(key, b"{\"v\":1}", DEADLINE)
            .await
            .expect("create");
        let t1 = Instant::now();
        store.delete(key, t, DEADLINE).await.expect("delete");
        u.raw.push(t0, t1, Instant::now());
        tokio::time::sleep(PAUSE).await;
        let t0 = Instant::now();
        let t = store
            .update(cas_key, b"{\"v\":2}", at, DEADLINE)
            .await
            .expect("update");
        let t1 = Instant::now();
        at = store
            .update(cas_key, b"{\"v\":1}", t, DEADLINE)
            .await
            .expect("update");
        u.cas.push(t0, t1, Instant::now());
        tokio::time::sleep(PAUSE).await;
        for (lock, into) in [
            (&mut lock_fast, &mut u.lock_fast),
            (&mut lock_default, &mut u.lock_default),
        ] {
            let t0 = Instant::now();
            lock_acquire(lock).await;
            let t1 = Instant::now();
            assert!(lock.release().await.expect("release"), "released");
            into.push(t0, t1, Instant::now());
            tokio::time::sleep(PAUSE).await;
        }
        for (timing, into) in [
            (fast(), &mut u.fast),
            (TimingConfig::default(), &mut u.default),
        ] {
            let t0 = Instant::now();
            let lease = acquire(store, LOCK, "bench-node", timing).await;
            let t1 = Instant::now();
            assert!(lease.release().await.expect("release"), "released");
            into.push(t0, t1, Instant::now());
            tokio::time::sleep(PAUSE).await;
        }
    }
    lock_fast.close().await.expect("close");
    lock_default.close().await.expect("close");
    u
}

/// The library variants of the uncontended measurement: JSON key, label,
/// and whether the ≤ 1.15× target applies (it is about locking again and
/// again, which is what [`Lock`] is for).
const VARIANTS: [(&str, &str, bool); 4] = [
    (
        "lock_fast",
        "`Lock` acquire + release, R=100ms F=3 C=1",
        true,
    ),
    (
        "lock_default",
        "`Lock` acquire + release, default timing",
        true,
    ),
    (
        "lease_fast",
        "one-shot `Lease` acquire + release, R=100ms F=3 C=1",
        false,
    ),
    (
        "lease_default",
        "one-shot `Lease` acquire + release, default timing",
        false,
    ),
];

impl Uncontended {
    fn print(&self) {
        let raw = Summary::of(&self.raw.pair);
        println!(
            "raw create + delete (same key): pair {}; create {}, delete {}",
            raw.med_p99(),
            Summary::of(&self.raw.first).median_ms(),
            Summary::of(&self.raw.second).median_ms()
        );
        let cas = Summary::of(&self.cas.pair);
        println!(
            "raw update + update (two CAS, the floor of any lock): pair {}",
            cas.med_p99()
        );
        for ((_, what, _), p) in VARIANTS.iter().zip(self.variants()) {
            let s = Summary::of(&p.pair);
            println!(
                "{what}: pair {}; acquire {}, release {}; ratio to raw {:.2}× (median), {:.2}× (p99); to two CAS {:.2}×",
                s.med_p99(),
                Summary::of(&p.first).median_ms(),
                Summary::of(&p.second).median_ms(),
                ratio(s.median, raw.median),
                ratio(s.p99, raw.p99),
                ratio(s.median, cas.median)
            );
        }
    }

    fn to_json(&self, store: &str) -> serde_json::Value {
        let pairs = |p: &Pairs| {
            let s = Summary::of(&p.pair);
            serde_json::json!({
                "median_ms": ms_f(s.median),
                "p99_ms": ms_f(s.p99),
                "first_median_ms": ms_f(Summary::of(&p.first).median),
                "second_median_ms": ms_f(Summary::of(&p.second).median),
            })
        };
        serde_json::json!({
            "store": store,
            "iters": self.raw.pair.len(),
            "raw_create_delete": pairs(&self.raw),
            "raw_cas_cas": pairs(&self.cas),
            "lock_fast": pairs(&self.lock_fast),
            "lock_default": pairs(&self.lock_default),
            "lease_fast": pairs(&self.fast),
            "lease_default": pairs(&self.default),
        })
    }

    fn variants(&self) -> [&Pairs; 4] {
        [
            &self.lock_fast,
            &self.lock_default,
            &self.fast,
            &self.default,
        ]
    }

    fn rows(&self, store: &str, table: &mut Table) {
        let raw = Summary::of(&self.raw.pair);
        table.push(
            "raw `create` + `delete` (same key)",
            store,
            raw.med_p99(),
            format!(
                "create {} + delete {}",
                Summary::of(&self.raw.first).median_ms(),
                Summary::of(&self.raw.second).median_ms()
            ),
        );
        let cas = Summary::of(&self.cas.pair);
        table.push(
            "raw `update` + `update` (two CAS: the floor of any lock)",
            store,
            cas.med_p99(),
            format!("{:.2}× raw create + delete", ratio(cas.median, raw.median)),
        );
        for ((_, what, target), p) in VARIANTS.iter().zip(self.variants()) {
            let s = Summary::of(&p.pair);
            let r = ratio(s.median, raw.median);
            let target = if *target {
                format!("target ≤ 1.15×: {}", verdict(r <= 1.15))
            } else {
                "starts an agent and a watch each time".to_owned()
            };
            table.push(
                what,
                store,
                s.med_p99(),
                format!(
                    "{r:.2}× raw (p99 {:.2}×); {target}; {:.2}× two CAS (acquire {}, release {})",
                    ratio(s.p99, raw.p99),
                    ratio(s.median, cas.median),
                    Summary::of(&p.first).median_ms(),
                    Summary::of(&p.second).median_ms()
                ),
            );
        }
    }
}

/// The phases of one counted iteration, split by the marker messages.
const PHASES: [&str; 3] = ["acquire", "release", "after"];

/// Store operations of one library acquire + release.
struct OpCounts {
    iters: usize,
    /// Writes by the revision counter (every store).
    writes: u64,
    /// NATS only: client → server requests and server → client deliveries
    /// by class, summed over the iterations, per phase.
    classes: BTreeMap<String, [usize; 3]>,
    /// NATS only: one iteration as the server routed it, with offsets.
    timeline: Vec<(Duration, String)>,
}

impl OpCounts {
    fn per_iter(&self, n: usize) -> f64 {
        n as f64 / self.iters as f64
    }

    fn print(&self, store: &str, profile: &str) {
        println!(
            "ops per acquire + release ({store}, {profile}, mean of {}): {:.2} writes by the revision counter",
            self.iters,
            self.per_iter(self.writes as usize)
        );
        if !self.classes.is_empty() {
            println!(
                "  seen on the server, per iteration: {}",
                PHASES.map(|p| format!("{p:>7}")).join(" ")
            );
            for (class, n) in &self.classes {
                println!(
                    "  {:<58} {}",
                    class,
                    n.map(|n| format!("{:>7.2}", self.per_iter(n))).join(" ")
                );
            }
        }
        if !self.timeline.is_empty() {
            println!(
                "  the last iteration in the server's order (offsets from the begin marker as \
                 the recording connection saw it; the first includes the marker's reply):"
            );
            for (at, what) in &self.timeline {
                println!("    +{:>7.3} ms  {what}", at.as_secs_f64() * 1e3);
            }
        }
    }

    fn summary(&self) -> String {
        if self.classes.is_empty() {
            return format!(
                "{:.1} writes (revision counter; reads and watch polls not counted)",
                self.per_iter(self.writes as usize)
            );
        }
        let phase = |i: usize| {
            let v: Vec<String> = self
                .classes
                .iter()
                .filter(|(c, n)| !c.starts_with('(') && n[i] > 0)
                .map(|(c, n)| format!("{:.1} {c}", self.per_iter(n[i])))
                .collect();
            if v.is_empty() {
                "nothing".to_owned()
            } else {
                v.join(", ")
            }
        };
        format!(
            "{:.1} writes (revision counter); requests: acquire {}; release {}; after {}",
            self.per_iter(self.writes as usize),
            phase(0),
            phase(1),
            phase(2)
        )
    }
}

/// NATS only: how many consumers the bucket's stream has (each live watch
/// is one).
async fn consumers(store: &AnyStore) -> Option<u64> {
    let AnyStore::Nats(s) = store else {
        return None;
    };
    let subject = format!("$JS.API.STREAM.INFO.KV_{}", s.bucket_name());
    let reply = s.client().request(subject, "".into()).await.ok()?;
    serde_json::from_slice::<serde_json::Value>(&reply.payload)
        .ok()?
        .pointer("/state/consumer_count")?
        .as_u64()
}

/// The store's current revision: a `put` of a scratch key.
async fn revision(store: &AnyStore) -> u64 {
    store
        .put("bench.mark", b"{\"v\":1}", DEADLINE)
        .await
        .expect("put")
        .revision
}

async fn count_ops(store: &AnyStore, timing: TimingConfig, standing: bool, url: &str) -> OpCounts {
    let snoop = match store {
        AnyStore::Nats(_) => Some(Snoop::start(url).await),
        _ => None,
    };
    let mark = |what: &'static str| {
        let s = snoop.as_ref();
        async move {
            if let Some(s) = s {
                s.mark(what).await;
            }
        }
    };
    let mut lock = match standing {
        true => Some(standing_lock(store, LOCK_FAST, timing.clone()).await),
        false => None,
    };
    let before = revision(store).await;
    for _ in 0..COUNT_ITERS {
        mark("begin").await;
        if let Some(lock) = &mut lock {
            lock_acquire(lock).await;
            mark("held").await;
            assert!(lock.release().await.expect("release"), "released");
        } else {
            let lease = acquire(store, LOCK, "bench-node", timing.clone()).await;
            mark("held").await;
            assert!(lease.release().await.expect("release"), "released");
        }
        mark("released").await;
        // Let the tail (watch teardown, late deliveries) land in this window.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    mark("begin").await;
    let after = revision(store).await;
    if let Some(lock) = lock {
        lock.close().await.expect("close");
    }
    let mut counts = OpCounts {
        iters: COUNT_ITERS,
        writes: after - before - 1,
        classes: BTreeMap::new(),
        timeline: Vec::new(),
    };
    let Some(snoop) = snoop else {
        return counts;
    };
    let log = snoop.finish().await;
    if std::env::var_os("LOCK_BENCH_DUMP").is_some() {
        for (at, m) in &log {
            eprintln!(
                "{at:?} {} reply={:?} headers={:?}",
                m.subject, m.reply, m.headers
            );
        }
    }
    // Requests by their reply subject, to name the replies.
    let mut asked: BTreeMap<String, String> = BTreeMap::new();
    let mut windows: Vec<Vec<(Duration, usize, String)>> = Vec::new();
    let mut opened: Option<Instant> = None;
    let mut phase = 0;
    let mut marker_replies = std::collections::HashSet::new();
    for (at, m) in &log {
        let subject = m.subject.as_str();
        if subject.starts_with("bench.snoop.") {
            if let Some(r) = &m.reply {
                marker_replies.insert(r.as_str().to_owned());
            }
        }
        if marker_replies.contains(subject) {
            continue;
        }
        let class = match subject.strip_prefix("bench.snoop.") {
            Some("begin") => {
                opened = Some(*at);
                phase = 0;
                windows.push(Vec::new());
                continue;
            }
            Some(what) => {
                phase = if what == "held" { 1 } else { 2 };
                format!("── {what} (marker)")
            }
            None if subject.starts_with("bench.") => continue,
            None => match asked.get(subject) {
                Some(request) => format!("   reply to {request}"),
                None => {
                    let class = classify(m);
                    if let Some(r) = &m.reply {
                        asked.insert(r.as_str().to_owned(), class.clone());
                    }
                    class
                }
            },
        };
        if class.contains("bench.mark") {
            continue;
        }
        if let (Some(t0), Some(w)) = (opened, windows.last_mut()) {
            w.push((at.duration_since(t0), phase, class));
        }
    }
    windows.pop(); // after the closing begin marker: the revision read
    for w in &windows {
        for (_, phase, class) in w {
            if class.starts_with("──") || class.starts_with("   reply") {
                continue;
            }
            counts.classes.entry(class.clone()).or_default()[*phase] += 1;
        }
    }
    if let Some(w) = windows.last() {
        counts.timeline = w.iter().map(|(at, _, c)| (*at, c.clone())).collect();
    }
    counts
}

/// A second NATS connection that records every message in the account.
///
/// Markers are request–reply round trips answered by the recording task
/// itself: when `mark` returns, the marker is in the record, and anything
/// the library sends afterwards comes after it.
struct Snoop {
    client: async_nats::Client,
    log: Arc<Mutex<Vec<(Instant, async_nats::Message)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Snoop {
    async fn start(url: &str) -> Snoop {
        let client = async_nats::connect(url).await.expect("snoop connect");
        let mut sub = client.subscribe(">").await.expect("subscribe >");
        client.flush().await.expect("flush");
        let log = Arc::new(Mutex::new(Vec::new()));
        let into = log.clone();
        let answer = client.clone();
        let task = tokio::spawn(async move {
            use futures::StreamExt;
            while let Some(m) = sub.next().await {
                let reply = m
                    .reply
                    .clone()
                    .filter(|_| m.subject.as_str().starts_with("bench.snoop."));
                into.lock().expect("log").push((Instant::now(), m));
                if let Some(r) = reply {
                    let _ = answer.publish(r, "".into()).await;
                }
            }
        });
        Snoop { client, log, task }
    }

    async fn mark(&self, what: &str) {
        self.client
            .request(format!("bench.snoop.{what}"), "".into())
            .await
            .expect("marker");
    }

    async fn finish(self) -> Vec<(Instant, async_nats::Message)> {
        self.task.abort();
        std::mem::take(&mut *self.log.lock().expect("log"))
    }
}

/// What a message seen on the server is, for counting.
fn classify(m: &async_nats::Message) -> String {
    let subject = m.subject.as_str();
    let header = |name: &str| {
        m.headers.as_ref().and_then(|h| {
            h.iter()
                .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.first())
                .map(|v| v.as_str().to_owned())
        })
    };
    let key_of = |s: &str| s.splitn(3, '.').nth(2).map(str::to_owned);
    if m.reply
        .as_ref()
        .is_some_and(|r| r.as_str().starts_with("$JS.ACK."))
    {
        // Push-consumer deliveries keep the message's own subject.
        let key = key_of(subject).unwrap_or_else(|| subject.to_owned());
        return format!("(watch delivery → client) {key}");
    }
    if subject.starts_with("$KV.") {
        let key = key_of(subject).unwrap_or_default();
        let op = if header("KV-Operation").is_some_and(|v| v == "DEL") {
            "delete"
        } else {
            match header("Nats-Expected-Last-Subject-Sequence").as_deref() {
                Some("0") => "create",
                Some(_) => "update (CAS)",
                None => "put",
            }
        };
        return format!("write: {op} {key}");
    }
    if let Some(rest) = subject.strip_prefix("$JS.API.DIRECT.GET.") {
        let key = rest
            .split_once(".$KV.")
            .and_then(|(_, k)| k.split_once('.'))
            .map_or("?", |(_, k)| k);
        return format!("read: direct get (any replica) {key}");
    }
    let json = || serde_json::from_slice::<serde_json::Value>(&m.payload).ok();
    if subject.starts_with("$JS.API.STREAM.MSG.GET.") {
        let key = json()
            .and_then(|v| v["last_by_subj"].as_str().and_then(key_of))
            .unwrap_or_else(|| "?".into());
        return format!("read: leader get {key}");
    }
    if subject.starts_with("$JS.API.CONSUMER.CREATE.") {
        let filter = json()
            .and_then(|v| {
                let c = &v["config"];
                c["filter_subject"]
                    .as_str()
                    .or_else(|| c["filter_subjects"][0].as_str())
                    .and_then(key_of)
            })
            .unwrap_or_else(|| "?".into());
        return format!("watch: consumer create {filter}");
    }
    if let Some(api) = subject.strip_prefix("$JS.API.") {
        let call: Vec<&str> = api.split('.').take(2).collect();
        return format!("api: {}", call.join(" ").to_lowercase());
    }
    if subject.starts_with("$JS.EVENT.") {
        return "(advisory)".into();
    }
    format!("other: {subject}")
}

// ---------------------------------------------------------------------------
// 2. Whole process.

/// The `putex` binary beside this example (`<profile>/examples/…` →
/// `<profile>/putex`), built with cargo when missing or without `lock`.
fn find_putex() -> Option<PathBuf> {
    let me = std::env::current_exe().expect("current exe");
    let profile_dir = me.parent().and_then(Path::parent)?.to_path_buf();
    let bin = profile_dir.join("putex");
    let has_lock = |b: &Path| {
        Command::new(b)
            .args(["lock", "--help"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_lock(&bin) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "putex", "--bin", "putex"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        eprintln!("building {} …", bin.display());
        let _ = cmd.status();
        if !has_lock(&bin) {
            println!(
                "cannot build {} with `putex lock`; skipping the putex lock runs (pass --putex PATH)",
                bin.display()
            );
            return None;
        }
    }
    println!("putex: {}", bin.display());
    Some(bin)
}

/// Section 2, whole-process `putex lock NAME -- true` against flock and
/// etcd. The commands are interleaved, one run of each per round, so load
/// from other work on the machine hits them alike. Returns the figures for
/// `--json`.
fn whole_process(
    table: &mut Table,
    putex_bin: Option<PathBuf>,
    dir: &Path,
    nats_url: &str,
    runs: usize,
) -> Vec<serde_json::Value> {
    println!("== whole process ==");
    let putex_bin = putex_bin.or_else(find_putex);
    let mut entries: Vec<Proc> = Vec::new();
    match on_path("flock") {
        Some(flock) => {
            let file = dir.join("flock.lock");
            entries.push(Proc::new(
                "process: `flock FILE true`",
                "local file",
                move || {
                    let mut c = Command::new(&flock);
                    c.arg(&file).arg("true");
                    c
                },
            ));
        }
        None => println!("flock (util-linux) not available; skipped"),
    }
    if let Some(bin) = &putex_bin {
        let b = bin.clone();
        entries.push(Proc::new(
            "process: `putex --version` (start-up floor)",
            "-",
            move || {
                let mut c = Command::new(&b);
                c.arg("--version");
                c
            },
        ));
        let sqlite_url = format!("sqlite://{}", dir.join("cli.db").display());
        for (label, url) in [("nats", nats_url.to_owned()), ("sqlite", sqlite_url)] {
            let lock = putex_lock(bin, &url, &dir.join("keepers"));
            // First use of the name waits W + G (S4): take it with the fast
            // profile, so that the default-timing runs start from a
            // released record.
            let t = Instant::now();
            match run_once(lock(&[
                "--renew",
                "100ms",
                "--failures",
                "3",
                "--confirm",
                "1",
            ])) {
                Ok(_) => println!(
                    "putex lock first use ({url}): {:.2} s (excluded)",
                    t.elapsed().as_secs_f64()
                ),
                Err(e) => println!("putex lock first use ({url}): {e}"),
            }
            entries.push(Proc::new(
                "process: `putex lock NAME -- true`, default timing",
                label,
                move || lock(&[]),
            ));
        }
    }
    let mut etcd_missing = None;
    let etcd = match start_etcd(dir) {
        Ok((server, endpoint, etcdctl)) => {
            entries.push(Proc::new(
                "process: `etcdctl lock NAME true`",
                "etcd",
                move || {
                    let mut c = Command::new(&etcdctl);
                    c.args(["--endpoints", &endpoint, "lock", CLI_LOCK, "true"]);
                    c
                },
            ));
            Some(server)
        }
        Err(e) => {
            println!("{e}");
            etcd_missing = Some(e);
            None
        }
    };
    // One untimed run of each, then the rounds.
    for round in 0..=runs {
        for e in entries.iter_mut().filter(|e| e.error.is_none()) {
            match run_once((e.cmd)()) {
                Ok(d) if round > 0 => e.samples.push(d),
                Ok(_) => {}
                Err(err) => e.error = Some(err),
            }
        }
    }
    drop(etcd);
    let flock = entries
        .iter()
        .find(|e| e.what.contains("flock") && !e.samples.is_empty())
        .map(|e| Summary::of(&e.samples).median);
    let mut rows = Vec::new();
    for e in &entries {
        if let Some(err) = &e.error {
            println!("{} ({}): {err}", e.what, e.store);
            rows.push(serde_json::json!({"what": e.what, "store": e.store, "error": err}));
            continue;
        }
        let s = Summary::of(&e.samples);
        rows.push(serde_json::json!({
            "what": e.what,
            "store": e.store,
            "runs": e.samples.len(),
            "median_ms": ms_f(s.median),
            "p90_ms": ms_f(s.p90),
        }));
        println!("{} ({}): {}", e.what, e.store, s.med_p90());
        let vs = match flock {
            Some(f) if !e.what.contains("flock") => {
                format!("{:.1}× flock (median)", ratio(s.median, f))
            }
            _ => String::new(),
        };
        table.push(&e.what, &e.store, s.med_p90(), vs);
    }
    if let Some(e) = etcd_missing {
        rows.push(serde_json::json!({
            "what": "process: `etcdctl lock NAME true`",
            "store": "etcd",
            "error": e,
        }));
        table.push("process: `etcdctl lock NAME true`", "-", e, String::new());
    }
    println!();
    rows
}

/// One command timed over several rounds.
struct Proc {
    what: String,
    store: String,
    cmd: Box<dyn Fn() -> Command>,
    samples: Vec<Duration>,
    error: Option<String>,
}

impl Proc {
    fn new(what: &str, store: &str, cmd: impl Fn() -> Command + 'static) -> Proc {
        Proc {
            what: what.to_owned(),
            store: store.to_owned(),
            cmd: Box::new(cmd),
            samples: Vec::new(),
            error: None,
        }
    }
}

/// Runs `cmd` to its end; its wall time, or why it failed.
fn run_once(mut cmd: Command) -> Result<Duration, String> {
    let what = format!("{:?}", cmd.get_program());
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(took)
}

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// `putex lock CLI_LOCK --store URL [extra] -- true`, with a clean
/// environment and its own keeper directory.
fn putex_lock(putex: &Path, url: &str, keeper_dir: &Path) -> impl Fn(&[&str]) -> Command {
    let (putex, url, keeper_dir) = (putex.to_owned(), url.to_owned(), keeper_dir.to_owned());
    move |extra: &[&str]| {
        let mut c = Command::new(&putex);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PUTEX_") || k == "NATS_URL" {
                c.env_remove(k);
            }
        }
        c.env("PUTEX_KEEPER_DIR", &keeper_dir)
            .args(["lock", CLI_LOCK, "--store", &url])
            .args(extra)
            .args(["--", "true"]);
        c
    }
}

/// A free loopback port (bound and released: another process could take it
/// in between, which is acceptable here).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A single-member etcd on loopback ports: the server, its client URL and
/// the `etcdctl` binary.
fn start_etcd(dir: &Path) -> Result<(KillOnDrop, String, PathBuf), String> {
    let (Some(etcd), Some(etcdctl)) = (on_path("etcd"), on_path("etcdctl")) else {
        return Err("etcd not available".into());
    };
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
    let mut server = KillOnDrop(
        Command::new(etcd)
            .arg("--data-dir")
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?,
    );
    let until = Instant::now() + Duration::from_secs(15);
    while !Command::new(&etcdctl)
        .args(["--endpoints", &endpoint, "endpoint", "health"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        if Instant::now() > until || server.0.try_wait().ok().flatten().is_some() {
            return Err("etcd did not come up".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((server, endpoint, etcdctl))
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------
// 3. Contention.

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
    /// A one-shot [`Lease`] per acquisition.
    Lease,
    /// One standing [`Lock`] per task.
    Lock,
    /// A fair-queue [`Ticket`], then a one-shot [`Lease`].
    Queue,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Lease => "Lease::acquire",
            Mode::Lock => "Lock::acquire",
            Mode::Queue => "Ticket queue + Lease",
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
            let mut lock = (mode == Mode::Lock).then(|| {
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
                let released = match (lease, &mut lock) {
                    (Some(lease), _) => lease.release().await,
                    (None, Some(lock)) => lock.release().await,
                    (None, None) => unreachable!("a lease or a lock"),
                };
                assert!(released.expect("release"), "released");
                if let Some(t) = ticket {
                    t.leave().await;
                }
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

// ---------------------------------------------------------------------------
// Figures.

struct Summary {
    median: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

impl Summary {
    fn of(v: &[Duration]) -> Summary {
        let mut v = v.to_vec();
        v.sort();
        let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
        Summary {
            median: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: *v.last().expect("samples"),
        }
    }

    fn med_p99(&self) -> String {
        format!("{} / p99 {}", ms(self.median), ms(self.p99))
    }

    fn med_p90(&self) -> String {
        format!("{} / p90 {}", ms(self.median), ms(self.p90))
    }

    fn median_ms(&self) -> String {
        ms(self.median)
    }
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// Milliseconds as a number, for `--json`.
fn ms_f(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

#[derive(Default)]
struct Table {
    rows: Vec<[String; 4]>,
}

impl Table {
    fn push(&mut self, what: &str, store: &str, figure: String, note: String) {
        self.rows
            .push([what.to_owned(), store.to_owned(), figure, note]);
    }

    /// A Markdown table, ready for docs/performance.md.
    fn print(&self) {
        println!("| measure | store | figure | ratio / notes |");
        println!("|---|---|---|---|");
        for [a, b, c, d] in &self.rows {
            println!("| {a} | {b} | {c} | {d} |");
        }
    }
}

struct Machine {
    cpus: usize,
    cpu_model: String,
    load: String,
    nats_version: String,
}

impl Machine {
    fn read(nats: &Path) -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, m)| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let nats_version = Command::new(nats)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            load: load_average(),
            nats_version: nats_version
                .rsplit(' ')
                .next()
                .unwrap_or("unknown")
                .to_owned(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} CPU(s), {}, load average {} at start",
            self.cpus, self.cpu_model, self.load
        )
    }
}

// ---------------------------------------------------------------------------
// nats-server (as failover_bench starts it).

/// The store on `server`.
async fn open_nats(server: &NatsServer) -> AnyStore {
    AnyStore::open(&StoreUrl::parse(&server.url).expect("nats url"))
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot open the NATS store at {}: {e}", server.url);
            std::process::exit(1)
        })
}
