//! The putex half of the side-by-side PostgreSQL HA benchmark
//! (`scripts/bench-postgres` runs it beside `scripts/bench-patroni` and
//! prints the table of `docs/postgresql.md`). Not a test: it prints figures.
//!
//! ```text
//! cargo run --release -p putex --example postgres_bench -- [--runs N]
//!     [--putex PATH] [--fast] [--synchronous] [--json FILE]
//! ```
//!
//! Three PostgreSQL servers (`putex_testkit::postgres`: `initdb`,
//! `pg_basebackup -R`, the settings the Patroni side uses too), a
//! single-node nats-server, one `putex run` per server with the recipe's
//! hooks (`packaging/postgresql/putex-pg`) at the timing `docs/postgresql.md`
//! recommends for a NATS cluster (R = 1 s, F = 5, C = 2; `--fast`: R = 500 ms,
//! F = 3, C = 1), `--max-lag 16MB` (`--synchronous`: the recipe's
//! synchronous mode, `SYNC=on`, and `--max-lag 0`), and a writer inserting sequence numbers
//! through a `target_session_attrs=read-write` string, 2 ms apart, recording
//! every acknowledged commit. `--runs` times each:
//!
//! - **crash failover as the writer sees it**: the primary's agent, keeper
//!   and postmaster (with its children) SIGKILLed together → the first
//!   acknowledged write on another server; the crashed node's agent is then
//!   started again and the run waits until it streams from the new primary
//!   (it rewinds first);
//! - **switchover write unavailability**: `putex switchover pg --to NODE` →
//!   the gap between the last acknowledgement on the old primary and the
//!   first on the new one;
//! - **acknowledged commits lost** after each event;
//! - **idle cost**, once, writer stopped: VmRSS and CPU of the primary's and
//!   a replica's agent over 10 s, alone and with the hooks it ran (`psql`
//!   twice per R: the health check and the position);
//! - **bootstrap**, first, `--runs` times: three agents started together
//!   on empty data directories configured as the guide says
//!   (`PgCluster::as_the_guide_says`, a store of its own each time) → one
//!   primary with two streaming replicas, and a first write acknowledged.
//!
//! `--json FILE` writes the keys `scripts/bench-patroni` writes:
//! `crash_failover_ms`, `switchover_unavailable_ms`, `lost`, `idle`,
//! `bootstrap_ms`.
//!
//! `--outage SECONDS` measures a store outage instead (issue 46's
//! comparison with Patroni's `failsafe_mode`): with the writer running on a
//! steady cluster, the store — the nats-server, or with `--etcd` a
//! single-member etcd, as Patroni's side has — is killed (SIGKILL) and
//! started again on its port and data SECONDS later; the figures are how long into the
//! outage the writes first failed, how long in all they were unavailable
//! (stretches of more than 250 ms without an acknowledgement), how long
//! after the store was back they were normal again, and the acknowledged
//! writes lost (JSON key `outage`, as `scripts/bench-patroni --outage`).
//! With `--failsafe` every agent runs with failsafe (`--http` on a port of
//! its own, a shared key, `--failsafe-max` a minute above the outage), as
//! Patroni's side runs with `failsafe_mode`; the lock is used once before
//! (a cluster in service has used it: a failsafe lock's first use on NATS
//! waits W over T + the cap).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use putex_testkit::agent::{wait_for, wall_ns, Agent};
use putex_testkit::etcd_server::EtcdServer;
use putex_testkit::nats_server::NatsServer;
use putex_testkit::postgres::{write_gap, write_outages, Ack, PgCluster, Writer};
use putex_testkit::procfs::{cpu_ticks, cpu_ticks_with_children, rss_kb};

