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
//! A process is in its scope before it runs anything: it is created there by
//! `clone3(CLONE_INTO_CGROUP)` ([`spawn_into`], Linux ≥ 5.7), or, on older
//! kernels, started as `/bin/sh -c 'echo $$ >"$0" || exit 125; exec "$@"'
//! <scope>/cgroup.procs ARGV…`, which moves itself and then `exec`s the real
//! command under the same pid ([`wrap_in_cgroup`]; the move costs an RCU grace
//! period, milliseconds). No process-wide state of the caller changes.
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

mod cgroup;
mod procfs;
mod snapshot;
mod spawn;
#[cfg(test)]
mod tests;

pub use cgroup::{cgroup2_mount, unified_cgroup_path, wrap_in_cgroup, Cgroup, CgroupRoot};
use procfs::own_children;
pub use procfs::{descendants, pids_matching, proc_entry, proc_table, ProcEntry, ProcId};
pub use snapshot::{TreeInfo, TreeSnapshot};
pub use spawn::{child_environment, spawn_into, DirectChild, Output, SpawnError, Spawned};

/// How often a stop looks whether the tree is empty yet.
const POLL: Duration = Duration::from_millis(2);

/// Exit status of the scope wrapper when it could not enter the cgroup.
pub const CGROUP_ENTER_FAILED: i32 = 125;

/// Errors of process-tree control.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A cgroup file or directory could not be read or written.
    #[error("cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was attempted.
        what: &'static str,
        source: Errno,
    },
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
///
/// Only this process's children are looked at (`procfs::own_children`); the
/// whole process table only where the kernel does not list them.
pub fn reap_orphans() -> Vec<(i32, WaitStatus)> {
    let claimed = CLAIMED.lock().clone();
    let children = own_children().unwrap_or_else(|| {
        let me = std::process::id() as i32;
        proc_table()
            .into_iter()
            .filter(|e| e.ppid == me && e.is_dead())
            .map(|e| e.pid)
            .collect()
    });
    let mut out = Vec::new();
    for pid in children {
        if claimed.contains(&pid) {
            continue;
        }
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => {}
            Ok(status) => out.push((pid, status)),
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
