//! The whole performance table: reads the JSON figures that `scripts/bench`
//! collects from `failover_bench`, `lock_cost`, `lock_process`,
//! `lock_contention`, `scale_bench` and `gateway_load` (their `--json FILE` option) and
//! prints one Markdown table with every figure, its target and a ratio or
//! verdict. Not a test.
//!
//! ```text
//! cargo run --release -p putex --example bench_table -- DIR [--mode quick|full]
//!     [--load-start "1.0 1.0 1.0"] [--seconds N] [--build-seconds N] [--nats-server PATH]
//! ```
//!
//! `DIR` holds `failover-nats.json`, `failover-sqlite.json`, `failover-etcd.json`,
//! `lock-cost.json`, `lock-process.json`, `lock-contention.json`,
//! `scale-*.json` and `gateway.json`; a missing file (its bench failed) shows as a row that
//! says so, with the bench's log `DIR/<name>.log`.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde_json::Value;

/// The whole performance table, from the figures `scripts/bench` collects.
///
/// Reads the benchmarks' JSON figures in DIR and prints one Markdown table
/// with every figure, its target and a ratio or verdict; a missing file
/// shows as a failed row that names the benchmark's log, DIR/<name>.log.
#[derive(Parser)]
#[command(name = "bench_table")]
struct Args {
    /// The directory holding the benchmarks' JSON figures and logs
    dir: PathBuf,
    /// The kind of run the figures come from (for the title)
    #[arg(long, default_value = "full", value_parser = ["quick", "full"])]
    mode: String,
    /// The load averages at the start of the run, e.g. "1.0 1.0 1.0"
    #[arg(long, value_name = "LOAD")]
    load_start: Option<String>,
    /// How long the whole run took, in seconds
    #[arg(long, value_name = "N")]
    seconds: Option<u64>,
    /// How many of those seconds went to building
    #[arg(long, value_name = "N")]
    build_seconds: Option<u64>,
    /// The nats-server binary the benchmarks ran (for its version)
    #[arg(long, value_name = "PATH")]
    nats_server: Option<PathBuf>,
}

fn main() {
    let Args {
        dir,
        mode,
        load_start,
        seconds,
        build_seconds: build,
        nats_server: nats,
    } = Args::parse();
    let mut t = Table::default();
    failover(&dir, &mut t);
    locks(&dir, &mut t);
    scale(&dir, &mut t);
    gateway(&dir, &mut t);

    println!("## scripts/bench ({mode}): the whole table\n");
    println!("{}\n", machine(nats.as_deref(), load_start, seconds, build));
    t.print();
    if !t.notes.is_empty() {
        println!();
        for (i, n) in t.notes.iter().enumerate() {
            println!("{}. {n}", i + 1);
        }
    }
}

// ---------------------------------------------------------------------------
// Sections.

