//! Process-tree control: whatever a service or hook starts, putex can stop.
//!
//! "Stopped" means every descendant is gone, including ones that called
//! `setsid` or double-forked (`docs/supervision.md`, "Process trees: cgroup scope or subreaper"). Two
//! mechanisms give that, chosen per tree:
//!
//! - **A cgroup v2 scope** ([`Cgroup`]) when one can be created: the cgroup2
//!   mount is found in `/proc/self/mountinfo` (on hybrid hosts it is
//!   `/sys/fs/cgroup/unified`, not `/sys/fs/cgroup`), and scopes are created
//!   as children of the cgroup the caller already runs in ([`CgroupRoot`]).
//!   Nothing can leave a cgroup without privileges, so `cgroup.procs` *is* the
//!   tree. It is killed with `cgroup.kill` (Linux ≥ 5.14), or on older kernels
//!   by freezing it, killing every member and thawing it.
//! - **The keeper as child subreaper** ([`set_child_subreaper`]) otherwise: an
//!   orphaned descendant is re-parented to the keeper instead of init, so the
//!   tree is every descendant of the keeper ([`Tree::Subreaper`]), found by
//!   walking parent links in `/proc`. Each tree also runs in its own process
//!   group.
//!
//! A process is put into a scope before it runs anything: it is started as
//! `/bin/sh -c 'echo $$ >"$0" || exit 125; exec "$@"' <scope>/cgroup.procs
//! ARGV…`, which moves itself and then `exec`s the real command under the same
//! pid ([`wrap_in_cgroup`]). No process-wide state of the caller changes.
//!
//! Reaping: the keeper, as a subreaper, inherits zombies it never spawned;
//! [`reap_orphans`] collects them without stealing the exit status of a child
//! someone else (tokio's process driver) waits for — those are [`claim`]ed.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How often a stop looks whether the tree is empty yet.
const POLL: Duration = Duration::from_millis(2);

/// Exit status of the scope wrapper when it could not enter the cgroup.
pub const CGROUP_ENTER_FAILED: i32 = 125;

/// Errors of process-tree control.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A cgroup file or directory could not be read or written.
    #[error("cgroup {path}: {source}")]
    Cgroup {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was attempted.
        what: &'static str,
        /// The errno.
        source: Errno,
    },
}

fn cg_err(path: &Path) -> impl FnOnce(io::Error) -> ProcessError + '_ {
    move |source| ProcessError::Cgroup {
        path: path.to_path_buf(),
        source,
    }
}

/// The cgroup2 mount point in a `/proc/self/mountinfo` text, if any.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = pre.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The unified-hierarchy path (`0::/path`) in a `/proc/<pid>/cgroup` text.
pub fn unified_cgroup_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// Where this process may create cgroup scopes: the cgroup2 directory of the
/// cgroup it runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRoot {
    dir: PathBuf,
}

impl CgroupRoot {
    /// Finds the cgroup2 mount and this process's cgroup in it. `None` when
    /// there is no cgroup2 mount, the process's cgroup cannot be read, or its
    /// directory is not writable (creating a scope is then impossible).
    pub fn detect() -> Option<CgroupRoot> {
        let mount = cgroup2_mount(&fs::read_to_string("/proc/self/mountinfo").ok()?)?;
        let own = unified_cgroup_path(&fs::read_to_string("/proc/self/cgroup").ok()?)?;
        let dir = mount.join(own.trim_start_matches('/'));
        if !dir.join("cgroup.procs").exists() {
            return None;
        }
        nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).ok()?;
        Some(CgroupRoot { dir })
    }

    /// The directory scopes are created in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the scope `name` (a fresh, empty child cgroup). A leftover
    /// empty scope of the same name is removed first.
    pub fn create(&self, name: &str) -> Result<Cgroup, ProcessError> {
        let path = self.dir.join(name);
        if path.exists() {
            // A stale, empty scope from an earlier run; a populated one is an error.
            fs::remove_dir(&path).map_err(cg_err(&path))?;
        }
        fs::create_dir(&path).map_err(cg_err(&path))?;
        Ok(Cgroup { path })
    }
}

