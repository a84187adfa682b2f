//! The lock gateway (`putex serve`) under load. Not a test: it prints
//! figures for `docs/performance.md`.
//!
//! ```text
//! cargo run --release -p putex --example gateway_load -- [--quick] [--store nats|sqlite|both]
//!     [--waiters N] [--putex PATH] [--json FILE]
//! ```
//!
//! For each store it starts one `putex serve` process (the release binary
//! beside this example, or `--putex PATH`; loopback port, default flags)
//! on a fresh single-node nats-server (loopback port, temporary directory;
//! `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else
//! `nats-server` on `PATH`) or an SQLite file, uses every resource once
//! (the first-use wait of S4, excluded), then drives it through the `/v1/`
//! API from this process, bounded in count and time:
//!
//! 1. **Waiters on one resource**: a client holds `one`; `--waiters`
//!    (1,000) requests then wait for it (wait 10 min, lifetime 1 min), and
//!    once the gateway lists them all the holder releases. Each waiter
//!    releases as soon as its `201` arrives. Reported: the gateway's RSS
//!    with every request waiting and its peak, the time until all were
//!    served, and whether they were served in the order the gateway listed
//!    them.
//! 2. **Spread**: 200 acquire + release per second (open loop, a new
//!    request every 5 ms whatever the answers do) over 100 resources,
//!    for 10 s (`--quick`: 5 s). Reported: acquire and release latency
//!    (p50, p99), the gateway's CPU.
//! 3. **Hammer**: 50 clients in a loop on one resource (acquire, release
//!    at once) for 10 s (`--quick`: 5 s). Reported: grants per second,
//!    acquire latency, and the spread of grants over the clients.
//!
//! Every phase checks what a lock promises, from the answers alone: every
//! request was answered `201` (none lost), no two clients held one
//! resource at once (a client counts as holding from its `201` until it
//! sends its `DELETE`; the next grant needs that release), and the fencing
//! tokens of a resource increase from grant to grant. A violation fails
//! the run (exit 1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio_rustls::rustls;

use putex_testkit::bench::lock::{preamble, print_summary};
use putex_testkit::bench::{ms_f, verdict, write_json, Summary, Table};
use putex_testkit::nats_server::NatsServer;
use putex_testkit::procfs::{clock_ticks, cpu_ticks, peak_rss_kb, rss_kb};

/// The lifetime every request asks for: longer than any phase, so that no
/// lock ends by expiring (every client releases).
const LIFETIME_S: f64 = 60.0;
/// Resources of the spread phase.
const SPREAD_RESOURCES: usize = 100;
/// Requests per second of the spread phase.
const SPREAD_RATE: u64 = 200;
/// Clients of the hammer phase.
const HAMMER_CLIENTS: usize = 50;
/// The most a single request may take before the bench calls it lost.
const REQUEST_LIMIT: Duration = Duration::from_secs(120);

/// Which stores to run on.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Stores {
    Nats,
    Sqlite,
    Both,
}

