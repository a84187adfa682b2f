//! `chaos`: the fault-injection suite of putex (`scripts/chaos`).
//!
//! Real processes on this machine: three `putex run` agents (or three
//! `putex lock` clients in loops), a nats-server (one node, or a 3-node
//! JetStream cluster with an R3 bucket), and a **fenced resource owned by
//! the harness** ([`resource`]): a TCP service that accepts writes tagged
//! with a fencing token, rejects tokens lower than the highest it accepted,
//! and logs every start, write and stop on the harness's own clock. Each
//! agent's service is this binary in `service` mode: it says `start NODE
//! TOKEN PID`, writes every 50 ms, and its connection's end tells the
//! harness when it stopped, however it died.
//!
//! Each agent reaches the store through its own TCP proxy
//! (`putex_testkit::proxy`, shared with putex's tests), so a fault can
//! cut off, reset, hold or delay one agent. Other faults are signals
//! (host crash, `kill -9` of the agent, SIGSTOP), store faults (nats-server
//! paused, killed and restarted, the stream leader killed, the bucket
//! re-created) and clock faults (libfaketime: rates and jumps).
//!
//! The checkers ([`check`]) read the recorded history only: overlapping
//! services, stale writes accepted or rejected, regressed tokens, failover
//! time against the bound B, transitions that no fault explains. The table
//! ([`report`]) has one row per scenario ([`scenarios`]) and ends with
//! `N passed, M failed`; the exit status is 1 on any violation.
//!
//! ```text
//! chaos --putex PATH [--quick] [--seed N] [--scenario NAME]... [--runs N]
//!       [--margin-ms M] [--self-test] [--list] [--keep]
//! chaos service ADDR [--every DUR] [--for DUR] [--kv PUTEX]   (the agents' child)
//! ```

mod agents;
mod check;
mod cluster;
mod faults;
mod report;
mod resource;
mod scenarios;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use report::Row;
use scenarios::Ctx;

