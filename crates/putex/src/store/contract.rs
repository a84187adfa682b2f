//! The store contract every backend keeps: the [`Store`] trait (get,
//! create, update, put, delete, watch, guarded writes, each with an
//! *unknown* outcome), its errors and its operations, and what the
//! backends share (deadlines, the boot-time store clock, complete prefix
//! reads). The backends and [`super::AnyStore`] build on it; it depends on
//! none of them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::keys;
use putex_core::store::{Entry, StoreTime, Token};

/// How long a store keeps the trace of a retired key ([`Store::retire`]):
/// the delete marker (NATS, as a per-message TTL) or tombstone (SQLite)
/// that tells watchers the key is gone. Long enough for any watcher that
/// is merely slow (a feed re-established after a server restart or a
/// leader election, 4–9 s); short enough that a busy queue's markers stay
/// few (a resource handed on 300 times a second keeps 9,000).
pub const RETIRED_KEPT: Duration = Duration::from_secs(30);

/// The store operation an error is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Op {
    /// Opening the store (connecting, creating the bucket or file).
    Open,
    /// [`Store::get`].
    Get,
    /// [`Store::create`].
    Create,
    /// [`Store::update`].
    Update,
    /// [`Store::put`].
    Put,
    /// [`Store::delete`].
    Delete,
    /// [`Store::watch`] (starting it, or an event it failed to deliver).
    Watch,
    /// [`Store::guarded`].
    Guarded,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Get => "get",
            Op::Create => "create",
            Op::Update => "update",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Watch => "watch",
            Op::Guarded => "guarded write",
        })
    }
}

/// Why a store operation did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The write was definitely not applied: the record was not at the
    /// expected revision (or epoch), or already existed for a create.
    #[error("{op} {key}: conflict (not applied: the record is not at the expected revision)")]
    Conflict {
        /// Which [`Store`] call was refused.
        op: Op,
        /// The key the call was about, as passed (e.g. `lock.<name>`).
        key: String,
    },
    /// Timed out or lost the connection: a write may or may not have been
    /// applied. Never a conflict in disguise. (For a call that writes
    /// nothing — open, get, watch — the text says only that the store is
    /// unavailable.)
    #[error("{op} {key}: {}", unknown_text(*.op, .reason))]
    Unknown {
        /// Which [`Store`] call ended without a known outcome.
        op: Op,
        /// The key (or watch filter).
        key: String,
        /// What happened, for the log.
        reason: String,
    },
    /// A problem retrying will not fix: a bad URL or key, an unfit bucket,
    /// a server too old, an unreadable file.
    #[error("store configuration: {reason}")]
    Config {
        /// What is wrong and, where it helps, how to fix it.
        reason: String,
    },
}

/// The text of an [`StoreError::Unknown`]: what a caller may assume of a
/// write, or, of a call that writes nothing, that the store is unavailable.
fn unknown_text(op: Op, reason: &str) -> String {
    match op {
        Op::Open | Op::Get | Op::Watch => {
            format!("store unavailable ({reason})")
        }
        Op::Create | Op::Update | Op::Put | Op::Delete | Op::Guarded => {
            format!("outcome unknown ({reason}); a write may or may not have been applied")
        }
    }
}

impl StoreError {
    /// An [`StoreError::Unknown`].
    pub fn unknown(op: Op, key: &str, reason: impl fmt::Display) -> Self {
        StoreError::Unknown {
            op,
            key: key.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// A [`StoreError::Conflict`].
    pub fn conflict(op: Op, key: &str) -> Self {
        StoreError::Conflict {
            op,
            key: key.to_owned(),
        }
    }

    /// A [`StoreError::Config`].
    pub fn config(reason: impl fmt::Display) -> Self {
        StoreError::Config {
            reason: reason.to_string(),
        }
    }

    /// The deadline passed before the store answered.
    pub fn timed_out(op: Op, key: &str, timeout: Duration) -> Self {
        Self::unknown(op, key, format_args!("no answer within {timeout:?}"))
    }

    /// Whether this is a conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    /// Whether the outcome is unknown.
    pub fn is_unknown(&self) -> bool {
        matches!(self, StoreError::Unknown { .. })
    }

    /// The core's outcome class for this error.
    pub fn outcome(&self) -> putex_core::store::StoreOutcome {
        use putex_core::store::StoreOutcome;
        match self {
            StoreError::Conflict { .. } => StoreOutcome::Conflict,
            StoreError::Unknown { .. } => StoreOutcome::Unknown,
            StoreError::Config { reason } => StoreOutcome::Failed(reason.clone()),
        }
    }
}

impl From<keys::KeyError> for StoreError {
    fn from(e: keys::KeyError) -> Self {
        StoreError::config(e)
    }
}

/// How fresh a read must be.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum ReadMode {
    /// Any replica may answer; it may lag behind our own latest writes.
    #[default]
    Any,
    /// The read must see the caller's own latest writes (H4). On NATS it is
    /// answered by the stream leader (last message by subject), never by a
    /// direct get that a lagging replica may serve.
    Leader,
}

/// A lock record's create ([`Store::create_vacant`]): its token, and how
/// long the store proves the key was without a record before it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Created {
    /// The create's token.
    pub token: Token,
    /// Real time (within ε, on a clock that never jumps) the key was
    /// provably vacant before the create; zero when the store cannot tell.
    pub vacant_for: Duration,
}

