//! Transition records: who held a lock when, and why it moved.
//!
//! A NATS KV key keeps only a short history of its own (8 revisions in a
//! bucket putex creates), far too short to answer "what happened last
//! night". So every failover agent (`putex run`) and every `putex lock`
//! holder writes a **transition record** of its own for each change of its
//! role that matters — into and out of `confirming`, `active`,
//! `stepping-down` and `lapsed` — and `putex history` / `putex watch` read
//! them back.
//!
//! # Layout
//!
//! One record per transition, written once with an unconditional `put` on
//! a key of its own ([`keys::history`]):
//! `history.<lock>.<node>-<instance8>-<seq>`, where `<instance8>` is the
//! first 8 characters of the writer's instance id and `<seq>` counts that
//! writer's records from 0. The value is versioned JSON
//! ([`TransitionRecord`]):
//!
//! ```json
//! {"v":1,"lock":"pg","node":"db2","instance":"4f1c…","seq":1,"source":"run",
//!  "from":"confirming","to":"active","reason":"fencing gap passed (S2)",
//!  "reason_code":"activated","token":{"epoch":1763…,"revision":812},
//!  "at":"2026-11-22T02:35:11.123Z"}
//! ```
//!
//! # Time and order
//!
//! Records are **ordered by their store revision**, never by a clock. `at`
//! is the writer's wall clock when the transition happened: it is there for
//! people to read and is never compared with another host's. Durations —
//! the time a lock had no active holder — are measured on the **store's
//! clock**: the store timestamps of the records themselves (the entry's
//! time, which the store assigns when the record lands; `docs/stores.md`). A
//! record lands about one store round trip after its transition, so these
//! durations are good to a round trip.
//!
//! # Never in the way
//!
//! The agent never waits for a record: [`HistoryWriter::send`] queues it
//! (a bounded queue; a full queue drops the record with a warning) and a
//! task of its own writes the queue in order, each write with a deadline.
//! A failed write is logged and forgotten: history is best effort, the
//! lock record alone decides who holds the lock. On exit the host gives
//! the queue a bounded moment to drain ([`HistoryWriter::flush`]).
//!
//! # Retention
//!
//! Distinct keys are not bounded by a bucket's per-key history, so the
//! writers prune: after about one write in [`PRUNE_EVERY`] (when the store
//! revision of the write is a multiple of it) the writer reads the lock's
//! records and removes all but the newest [`KEEP`]. On NATS a record is
//! removed by purging its subject from the stream, so nothing of it
//! remains (a plain delete would leave a delete marker and the old value
//! behind); if the credentials may not purge, it falls back to a delete.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use putex_core::{Reason, Role, StoreGap, StoreTime, Token};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::store::{keys, snapshot_synced, AnyStore, Entry, Store, StoreError};

/// The record format version this module writes and reads.
pub const RECORD_VERSION: u32 = 1;
/// How many transition records per lock the writers keep.
pub const KEEP: usize = 1000;
/// The writers prune after a write whose store revision is a multiple of
/// this: about one write in `PRUNE_EVERY`.
pub const PRUNE_EVERY: u64 = 32;
/// Records a writer queues before it drops new ones.
const QUEUE: usize = 256;

/// One transition of one node's role for one lock, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// The lock (or semaphore) name.
    pub lock: String,
    /// The store key of the lock record, when it is not `lock.<lock>` (a
    /// semaphore slot, `sem.<lock>.<n>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The writer's node id.
    pub node: String,
    /// The writer's instance id (one per start of an agent or `putex lock`).
    pub instance: String,
    /// The writer's record count, from 0.
    pub seq: u64,
    /// Who wrote it: `run` (the failover agent), `lock` (`putex lock`) or
    /// `serve` (the HTTP gateway).
    pub source: String,
    /// The old role (`standby`, `confirming`, `active`, …).
    pub from: String,
    /// The new role.
    pub to: String,
    /// Why, for people: the core [`Reason`]'s text.
    pub reason: String,
    /// Why, for programs: [`reason_code`].
    pub reason_code: String,
    /// The fencing token involved (the acquisition's on `confirming`, the
    /// one the service was started with on `active`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Token>,
    /// On a stale takeover: the evidence (S1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<StaleEvidence>,
    /// The writer's wall clock at the transition, RFC 3339 in UTC. For
    /// display only: order is by store revision, durations are on the
    /// store's clock.
    pub at: String,
}