#[derive(clap::Parser)]
#[command(
    name = "postgres_bench",
    about = "putex running three real PostgreSQL servers: crash failover, switchover, loss, idle cost"
)]
struct Args {
    /// Crash failovers and switchovers to measure, each.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The putex binary (default: the one built beside this example).
    #[arg(long)]
    putex: Option<PathBuf>,
    /// R = 500 ms, F = 3, C = 1 instead of R = 1 s, F = 5, C = 2.
    #[arg(long)]
    fast: bool,
    /// The recipe's synchronous mode (`SYNC=on`; `--max-lag 0`: only a
    /// replica holding every acknowledged commit is eligible).
    #[arg(long)]
    synchronous: bool,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of bootstraps, crashes and switchovers: kill the store for
    /// this many seconds under the writer and measure the writes.
    #[arg(long, value_name = "SECONDS")]
    outage: Option<u64>,
    /// With `--outage`: the store is a single-member etcd, not a
    /// nats-server.
    #[arg(long, requires = "outage")]
    etcd: bool,
    /// With `--outage`: every agent runs with `--failsafe`.
    #[arg(long, requires = "outage")]
    failsafe: bool,
}

/// The store the outage takes down.
enum OutageStore {
    Nats(NatsServer),
    Etcd(EtcdServer),
}

impl OutageStore {
    fn url(&self) -> String {
        match self {
            OutageStore::Nats(s) => s.url.clone(),
            OutageStore::Etcd(s) => format!("etcd://{}", s.endpoint()),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            OutageStore::Nats(_) => "nats-server (single node, SIGKILL)",
            OutageStore::Etcd(_) => "etcd (single member, SIGKILL)",
        }
    }

    fn kill(&mut self) {
        match self {
            OutageStore::Nats(s) => s.kill(),
            OutageStore::Etcd(s) => s.kill(),
        }
    }

    fn restart(&mut self) {
        match self {
            OutageStore::Nats(s) => s.restart(),
            OutageStore::Etcd(s) => s.restart(),
        }
    }
}

struct Bench {
    putex: PathBuf,
    url: String,
    pg: PgCluster,
    timing: Vec<&'static str>,
    max_lag: &'static str,
    agents: Vec<Option<Agent>>,
    /// Each node's `--failsafe` flags, when it runs with failsafe.
    failsafe: Vec<Vec<String>>,
}

impl Bench {
    fn start(&mut self, i: usize) {
        let spec = self
            .pg
            .agent_spec(&self.putex, &self.url, i)
            .args(&self.timing)
            .args(&["--max-lag", self.max_lag])
            .args(self.failsafe.get(i).map_or(&[][..], Vec::as_slice));
        self.agents[i] = None;
        self.agents[i] = Some(Agent::start(spec).expect("start putex run"));
    }

    fn primary(&self) -> Option<usize> {
        (0..3).find(|&i| self.pg.is_primary(i) == Some(true))
    }

    /// Waits for one primary with both replicas streaming from it.
    fn steady(&self) -> usize {
        let mut primary = None;
        let ok = wait_for(Duration::from_secs(60), || {
            primary = self.primary();
            primary.is_some_and(|p| self.pg.streaming_from(p).len() == 2)
        });
        if !ok {
            for a in self.agents.iter().flatten() {
                eprintln!("--- {}:\n{}", a.node(), a.log_text());
            }
            panic!("the cluster did not settle");
        }
        primary.unwrap()
    }

    fn lost(&self, on: usize, acks: &[Ack]) -> usize {
        self.pg.missing(on, acks).map_or(acks.len(), |m| m.len())
    }
}

/// Three agents started together on empty data directories (the guide's
/// bootstrap) → one primary with two streaming replicas and a first
/// acknowledged write: that time, in ms.
fn bootstrap(putex: &std::path::Path, timing: &[&str], max_lag: &str, sync: bool) -> f64 {
    // A store of its own: the cluster's record (putex-pg.pg.system) names
    // this cluster, not the next one.
    let server = NatsServer::start();
    let pg = PgCluster::as_the_guide_says(3, sync, putex);
    let started = Instant::now();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let spec = pg
                .agent_spec(putex, &server.url, i)
                .args(timing)
                .args(&["--max-lag", max_lag]);
            Agent::start(spec).expect("start putex run")
        })
        .collect();
    let primary = || (0..3).find(|&i| pg.is_primary(i) == Some(true));
    let up = wait_for(Duration::from_secs(120), || {
        primary().is_some_and(|p| pg.streaming_from(p).len() == 2)
    });
    if !up {
        for a in &agents {
            eprintln!("--- {}:\n{}", a.node(), a.log_text());
        }
        panic!("no primary with two streaming replicas from empty data directories");
    }
    let writer = Writer::start(pg.guide_conninfo());
    assert!(
        wait_for(Duration::from_secs(30), || !writer.acks().is_empty()),
        "no write on the bootstrapped primary"
    );
    let took = started.elapsed();
    writer.stop();
    drop(agents);
    ms(took)
}