/// One change seen by a watch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WatchEvent {
    /// The key that changed: a full key under the watched prefix (e.g.
    /// `lock.<name>`).
    pub key: String,
    /// The new entry; `None` when the key was deleted or purged.
    pub entry: Option<Entry>,
    /// The revision of the change (of the delete marker for a delete).
    /// Events of one watch come in strictly increasing revision order.
    pub revision: u64,
    /// When the store applied the change, on the store's clock.
    pub time: StoreTime,
}

/// The stream of changes a watch delivers.
///
/// It may end (`None`) or yield an error; either way the watch is over and
/// must be re-established with `from_revision` = last seen revision + 1.
pub type WatchStream = Pin<Box<dyn futures::Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// One write of a guarded batch ([`Store::guarded`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` to `value`.
    Put {
        /// The key written.
        key: String,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Deletes `key`; nothing when it is absent.
    Delete {
        /// The key deleted.
        key: String,
    },
}

impl Write {
    /// The key this write is about.
    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// Checks a guarded batch before any store sees it: valid keys, at least
/// one write, none of them to the guard itself.
pub(crate) fn check_guarded(guard_key: &str, writes: &[Write]) -> Result<(), StoreError> {
    keys::validate_key(guard_key)?;
    if writes.is_empty() {
        return Err(StoreError::config(
            "a guarded write needs at least one write",
        ));
    }
    for (i, w) in writes.iter().enumerate() {
        keys::validate_key(w.key())?;
        if writes[..i].iter().any(|o| o.key() == w.key()) {
            return Err(StoreError::config(format!(
                "a guarded write names {:?} twice: one write per key",
                w.key()
            )));
        }
        if w.key() == guard_key {
            return Err(StoreError::config(format!(
                "a guarded write cannot write its own guard {guard_key:?}"
            )));
        }
    }
    Ok(())
}

/// The store contract (`docs/stores.md`). Every call takes a `timeout`; when it
/// passes without an answer the call returns [`StoreError::Unknown`].
///
/// Keys must pass [`keys::validate_key`]; a bad key is a
/// [`StoreError::Config`].
pub trait Store: Send + Sync {
    /// The bucket incarnation: tokens carry it, and it compares higher for a
    /// re-created bucket (S6). Cheap: no store round trip.
    fn epoch(&self) -> u64;

    /// Whether this store's times say when this handle first *saw* a write
    /// rather than when the store applied it (etcd, whose keys carry no
    /// time: [`crate::store::etcd`]). Such times are safe for S1 (b) but say little about
    /// records written long before: history durations then use the
    /// writers' own clocks.
    fn times_are_first_seen(&self) -> bool {
        false
    }

