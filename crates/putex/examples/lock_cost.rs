//! Lock benchmark, part 1 of 3: what an uncontended lock costs through the
//! lease library, against the raw store operations, and how many store
//! operations it takes. Not a test: it prints figures and ratios for
//! `docs/performance.md`. (Part 2, `lock_process`, times the `putex lock`
//! command; part 3, `lock_contention`, a lock under contention.)
//!
//! ```text
//! cargo run --release -p putex --example lock_cost -- [--iters N] [--quick] [--json FILE]
//! ```
//!
//! `--quick` (50 iterations) takes about ten seconds; the default is 300
//! iterations. `RUST_LOG` turns on the library's logs, and
//! `LOCK_BENCH_DUMP=1` prints every message the NATS recorder saw (both on
//! stderr). `--json FILE` also writes the figures as JSON (for
//! `scripts/bench`).
//!
//! It starts a single-node nats-server on a loopback port with a temporary
//! store directory and the default fsync policy (the binary is
//! `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else `nats-server`
//! on `PATH`; `scripts/install-nats-server` installs it). The embedded
//! SQLite store lives in a temporary file; the etcd store is a single etcd
//! member on a loopback port (`scripts/install-etcd`). The lock names are used once,
//! untimed, before anything is measured, so the first-use wait of S4 is
//! excluded.
//!
//! **Uncontended acquire + release** through the library — a standing
//! [`Lock`] taken and given back again and again (the ≤ 1.15× target), and
//! a one-shot `Lease::acquire` + `Lease::release`, which starts an
//! agent and a watch each time — with the fast profile R = 100 ms, F = 3,
//! C = 1, and the default timing, against the two raw store operations
//! `create` + `delete` of one key (the same key every iteration). The
//! variants are interleaved, one of each per round with a 2 ms pause after
//! each, so load from other work on the machine hits them alike; each
//! standing lock has a name of its own. Then the store operations of one
//! library acquire + release are **counted**: on both stores the writes,
//! by the revision counter (a `put` of a scratch key before and after 20
//! acquire + release); on NATS every message too, by a second connection
//! subscribed to `>` that classifies what it sees (writes to
//! `$KV.<bucket>.<key>` by their headers, direct and leader reads,
//! consumer creations for watches, watch deliveries), split into the
//! acquire, release and after-release phases by marker round trips.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

use putex::core::TimingConfig;
use putex::locks::lease::{LeaseOptions, Lock};
use putex::store::{AnyStore, Store};

use putex_testkit::bench::lock::{
    acquire, fast, first_use, lock_acquire, open_nats, open_sqlite, preamble, print_summary,
    report_watches, revision, DEADLINE, LOCK, LOCK_DEFAULT, LOCK_FAST,
};
use putex_testkit::bench::{at_least_one, ms_f, ratio, verdict, write_json, Summary, Table};
use putex_testkit::etcd_server::EtcdServer;
use putex_testkit::nats_server::NatsServer;
use putex_testkit::watch_failures::WatchFailures;

/// A pause after each timed pair, so that the background work a lease
/// leaves behind (its watch being torn down) does not land on the next
/// variant's clock.
const PAUSE: Duration = Duration::from_millis(2);
/// Iterations of the op-counting runs.
const COUNT_ITERS: usize = 20;

/// Lock benchmark, part 1 of 3: what an uncontended lock costs.
///
/// Times an uncontended acquire + release through the library (a standing
/// `Lock` and a one-shot `Lease`, each with the fast and the default
/// timing) against the raw store operations `create` + `delete`, and counts
/// the store operations of one acquire + release, on a fresh single-node
/// nats-server and on SQLite.
#[derive(Parser)]
#[command(name = "lock_cost")]
struct Args {
    /// Rounds of each variant [default: 300, or 50 with --quick]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    iters: Option<usize>,
    /// A shorter run: 50 rounds (unless --iters says otherwise)
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
    let iters = args.iters.unwrap_or(if args.quick { 50 } else { 300 });
    let started = Instant::now();

    let machine = preamble("a fresh single-node server");
    println!("iterations: {iters} per variant\n");

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = open_sqlite(dir.path().join("bench.db")).await;
    first_use("sqlite", &sqlite).await;
    let mut table = Table::default();
    // The figures for --json.
    let mut uncontended_json = Vec::new();
    let mut op_counts_json = Vec::new();
    let mut guarded_json = Vec::new();
    let mut counts: Vec<(String, String, OpCounts)> = Vec::new();