fn failover(dir: &Path, t: &mut Table) {
    for store in ["nats", "sqlite", "etcd"] {
        let name = format!("failover-{store}");
        let Some(f) = read(dir, &name) else {
            t.missing("crash failover and clean handover", store, dir, &name);
            continue;
        };
        let runs = num(&f, "runs");
        let bound = num(&f, "bound_ms");
        let (med, max) = (num(&f, "crash_median_ms"), num(&f, "crash_max_ms"));
        t.row(
            "crash failover: active agent + keeper SIGKILLed → next activate hook (3 agents, R=100ms F=3 C=1)",
            store,
            format!(
                "median {}, max {} ({runs:.0} crashes)",
                ms(med),
                ms(max)
            ),
            format!("max ≤ B + 100 ms; B = {} (`putex check`)", ms(bound)),
            format!(
                "median {:.2} B, max {:.2} B — **{}**",
                med / bound,
                max / bound,
                verdict(max <= bound + 100.0)
            ),
        );
        let (gmed, gmax) = (
            num(&f, "handover_gap_median_ms"),
            num(&f, "handover_gap_max_ms"),
        );
        t.row(
            "clean handover gap: graceful stop done → next activate hook",
            store,
            format!(
                "median {}, max {} ({runs:.0} handovers; SIGTERM → activate median {})",
                ms(gmed),
                ms(gmax),
                ms(num(&f, "handover_total_median_ms"))
            ),
            "median < 20 ms".into(),
            format!(
                "{:.2}× the target — **{}**",
                gmed / 20.0,
                verdict(gmed < 20.0)
            ),
        );
        if f.get("switchover_median_ms").is_some() {
            let (smed, smax) = (
                num(&f, "switchover_median_ms"),
                num(&f, "switchover_max_ms"),
            );
            t.row(
                "switchover: `putex switchover --to NODE` started → target's activate hook",
                store,
                format!(
                    "median {}, max {} ({runs:.0} switchovers)",
                    ms(smed),
                    ms(smax)
                ),
                "median ≤ 20 ms (Patroni: 2.9 s)".into(),
                format!(
                    "{:.2}× the target, {:.0}× faster than Patroni — **{}**",
                    smed / 20.0,
                    2900.0 / smed.max(0.001),
                    verdict(smed <= 20.0)
                ),
            );
        }
        let idle = f["idle"].as_array().cloned().unwrap_or_default();
        for role in ["active", "standby"] {
            let agent = idle
                .iter()
                .find(|p| p["what"].as_str() == Some(&format!("{role} agent")));
            let keeper = idle
                .iter()
                .find(|p| p["what"].as_str() == Some(&format!("{role} keeper")));
            let Some(a) = agent else { continue };
            let rss = num(a, "rss_kb") / 1024.0;
            let cpu = num(a, "cpu_percent").max(num(a, "sched_percent"));
            let keeper = keeper
                .map(|k| {
                    format!(
                        "; its keeper {:.1} MB, {:.2} %",
                        num(k, "rss_kb") / 1024.0,
                        num(k, "cpu_percent").max(num(k, "sched_percent"))
                    )
                })
                .unwrap_or_default();
            t.row(
                &format!("idle {role} agent at R=1s (F=3 C=1, `--healthcheck true` each R)"),
                store,
                format!(
                    "VmRSS {rss:.1} MB (peak), CPU {cpu:.2} % of a core over {:.0} s{keeper}",
                    num(&f, "idle_window_s")
                ),
                "VmRSS < 15 MB, CPU < 1 % (agent alone)".into(),
                format!(
                    "{:.2}× / {:.2}× the targets — **{}**",
                    rss / 15.0,
                    cpu / 1.0,
                    verdict(rss < 15.0 && cpu < 1.0)
                ),
            );
        }
    }
    t.note(
        "B = W + G' + three store round trips, as `putex check` prints it for the same \
         flags against the same store; idle CPU is the larger of utime + stime and \
         the threads' schedstat, hook processes excluded.",
    );
}

fn locks(dir: &Path, t: &mut Table) {
    let mut seen = false;
    for (name, what, rows) in [
        (
            "lock-cost",
            "locks: uncontended acquire + release vs raw KV ops",
            lock_cost as fn(&Value, &mut Table),
        ),
        (
            "lock-process",
            "locks: `putex lock` vs `flock`",
            lock_process,
        ),
        ("lock-process", "locks: a semaphore at its limit", semaphore),
        ("lock-contention", "locks: contention", lock_contention),
    ] {
        match read(dir, name) {
            Some(l) => {
                seen = true;
                rows(&l, t);
            }
            None => t.missing(what, "both", dir, name),
        }
    }
    if seen {
        t.note(
            "Locks: `lock_cost`, `lock_process` and `lock_contention` (single-node \
             nats-server, default fsync; SQLite with `synchronous=FULL`); lock names \
             used once, untimed, before measuring.",
        );
    }
}

