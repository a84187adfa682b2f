//! The embedded store: one SQLite file, shared by every process on one
//! machine. The zero-setup default (`sqlite:`), for tests, demos and
//! single-host mutual exclusion; it is not a distributed store.
//!
//! - **Location**: `$XDG_STATE_HOME/putex/store.db`, else
//!   `~/.local/state/putex/store.db` (directories are created), or any file
//!   named by `sqlite:///abs/path.db`.
//! - **Many processes**: WAL journal, `synchronous=FULL` (an acknowledged
//!   write survives a power cut), a busy timeout, and every write in a
//!   `BEGIN IMMEDIATE` transaction: writers are serialised by SQLite's own
//!   file lock, so a compare-and-swap is atomic across processes.
//! - **Revisions** come from one counter row that only ever increases, so a
//!   revision is never reused, even for another key or after a delete.
//! - **Epoch**: the file's creation time (wall-clock nanoseconds), kept in
//!   the `meta` table. Deleting the file and starting again yields a new,
//!   higher epoch.
//! - **Store time**: (hash of this boot's id, `CLOCK_BOOTTIME` nanoseconds),
//!   read inside the write transaction, so it moves forward with the
//!   revision. A record written before a reboot is in another era and
//!   counts as infinitely old (`docs/stores.md`).
//! - **Group commit**: writes that queue while the connection is busy commit
//!   together, one transaction and one fsync for all, each still its own
//!   compare-and-swap in queue order (`SqliteStore::write`). The batch is
//!   taken once SQLite's write lock is won, which another process's commit
//!   can hold for seconds on a busy disk: writes whose callers gave up
//!   meanwhile are left out, writes queued meanwhile join.
//! - **Reads** (`get`, a watch's catch-up) use a read-only connection of
//!   their own, so they never queue behind this handle's writes.
//! - **Watch**: one feed per handle reads the rows above the last seen
//!   revision when this handle wrote, when another process wrote (inotify
//!   on the `-wal` file) and every [`WATCH_POLL`]. The table keeps only the
//!   latest change per key (deletes as markers), so a watcher may see
//!   several quick changes of one key as its latest.
//! - **Measurements take turns**: the start-up measurement of the store's
//!   compare-and-swaps (`store::measure`) holds an exclusive
//!   `flock` on `<database>-measure` ([`SqliteStore::measurement_turn`]),
//!   so processes started together do not time each other's writes.
//! - Every blocking call runs in [`tokio::task::spawn_blocking`]; a call
//!   that outlives its deadline is reported unknown and may still commit.
//! - **The file deleted or replaced under a handle**: SQLite keeps using the
//!   file it opened even after its path names another file or none, so a
//!   holder would go on renewing in a file nobody else sees while a new
//!   file at the path hands the lock to someone else. Every call (and every
//!   watch poll) therefore checks, after its SQL, that the database path
//!   and its `-wal` and `-shm` still name the files the handle opened
//!   (device and inode, three `stat`s, about 2 µs); if not, the call fails as
//!   unknown (`FileError::Replaced`) and the holder stops when its licence
//!   ends (H1). A handle never follows the new file: restart to use it.
//! - **No new database next to another one's log**: SQLite names the
//!   write-ahead log and the shared-memory index by path (`store.db-wal`,
//!   `store.db-shm`). If `store.db` alone is deleted, a new `store.db` would
//!   share them with the deleted file's open handles, which can corrupt
//!   both. Opening refuses when the database is missing but either is
//!   present (`FileError::Leftovers`, a configuration error).
//!
//! The code: `schema.rs` opens the file (tables, epoch, when it was made);
//! `connection.rs` runs each call on a connection within its deadline
//! (busy handling, SQLite's errors classified); `files.rs` guards the files
//! against deletion and replacement; `writes.rs` commits the queued writes;
//! `watch.rs` feeds the watches; `measurement_turn.rs` takes turns to
//! measure. The handle, its shared state and the [`Store`] operations are
//! here.

mod connection;
mod files;
mod measurement_turn;
mod schema;
mod watch;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::Mutex;

use super::hub::Hub;
use super::keys::{validate_filter, validate_key};
use super::{
    check_guarded, Created, Entry, Op, ReadMode, Store, StoreError, StoreGap, StoreTime, Token,
    WatchStream, Write,
};
use connection::sql_err;
use files::Files;
use schema::{from_i64, past_prefix, to_i64};
use watch::{row_event, rows_since};

pub use measurement_turn::MeasurementTurn;
pub use watch::WATCH_POLL;

