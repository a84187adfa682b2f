//! Why the agent could not start or did not finish on its own terms.

use std::path::PathBuf;

use crate::store::measure::{MeasureError, StoreCheckError};
use crate::store::StoreError;
use crate::supervision::keeper::KeeperError;

/// Why the agent could not start or did not finish on its own terms.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A host-local file or directory could not be used.
    #[error("{what} {}: {source}", path.display())]
    Local {
        /// Which one.
        what: LocalFile,
        /// The path that could not be used.
        path: PathBuf,
        /// The I/O error it gave.
        source: std::io::Error,
    },
    /// Another agent already runs this lock for this store on this host.
    #[error(
        "another putex agent (pid {pid}) already runs lock {lock:?} for store {store} on this \
         host (lock file {}); one agent per lock and host (to try several nodes of one lock \
         on one host, give each agent its own --keeper-dir)",
        lock_file.display()
    )]
    AlreadyRunning {
        /// The pid written in the lock file.
        pid: String,
        /// The lock name the other agent runs.
        lock: String,
        /// The store, without secrets.
        store: String,
        /// The host-local lock file both agents take, in the keeper
        /// directory; it holds the running agent's pid.
        lock_file: PathBuf,
    },
    /// The store cannot be opened.
    #[error("store {url}: {source}")]
    StoreUnreachable {
        /// The store URL, without secrets.
        url: String,
        /// What opening it failed with.
        source: StoreError,
    },
    /// Measuring the store failed.
    #[error(transparent)]
    Measure(#[from] MeasureError),
    /// The timing does not suit the store (measured p99, replication): the
    /// rule broken and how the store was measured.
    #[error(transparent)]
    Timing(#[from] StoreCheckError),
    /// `--failsafe` with a key another live member of the lock does not
    /// share: every ask and grant between them would be rejected, so the
    /// failsafe would fail in the outage it is for.
    #[error(
        "--failsafe-key-file: member {node} of lock {lock:?} signs with key {theirs}, this \
         agent's key is {ours}: every member needs the same key file (else each rejects the \
         other's asks and grants, and a store outage stops the holder at T)"
    )]
    FailsafeKeyMismatch {
        /// The lock.
        lock: String,
        /// The member whose key differs.
        node: String,
        /// Its key's fingerprint, as its member record publishes it.
        theirs: String,
        /// This agent's.
        ours: String,
    },
    /// The settings name no lock (`check` settings, not `run` ones).
    #[error("no lock to run for (--lock)")]
    NoLock,
    /// The keeper could not be started or adopted.
    #[error("keeper: {0}")]
    Keeper(#[from] KeeperError),
    /// No keeper executable was given and this program's own path is unknown.
    #[error("cannot find the putex binary to run the keeper: {0}")]
    NoKeeperExe(std::io::Error),
    /// Asked to stop at once: an emergency stop was made; the lock was
    /// released only if the graceful stop under way proved the service
    /// stopped first.
    #[error("stopped at once by a second signal")]
    Aborted,
}

/// The host-local files and directories an agent needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalFile {
    /// `--keeper-dir`: the keepers' sockets and the agents' lock files.
    KeeperDir,
    /// The host-local lock file that keeps a second agent of one lock out.
    LockFile,
    /// The host state file (previous instance, boot id).
    HostStateFile,
}

impl std::fmt::Display for LocalFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LocalFile::KeeperDir => "keeper directory",
            LocalFile::LockFile => "lock file",
            LocalFile::HostStateFile => "host state file",
        })
    }
}
