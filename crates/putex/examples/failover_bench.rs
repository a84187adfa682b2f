//! Failover benchmark of `putex run`: crash failovers, clean handovers, and
//! what an idle agent costs. Not a test: it prints figures for
//! `docs/performance.md`.
//!
//! ```text
//! cargo run --release -p putex --example failover_bench -- [--runs N] [--putex PATH]
//!     [--store nats|sqlite|etcd] [--json FILE]
//! ```
//!
//! It starts a single-node nats-server on a loopback port (the binary is
//! `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`, else `nats-server` on
//! `PATH`; `scripts/install-nats-server` installs it) — or, with `--store
//! sqlite`, gives every agent the same embedded SQLite file in a temporary
//! directory, or with `--store etcd` a single etcd member (`$PUTEX_ETCD`,
//! else `.tools/bin/etcd`; `scripts/install-etcd`), whose bound B is longer
//! by the store clock's steps — and three agents with
//! the fast profile (R = 100 ms, F = 3, C = 1) in hook mode. The hooks
//! append `start NODE NS TOKEN` and `stop NODE NS KIND` lines (wall-clock
//! nanoseconds from `date +%s%N`) to a file:
//!
//! 1. **crash failover**, N times: SIGKILL of the active agent and its
//!    keeper (a host crash) → the next `start` line; compared with the bound
//!    B that `putex check` prints for the same flags;
//! 2. **clean handover**, N times: SIGTERM of the active agent → its
//!    `graceful` stop line → the next `start` line;
//! 3. **switchover**, N times: `putex switchover bench --to NODE` (a new
//!    process, as an operator runs it) → the target's `start` line;
//!    Patroni, measured on this kind of machine, needs 2.9 s;
//! 4. **idle cost**: two agents at R = 1 s (one active, one standby) for 10 s:
//!    VmRSS and CPU time (utime + stime) of each agent process and keeper
//!    from `/proc`, hook processes excluded.
//!
//! The `putex` binary is the one built beside this example (it is built if
//! missing or older than the example), or `--putex PATH`. `--json FILE`
//! also writes the figures as JSON (for `scripts/bench`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use putex_testkit::agent::{events, hooks, starts, wall_ns, Agent, AgentSpec, Line};
use putex_testkit::bench::{verdict, FAST};
use putex_testkit::etcd_server::EtcdServer;
use putex_testkit::nats_server::NatsServer;
use putex_testkit::procfs::{cpu_ticks, num_cpus, rss_kb};

const IDLE: [&str; 6] = ["--renew", "1s", "--failures", "3", "--confirm", "1"];
const IDLE_WINDOW: Duration = Duration::from_secs(10);

/// Which store the agents share.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    /// A single-node nats-server on a loopback port.
    Nats,
    /// One embedded SQLite file for every agent.
    Sqlite,
    /// A single etcd member on a loopback port.
    Etcd,
}

