//! What the benchmark examples report with: durations in milliseconds,
//! ratios and verdicts, the median and tail of a set of samples, the
//! machine they ran on, a Markdown table of the figures, and the `--json`
//! file; [`lock`] holds what the lock benchmarks (`lock_cost`,
//! `lock_process`, `lock_contention`) share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::procfs::load_average;

pub mod lock;

/// The fast profile's flags (R = 100 ms, F = 3, C = 1), as the benchmarks
/// pass them to `putex run`, `putex check` and `putex lock`.
pub const FAST: [&str; 6] = ["--renew", "100ms", "--failures", "3", "--confirm", "1"];

/// A duration in milliseconds for people: two decimals below 10 ms, one
/// above.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// Milliseconds as a number, for `--json`.
pub fn ms_f(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `a / b` (`b` of zero counts as the smallest positive number).
pub fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE)
}

/// Whether a target was met, as the tables say it.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// The median and tail of a set of samples (nearest rank).
pub struct Summary {
    /// The median.
    pub median: Duration,
    /// The 90th percentile.
    pub p90: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The largest sample.
    pub max: Duration,
}

impl Summary {
    /// The summary of `v`, which must not be empty.
    pub fn of(v: &[Duration]) -> Summary {
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

    /// `<median> / p99 <p99>`.
    pub fn med_p99(&self) -> String {
        format!("{} / p99 {}", ms(self.median), ms(self.p99))
    }

    /// `<median> / p90 <p90>`.
    pub fn med_p90(&self) -> String {
        format!("{} / p90 {}", ms(self.median), ms(self.p90))
    }

    /// The median alone.
    pub fn median_ms(&self) -> String {
        ms(self.median)
    }
}

/// The rows of a benchmark's summary: measure, store, figure, and a ratio
/// or notes.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 4]>,
}

impl Table {
    /// Adds a row.
    pub fn push(&mut self, what: &str, store: &str, figure: String, note: String) {
        self.rows
            .push([what.to_owned(), store.to_owned(), figure, note]);
    }

    /// Prints a Markdown table, ready for docs/performance.md.
    pub fn print(&self) {
        println!("| measure | store | figure | ratio / notes |");
        println!("|---|---|---|---|");
        for [a, b, c, d] in &self.rows {
            println!("| {a} | {b} | {c} | {d} |");
        }
    }
}

/// The machine a benchmark runs on, read at its start.
pub struct Machine {
    /// The CPUs this process may use.
    pub cpus: usize,
    /// The CPU's model name (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// The load averages at the start.
    pub load: String,
    /// What `nats-server --version` says, the version alone.
    pub nats_version: String,
}

impl Machine {
    /// Reads the machine, and the version of the nats-server binary `nats`.
    pub fn read(nats: &Path) -> Machine {
        let cpu_model = crate::procfs::cpu_model();
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

    /// `2 CPU(s), <model>, load average <load> at start`.
    pub fn describe(&self) -> String {
        format!(
            "{} CPU(s), {}, load average {} at start",
            self.cpus, self.cpu_model, self.load
        )
    }
}

/// A count given on the command line that must be at least 1 (`--iters`,
/// `--ops`): a parser for clap's `value_parser`.
pub fn at_least_one(arg: &str) -> Result<usize, String> {
    match arg.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The `putex` binary beside the running example (`<profile>/examples/…` →
/// `<profile>/putex`), built with cargo first when it is missing or older
/// than the example; an error names the binary and how to build it.
pub fn putex_beside_me() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let profile_dir = me
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not in <profile>/examples", me.display()))?
        .to_path_buf();
    let bin = profile_dir.join("putex");
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (mtime(&bin), mtime(&me)) {
        (Some(b), Some(e)) => b < e,
        _ => true,
    };
    if stale {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "putex", "--bin", "putex"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        eprintln!("building {} …", bin.display());
        if !cmd.status().is_ok_and(|s| s.success()) || !bin.is_file() {
            return Err(format!(
                "cannot build {}; build it with `cargo build --release -p putex` or pass \
                 --putex PATH",
                bin.display()
            ));
        }
    }
    Ok(bin)
}

/// Writes a benchmark's `--json` figures to `path`, pretty-printed; exits
/// with status 1 when it cannot.
pub fn write_json(path: &Path, figures: &serde_json::Value) {
    let text = serde_json::to_string_pretty(figures).expect("json");
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
}