/// A handle on the embedded store; clones share one connection.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    epoch: u64,
    /// When this file was made, as far as anyone can prove
    /// (`schema::made_at`).
    made: StoreTime,
    /// The connection for writes; the watch feed opens its own.
    conn: Arc<Mutex<Connection>>,
    /// A read-only connection for reads ([`SqliteStore::reading`]): a read
    /// never queues behind this handle's writes, which may wait seconds for
    /// SQLite's write lock while another process commits.
    reader: Arc<Mutex<Connection>>,
    /// The files the connection opened, checked around every call.
    files: Arc<Files>,
    /// Every watch on this handle, fed by one poller (`watch::feed`).
    hub: Arc<Hub>,
    /// Held while a feed starts, so that only one does.
    starting: tokio::sync::Mutex<()>,
    /// Woken by this handle's own writes: the feed reads them at once.
    written: Arc<tokio::sync::Notify>,
    /// Set by [`SqliteStore::prepare_exit`]: the feed polls only.
    exiting: Arc<Exiting>,
    /// Writes waiting for the connection: whoever takes it next commits
    /// them all in one transaction ([`SqliteStore::write`]).
    queued: parking_lot::Mutex<Vec<Queued>>,
    /// Write transactions committed through this handle (each a batch of
    /// one or more writes).
    commits: std::sync::atomic::AtomicU64,
}

/// Whether the process said it exits soon ([`SqliteStore::prepare_exit`]),
/// and the feed's wake-up when it does.
#[derive(Debug, Default)]
struct Exiting {
    set: std::sync::atomic::AtomicBool,
    told: tokio::sync::Notify,
}

impl Exiting {
    fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A write waiting for the connection, and where its outcome goes.
#[derive(Debug)]
struct Queued {
    op: Op,
    key: String,
    value: Option<Vec<u8>>,
    expect: Expect,
    /// A delete of a retired key ([`Store::retire`]): its siblings'
    /// tombstones older than [`RETIRED_KEPT`](super::RETIRED_KEPT) go with it.
    retire: bool,
    /// A guarded batch ([`Store::guarded`]): `key` is the guard, `expect`
    /// its revision, and these the writes made if it holds.
    guarded: Vec<Write>,
    reply: tokio::sync::oneshot::Sender<Result<Written, StoreError>>,
}

/// A write the batch applied: its token, and for a create whether the key
/// never had a row in this file (no record, no delete marker, no recorded
/// delete: [`Created::vacant_for`]).
#[derive(Clone, Copy, Debug)]
struct Written {
    token: Token,
    pristine: bool,
    /// The store time the write was stamped with.
    at: StoreTime,
}

#[derive(Debug)]
enum Expect {
    Absent,
    At(u64),
    Anything,
}

type Row = (String, Option<Vec<u8>>, u64, StoreTime);

impl SqliteStore {
    /// What tells this handle apart from every other open one (its clones
    /// included, which share it): the address of what they share.
    pub(crate) fn handle_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The database file this handle opened, as given to
    /// [`SqliteStore::open`]. The handle keeps using that file even if the
    /// path comes to name another one (its calls then fail).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Removes every row under `prefix` (ending in `.`) but the `keep`
    /// newest (by revision) and `spare`, tombstones included, leaving no
    /// tombstone: watchers never learn of it. For write-once records that
    /// nobody reads any more (transition records beyond the newest
    /// [`KEEP`](crate::observe::history::KEEP), sparing the scan marker);
    /// never for lock records. Returns how many rows went.
    pub async fn purge_prefix_keeping(
        &self,
        prefix: &str,
        keep: u64,
        spare: &str,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        validate_filter(prefix)?;
        let Some(to) = past_prefix(prefix) else {
            return Err(StoreError::config(format!(
                "{prefix:?} is no prefix (it must end in `.`)"
            )));
        };
        let (from, spare) = (prefix.to_owned(), spare.to_owned());
        self.blocking(Op::Delete, prefix, timeout, move |conn| {
            conn.execute(
                "DELETE FROM kv WHERE key > ?1 AND key < ?2 AND key != ?3 AND revision NOT IN (
                     SELECT revision FROM kv WHERE key > ?1 AND key < ?2 AND key != ?3
                     ORDER BY revision DESC LIMIT ?4)",
                params![from, to, spare, to_i64(keep)],
            )
            .map(|n| n as u64)
            .map_err(|e| sql_err(Op::Delete, &from, &e))
        })
        .await
    }
}

