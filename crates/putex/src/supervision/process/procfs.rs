//! `/proc`: the process table, a process's start time (so a reused pid is
//! never mistaken for it), and the descendants of a process.

use super::*;

/// One line of `/proc/<pid>/stat`, the fields tree walking needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// Process group id.
    pub pgid: i32,
    /// Session id.
    pub session: i32,
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Start time, in clock ticks since boot: with the pid, it names the
    /// process for good (a pid is reused, a (pid, start) pair is not).
    pub start: u64,
}

impl ProcEntry {
    /// Parses `/proc/<pid>/stat`; the command name may contain anything, so
    /// fields are counted after its closing parenthesis.
    pub fn parse(stat: &str) -> Option<ProcEntry> {
        let (head, tail) = stat.rsplit_once(')')?;
        let pid = head.split_whitespace().next()?.parse().ok()?;
        let mut f = tail.split_whitespace();
        let state = f.next()?.chars().next()?;
        let ppid = f.next()?.parse().ok()?;
        let pgid = f.next()?.parse().ok()?;
        let session = f.next()?.parse().ok()?;
        // Field 22 of stat(5); this iterator stands at field 7.
        let start = f.nth(15)?.parse().ok()?;
        Some(ProcEntry {
            pid,
            ppid,
            pgid,
            session,
            state,
            start,
        })
    }

    /// This process as it can be found again ([`ProcId`]).
    pub fn id(&self) -> ProcId {
        ProcId {
            pid: self.pid,
            start: self.start,
        }
    }

    /// Whether the process has exited (a zombie or dead task).
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Pids of live processes (other than this one) whose command line
/// contains `needle`, e.g. a keeper's socket directory. A child with its
/// parent's very command line is left out: it is forked but not yet
/// replaced by its program (a hook or service about to start).
pub fn pids_matching(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let matching: Vec<(ProcEntry, String)> = proc_table()
        .into_iter()
        .filter(|e| !e.is_dead() && e.pid != me)
        .filter_map(|e| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", e.pid)).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some((e, cmdline))
        })
        .collect();
    matching
        .iter()
        .filter(|(e, cmdline)| {
            !matching
                .iter()
                .any(|(p, parent)| p.pid == e.ppid && parent == cmdline)
        })
        .map(|(e, _)| e.pid)
        .collect()
}

/// Every process on the host, from `/proc`.
pub fn proc_table() -> Vec<ProcEntry> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let name = e.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        ProcEntry::parse(&fs::read_to_string(e.path().join("stat")).ok()?)
    })
    .collect()
}

/// The children of this process (of all its threads, orphans re-parented
/// to it as a subreaper included), from `/proc/self/task/*/children`: a
/// few small reads where [`proc_table`] reads every process on the host.
/// `None` when the kernel does not offer those files
/// (`CONFIG_PROC_CHILDREN`).
pub fn own_children() -> Option<Vec<i32>> {
    let mut out = Vec::new();
    for task in fs::read_dir("/proc/self/task").ok()? {
        let list = fs::read_to_string(task.ok()?.path().join("children")).ok()?;
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    Some(out)
}

/// All descendants of `root` in `table` (not `root` itself), by parent links.
pub fn descendants(table: &[ProcEntry], root: i32) -> Vec<ProcEntry> {
    let mut children: HashMap<i32, Vec<&ProcEntry>> = HashMap::new();
    for e in table {
        children.entry(e.ppid).or_default().push(e);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if c.pid != root {
                out.push(**c);
                stack.push(c.pid);
            }
        }
    }
    out
}

/// A process as it can be found again: its pid and start time. A pid is
/// reused once its process is gone; the pair is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcId {
    /// Process id.
    pub pid: i32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub start: u64,
}

impl ProcId {
    /// The process `pid` as it is now, if it lives.
    pub fn of(pid: i32) -> Option<ProcId> {
        proc_entry(pid).filter(|e| !e.is_dead()).map(|e| e.id())
    }
}

/// One process's `/proc/<pid>/stat`, if it exists.
pub fn proc_entry(pid: i32) -> Option<ProcEntry> {
    ProcEntry::parse(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}