/// The evidence of a stale takeover ([`Reason::AcquiredStale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleEvidence {
    /// The revision that went stale: the old holder's last write.
    pub revision: Token,
    /// How long the taker saw it unchanged, on its own clock (S1 a).
    pub unchanged_for_ms: u64,
    /// Its age on the store's clock at the taker's last probe (S1 b);
    /// absent when the store's clocks could not be compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_age_ms: Option<u64>,
}

/// A short, stable, machine-readable name for a [`Reason`]
/// (`acquired-stale`, `activated`, `keeper-fired`, …).
pub fn reason_code(reason: &Reason) -> &'static str {
    match reason {
        Reason::Started => "started",
        Reason::AcquiredReleased => "acquired-released",
        Reason::AcquiredStale { .. } => "acquired-stale",
        Reason::AcquiredAbsent => "acquired-absent",
        Reason::Resumed => "resumed",
        Reason::Activated => "activated",
        Reason::LicenceEnded => "licence-ended",
        Reason::Lost(_) => "lost",
        Reason::Unhealthy => "unhealthy",
        Reason::Shutdown => "shutdown",
        Reason::ReleaseRequested => "release-requested",
        Reason::ServiceExited => "service-exited",
        Reason::ActivationFailed => "activation-failed",
        Reason::KeeperRefused => "keeper-refused",
        Reason::StopTimedOut => "stop-timed-out",
        Reason::StopFailed => "stop-failed",
        Reason::KeeperFired => "keeper-fired",
        Reason::KeeperLost => "keeper-lost",
        Reason::Released => "released",
        Reason::ReleaseFailed => "release-failed",
        Reason::Stopped => "stopped",
    }
}

/// Whether a transition is worth a record: every one into or out of a
/// role that holds the lock (`confirming`, `active`, `stepping-down`,
/// `lapsed`). Start-up and exit of a standby are not.
pub fn is_recorded(from: Role, to: Role) -> bool {
    let holds = |r: Role| {
        matches!(
            r,
            Role::Confirming | Role::Active | Role::SteppingDown | Role::Lapsed
        )
    };
    from != to && (holds(from) || holds(to))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Writing.

/// Who writes, and how.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// The lock name.
    pub lock: String,
    /// This node's id.
    pub node: String,
    /// This writer's instance id.
    pub instance: String,
    /// [`TransitionRecord::source`].
    pub source: &'static str,
    /// The deadline of each write.
    pub timeout: Duration,
    /// Records per lock to keep when pruning ([`KEEP`]).
    pub keep: usize,
    /// Prune after writes whose revision is a multiple of this
    /// ([`PRUNE_EVERY`]; 0: never).
    pub prune_every: u64,
}

impl WriterConfig {
    /// A writer for `lock` with the default retention.
    pub fn new(
        lock: &str,
        node: &str,
        instance: &str,
        source: &'static str,
        timeout: Duration,
    ) -> WriterConfig {
        WriterConfig {
            lock: lock.to_owned(),
            node: node.to_owned(),
            instance: instance.to_owned(),
            source,
            timeout,
            keep: KEEP,
            prune_every: PRUNE_EVERY,
        }
    }
}

enum Msg {
    Write(Box<TransitionRecord>),
    Flush(oneshot::Sender<()>),
}

/// Writes one host's transition records in the background; clones share
/// the queue. See the [module docs](self).
#[derive(Clone)]
pub struct HistoryWriter {
    inner: Arc<WriterInner>,
}

struct WriterInner {
    cfg: WriterConfig,
    seq: AtomicU64,
    tx: mpsc::Sender<Msg>,
}

impl std::fmt::Debug for HistoryWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryWriter")
            .field("lock", &self.inner.cfg.lock)
            .field("node", &self.inner.cfg.node)
            .finish_non_exhaustive()
    }
}

