//! Taking turns to measure: the start-up measurement of the store's
//! compare-and-swaps ([`crate::store::measure`]) holds an exclusive
//! `flock` on `<database>-measure`, so that processes started together do
//! not time each other's writes. The turn is given up when its
//! [`MeasurementTurn`] is dropped or the process ends.

use std::time::Duration;

use super::files::with_suffix;
use super::SqliteStore;

/// How long [`SqliteStore::measurement_turn`] waits for another process's
/// measurement to end before measuring anyway.
const TURN_PATIENCE: Duration = Duration::from_secs(10);

/// How often [`SqliteStore::measurement_turn`] looks whether the turn is
/// free.
const TURN_POLL: Duration = Duration::from_millis(5);

/// This process's turn to measure the store alone
/// ([`SqliteStore::measurement_turn`]); dropping it (or the process
/// ending) passes the turn on.
#[derive(Debug)]
pub struct MeasurementTurn {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl SqliteStore {
    /// Waits for this process's turn to time compare-and-swaps on the
    /// store (`store::measure`): an exclusive `flock` on the file
    /// `<database>-measure` beside it, so that processes started together
    /// measure one after another instead of timing each other's writes (its
    /// writers queue for one file lock). Waits at most `TURN_PATIENCE`
    /// (a measurement takes well under a second); `None` when the turn
    /// could not be had, and the caller measures anyway.
    pub async fn measurement_turn(&self) -> Option<MeasurementTurn> {
        use nix::fcntl::{Flock, FlockArg};
        let path = with_suffix(&self.inner.path, "-measure");
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            // Another user's file: a lock needs no write access.
            .or_else(|_| std::fs::File::open(&path));
        let mut file = match opened {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no measurement turn");
                return None;
            }
        };
        let began = tokio::time::Instant::now();
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Some(MeasurementTurn { _lock: lock }),
                Err((f, nix::errno::Errno::EWOULDBLOCK)) if began.elapsed() < TURN_PATIENCE => {
                    file = f;
                    tokio::time::sleep(TURN_POLL).await;
                }
                Err((_, e)) => {
                    tracing::debug!(path = %path.display(), error = %e, "no measurement turn");
                    return None;
                }
            }
        }
    }
}