/// `lock_cost`: uncontended acquire + release against the raw operations.
fn lock_cost(l: &Value, t: &mut Table) {
    for u in l["uncontended"].as_array().cloned().unwrap_or_default() {
        let store = u["store"].as_str().unwrap_or("?").to_owned();
        let raw = num(&u["raw_create_delete"], "median_ms");
        for (key, what, targeted) in [
            ("lock_default", "standing `Lock`, default timing", true),
            ("lock_fast", "standing `Lock`, R=100ms F=3 C=1", true),
            ("lease_default", "one-shot `Lease`, default timing", false),
            ("lease_fast", "one-shot `Lease`, R=100ms F=3 C=1", false),
        ] {
            if u[key].is_null() {
                continue; // figures from before `Lock`
            }
            let lib = num(&u[key], "median_ms");
            let r = lib / raw;
            let floor = u["raw_cas_cas"]
                .get("median_ms")
                .and_then(Value::as_f64)
                .map(|cas| format!("; {:.2}× two raw CAS ({})", lib / cas, ms(cas)))
                .unwrap_or_default();
            let (target, verdict) = if targeted {
                (
                    "≤ 1.15× raw (median)".to_owned(),
                    format!("{r:.2}× raw — **{}**{floor}", verdict(r <= 1.15)),
                )
            } else {
                (
                    "(no target: starts an agent and a watch)".to_owned(),
                    format!("{r:.2}× raw{floor}"),
                )
            };
            t.row(
                &format!("uncontended acquire + release ({what}) vs raw KV `create` + `delete`"),
                &store,
                format!(
                    "{} vs {} (medians of {:.0}; p99 {} vs {})",
                    ms(lib),
                    ms(raw),
                    num(&u, "iters"),
                    ms(num(&u[key], "p99_ms")),
                    ms(num(&u["raw_create_delete"], "p99_ms"))
                ),
                target,
                verdict,
            );
        }
    }
}

/// `lock_process`: the whole process `putex lock` against `flock`.
fn lock_process(l: &Value, t: &mut Table) {
    let process = l["process"].as_array().cloned().unwrap_or_default();
    let flock = process
        .iter()
        .find(|p| p["what"].as_str().is_some_and(|w| w.contains("flock")))
        .and_then(|p| p["median_ms"].as_f64());
    let etcd = process
        .iter()
        .find(|p| p["what"].as_str().is_some_and(|w| w.contains("etcdctl")))
        .and_then(|p| p["median_ms"].as_f64());
    let floor = process
        .iter()
        .find(|p| p["what"].as_str().is_some_and(|w| w.contains("--version")))
        .and_then(|p| p["median_ms"].as_f64());
    for p in &process {
        let what = p["what"].as_str().unwrap_or("?");
        let store = p["store"].as_str().unwrap_or("?");
        if what.contains("flock") || what.contains("--version") {
            continue;
        }
        let label = if what.contains("etcdctl") {
            "whole process `etcdctl lock NAME true` vs `flock FILE true`"
        } else {
            "whole process `putex lock NAME -- true` (default timing) vs `flock FILE true`"
        };
        if let Some(e) = p["error"].as_str() {
            t.row(
                label,
                store,
                "not measured".into(),
                "(ratio only)".into(),
                format!("n/a: {e}"),
            );
            continue;
        }
        let med = num(p, "median_ms");
        t.row(
            label,
            store,
            format!(
                "{} vs flock {} (medians of {:.0}; p90 {}; `putex --version` alone {})",
                ms(med),
                flock.map_or("n/a".into(), ms),
                num(p, "runs"),
                ms(num(p, "p90_ms")),
                floor.map_or("n/a".into(), ms)
            ),
            "(ratio only)".into(),
            format!(
                "{}{}",
                flock.map_or("flock not available".into(), |f| format!(
                    "{:.1}× flock",
                    med / f
                )),
                etcd.filter(|_| !what.contains("etcdctl"))
                    .map(|e| format!("; {:.1}× `etcdctl lock`", med / e))
                    .unwrap_or_default()
            ),
        );
    }
}