impl HistoryWriter {
    /// Starts the writer's task on the current tokio runtime.
    pub fn spawn(store: AnyStore, cfg: WriterConfig) -> HistoryWriter {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_loop(store, cfg.clone(), rx));
        HistoryWriter {
            inner: Arc::new(WriterInner {
                cfg,
                seq: AtomicU64::new(0),
                tx,
            }),
        }
    }

    /// The record of a transition, stamped now with the next sequence
    /// number; `None` for a transition that is not recorded
    /// ([`is_recorded`]). `key` is the lock record's key when it is not
    /// `lock.<lock>`.
    pub fn record(
        &self,
        from: Role,
        to: Role,
        reason: &Reason,
        token: Option<Token>,
        key: Option<&str>,
    ) -> Option<TransitionRecord> {
        if !is_recorded(from, to) {
            return None;
        }
        let cfg = &self.inner.cfg;
        let stale = match reason {
            Reason::AcquiredStale {
                revision,
                unchanged_for,
                store_age,
            } => Some(StaleEvidence {
                revision: *revision,
                unchanged_for_ms: millis(*unchanged_for),
                store_age_ms: store_age.map(millis),
            }),
            _ => None,
        };
        Some(TransitionRecord {
            v: RECORD_VERSION,
            lock: cfg.lock.clone(),
            key: key.map(str::to_owned),
            node: cfg.node.clone(),
            instance: cfg.instance.clone(),
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
            source: cfg.source.to_owned(),
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_string(),
            reason_code: reason_code(reason).to_owned(),
            token,
            stale,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        })
    }

    /// Queues a record for writing. Never blocks: a full queue drops it
    /// with a warning.
    pub fn send(&self, record: TransitionRecord) {
        if let Err(e) = self.inner.tx.try_send(Msg::Write(Box::new(record))) {
            tracing::warn!(error = %e, "transition record dropped: the history queue is full or closed");
        }
    }

    /// [`record`](Self::record) and [`send`](Self::send): what a host's
    /// `event` calls on [`putex_core::Event::Transition`].
    pub fn transition(&self, from: Role, to: Role, reason: &Reason, token: Option<Token>) {
        if let Some(r) = self.record(from, to, reason, token, None) {
            self.send(r);
        }
    }

    /// Waits until every record queued so far was written or given up on,
    /// or `within` passed, whichever comes first.
    pub async fn flush(&self, within: Duration) {
        let (tx, rx) = oneshot::channel();
        let work = async {
            if self.inner.tx.send(Msg::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        };
        if tokio::time::timeout(within, work).await.is_err() {
            tracing::debug!("transition records still queued at exit");
        }
    }
}

async fn write_loop(store: AnyStore, cfg: WriterConfig, mut rx: mpsc::Receiver<Msg>) {
    // Pruning runs beside the writes, so that it never delays a record
    // (whose store time measures a gap). A request while one is pending
    // is merged into it; the pruner ends with this loop.
    let (prune_tx, prune_rx) = mpsc::channel(1);
    tokio::spawn(prune_loop(store.clone(), cfg.clone(), prune_rx));
    while let Some(msg) = rx.recv().await {
        let rec = match msg {
            Msg::Flush(done) => {
                let _ = done.send(());
                continue;
            }
            Msg::Write(rec) => *rec,
        };
        let key = match keys::history(&rec.lock, &rec.node, &rec.instance, rec.seq) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "transition record not written");
                continue;
            }
        };
        let bytes = serde_json::to_vec(&rec).expect("a transition record serialises");
        match store.put(&key, &bytes, cfg.timeout).await {
            Ok(token) => {
                tracing::debug!(key, revision = token.revision, "transition record written");
                if cfg.prune_every > 0 && token.revision % cfg.prune_every == 0 {
                    let _ = prune_tx.try_send(());
                }
            }
            Err(e) => tracing::warn!(
                key,
                error = %e,
                "transition record not written (best effort: `putex history` will miss it)"
            ),
        }
    }
}

async fn prune_loop(store: AnyStore, cfg: WriterConfig, mut due: mpsc::Receiver<()>) {
    while due.recv().await.is_some() {
        match prune(&store, &cfg.lock, cfg.keep, cfg.timeout * 4).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "pruned transition records"),
            Err(e) => tracing::warn!(error = %e, "cannot prune transition records"),
        }
    }
}

