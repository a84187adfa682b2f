//! What identifies a service's tree for another process: its members,
//! process groups and sessions, and its cgroup, so that the agent can find
//! and kill it without the keeper.

use super::*;

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
    ///
    /// Reads the members' and their leaders' `/proc` entries only, not the
    /// whole process table: the keeper takes a snapshot at every change of
    /// its tree, on hosts with thousands of processes.
    pub fn capture(tree: &Tree) -> TreeSnapshot {
        let mut members = BTreeSet::new();
        let mut groups = BTreeSet::new();
        let mut sessions = BTreeSet::new();
        let mut leaders: HashMap<i32, u64> = HashMap::new();
        for pid in tree.members() {
            let Some(e) = proc_entry(pid).filter(|e| !e.is_dead()) else {
                continue;
            };
            members.insert(e.id());
            for (set, leader) in [(&mut groups, e.pgid), (&mut sessions, e.session)] {
                // A leader that is gone is recorded with start 0: nothing
                // can reuse its id while the group or session lives.
                let start = *leaders
                    .entry(leader)
                    .or_insert_with(|| proc_entry(leader).map_or(0, |l| l.start));
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
pub(super) fn protected(table: &[ProcEntry]) -> BTreeSet<i32> {
    let parents: HashMap<i32, i32> = table.iter().map(|e| (e.pid, e.ppid)).collect();
    let mut out = BTreeSet::from([1]);
    let mut pid = std::process::id() as i32;
    while pid > 1 && out.insert(pid) {
        pid = parents.get(&pid).copied().unwrap_or(0);
    }
    out
}