    /// Reads a record; `None` when it is absent or deleted.
    fn get(
        &self,
        key: &str,
        mode: ReadMode,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send;

    /// Writes a record that must not exist (or was deleted).
    fn create(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> impl Future<Output = Result<Token, StoreError>> + Send;

    /// [`Store::create`] of a lock record, with how long this store proves
    /// the key was vacant before it (S4 refined: `docs/safety.md`, "When an
    /// absent record proves vacancy"; `docs/stores.md`, "First use"). The
    /// default proves nothing: a store that may lose acknowledged writes,
    /// or whose clock may jump, answers zero.
    fn create_vacant(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> impl Future<Output = Result<Created, StoreError>> + Send {
        async move {
            Ok(Created {
                token: self.create(key, value, timeout).await?,
                vacant_for: Duration::ZERO,
            })
        }
    }

    /// Compare-and-swap: writes only if the record is still at `expected`.
    /// An `expected.epoch` other than the store's is a conflict: a re-created
    /// bucket restarts its revisions.
    fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> impl Future<Output = Result<Token, StoreError>> + Send;

    /// Unconditional write (probe records only).
    fn put(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> impl Future<Output = Result<Token, StoreError>> + Send;

    /// Deletes a record that is still at `expected`. `expected` must be the
    /// token of a live entry (read or written): the revision of a delete
    /// marker, seen only in watches, is no valid expectation (NATS would
    /// accept a CAS on it, the other stores would not).
    fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// [`Store::delete`] for a key that is never written again (a waiter's
    /// ticket, an HTTP grant: their keys name one waiter or one request):
    /// watchers see the delete as usual, and [`RETIRED_KEPT`] later the
    /// store forgets the key altogether. A plain delete leaves a delete
    /// marker (NATS) or a tombstone (SQLite) for good, and every one of
    /// them costs each later watch of its prefix a delivery: one per
    /// `putex lock` run, without end (`docs/stores.md`, "Retired keys").
    /// A watcher that misses more than [`RETIRED_KEPT`] of changes may miss
    /// such a delete; the records retired this way expire by observation
    /// anyway (a ticket nobody refreshes is skipped). The default is
    /// [`Store::delete`] (etcd keeps no deleted key beyond its compaction).
    fn retire(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.delete(key, expected, timeout)
    }

    /// A guarded write (`docs/locks.md`, "Guarded writes"): applies every
    /// write of `writes` — all or none, in order — only if the record at
    /// `guard_key` is, when the store commits them, still the live entry
    /// at `guard`; otherwise a conflict, and nothing is written. The check
    /// and the writes are one step of the store (a transaction, a
    /// conditional publish), never a read followed by a write. Returns the
    /// token of the last write.
    ///
    /// On NATS, more than one write is an atomic batch (nats-server 2.12+;
    /// the first batch lets the bucket take them, `allow_atomic`); an older
    /// server refuses it with a [`StoreError::Config`].
    fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> impl Future<Output = Result<Token, StoreError>> + Send;

    /// Watches the keys that `filter` selects: `""` for every key, a prefix
    /// ending in `.` (e.g. `"member.pg."`) for the keys under it, or one key.
    ///
    /// With `from_revision: None` the stream first delivers the latest entry
    /// of every selected key (delete markers included), then each change.
    /// With `Some(r)` it delivers the changes with revision `>= r`. A store
    /// may coalesce several changes of one key into its latest (the SQLite
    /// store does; NATS delivers what the bucket's history still holds), but
    /// revisions always increase and the latest state of every key is
    /// always delivered. `timeout` bounds starting the watch.
    fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> impl Future<Output = Result<WatchStream, StoreError>> + Send;
}

/// Every record under `prefix` (ending in `.`) as of now:
/// [`snapshot_synced`] with the marker `<prefix>=scan` — `=` is no name
/// character, so the marker is never a lock, ticket or member.
pub async fn read_prefix(
    store: &impl Store,
    prefix: &str,
    timeout: Duration,
) -> Result<Vec<(String, Entry)>, StoreError> {
    let marker = format!("{prefix}=scan");
    let (records, _) = snapshot_synced(store, prefix, &marker, timeout).await?;
    Ok(records.into_iter().collect())
}

/// The latest entry of every key under `filter` as of now, complete: writes
/// `marker` (a key under `filter`, unconditionally) and reads the watch's
/// initial delivery up to the marker. Every backend delivers in revision
/// order, so every key last written before the marker has been seen by
/// then — but a key written again after the marker (a member renewing)
/// comes after it, its older state coalesced away, so the marker is
/// written a second time once the first is seen, and the read goes on to
/// that: it comes after the watch's whole first read. Returns the entries
/// (without the marker and delete markers) and the second marker's store
/// time: the store's "now".
///
/// Fails with [`StoreError::Unknown`] when the marker does not arrive within
/// `timeout`.
pub async fn snapshot_synced(
    store: &impl Store,
    filter: &str,
    marker: &str,
    timeout: Duration,
) -> Result<(std::collections::BTreeMap<String, Entry>, StoreTime), StoreError> {
    use futures::StreamExt;
    debug_assert!(
        keys::filter_matches(filter, marker),
        "{marker} not under {filter}"
    );
    let deadline = tokio::time::Instant::now() + timeout;
    const SCAN: &[u8] = br#"{"v":1,"kind":"scan"}"#;
    let mark = store.put(marker, SCAN, timeout).await?;
    let mut w = store.watch(filter, None, timeout).await?;
    let mut latest = std::collections::BTreeMap::new();
    let mut second: Option<u64> = None;
    loop {
        let ev = match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) => return Err(StoreError::unknown(Op::Watch, filter, "the watch ended")),
            Err(_) => return Err(StoreError::timed_out(Op::Watch, filter, timeout)),
        };
        if ev.key == marker {
            match second {
                // The first marker: every key that had not changed since
                // came before it. A key that changed after it (a member
                // renewing) comes after it, in the watch's first read, its
                // older state coalesced away: written now, a second marker
                // comes after that first read, so after those keys too.
                None if ev.revision >= mark.revision => {
                    second = Some(store.put(marker, SCAN, timeout).await?.revision);
                }
                Some(r) if ev.revision >= r => return Ok((latest, ev.time)),
                _ => {}
            }
            continue;
        }
        match ev.entry {
            Some(e) => latest.insert(ev.key, e),
            None => latest.remove(&ev.key),
        };
    }
}

/// Runs `fut` with a deadline; expiry is [`StoreError::Unknown`].
pub(crate) async fn with_deadline<T>(
    op: Op,
    key: &str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::timed_out(op, key, timeout)),
    }
}

/// Nanoseconds since the Unix epoch on the wall clock: used only for epochs
/// (bucket/file creation times), never for a timing decision.
pub(crate) fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The clock domain of this boot: an FNV-1a hash of
/// `/proc/sys/kernel/random/boot_id` (stable across processes and putex
/// versions, unlike `std`'s hasher).
pub(crate) fn boot_era() -> u64 {
    static ERA: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ERA.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        fnv1a(id.trim().as_bytes())
    })
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// This boot's store time: (boot era, `CLOCK_BOOTTIME` in nanoseconds).
pub(crate) fn boot_time_now() -> StoreTime {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is available on Linux");
    let nanos = u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0);
    StoreTime {
        era: boot_era(),
        nanos,
    }
}
