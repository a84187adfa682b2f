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
//!   compare-and-swaps ([`crate::store::measure`]) holds an exclusive
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

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::Mutex;

use super::hub::Hub;
use super::keys::{
    filter_matches, validate_filter, validate_key, GRANT_PREFIX, HISTORY_PREFIX, ID_PREFIX,
    QUEUE_PREFIX,
};
use super::{
    boot_time_now, check_guarded, wall_nanos, with_deadline, Created, Entry, Op, ReadMode, Store,
    StoreError, StoreGap, StoreTime, Token, WatchEvent, WatchStream, Write, RETIRED_KEPT,
};

/// How often the watch feed reads new revisions when nothing told it of a
/// change: a write through this handle wakes it at once, another process's
/// write through inotify on the `-wal` file; this poll is the fallback
/// (a file system without inotify, an event lost).
pub const WATCH_POLL: Duration = Duration::from_millis(100);
/// How long a call waits for another process's write lock inside SQLite.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a call waiting for the write lock tries again. SQLite's own
/// busy timeout backs off to 100 ms between tries, and another process
/// writing back to back frees the lock only for microseconds between its
/// transactions: a holder renewing every 100 ms with a 40 ms deadline then
/// got four or five tries, lost them all, and lapsed. Trying every
/// millisecond lets it in between two of the other writer's commits.
const BUSY_POLL: Duration = Duration::from_millis(1);

/// How many times a call tries again: [`BUSY_TIMEOUT`] of [`BUSY_POLL`]s.
const BUSY_TRIES: i32 = (BUSY_TIMEOUT.as_millis() / BUSY_POLL.as_millis()) as i32;

/// The busy handler of every connection: sleep [`BUSY_POLL`] and try again,
/// for about [`BUSY_TIMEOUT`] in all (the sleeps alone add up to it).
fn busy_wait(tries: i32) -> bool {
    if tries >= BUSY_TRIES {
        return false;
    }
    std::thread::sleep(BUSY_POLL);
    true
}

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

/// A handle on the embedded store; clones share one connection.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    epoch: u64,
    /// When this file was made, as far as anyone can prove ([`made_at`]).
    made: StoreTime,
    /// The connection for writes; the watch feed opens its own.
    conn: Arc<Mutex<Connection>>,
    /// A read-only connection for reads ([`SqliteStore::reading`]): a read
    /// never queues behind this handle's writes, which may wait seconds for
    /// SQLite's write lock while another process commits.
    reader: Arc<Mutex<Connection>>,
    /// The files the connection opened, checked around every call.
    files: Arc<Files>,
    /// Every watch on this handle, fed by one poller ([`feed`]).
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
    /// tombstones older than [`RETIRED_KEPT`] go with it.
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

/// Why the store's files are not (or no longer) the ones to use.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// The path no longer names the file this handle opened: the file was
    /// deleted, or another file took its name. Its writes would reach a
    /// file no other process sees.
    #[error(
        "embedded store file {} was deleted or replaced while in use (the path now names {now}): \
         this handle no longer sees the store that others use; restart to open the file now at the path",
        path.display()
    )]
    Replaced {
        /// The file (the database, or its `-wal` or `-shm`).
        path: PathBuf,
        /// What the path names now: `no file` or `another file`.
        now: &'static str,
    },
    /// The database is missing but its write-ahead log or shared-memory
    /// index is still there: a new database would share them with handles
    /// of the deleted one.
    #[error(
        "embedded store {} is missing but {} remain: the database was deleted while in use, and a new \
         one would share the old one's write-ahead log. Make sure no process uses the deleted store \
         (a putex holding a lock there stops within its lease), then remove them",
        path.display(),
        leftovers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ")
    )]
    Leftovers {
        path: PathBuf,
        /// The `-wal` and `-shm` files found without it.
        leftovers: Vec<PathBuf>,
    },
    /// A store file could not be examined.
    #[error("embedded store file {}: cannot stat it: {source}", path.display())]
    Stat {
        path: PathBuf,
        /// What `stat` said.
        source: std::io::Error,
    },
}

/// What a path names: (device, inode). While a connection keeps a file
/// open its inode cannot be reused, so equal identities mean the same file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId {
    dev: u64,
    ino: u64,
}

/// What `path` names now; `None` when nothing.
fn file_id(path: &Path) -> Result<Option<FileId>, FileError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Stat {
            path: path.to_owned(),
            source,
        }),
    }
}