/// Removes all but the newest `keep` transition records of `lock` (by
/// store revision); returns how many it removed. Records that cannot be
/// removed now are left for the next prune.
pub async fn prune(
    store: &AnyStore,
    lock: &str,
    keep: usize,
    timeout: Duration,
) -> Result<usize, StoreError> {
    let filter = keys::history_of(lock)?;
    let marker = keys::history_scan(lock)?;
    let (entries, _) = snapshot_synced(store, &filter, &marker, timeout).await?;
    if entries.len() <= keep {
        return Ok(0);
    }
    let mut entries: Vec<(String, Entry)> = entries.into_iter().collect();
    entries.sort_by_key(|(_, e)| e.token.revision);
    let excess = entries.len() - keep;
    let mut removed = 0;
    for (key, e) in entries.into_iter().take(excess) {
        match remove(store, &key, e.token, timeout).await {
            Ok(()) => removed += 1,
            Err(e) => tracing::debug!(key, error = %e, "transition record not removed"),
        }
    }
    Ok(removed)
}

async fn remove(
    store: &AnyStore,
    key: &str,
    token: Token,
    timeout: Duration,
) -> Result<(), StoreError> {
    match store {
        AnyStore::Nats(nats) => match nats.purge_key(key, timeout).await {
            Ok(()) => return Ok(()),
            Err(e) => tracing::debug!(key, error = %e, "cannot purge; deleting instead"),
        },
        AnyStore::Sqlite(sqlite) => return sqlite.purge_key(key, token, timeout).await.map(drop),
        AnyStore::Memory(_) => {}
    }
    match store.delete(key, token, timeout).await {
        // Someone else pruned it first.
        Err(e) if e.is_conflict() => Ok(()),
        other => other,
    }
}

// ---------------------------------------------------------------------------
// Reading.

/// A transition record with what the store says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// Its key.
    pub key: String,
    /// Its store revision: the order of records.
    pub revision: u64,
    /// When the store applied it, on the store's clock.
    pub time: StoreTime,
    /// The record.
    pub record: TransitionRecord,
}

/// The transition records among `entries` (from a watch or a snapshot of
/// `history.<lock>.`), in store-revision order. Markers, unreadable values
/// and records of a newer format version are skipped.
pub fn parse(entries: impl IntoIterator<Item = (String, Entry)>) -> Vec<Stored> {
    let mut out: Vec<Stored> = entries
        .into_iter()
        .filter_map(|(key, e)| {
            let record: TransitionRecord = serde_json::from_slice(&e.value).ok()?;
            (record.v == RECORD_VERSION).then_some(Stored {
                key,
                revision: e.token.revision,
                time: e.time,
                record,
            })
        })
        .collect();
    out.sort_by_key(|s| s.revision);
    out
}

/// Every kept transition record of `lock`, in store-revision order: a
/// consistent read ([`snapshot_synced`] with the `history.<lock>.=scan`
/// marker), so every record written before the call is in it.
pub async fn read(
    store: &impl Store,
    lock: &str,
    timeout: Duration,
) -> Result<Vec<Stored>, StoreError> {
    let filter = keys::history_of(lock)?;
    let marker = keys::history_scan(lock)?;
    let (entries, _) = snapshot_synced(store, &filter, &marker, timeout).await?;
    Ok(parse(entries))
}

/// How [`HistoryRow::no_holder_ms`] was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoHolderBasis {
    /// From the previous holder's record of leaving `active` to this
    /// activation's record: both on the store's clock.
    Left,
    /// The previous holder left no record (it crashed, or its agent was
    /// cut off): from its last renewal — the stale record's store age at
    /// the takeover (S1 b), or the taker's own observation when the
    /// store's clocks were not comparable — to this activation.
    LastRenewal,
}

/// A transition record with what can be derived from the ones before it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryRow {
    /// The record's store revision (the order).
    pub revision: u64,
    /// The record's store time.
    pub store_time: StoreTime,
    /// The record itself.
    #[serde(flatten)]
    pub record: TransitionRecord,
    /// The node holding the lock as `active` after this transition, as
    /// far as the records tell (`None`: nobody).
    pub holder: Option<String>,
    /// Whether this transition made its node the holder (into `active`).
    pub activation: bool,
    /// On an activation: the holder before, if any record names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_holder: Option<String>,
    /// On an activation: how long the lock had no active holder before
    /// it, in ms of store time ([`NoHolderBasis`]); absent when unknown
    /// (the first activation, or clocks that cannot be compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_holder_ms: Option<u64>,
    /// How `no_holder_ms` was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_holder_basis: Option<NoHolderBasis>,
    /// On an activation: why its node took the lock (the reason code of
    /// its `confirming` transition: `acquired-stale`, `acquired-released`,
    /// …), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired: Option<String>,
}