fn usage() -> ExitCode {
    eprintln!(
        "usage: chaos --putex PATH [--quick] [--seed N] [--scenario NAME]... [--runs N] \
         [--margin-ms M] [--self-test] [--list] [--keep]\n       chaos service ADDR [--every DUR] [--for DUR] [--kv PUTEX]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "service") {
        return service(&args[1..]);
    }
    let mut putex: Option<PathBuf> = None;
    let mut quick = false;
    let mut seed: u64 = 1;
    let mut names: Vec<String> = Vec::new();
    let mut runs: Option<usize> = None;
    let mut margin = Duration::from_millis(100);
    let mut self_test = false;
    let mut list = false;
    let mut keep = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = || it.next();
        match a.as_str() {
            "--putex" => putex = value().map(PathBuf::from),
            "--quick" => quick = true,
            "--seed" => match value().and_then(|v| v.parse().ok()) {
                Some(s) => seed = s,
                None => return usage(),
            },
            "--scenario" => match value() {
                Some(n) => names.extend(n.split(',').map(str::to_owned)),
                None => return usage(),
            },
            "--runs" => match value().and_then(|v| v.parse().ok()).filter(|n| *n > 0) {
                Some(n) => runs = Some(n),
                None => return usage(),
            },
            "--margin-ms" => match value().and_then(|v| v.parse().ok()) {
                Some(m) => margin = Duration::from_millis(m),
                None => return usage(),
            },
            "--self-test" => self_test = true,
            "--list" => list = true,
            "--keep" => keep = true,
            _ => return usage(),
        }
    }
    let all = scenarios::all();
    if list {
        for s in &all {
            println!("{:<20} fault {:<8} {}", s.name, s.fault_no, s.about);
        }
        return ExitCode::SUCCESS;
    }
    for n in &names {
        if !all.iter().any(|s| s.name == n) {
            eprintln!("chaos: no scenario {n:?} (see --list)");
            return ExitCode::from(2);
        }
    }
    let Some(putex) = putex.filter(|p| p.is_file()) else {
        eprintln!("chaos: --putex PATH (the putex binary under test) is required");
        return usage();
    };
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chaos: cannot find my own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/chaos");
    let _ = std::fs::create_dir_all(&root);
    let root = root.canonicalize().unwrap_or(root);
    let ctx = match Ctx::new(putex, me, quick, seed, runs, root, margin) {
        Ok(mut c) => {
            c.keep = keep;
            c
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    println!(
        "chaos: putex {} ({}), seed {seed}, {} mode, failover margin {} ms",
        ctx.putex.display(),
        version(&ctx),
        if quick { "quick" } else { "full" },
        margin.as_millis()
    );
    println!(
        "host: {} CPU(s), load average {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!("{}", faults::probe_netns());
    match &ctx.faketime {
        Ok(p) => println!("libfaketime: {}", p.display()),
        Err(e) => println!("libfaketime: clock scenarios skipped: {e}"),
    }

    let mut rows: Vec<Row> = Vec::new();
    if self_test || quick {
        rows.push(run_self_test(&ctx));
    }
    if !self_test || !names.is_empty() {
        for s in all
            .iter()
            .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name))
        {
            rows.push(scenarios::run(&ctx, s));
        }
    }
    println!();
    print!("{}", report::render(&rows));
    println!("chaos: {:.0} s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&ctx.work);
    if rows.iter().any(|r| !r.failures.is_empty()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn version(ctx: &Ctx) -> String {
    std::process::Command::new(&ctx.putex)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Proves the checkers can fail: synthetic histories with a known violation
/// each, then one real run with a deliberately broken configuration (the
/// holder's clock ×0.5, far beyond ε) judged as if it were within the
/// assumptions, which the table must flag as an overlap.
fn run_self_test(ctx: &Ctx) -> Row {
    let mut row = Row {
        name: "self-test".into(),
        fault_no: "-".into(),
        margin: ctx.margin,
        ..Row::default()
    };
    for f in check::self_test() {
        row.failures.push(format!("checker missed: {f}"));
    }
    row.notes.push(
        "synthetic histories: overlap, open overlap, stale accept (superseded and below), \
         regressed token, missing failover: every checker flagged its own"
            .into(),
    );
    let Some(sc) = scenarios::all()
        .into_iter()
        .find(|s| s.name == "clock-slow-holder")
    else {
        return row;
    };
    if let Some(why) = (sc.skip)(ctx) {
        row.notes
            .push(format!("real broken-config run skipped: {why}"));
        return row;
    }
    // The same scenario, but judged as if its clocks were within ε.
    let honest = scenarios::Scenario {
        broken: None,
        provokes_stale: false,
        zero_transitions: false,
        ..sc
    };
    // Whether a run overlaps depends on where the holder is in its round
    // when the fault hits: a few tries, each with its own seed, must catch
    // at least one (the broken rule shows; a checker that cannot fail
    // never would).
    const TRIES: u64 = 5;
    for attempt in 0..TRIES {
        let seed = ctx.seed.wrapping_add(attempt);
        let mut rng = faults::Rng::new(seed);
        eprintln!(
            "chaos: self-test: a real run with the holder's clock ×0.5, judged as if within ε \
             (try {} of {TRIES}) …",
            attempt + 1
        );
        match (honest.run)(ctx, &mut rng) {
            Ok(out) => {
                let mut probe = Row::default();
                scenarios::judge(&honest, &out, &mut probe, seed);
                row.runs += 1;
                row.faults += out.faults;
                let caught = probe.overlaps > 0 && !probe.failures.is_empty();
                row.notes.push(format!(
                    "broken config (holder ×0.5 judged as within ε), try {}: {} overlap(s), \
                     longest {} ms, {} stale write(s) rejected, {} accepted: {}",
                    attempt + 1,
                    probe.overlaps,
                    probe.overlap_max.as_millis(),
                    probe.stale_rejected,
                    probe.stale_accepted,
                    if caught {
                        "flagged, as it must be"
                    } else {
                        "no overlap this time"
                    }
                ));
                let _ = std::fs::remove_dir_all(&out.dir);
                if caught {
                    return row;
                }
            }
            Err(e) => {
                row.failures.push(format!("broken-config run: {e}"));
                return row;
            }
        }
    }
    row.failures.push(format!(
        "the broken configuration produced no overlap the checkers flagged in {TRIES} tries"
    ));
    row
}

fn service(args: &[String]) -> ExitCode {
    let Some(addr) = args.first() else {
        return usage();
    };
    let mut every = Duration::from_millis(50);
    let mut run_for = None;
    let mut kv = None;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let Some(v) = it.next() else {
            return usage();
        };
        match (a.as_str(), humantime::parse_duration(v).ok()) {
            ("--every", Some(d)) => every = d,
            ("--for", Some(d)) => run_for = Some(d),
            ("--kv", _) => kv = Some(PathBuf::from(v)),
            _ => return usage(),
        }
    }
    let code = resource::service(addr, every, run_for, kv.as_deref());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
