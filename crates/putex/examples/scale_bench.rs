//! Scale benchmark: one process holding many leases, and many agents on one
//! lock. Not a test: it prints figures for `docs/performance.md` (and, with
//! `--json FILE`, writes them for `scripts/bench`).
//!
//! ```text
//! cargo run --release -p putex --example scale_bench -- [--quick] [--only leases|agents]
//!     [--store nats|sqlite|both] [--leases N] [--window SECS] [--acquire-limit SECS]
//!     [--agents N] [--crashes N] [--putex PATH] [--json FILE]
//! ```
//!
//! 1. **Many leases in one process** (`--leases`, default 1,000): one
//!    [`Lease::acquire`] per name (`scale-0` …), all at once, with the
//!    default timing (R = 1 s, F = 10, C = 2) and one store handle. The
//!    names are new, so every acquisition first waits W + G (S4, about
//!    12.2 s): that is the warm-up, timed but not measured. Then, over the
//!    window (`--window`, default 20 s; 5 s with `--quick`): this process's
//!    CPU time (`utime + stime` of `/proc/self/stat`, every thread), its
//!    peak VmRSS (sampled every 250 ms from the start of the warm-up to the
//!    end of the window), the store's writes per second (the
//!    revision counter: a `put` of a scratch key before and after, every
//!    write takes one revision), on NATS the nats-server's own CPU time, the
//!    leases still held at the end, and the lease watches that failed to
//!    start (the driver logs them at debug level; on NATS each watch is a
//!    JetStream consumer, and the server allows 1,000 per stream by
//!    default). Then all are released at once (timed). If not every lease
//!    was acquired (within `--acquire-limit`, default 43 s = W + G + 30 s;
//!    25 s with `--quick`) and still held at the end, the
//!    attempt is repeated with a third as many leases, and each attempt is
//!    reported. On NATS the same writes are then made **without the
//!    leases**, on the same server: one compare-and-swap per key and
//!    second for as many keys, spread evenly, with a watch of the keys
//!    taking every change — once through async-nats's JetStream publish,
//!    once through putex's NATS store (`Store::update`). That is the floor
//!    under any design that renews each lease with a write of its own.
//! 2. **Many agents on one lock** (`--agents`, default 50): `putex run`
//!    agents (the release binary beside this example, or `--putex PATH`)
//!    with the fast profile R = 100 ms, F = 3, C = 1 in hook mode with
//!    `--healthcheck true`, the hooks appending `start`/`stop` lines as in
//!    `failover_bench`. Once all are up: their CPU time (agents, keepers
//!    and, on NATS, the server) over 5 s, then `--crashes` times (3; 1 with
//!    `--quick`) a host crash — SIGKILL of the active agent and its keeper —
//!    timed to the next `start` line and compared with the bound B that
//!    `putex check` prints for the same flags; 1 s later exactly one live
//!    agent must be active (its last hook line a `start`). The crashed agent
//!    is restarted as a standby before the next crash. If the agents cannot
//!    come up or no standby takes over, the run is repeated with half as
//!    many agents (down to 2), and each attempt is reported.
//!
//! Each store gets a fresh single-node nats-server on a loopback port (the
//! binary is `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else
//! `nats-server` on `PATH`; default fsync) or a fresh SQLite file in a
//! temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use putex::core::TimingConfig;
use putex::locks::lease::{Lease, LeaseOptions};
use putex::store::{AnyStore, SqliteStore, Store, StoreUrl, Token};

use putex_testkit::agent::{events, hooks, starts, Agent, AgentSpec, Line};
use putex_testkit::bench::lock::{consumers, revision};
use putex_testkit::bench::{verdict, FAST};
use putex_testkit::nats_server::NatsServer;
use putex_testkit::procfs::{clock_ticks, cpu_model, cpu_ticks, load_average, num_cpus, rss_kb};
use putex_testkit::watch_failures::WatchFailures;

/// How long the agents' CPU time is sampled once they are all up.
const AGENT_CPU_WINDOW: Duration = Duration::from_secs(5);
/// After a failover, how long before checking that exactly one is active.
const SETTLE: Duration = Duration::from_secs(1);

/// Which part to run.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    /// Many leases in one process.
    Leases,
    /// Many agents on one lock.
    Agents,
}

/// Which stores to run on.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Stores {
    Nats,
    Sqlite,
    Both,
}