/// When the database at `path` was made, as far as anyone can prove (S4
/// refined, `docs/stores.md`): the store time kept in `meta` with the
/// device and inode of the file it was made as. A file that is not that one
/// — a copy, a backup put back, a file from before these rows existed —
/// counts as made now and the rows are written anew: whatever it holds, a
/// holder of the file it replaced may still be running.
fn made_at(tx: &rusqlite::Transaction<'_>, path: &Path) -> Result<StoreTime, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let read = |name: &str| -> Result<Option<u64>, String> {
        tx.query_row("SELECT value FROM meta WHERE name = ?1", [name], |r| {
            r.get::<_, i64>(0)
        })
        .optional()
        .map(|v| v.map(from_i64))
        .map_err(|e| e.to_string())
    };
    let same_file = read("made_dev")? == Some(meta.dev()) && read("made_ino")? == Some(meta.ino());
    if let (true, Some(era), Some(nanos)) = (same_file, read("made_era")?, read("made_nanos")?) {
        return Ok(StoreTime { era, nanos });
    }
    let now = boot_time_now();
    for (name, value) in [
        ("made_dev", meta.dev()),
        ("made_ino", meta.ino()),
        ("made_era", now.era),
        ("made_nanos", now.nanos),
    ] {
        tx.execute(
            "INSERT OR REPLACE INTO meta (name, value) VALUES (?1, ?2)",
            params![name, to_i64(value)],
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(now)
}

/// `path` with `suffix` appended: how SQLite names a database's `-wal` and
/// `-shm`.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    s.into()
}

/// The files of an open store and the identity each had when it was
/// opened: the database (by the path the user named) and its `-wal` and
/// `-shm` (named, as SQLite names them, after the database's real path).
/// SQLite removes a `-wal` or `-shm` only when the last connection to the
/// database closes, so while a handle is open all three stay put unless
/// something else deletes or replaces them.
#[derive(Debug)]
struct Files {
    files: [(PathBuf, FileId); 3],
    /// Set once the loss has been logged.
    alarmed: std::sync::atomic::AtomicBool,
}