/// The lock gateway (`putex serve`) under load: waiters on one resource,
/// acquire + release spread over 100 resources, 50 clients on one.
#[derive(Parser)]
#[command(name = "gateway_load")]
struct Args {
    /// A shorter run: 5 s phases instead of 10 s
    #[arg(long)]
    quick: bool,
    /// The stores to run on
    #[arg(long, value_enum, default_value_t = Stores::Both)]
    store: Stores,
    /// Requests waiting on one resource in phase 1
    #[arg(long, default_value_t = 1000)]
    waiters: usize,
    /// The putex binary [default: the release binary beside this example]
    #[arg(long, value_name = "PATH")]
    putex: Option<PathBuf>,
    /// Also write the figures as JSON to FILE (for scripts/bench)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let stores: &[&str] = match args.store {
        Stores::Both => &["nats", "sqlite"],
        Stores::Nats => &["nats"],
        Stores::Sqlite => &["sqlite"],
    };
    let putex = args.putex.clone().unwrap_or_else(|| {
        putex_testkit::bench::putex_beside_me().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        })
    });
    // A thousand requests in flight are a thousand sockets.
    putex::cli::serve::raise_open_files();
    let started = Instant::now();
    let machine = preamble("a fresh single-node server per store");
    let phase = Duration::from_secs(if args.quick { 5 } else { 10 });
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut table = Table::default();
    let mut figures = serde_json::Map::new();
    let mut failed = false;
    for &store in stores {
        let dir = tempfile::tempdir().expect("temp dir");
        let nats = (store == "nats").then(NatsServer::start);
        let url = match &nats {
            Some(n) => n.url.clone(),
            None => format!("sqlite://{}", dir.path().join("gateway.db").display()),
        };
        let gateway = Gateway::start(&putex, &url, dir.path());
        println!(
            "\n== {store}: putex serve at {} (pid {}) ==",
            gateway.base, gateway.pid
        );
        let run = rt.block_on(run_store(&gateway, args.waiters, phase));
        match run {
            Ok(f) => {
                f.rows(store, args.waiters, &mut table);
                failed |= !f.violations.is_empty();
                figures.insert(store.to_owned(), f.json(args.waiters));
            }
            Err(e) => {
                println!("{store}: FAILED: {e}");
                println!("the gateway's log:\n{}", gateway.log_tail());
                failed = true;
            }
        }
        drop(gateway);
        drop(nats);
    }
    println!();
    print_summary(&machine, started, &table);
    if let Some(path) = &args.json {
        write_json(path, &Value::Object(figures));
    }
    if failed {
        eprintln!("gateway_load: FAILED (see above)");
        std::process::exit(1);
    }
}

/// One `putex serve` process, killed on drop.
struct Gateway {
    child: Child,
    pid: i32,
    base: String,
    log: PathBuf,
}