#[derive(clap::Parser)]
#[command(
    name = "scale_bench",
    about = "1,000 leases in one process, then many agents on one lock: CPU, memory, failover"
)]
struct Args {
    /// A shorter run: 5 s windows, a 25 s acquire limit, 1 crash
    #[arg(long)]
    quick: bool,
    /// Run one part only
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// The stores to run on
    #[arg(long, value_enum, default_value_t = Stores::Both)]
    store: Stores,
    /// How many leases one process holds
    #[arg(long, default_value_t = 1000, value_parser = putex_testkit::bench::at_least_one)]
    leases: usize,
    /// The measuring window in seconds [default: 20, 5 with --quick]
    #[arg(long, value_name = "SECS")]
    window: Option<u64>,
    /// How long all leases may take to be acquired, in seconds [default: 43, 25 with --quick]
    #[arg(long, value_name = "SECS")]
    acquire_limit: Option<u64>,
    /// How many agents share one lock (at least 2)
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(2..))]
    agents: u64,
    /// How many crashes of the active agent [default: 3, 1 with --quick]
    #[arg(long, value_parser = putex_testkit::bench::at_least_one)]
    crashes: Option<usize>,
    /// The putex binary [default: the one beside this example, built if missing]
    #[arg(long, value_name = "PATH")]
    putex: Option<PathBuf>,
    /// Also write the figures as JSON to FILE (for scripts/bench)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn main() {
    let Args {
        quick,
        only,
        store,
        leases,
        window,
        acquire_limit: limit,
        agents,
        crashes,
        putex: putex_bin,
        json,
    } = clap::Parser::parse();
    let agents = usize::try_from(agents).unwrap_or(usize::MAX);
    let stores: Vec<&str> = match store {
        Stores::Nats => vec!["nats"],
        Stores::Sqlite => vec!["sqlite"],
        Stores::Both => vec!["nats", "sqlite"],
    };
    let window = Duration::from_secs(window.unwrap_or(if quick { 5 } else { 20 }));
    // W + G at the default timing is 12.2 s; then 30 s to spare (12 quick).
    let limit = Duration::from_secs(limit.unwrap_or(if quick { 25 } else { 43 }));
    let crashes = crashes.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let run = |part: Only| only.is_none_or(|o| o == part);
    let watch_failures = WatchFailures::install();
    println!(
        "host: {} CPU(s), {}, load average {}",
        num_cpus(),
        cpu_model(),
        load_average()
    );

    let mut out_leases = Vec::new();
    let mut out_agents = Vec::new();
    if run(Only::Leases) {
        for store in &stores {
            let mut n = leases;
            loop {
                println!("\n== {store}: one process holding {n} leases at R = 1 s ==");
                // A runtime per attempt: dropping it ends every driver task
                // an attempt leaves behind (an acquisition that timed out
                // keeps its driver running until then).
                let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
                let r = rt.block_on(many_leases(store, n, window, limit, &watch_failures));
                rt.shutdown_timeout(Duration::from_secs(10));
                r.print();
                let ok = r.sustained();
                out_leases.push(r.to_json());
                if ok || n < 10 {
                    break;
                }
                n /= 3;
                println!("not sustained: retrying with {n} leases");
                // Let the machine calm down first.
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }
    if run(Only::Agents) {
        let putex_bin = putex_bin.unwrap_or_else(find_putex);
        for store in &stores {
            let mut n = agents;
            loop {
                println!(
                    "\n== {store}: {n} agents on one lock, R = 100 ms, F = 3, C = 1, {crashes} crash(es) =="
                );
                let r = many_agents(&putex_bin, store, n, crashes);
                r.print();
                let failed = r.failure.is_some();
                out_agents.push(r.to_json());
                if !failed || n <= 2 {
                    break;
                }
                n = (n / 2).max(2);
                println!("retrying with {n} agents");
            }
        }
    }
    println!("\nload average at the end: {}", load_average());
    if let Some(path) = json {
        let v = serde_json::json!({
            "bench": "scale",
            "cpus": num_cpus(),
            "leases": out_leases,
            "agents": out_agents,
        });
        if let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(&v).expect("json")) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Many leases in one process.

struct ManyLeases {
    store: String,
    leases: usize,
    acquired: usize,
    acquire_errors: Vec<String>,
    warm_up: Duration,
    window: Duration,
    cpu_percent: f64,
    server_cpu_percent: Option<f64>,
    rss_before_kb: u64,
    rss_peak_kb: u64,
    writes: u64,
    held_at_end: usize,
    watch_failures_warm_up: usize,
    watch_failures_window: usize,
    consumers: Option<u64>,
    /// Threads and open file descriptors of this process at the end of the
    /// window (tokio's blocking pool; SQLite connections).
    threads: usize,
    open_fds: usize,
    released: usize,
    release_took: Duration,
    load_start: String,
    load_end: String,
    /// On NATS: the client library alone at the same rate ([`client_floor`]).
    client_floor: Option<Result<ClientFloor, String>>,
}

async fn many_leases(
    label: &str,
    n: usize,
    window: Duration,
    limit: Duration,
    failures: &WatchFailures,
) -> ManyLeases {
    let load_start = load_average();
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = (label == "nats").then(NatsServer::start);
    let store: AnyStore = match &nats {
        Some(s) => AnyStore::open(&StoreUrl::parse(&s.url).expect("url"))
            .await
            .unwrap_or_else(|e| {
                eprintln!("cannot open the NATS store at {}: {e}", s.url);
                std::process::exit(1)
            }),
        None => SqliteStore::open(dir.path().join("scale.db"))
            .await
            .expect("sqlite store")
            .into(),
    };
    let me = std::process::id() as i32;
    let rss_before_kb = rss_kb(me);
    let failed_before = failures.count();
    // Peak VmRSS, sampled from here to the end of the window.
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kb(me) as usize, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // Warm-up: every name is new, so each acquisition waits W + G (S4).
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let options =
                    LeaseOptions::new(&format!("scale-{i}"), "scale-node", TimingConfig::default())
                        .unwrap();
                match tokio::time::timeout(limit, Lease::acquire(store, options)).await {
                    Ok(Ok(lease)) => Ok(lease),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("not held within {limit:?}")),
                }
            })
        })
        .collect();
    let mut held = Vec::with_capacity(n);
    let mut acquire_errors = Vec::new();
    for t in tasks {
        match t.await.expect("an acquire task panicked") {
            Ok(lease) => held.push(lease),
            Err(e) => acquire_errors.push(e),
        }
    }
    let warm_up = t0.elapsed();
    println!(
        "warm-up: {} of {n} held after {:.1} s (first use of each name waits W + G ≈ 12.2 s)",
        held.len(),
        warm_up.as_secs_f64()
    );
    let watch_failures_warm_up = failures.count() - failed_before;
    // Let the renewal rounds spread out before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The window.
    let server = nats.as_ref().map(NatsServer::pid);
    let failed_before = failures.count();
    let rev0 = revision(&store).await;
    let cpu0 = cpu_ticks(me);
    let srv0 = server.map(cpu_ticks);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_ticks(me);
    let srv1 = server.map(cpu_ticks);
    let rev1 = revision(&store).await;
    let tck = clock_ticks();
    let pct = |ticks: u64| ticks as f64 / tck as f64 / secs * 100.0;
    let held_at_end = held.iter().filter(|l| l.is_held()).count();
    let watch_failures_window = failures.count() - failed_before;
    let consumers = consumers(&store).await;
    let threads = count_dir(&format!("/proc/{me}/task"));
    let open_fds = count_dir(&format!("/proc/{me}/fd"));
    sampler.abort();
    let rss_peak_kb = peak.load(Ordering::Relaxed) as u64;

    // Release them all at once.
    let t0 = Instant::now();
    let releases: Vec<_> = held
        .into_iter()
        .map(|l| tokio::spawn(async move { l.release().await.unwrap_or(false) }))
        .collect();
    let mut released = 0;
    for r in releases {
        if r.await.unwrap_or(false) {
            released += 1;
        }
    }
    let release_took = t0.elapsed();
    drop(store);
    // The same server, the same rate, without putex.
    let client_floor = match &nats {
        Some(server) => Some(client_floor(&server.url, n, window).await),
        None => None,
    };
    drop(nats);
    ManyLeases {
        store: label.to_owned(),
        leases: n,
        acquired: n - acquire_errors.len(),
        acquire_errors,
        warm_up,
        window: Duration::from_secs_f64(secs),
        cpu_percent: pct(cpu1 - cpu0),
        server_cpu_percent: srv0.zip(srv1).map(|(a, b)| pct(b - a)),
        rss_before_kb,
        rss_peak_kb,
        // The second put's own revision is not a lease's write.
        writes: rev1.saturating_sub(rev0).saturating_sub(1),
        held_at_end,
        watch_failures_warm_up,
        watch_failures_window,
        consumers,
        threads,
        open_fds,
        released,
        release_took,
        load_start,
        load_end: load_average(),
        client_floor,
    }
}