impl Files {
    /// The files as they are now, right after the connection opened them.
    fn capture(path: &Path) -> Result<Files, FileError> {
        let real = std::fs::canonicalize(path).map_err(|source| FileError::Stat {
            path: path.to_owned(),
            source,
        })?;
        let one = |p: PathBuf| -> Result<(PathBuf, FileId), FileError> {
            match file_id(&p)? {
                Some(id) => Ok((p, id)),
                None => Err(FileError::Replaced {
                    path: p,
                    now: "no file",
                }),
            }
        };
        Ok(Files {
            files: [
                one(path.to_owned())?,
                one(with_suffix(&real, "-wal"))?,
                one(with_suffix(&real, "-shm"))?,
            ],
            alarmed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether every path still names the file it named when opened.
    fn verify(&self) -> Result<(), FileError> {
        for (path, id) in &self.files {
            let now = match file_id(path)? {
                Some(now) if now == *id => continue,
                Some(_) => "another file",
                None => "no file",
            };
            return Err(FileError::Replaced {
                path: path.clone(),
                now,
            });
        }
        Ok(())
    }

    /// [`Files::verify`] as the outcome of a call: unknown, since a write
    /// may have landed in the file that is gone.
    /// The first time, the loss is logged as an error: every later call
    /// fails the same way, and the process needs a restart.
    fn check(&self, op: Op, key: &str) -> Result<(), StoreError> {
        match self.lost() {
            None => Ok(()),
            Some(e) => Err(StoreError::unknown(op, key, e)),
        }
    }

    /// [`Files::verify`], the loss logged the first time: `None` while the
    /// files are in place.
    fn lost(&self) -> Option<FileError> {
        let e = self.verify().err()?;
        if !self
            .alarmed
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(error = %e, "the embedded store's file is gone");
        }
        Some(e)
    }
}

/// Refuses a missing database whose `-wal` or `-shm` is still there (see
/// [`FileError::Leftovers`]). They are looked at first: a database is
/// always created before them, so finding one and then no database means
/// the database was deleted, not that it is still being created.
fn refuse_leftovers(path: &Path) -> Result<(), FileError> {
    let mut leftovers = Vec::new();
    for suffix in ["-wal", "-shm"] {
        let p = with_suffix(path, suffix);
        if file_id(&p)?.is_some() {
            leftovers.push(p);
        }
    }
    if leftovers.is_empty() || file_id(path)?.is_some() {
        return Ok(());
    }
    Err(FileError::Leftovers {
        path: path.to_owned(),
        leftovers,
    })
}

#[derive(Debug)]
enum Expect {
    Absent,
    At(u64),
    Anything,
}

type Row = (String, Option<Vec<u8>>, u64, StoreTime);

fn sql_err(op: Op, key: &str, e: &rusqlite::Error) -> StoreError {
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

fn to_i64(v: u64) -> i64 {
    // Stored as the same 64 bits; read back with `from_i64`.
    v as i64
}

fn from_i64(v: i64) -> u64 {
    v as u64
}

impl SqliteStore {
    /// What tells this handle apart from every other open one (its clones
    /// included, which share it): the address of what they share.
    pub(crate) fn handle_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Opens (creating if needed) the store in `path`, and its directory.
    pub async fn open(path: PathBuf) -> Result<SqliteStore, StoreError> {
        tokio::task::spawn_blocking(move || Self::open_blocking(path))
            .await
            .map_err(|e| StoreError::config(format!("sqlite open: {e}")))?
    }

    fn open_blocking(path: PathBuf) -> Result<SqliteStore, StoreError> {
        let cfg = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::config(format!("embedded store {}: {what}: {e}", path.display()))
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| cfg("cannot create its directory", &e))?;
        }
        refuse_leftovers(&path).map_err(StoreError::config)?;
        let before = file_id(&path).map_err(StoreError::config)?;
        let mut conn = Connection::open(&path).map_err(|e| cfg("cannot open", &e))?;
        conn.busy_handler(Some(busy_wait))
            .map_err(|e| cfg("busy handler", &e))?;
        // journal_mode returns a row; WAL needs no write lock once set. The
        // switch does not wait on the busy handler: processes opening a
        // fresh file at the same moment see SQLITE_BUSY, so retry it here,
        // within the same budget as any other lock wait.
        let started = std::time::Instant::now();
        let mode: String = loop {
            match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)) {
                Ok(mode) => break mode,
                Err(rusqlite::Error::SqliteFailure(f, _))
                    if f.code == rusqlite::ErrorCode::DatabaseBusy
                        && started.elapsed() < BUSY_TIMEOUT =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(cfg("cannot switch to WAL", &e)),
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(cfg("journal mode", &format!("got {mode}, need wal")));
        }
        conn.execute_batch("PRAGMA synchronous=FULL;")
            .map_err(|e| cfg("synchronous", &e))?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| cfg("cannot initialise", &e))?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (
                 name  TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS counter (
                 id       INTEGER PRIMARY KEY CHECK (id = 0),
                 revision INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS kv (
                 key      TEXT PRIMARY KEY,
                 value    BLOB,
                 revision INTEGER NOT NULL UNIQUE,
                 era      INTEGER NOT NULL,
                 nanos    INTEGER NOT NULL
             );
             INSERT OR IGNORE INTO counter (id, revision) VALUES (0, 0);",
        )
        .map_err(|e| cfg("cannot create tables", &e))?;
        tx.execute(
            "INSERT OR IGNORE INTO meta (name, value) VALUES ('epoch', ?1)",
            [to_i64(wall_nanos())],
        )
        .map_err(|e| cfg("cannot write the epoch", &e))?;
        let epoch: i64 = tx
            .query_row("SELECT value FROM meta WHERE name = 'epoch'", [], |r| {
                r.get(0)
            })
            .map_err(|e| cfg("cannot read the epoch", &e))?;
        // Every row deleted is remembered (S4 refined: a key that had one
        // is no first use), but for the rows putex removes itself: old
        // transition records (`purge_prefix_keeping`) and the tombstones of
        // retired keys (`forget_retired_siblings`: tickets, grants, claim
        // names), none of them a lock record.
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS deleted (key TEXT PRIMARY KEY);
             CREATE TRIGGER IF NOT EXISTS record_deletes AFTER DELETE ON kv
                 WHEN old.key NOT LIKE '{HISTORY_PREFIX}%'
                     AND NOT (old.value IS NULL AND (old.key LIKE '{QUEUE_PREFIX}%'
                         OR old.key LIKE '{GRANT_PREFIX}%' OR old.key LIKE '{ID_PREFIX}%.name.%'))
                 BEGIN INSERT OR IGNORE INTO deleted (key) VALUES (old.key); END;"
        ))
        .map_err(|e| cfg("cannot create tables", &e))?;
        let made = made_at(&tx, &path).map_err(|e| cfg("cannot read when it was made", &e))?;
        tx.commit().map_err(|e| cfg("cannot initialise", &e))?;
        let mut reader = Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| cfg("cannot open for reading", &e))?;
        reader
            .busy_handler(Some(busy_wait))
            .map_err(|e| cfg("busy handler", &e))?;
        // The connection has the database, its -wal and its -shm open now.
        // A file that was there before must still be the one (else it was
        // replaced while opening, and the connection may have the old one).
        let key = path.display().to_string();
        let files = Files::capture(&path).map_err(|e| StoreError::unknown(Op::Open, &key, e))?;
        if before.is_some_and(|id| id != files.files[0].1) {
            let e = FileError::Replaced {
                path: path.clone(),
                now: "another file",
            };
            return Err(StoreError::unknown(Op::Open, &key, e));
        }
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                epoch: from_i64(epoch),
                made,
                conn: Arc::new(Mutex::new(conn)),
                reader: Arc::new(Mutex::new(reader)),
                files: Arc::new(files),
                hub: Hub::new(),
                starting: tokio::sync::Mutex::new(()),
                written: Arc::new(tokio::sync::Notify::new()),
                exiting: Arc::default(),
                queued: parking_lot::Mutex::default(),
                commits: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// Waits for this process's turn to time compare-and-swaps on the
    /// store ([`crate::store::measure`]): an exclusive `flock` on the file
    /// `<database>-measure` beside it, so that processes started together
    /// measure one after another instead of timing each other's writes (its
    /// writers queue for one file lock). Waits at most [`TURN_PATIENCE`]
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

    /// Runs blocking work on the main connection, within the deadline,
    /// checking after it that the files are still in place.
    async fn blocking<T: Send + 'static>(
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
    async fn reading<T: Send + 'static>(
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

    /// One write: queued, then committed by whichever call takes the
    /// connection next — this one, or another already waiting — together
    /// with every write queued by then, in one transaction (group commit:
    /// a thousand leases renewing at once cost a few fsyncs, not a
    /// thousand). Each write in the batch is its own compare-and-swap,
    /// decided in queue order against what the writes before it left, so
    /// one write's conflict does not touch the others. The batch is what is
    /// queued once SQLite's write lock is won ([`commit_queued`]): a write
    /// whose caller gave up before then is left out (it never lands late),
    /// and one queued while the lock was awaited joins.
    async fn write(
        &self,
        op: Op,
        key: &str,
        value: Option<&[u8]>,
        expect: Expect,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        self.write_queued(op, key, value, expect, false, timeout)
            .await
            .map(|w| w.token)
    }

    /// [`Store::delete`], or with `retire` [`Store::retire`].
    async fn delete_at(
        &self,
        key: &str,
        expected: Token,
        retire: bool,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        if expected.epoch != self.inner.epoch {
            validate_key(key)?;
            return Err(StoreError::conflict(Op::Delete, key));
        }
        let at = Expect::At(expected.revision);
        self.write_queued(Op::Delete, key, None, at, retire, timeout)
            .await
            .map(drop)
    }

    /// [`Self::write`], for a retired key's delete too (`retire`).
    async fn write_queued(
        &self,
        op: Op,
        key: &str,
        value: Option<&[u8]>,
        expect: Expect,
        retire: bool,
        timeout: Duration,
    ) -> Result<Written, StoreError> {
        validate_key(key)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.inner.queued.lock().push(Queued {
            op,
            key: key.to_owned(),
            value: value.map(<[u8]>::to_vec),
            expect,
            retire,
            guarded: Vec::new(),
            reply,
        });
        self.commit_turn(op, key, answer, timeout).await
    }

    /// Waits for a queued write's answer, committing the queue (this
    /// write's batch) if the connection is free first.
    async fn commit_turn(
        &self,
        op: Op,
        key: &str,
        mut answer: tokio::sync::oneshot::Receiver<Result<Written, StoreError>>,
        timeout: Duration,
    ) -> Result<Written, StoreError> {
        let inner = self.inner.clone();
        let lost =
            |key: &str| StoreError::unknown(op, key, "the write's batch ended without an answer");
        with_deadline(op, key, timeout, async move {
            tokio::select! {
                biased;
                r = &mut answer => return r.unwrap_or_else(|_| Err(lost(key))),
                mut conn = inner.conn.clone().lock_owned() => {
                    if !inner.queued.lock().is_empty() {
                        let handle = inner.clone();
                        let committed = tokio::task::spawn_blocking(move || {
                            commit_queued(&mut conn, &handle)
                        })
                        .await
                        .unwrap_or(false);
                        if committed {
                            inner.written.notify_one();
                        }
                    }
                }
            }
            answer.await.unwrap_or_else(|_| Err(lost(key)))
        })
        .await
    }
}

