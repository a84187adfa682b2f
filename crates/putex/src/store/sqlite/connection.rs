//! The connections of a handle and how a call uses them: SQLite's busy
//! handling (a call waiting for another process's write lock tries again
//! every millisecond, for [`BUSY_TIMEOUT`] in all), every blocking call
//! run in the blocking pool within its deadline, queued behind the
//! connection as a future rather than as a blocked thread, and checked
//! afterwards against the files the handle opened ([`checked`]). SQLite's
//! errors are classified here ([`sql_err`]): configuration errors that
//! retrying will not fix, and unknown for everything else.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::Mutex;

use super::files::Files;
use super::SqliteStore;
use crate::store::{with_deadline, Op, StoreError};

/// How long a call waits for another process's write lock inside SQLite.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a call waiting for the write lock tries again. SQLite's own
/// busy timeout backs off to 100 ms between tries, and another process
/// writing back to back frees the lock only for microseconds between its
/// transactions: a holder renewing every 100 ms with a 40 ms deadline then
/// got four or five tries, lost them all, and lapsed. Trying every
/// millisecond lets it in between two of the other writer's commits.
pub(super) const BUSY_POLL: Duration = Duration::from_millis(1);

/// How many times a call tries again: [`BUSY_TIMEOUT`] of [`BUSY_POLL`]s.
pub(super) const BUSY_TRIES: i32 = (BUSY_TIMEOUT.as_millis() / BUSY_POLL.as_millis()) as i32;

/// The busy handler of every connection: sleep [`BUSY_POLL`] and try again,
/// for about [`BUSY_TIMEOUT`] in all (the sleeps alone add up to it).
pub(super) fn busy_wait(tries: i32) -> bool {
    if tries >= BUSY_TRIES {
        return false;
    }
    std::thread::sleep(BUSY_POLL);
    true
}

pub(super) fn sql_err(op: Op, key: &str, e: &rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match e.sqlite_error_code() {
        // Errors that retrying will not fix.
        Some(
            C::NotADatabase
            | C::CannotOpen
            | C::ReadOnly
            | C::PermissionDenied
            | C::DatabaseCorrupt,
        ) => StoreError::config(format!("sqlite {op} {key}: {e}")),
        // Busy, locked, I/O errors, and anything else: the transaction may
        // or may not have committed as far as we can tell.
        _ => StoreError::unknown(op, key, format_args!("sqlite: {e}")),
    }
}

impl SqliteStore {
    /// Runs blocking work on the main connection, within the deadline,
    /// checking after it that the files are still in place.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.inner.conn.clone();
        self.checked_on(conn, op, key, timeout, f).await
    }

    /// Runs a read on the read-only connection, within the deadline,
    /// checking after it that the files are still in place. It sees every
    /// write committed before it began, this handle's own included (they
    /// are answered only once committed): WAL readers never wait for a
    /// writer.
    pub(super) async fn reading<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.inner.reader.clone();
        self.checked_on(conn, op, key, timeout, f).await
    }

    /// [`on_conn`] with the check that the files are still in place.
    async fn checked_on<T: Send + 'static>(
        &self,
        conn: Arc<Mutex<Connection>>,
        op: Op,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let files = self.inner.files.clone();
        on_conn(conn, op, key, timeout, checked(files, op, key, f)).await
    }
}

/// `f`, then the check that the store's files are still the ones the
/// handle opened. Once a path names another file (or none) it never names
/// the handle's file again — the connection keeps that inode from being
/// reused — so a check that passes after the SQL means the file was in
/// place while it ran: a success is a success in the file everyone uses.
/// Anything else, a conflict included, is unknown: it happened, if at all,
/// in a file nobody else sees.
pub(super) fn checked<T>(
    files: Arc<Files>,
    op: Op,
    key: &str,
    f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
) -> impl FnOnce(&mut Connection) -> Result<T, StoreError> {
    let key = key.to_owned();
    move |conn| {
        let result = f(conn);
        files.check(op, &key)?;
        result
    }
}

/// Runs blocking work on `conn` in the blocking pool, within the deadline.
/// The connection is taken first, so calls queued behind one another wait
/// as futures, not as blocked threads: a thousand leases renewing at once
/// hold one thread, not a thousand. On expiry the work goes on (and may
/// commit) if it started; the caller hears Unknown either way.
pub(super) async fn on_conn<T: Send + 'static>(
    conn: Arc<Mutex<Connection>>,
    op: Op,
    key: &str,
    timeout: Duration,
    f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let key_owned = key.to_owned();
    with_deadline(op, key, timeout, async move {
        let mut conn = conn.lock_owned().await;
        tokio::task::spawn_blocking(move || f(&mut conn))
            .await
            .map_err(|e| StoreError::unknown(op, &key_owned, format_args!("task: {e}")))?
    })
    .await
}