#[derive(clap::Parser)]
#[command(
    name = "failover_bench",
    about = "Crash failovers, clean handovers and an idle agent's cost, for docs/performance.md"
)]
struct Args {
    /// How many crash failovers and how many clean handovers
    #[arg(long, default_value_t = 20, value_parser = putex_testkit::bench::at_least_one)]
    runs: usize,
    /// The putex binary [default: the one beside this example, built if missing]
    #[arg(long, value_name = "PATH")]
    putex: Option<PathBuf>,
    /// The store the agents share
    #[arg(long, value_enum, default_value_t = StoreKind::Nats)]
    store: StoreKind,
    /// Also write the figures as JSON to FILE (for scripts/bench)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn main() {
    let Args {
        runs,
        putex: putex_bin,
        store,
        json,
    } = clap::Parser::parse();
    let putex_bin = putex_bin.unwrap_or_else(find_putex);
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = (store == StoreKind::Nats).then(NatsServer::start);
    let etcd = (store == StoreKind::Etcd).then(EtcdServer::start);
    let url = match (&nats, &etcd) {
        (Some(n), _) => n.url.clone(),
        (_, Some(e)) => format!("etcd://{}", e.endpoint()),
        _ => format!("sqlite://{}", dir.path().join("store.db").display()),
    };
    let (store_label, store_name) = match store {
        StoreKind::Sqlite => ("embedded SQLite store (one file, every agent)", "sqlite"),
        StoreKind::Nats => ("single-node nats-server", "nats"),
        StoreKind::Etcd => ("single-member etcd", "etcd"),
    };
    println!("putex: {}", putex_bin.display());
    match &nats {
        Some(n) => println!(
            "nats-server: {} ({})",
            putex_testkit::nats_server::nats_server_binary().display(),
            n.url
        ),
        None => println!("store: {url}"),
    }
    println!(
        "host: {} CPU(s), load average {}\n",
        num_cpus(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    // The bound B for these flags, with the store's measured round trip.
    let out = Command::new(&putex_bin)
        .args(["check", "--store", &url])
        .args(FAST)
        .output()
        .expect("putex check");
    let check = String::from_utf8_lossy(&out.stdout).to_string();
    print!("putex check {}:\n{check}\n", FAST.join(" "));
    let bound = putex_testkit::check::worst_case_bound(&check).unwrap_or_else(|| {
        eprintln!(
            "cannot read B from putex check:\n{check}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::process::exit(1)
    });

    let mut bench = Bench {
        putex: putex_bin.clone(),
        dir: dir.path().to_path_buf(),
        url: url.clone(),
        events: dir.path().join("events"),
        agents: Vec::new(),
    };
    for n in ["n1", "n2", "n3"] {
        bench.start(n);
    }
    bench.wait_starts(1, Duration::from_secs(10));

    // 1. Crash failovers.
    let mut failovers = Vec::new();
    for i in 0..runs {
        let active = bench.steady();
        let before = bench.starts().len();
        let killed = bench.crash(&active);
        let next = bench.wait_starts(before + 1, Duration::from_secs(5));
        let took = ns_between(killed, next.ns);
        println!(
            "crash {:>2}: {active} killed → {} active after {took:?}",
            i + 1,
            next.node
        );
        failovers.push(took);
        bench.start(&active);
    }

    // 2. Clean handovers.
    let mut handovers = Vec::new();
    let mut totals = Vec::new();
    for i in 0..runs {
        let active = bench.steady();
        let before = bench.starts().len();
        let termed = wall_ns();
        bench.agent(&active).sigterm();
        let next = bench.wait_starts(before + 1, Duration::from_secs(5));
        let stop = bench
            .events()
            .into_iter()
            .find(|l| {
                l.what == "stop" && l.node == active && l.extra == "graceful" && l.ns >= termed
            })
            .expect("a graceful stop line");
        let gap = ns_between(stop.ns, next.ns);
        let total = ns_between(termed, next.ns);
        println!(
            "handover {:>2}: SIGTERM {active} → graceful stop +{:?} → {} active +{gap:?} (total {total:?})",
            i + 1,
            ns_between(termed, stop.ns),
            next.node
        );
        handovers.push(gap);
        totals.push(total);
        bench.agent(&active).wait_exit(Duration::from_secs(5));
        bench.start(&active);
    }
    // 3. Switchovers: the command (a new process) → the target's activate
    // hook, to each other node in turn.
    let mut switchovers = Vec::new();
    for i in 0..runs {
        let active = bench.steady();
        // Every member has reported since the last change (3 R).
        std::thread::sleep(Duration::from_millis(400));
        let target = ["n1", "n2", "n3"]
            .into_iter()
            .find(|n| *n != active && (i % 2 == 0 || *n != "n1"))
            .expect("another node");
        let before = bench.starts().len();
        let asked = wall_ns();
        let out = Command::new(&putex_bin)
            .args(["switchover", "bench", "--to", target, "--store", &url])
            .output()
            .expect("putex switchover");
        if !out.status.success() {
            eprintln!(
                "switchover to {target} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::process::exit(1);
        }
        let next = bench.wait_starts(before + 1, Duration::from_secs(5));
        assert_eq!(next.node, target, "the switchover went elsewhere");
        let took = ns_between(asked, next.ns);
        let stopped = events(&bench.events)
            .into_iter()
            .find(|l| l.what == "stop" && l.node == active && l.ns >= asked)
            .map(|l| format!(" (its deactivate hook at {:?})", ns_between(asked, l.ns)))
            .unwrap_or_default();
        println!(
            "switchover {:>2}: {active} → {target} active {took:?} after the command started{stopped}",
            i + 1
        );
        switchovers.push(took);
    }
    bench.stop_all();

    // 4. Idle cost at R = 1 s.
    let idle = idle_cost(&putex_bin, &url, dir.path());

    // Summary.
    failovers.sort();
    handovers.sort();
    totals.sort();
    switchovers.sort();
    let med = |v: &[Duration]| v[v.len() / 2];
    let max = |v: &[Duration]| *v.last().expect("runs");
    println!("\n== summary ({runs} runs each; R = 100 ms, F = 3, C = 1, {store_label}) ==");
    println!(
        "crash failover (kill → next activate): median {:?}, max {:?}; B = {bound:?}: median {:.0}% of B, max {:.0}% of B; target max ≤ B + 100 ms = {:?}: {}",
        med(&failovers),
        max(&failovers),
        pct(med(&failovers), bound),
        pct(max(&failovers), bound),
        bound + Duration::from_millis(100),
        verdict(max(&failovers) <= bound + Duration::from_millis(100))
    );
    println!(
        "clean handover (graceful stop → next activate): median {:?}, max {:?}; target median < 20 ms: {}",
        med(&handovers),
        max(&handovers),
        verdict(med(&handovers) < Duration::from_millis(20))
    );
    println!(
        "clean handover (SIGTERM → next activate, stop included): median {:?}, max {:?}",
        med(&totals),
        max(&totals)
    );
    println!(
        "switchover (`putex switchover --to` started → target's activate hook): median {:?}, max {:?}; target median ≤ 20 ms: {}; Patroni: 2.9 s",
        med(&switchovers),
        max(&switchovers),
        verdict(med(&switchovers) <= Duration::from_millis(20))
    );
    for p in &idle {
        println!(
            "idle {} at R = 1 s: VmRSS {:.1} MB (peak), CPU {:.2}% of a core over {IDLE_WINDOW:?} (utime+stime; {:.3}% by schedstat){}",
            p.what,
            p.rss_kb as f64 / 1024.0,
            p.cpu_percent,
            p.sched_percent,
            if p.what.contains("agent") {
                format!(
                    "; target < 15 MB and < 1%: {}",
                    verdict(
                        p.rss_kb < 15 * 1024 && p.cpu_percent < 1.0 && p.sched_percent < 1.0
                    )
                )
            } else {
                String::new()
            }
        );
    }

    if let Some(path) = json {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let all = |v: &[Duration]| v.iter().map(|d| ms(*d)).collect::<Vec<_>>();
        let figures = serde_json::json!({
            "bench": "failover",
            "store": store_name,
            "runs": runs,
            "profile": FAST.join(" "),
            "bound_ms": ms(bound),
            "crash_ms": all(&failovers),
            "crash_median_ms": ms(med(&failovers)),
            "crash_max_ms": ms(max(&failovers)),
            "handover_gap_ms": all(&handovers),
            "handover_gap_median_ms": ms(med(&handovers)),
            "handover_gap_max_ms": ms(max(&handovers)),
            "handover_total_median_ms": ms(med(&totals)),
            "handover_total_max_ms": ms(max(&totals)),
            "switchover_ms": all(&switchovers),
            "switchover_median_ms": ms(med(&switchovers)),
            "switchover_max_ms": ms(max(&switchovers)),
            "idle_profile": IDLE.join(" "),
            "idle_window_s": IDLE_WINDOW.as_secs_f64(),
            "idle": idle
                .iter()
                .map(|p| serde_json::json!({
                    "what": p.what,
                    "rss_kb": p.rss_kb,
                    "cpu_percent": p.cpu_percent,
                    "sched_percent": p.sched_percent,
                }))
                .collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&figures).expect("json");
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

fn pct(d: Duration, of: Duration) -> f64 {
    d.as_secs_f64() / of.as_secs_f64() * 100.0
}

fn ns_between(a: u128, b: u128) -> Duration {
    Duration::from_nanos(u64::try_from(b.saturating_sub(a)).unwrap_or(u64::MAX))
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

// ---------------------------------------------------------------------------
// Agents.

/// Starts `putex run` for `lock` as `node`, with `timing`, its keeper
/// directory and log in `dir`, and hooks that write to `events`.
fn spawn_agent(
    putex: &Path,
    url: &str,
    lock: &str,
    node: &str,
    timing: &[&str],
    dir: &Path,
    events: &Path,
) -> Agent {
    let spec = AgentSpec::new(putex, url, lock, node, dir)
        .keeper_dir(&dir.join(format!("keeper-{lock}-{node}")))
        .args(timing)
        .args(&["--healthcheck", "true"])
        .args(&hooks(events));
    Agent::spawn(spec).expect("start putex run")
}

struct Bench {
    putex: PathBuf,
    dir: PathBuf,
    url: String,
    events: PathBuf,
    agents: Vec<Agent>,
}

impl Bench {
    /// Starts (or restarts) `node`'s agent with its keeper dir.
    fn start(&mut self, node: &str) {
        self.agents.retain(|a| a.node() != node);
        let a = spawn_agent(
            &self.putex,
            &self.url,
            "bench",
            node,
            &FAST,
            &self.dir,
            &self.events,
        );
        self.agents.push(a);
    }

    fn agent(&mut self, node: &str) -> &mut Agent {
        self.agents
            .iter_mut()
            .find(|a| a.node() == node)
            .expect("agent")
    }

    fn events(&self) -> Vec<Line> {
        events(&self.events)
    }

    fn starts(&self) -> Vec<Line> {
        starts(&self.events)
    }

    /// Waits for the `n`-th start line and returns it.
    fn wait_starts(&self, n: usize, within: Duration) -> Line {
        let until = Instant::now() + within;
        loop {
            let mut s = self.starts();
            if s.len() >= n {
                return s.swap_remove(n - 1);
            }
            if Instant::now() > until {
                for a in &self.agents {
                    eprintln!("--- {}:\n{}", a.node(), a.log_text());
                }
                panic!("no activation #{n} within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until every agent is up (active or standby) and a few
    /// renewals have been seen; returns the active node.
    fn steady(&self) -> String {
        let until = Instant::now() + Duration::from_secs(10);
        while !self
            .agents
            .iter()
            .all(|a| a.log_text().contains("-> standby"))
        {
            if Instant::now() > until {
                for a in &self.agents {
                    eprintln!("--- {}:\n{}", a.node(), a.log_text());
                }
                panic!("agents did not come up");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(500));
        self.starts().last().expect("an active node").node.clone()
    }

    /// A host crash: SIGKILL of the agent and its keeper at once. Returns
    /// the wall-clock time of the kill.
    fn crash(&mut self, node: &str) -> u128 {
        self.agent(node).crash()
    }

    fn stop_all(&mut self) {
        for a in &self.agents {
            a.sigterm();
        }
        for a in &mut self.agents {
            a.wait_exit(Duration::from_secs(5));
        }
        self.agents.clear();
    }
}

// ---------------------------------------------------------------------------
// Idle cost.

struct Cost {
    what: String,
    rss_kb: u64,
    /// From utime + stime (clock ticks).
    cpu_percent: f64,
    /// From the threads' schedstat (nanoseconds).
    sched_percent: f64,
}

/// On-CPU time of every live thread of `pid`, in nanoseconds
/// (`/proc/PID/task/*/schedstat`, precise where utime + stime count ticks).
fn cpu_ns(pid: i32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

fn idle_cost(putex: &Path, url: &str, dir: &Path) -> Vec<Cost> {
    let events = dir.join("idle-events");
    let mut agents: Vec<Agent> = ["i1", "i2"]
        .iter()
        .map(|n| spawn_agent(putex, url, "idle", n, &IDLE, dir, &events))
        .collect();
    // First use of the name waits W + G' ≈ 4.1 s; then settle.
    let until = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(&events)
        .unwrap_or_default()
        .contains("start ")
    {
        assert!(Instant::now() < until, "no idle activation");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let active = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("start "))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    let mut procs: Vec<(String, i32)> = Vec::new();
    for a in &agents {
        let role = if a.node() == active {
            "active"
        } else {
            "standby"
        };
        procs.push((format!("{role} agent"), a.pid()));
        for k in a.keepers() {
            procs.push((format!("{role} keeper"), k));
        }
    }
    // Clock ticks per second of /proc/PID/stat (USER_HZ, 100 on Linux).
    let tck: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100);
    let before: Vec<u64> = procs.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    let before_ns: Vec<u64> = procs.iter().map(|(_, p)| cpu_ns(*p)).collect();
    let t0 = Instant::now();
    let mut peak = vec![0u64; procs.len()];
    while t0.elapsed() < IDLE_WINDOW {
        for (i, (_, p)) in procs.iter().enumerate() {
            peak[i] = peak[i].max(rss_kb(*p));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let secs = t0.elapsed().as_secs_f64();
    let costs = procs
        .iter()
        .enumerate()
        .map(|(i, (what, p))| {
            let ticks = cpu_ticks(*p).saturating_sub(before[i]);
            let ns = cpu_ns(*p).saturating_sub(before_ns[i]);
            Cost {
                what: what.clone(),
                rss_kb: peak[i],
                cpu_percent: ticks as f64 / tck as f64 / secs * 100.0,
                sched_percent: ns as f64 / 1e9 / secs * 100.0,
            }
        })
        .collect();
    for a in &agents {
        a.sigterm();
    }
    for a in &mut agents {
        a.wait_exit(Duration::from_secs(5));
    }
    costs
}
