//! Lock benchmark, part 2 of 3: what a lock costs as a whole process,
//! `putex lock NAME -- true`, against `flock FILE true` and `etcdctl lock
//! NAME true`. Not a test: it prints figures and ratios for
//! `docs/performance.md`. (Part 1, `lock_cost`, measures the library
//! uncontended; part 3, `lock_contention`, a lock under contention.)
//!
//! ```text
//! cargo run --release -p putex --example lock_process -- [--quick] [--putex PATH] [--json FILE]
//! ```
//!
//! `--quick` (20 runs of each command) takes a few seconds; the default is
//! 30 runs. `--json FILE` also writes the figures as JSON (for
//! `scripts/bench`).
//!
//! The commands are interleaved, one run of each per round after one
//! untimed run of each, so load from other work on the machine hits them
//! alike:
//!
//! - `putex lock NAME --store URL -- true` with the default timing, on a
//!   single-node nats-server (loopback port, temporary store directory,
//!   default fsync; the binary is `$PUTEX_NATS_SERVER`, else
//!   `.tools/bin/nats-server`, else `nats-server` on `PATH`;
//!   `scripts/install-nats-server` installs it) and on an SQLite file. The
//!   `putex` binary is the release binary beside this example, built if
//!   missing or older than the example, or `--putex PATH`; it runs with
//!   a clean environment and a temporary keeper directory. The lock name is
//!   used once first, untimed, so the first-use wait of S4 is excluded.
//! - `putex --version`, the floor of starting the binary.
//! - `flock FILE true` (util-linux).
//! - `etcdctl lock NAME true` against a local single-member etcd, when
//!   `etcd` and `etcdctl` are on `PATH`.
//! - **A semaphore at its limit**: 16 `putex lock SEM --limit 4 -- CMD`
//!   processes started at once on each store (default timing; the name
//!   used once first), CMD holding its slot 100 ms and logging when it
//!   started and ended. Reported: the total time from the first start to
//!   the last exit against the ideal ⌈16/4⌉ × 100 ms, and the most CMDs
//!   ever running at once (never more than 4; 4 while waiters remain).
//!   Beside it, the floor under its first round on this machine: 16
//!   `putex lock` clients of 16 *different* locks started at once, none
//!   waiting for another, and when their CMDs started — a semaphore's 4th
//!   slot cannot fill before the 4th of these.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

use putex_testkit::bench::lock::{preamble, print_summary};
use putex_testkit::bench::{ms_f, ratio, write_json, Summary, Table};
use putex_testkit::nats_server::NatsServer;

/// The lock the `putex lock` runs use.
const CLI_LOCK: &str = "clibench";

/// Lock benchmark, part 2 of 3: `putex lock NAME -- true` as a whole process.
///
/// Times `putex lock NAME -- true` (default timing; on a fresh single-node
/// nats-server and on SQLite) against `flock FILE true`, `putex --version`
/// and, when etcd and etcdctl are on PATH, `etcdctl lock NAME true`.
#[derive(Parser)]
#[command(name = "lock_process")]
struct Args {
    /// A shorter run: 20 runs of each command instead of 30
    #[arg(long)]
    quick: bool,
    /// The putex binary to time [default: the release binary beside this
    /// example, built if missing or older than the example]
    #[arg(long, value_name = "PATH")]
    putex: Option<PathBuf>,
    /// Also write the figures as JSON to FILE (for scripts/bench)
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let runs = if args.quick { 20 } else { 30 };
    let started = Instant::now();

    let machine = preamble("a fresh single-node server");
    println!("putex lock runs: {runs}\n");

    let dir = tempfile::tempdir().expect("temp dir");
    let mut table = Table::default();
    let rows = {
        let nats = NatsServer::start();
        whole_process(&mut table, args.putex.clone(), dir.path(), &nats.url, runs)
    };