/// Takes SQLite's write lock (`BEGIN IMMEDIATE`, waiting in the busy
/// handler while another connection writes), then commits every write
/// queued by then in that one transaction: each write checks its own
/// expectation (a conflict leaves the rest alone), takes the next revision
/// and the store time, and every caller hears its outcome once the commit
/// and the check of the files are done. Any other failure is every
/// queued write's: unknown (or a configuration error), nothing committed
/// that anyone is told of as done. Returns whether anything was written.
///
/// The queue is taken only once the lock is won, not before the wait for
/// it: another process's commit can hold the lock for seconds (its `fsync`
/// behind other writes to a busy disk: 2 s and 4 s were seen), and a write
/// whose caller gave up meanwhile must not commit — its caller heard
/// "unknown" and has sent a fresher one (a renewal), which would otherwise
/// wait for a second turn at the lock and a second `fsync` behind it. Taken
/// after the wait, the stale write is left out and the fresh one lands in
/// the first transaction.
fn commit_queued(conn: &mut Connection, inner: &Inner) -> bool {
    let began = std::time::Instant::now();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate);
    let locked = began.elapsed();
    // Callers that gave up before the lock was won (their deadline passed):
    // left out, so a write that timed out never lands late.
    let batch: Vec<Queued> = std::mem::take(&mut *inner.queued.lock())
        .into_iter()
        .filter(|q| !q.reply.is_closed())
        .collect();
    let fail_all = |batch: Vec<Queued>, e: &rusqlite::Error| {
        for q in batch {
            let _ = q.reply.send(Err(sql_err(q.op, &q.key, e)));
        }
        false
    };
    let tx = match tx {
        Ok(tx) => tx,
        Err(e) => return fail_all(batch, &e),
    };
    if batch.is_empty() {
        // Nothing left to write: the transaction ends without a commit.
        return false;
    }
    let mut outcomes = Vec::with_capacity(batch.len());
    for q in &batch {
        match apply(&tx, q) {
            Ok(applied) => outcomes.push(applied),
            Err(e) => {
                drop(tx);
                return fail_all(batch, &e);
            }
        }
    }
    if let Err(e) = tx.commit() {
        return fail_all(batch, &e);
    }
    tracing::trace!(
        writes = batch.len(),
        lock_wait_us = u64::try_from(locked.as_micros()).unwrap_or(u64::MAX),
        commit_us = u64::try_from((began.elapsed() - locked).as_micros()).unwrap_or(u64::MAX),
        "sqlite transaction committed"
    );
    inner
        .commits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // After the SQL: the file written is still the one everyone uses
    // ([`checked`]); if not, every outcome is unknown.
    let lost = inner.files.lost();
    let mut wrote = false;
    for (q, applied) in batch.into_iter().zip(outcomes) {
        let outcome = match (&lost, applied) {
            (Some(e), _) => Err(StoreError::unknown(q.op, &q.key, e)),
            (None, Some((revision, pristine, at))) => {
                wrote = true;
                Ok(Written {
                    token: Token::new(inner.epoch, revision),
                    pristine,
                    at,
                })
            }
            (None, None) => Err(StoreError::conflict(q.op, &q.key)),
        };
        let _ = q.reply.send(outcome);
    }
    wrote
}