impl ManyLeases {
    /// Every lease acquired and still held at the end of the window.
    fn sustained(&self) -> bool {
        self.acquire_errors.is_empty() && self.held_at_end == self.leases
    }

    fn writes_per_s(&self) -> f64 {
        self.writes as f64 / self.window.as_secs_f64()
    }

    fn print(&self) {
        if !self.acquire_errors.is_empty() {
            println!(
                "{} acquisitions failed, e.g. {}",
                self.acquire_errors.len(),
                self.acquire_errors[0]
            );
        }
        println!(
            "over {:.1} s: process CPU {:.1}% of a core ({:.4}% per lease){}; VmRSS {:.1} MB before, \
             peak {:.1} MB (warm-up and window); store writes {:.0}/s (expected {} leases / R = {}/s); \
             {} of {} still held at the end",
            self.window.as_secs_f64(),
            self.cpu_percent,
            self.cpu_percent / self.acquired.max(1) as f64,
            self.server_cpu_percent
                .map(|p| format!(", nats-server {p:.1}%"))
                .unwrap_or_default(),
            self.rss_before_kb as f64 / 1024.0,
            self.rss_peak_kb as f64 / 1024.0,
            self.writes_per_s(),
            self.acquired,
            self.acquired,
            self.held_at_end,
            self.acquired
        );
        if let Some(Err(e)) = &self.client_floor {
            println!("the NATS client alone could not be measured: {e}");
        }
        println!(
            "{} threads, {} open file descriptors; watches that failed to start: {} during the warm-up, {} in the window{}",
            self.threads,
            self.open_fds,
            self.watch_failures_warm_up,
            self.watch_failures_window,
            self.consumers
                .map(|c| format!("; consumers on the bucket's stream: {c}"))
                .unwrap_or_default()
        );
        println!(
            "released {} of {} at once in {:.2} s; load average {} → {}",
            self.released,
            self.acquired,
            self.release_took.as_secs_f64(),
            self.load_start,
            self.load_end
        );
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "store": self.store,
            "leases": self.leases,
            "acquired": self.acquired,
            "acquire_errors": self.acquire_errors.len(),
            "first_acquire_error": self.acquire_errors.first(),
            "warm_up_s": self.warm_up.as_secs_f64(),
            "window_s": self.window.as_secs_f64(),
            "cpu_percent": self.cpu_percent,
            "server_cpu_percent": self.server_cpu_percent,
            "rss_before_kb": self.rss_before_kb,
            "rss_peak_kb": self.rss_peak_kb,
            "sustained": self.sustained(),
            "writes": self.writes,
            "writes_per_s": self.writes_per_s(),
            "expected_writes_per_s": self.acquired as f64,
            "held_at_end": self.held_at_end,
            "watch_failures_warm_up": self.watch_failures_warm_up,
            "watch_failures_window": self.watch_failures_window,
            "consumers": self.consumers,
            "threads": self.threads,
            "open_fds": self.open_fds,
            "released": self.released,
            "release_s": self.release_took.as_secs_f64(),
            "load_start": self.load_start,
            "load_end": self.load_end,
            "client_floor": match &self.client_floor {
                Some(Ok(f)) => serde_json::json!({
                    "cas_per_s": f.rate,
                    "window_s": f.window.as_secs_f64(),
                    "jetstream_publish_cpu_percent": f.jetstream_publish,
                    "store_update_cpu_percent": f.store_update,
                }),
                Some(Err(e)) => serde_json::json!({ "error": e }),
                None => serde_json::Value::Null,
            },
        })
    }
}

