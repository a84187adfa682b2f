//! The result table: one row per scenario, then `N passed, M failed`.
//!
//! A row sums its runs: faults injected, overlapping service intervals
//! (count and the longest), stale writes accepted and rejected by the fenced
//! resource, regressed tokens, failover p50/max against the bound plus the
//! margin, and transitions that no fault explains. The verdict column says
//! `pass`, `FAIL` (with the reasons printed below the table), `skip` (with
//! why) or `pass*` for a row whose scenario breaks an assumption of `docs/safety.md`
//! on purpose: it passes when no stale write was accepted, overlaps or not.

use std::fmt::Write as _;
use std::time::Duration;

use crate::check::percentile;

/// One scenario's results over its runs.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The scenario.
    pub name: String,
    /// Which fault of the issue (e.g. `1`, `8`).
    pub fault_no: String,
    /// Runs done.
    pub runs: usize,
    /// Faults injected.
    pub faults: usize,
    /// Overlapping pairs of services.
    pub overlaps: usize,
    /// The longest overlap.
    pub overlap_max: Duration,
    /// Stale writes accepted.
    pub stale_accepted: usize,
    /// Stale writes rejected.
    pub stale_rejected: usize,
    /// Starts with a token not above an earlier one.
    pub regressed: usize,
    /// Failover times measured.
    pub failovers: Vec<Duration>,
    /// The bound B (None: not judged).
    pub bound: Option<Duration>,
    /// What is allowed above B.
    pub margin: Duration,
    /// Starts that no fault explains (None: not counted).
    pub spurious: Option<usize>,
    /// Set when the scenario breaks an assumption on purpose: which.
    pub broken: Option<String>,
    /// Why the row failed (empty: passed).
    pub failures: Vec<String>,
    /// Why it was skipped.
    pub skipped: Option<String>,
    /// Things worth knowing (fault evidence, recovery times).
    pub notes: Vec<String>,
    /// Failovers slower than allowed (also in `failures`).
    pub slow: usize,
    /// A timing-only failure was run again (`--quick`), and the row is
    /// judged on the new run.
    pub retried: bool,
}

impl Row {
    /// The verdict word.
    pub fn verdict(&self) -> &'static str {
        if self.skipped.is_some() {
            "skip"
        } else if !self.failures.is_empty() {
            "FAIL"
        } else if self.broken.is_some() {
            "pass*"
        } else if self.retried {
            "pass (retried)"
        } else {
            "pass"
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{}", d.as_millis())
}

/// The table, the failures and notes under it, and the last line.
pub fn render(rows: &[Row]) -> String {
    let head = [
        "scenario",
        "fault",
        "runs",
        "faults",
        "overlaps",
        "stale acc",
        "stale rej",
        "regressed",
        "failover p50/max (B+m) ms",
        "spurious",
        "result",
    ];
    let mut cells: Vec<Vec<String>> = Vec::new();
    for r in rows {
        let failover = match (
            percentile(&r.failovers, 50),
            percentile(&r.failovers, 100),
            r.bound,
        ) {
            (Some(p50), Some(max), Some(b)) => {
                format!("{}/{} ({}+{})", ms(p50), ms(max), ms(b), ms(r.margin))
            }
            (Some(p50), Some(max), None) => format!("{}/{} (-)", ms(p50), ms(max)),
            _ => "-".into(),
        };
        let overlaps = if r.overlaps > 0 {
            format!("{} ({} ms)", r.overlaps, r.overlap_max.as_millis())
        } else {
            "0".into()
        };
        let skipped = r.skipped.is_some();
        let num = |n: usize| {
            if skipped {
                "-".to_owned()
            } else {
                n.to_string()
            }
        };
        cells.push(vec![
            r.name.clone(),
            r.fault_no.clone(),
            num(r.runs),
            num(r.faults),
            if skipped { "-".into() } else { overlaps },
            num(r.stale_accepted),
            num(r.stale_rejected),
            num(r.regressed),
            failover,
            r.spurious.map_or("-".into(), |s| s.to_string()),
            r.verdict().into(),
        ]);
    }
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (i, c) in row.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cols: &[String]| {
        let mut s = String::from("|");
        for (i, c) in cols.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            let _ = write!(s, " {c}{} |", " ".repeat(pad));
        }
        s.push('\n');
        s
    };
    let mut out = line(&head.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    out.push_str(&line(
        &width.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
    ));
    for row in &cells {
        out.push_str(&line(row));
    }
    let mut extra = String::new();
    for r in rows {
        if let Some(b) = &r.broken {
            let _ = writeln!(extra, "  {}: assumption broken: {b}", r.name);
        }
        if let Some(s) = &r.skipped {
            let _ = writeln!(extra, "  {}: skipped: {s}", r.name);
        }
        for f in &r.failures {
            let _ = writeln!(extra, "  {}: FAILED: {f}", r.name);
        }
        for n in &r.notes {
            let _ = writeln!(extra, "  {}: {n}", r.name);
        }
    }
    if !extra.is_empty() {
        out.push('\n');
        out.push_str(&extra);
    }
    let passed = rows
        .iter()
        .filter(|r| r.skipped.is_none() && r.failures.is_empty())
        .count();
    let failed = rows.iter().filter(|r| !r.failures.is_empty()).count();
    let skipped = rows.iter().filter(|r| r.skipped.is_some()).count();
    out.push('\n');
    if skipped > 0 {
        let _ = writeln!(out, "{skipped} skipped");
    }
    let _ = writeln!(out, "{passed} passed, {failed} failed");
    out
}