/// One queued write inside the batch's transaction: its revision, whether
/// the key never had a row ([`Written::pristine`]) and its store time, or
/// `None` when its expectation does not hold (a conflict).
fn apply(
    tx: &rusqlite::Transaction<'_>,
    q: &Queued,
) -> rusqlite::Result<Option<(u64, bool, StoreTime)>> {
    let current: Option<(i64, bool)> = tx
        .prepare_cached("SELECT revision, value IS NULL FROM kv WHERE key = ?1")?
        .query_row([&q.key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let live = current
        .filter(|(_, deleted)| !deleted)
        .map(|(rev, _)| from_i64(rev));
    let ok = match q.expect {
        Expect::Anything => true,
        Expect::Absent => live.is_none(),
        Expect::At(rev) => live == Some(rev),
    };
    if !ok {
        return Ok(None);
    }
    if !q.guarded.is_empty() {
        return apply_guarded(tx, &q.guarded).map(Some);
    }
    // No row at all (not even a delete marker) and no delete recorded by
    // the trigger: nothing was ever at this key in this file.
    let pristine = current.is_none()
        && tx
            .prepare_cached("SELECT 1 FROM deleted WHERE key = ?1")?
            .query_row([&q.key], |_| Ok(()))
            .optional()?
            .is_none();
    // Read the clock inside the transaction: writers are serialised, so
    // store time moves forward with the revision.
    let now = boot_time_now();
    let revision = write_row(tx, &q.key, q.value.as_deref(), now)?;
    if q.retire {
        forget_retired_siblings(tx, &q.key, now)?;
    }
    Ok(Some((from_i64(revision), pristine, now)))
}

/// Writes `key`'s row (`value: None`: a delete marker) at the next
/// revision and store time `now`; returns the revision.
fn write_row(
    tx: &rusqlite::Transaction<'_>,
    key: &str,
    value: Option<&[u8]>,
    now: StoreTime,
) -> rusqlite::Result<i64> {
    let revision: i64 = tx
        .prepare_cached(
            "UPDATE counter SET revision = revision + 1 WHERE id = 0 RETURNING revision",
        )?
        .query_row([], |r| r.get(0))?;
    tx.prepare_cached(
        "INSERT INTO kv (key, value, revision, era, nanos) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value,
             revision = excluded.revision, era = excluded.era, nanos = excluded.nanos",
    )?
    .execute(params![
        key,
        value,
        revision,
        to_i64(now.era),
        to_i64(now.nanos)
    ])?;
    Ok(revision)
}

/// The writes of a guarded batch whose guard holds ([`Store::guarded`]),
/// in the batch's transaction: the revision and time of the last.
fn apply_guarded(
    tx: &rusqlite::Transaction<'_>,
    writes: &[Write],
) -> rusqlite::Result<(u64, bool, StoreTime)> {
    let now = boot_time_now();
    let mut revision: i64 = 0;
    for w in writes {
        let value = match w {
            Write::Put { value, .. } => Some(value.as_slice()),
            Write::Delete { key } => {
                let live: Option<bool> = tx
                    .prepare_cached("SELECT value IS NOT NULL FROM kv WHERE key = ?1")?
                    .query_row([key], |r| r.get(0))
                    .optional()?;
                if live != Some(true) {
                    continue;
                }
                None
            }
        };
        revision = write_row(tx, w.key(), value, now)?;
    }
    if revision == 0 {
        // Only deletes of absent keys: nothing written, the newest
        // revision stands for the batch.
        revision = to_i64(newest_revision(tx)?);
    }
    Ok((from_i64(revision), false, now))
}

/// For a prefix `stem.`: the first key past every key under it, `stem/`
/// (`/` follows `.`), so that those keys are `> prefix AND < past`. `None`
/// for anything but a prefix.
fn past_prefix(prefix: &str) -> Option<String> {
    prefix.strip_suffix('.').map(|stem| format!("{stem}/"))
}

/// Removes the tombstones under `key`'s parent prefix (`queue.<name>.` for
/// a ticket) that are older than [`RETIRED_KEPT`] — or from another boot,
/// whose times do not compare — now that a watcher has had that long to see
/// each ([`Store::retire`]). Only retired keys live under such a prefix, so
/// every tombstone there is a retired key's.
fn forget_retired_siblings(
    tx: &rusqlite::Transaction<'_>,
    key: &str,
    now: StoreTime,
) -> rusqlite::Result<()> {
    let Some(dot) = key.rfind('.') else {
        return Ok(());
    };
    let prefix = &key[..=dot];
    let end = past_prefix(prefix).expect("ends in `.`");
    let kept = u64::try_from(RETIRED_KEPT.as_nanos()).unwrap_or(u64::MAX);
    tx.prepare_cached(
        "DELETE FROM kv WHERE key > ?1 AND key < ?2 AND value IS NULL
             AND (era != ?3 OR nanos < ?4)",
    )?
    .execute(params![
        prefix,
        end,
        to_i64(now.era),
        to_i64(now.nanos.saturating_sub(kept))
    ])?;
    Ok(())
}

/// `f`, then the check that the store's files are still the ones the
/// handle opened. Once a path names another file (or none) it never names
/// the handle's file again — the connection keeps that inode from being
/// reused — so a check that passes after the SQL means the file was in
/// place while it ran: a success is a success in the file everyone uses.
/// Anything else, a conflict included, is unknown: it happened, if at all,
/// in a file nobody else sees.
fn checked<T>(
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
async fn on_conn<T: Send + 'static>(
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

/// The newest revision committed.
fn newest_revision(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT revision FROM counter WHERE id = 0")?
        .query_row([], |r| r.get::<_, i64>(0))
        .map(from_i64)
}

/// Every row above revision `after` that `filter` selects, in order, and
/// the newest revision committed when they were read: a watch goes on from
/// there, so that rows other keys changed are never scanned again (with many
/// watches on one file, scanning them made every poll grow with the number
/// of writers). Writes are serialised and take their revision in the
/// writing transaction, so no row at or below that revision can appear
/// later.
///
/// Both reads are one snapshot (a read transaction): read apart, a key
/// rewritten between them had its one row moved above `upto` and was in
/// neither this read nor, for a catch-up, anywhere before the feed's next
/// rows — where a key rewritten every few milliseconds keeps coming after
/// any marker a snapshot waits for ([`super::snapshot_synced`]).
fn rows_since(conn: &Connection, after: u64, filter: &str) -> rusqlite::Result<(Vec<Row>, u64)> {
    if conn.is_autocommit() {
        let tx = conn.unchecked_transaction()?;
        let read = rows_since_in(&tx, after, filter)?;
        tx.commit()?;
        Ok(read)
    } else {
        rows_since_in(conn, after, filter)
    }
}

fn rows_since_in(conn: &Connection, after: u64, filter: &str) -> rusqlite::Result<(Vec<Row>, u64)> {
    let upto = newest_revision(conn)?;
    if upto <= after {
        return Ok((Vec::new(), after));
    }
    let map = |r: &rusqlite::Row<'_>| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<Vec<u8>>>(1)?,
            from_i64(r.get(2)?),
            StoreTime {
                era: from_i64(r.get(3)?),
                nanos: from_i64(r.get(4)?),
            },
        ))
    };
    let (a, b) = (to_i64(after), to_i64(upto));
    let rows: Vec<Row> = if filter.is_empty() {
        conn.prepare_cached(
            "SELECT key, value, revision, era, nanos FROM kv
             WHERE revision > ?1 AND revision <= ?2 ORDER BY revision",
        )?
        .query_map(rusqlite::params![a, b], map)?
        .collect::<rusqlite::Result<_>>()?
    } else if let Some(end) = past_prefix(filter) {
        conn.prepare_cached(
            "SELECT key, value, revision, era, nanos FROM kv
             WHERE key > ?3 AND key < ?4 AND revision > ?1 AND revision <= ?2
             ORDER BY revision",
        )?
        .query_map(rusqlite::params![a, b, filter, end], map)?
        .collect::<rusqlite::Result<_>>()?
    } else {
        conn.prepare_cached(
            "SELECT key, value, revision, era, nanos FROM kv
             WHERE key = ?3 AND revision > ?1 AND revision <= ?2",
        )?
        .query_map(rusqlite::params![a, b, filter], map)?
        .collect::<rusqlite::Result<_>>()?
    };
    let rows = rows
        .into_iter()
        .filter(|r| filter_matches(filter, &r.0))
        .collect();
    Ok((rows, upto))
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

    /// Starts the handle's watch feed unless one runs: a read-only
    /// connection of its own (so that reading never queues behind writes)
    /// and a task that reads every row above the last revision it read
    /// whenever a write may have happened, handing each to the hub.
    async fn start_feed(&self, filter: &str, timeout: Duration) -> Result<(), StoreError> {
        let _one = self.inner.starting.lock().await;
        if self.inner.hub.is_live() {
            return Ok(());
        }
        let path = self.inner.path.clone();
        let f = filter.to_owned();
        let conn = Arc::new(Mutex::new(
            tokio::task::spawn_blocking(move || {
                let mut c = Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                c.busy_handler(Some(busy_wait))?;
                Ok(c)
            })
            .await
            .map_err(|e| StoreError::unknown(Op::Watch, &f, e))?
            .map_err(|e| sql_err(Op::Watch, &f, &e))?,
        ));
        // Where the feed starts: every watch taken from now on reads its
        // catch-up after this, so nothing at or below it is needed.
        let files = self.inner.files.clone();
        let last = on_conn(
            conn.clone(),
            Op::Watch,
            filter,
            timeout,
            checked(files.clone(), Op::Watch, filter, move |c| {
                newest_revision(c).map_err(|e| sql_err(Op::Watch, "", &e))
            }),
        )
        .await?;
        let exiting = self.inner.exiting.clone();
        let wal = if exiting.is_set() {
            None
        } else {
            wal_changes(&self.inner.path)
        };
        tokio::spawn(feed(
            Arc::downgrade(&self.inner.hub),
            conn,
            files,
            self.inner.epoch,
            last,
            Wakeups {
                written: self.inner.written.clone(),
                exiting,
            },
            wal,
        ));
        self.inner.hub.revive();
        Ok(())
    }
}