// ---------------------------------------------------------------------------
// 1b. The same writes without the leases.

/// What `rate` compare-and-swaps a second cost this process without the
/// leases around them: the floor under any design that renews each lease
/// with a write of its own.
struct ClientFloor {
    rate: usize,
    window: Duration,
    /// % of a core through async-nats's JetStream publish (a new inbox,
    /// a permit and two timers per write: how putex wrote until session 32).
    jetstream_publish: f64,
    /// % of a core through putex's NATS store (`Store::update`: every
    /// write's answer on the handle's one subscription, its deadline, its
    /// classification).
    store_update: f64,
}

/// Measures [`ClientFloor`] against the server at `url`, on a bucket of its
/// own (`floor`) with `rate` keys, each compare-and-swapped once a second
/// for `window` (spread evenly, as the leases' renewals are), while a
/// watch of the whole bucket takes every change, as a handle's one change
/// feed does. The leases were released and their handle dropped: nothing
/// else of putex runs meanwhile.
async fn client_floor(url: &str, rate: usize, window: Duration) -> Result<ClientFloor, String> {
    let store = AnyStore::open(
        &StoreUrl::parse(&format!("{url}?bucket=floor")).map_err(|e| e.to_string())?,
    )
    .await
    .map_err(|e| format!("open: {e}"))?;
    let AnyStore::Nats(nats) = &store else {
        return Err("not a NATS store".into());
    };
    let js = async_nats::jetstream::new(nats.client().clone());
    let value = vec![b'x'; 300];
    let keys: Vec<String> = (0..rate).map(|i| format!("floor.k{i}")).collect();
    let mut tokens = Vec::with_capacity(rate);
    for key in &keys {
        let token = store
            .put(key, &value, Duration::from_secs(5))
            .await
            .map_err(|e| format!("put: {e}"))?;
        tokens.push(token);
    }
    let mut feed = store
        .watch("floor.", None, Duration::from_secs(5))
        .await
        .map_err(|e| format!("watch: {e}"))?;
    let feed = tokio::spawn(async move { while feed.next().await.is_some() {} });
    let floor = Floor {
        rate,
        window,
        store: &store,
        js: &js,
        keys: &keys,
        value: &value,
    };
    let jetstream_publish = floor
        .run(
            "async-nats's JetStream publish",
            Way::JetStreamPublish,
            &mut tokens,
        )
        .await?;
    let store_update = floor
        .run("putex's NATS store", Way::Store, &mut tokens)
        .await?;
    feed.abort();
    Ok(ClientFloor {
        rate,
        window,
        jetstream_publish,
        store_update,
    })
}