impl Gateway {
    fn start(putex: &Path, store: &str, dir: &Path) -> Gateway {
        let log = dir.join("serve.log");
        let child = Command::new(putex)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--node",
                "gw-bench",
                "--store",
                store,
            ])
            .arg("--max-wait")
            .arg("1h")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .envs(std::env::var_os("MALLOC_ARENA_MAX").map(|v| ("MALLOC_ARENA_MAX", v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| {
                eprintln!("cannot start {} serve: {e}", putex.display());
                std::process::exit(1)
            });
        let pid = child.id() as i32;
        let mut gw = Gateway {
            child,
            pid,
            base: String::new(),
            log,
        };
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let text = std::fs::read_to_string(&gw.log).unwrap_or_default();
            if let Some(addr) = text
                .split("listen=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
            {
                gw.base = format!("http://{addr}");
                return gw;
            }
            if let Ok(Some(status)) = gw.child.try_wait() {
                eprintln!("putex serve exited ({status}) before listening:\n{text}");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("putex serve did not listen within 30 s:\n{}", gw.log_tail());
        std::process::exit(1);
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// CPU seconds the gateway has used so far.
    fn cpu_s(&self) -> f64 {
        cpu_ticks(self.pid) as f64 / clock_ticks() as f64
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `201` as a client saw it: when, its fencing token, the lock's uid.
type GrantSeen = (Instant, (u64, u64), String);

/// What every phase checks: grants per resource, in the order they
/// arrived, and how many clients held a resource at once.
#[derive(Default)]
struct Ledger {
    inside: Mutex<HashMap<String, Arc<AtomicI64>>>,
    grants: Mutex<HashMap<String, Vec<GrantSeen>>>,
    overlaps: AtomicUsize,
}

impl Ledger {
    /// A client's `201` for `resource`: it holds the resource from now.
    fn granted(&self, resource: &str, token: (u64, u64), uid: &str) {
        let inside = self
            .inside
            .lock()
            .entry(resource.to_owned())
            .or_default()
            .clone();
        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.grants
            .lock()
            .entry(resource.to_owned())
            .or_default()
            .push((Instant::now(), token, uid.to_owned()));
    }

    /// The client is about to send its `DELETE`: it no longer counts on
    /// the lock.
    fn releasing(&self, resource: &str) {
        if let Some(inside) = self.inside.lock().get(resource) {
            inside.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The violations found: overlaps, and tokens that did not increase
    /// from one grant of a resource to the next.
    fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let overlaps = self.overlaps.load(Ordering::SeqCst);
        if overlaps > 0 {
            out.push(format!(
                "{overlaps} grant(s) while another client held the resource"
            ));
        }
        for (resource, grants) in self.grants.lock().iter_mut() {
            grants.sort_by_key(|g| g.0);
            for w in grants.windows(2) {
                if w[1].1 <= w[0].1 {
                    out.push(format!(
                        "{resource}: token {:?} after {:?} (uids {} then {})",
                        w[1].1, w[0].1, w[0].2, w[1].2
                    ));
                }
            }
        }
        out
    }

    /// The uids of `resource`'s grants in the order they arrived.
    fn order(&self, resource: &str) -> Vec<String> {
        let mut g = self
            .grants
            .lock()
            .get(resource)
            .cloned()
            .unwrap_or_default();
        g.sort_by_key(|g| g.0);
        g.into_iter().map(|g| g.2).collect()
    }

    fn count(&self) -> usize {
        self.grants.lock().values().map(Vec::len).sum()
    }

    fn per_resource(&self) -> HashMap<String, Vec<Instant>> {
        self.grants
            .lock()
            .iter()
            .map(|(r, g)| {
                let mut t: Vec<Instant> = g.iter().map(|g| g.0).collect();
                t.sort();
                (r.clone(), t)
            })
            .collect()
    }
}

/// One store's figures.
struct Figures {
    waiters_rss_kb: u64,
    waiters_served: usize,
    waiters_time: Duration,
    waiters_in_order: bool,
    waiters_out_of_place: usize,
    waiters_handoff: Summary,
    waiters_cpu_pct: f64,
    spread_requests: usize,
    spread_acquire: Summary,
    spread_release: Summary,
    spread_cpu_pct: f64,
    hammer_grants: usize,
    hammer_secs: f64,
    hammer_acquire: Summary,
    hammer_min: usize,
    hammer_max: usize,
    hammer_cpu_pct: f64,
    peak_rss_kb: u64,
    errors: Vec<String>,
    violations: Vec<String>,
}

impl Figures {
    fn rows(&self, store: &str, waiters: usize, table: &mut Table) {
        let mb = |kb: u64| kb as f64 / 1024.0;
        table.push(
            &format!("{waiters} waiters on one resource: served"),
            store,
            format!(
                "{}/{waiters} in {:.1} s ({:.0}/s), hand-off {}",
                self.waiters_served,
                self.waiters_time.as_secs_f64(),
                self.waiters_served as f64 / self.waiters_time.as_secs_f64().max(1e-9),
                self.waiters_handoff.med_p99()
            ),
            format!(
                "in the listed order: {} ({} out of place); gateway CPU {:.0} %",
                verdict(self.waiters_in_order),
                self.waiters_out_of_place,
                self.waiters_cpu_pct
            ),
        );
        table.push(
            &format!("{waiters} waiters on one resource: gateway RSS"),
            store,
            format!(
                "{:.1} MB all waiting; peak {:.1} MB",
                mb(self.waiters_rss_kb),
                mb(self.peak_rss_kb)
            ),
            format!(
                "target ≤ 100 MB: {}",
                verdict(self.peak_rss_kb <= 100 * 1024)
            ),
        );
        let spread_ok = self.spread_acquire.p99 <= Duration::from_millis(20);
        table.push(
            &format!("{SPREAD_RATE} acquire + release/s over {SPREAD_RESOURCES} resources"),
            store,
            format!(
                "acquire {}, release {}",
                self.spread_acquire.med_p99(),
                self.spread_release.med_p99()
            ),
            format!(
                "{} requests; gateway CPU {:.0} %{}",
                self.spread_requests,
                self.spread_cpu_pct,
                if store == "nats" {
                    format!("; target p99 ≤ 20 ms: {}", verdict(spread_ok))
                } else {
                    String::new()
                }
            ),
        );
        table.push(
            &format!("{HAMMER_CLIENTS} clients on one resource"),
            store,
            format!(
                "{:.0} grants/s, acquire {}",
                self.hammer_grants as f64 / self.hammer_secs,
                self.hammer_acquire.med_p99()
            ),
            format!(
                "grants per client {}–{}; gateway CPU {:.0} %",
                self.hammer_min, self.hammer_max, self.hammer_cpu_pct
            ),
        );
        let lost = self.errors.len();
        table.push(
            "requests lost or refused; double grants",
            store,
            format!(
                "{lost} lost or refused; {} violation(s)",
                self.violations.len()
            ),
            verdict(lost == 0 && self.violations.is_empty()).to_owned(),
        );
    }

    fn json(&self, waiters: usize) -> Value {
        json!({
            "waiters": waiters,
            "waiters_rss_mb": self.waiters_rss_kb as f64 / 1024.0,
            "peak_rss_mb": self.peak_rss_kb as f64 / 1024.0,
            "waiters_served": self.waiters_served,
            "waiters_s": self.waiters_time.as_secs_f64(),
            "waiters_in_order": self.waiters_in_order,
            "waiters_handoff_p50_ms": ms_f(self.waiters_handoff.median),
            "waiters_handoff_p99_ms": ms_f(self.waiters_handoff.p99),
            "waiters_cpu_pct": self.waiters_cpu_pct,
            "spread_requests": self.spread_requests,
            "spread_acquire_p50_ms": ms_f(self.spread_acquire.median),
            "spread_acquire_p99_ms": ms_f(self.spread_acquire.p99),
            "spread_release_p50_ms": ms_f(self.spread_release.median),
            "spread_release_p99_ms": ms_f(self.spread_release.p99),
            "spread_cpu_pct": self.spread_cpu_pct,
            "hammer_grants_per_s": self.hammer_grants as f64 / self.hammer_secs,
            "hammer_acquire_p50_ms": ms_f(self.hammer_acquire.median),
            "hammer_acquire_p99_ms": ms_f(self.hammer_acquire.p99),
            "hammer_min": self.hammer_min,
            "hammer_max": self.hammer_max,
            "hammer_cpu_pct": self.hammer_cpu_pct,
            "lost": self.errors.len(),
            "violations": self.violations.len(),
        })
    }
}

/// A client of the gateway's `/v1/` API.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
}

/// A granted lock, as the `201` said it.
struct Granted {
    uid: String,
    token: (u64, u64),
}

impl Client {
    async fn acquire(&self, resource: &str, wait: f64) -> Result<Granted, String> {
        let r = self
            .http
            .post(format!("{}/v1/locks/{resource}", self.base))
            .body(json!({"title": "load", "wait": wait, "lifetime": LIFETIME_S}).to_string())
            .timeout(REQUEST_LIMIT)
            .send()
            .await
            .map_err(|e| format!("POST {resource}: {e}"))?;
        let status = r.status();
        let body = r
            .text()
            .await
            .map_err(|e| format!("POST {resource}: {e}"))?;
        if status != reqwest::StatusCode::CREATED {
            return Err(format!("POST {resource}: {status} {body}"));
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("POST {resource}: {e}"))?;
        let token = v["fencing_token"]
            .as_str()
            .and_then(|t| t.split_once(':'))
            .and_then(|(e, r)| Some((e.parse().ok()?, r.parse().ok()?)))
            .ok_or_else(|| format!("POST {resource}: no fencing token in {body}"))?;
        Ok(Granted {
            uid: v["uid"].as_str().unwrap_or_default().to_owned(),
            token,
        })
    }

    async fn release(&self, resource: &str, uid: &str) -> Result<(), String> {
        let r = self
            .http
            .delete(format!("{}/v1/locks/{resource}/{uid}", self.base))
            .timeout(REQUEST_LIMIT)
            .send()
            .await
            .map_err(|e| format!("DELETE {resource}: {e}"))?;
        if r.status() != reqwest::StatusCode::NO_CONTENT {
            return Err(format!("DELETE {resource}/{uid}: {}", r.status()));
        }
        Ok(())
    }

    /// The uids of `resource`'s waiting requests, in line.
    async fn waiting(&self, resource: &str) -> Result<Vec<String>, String> {
        let v: Value = self
            .http
            .get(format!("{}/v1/locks/{resource}", self.base))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        Ok(v["locks"]
            .as_array()
            .map(|locks| {
                locks
                    .iter()
                    .filter(|l| l["active"] == false)
                    .filter_map(|l| l["uid"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Acquire, note, release: one client's turn.
    async fn turn(
        &self,
        ledger: &Ledger,
        resource: &str,
        wait: f64,
    ) -> Result<(Duration, Duration), String> {
        let t = Instant::now();
        let g = self.acquire(resource, wait).await?;
        let acquired = t.elapsed();
        ledger.granted(resource, g.token, &g.uid);
        ledger.releasing(resource);
        let t = Instant::now();
        self.release(resource, &g.uid).await?;
        Ok((acquired, t.elapsed()))
    }
}

/// reqwest wants a TLS configuration even for plain HTTP (it is built
/// without a crypto provider of its own): ring's, as the server's.
fn plain_http_tls() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

async fn run_store(gw: &Gateway, waiters: usize, phase: Duration) -> Result<Figures, String> {
    let client = Client {
        http: reqwest::Client::builder()
            .tls_backend_preconfigured(plain_http_tls())
            .pool_max_idle_per_host(usize::MAX)
            .build()
            .map_err(|e| e.to_string())?,
        base: gw.base.clone(),
    };
    let ledger = Arc::new(Ledger::default());
    let mut errors: Vec<String> = Vec::new();

    // First use of every name (S4's wait), all at once, untimed.
    let t = Instant::now();
    let names: Vec<String> = ["one".to_owned(), "hammer".to_owned()]
        .into_iter()
        .chain((0..SPREAD_RESOURCES).map(|i| format!("r{i}")))
        .collect();
    let warm = futures::future::join_all(names.iter().map(|n| {
        let c = client.clone();
        async move {
            let g = c.acquire(n, 60.0).await?;
            c.release(n, &g.uid).await
        }
    }))
    .await;
    for r in warm {
        r?;
    }
    println!(
        "first use of {} resources (excluded): {:.2} s",
        names.len(),
        t.elapsed().as_secs_f64()
    );

    // 1. Waiters on one resource.
    let holder = client.acquire("one", 10.0).await?;
    let t_join = Instant::now();
    let mut tasks = Vec::with_capacity(waiters);
    for _ in 0..waiters {
        let c = client.clone();
        let l = ledger.clone();
        tasks.push(tokio::spawn(async move { c.turn(&l, "one", 600.0).await }));
    }
    let listed = loop {
        let w = client.waiting("one").await?;
        if w.len() >= waiters {
            break w;
        }
        if t_join.elapsed() > REQUEST_LIMIT {
            return Err(format!(
                "only {} of {waiters} waiters listed after {REQUEST_LIMIT:?}",
                w.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "{waiters} requests waiting after {:.2} s",
        t_join.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiters_rss_kb = rss_kb(gw.pid);
    let cpu0 = gw.cpu_s();
    let t0 = Instant::now();
    client.release("one", &holder.uid).await?;
    for r in futures::future::join_all(tasks).await {
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let waiters_time = t0.elapsed();
    let waiters_cpu_pct = (gw.cpu_s() - cpu0) / waiters_time.as_secs_f64() * 100.0;
    let order = ledger.order("one");
    let out_of_place = order.iter().zip(&listed).filter(|(a, b)| a != b).count()
        + listed.len().abs_diff(order.len());
    let times = ledger.per_resource().remove("one").unwrap_or_default();
    let handoffs: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "served {} in {:.2} s; out of place {out_of_place}",
        order.len(),
        waiters_time.as_secs_f64()
    );

    // 2. Spread: an open loop of acquire + release over many resources.
    let cpu0 = gw.cpu_s();
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / SPREAD_RATE));
    let mut tasks = Vec::new();
    let mut i = 0usize;
    while t0.elapsed() < phase {
        tick.tick().await;
        let c = client.clone();
        let l = ledger.clone();
        let resource = format!("r{}", i % SPREAD_RESOURCES);
        i += 1;
        tasks.push(tokio::spawn(
            async move { c.turn(&l, &resource, 10.0).await },
        ));
    }
    let mut acquire = Vec::new();
    let mut release = Vec::new();
    for r in futures::future::join_all(tasks).await {
        match r {
            Ok(Ok((a, r))) => {
                acquire.push(a);
                release.push(r);
            }
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let spread_secs = t0.elapsed().as_secs_f64();
    let spread_cpu_pct = (gw.cpu_s() - cpu0) / spread_secs * 100.0;
    let spread_requests = i;
    if acquire.is_empty() {
        return Err(format!(
            "spread: no request was granted ({} errors, first: {:?})",
            errors.len(),
            errors.first()
        ));
    }
    println!("spread: {i} requests in {spread_secs:.2} s");

    // 3. Hammer: many clients in a loop on one resource.
    let cpu0 = gw.cpu_s();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..HAMMER_CLIENTS {
        let c = client.clone();
        let l = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut errors = Vec::new();
            while t0.elapsed() < phase {
                match c.turn(&l, "hammer", 60.0).await {
                    Ok((a, _)) => times.push(a),
                    Err(e) => errors.push(e),
                }
            }
            (times, errors)
        }));
    }
    let mut hammer = Vec::new();
    let mut per_client = Vec::new();
    for r in futures::future::join_all(tasks).await {
        match r {
            Ok((times, errs)) => {
                per_client.push(times.len());
                hammer.extend(times);
                errors.extend(errs);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let hammer_secs = t0.elapsed().as_secs_f64();
    let hammer_cpu_pct = (gw.cpu_s() - cpu0) / hammer_secs * 100.0;
    if hammer.is_empty() {
        return Err(format!(
            "hammer: no request was granted ({} errors, first: {:?})",
            errors.len(),
            errors.first()
        ));
    }
    println!("hammer: {} grants in {hammer_secs:.2} s", hammer.len());

    let violations = ledger.violations();
    for v in violations.iter().take(20) {
        println!("VIOLATION: {v}");
    }
    for e in errors.iter().take(20) {
        println!("lost or refused: {e}");
    }
    println!("grants checked: {}", ledger.count());
    Ok(Figures {
        waiters_rss_kb,
        waiters_served: order.len(),
        waiters_time,
        waiters_in_order: out_of_place == 0,
        waiters_out_of_place: out_of_place,
        waiters_handoff: Summary::of(if handoffs.is_empty() {
            &[Duration::ZERO]
        } else {
            &handoffs
        }),
        waiters_cpu_pct,
        spread_requests,
        spread_acquire: Summary::of(&acquire),
        spread_release: Summary::of(&release),
        spread_cpu_pct,
        hammer_grants: hammer.len(),
        hammer_secs,
        hammer_acquire: Summary::of(&hammer),
        hammer_min: per_client.iter().copied().min().unwrap_or(0),
        hammer_max: per_client.iter().copied().max().unwrap_or(0),
        hammer_cpu_pct,
        peak_rss_kb: peak_rss_kb(gw.pid),
        errors,
        violations,
    })
}