/// A watch event of a row.
fn row_event(epoch: u64, (key, value, revision, time): Row) -> WatchEvent {
    WatchEvent {
        key,
        entry: value.map(|value| Entry {
            value,
            token: Token::new(epoch, revision),
            time,
        }),
        revision,
        time,
    }
}

/// What wakes a feed besides its poll.
struct Wakeups {
    /// This handle's own writes.
    written: Arc<tokio::sync::Notify>,
    /// The process exits soon: the inotify watch goes.
    exiting: Arc<Exiting>,
}

/// The feed of one handle: reads the rows above `last` when this handle
/// wrote, when the `-wal` file changed (another process wrote; tried again
/// soon when nothing showed yet, [`next_recheck`]), or every
/// [`WATCH_POLL`], and hands them to the hub in revision order. Ends when
/// the handle is gone; on an error (the file replaced, unreadable) it
/// fails every watch, and the next watch starts a new feed. Once the
/// process said it exits soon it removes its inotify watch and polls.
async fn feed(
    hub: std::sync::Weak<Hub>,
    conn: Arc<Mutex<Connection>>,
    files: Arc<Files>,
    epoch: u64,
    mut last: u64,
    wake: Wakeups,
    mut wal: Option<WalChanges>,
) {
    // A read sooner than the poll, after a change of the `-wal` file that
    // showed nothing yet ([`next_recheck`]).
    let mut recheck: Option<Duration> = None;
    loop {
        if wake.exiting.is_set() {
            if let Some(w) = wal.as_mut() {
                w.stop();
            }
        }
        let mut by_wal = false;
        tokio::select! {
            _ = wake.written.notified() => {}
            _ = tokio::time::sleep(recheck.unwrap_or(WATCH_POLL)) => {}
            () = async {
                match wal.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                }
            } => by_wal = true,
            _ = wake.exiting.told.notified() => continue,
        }
        // Changes made before this read are read now: their events are
        // no reason to read again (our own commits' among them). One taken
        // here counts as a wake by the file: its commit may not show yet.
        if let Some(w) = wal.as_mut() {
            by_wal |= w.drain();
        }
        let Some(hub) = hub.upgrade() else { return };
        let polled = on_conn(
            conn.clone(),
            Op::Watch,
            "",
            BUSY_TIMEOUT * 2,
            checked(files.clone(), Op::Watch, "", move |c| {
                rows_since(c, last, "").map_err(|e| sql_err(Op::Watch, "", &e))
            }),
        )
        .await;
        match polled {
            Ok((rows, upto)) => {
                recheck = next_recheck(by_wal, upto > last, recheck);
                for row in rows {
                    hub.dispatch(&row_event(epoch, row));
                }
                last = upto;
            }
            Err(e) => {
                hub.fail(|| e.clone());
                return;
            }
        }
    }
}