/// How [`client_floor`] writes.
#[derive(Clone, Copy)]
enum Way {
    /// async-nats's JetStream publish, awaiting its acknowledgement.
    JetStreamPublish,
    /// `Store::update` of putex's NATS store: the write a renewal makes,
    /// without the lease around it.
    Store,
}

/// What every run of [`client_floor`] writes with.
struct Floor<'a> {
    rate: usize,
    window: Duration,
    store: &'a AnyStore,
    js: &'a async_nats::jetstream::Context,
    keys: &'a [String],
    value: &'a [u8],
}

impl Floor<'_> {
    /// One way's run: the process's CPU over the window, % of a core.
    async fn run(&self, label: &str, way: Way, tokens: &mut [Token]) -> Result<f64, String> {
        let me = std::process::id() as i32;
        let epoch = self.store.epoch();
        let cpu0 = cpu_ticks(me);
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut sent = 0usize;
        let mut failed = 0usize;
        let mut calls = futures::stream::FuturesUnordered::new();
        while t0.elapsed() < self.window {
            tokio::select! {
                _ = tick.tick() => {
                    let due = (t0.elapsed().as_millis() as usize).saturating_mul(self.rate) / 1000;
                    while sent < due {
                        let i = sent % self.rate;
                        sent += 1;
                        let (key, value, expected) = (self.keys[i].clone(), self.value.to_vec(), tokens[i]);
                        let call: futures::future::BoxFuture<'static, (usize, Option<Token>)> = match way {
                            Way::JetStreamPublish => {
                                let js = self.js.clone();
                                Box::pin(async move {
                                    let mut headers = async_nats::HeaderMap::new();
                                    headers.insert(
                                        "Nats-Expected-Last-Subject-Sequence",
                                        async_nats::HeaderValue::from(expected.revision),
                                    );
                                    let subject = format!("$KV.floor.{key}");
                                    let ack = match js.publish_with_headers(subject, headers, value.into()).await {
                                        Ok(ack) => ack.await.ok().map(|a| Token::new(epoch, a.sequence)),
                                        Err(_) => None,
                                    };
                                    (i, ack)
                                })
                            }
                            Way::Store => {
                                let store = self.store.clone();
                                Box::pin(async move {
                                    let t = store.update(&key, &value, expected, Duration::from_secs(5)).await;
                                    (i, t.ok())
                                })
                            }
                        };
                        calls.push(call);
                    }
                }
                Some((i, token)) = calls.next(), if !calls.is_empty() => match token {
                    Some(token) => tokens[i] = token,
                    None => failed += 1,
                },
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = (cpu_ticks(me) - cpu0) as f64 / clock_ticks() as f64 / secs * 100.0;
        while let Some((i, token)) = calls.next().await {
            match token {
                Some(token) => tokens[i] = token,
                None => failed += 1,
            }
        }
        println!(
            "without the leases ({label}): {sent} compare-and-swaps in {secs:.1} s, \
             {failed} failed: {cpu:.1}% of a core"
        );
        if failed > 0 {
            return Err(format!("{label}: {failed} of {sent} writes failed"));
        }
        Ok(cpu)
    }
}