    let nats = NatsServer::start();
    let nats_store = open_nats(&nats).await;
    first_use("nats", &nats_store).await;
    // etcd: a single member (`$PUTEX_ETCD`, else .tools/bin/etcd; scripts/install-etcd).
    let etcd = EtcdServer::start();
    let etcd_store = AnyStore::open(
        &putex::store::StoreUrl::parse(&format!("etcd://{}", etcd.endpoint())).expect("etcd URL"),
    )
    .await
    .expect("open etcd");
    first_use("etcd", &etcd_store).await;
    for (label, store) in [
        ("nats", &nats_store),
        ("sqlite", &sqlite),
        ("etcd", &etcd_store),
    ] {
        println!("== {label}: uncontended ==");
        let failed = watch_failures.count();
        let u = uncontended(store, iters).await;
        u.print();
        u.rows(label, &mut table);
        uncontended_json.push(u.to_json(label));
        let g = guarded_puts(store, iters).await;
        g.print();
        g.rows(label, &mut table);
        guarded_json.push(g.to_json(label));
        for (profile, timing, standing) in [
            ("Lock, fast", fast(), true),
            ("Lease, fast", fast(), false),
            ("Lease, default", TimingConfig::default(), false),
        ] {
            let c = count_ops(store, timing, standing, &nats.url).await;
            c.print(label, profile);
            op_counts_json.push(serde_json::json!({
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

    print_summary(&machine, started, &table);
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({
                "bench": "lock_cost",
                "iters": iters,
                "nats_server": machine.nats_version,
                "uncontended": uncontended_json,
                "op_counts": op_counts_json,
                "guarded_put": guarded_json,
            }),
        );
    }
    println!();
    println!("store operations per library acquire + release (mean of {COUNT_ITERS}):");
    for (store, profile, c) in &counts {
        println!("  {store}, {profile}: {}", c.summary());
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
    /// One `Lease` per iteration.
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

/// A guarded put (`docs/locks.md`, "Guarded writes") beside a plain put
/// of the same key, alternately, while one `Lease` holds the lock and
/// renews (R = 100 ms: a renewal lands among every few writes).
struct GuardedPuts {
    plain: Vec<Duration>,
    guarded: Vec<Duration>,
}

async fn guarded_puts(store: &AnyStore, iters: usize) -> GuardedPuts {
    let lease = acquire(store, "bench-guarded", "bench-node", fast()).await;
    let writes = lease.guard();
    // Warm both paths.
    store
        .put("kv.bench.plain", b"0", DEADLINE)
        .await
        .expect("put");
    writes
        .put("bench.guarded", b"0")
        .await
        .expect("guarded put");
    let mut g = GuardedPuts {
        plain: Vec::with_capacity(iters),
        guarded: Vec::with_capacity(iters),
    };
    for i in 0..iters {
        let value = i.to_string();
        let t0 = Instant::now();
        store
            .put("kv.bench.plain", value.as_bytes(), DEADLINE)
            .await
            .expect("put");
        g.plain.push(t0.elapsed());
        tokio::time::sleep(PAUSE).await;
        let t0 = Instant::now();
        writes
            .put("bench.guarded", value.as_bytes())
            .await
            .expect("a held lease's guarded put lands");
        g.guarded.push(t0.elapsed());
        tokio::time::sleep(PAUSE).await;
    }
    assert!(lease.release().await.expect("release"), "released");
    g
}

impl GuardedPuts {
    fn print(&self) {
        let (plain, guarded) = (Summary::of(&self.plain), Summary::of(&self.guarded));
        println!(
            "plain put {}; guarded put (held Lease) {}: {:.2}× (median)",
            plain.med_p99(),
            guarded.med_p99(),
            ratio(guarded.median, plain.median)
        );
    }

    fn to_json(&self, store: &str) -> serde_json::Value {
        let (plain, guarded) = (Summary::of(&self.plain), Summary::of(&self.guarded));
        serde_json::json!({
            "store": store,
            "iters": self.plain.len(),
            "plain_put": {"median_ms": ms_f(plain.median), "p99_ms": ms_f(plain.p99)},
            "guarded_put": {"median_ms": ms_f(guarded.median), "p99_ms": ms_f(guarded.p99)},
        })
    }

    fn rows(&self, store: &str, table: &mut Table) {
        let (plain, guarded) = (Summary::of(&self.plain), Summary::of(&self.guarded));
        table.push(
            "guarded `put` (held `Lease`, R=100ms) vs plain `put`",
            store,
            guarded.med_p99(),
            format!(
                "{:.2}× plain put ({}; p99 {:.2}×)",
                ratio(guarded.median, plain.median),
                plain.median_ms(),
                ratio(guarded.p99, plain.p99)
            ),
        );
    }
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