/// The first read again after a change of the `-wal` file that showed no
/// new commit.
const RECHECK_FIRST: Duration = Duration::from_millis(1);

/// When the feed reads again before its poll. Another process's commit
/// changes the `-wal` file before it is visible: its frames are written
/// (and synced) first, and only then does the WAL index say they are
/// committed. A read woken by the change can fall in between and find
/// nothing; with no later write to wake the feed, the last commit of a
/// burst — a release, a ticket removed — would wait for the poll
/// ([`WATCH_POLL`]). So a read woken by the file that finds nothing is
/// tried again after [`RECHECK_FIRST`], then after twice as long each time,
/// until it finds the commit or the wait reaches the poll's. The file's
/// events that came before a read are drained before it
/// ([`WalChanges::drain`]), so a commit of this handle's own, read at once,
/// starts no tries.
fn next_recheck(by_wal: bool, found: bool, previous: Option<Duration>) -> Option<Duration> {
    if found {
        return None;
    }
    let next = match (by_wal, previous) {
        // Another change while trying again: the tries go on as they were
        // (a busy file does not make them more frequent).
        (_, Some(d)) => d * 2,
        (true, None) => RECHECK_FIRST,
        (false, None) => return None,
    };
    (next < WATCH_POLL).then_some(next)
}