/// A cgroup v2 scope that holds one process tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// A handle on an existing scope (e.g. one a dead keeper created).
    pub fn open(path: impl Into<PathBuf>) -> Cgroup {
        Cgroup { path: path.into() }
    }

    /// The scope's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The pids in the scope.
    pub fn procs(&self) -> Result<Vec<i32>, ProcessError> {
        let p = self.file("cgroup.procs");
        let text = fs::read_to_string(&p).map_err(cg_err(&p))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Whether any live process is in the scope (`cgroup.events`). A scope
    /// that no longer exists is empty.
    pub fn populated(&self) -> Result<bool, ProcessError> {
        let p = self.file("cgroup.events");
        match fs::read_to_string(&p) {
            Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 1")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(cg_err(&p)(e)),
        }
    }

    /// Whether the kernel offers `cgroup.kill` (Linux ≥ 5.14).
    pub fn has_kill(&self) -> bool {
        self.file("cgroup.kill").exists()
    }

    /// Sends `sig` to every process in the scope.
    pub fn signal(&self, sig: Signal) -> Result<(), ProcessError> {
        for pid in self.procs()? {
            signal_pid(pid, sig);
        }
        Ok(())
    }

    /// SIGKILLs every process in the scope, including ones forking right now:
    /// `cgroup.kill` where the kernel has it, otherwise freeze, kill each
    /// member, thaw.
    pub fn kill(&self) -> Result<(), ProcessError> {
        if !self.populated()? {
            return Ok(());
        }
        if self.has_kill() {
            let p = self.file("cgroup.kill");
            return fs::write(&p, "1").map_err(cg_err(&p));
        }
        let freeze = self.file("cgroup.freeze");
        let frozen = fs::write(&freeze, "1").is_ok();
        if frozen {
            // Freezing is asynchronous; give it a moment so nothing forks
            // between listing and killing. Killing works on frozen tasks.
            for _ in 0..50 {
                let events = fs::read_to_string(self.file("cgroup.events")).unwrap_or_default();
                if events.lines().any(|l| l.trim() == "frozen 1") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let result = self.signal(Signal::SIGKILL);
        if frozen {
            let _ = fs::write(&freeze, "0");
        }
        result
    }

    /// Removes the scope if it is empty. Removing a scope that is gone
    /// already is fine.
    pub fn remove(&self) -> Result<(), ProcessError> {
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(cg_err(&self.path)(e)),
        }
    }
}

/// Prefixes `argv` so that the process moves itself into `cgroup` before it
/// `exec`s the real command (same pid). Exits [`CGROUP_ENTER_FAILED`] if the
/// move fails.
pub fn wrap_in_cgroup(cgroup: &Cgroup, argv: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("echo $$ >\"$0\" || exit {CGROUP_ENTER_FAILED}; exec \"$@\"").into(),
        cgroup.file("cgroup.procs").into_os_string(),
    ];
    out.extend(argv.iter().cloned());
    out
}

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
/// contains `needle`, e.g. a keeper's socket directory.
pub fn pids_matching(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    proc_table()
        .into_iter()
        .filter(|e| !e.is_dead() && e.pid != me)
        .filter(|e| {
            std::fs::read(format!("/proc/{}/cmdline", e.pid))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .map(|e| e.pid)
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

/// Where a tree lives, in a form another process can act on (the agent after
/// its keeper died).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TreeInfo {
    /// The cgroup scope directory.
    Cgroup(PathBuf),
    /// The process group of the tree's first process.
    ProcessGroup(i32),
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

/// Everything needed to find a service's process tree again without the
/// process that owns it — the agent's fallback when its keeper died, and a
/// restarted agent's check at start-up (S5).
///
/// In the subreaper fallback the tree is "every descendant of the keeper":
/// once the keeper is gone, orphans re-parent to init and that view is
/// lost. The snapshot keeps what still identifies them then: each member
/// ([`ProcId`], so a reused pid is never taken for it), and the process
/// groups and sessions they ran in — a new process of the tree that stayed
/// in its group or session is found through them, even if it started after
/// the snapshot. A group or session counts only while its leader is gone or
/// still the same process (its id cannot be handed out again while any
/// member lives). A cgroup scope, when there was one, is the tree itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSnapshot {
    /// The cgroup scope, if the tree ran in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    /// The living members when the snapshot was taken.
    #[serde(default)]
    pub members: Vec<ProcId>,
    /// Process groups of the tree, each named by its leader.
    #[serde(default)]
    pub groups: Vec<ProcId>,
    /// Sessions of the tree, each named by its leader.
    #[serde(default)]
    pub sessions: Vec<ProcId>,
}

impl TreeSnapshot {
    /// The snapshot of `tree` now: its members, and the groups and
    /// sessions they run in (named by their leaders, when those live).
    pub fn capture(tree: &Tree) -> TreeSnapshot {
        let table = proc_table();
        let by_pid: HashMap<i32, &ProcEntry> = table.iter().map(|e| (e.pid, e)).collect();
        let mut members = BTreeSet::new();
        let mut groups = BTreeSet::new();
        let mut sessions = BTreeSet::new();
        for pid in tree.members() {
            let Some(e) = by_pid.get(&pid).filter(|e| !e.is_dead()) else {
                continue;
            };
            members.insert(e.id());
            for (set, leader) in [(&mut groups, e.pgid), (&mut sessions, e.session)] {
                // A leader that is gone is recorded with start 0: nothing
                // can reuse its id while the group or session lives.
                let start = by_pid.get(&leader).map_or(0, |l| l.start);
                set.insert(ProcId { pid: leader, start });
            }
        }
        TreeSnapshot {
            cgroup: match tree {
                Tree::Cgroup(cg) => Some(cg.path().to_path_buf()),
                _ => None,
            },
            members: members.into_iter().collect(),
            groups: groups.into_iter().collect(),
            sessions: sessions.into_iter().collect(),
        }
    }

    /// Whether the snapshot names nothing at all.
    pub fn is_empty(&self) -> bool {
        self.cgroup.is_none() && self.members.is_empty()
    }

    /// The living processes of the tree in `table`: the members still the
    /// same processes, everything in the tree's groups and sessions (whose
    /// leader is gone or unchanged), every descendant of those, and the
    /// cgroup's members. Never this process, its ancestors or pid 1.
    pub fn survivors(&self, table: &[ProcEntry]) -> Vec<i32> {
        let live: HashMap<i32, &ProcEntry> = table
            .iter()
            .filter(|e| !e.is_dead())
            .map(|e| (e.pid, e))
            .collect();
        // A group or session is ours while its leader is gone, or is still
        // the process that led it.
        let ours = |ids: &[ProcId]| -> BTreeSet<i32> {
            ids.iter()
                .filter(|l| {
                    live.get(&l.pid)
                        .is_none_or(|e| l.start != 0 && e.start == l.start)
                })
                .map(|l| l.pid)
                .collect()
        };
        let groups = ours(&self.groups);
        let sessions = ours(&self.sessions);
        let mut found: BTreeSet<i32> = self
            .members
            .iter()
            .filter(|m| live.get(&m.pid).is_some_and(|e| e.start == m.start))
            .map(|m| m.pid)
            .collect();
        for e in live.values() {
            if groups.contains(&e.pgid) || sessions.contains(&e.session) {
                found.insert(e.pid);
            }
        }
        if let Some(cg) = &self.cgroup {
            found.extend(Cgroup::open(cg).procs().unwrap_or_default());
        }
        let roots: Vec<i32> = found.iter().copied().collect();
        for root in roots {
            found.extend(
                descendants(table, root)
                    .into_iter()
                    .filter(|e| !e.is_dead())
                    .map(|e| e.pid),
            );
        }
        for spared in protected(table) {
            found.remove(&spared);
        }
        found.into_iter().collect()
    }

    /// Kills the whole tree (SIGKILL, again and again, for whatever
    /// appears) and waits up to `within` for nothing of it to live. Returns
    /// whether that was proven.
    pub async fn kill(&self, within: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            if let Some(cg) = &self.cgroup {
                let cg = Cgroup::open(cg);
                if cg.populated().unwrap_or(true) {
                    let _ = cg.kill();
                }
            }
            let survivors = self.survivors(&proc_table());
            if survivors.is_empty() && !self.cgroup_populated() {
                return true;
            }
            for pid in &survivors {
                signal_pid(*pid, Signal::SIGKILL);
            }
            if start.elapsed() >= within {
                tracing::error!(
                    survivors = ?survivors,
                    "the service's processes survive SIGKILL (uninterruptible sleep?); stop not proven"
                );
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn cgroup_populated(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(|cg| Cgroup::open(cg).populated().unwrap_or(true))
    }
}

/// Processes a tree kill must never touch: this one, its ancestors, pid 1.
fn protected(table: &[ProcEntry]) -> BTreeSet<i32> {
    let parents: HashMap<i32, i32> = table.iter().map(|e| (e.pid, e.ppid)).collect();
    let mut out = BTreeSet::from([1]);
    let mut pid = std::process::id() as i32;
    while pid > 1 && out.insert(pid) {
        pid = parents.get(&pid).copied().unwrap_or(0);
    }
    out
}

/// A process tree that can be signalled as a whole and observed to be empty.
#[derive(Clone, Debug)]
pub enum Tree {
    /// Everything in a cgroup v2 scope.
    Cgroup(Cgroup),
    /// `root`, its living descendants and its process group. Without a
    /// subreaper, a double-forked orphan escapes this view; it is what hooks
    /// run by a process that is not a subreaper get when no cgroup is usable.
    Pids {
        /// The first process of the tree; also its process group id.
        root: i32,
    },
    /// Every descendant of `reaper`, which must be a child subreaper, so that
    /// orphans re-parent to it rather than leave the tree.
    Subreaper {
        /// The subreaper (the keeper itself).
        reaper: i32,
    },
}

impl Tree {
    /// The pids of the tree's living members.
    pub fn members(&self) -> Vec<i32> {
        match self {
            Tree::Cgroup(cg) => cg.procs().unwrap_or_default(),
            Tree::Pids { root } => {
                let table = proc_table();
                let mut set: BTreeSet<i32> = descendants(&table, *root)
                    .into_iter()
                    .filter(|e| !e.is_dead())
                    .map(|e| e.pid)
                    .collect();
                for e in &table {
                    if !e.is_dead() && (e.pid == *root || e.pgid == *root) {
                        set.insert(e.pid);
                    }
                }
                set.into_iter().collect()
            }
            Tree::Subreaper { reaper } => descendants(&proc_table(), *reaper)
                .into_iter()
                .filter(|e| !e.is_dead())
                .map(|e| e.pid)
                .collect(),
        }
    }

    /// Whether every member is gone.
    pub fn is_empty(&self) -> bool {
        match self {
            Tree::Cgroup(cg) => {
                !cg.populated().unwrap_or(true) || cg.procs().is_ok_and(|p| p.is_empty())
            }
            _ => self.members().is_empty(),
        }
    }

    /// Sends `sig` to every member (and SIGCONT after SIGTERM/SIGINT/SIGHUP so
    /// stopped members can act on it).
    pub fn signal(&self, sig: Signal) {
        match self {
            Tree::Cgroup(cg) => {
                let _ = cg.signal(sig);
            }
            _ => {
                for pid in self.members() {
                    signal_pid(pid, sig);
                }
            }
        }
        if matches!(sig, Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP) {
            self.signal_quiet(Signal::SIGCONT);
        }
    }

    fn signal_quiet(&self, sig: Signal) {
        for pid in self.members() {
            signal_pid(pid, sig);
        }
    }

    /// SIGKILLs every member.
    pub fn kill(&self) {
        match self {
            Tree::Cgroup(cg) => {
                if let Err(e) = cg.kill() {
                    tracing::warn!(error = %e, "cgroup kill failed; killing members one by one");
                    let _ = cg.signal(Signal::SIGKILL);
                }
            }
            _ => self.signal_quiet(Signal::SIGKILL),
        }
    }

    /// Waits up to `within` for the tree to be empty, re-killing new members
    /// if `rekill` (a member may fork between a scan and its death).
    pub async fn wait_empty(&self, within: Duration, rekill: bool) -> bool {
        let start = std::time::Instant::now();
        loop {
            if self.is_empty() {
                return true;
            }
            if start.elapsed() >= within {
                return false;
            }
            if rekill {
                self.kill();
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM, wait up to `term_wait`, then SIGKILL and wait up to
    /// `kill_wait`. Returns whether the tree is empty: the proof of H6.
    pub async fn stop(&self, term_wait: Duration, kill_wait: Duration) -> bool {
        if self.is_empty() {
            return true;
        }
        self.signal(Signal::SIGTERM);
        if self.wait_empty(term_wait, false).await {
            return true;
        }
        self.kill();
        self.wait_empty(kill_wait, true).await
    }

    /// Where the tree lives, for another process.
    pub fn info(&self) -> TreeInfo {
        match self {
            Tree::Cgroup(cg) => TreeInfo::Cgroup(cg.path().to_path_buf()),
            Tree::Pids { root } => TreeInfo::ProcessGroup(*root),
            Tree::Subreaper { reaper } => TreeInfo::ProcessGroup(*reaper),
        }
    }
}

/// Sends a signal, ignoring processes that are gone already.
pub fn signal_pid(pid: i32, sig: Signal) {
    if pid <= 0 {
        return;
    }
    match kill(Pid::from_raw(pid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::debug!(pid, ?sig, error = %e, "signal failed"),
    }
}

/// Makes this process the child subreaper of its descendants.
pub fn set_child_subreaper() -> Result<(), ProcessError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|source| ProcessError::Sys {
        what: "prctl(PR_SET_CHILD_SUBREAPER)",
        source,
    })
}

/// Sets this process's `oom_score_adj` (−1000 exempts it from the OOM killer).
pub fn set_oom_score_adj(value: i32) -> io::Result<()> {
    fs::write("/proc/self/oom_score_adj", value.to_string())
}

/// Pids whose exit status belongs to someone else (tokio's process driver).
static CLAIMED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Marks `pid` as waited for by its spawner: [`reap_orphans`] leaves it alone.
/// Call it right after spawning, before the next `.await`.
pub fn claim(pid: i32) {
    CLAIMED.lock().insert(pid);
}

/// Undoes [`claim`] once the spawner has collected the exit status.
pub fn unclaim(pid: i32) {
    CLAIMED.lock().remove(&pid);
}

/// Reaps every exited child of this process that nobody [`claim`]ed, and
/// returns their statuses. Never blocks.
pub fn reap_orphans() -> Vec<(i32, WaitStatus)> {
    let me = std::process::id() as i32;
    let claimed = CLAIMED.lock().clone();
    let mut out = Vec::new();
    for e in proc_table() {
        if e.ppid == me && e.is_dead() && !claimed.contains(&e.pid) {
            match waitpid(Pid::from_raw(e.pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => {}
                Ok(status) => out.push((e.pid, status)),
            }
        }
    }
    out
}

/// The exit of a process as putex reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// The exit code, if it exited.
    pub code: Option<i32>,
    /// The signal number, if a signal ended it.
    pub signal: Option<i32>,
}

impl Exit {
    /// From a wait status; `None` for statuses that are not an end.
    pub fn from_wait(status: WaitStatus) -> Option<Exit> {
        match status {
            WaitStatus::Exited(_, code) => Some(Exit {
                code: Some(code),
                signal: None,
            }),
            WaitStatus::Signaled(_, sig, _) => Some(Exit {
                code: None,
                signal: Some(sig as i32),
            }),
            _ => None,
        }
    }

    /// From a std exit status.
    pub fn from_std(status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        Exit {
            code: status.code(),
            signal: status.signal(),
        }
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Forwards SIGINT, SIGTERM and SIGHUP received by this process to `forward`
/// (e.g. to the CMD of `putex lock`, through its keeper) until the returned
/// task is aborted.
pub fn forward_signals<F>(mut forward: F) -> io::Result<tokio::task::JoinHandle<()>>
where
    F: FnMut(Signal) + Send + 'static,
{
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        loop {
            let sig = tokio::select! {
                Some(()) = int.recv() => Signal::SIGINT,
                Some(()) = term.recv() => Signal::SIGTERM,
                Some(()) = hup.recv() => Signal::SIGHUP,
                else => return,
            };
            forward(sig);
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i32, ppid: i32, pgid: i32, session: i32, state: char) -> ProcEntry {
        ProcEntry {
            pid,
            ppid,
            pgid,
            session,
            state,
            start: 1000 + pid as u64,
        }
    }

    fn id(pid: i32) -> ProcId {
        ProcId {
            pid,
            start: 1000 + pid as u64,
        }
    }

    #[test]
    fn a_snapshot_finds_the_tree_after_its_keeper_died() {
        // The keeper (session 500, dead) ran the child 600 (group 600); the
        // child started 601 (same group) and 602, which called setsid and
        // double-forked into 603 (re-parented to init).
        let snap = TreeSnapshot {
            cgroup: None,
            members: vec![id(600), id(601), id(602)],
            groups: vec![id(600)],
            sessions: vec![id(500)],
        };
        let table = vec![
            entry(1, 0, 1, 1, 'S'),
            entry(600, 1, 600, 500, 'S'),
            entry(601, 600, 600, 500, 'S'),
            entry(603, 1, 602, 602, 'S'),
            // Started after the snapshot, still in the child's group.
            entry(604, 601, 600, 500, 'S'),
            // A grandchild of a member that moved to a group of its own.
            entry(605, 601, 605, 500, 'S'),
            // Unrelated.
            entry(700, 1, 700, 700, 'S'),
            entry(701, 700, 700, 700, 'S'),
        ];
        let mut found = snap.survivors(&table);
        found.sort();
        assert_eq!(found, vec![600, 601, 604, 605]);
        // 602 is gone; 603 left its group and session before the snapshot
        // saw it: only the newer snapshot that lists it finds it.
        let later = TreeSnapshot {
            members: vec![id(600), id(601), id(603)],
            ..snap.clone()
        };
        assert!(later.survivors(&table).contains(&603));
    }

    #[test]
    fn a_snapshot_never_takes_a_reused_pid_for_a_member() {
        let snap = TreeSnapshot {
            cgroup: None,
            members: vec![id(600)],
            groups: vec![id(600)],
            sessions: vec![ProcId { pid: 500, start: 0 }],
        };
        // Pid 600 and 500 now belong to other processes, leading groups and
        // sessions of their own.
        let table = vec![
            ProcEntry {
                start: 5,
                ..entry(600, 1, 600, 600, 'S')
            },
            entry(601, 600, 600, 600, 'S'),
            ProcEntry {
                start: 7,
                ..entry(500, 1, 500, 500, 'S')
            },
            entry(501, 500, 500, 500, 'S'),
        ];
        assert_eq!(snap.survivors(&table), Vec::<i32>::new());
        // Zombies are not survivors.
        let dead = vec![entry(600, 1, 600, 500, 'Z')];
        assert!(snap.survivors(&dead).is_empty());
    }

    #[test]
    fn a_snapshot_never_names_this_process_or_its_ancestors() {
        let me = std::process::id() as i32;
        let table = proc_table();
        let mine = table.iter().find(|e| e.pid == me).copied().unwrap();
        let snap = TreeSnapshot {
            cgroup: None,
            members: vec![mine.id()],
            groups: vec![ProcId {
                pid: mine.pgid,
                start: 0,
            }],
            sessions: vec![ProcId {
                pid: mine.session,
                start: 0,
            }],
        };
        let found = snap.survivors(&table);
        assert!(!found.contains(&me));
        assert!(!found.contains(&mine.ppid));
        assert!(!found.contains(&1));
    }

    #[test]
    fn finds_cgroup2_on_a_hybrid_host() {
        let mi = "25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                  31 25 0:27 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n\
                  41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n\
                  42 31 0:39 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        assert_eq!(
            cgroup2_mount(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("1 2 0:1 / /a\\040b rw - cgroup2 x rw"),
            Some(PathBuf::from("/a b"))
        );
        assert_eq!(
            cgroup2_mount("31 25 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro"),
            None
        );
    }

    #[test]
    fn reads_the_unified_cgroup_path() {
        let c = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/putex.service\n";
        assert_eq!(
            unified_cgroup_path(c).as_deref(),
            Some("/system.slice/putex.service")
        );
        assert_eq!(unified_cgroup_path("1:cpu:/\n"), None);
    }

    #[test]
    fn parses_stat_with_odd_command_names() {
        let e = ProcEntry::parse(
            "123 (a) b (c)) S 1 123 120 0 -1 4194560 86 0 0 0 0 0 0 0 20 0 1 0 987654 1 2",
        )
        .unwrap();
        assert_eq!(
            e,
            ProcEntry {
                pid: 123,
                ppid: 1,
                pgid: 123,
                session: 120,
                state: 'S',
                start: 987654,
            }
        );
        assert_eq!(ProcEntry::parse("123 (a) S 1 123 120 0"), None, "truncated");
        let me = std::process::id() as i32;
        let table = proc_table();
        assert!(table.iter().any(|e| e.pid == me));
        let d = descendants(
            &[
                entry(2, 1, 2, 2, 'S'),
                entry(3, 2, 2, 2, 'S'),
                entry(4, 3, 4, 4, 'Z'),
                entry(5, 9, 5, 5, 'S'),
            ],
            2,
        );
        assert_eq!(d.iter().map(|e| e.pid).collect::<Vec<_>>(), vec![3, 4]);
    }
}
