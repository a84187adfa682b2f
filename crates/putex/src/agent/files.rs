//! Host-local files for (store, lock): the lock file that admits one agent
//! per lock and host (S5). What outlives the agent (the previous instance,
//! the boot id, the highest token seen for S6, the service's tree) is the
//! lock's host state, shared with critical sections: `crate::host_state`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::error::{AgentError, LocalFile};
use crate::supervision::keeper::socket_path;

/// Paths of the host-local files for (store, lock).
#[derive(Clone, Debug)]
pub struct LocalPaths {
    /// The keeper's socket.
    pub socket: PathBuf,
    /// The lock file (flock) that admits one agent per (store, lock).
    pub lock_file: PathBuf,
    /// Where the agent answers its hooks' `putex kv` (`PUTEX_KV_SOCKET`).
    pub kv_socket: PathBuf,
}

impl LocalPaths {
    /// The paths in `dir` for `store_id` and `lock`.
    pub fn new(dir: &Path, store_id: &str, lock: &str) -> LocalPaths {
        let socket = socket_path(dir, store_id, lock);
        LocalPaths {
            lock_file: socket.with_extension("lock"),
            kv_socket: socket.with_extension("kv.sock"),
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
            .map_err(|e| AgentError::local(LocalFile::LockFile, path, e))?;
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
            Err((_, e)) => Err(AgentError::local(LocalFile::LockFile, path, e.into())),
        }
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
}