// ---------------------------------------------------------------------------
// 2. Many agents on one lock.

struct ManyAgents {
    store: String,
    agents: usize,
    bound: Option<Duration>,
    /// Until all agents were up (first use of the lock included).
    came_up: Option<Duration>,
    /// CPU of all agents, all keepers and the server, % of one core.
    agents_cpu: f64,
    keepers_cpu: f64,
    server_cpu: Option<f64>,
    /// Whole machine: busy share of all cores over the same window.
    machine_busy: f64,
    failovers: Vec<Duration>,
    /// After each failover: live agents whose last hook line is a start.
    active_after: Vec<usize>,
    /// Agents that exited at start-up (and were started again), with why.
    refusals: Vec<String>,
    failure: Option<String>,
    load_start: String,
    load_end: String,
}

fn many_agents(putex: &Path, label: &str, n: usize, crashes: usize) -> ManyAgents {
    let mut r = ManyAgents {
        store: label.to_owned(),
        agents: n,
        bound: None,
        came_up: None,
        agents_cpu: 0.0,
        keepers_cpu: 0.0,
        server_cpu: None,
        machine_busy: 0.0,
        failovers: Vec::new(),
        active_after: Vec::new(),
        refusals: Vec::new(),
        failure: None,
        load_start: load_average(),
        load_end: String::new(),
    };
    if let Err(e) = agents_run(putex, label, n, crashes, &mut r) {
        println!("FAILED with {n} agents: {e}");
        r.failure = Some(e);
    }
    r.load_end = load_average();
    r
}

fn agents_run(
    putex: &Path,
    label: &str,
    n: usize,
    crashes: usize,
    r: &mut ManyAgents,
) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = (label == "nats").then(NatsServer::start);
    let url = match &nats {
        Some(s) => s.url.clone(),
        None => format!("sqlite://{}", dir.path().join("store.db").display()),
    };
    let out = Command::new(putex)
        .args(["check", "--store", &url])
        .args(FAST)
        .output()
        .map_err(|e| format!("putex check: {e}"))?;
    let check = String::from_utf8_lossy(&out.stdout).to_string();
    let bound = putex_testkit::check::worst_case_bound(&check)
        .ok_or_else(|| format!("cannot read B from:\n{check}"))?;
    r.bound = Some(bound);
    println!("B = {bound:?} (putex check {})", FAST.join(" "));

    let mut bench = Agents {
        putex: putex.to_owned(),
        dir: dir.path().to_path_buf(),
        url,
        events: dir.path().join("events"),
        agents: Vec::new(),
    };
    let t0 = Instant::now();
    for i in 1..=n {
        bench.start_up(&format!("a{i:02}"), &mut r.refusals)?;
    }
    let up_within = Duration::from_secs(30);
    bench.wait_starts(1, up_within)?;
    bench.all_up(up_within)?;
    r.came_up = Some(t0.elapsed());
    println!(
        "all {n} up after {:.1} s (started one after another){}; load average {}",
        t0.elapsed().as_secs_f64(),
        refusals_note(&r.refusals),
        load_average()
    );

    // CPU while all are up and one is active.
    let agent_pids: Vec<i32> = bench.agents.iter().map(Agent::pid).collect();
    let keeper_pids: Vec<i32> = bench.agents.iter().flat_map(Agent::keepers).collect();
    let server = nats.as_ref().map(NatsServer::pid);
    let sum = |pids: &[i32]| pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let (a0, k0, s0, m0) = (
        sum(&agent_pids),
        sum(&keeper_pids),
        server.map(cpu_ticks),
        machine_ticks(),
    );
    let t = Instant::now();
    std::thread::sleep(AGENT_CPU_WINDOW);
    let secs = t.elapsed().as_secs_f64();
    let (a1, k1, s1, m1) = (
        sum(&agent_pids),
        sum(&keeper_pids),
        server.map(cpu_ticks),
        machine_ticks(),
    );
    let tck = clock_ticks() as f64;
    let pct = |ticks: u64| ticks as f64 / tck / secs * 100.0;
    r.agents_cpu = pct(a1 - a0);
    r.keepers_cpu = pct(k1 - k0);
    r.server_cpu = s0.zip(s1).map(|(a, b)| pct(b - a));
    r.machine_busy = {
        let busy = (m1.0 - m0.0) as f64;
        let all = (m1.1 - m0.1) as f64;
        busy / all.max(1.0) * 100.0
    };
    println!(
        "CPU over {secs:.1} s: {n} agents {:.1}%, {} keepers {:.1}% of one core{}; machine {:.0}% busy (all cores, any process)",
        r.agents_cpu,
        keeper_pids.len(),
        r.keepers_cpu,
        r.server_cpu
            .map(|p| format!(", nats-server {p:.1}%"))
            .unwrap_or_default(),
        r.machine_busy
    );

    for i in 0..crashes {
        if i > 0 {
            bench.all_up(up_within)?;
        }
        std::thread::sleep(Duration::from_millis(500));
        let active = bench
            .starts()
            .last()
            .map(|l| l.node.clone())
            .ok_or("no active agent")?;
        let before = bench.starts().len();
        let killed = bench.crash(&active);
        let next = bench.wait_starts(before + 1, Duration::from_secs(10))?;
        let took = ns_between(killed, next.ns);
        std::thread::sleep(SETTLE);
        let live = bench.active_live(&active);
        println!(
            "crash {}: {active} killed → {} active after {took:?} ({:.0}% of B); {} live agent(s) active {SETTLE:?} later: {}",
            i + 1,
            next.node,
            pct_of(took, bound),
            live.len(),
            live.join(" ")
        );
        r.failovers.push(took);
        r.active_after.push(live.len());
        if i + 1 < crashes {
            bench.start_up(&active, &mut r.refusals)?;
        }
    }
    bench.stop_all();
    Ok(())
}

