//! The watch feed: one per handle, on a read-only connection of its own,
//! reading the rows above the last revision it read whenever a write may
//! have happened — this handle wrote, another process wrote (inotify on
//! the `-wal` file, tried again shortly when a commit does not show yet),
//! or every [`WATCH_POLL`] — and handing them to the hub in revision order.
//! The table keeps only the latest change per key, so a watcher may see
//! several quick changes of one key as its latest.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::Mutex;

use super::connection::{busy_wait, checked, on_conn, sql_err, BUSY_TIMEOUT};
use super::files::Files;
use super::schema::{from_i64, newest_revision, past_prefix, to_i64};
use super::{Exiting, Row, SqliteStore};
use crate::store::hub::Hub;
use crate::store::keys::filter_matches;
use crate::store::{Entry, Op, StoreError, StoreTime, Token, WatchEvent};

/// How often the watch feed reads new revisions when nothing told it of a
/// change: a write through this handle wakes it at once, another process's
/// write through inotify on the `-wal` file; this poll is the fallback
/// (a file system without inotify, an event lost).
pub const WATCH_POLL: Duration = Duration::from_millis(100);

impl SqliteStore {
    /// Starts the handle's watch feed unless one runs: a read-only
    /// connection of its own (so that reading never queues behind writes)
    /// and a task that reads every row above the last revision it read
    /// whenever a write may have happened, handing each to the hub.
    pub(super) async fn start_feed(
        &self,
        filter: &str,
        timeout: Duration,
    ) -> Result<(), StoreError> {
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
pub(super) fn row_event(epoch: u64, (key, value, revision, time): Row) -> WatchEvent {
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
pub(super) fn next_recheck(
    by_wal: bool,
    found: bool,
    previous: Option<Duration>,
) -> Option<Duration> {
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
/// any marker a snapshot waits for ([`snapshot_synced`](crate::store::snapshot_synced)).
pub(super) fn rows_since(
    conn: &Connection,
    after: u64,
    filter: &str,
) -> rusqlite::Result<(Vec<Row>, u64)> {
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