/// Changes to the store's `-wal` file (every commit of every process
/// writes it), through inotify.
struct WalChanges {
    events: inotify::EventStream<[u8; 1024]>,
    /// The watch, until [`WalChanges::stop`].
    watch: Option<inotify::WatchDescriptor>,
}

/// Inotify on `<db>-wal`, or `None` where it cannot be had (the feed then
/// polls only).
fn wal_changes(db: &Path) -> Option<WalChanges> {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let watch = || -> std::io::Result<WalChanges> {
        let fd = inotify::Inotify::init()?;
        let watch = fd
            .watches()
            .add(Path::new(&wal), inotify::WatchMask::MODIFY)?;
        Ok(WalChanges {
            events: fd.into_event_stream([0; 1024])?,
            watch: Some(watch),
        })
    };
    watch()
        .map_err(
            |e| tracing::debug!(error = %e, "no inotify on the store's -wal file; watches poll"),
        )
        .ok()
}

impl WalChanges {
    /// Waits for the next change; after an inotify failure or
    /// [`WalChanges::stop`], forever (the feed's poll goes on).
    async fn changed(&mut self) {
        use futures::StreamExt;
        if self.watch.is_none() {
            return std::future::pending().await;
        }
        match self.events.next().await {
            Some(Ok(_)) => {}
            _ => std::future::pending().await,
        }
    }

    /// Takes the events already there without waiting, and says whether
    /// there were any: the read that follows sees their commits, or (not
    /// visible yet) is tried again.
    fn drain(&mut self) -> bool {
        use futures::{FutureExt, StreamExt};
        let mut any = false;
        if self.watch.is_some() {
            while let Some(Some(Ok(_))) = self.events.next().now_or_never() {
                any = true;
            }
        }
        any
    }

    /// Removes the watch now, keeping the descriptor. Removing a watch
    /// does not wait; closing an inotify descriptor waits until the
    /// kernel has freed the watches removed before (an RCU grace period,
    /// 7–15 ms on a busy file): done well before the exit, the exit's
    /// close finds nothing left to wait for.
    fn stop(&mut self) {
        if let Some(watch) = self.watch.take() {
            if let Err(e) = self.events.watches().remove(watch) {
                tracing::debug!(error = %e, "cannot remove the inotify watch of the -wal file");
            }
        }
    }
}

#[cfg(test)]
mod tests;