impl ManyAgents {
    fn print(&self) {
        if self.failure.is_some() && !self.refusals.is_empty() {
            println!(
                "start-up refusals before the failure{}",
                refusals_note(&self.refusals)
            );
        }
        let Some(bound) = self.bound else {
            return;
        };
        if self.failovers.is_empty() {
            return;
        }
        let max = *self.failovers.iter().max().expect("failovers");
        println!(
            "{} agents: failover max {max:?} = {:.0}% of B = {bound:?}; target ≤ B + 100 ms: {}; exactly one active after every failover: {}",
            self.agents,
            pct_of(max, bound),
            verdict(max <= bound + Duration::from_millis(100)),
            if self.active_after.iter().all(|n| *n == 1) {
                "yes"
            } else {
                "NO"
            }
        );
    }

    fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        serde_json::json!({
            "store": self.store,
            "agents": self.agents,
            "bound_ms": self.bound.map(ms),
            "came_up_s": self.came_up.map(|d| d.as_secs_f64()),
            "agents_cpu_percent": self.agents_cpu,
            "keepers_cpu_percent": self.keepers_cpu,
            "server_cpu_percent": self.server_cpu,
            "machine_busy_percent": self.machine_busy,
            "failover_ms": self.failovers.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "active_after": self.active_after,
            "start_refusals": self.refusals.len(),
            "first_start_refusal": self.refusals.first(),
            "failure": self.failure,
            "load_start": self.load_start,
            "load_end": self.load_end,
        })
    }
}

struct Agents {
    putex: PathBuf,
    dir: PathBuf,
    url: String,
    events: PathBuf,
    agents: Vec<Agent>,
}

impl Agents {
    /// Starts (or restarts) `node`'s agent, with its keeper dir and log.
    fn start(&mut self, node: &str) {
        self.agents.retain(|a| a.node() != node);
        let spec = AgentSpec::new(&self.putex, &self.url, "scale", node, &self.dir)
            .args(&FAST)
            .args(&["--healthcheck", "true"])
            .args(&hooks(&self.events));
        self.agents
            .push(Agent::spawn(spec).expect("start putex run"));
    }

    fn events(&self) -> Vec<Line> {
        events(&self.events)
    }

    fn starts(&self) -> Vec<Line> {
        starts(&self.events)
    }

