//! Opening the database: its directory, WAL journal and `synchronous=FULL`,
//! the tables (`meta`, `counter`, `kv`, `deleted` and the trigger that
//! fills it), the epoch (the file's creation time, written once) and when
//! the file was made as far as anyone can prove ([`made_at`]); and the few
//! facts of the layout that every query shares: integers stored as the
//! same 64 bits ([`to_i64`], [`from_i64`]), the revision counter
//! ([`newest_revision`]) and the key range of a prefix ([`past_prefix`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::Mutex;

use super::connection::{busy_wait, BUSY_TIMEOUT};
use super::files::{file_id, refuse_leftovers, FileError, Files};
use super::{Inner, SqliteStore};
use crate::store::hub::Hub;
use crate::store::keys::{GRANT_PREFIX, HISTORY_PREFIX, ID_PREFIX, QUEUE_PREFIX};
use crate::store::{boot_time_now, wall_nanos, Op, StoreError, StoreTime};

impl SqliteStore {
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

pub(super) fn to_i64(v: u64) -> i64 {
    // Stored as the same 64 bits; read back with `from_i64`.
    v as i64
}

pub(super) fn from_i64(v: i64) -> u64 {
    v as u64
}

/// For a prefix `stem.`: the first key past every key under it, `stem/`
/// (`/` follows `.`), so that those keys are `> prefix AND < past`. `None`
/// for anything but a prefix.
pub(super) fn past_prefix(prefix: &str) -> Option<String> {
    prefix.strip_suffix('.').map(|stem| format!("{stem}/"))
}

/// The newest revision committed.
pub(super) fn newest_revision(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT revision FROM counter WHERE id = 0")?
        .query_row([], |r| r.get::<_, i64>(0))
        .map(from_i64)
}