#[derive(Default)]
struct KeyState {
    /// The active holder: node and instance.
    holder: Option<(String, String)>,
    /// The last node that was active.
    last: Option<String>,
    /// When the last holder's leaving `active` was recorded (store time),
    /// while nobody is active since.
    left: Option<StoreTime>,
    /// The latest `confirming` transition of each instance.
    acquired: HashMap<String, Stored>,
}

fn gap_ms(later: StoreTime, earlier: StoreTime) -> Option<u64> {
    match later.gap_since(earlier) {
        StoreGap::Forward(d) => Some(millis(d)),
        StoreGap::Backwards => Some(0),
        StoreGap::Unbounded => None,
    }
}

/// Derives holders, handovers and the time without a holder from records
/// in store-revision order ([`read`], [`parse`]). Each lock record key (a
/// semaphore has one per slot) is followed on its own.
pub fn derive(records: &[Stored]) -> Vec<HistoryRow> {
    let mut states: HashMap<String, KeyState> = HashMap::new();
    let mut rows = Vec::with_capacity(records.len());
    for s in records {
        let r = &s.record;
        let key = r.key.clone().unwrap_or_default();
        let st = states.entry(key).or_default();
        let mut row = HistoryRow {
            revision: s.revision,
            store_time: s.time,
            record: r.clone(),
            holder: None,
            activation: false,
            previous_holder: None,
            no_holder_ms: None,
            no_holder_basis: None,
            acquired: None,
        };
        let is_holder = st
            .holder
            .as_ref()
            .is_some_and(|(n, i)| *n == r.node && *i == r.instance);
        if r.to == "confirming" {
            st.acquired.insert(r.instance.clone(), s.clone());
        } else if r.to == "active" && !is_holder {
            row.activation = true;
            let acq = st.acquired.remove(&r.instance);
            row.acquired = acq.as_ref().map(|a| a.record.reason_code.clone());
            row.previous_holder = st
                .holder
                .as_ref()
                .map(|(n, _)| n.clone())
                .or_else(|| st.last.clone());
            // The previous holder recorded leaving: measure from there.
            // Otherwise estimate its last renewal from the takeover's
            // evidence (S1): the stale record's age when it was taken.
            let measured = match (st.holder.is_none(), st.left) {
                (true, Some(left)) => gap_ms(s.time, left).map(|g| (g, NoHolderBasis::Left)),
                _ => acq.as_ref().and_then(|a| {
                    let ev = a.record.stale?;
                    let age = ev.store_age_ms.unwrap_or(ev.unchanged_for_ms);
                    let since = gap_ms(s.time, a.time)?;
                    Some((since.saturating_add(age), NoHolderBasis::LastRenewal))
                }),
            };
            if let Some((ms, basis)) = measured {
                row.no_holder_ms = Some(ms);
                row.no_holder_basis = Some(basis);
            }
            st.holder = Some((r.node.clone(), r.instance.clone()));
            st.last = Some(r.node.clone());
            st.left = None;
        } else if r.from == "active" && r.to != "active" && is_holder {
            st.holder = None;
            st.left = Some(s.time);
        }
        row.holder = st.holder.as_ref().map(|(n, _)| n.clone());
        rows.push(row);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn rec(node: &str, instance: &str, from: Role, to: Role, reason: Reason) -> TransitionRecord {
        TransitionRecord {
            v: 1,
            lock: "pg".into(),
            key: None,
            node: node.into(),
            instance: instance.into(),
            seq: 0,
            source: "run".into(),
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_string(),
            reason_code: reason_code(&reason).into(),
            token: Some(Token::new(1, 1)),
            stale: match reason {
                Reason::AcquiredStale {
                    revision,
                    unchanged_for,
                    store_age,
                } => Some(StaleEvidence {
                    revision,
                    unchanged_for_ms: millis(unchanged_for),
                    store_age_ms: store_age.map(millis),
                }),
                _ => None,
            },
            at: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    fn at(revision: u64, ms: u64, record: TransitionRecord) -> Stored {
        Stored {
            key: format!("history.pg.{}-{revision}", record.node),
            revision,
            time: StoreTime {
                era: 1,
                nanos: ms * 1_000_000,
            },
            record,
        }
    }

    #[test]
    fn only_holding_transitions_are_recorded() {
        assert!(!is_recorded(Role::Starting, Role::Standby));
        assert!(!is_recorded(Role::Standby, Role::Exited));
        assert!(is_recorded(Role::Standby, Role::Confirming));
        assert!(is_recorded(Role::Confirming, Role::Active));
        assert!(is_recorded(Role::Active, Role::SteppingDown));
        assert!(is_recorded(Role::Lapsed, Role::Standby));
        assert!(is_recorded(Role::Starting, Role::Active)); // resumed (S5)
    }

    #[test]
    fn codes_are_distinct() {
        let all = [
            Reason::Started,
            Reason::AcquiredReleased,
            Reason::AcquiredStale {
                revision: Token::new(1, 2),
                unchanged_for: Duration::ZERO,
                store_age: None,
            },
            Reason::AcquiredAbsent,
            Reason::Resumed,
            Reason::Activated,
            Reason::LicenceEnded,
            Reason::Lost(putex_core::LossCause::Revoked),
            Reason::Unhealthy,
            Reason::Shutdown,
            Reason::ReleaseRequested,
            Reason::ServiceExited,
            Reason::ActivationFailed,
            Reason::KeeperRefused,
            Reason::StopTimedOut,
            Reason::StopFailed,
            Reason::KeeperFired,
            Reason::KeeperLost,
            Reason::Released,
            Reason::ReleaseFailed,
            Reason::Stopped,
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(reason_code).collect();
        assert_eq!(codes.len(), all.len());
    }

    #[test]
    fn crash_failover_and_graceful_handover_are_derived() {
        use Role::*;
        let stale = Reason::AcquiredStale {
            revision: Token::new(1, 5),
            unchanged_for: Duration::from_millis(330),
            store_age: Some(Duration::from_millis(320)),
        };
        let records = vec![
            at(
                1,
                0,
                rec("a", "ia", Standby, Confirming, Reason::AcquiredAbsent),
            ),
            at(
                2,
                500,
                rec("a", "ia", Confirming, Active, Reason::Activated),
            ),
            // a crashes: no record. b takes over after W, activates after G.
            at(9, 2_000, rec("b", "ib", Standby, Confirming, stale)),
            at(
                10,
                2_100,
                rec("b", "ib", Confirming, Active, Reason::Activated),
            ),
            // b hands over gracefully.
            at(
                11,
                3_000,
                rec("b", "ib", Active, SteppingDown, Reason::Shutdown),
            ),
            at(
                12,
                3_050,
                rec("b", "ib", SteppingDown, Standby, Reason::Released),
            ),
            at(
                13,
                3_060,
                rec("c", "ic", Standby, Confirming, Reason::AcquiredReleased),
            ),
            at(
                14,
                3_070,
                rec("c", "ic", Confirming, Active, Reason::Activated),
            ),
        ];
        let rows = derive(&records);
        let acts: Vec<&HistoryRow> = rows.iter().filter(|r| r.activation).collect();
        assert_eq!(acts.len(), 3);
        assert_eq!(acts[0].record.node, "a");
        assert_eq!(acts[0].previous_holder, None);
        assert_eq!(acts[0].no_holder_ms, None);
        assert_eq!(acts[0].acquired.as_deref(), Some("acquired-absent"));
        // b: 100 ms after its takeover, which found a's record 320 ms old.
        assert_eq!(acts[1].previous_holder.as_deref(), Some("a"));
        assert_eq!(acts[1].no_holder_ms, Some(420));
        assert_eq!(acts[1].no_holder_basis, Some(NoHolderBasis::LastRenewal));
        assert_eq!(acts[1].acquired.as_deref(), Some("acquired-stale"));
        // c: from b's leaving active to c's activation.
        assert_eq!(acts[2].previous_holder.as_deref(), Some("b"));
        assert_eq!(acts[2].no_holder_ms, Some(70));
        assert_eq!(acts[2].no_holder_basis, Some(NoHolderBasis::Left));
        // Holders along the way.
        let holders: Vec<Option<&str>> = rows.iter().map(|r| r.holder.as_deref()).collect();
        assert_eq!(
            holders,
            [
                None,
                Some("a"),
                Some("a"),
                Some("b"),
                None,
                None,
                None,
                Some("c")
            ]
        );
        let json = serde_json::to_value(&rows[3]).unwrap();
        for k in [
            "revision",
            "store_time",
            "lock",
            "node",
            "from",
            "to",
            "reason",
            "reason_code",
            "token",
            "at",
            "holder",
            "no_holder_ms",
        ] {
            assert!(json.get(k).is_some(), "{k} missing in {json}");
        }
    }

    #[test]
    fn a_late_record_of_an_old_holder_does_not_take_the_lock_back() {
        use Role::*;
        let records = vec![
            at(2, 0, rec("a", "ia", Confirming, Active, Reason::Activated)),
            at(
                10,
                2_100,
                rec("b", "ib", Confirming, Active, Reason::Activated),
            ),
            // a's agent was frozen; it records its lapse afterwards.
            at(
                11,
                2_500,
                rec("a", "ia", Active, Lapsed, Reason::KeeperFired),
            ),
        ];
        let rows = derive(&records);
        assert_eq!(rows[2].holder.as_deref(), Some("b"));
        assert_eq!(rows[1].previous_holder.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn pruning_leaves_nothing_behind_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = AnyStore::from(crate::store::SqliteStore::open(path.clone()).await.unwrap());
        let t = Duration::from_secs(2);
        let w = HistoryWriter::spawn(store.clone(), WriterConfig::new("pg", "a", "ia", "run", t));
        for _ in 0..3 {
            w.transition(Role::Confirming, Role::Active, &Reason::Activated, None);
            w.transition(Role::Active, Role::SteppingDown, &Reason::Shutdown, None);
        }
        w.flush(t).await;
        assert_eq!(prune(&store, "pg", 2, t).await.unwrap(), 4);
        let left = read(&store, "pg", t).await.unwrap();
        assert_eq!(
            left.iter().map(|s| s.record.seq).collect::<Vec<_>>(),
            [4, 5]
        );
        // No tombstones: the records and the scan marker are all that is left.
        let conn = rusqlite::Connection::open(&path).unwrap();
        let rows: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM kv WHERE key LIKE 'history.%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 3);
    }

    #[tokio::test]
    async fn writer_writes_in_order_and_prunes() {
        let store = AnyStore::from(MemoryStore::new());
        let mut cfg = WriterConfig::new(
            "pg",
            "db1.example.com",
            "abcdef0123",
            "run",
            Duration::from_secs(1),
        );
        cfg.keep = 4;
        cfg.prune_every = 1;
        let w = HistoryWriter::spawn(store.clone(), cfg);
        for _ in 0..5 {
            w.transition(
                Role::Standby,
                Role::Confirming,
                &Reason::AcquiredReleased,
                Some(Token::new(1, 3)),
            );
            w.transition(
                Role::Confirming,
                Role::Active,
                &Reason::Activated,
                Some(Token::new(1, 3)),
            );
            // Not recorded.
            w.transition(Role::Starting, Role::Standby, &Reason::Started, None);
        }
        w.flush(Duration::from_secs(5)).await;
        // Pruning runs beside the writes: give the last one a moment.
        let mut all = Vec::new();
        for _ in 0..100 {
            all = read(&store, "pg", Duration::from_secs(2)).await.unwrap();
            if all.len() <= 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(all.len(), 4, "{all:?}");
        let seqs: Vec<u64> = all.iter().map(|s| s.record.seq).collect();
        assert_eq!(seqs, [6, 7, 8, 9]);
        assert!(all[0]
            .key
            .starts_with("history.pg.db1.example.com-abcdef01-"));
        assert_eq!(all[3].record.reason_code, "activated");
        assert_eq!(all[3].record.token, Some(Token::new(1, 3)));
    }
}