    /// Waits for the `n`-th start line and returns it.
    fn wait_starts(&self, n: usize, within: Duration) -> Result<Line, String> {
        let until = Instant::now() + within;
        loop {
            let mut s = self.starts();
            if s.len() >= n {
                return Ok(s.swap_remove(n - 1));
            }
            if Instant::now() > until {
                return Err(format!(
                    "no activation #{n} within {within:?}{}",
                    self.exited()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts `node` and waits until it is up (in standby), one agent
    /// after another as separate hosts would come up. An agent that exits
    /// instead — e.g. refused by the start-up check that R is at least ten
    /// times the store's p99 compare-and-swap latency, measured while the
    /// machine is busy — is started again, up to 3 times; each refusal is
    /// recorded with its reason.
    fn start_up(&mut self, node: &str, refusals: &mut Vec<String>) -> Result<(), String> {
        for _ in 0..4 {
            self.start(node);
            let until = Instant::now() + Duration::from_secs(15);
            loop {
                let a = self.agents.last_mut().expect("just started");
                if a.log_text().contains("-> standby") {
                    return Ok(());
                }
                if !a.alive() {
                    refusals.push(format!("{node}: {}", a.refusal()));
                    break;
                }
                if Instant::now() > until {
                    return Err(format!("{node} not up within 15 s"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(format!(
            "{node} exited at start-up 4 times; last: {}",
            refusals.last().map_or("", String::as_str)
        ))
    }

    /// Waits until every agent is up (its log shows it entered standby).
    fn all_up(&mut self, within: Duration) -> Result<(), String> {
        let until = Instant::now() + within;
        loop {
            for a in &mut self.agents {
                if !a.alive() {
                    return Err(format!("{} exited: {}", a.node(), a.refusal()));
                }
            }
            let down = self
                .agents
                .iter()
                .filter(|a| !a.log_text().contains("-> standby"))
                .count();
            if down == 0 {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(format!(
                    "{down} of {} agents not up within {within:?}{}",
                    self.agents.len(),
                    self.exited()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Agents that exited on their own, with the end of their log.
    fn exited(&self) -> String {
        let gone: Vec<String> = self
            .agents
            .iter()
            .filter(|a| {
                std::fs::read_to_string(format!("/proc/{}/stat", a.pid()))
                    .map(|s| s.contains(") Z"))
                    .unwrap_or(true)
            })
            .map(|a| format!("{}: {}", a.node(), a.refusal()))
            .collect();
        if gone.is_empty() {
            String::new()
        } else {
            format!("; exited: {}", gone.join("; "))
        }
    }

    /// Live agents (not `crashed`) whose last hook line is a start.
    fn active_live(&self, crashed: &str) -> Vec<String> {
        let mut last: std::collections::BTreeMap<String, String> = Default::default();
        for l in self.events() {
            last.insert(l.node, l.what);
        }
        last.into_iter()
            .filter(|(node, what)| node != crashed && what == "start")
            .map(|(node, _)| node)
            .collect()
    }

    /// A host crash: SIGKILL of the agent and its keeper at once. Returns
    /// the wall-clock time of the kill.
    fn crash(&mut self, node: &str) -> u128 {
        let a = self
            .agents
            .iter_mut()
            .find(|a| a.node() == node)
            .expect("agent");
        a.crash()
    }

    fn stop_all(&mut self) {
        for a in &self.agents {
            a.sigterm();
        }
        let until = Instant::now() + Duration::from_secs(10);
        for a in &mut self.agents {
            a.wait_exit(until.saturating_duration_since(Instant::now()));
        }
        // Drop kills what is left (and the keepers).
        self.agents.clear();
    }
}

/// How many agents exited at start-up and why (the first reason).
fn refusals_note(refusals: &[String]) -> String {
    match refusals.first() {
        None => String::new(),
        Some(first) => format!(
            "; {} start(s) refused and retried, first: {first}",
            refusals.len()
        ),
    }
}

// ---------------------------------------------------------------------------
// Measuring.

fn pct_of(d: Duration, of: Duration) -> f64 {
    d.as_secs_f64() / of.as_secs_f64() * 100.0
}

fn ns_between(a: u128, b: u128) -> Duration {
    Duration::from_nanos(u64::try_from(b.saturating_sub(a)).unwrap_or(u64::MAX))
}

/// The whole machine from `/proc/stat`: (busy, total) clock ticks.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map_or(0, |d| d.count())
}

// ---------------------------------------------------------------------------
// Binaries.

/// The `putex` binary beside this example, built when missing or stale.
fn find_putex() -> PathBuf {
    putex_testkit::bench::putex_beside_me().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
}