/// `lock_process`'s semaphore: 16 clients of 4 slots, each holding 100 ms,
/// started at once, against the ideal ⌈16/4⌉ × 100 ms — and the floor
/// under its first round: as many clients of different locks started at
/// once.
fn semaphore(l: &Value, t: &mut Table) {
    for sem in l["semaphore"].as_array().cloned().unwrap_or_default() {
        let store = sem["store"].as_str().unwrap_or("?");
        let (clients, slots) = (num(&sem, "clients"), num(&sem, "slots"));
        let (total, ideal, r) = (
            num(&sem, "total_ms"),
            num(&sem, "ideal_ms"),
            num(&sem, "ratio"),
        );
        let most = num(&sem, "most_inside");
        let floor = sem["apart_starts_ms"]
            .as_array()
            .and_then(|a| a.get(slots as usize - 1))
            .and_then(Value::as_f64)
            .map(|nth| {
                format!(
                    "; the floor: {clients:.0} clients of {clients:.0} different locks started at once \
                     run their {slots:.0}th CMD {} after the launch, where 1.15× leaves {} for the start, \
                     the hand-offs and the exit",
                    ms(nth),
                    ms(ideal * 0.15)
                )
            })
            .unwrap_or_default();
        t.row(
            &format!(
                "semaphore: {clients:.0} `putex lock --limit {slots:.0}` clients holding {:.0} ms, started at once",
                num(&sem, "hold_ms")
            ),
            store,
            format!(
                "{} for {:.0} of {clients:.0} ({:.0} failed); {slots:.0}th slot first filled {} after the launch, \
                 hand-offs median {}, max {}; at most {most:.0} inside",
                ms(total),
                num(&sem, "ran"),
                num(&sem, "failed"),
                ms(num(&sem, "slots_full_ms")),
                ms(num(&sem, "handoff_median_ms")),
                ms(num(&sem, "handoff_max_ms")),
            ),
            format!("≤ 1.15× the ideal {}; never more than {slots:.0} inside", ms(ideal)),
            format!(
                "{r:.2}× the ideal: {}; at most {most:.0} inside: {}{floor}",
                retired_unless_met(r <= 1.15),
                verdict(most <= slots)
            ),
        );
    }
}

/// `lock_contention`: waiters on one lock in one process.
fn lock_contention(l: &Value, t: &mut Table) {
    let waiters = num(l, "waiters");
    for c in l["contention"].as_array().cloned().unwrap_or_default() {
        let store = c["store"].as_str().unwrap_or("?").to_owned();
        let variant = c["variant"].as_str().unwrap_or("lease");
        let queued = variant == "queue";
        let rate = num(&c, "per_s");
        let other = num(&c, "to_another_task_per_s");
        let mut notes = Vec::new();
        if let Some(f) = c["watches_failing_from_s"].as_f64() {
            notes.push(format!(
                "watches failing from {f:.1} s on (consumer limit): {:.0}/s before, {:.0}/s after",
                num(&c, "per_s_before_watch_failures"),
                num(&c, "per_s_after_watch_failures")
            ));
        }
        if num(&c, "gave_up") > 0.0 {
            notes.push(format!(
                "{:.0} waiters without a turn at the end",
                num(&c, "gave_up")
            ));
        }
        let figure = format!(
            "{rate:.0} acquisitions/s, {other:.0}/s to another task ({:.0} s; wait p99 {}){}",
            num(&c, "window_s"),
            ms(num(&c, "wait_p99_ms")),
            if notes.is_empty() {
                String::new()
            } else {
                format!("; {}", notes.join("; "))
            }
        );
        let (target, ratio) = if store == "nats" {
            let v = if queued {
                format!(
                    "{:.2}× — **{}** (every acquisition is a hand-off)",
                    rate / 1000.0,
                    verdict(rate >= 1000.0)
                )
            } else {
                format!(
                    "acquisitions {:.2}× — **{}**; between tasks {:.2}× — **{}**",
                    rate / 1000.0,
                    verdict(rate >= 1000.0),
                    other / 1000.0,
                    verdict(other >= 1000.0)
                )
            };
            ("≥ 1,000 hand-offs/s".to_owned(), v)
        } else {
            ("(no target)".to_owned(), String::new())
        };
        t.row(
            &format!(
                "contended: {waiters:.0} waiters on one lock in one process, R=100ms ({})",
                match variant {
                    "queue" => "fair queue `Ticket` + a standing `Lock`",
                    "lock" => "a standing `Lock` per waiter",
                    _ => "`Lease::acquire`",
                }
            ),
            &store,
            figure,
            target,
            ratio,
        );
    }
}

