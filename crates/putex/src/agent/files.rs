//! Host-local files for (store, lock): the lock file that admits one agent
//! per lock and host (S5), and the state file that outlives the agent (the
//! previous instance, the boot id, the highest token seen for S6, the
//! service's tree).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use putex_core::Token;
use serde::{Deserialize, Serialize};

use super::AgentError;
use crate::supervision::keeper::socket_path;
use crate::supervision::process::TreeSnapshot;
/// Paths of the host-local files for (store, lock).
#[derive(Clone, Debug)]
pub struct LocalPaths {
    /// The keeper's socket.
    pub socket: PathBuf,
    /// The lock file (flock) that admits one agent per (store, lock).
    pub lock_file: PathBuf,
    /// The state file: previous instance, boot id, highest token.
    pub state_file: PathBuf,
}

impl LocalPaths {
    /// The paths in `dir` for `store_id` and `lock`.
    pub fn new(dir: &Path, store_id: &str, lock: &str) -> LocalPaths {
        let socket = socket_path(dir, store_id, lock);
        LocalPaths {
            lock_file: socket.with_extension("lock"),
            state_file: socket.with_extension("state"),
            socket,
        }
    }
}

/// The held lock file; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct LocalLock {
    _file: Flock<File>,
}

impl LocalLock {
    /// Takes the lock file, or explains who holds it (exit 4).
    pub fn acquire(path: &Path, lock: &str, store: &str) -> Result<LocalLock, AgentError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| AgentError::local("lock file", path, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut f) => {
                let _ = f.set_len(0);
                let _ = writeln!(&mut *f, "{}", std::process::id());
                Ok(LocalLock { _file: f })
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let pid = std::fs::read_to_string(path).unwrap_or_default();
                Err(AgentError::AlreadyRunning {
                    pid: pid.trim().to_owned(),
                    lock: lock.to_owned(),
                    store: store.to_owned(),
                    lock_file: path.to_owned(),
                })
            }
            Err((_, e)) => Err(AgentError::local("lock file", path, e.into())),
        }
    }
}

/// What the state file holds (S5, S6).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalState {
    /// The instance id of the agent that wrote it.
    pub instance: String,
    /// The boot id when it was written.
    pub boot_id: String,
    /// The highest fencing token seen for the lock.
    pub highest: Option<Token>,
    /// What identifies the service's process tree (child mode), as the
    /// keeper last reported it: a restarted agent, or one whose keeper
    /// died, finds and kills it with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSnapshot>,
}

impl LocalState {
    /// Reads the state file; a missing or unreadable one is "no previous
    /// instance" (logged when unreadable).
    pub fn load(path: &Path) -> Option<LocalState> {
        let text = std::fs::read_to_string(path).ok()?;
        match serde_json::from_str(&text) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable state file; ignoring it");
                None
            }
        }
    }

    /// Writes the state file atomically (a temporary file, then rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("state.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).expect("state serialises"))?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_file_holder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = LocalPaths::new(dir.path(), "sqlite:///x.db", "pg");
        assert!(p.lock_file.to_string_lossy().ends_with("-pg.lock"));
        let first = LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap();
        let e = LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap_err();
        assert!(matches!(e, AgentError::AlreadyRunning { .. }), "{e}");
        assert!(e.to_string().contains("already runs lock \"pg\""), "{e}");
        drop(first);
        LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap();
    }

    #[test]
    fn state_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.state");
        assert_eq!(LocalState::load(&p), None);
        let s = LocalState {
            instance: "i1".into(),
            boot_id: crate::identity::boot_id(),
            highest: Some(Token::new(5, 7)),
            tree: Some(TreeSnapshot {
                members: vec![crate::supervision::process::ProcId { pid: 42, start: 7 }],
                ..TreeSnapshot::default()
            }),
        };
        s.save(&p).unwrap();
        assert_eq!(LocalState::load(&p), Some(s));
    }
}