impl Store for SqliteStore {
    fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    async fn get(
        &self,
        key: &str,
        _mode: ReadMode,
        timeout: Duration,
    ) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        let epoch = self.inner.epoch;
        let k = key.to_owned();
        self.reading(Op::Get, key, timeout, move |conn| {
            let row: Option<(Option<Vec<u8>>, i64, i64, i64)> = conn
                .prepare_cached("SELECT value, revision, era, nanos FROM kv WHERE key = ?1")
                .and_then(|mut s| {
                    s.query_row([&k], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                        .optional()
                })
                .map_err(|e| sql_err(Op::Get, &k, &e))?;
            Ok(row.and_then(|(value, rev, era, nanos)| {
                value.map(|value| Entry {
                    value,
                    token: Token::new(epoch, from_i64(rev)),
                    time: StoreTime {
                        era: from_i64(era),
                        nanos: from_i64(nanos),
                    },
                })
            }))
        })
        .await
    }

    async fn create(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        self.write(Op::Create, key, Some(value), Expect::Absent, timeout)
            .await
    }

    /// Vacant since the file was made, if the key never had a row in it
    /// (`docs/stores.md`, "First use"): the file keeps every acknowledged
    /// write (`synchronous=FULL`), putex never deletes a lock record, a
    /// delete by anyone else is kept (a marker, or a row in `deleted`), and
    /// a replaced file counts as made when it was first opened. The clock
    /// is `CLOCK_BOOTTIME`, which never jumps; a file made in an earlier
    /// boot is vacant for as long as this boot has run and longer: no
    /// process of that boot holds anything now.
    async fn create_vacant(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Created, StoreError> {
        let made = self.inner.made;
        let w = self
            .write_queued(Op::Create, key, Some(value), Expect::Absent, false, timeout)
            .await?;
        let vacant_for = match w.at.gap_since(made) {
            _ if !w.pristine => Duration::ZERO,
            StoreGap::Forward(d) => d,
            StoreGap::Unbounded => Duration::MAX,
            StoreGap::Backwards => Duration::ZERO,
        };
        Ok(Created {
            token: w.token,
            vacant_for,
        })
    }

    async fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        if expected.epoch != self.inner.epoch {
            validate_key(key)?;
            return Err(StoreError::conflict(Op::Update, key));
        }
        self.write(
            Op::Update,
            key,
            Some(value),
            Expect::At(expected.revision),
            timeout,
        )
        .await
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        self.write(Op::Put, key, Some(value), Expect::Anything, timeout)
            .await
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.delete_at(key, expected, false, timeout).await
    }

    async fn retire(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.delete_at(key, expected, true, timeout).await
    }

    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        check_guarded(guard_key, writes)?;
        if guard.epoch != self.inner.epoch {
            return Err(StoreError::conflict(Op::Guarded, guard_key));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.inner.queued.lock().push(Queued {
            op: Op::Guarded,
            key: guard_key.to_owned(),
            value: None,
            expect: Expect::At(guard.revision),
            retire: false,
            guarded: writes.to_vec(),
            reply,
        });
        self.commit_turn(Op::Guarded, guard_key, answer, timeout)
            .await
            .map(|w| w.token)
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        validate_filter(filter)?;
        let subscription = loop {
            if let Some(s) = self.inner.hub.subscribe(filter) {
                break s;
            }
            self.start_feed(filter, timeout).await?;
        };
        // The catch-up, read after the subscription began: with no start
        // revision every key's latest state (every row), else the rows at
        // or above it. The feed's copies of them are dropped.
        let after = from_revision.map_or(0, |r| r.saturating_sub(1));
        let f = filter.to_owned();
        let (rows, upto) = self
            .reading(Op::Watch, filter, timeout, move |conn| {
                rows_since(conn, after, &f).map_err(|e| sql_err(Op::Watch, &f, &e))
            })
            .await?;
        let epoch = self.inner.epoch;
        let catch_up = rows.into_iter().map(|r| row_event(epoch, r)).collect();
        Ok(subscription.into_stream(catch_up, upto.max(after)))
    }
}

impl SqliteStore {
    /// How many watches this handle's feed serves (all of them share one
    /// connection and one poller).
    pub fn watches(&self) -> usize {
        self.inner.hub.watches()
    }

    /// The process exits soon: the feed removes its inotify watch now and
    /// polls from then on (see [`AnyStore::prepare_exit`](super::AnyStore::prepare_exit)).
    pub fn prepare_exit(&self) {
        self.inner
            .exiting
            .set
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.inner.exiting.told.notify_one();
    }
}

#[cfg(test)]
mod tests;