fn scale(dir: &Path, t: &mut Table) {
    let mut leases = Vec::new();
    let mut agents = Vec::new();
    let mut seen = false;
    for (name, what, store) in [
        (
            "scale-leases-nats",
            "scale: one process holding 10,000 leases",
            "nats",
        ),
        (
            "scale-leases-sqlite",
            "scale: one process holding 10,000 leases",
            "sqlite",
        ),
        ("scale-agents", "scale: 50 agents on one lock", "both"),
    ] {
        match read(dir, name) {
            Some(s) => {
                seen = true;
                leases.extend(s["leases"].as_array().cloned().unwrap_or_default());
                agents.extend(s["agents"].as_array().cloned().unwrap_or_default());
            }
            None => t.missing(what, store, dir, name),
        }
    }
    if !seen {
        return;
    }
    for l in &leases {
        let store = l["store"].as_str().unwrap_or("?");
        let n = num(l, "leases");
        let acquired = num(l, "acquired");
        let held = num(l, "held_at_end");
        let writes = num(l, "writes_per_s");
        let sustained = l["sustained"].as_bool().unwrap_or(false);
        let server = l["server_cpu_percent"]
            .as_f64()
            .map(|p| format!(" (+ nats-server {p:.1} %)"))
            .unwrap_or_default();
        let watch = {
            let w = num(l, "watch_failures_warm_up") + num(l, "watch_failures_window");
            let consumers = l["consumers"]
                .as_u64()
                .map(|c| format!(", {c} consumers on the stream"))
                .unwrap_or_default();
            if w > 0.0 || !consumers.is_empty() {
                format!("; {w:.0} watches failed to start{consumers}")
            } else {
                String::new()
            }
        };
        // The same writes without the leases (NATS): the floor under any
        // design that renews each lease with a write of its own.
        let floor = &l["client_floor"];
        let floor_note = match (
            floor["store_update_cpu_percent"].as_f64(),
            floor["jetstream_publish_cpu_percent"].as_f64(),
        ) {
            (Some(store), Some(js)) => format!(
                "; the same {:.0} compare-and-swaps/s without the leases: {store:.1} % through putex's \
                 NATS store, {js:.1} % through async-nats's JetStream publish",
                num(floor, "cas_per_s")
            ),
            _ => floor["error"]
                .as_str()
                .map(|e| format!("; the writes without the leases not measured: {e}"))
                .unwrap_or_default(),
        };
        // Issue targets for 10,000 leases at R = 1 s.
        const RSS_TARGET_MB: f64 = 250.0;
        let cpu_target = if store == "nats" { 10.0 } else { 50.0 };
        let cpu = num(l, "cpu_percent");
        let rss_mb = num(l, "rss_peak_kb") / 1024.0;
        t.row(
            &format!("scale: one process holding {n:.0} leases, default timing (R=1s)"),
            store,
            format!(
                "CPU {:.1} % of a core{server}, peak VmRSS {:.0} MB, store writes {writes:.0}/s over {:.0} s; \
                 {acquired:.0} of {n:.0} acquired after {:.1} s (first use: W + G each, all at once), \
                 {held:.0} held at the end; {:.0} threads, {:.0} open files{watch}{floor_note}",
                cpu,
                rss_mb,
                num(l, "window_s"),
                num(l, "warm_up_s"),
                num(l, "threads"),
                num(l, "open_fds"),
            ),
            format!(
                "10,000 all held; ≤ {cpu_target:.0} % of a core (putex), ≤ {RSS_TARGET_MB:.0} MB; \
                 threads and files independent of the count"
            ),
            format!(
                "writes {:.2}× one per lease per R; {:.3} % CPU per lease — {}; CPU {:.2}× the target: {}; \
                 RSS {:.2}× the target: {}",
                writes / n.max(1.0),
                cpu / acquired.max(1.0),
                if sustained {
                    format!("**sustained** ({n:.0})")
                } else {
                    format!("**not sustained** ({held:.0} of {n:.0} held at the end)")
                },
                cpu / cpu_target,
                if store == "nats" {
                    retired_unless_met(cpu <= cpu_target && n >= 10_000.0)
                } else {
                    verdict(cpu <= cpu_target && n >= 10_000.0)
                },
                rss_mb / RSS_TARGET_MB,
                verdict(rss_mb <= RSS_TARGET_MB && n >= 10_000.0),
            ),
        );
    }
    for a in &agents {
        let store = a["store"].as_str().unwrap_or("?");
        let n = num(a, "agents");
        let bound = num(a, "bound_ms");
        let failovers: Vec<f64> = a["failover_ms"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        let refusals = num(a, "start_refusals");
        let refused = if refusals > 0.0 {
            format!(
                "; {refusals:.0} agent start(s) refused and retried ({})",
                a["first_start_refusal"]
                    .as_str()
                    .map(short_refusal)
                    .unwrap_or_default()
            )
        } else {
            String::new()
        };
        let load = format!(
            "CPU: agents {:.0} %, keepers {:.0} % of a core{}, machine {:.0} % busy; load {} → {}",
            num(a, "agents_cpu_percent"),
            num(a, "keepers_cpu_percent"),
            a["server_cpu_percent"]
                .as_f64()
                .map(|p| format!(", nats-server {p:.0} %"))
                .unwrap_or_default(),
            num(a, "machine_busy_percent"),
            a["load_start"].as_str().unwrap_or("?"),
            a["load_end"].as_str().unwrap_or("?"),
        );
        let what = format!(
            "scale: {n:.0} `putex run` agents on one lock (R=100ms F=3 C=1), crash failover"
        );
        if let Some(e) = a["failure"].as_str() {
            t.row(
                &what,
                store,
                format!("not sustained: {e}{refused}"),
                "max ≤ B + 100 ms; exactly one active".into(),
                "**failed** (see the next row for fewer agents)".into(),
            );
            continue;
        }
        if failovers.is_empty() {
            continue;
        }
        let max = failovers.iter().cloned().fold(0.0, f64::max);
        let mut sorted = failovers.clone();
        sorted.sort_by(f64::total_cmp);
        let med = sorted[sorted.len() / 2];
        let one = a["active_after"]
            .as_array()
            .is_some_and(|v| v.iter().all(|n| n.as_u64() == Some(1)));
        t.row(
            &what,
            store,
            format!(
                "median {}, max {} ({} crash{}); {load}{refused}",
                ms(med),
                ms(max),
                failovers.len(),
                if failovers.len() == 1 { "" } else { "es" }
            ),
            format!(
                "max ≤ B + 100 ms, B = {}; exactly one active after",
                ms(bound)
            ),
            format!(
                "max {:.2} B — **{}**; exactly one active: **{}**",
                max / bound,
                verdict(max <= bound + 100.0),
                if one { "yes" } else { "NO" }
            ),
        );
    }
    t.note(
        "Scale: `scale_bench`. The 10,000 leases share one store handle, and their watches \
         its one change feed (on NATS one ordered consumer, on SQLite one connection woken \
         by writes); on SQLite the renewals queued at one moment commit in one transaction \
         (group commit). The agents run on this one machine, each with its keeper and a \
         health check (`true`) every R, started one after another; agent CPU excludes the \
         hook processes, the machine figure includes everything on it.",
    );
}

/// The gist of an agent's start-up refusal.
fn short_refusal(s: &str) -> String {
    match s.split_once("putex: ") {
        Some((_, why)) => why
            .split(';')
            .next()
            .unwrap_or(why)
            .replace("must be at least", "≥"),
        None => s.chars().take(120).collect(),
    }
}

// ---------------------------------------------------------------------------
// The table.

fn gateway(dir: &Path, t: &mut Table) {
    let Some(g) = read(dir, "gateway") else {
        t.missing("gateway (`putex serve`) under load", "both", dir, "gateway");
        return;
    };
    for store in ["nats", "sqlite"] {
        let f = &g[store];
        if f.is_null() {
            continue;
        }
        let waiters = num(f, "waiters");
        let served = num(f, "waiters_served");
        let in_order = f["waiters_in_order"].as_bool().unwrap_or(false);
        let peak = num(f, "peak_rss_mb");
        let sound = num(f, "lost") == 0.0 && num(f, "violations") == 0.0;
        t.row(
            &format!("gateway: {waiters:.0} requests waiting on one resource"),
            store,
            format!(
                "{served:.0} of {waiters:.0} served in {:.1} s (hand-off {} / p99 {}), {}; gateway RSS {:.0} MB \
                 all waiting, peak {peak:.0} MB; CPU {:.0} % while serving",
                num(f, "waiters_s"),
                ms(num(f, "waiters_handoff_p50_ms")),
                ms(num(f, "waiters_handoff_p99_ms")),
                if in_order { "in the listed order" } else { "NOT in the listed order" },
                num(f, "waiters_rss_mb"),
                num(f, "waiters_cpu_pct"),
            ),
            "all served in order, none lost; RSS ≤ 100 MB".into(),
            format!(
                "**{}**",
                verdict(served == waiters && in_order && sound && peak <= 100.0)
            ),
        );
        let p99 = num(f, "spread_acquire_p99_ms");
        t.row(
            "gateway: 200 acquire + release/s over 100 resources (open loop)",
            store,
            format!(
                "acquire {} / p99 {}, release {} / p99 {}; gateway CPU {:.0} %",
                ms(num(f, "spread_acquire_p50_ms")),
                ms(p99),
                ms(num(f, "spread_release_p50_ms")),
                ms(num(f, "spread_release_p99_ms")),
                num(f, "spread_cpu_pct"),
            ),
            if store == "nats" {
                "acquire p99 ≤ 20 ms".into()
            } else {
                "(no target)".into()
            },
            if store == "nats" {
                format!("{:.2}× — **{}**", p99 / 20.0, verdict(p99 <= 20.0))
            } else {
                String::new()
            },
        );
        t.row(
            "gateway: 50 clients in a loop on one resource",
            store,
            format!(
                "{:.0} grants/s, acquire {} / p99 {}; grants per client {:.0}–{:.0}; gateway CPU {:.0} %",
                num(f, "hammer_grants_per_s"),
                ms(num(f, "hammer_acquire_p50_ms")),
                ms(num(f, "hammer_acquire_p99_ms")),
                num(f, "hammer_min"),
                num(f, "hammer_max"),
                num(f, "hammer_cpu_pct"),
            ),
            "none lost, never two holders, tokens increase".into(),
            format!(
                "**{}** ({:.0} lost, {:.0} violations over all three)",
                verdict(sound),
                num(f, "lost"),
                num(f, "violations")
            ),
        );
    }
    t.note(
        "Gateway: `gateway_load`. One `putex serve` per store, driven over `/v1/` from one \
         process on the same machine (the load generator, the gateway and nats-server share \
         its cores); every grant is checked from the answers: none lost, never two holders \
         of a resource, tokens increasing.",
    );
}

#[derive(Default)]
struct Table {
    rows: Vec<[String; 5]>,
    notes: Vec<String>,
}

impl Table {
    fn row(&mut self, what: &str, store: &str, figure: String, target: String, ratio: String) {
        self.rows
            .push([what.to_owned(), store.to_owned(), figure, target, ratio]);
    }

    fn missing(&mut self, what: &str, store: &str, dir: &Path, name: &str) {
        self.row(
            what,
            store,
            "not measured".into(),
            String::new(),
            format!(
                "**failed**: no figures; see {}",
                dir.join(format!("{name}.log")).display()
            ),
        );
    }

    fn note(&mut self, n: &str) {
        self.notes.push(n.to_owned());
    }

    fn print(&self) {
        println!("| measure | store | figure | target | ratio / verdict |");
        println!("|---|---|---|---|---|");
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
            println!("| {} |", cells.join(" | "));
        }
    }
}

