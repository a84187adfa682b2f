//! The writes: every one is queued, and whichever call takes the
//! connection next commits the whole queue in one `BEGIN IMMEDIATE`
//! transaction (group commit), each write still its own compare-and-swap
//! in queue order. A write whose caller gave up before SQLite's write lock
//! was won is left out, so it never lands late; every caller hears its
//! outcome only once the commit and the check of the files are done.

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::connection::sql_err;
use super::schema::{from_i64, newest_revision, past_prefix, to_i64};
use super::{Expect, Inner, Queued, SqliteStore, Written};
use crate::store::keys::validate_key;
use crate::store::{
    boot_time_now, with_deadline, Op, StoreError, StoreTime, Token, Write, RETIRED_KEPT,
};

impl SqliteStore {
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
    pub(super) async fn write(
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

    /// [`Store::delete`](crate::store::Store::delete), or with `retire`
    /// [`Store::retire`](crate::store::Store::retire).
    pub(super) async fn delete_at(
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
    pub(super) async fn write_queued(
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
    pub(super) async fn commit_turn(
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

/// The writes of a guarded batch whose guard holds
/// ([`Store::guarded`](crate::store::Store::guarded)), in the batch's
/// transaction: the revision and time of the last.
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

/// Removes the tombstones under `key`'s parent prefix (`queue.<name>.` for
/// a ticket) that are older than [`RETIRED_KEPT`] — or from another boot,
/// whose times do not compare — now that a watcher has had that long to see
/// each ([`Store::retire`](crate::store::Store::retire)). Only retired keys
/// live under such a prefix, so every tombstone there is a retired key's.
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