/// The store killed for `outage` under the writer, then started again on
/// its port and data; once the cluster is steady again and has written for
/// 5 s more, what the writer saw (see the module docs).
fn store_outage(
    b: &mut Bench,
    server: &mut OutageStore,
    writer: Writer,
    outage: Duration,
) -> serde_json::Value {
    let p = b.steady();
    std::thread::sleep(Duration::from_secs(2));
    let down = wall_ns();
    server.kill();
    println!(
        "outage: {} killed; {} was the primary",
        server.name(),
        b.pg.nodes[p].name
    );
    std::thread::sleep(outage);
    server.restart();
    let up = wall_ns();
    println!(
        "outage: the store is back after {:.1} s",
        ms_between(down, up) / 1000.0
    );
    let to = b.steady();
    let settled = wall_ns();
    assert!(
        wait_for(Duration::from_secs(30), || writer
            .acks()
            .last()
            .is_some_and(|a| ms_between(settled, a.ns) > 5_000.0)),
        "no writes after the outage"
    );
    let acks = writer.stop();
    let before = acks
        .iter()
        .rposition(|a| a.ns < down)
        .expect("writes before the outage");
    let gaps = write_outages(&acks[before..], Duration::from_millis(250));
    // `+ 0.0`: an empty sum of floats is -0.0, printed "-0".
    let unavailable: f64 = gaps.iter().map(|&(a, z)| ms_between(a, z)).sum::<f64>() + 0.0;
    let first_failure = gaps.first().map(|&(a, _)| ms_between(down, a).max(0.0));
    let normal_after = gaps
        .last()
        .filter(|&&(_, z)| z > up)
        .map_or(0.0, |&(_, z)| ms_between(up, z));
    let lost = b.lost(to, &acks);
    // What the new primary's agent said of its takeover.
    if let Some(a) = &b.agents[to] {
        let log = a.log_text();
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("transition") || l.contains("waiting"))
            .collect();
        eprintln!("outage: {}'s last transitions:", b.pg.nodes[to].name);
        for line in &said[said.len().saturating_sub(6)..] {
            eprintln!("  {line}");
        }
    }
    let figures = serde_json::json!({
        "outage_s": outage.as_secs_f64(),
        "store": server.name(),
        "writes_failed_from_ms": first_failure,
        "unavailable_ms": (unavailable * 10.0).round() / 10.0,
        "normal_after_store_back_ms": (normal_after * 10.0).round() / 10.0,
        "primary_before": b.pg.nodes[p].name,
        "primary_after": b.pg.nodes[to].name,
        "lost": lost,
        "acknowledged": acks.len(),
    });
    println!("outage: {figures}");
    figures
}