// ---------------------------------------------------------------------------
// Helpers.

fn read(dir: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "n/a".into()
    } else if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.0} ms")
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

/// The verdict of a target retired after its floor was measured (issue
/// 18's semaphore ratio and NATS lease CPU; `docs/performance.md`, "Two
/// targets retired, not failed"): its figure is still shown.
fn retired_unless_met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "retired (docs/performance.md: the floor under it)"
    }
}

/// The machine, in one paragraph.
fn machine(
    nats: Option<&Path>,
    load_start: Option<String>,
    seconds: Option<u64>,
    build: Option<u64>,
) -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = putex_testkit::procfs::cpu_model();
    let mem_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or("?".into(), |kb| format!("{:.0}", kb / 1024.0 / 1024.0));
    let output = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let kernel = output("uname", &["-r"]).unwrap_or_else(|| "?".into());
    let date = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into());
    let nats_version = nats
        .and_then(|n| output(&n.display().to_string(), &["--version"]))
        .and_then(|v| v.rsplit(' ').next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    let load_end: String = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "Machine: {cpus} CPU(s) ({cpu}), {mem_gb} GB, Linux {kernel}; nats-server {nats_version} \
         (single node, loopback, default fsync); release build. Load average {} at the start, \
         {load_end} at the end. Finished {date}{}.",
        load_start.as_deref().unwrap_or("?"),
        seconds
            .map(|s| format!(
                ", {}m{:02}s in all{}",
                s / 60,
                s % 60,
                build
                    .map(|b| format!(" ({b} s of it building)"))
                    .unwrap_or_default()
            ))
            .unwrap_or_default()
    )
}