    let semaphore = match args.putex.clone().or_else(find_putex) {
        Some(bin) => {
            let nats = NatsServer::start();
            let sqlite_url = format!("sqlite://{}", dir.path().join("sem.db").display());
            [("nats", nats.url.clone()), ("sqlite", sqlite_url)]
                .into_iter()
                .map(|(store, url)| {
                    semaphore_at_its_limit(&mut table, &bin, dir.path(), store, &url)
                })
                .collect()
        }
        None => Vec::new(),
    };

    print_summary(&machine, started, &table);
    if let Some(path) = &args.json {
        write_json(
            path,
            &serde_json::json!({
                "bench": "lock_process",
                "process_runs": runs,
                "nats_server": machine.nats_version,
                "process": rows,
                "semaphore": semaphore,
            }),
        );
    }
}

/// The `putex` binary beside this example, built when missing or stale;
/// `None` (and the `putex lock` rows skipped) when it cannot be built.
fn find_putex() -> Option<PathBuf> {
    match putex_testkit::bench::putex_beside_me() {
        Ok(bin) => {
            println!("putex: {}", bin.display());
            Some(bin)
        }
        Err(e) => {
            println!("{e}; skipping the putex lock runs");
            None
        }
    }
}

/// The whole process `putex lock NAME -- true` against flock and etcd.
/// The commands are interleaved, one run of each per round, so load from
/// other work on the machine hits them alike. Returns the figures for
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
    // etcd first: `putex lock` runs on it too, beside `etcdctl lock`.
    let mut etcd_missing = None;
    let mut etcd_endpoint = None;
    let etcd = match start_etcd(dir) {
        Ok((server, endpoint, etcdctl)) => {
            etcd_endpoint = Some(endpoint.clone());
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
        let etcd_url = etcd_endpoint.map(|e| format!("etcd://{}", e.trim_start_matches("http://")));
        let stores = [
            Some(("nats", nats_url.to_owned())),
            Some(("sqlite", sqlite_url)),
            etcd_url.map(|u| ("etcd", u)),
        ];
        for (label, url) in stores.into_iter().flatten() {
            let lock = putex_lock(bin, &url, &dir.join("keepers"));
            // First use of the name waits W + G (S4): take it with the fast
            // profile, so that the default-timing runs start from a
            // released record.
            let t = Instant::now();
            match run_once(lock(&putex_testkit::bench::FAST)) {
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

/// 16 clients of a semaphore of 4 slots, each holding its slot 100 ms,
/// started at once: how long until all are done against the ideal, and
/// how many ran at once (from CMD's own start and end times).
fn semaphore_at_its_limit(
    table: &mut Table,
    putex: &Path,
    dir: &Path,
    store: &str,
    url: &str,
) -> serde_json::Value {
    const CLIENTS: usize = 16;
    const SLOTS: usize = 4;
    const HOLD_MS: u64 = 100;
    let log = dir.join(format!("sem-{store}.log"));
    let cmd = |extra: &[&str], hold: &str| {
        let mut c = lock_command(putex, &dir.join("keepers"), "sembench", url);
        c.args(["--limit", "4"])
            .args(extra)
            .args(["--", "sh", "-c"])
            .arg(format!(
                "echo \"+ $(date +%s%N) $$\" >>'{l}'; sleep {hold}; echo \"- $(date +%s%N) $$\" >>'{l}'",
                l = log.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    // First use of the name waits W + G (S4): the fast profile, untimed.
    if let Err(e) = run_once(cmd(&putex_testkit::bench::FAST, "0")) {
        println!("semaphore first use ({store}): {e}");
    }
    let apart = apart(putex, dir, store, url, CLIENTS);
    let _ = std::fs::remove_file(&log);
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let started = Instant::now();
    let children: Vec<Child> = (0..CLIENTS)
        .map(|_| cmd(&[], "0.1").spawn().expect("start putex lock"))
        .collect();
    let mut failed = 0;
    for c in children {
        let out = c.wait_with_output().expect("wait for putex lock");
        if !out.status.success() {
            failed += 1;
            println!(
                "semaphore client failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    let total = started.elapsed();
    // The most CMDs running at once, from their own start and end lines
    // (`+ NS PID` / `- NS PID`).
    let lines: Vec<(u128, i32, String)> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let sign = if f.next()? == "+" { 1 } else { -1 };
            Some((f.next()?.parse().ok()?, sign, f.next()?.to_owned()))
        })
        .collect();
    let mut events: Vec<(u128, i32)> = lines.iter().map(|(t, d, _)| (*t, *d)).collect();
    events.sort();
    // How long each CMD held its slot by its own lines: the hold asked for
    // plus the CMD's own forks (`date`, `sleep`) on this machine.
    let mut holds: Vec<f64> = lines
        .iter()
        .filter(|(_, d, _)| *d == 1)
        .filter_map(|(t0, _, pid)| {
            let end = lines.iter().find(|(_, d, p)| *d == -1 && p == pid)?.0;
            Some(end.saturating_sub(*t0) as f64 / 1e6)
        })
        .collect();
    holds.sort_by(f64::total_cmp);
    let hold_median = holds.get(holds.len() / 2).copied();
    let (mut inside, mut most) = (0, 0);
    for (_, d) in &events {
        inside += d;
        most = most.max(inside);
    }
    let ran = events.iter().filter(|(_, d)| *d == 1).count();
    // Where the time over the ideal goes: the first CMD's start after the
    // launch (16 processes starting on this machine's cores), and each
    // hand-off — the k-th start (k ≥ 4) after the (k − 4)-th end, the end
    // that freed its slot.
    let starts: Vec<u128> = events
        .iter()
        .filter(|(_, d)| *d == 1)
        .map(|(t, _)| *t)
        .collect();
    let ends: Vec<u128> = events
        .iter()
        .filter(|(_, d)| *d == -1)
        .map(|(t, _)| *t)
        .collect();
    let ms = |ns: u128| ns as f64 / 1e6;
    let first_start = starts.first().map(|t| ms(t.saturating_sub(launched_ns)));
    let slots_full = starts
        .get(SLOTS - 1)
        .map(|t| ms(t.saturating_sub(launched_ns)));
    let mut handoffs: Vec<f64> = starts
        .iter()
        .skip(SLOTS)
        .zip(&ends)
        .map(|(s, e)| ms(s.saturating_sub(*e)))
        .collect();
    handoffs.sort_by(f64::total_cmp);
    let handoff_median = handoffs.get(handoffs.len() / 2).copied();
    let handoff_max = handoffs.last().copied();
    let last_end = ends.last().map(|t| ms(t.saturating_sub(launched_ns)));
    let ideal = Duration::from_millis(CLIENTS.div_ceil(SLOTS) as u64 * HOLD_MS);
    let r = ratio(total, ideal);
    let figure = format!(
        "{:.0} ms for {ran} of {CLIENTS} clients ({failed} failed); at most {most} inside",
        ms_f(total)
    );
    let vs = format!(
        "{r:.2}× the ideal {:.0} ms; target ≤ 1.15×: {}; never more than {SLOTS} inside: {}",
        ms_f(ideal),
        if r <= 1.15 { "met" } else { "MISSED" },
        if most <= SLOTS as i32 { "yes" } else { "NO" }
    );
    println!("semaphore, {SLOTS} slots, {CLIENTS} clients holding {HOLD_MS} ms ({store}): {figure}; {vs}");
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
    println!(
        "  where the time goes ({store}): first CMD started {} after the launch, \
         the {SLOTS}th {}; each CMD held its slot {} (median, by its own lines; {HOLD_MS} ms asked); \
         hand-offs (a CMD's end to the next start in its slot) median {}, max {}; \
         last CMD ended {} after the launch",
        opt(first_start),
        opt(slots_full),
        opt(hold_median),
        opt(handoff_median),
        opt(handoff_max),
        opt(last_end)
    );
    let apart_note = match &apart {
        Ok(a) => {
            let nth = a.get(SLOTS - 1).copied().unwrap_or(f64::NAN);
            println!(
                "  the floor ({store}): {CLIENTS} clients of {CLIENTS} different locks started at once, \
                 no waiting: the {SLOTS}th CMD started {nth:.1} ms after the launch, the last {:.1} ms",
                a.last().copied().unwrap_or(f64::NAN)
            );
            format!("; {CLIENTS} clients of {CLIENTS} different locks at once start their {SLOTS}th CMD {nth:.0} ms after the launch")
        }
        Err(e) => {
            println!("  the floor ({store}) not measured: {e}");
            String::new()
        }
    };
    table.push(
        "semaphore: 16 `putex lock --limit 4` clients holding 100 ms, started at once",
        store,
        figure,
        format!("{vs}{apart_note}"),
    );
    serde_json::json!({
        "store": store, "clients": CLIENTS, "slots": SLOTS, "hold_ms": HOLD_MS,
        "total_ms": ms_f(total), "ideal_ms": ms_f(ideal), "ratio": r,
        "most_inside": most, "ran": ran, "failed": failed,
        "first_start_ms": first_start, "slots_full_ms": slots_full, "hold_median_ms": hold_median, "handoff_median_ms": handoff_median,
        "handoff_max_ms": handoff_max, "last_end_ms": last_end,
        "apart_starts_ms": apart.as_ref().ok(),
        "apart_error": apart.as_ref().err(),
    })
}

/// The floor under a semaphore's first round on this machine: `clients`
/// `putex lock` processes of as many *different* locks (each name used
/// once first, untimed), started at once as the semaphore's clients are,
/// none waiting for another; when each CMD started after the launch (ms,
/// in order). A semaphore of N slots cannot have its N-th CMD running
/// before the N-th of these starts: what is left is the cost of starting
/// `clients` processes together on this machine's cores.
fn apart(
    putex: &Path,
    dir: &Path,
    store: &str,
    url: &str,
    clients: usize,
) -> Result<Vec<f64>, String> {
    let log = dir.join(format!("apart-{store}.log"));
    let cmd = |i: usize, extra: &[&str]| {
        let mut c = lock_command(putex, &dir.join("keepers"), &format!("apart{i}"), url);
        c.args(extra)
            .args(["--", "sh", "-c"])
            .arg(format!("echo \"+ $(date +%s%N)\" >>'{}'", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    // First use of every name (S4's wait), at once, untimed.
    all_at_once(
        (0..clients).map(|i| cmd(i, &putex_testkit::bench::FAST)),
        "first use",
    )?;
    let _ = std::fs::remove_file(&log);
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    all_at_once((0..clients).map(|i| cmd(i, &[])), "putex lock")?;
    let mut starts: Vec<f64> = std::fs::read_to_string(&log)
        .map_err(|e| format!("{}: {e}", log.display()))?
        .lines()
        .filter_map(|l| l.strip_prefix("+ ")?.trim().parse::<u128>().ok())
        .map(|t| t.saturating_sub(launched_ns) as f64 / 1e6)
        .collect();
    starts.sort_by(f64::total_cmp);
    if starts.len() != clients {
        return Err(format!("{} of {clients} CMDs ran", starts.len()));
    }
    Ok(starts)
}

/// Starts every command at once and waits for all; the first failure's
/// stderr, named by `what`.
fn all_at_once(cmds: impl Iterator<Item = Command>, what: &str) -> Result<(), String> {
    let children: Vec<Child> = cmds
        .map(|mut c| c.spawn())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: cannot start putex lock: {e}"))?;
    let mut failure = None;
    for c in children {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() && failure.is_none() {
            failure = Some(format!(
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    failure.map_or(Ok(()), Err)
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
        let mut c = lock_command(&putex, &keeper_dir, CLI_LOCK, &url);
        c.args(extra).args(["--", "true"]);
        c
    }
}

/// `putex lock NAME --store URL` with none of this environment's `PUTEX_*`
/// settings (nor `NATS_URL`) and keepers in `keeper_dir`; the caller adds
/// the rest of the line.
fn lock_command(putex: &Path, keeper_dir: &Path, name: &str, url: &str) -> Command {
    let mut c = Command::new(putex);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PUTEX_") || k == "NATS_URL" {
            c.env_remove(k);
        }
    }
    c.env("PUTEX_KEEPER_DIR", keeper_dir)
        .args(["lock", name, "--store", url]);
    c
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