/// Milliseconds from `a` to `z` (wall-clock ns; negative if `z` is earlier).
fn ms_between(a: u128, z: u128) -> f64 {
    (z as f64 - a as f64) / 1e6
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn main() {
    let args: Args = clap::Parser::parse();
    let putex = args.putex.clone().unwrap_or_else(|| {
        putex_testkit::bench::putex_beside_me().unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        })
    });
    let mut server = if args.etcd {
        OutageStore::Etcd(EtcdServer::start())
    } else {
        OutageStore::Nats(NatsServer::start())
    };
    let timing: Vec<&'static str> = if args.fast {
        vec!["--renew", "500ms", "--failures", "3", "--confirm", "1"]
    } else {
        vec!["--renew", "1s", "--failures", "5", "--confirm", "2"]
    };
    let mut timing = timing;
    timing.extend(["--healthcheck-timeout", "250ms"]);
    let max_lag = if args.synchronous { "0" } else { "16777216" };
    let mut bootstraps = Vec::new();
    let bootstrap_runs = if args.outage.is_some() { 0 } else { args.runs };
    for run in 1..=bootstrap_runs {
        let took = bootstrap(&putex, &timing, max_lag, args.synchronous);
        println!(
            "bootstrap {run}: three empty data directories → a primary with two streaming replicas and a first write in {took:.0} ms"
        );
        bootstraps.push(took);
    }
    let mut b = Bench {
        putex,
        url: server.url(),
        pg: PgCluster::create(3, args.synchronous),
        timing,
        max_lag,
        agents: vec![None, None, None],
        failsafe: Vec::new(),
    };
    if args.failsafe {
        let key = b.pg.put_file(
            "failsafe.key",
            "postgres_bench: the cluster's failsafe key, 32 bytes or more\n",
            0o600,
        );
        let cap = format!("{}s", args.outage.unwrap_or(0) + 60);
        b.failsafe = (0..3)
            .map(|_| {
                let http = format!("127.0.0.1:{}", putex_testkit::ports::free_port());
                ["--http", &http, "--failsafe", "--failsafe-key-file"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain([
                        key.display().to_string(),
                        "--failsafe-max".into(),
                        cap.clone(),
                    ])
                    .collect()
            })
            .collect();
        // The lock used once, as a cluster's in service has been: a
        // failsafe lock's first use on NATS waits W over T + the cap.
        let keepers = putex_testkit::agent::scratch_keeper_dir();
        putex_testkit::agent::use_lock_once(&b.putex, &b.url, "pg", "n1", keepers)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    b.start(0);
    assert!(
        wait_for(Duration::from_secs(60), || b.pg.is_primary(0) == Some(true)),
        "n1 did not become the primary"
    );
    b.start(1);
    b.start(2);
    b.steady();
    let writer = Writer::start(b.pg.primary_conninfo());
    assert!(
        wait_for(Duration::from_secs(30), || writer.acks().len() > 100),
        "no writes"
    );
    if args.failsafe {
        // The holder's record carries the set once every member published
        // its endpoint and a renewal passed.
        let published = wait_for(Duration::from_secs(30), || {
            let out = Command::new(&b.putex)
                .args(["status", "pg", "--store", &b.url, "-o", "json"])
                .output()
                .expect("putex status");
            let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            st["members"].as_array().is_some_and(|ms| {
                ms.len() == 3 && ms.iter().all(|m| m["failsafe"]["url"].is_string())
            })
        });
        assert!(
            published,
            "the members' failsafe endpoints are not in status"
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    if let Some(secs) = args.outage {
        let figures = store_outage(&mut b, &mut server, writer, Duration::from_secs(secs));
        if let Some(path) = args.json {
            let j = serde_json::json!({
                "outage": figures,
                "settings": {"timing": b.timing, "max_lag": b.max_lag, "synchronous": args.synchronous, "failsafe": args.failsafe},
            });
            std::fs::write(&path, serde_json::to_string_pretty(&j).unwrap()).expect("write --json");
        }
        return;
    }

    let mut crashes = Vec::new();
    let mut switchovers = Vec::new();
    let mut lost = Vec::new();
    for run in 1..=args.runs {
        // Crash of the primary's host.
        let p = b.steady();
        std::thread::sleep(Duration::from_secs(2));
        let before = writer.acks().len();
        let port = b.pg.nodes[p].port;
        let crashed = wall_ns();
        if let Some(a) = b.agents[p].as_mut() {
            a.crash();
        }
        b.pg.kill_server(p);
        let mut first = None;
        wait_for(Duration::from_secs(120), || {
            first = writer.acks()[before..]
                .iter()
                .find(|a| a.port != port)
                .copied();
            first.is_some()
        });
        let first = first.expect("no failover");
        let took = Duration::from_nanos((first.ns - crashed) as u64);
        let to =
            b.pg.nodes
                .iter()
                .position(|n| n.port == first.port)
                .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let l = b.lost(to, &writer.acks());
        println!(
            "crash {run}: {} → {}: first write on the new primary {:.0} ms after the crash; {l} acknowledged writes lost",
            b.pg.nodes[p].name, b.pg.nodes[to].name, ms(took)
        );
        crashes.push(ms(took));
        lost.push(l);
        let back = Instant::now();
        b.agents[p] = None;
        b.start(p);
        b.steady();
        println!(
            "  {} streams from {} again {:.1} s after its agent restarted",
            b.pg.nodes[p].name,
            b.pg.nodes[to].name,
            back.elapsed().as_secs_f64()
        );

        // Switchover to a replica.
        let p = b.steady();
        std::thread::sleep(Duration::from_secs(2));
        let target = (p + 1) % 3;
        let before = writer.acks().len();
        // In synchronous mode with --max-lag 0 a target under load is
        // always some bytes behind the position published a moment before:
        // it takes the lock once it caught up with what the old primary's
        // fast shutdown sent it (no --allow-lag); the lost-commit check
        // below holds it to that.
        let out = Command::new(&b.putex)
            .args(["switchover", "pg", "--to", &b.pg.nodes[target].name])
            .args(["--store", &b.url])
            .output()
            .expect("putex switchover");
        assert!(
            out.status.success(),
            "switchover: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tport = b.pg.nodes[target].port;
        assert!(
            wait_for(Duration::from_secs(30), || writer.acks()[before..]
                .iter()
                .any(|a| a.port == tport)),
            "no write reached the switchover's target"
        );
        let acks = writer.acks();
        let gap = write_gap(&acks[before.saturating_sub(1)..]).expect("a change of primary");
        std::thread::sleep(Duration::from_millis(500));
        let l = b.lost(target, &writer.acks());
        println!(
            "switchover {run}: {} → {}: writes unavailable {:.0} ms; {l} acknowledged writes lost",
            b.pg.nodes[p].name,
            b.pg.nodes[target].name,
            ms(gap)
        );
        switchovers.push(ms(gap));
        lost.push(l);
    }
    let acked = writer.stop().len();

    // Idle cost, writer stopped.
    let p = b.steady();
    let replica = (p + 1) % 3;
    std::thread::sleep(Duration::from_secs(2));
    let pid = |i: usize| b.agents[i].as_ref().map_or(0, |a| a.pid());
    let (pp, rp) = (pid(p), pid(replica));
    let start = [
        cpu_ticks(pp),
        cpu_ticks_with_children(pp),
        cpu_ticks(rp),
        cpu_ticks_with_children(rp),
    ];
    let window = Duration::from_secs(10);
    std::thread::sleep(window);
    let end = [
        cpu_ticks(pp),
        cpu_ticks_with_children(pp),
        cpu_ticks(rp),
        cpu_ticks_with_children(rp),
    ];
    // USER_HZ is 100 on Linux: a tick is 10 ms.
    let pct = |k: usize| (end[k] - start[k]) as f64 * 10.0 / window.as_millis() as f64 * 100.0;
    let idle = serde_json::json!({
        "primary_agent": {"rss_mb": rss_kb(pp) as f64 / 1024.0, "cpu_pct": pct(0), "cpu_pct_with_hooks": pct(1)},
        "replica_agent": {"rss_mb": rss_kb(rp) as f64 / 1024.0, "cpu_pct": pct(2), "cpu_pct_with_hooks": pct(3)},
    });
    println!("idle, 10 s: {idle}");
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!(
        "putex (R = {}): bootstrap median {:.0} ms, crash failover median {:.0} ms, switchover unavailability median {:.0} ms, {} of {acked} acknowledged writes lost",
        b.timing[1],
        med(&bootstraps),
        med(&crashes),
        med(&switchovers),
        lost.iter().sum::<usize>()
    );
    if let Some(path) = args.json {
        let j = serde_json::json!({
            "bootstrap_ms": bootstraps,
            "crash_failover_ms": crashes,
            "switchover_unavailable_ms": switchovers,
            "lost": lost,
            "acknowledged": acked,
            "idle": idle,
            "settings": {"timing": b.timing, "max_lag": b.max_lag, "synchronous": args.synchronous},
        });
        std::fs::write(&path, serde_json::to_string_pretty(&j).unwrap()).expect("write --json");
    }
}
