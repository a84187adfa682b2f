//! The distributed store: a NATS JetStream KV bucket (default `putex`).
//!
//! - **Writes** are publishes to `$KV.<bucket>.<key>` with the
//!   `Nats-Expected-Last-Subject-Sequence` header (0 for a create), made
//!   here rather than through `kv::Store::update` so that the server's error
//!   code reaches the classifier, and answered on one subscription per
//!   handle (`acks`): 10071 (wrong last sequence) **and** 10164 (what a
//!   replicated bucket answers) are conflicts; a timeout, a lost
//!   connection, "no responders" during a leader election or anything
//!   unrecognised is **unknown** — both `create` and `update` have been
//!   seen to land after a timeout.
//! - **Reads**: [`ReadMode::Leader`] asks the stream leader for the last
//!   message of the key's subject (`STREAM.MSG.GET`); [`ReadMode::Any`] uses
//!   direct get, which any replica may answer.
//! - **Epoch**: the stream's creation time in nanoseconds; a re-created
//!   bucket has a later one. A bucket putex creates has *dated* revisions:
//!   it counts them from its creation time in microseconds
//!   ([`first_dated_revision`]), so no two incarnations share one, and a
//!   compare-and-swap on a dated revision is one publish. On an undated
//!   bucket (written before putex first opened it) a compare-and-swap
//!   reads the epoch from the stream leader (a stream-info request) right
//!   before it publishes: a re-created bucket restarts its revisions, and a
//!   token of the old bucket must be a conflict there, never a hit on the
//!   new bucket's record at the same revision. Other calls use the epoch
//!   cached at open, re-read after every reconnect and every 5 s.
//! - **Store time**: era 1, nanos = the message timestamp (the stream
//!   leader's wall clock; it can jump at a leader change).
//! - **Opening** refuses nats-server older than 2.11, creates the bucket if
//!   missing (history 8, no TTL, file storage, the URL's replicas), refuses
//!   a bucket whose records expire (max age or per-message TTL would let a
//!   lock vanish) and warns about other unfit settings.
//!
//! The code: `open.rs` connects, checks the server and finds or creates
//! the bucket; `calls.rs` admits each call in turn and notes its answer,
//! so that a handle cut off with its server reconnects (`stuck.rs`);
//! `writes.rs` publishes with the expected revision (answered through
//! `acks.rs`) and makes the compare-and-swaps; `watch.rs` feeds the
//! watches. The handle, its epoch, its reads and the [`Store`] operations
//! are here.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream::StorageType};
use async_nats::ServerAddr;

use super::hub::Hub;
use super::keys::{validate_filter, validate_key};
use super::url::{NatsAuth, NatsConfig};
use super::{
    check_guarded, with_deadline, Entry, Op, ReadMode, Store, StoreError, StoreTime, Token,
    WatchStream, Write,
};

/// The one clock domain of NATS store time.
pub const NATS_ERA: u64 = 1;
/// History a bucket that putex creates keeps per key.
pub const HISTORY: i64 = 8;
/// The oldest nats-server putex runs against.
pub const MIN_SERVER: (u64, u64, u64) = (2, 11, 0);
/// How long opening (connecting, finding or creating the bucket) may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the first attempt to find or create the bucket may take. A
/// cluster that is still electing its JetStream meta leader leaves some API
/// requests unanswered; each attempt is tried again with twice the time (up
/// to [`OPEN_ATTEMPT_MAX`]), within [`OPEN_TIMEOUT`].
const OPEN_ATTEMPT: Duration = Duration::from_secs(1);
/// The longest single attempt to find or create the bucket.
const OPEN_ATTEMPT_MAX: Duration = Duration::from_secs(4);

const KV_OPERATION: &str = "KV-Operation";
/// "wrong last sequence": the compare-and-swap did not match.
const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;
/// The same answer from a replicated stream.
const ERR_WRONG_LAST_SEQUENCE_CONSTANT: u64 = 10164;

/// Answers to a bucket creation that retrying will not change.
const CONFIG_REJECTIONS: [jetstream::ErrorCode; 6] = [
    jetstream::ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED,
    jetstream::ErrorCode::STREAM_NAME_EXIST,
    jetstream::ErrorCode::STREAM_INVALID_CONFIG,
    jetstream::ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    jetstream::ErrorCode::STORAGE_RESOURCES_EXCEEDED,
    jetstream::ErrorCode::MEMORY_RESOURCES_EXCEEDED,
];

/// A handle on a NATS KV bucket; clones share the connection.
#[derive(Clone)]
pub struct NatsStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    kv: kv::Store,
    bucket: String,
    /// `$KV.<bucket>.`
    subject_prefix: String,
    epoch: AtomicU64,
    /// Set after a reconnect: re-read the epoch before the next operation.
    epoch_stale: Arc<AtomicBool>,
    /// Every watch on this handle, fed by one ordered consumer over the
    /// whole bucket (`watch::feed`).
    hub: Arc<Hub>,
    /// Held while a feed starts; holds the feed's stop (dropped with the
    /// handle, it ends the feed and removes its consumer).
    starting: tokio::sync::Mutex<Option<tokio_util::sync::DropGuard>>,
    /// Admits [`CALLS_UNDER_WAY`] calls at a time ([`NatsStore::call`]).
    admission: tokio::sync::Semaphore,
    /// Whether calls are answered: a handle whose calls go unanswered on a
    /// server that still answers it (one cut off from its cluster)
    /// reconnects elsewhere ([`stuck`]).
    stuck: stuck::Stuck,
    /// The server the client connects to, picked by the handle (shared
    /// with the client's reconnect callback).
    choice: Arc<stuck::ServerChoice>,
    /// The subject and subscription of [`NatsStore::server_echoes`], made
    /// at its first use.
    echo: tokio::sync::Mutex<Option<(String, async_nats::Subscriber)>>,
    /// How many servers the URL names.
    servers: usize,
    /// Whether the bucket allows per-message TTLs, so that a retired key's
    /// marker can expire ([`Store::retire`]). Set once the bucket does:
    /// at the open, or when the update that allows them returns.
    ttl_allowed: AtomicBool,
    /// Whether the bucket takes atomic batches (`allow_atomic`, nats-server
    /// 2.12+): set at the first guarded batch, which asks for it.
    atomic_allowed: AtomicBool,
    /// Every write of this handle and the one subscription its answers
    /// come on.
    acks: acks::Acks,
}

/// What a write publishes besides its value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Marker {
    /// A value.
    None,
    /// A delete marker.
    Delete,
    /// A purge marker that replaces the key's earlier messages and expires
    /// after [`RETIRED_KEPT`](super::RETIRED_KEPT): then nothing of the key
    /// is left.
    Retire,
}

/// What a compare-and-swap writes: one key's value or marker, or (a
/// guarded write only) an atomic batch of several keys.
#[derive(Clone, Copy, Debug)]
enum Body<'a> {
    One(&'a [u8], Marker),
    Batch(&'a [Write]),
}

/// How many calls of one handle are under way at once; the rest wait their
/// turn (first come, first served), each within its own deadline. A call
/// under way is 3–5 KB of state in this process (the NATS client's
/// request futures) besides what it queues in the client: 10,000 leases
/// starting together held ~180 MB of it. 512 in flight is still far more
/// than one connection needs to keep the server busy.
pub const CALLS_UNDER_WAY: usize = 512;

impl fmt::Debug for NatsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsStore")
            .field("bucket", &self.inner.bucket)
            .field("epoch", &self.inner.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A record as the stream holds it: a value, a delete marker, or nothing.
enum Raw {
    Absent,
    Deleted(u64),
    Value(Entry),
}

/// How often a store handle re-reads its bucket's epoch (one stream-info
/// request) even without a reconnect.
const EPOCH_RECHECK: Duration = Duration::from_secs(5);

/// Nanoseconds since the Unix epoch of an async-nats timestamp (a
/// `time::OffsetDateTime`, used here without naming the `time` crate).
macro_rules! nanos {
    ($t:expr) => {
        u64::try_from($t.unix_timestamp_nanos()).unwrap_or(0)
    };
}

impl NatsStore {
    /// What tells this handle apart from every other open one (its clones
    /// included, which share it): the address of what they share.
    pub(crate) fn handle_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The KV bucket's name (`bucket=` of the store URL); JetStream keeps
    /// it in the stream `KV_<name>`.
    pub fn bucket_name(&self) -> &str {
        &self.inner.bucket
    }

    /// The underlying NATS client (for tests and diagnostics).
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// Removes every message under `prefix` (ending in `.`) but the newest
    /// `keep`, in one request to the server (a stream purge with a filter
    /// and `keep`): nothing of the removed keys remains, and watchers never
    /// learn of it. For write-once records that nobody reads any more
    /// (transition records beyond the newest [`KEEP`](crate::observe::history::KEEP));
    /// never for lock records. Returns how many messages went.
    pub async fn purge_prefix_keeping(
        &self,
        prefix: &str,
        keep: u64,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        validate_filter(prefix)?;
        let filter = format!("{}{}", self.inner.subject_prefix, nats_filter(prefix));
        with_deadline(Op::Delete, prefix, timeout, async {
            self.inner
                .kv
                .stream
                .purge()
                .filter(filter)
                .keep(keep)
                .await
                .map(|r| r.purged)
                .map_err(|e| StoreError::unknown(Op::Delete, prefix, e))
        })
        .await
    }

    /// Whether a retired key's marker expires ([`Store::retire`]): the
    /// bucket allows per-message TTLs. An old bucket is made to allow them
    /// in the background of the open; until then, and if it cannot be,
    /// retired keys leave delete markers.
    pub fn retires_leave_nothing(&self) -> bool {
        self.inner.ttl_allowed.load(Ordering::SeqCst)
    }

    /// Re-reads the epoch if a reconnect happened or [`EPOCH_RECHECK`]
    /// passed.
    async fn refresh_epoch(&self, op: Op, key: &str) -> Result<(), StoreError> {
        if !self.inner.epoch_stale.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.read_epoch(op, key).await.map(drop)
    }

    /// Reads the bucket's epoch from the stream leader (one stream-info
    /// request) and caches it.
    async fn read_epoch(&self, op: Op, key: &str) -> Result<u64, StoreError> {
        match self.inner.kv.stream.get_info().await {
            Ok(info) => {
                let epoch = nanos!(info.created);
                let old = self.inner.epoch.swap(epoch, Ordering::SeqCst);
                if old != epoch {
                    // Displayed: a string in JSON logs, exact for any reader.
                    tracing::warn!(bucket = %self.inner.bucket, old = %old, new = %epoch, "the NATS bucket was re-created: new epoch");
                }
                Ok(epoch)
            }
            Err(e) => {
                self.inner.epoch_stale.store(true, Ordering::SeqCst);
                Err(StoreError::unknown(
                    op,
                    key,
                    format_args!("cannot read the bucket's epoch: {e}"),
                ))
            }
        }
    }

    fn token(&self, revision: u64) -> Token {
        Token::new(self.epoch(), revision)
    }

    fn message_to_raw(&self, m: jetstream::message::StreamMessage) -> Raw {
        let op = m.headers.get(KV_OPERATION).map(|v| v.as_str().to_owned());
        if matches!(op.as_deref(), Some("DEL" | "PURGE")) {
            return Raw::Deleted(m.sequence);
        }
        Raw::Value(Entry {
            value: m.payload.to_vec(),
            token: self.token(m.sequence),
            time: StoreTime {
                era: NATS_ERA,
                nanos: nanos!(m.time),
            },
        })
    }

    /// The key's last message: from the stream leader, or any replica.
    async fn raw(&self, key: &str, mode: ReadMode) -> Result<Raw, StoreError> {
        let subject = format!("{}{key}", self.inner.kv.prefix);
        let stream = &self.inner.kv.stream;
        if mode == ReadMode::Any && stream.cached_info().config.allow_direct {
            use jetstream::stream::DirectGetErrorKind as K;
            match stream.direct_get_last_for_subject(subject).await {
                Ok(m) => Ok(self.message_to_raw(m)),
                Err(e) if e.kind() == K::NotFound => Ok(Raw::Absent),
                Err(e) => Err(StoreError::unknown(Op::Get, key, e)),
            }
        } else {
            use jetstream::stream::LastRawMessageErrorKind as K;
            match stream.get_last_raw_message_by_subject(&subject).await {
                Ok(m) => Ok(self.message_to_raw(m)),
                Err(e) if e.kind() == K::NoMessageFound => Ok(Raw::Absent),
                Err(e) => Err(StoreError::unknown(Op::Get, key, e)),
            }
        }
    }
}

fn nats_filter(filter: &str) -> String {
    if filter.is_empty() {
        ">".to_owned()
    } else if filter.ends_with('.') {
        format!("{filter}>")
    } else {
        filter.to_owned()
    }
}

impl Store for NatsStore {
    fn epoch(&self) -> u64 {
        self.inner.epoch.load(Ordering::SeqCst)
    }

    async fn get(
        &self,
        key: &str,
        mode: ReadMode,
        timeout: Duration,
    ) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        self.call(Op::Get, key, timeout, || {
            Box::pin(async move {
                self.refresh_epoch(Op::Get, key).await?;
                Ok(match self.raw(key, mode).await? {
                    Raw::Value(e) => Some(e),
                    Raw::Absent | Raw::Deleted(_) => None,
                })
            })
        })
        .await
    }

    async fn create(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        validate_key(key)?;
        self.call(Op::Create, key, timeout, || {
            Box::pin(async move {
                self.refresh_epoch(Op::Create, key).await?;
                match self
                    .publish(Op::Create, key, value, Some(0), None, Marker::None)
                    .await
                {
                    Err(StoreError::Conflict { .. }) => {}
                    other => return other.map(|rev| self.token(rev)),
                }
                // The key exists, but may be only a delete marker: then create
                // means a compare-and-swap on the marker.
                match self.raw(key, ReadMode::Leader).await {
                    Ok(Raw::Deleted(rev)) => self
                        .publish(Op::Create, key, value, Some(rev), None, Marker::None)
                        .await
                        .map(|rev| self.token(rev)),
                    // The first attempt was definitely not applied.
                    _ => Err(StoreError::conflict(Op::Create, key)),
                }
            })
        })
        .await
    }

    async fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        self.cas(
            Op::Update,
            key,
            Body::One(value, Marker::None),
            expected,
            None,
            timeout,
        )
        .await
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        validate_key(key)?;
        self.call(Op::Put, key, timeout, || {
            Box::pin(async move {
                self.refresh_epoch(Op::Put, key).await?;
                self.publish(Op::Put, key, value, None, None, Marker::None)
                    .await
                    .map(|rev| self.token(rev))
            })
        })
        .await
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.cas(
            Op::Delete,
            key,
            Body::One(&[], Marker::Delete),
            expected,
            None,
            timeout,
        )
        .await
        .map(drop)
    }

    async fn retire(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        // A bucket that allows no TTLs (a server before 2.11, credentials
        // that may not update the stream) keeps a delete marker instead.
        let marker = if self.retires_leave_nothing() {
            Marker::Retire
        } else {
            Marker::Delete
        };
        self.cas(
            Op::Delete,
            key,
            Body::One(&[], marker),
            expected,
            None,
            timeout,
        )
        .await
        .map(drop)
    }

    /// One write, published with the guard's last revision as its
    /// expectation (`Nats-Expected-Last-Subject-Sequence-Subject`): the
    /// stream leader checks and appends in one step. Several writes are
    /// one atomic batch (nats-server 2.12+, [`writes`]), each message with
    /// the same expectation, checked when the batch commits.
    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        check_guarded(guard_key, writes)?;
        let (key, body) = match writes {
            [Write::Put { key, value }] => (key.as_str(), Body::One(value, Marker::None)),
            [Write::Delete { key }] => (key.as_str(), Body::One(&[], Marker::Delete)),
            [first, ..] => (first.key(), Body::Batch(writes)),
            [] => unreachable!("check_guarded refuses an empty batch"),
        };
        self.cas(Op::Guarded, key, body, guard, Some(guard_key), timeout)
            .await
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        validate_filter(filter)?;
        self.call(Op::Watch, filter, timeout, || {
            Box::pin(async move {
                let subscription = loop {
                    if let Some(s) = self.inner.hub.subscribe(filter) {
                        break s;
                    }
                    // Boxed, as the prefix catch-up below: they are large and
                    // rare, and a single-key watch (one per lease) should not
                    // carry their state while it reads its key.
                    Box::pin(self.start_feed(filter)).await?;
                };
                // The catch-up, read after the subscription began (from the
                // stream leader: a lagging replica could miss what the feed
                // delivered before). The feed's copies of it are dropped.
                let after = from_revision.map_or(0, |r| r.saturating_sub(1));
                let (catch_up, upto) = if filter.is_empty() || filter.ends_with('.') {
                    Box::pin(self.read_changes(filter, from_revision)).await?
                } else {
                    self.read_last(filter).await?
                };
                let catch_up = catch_up
                    .into_iter()
                    .filter(|e| e.revision > after)
                    .collect();
                Ok(subscription.into_stream(catch_up, upto.max(after)))
            })
        })
        .await
    }
}

impl NatsStore {
    /// How many watches this handle's feed serves (all of them share one
    /// JetStream consumer).
    pub fn watches(&self) -> usize {
        self.inner.hub.watches()
    }

    /// How many of this handle's calls are under way (at most
    /// [`CALLS_UNDER_WAY`]; the others wait their turn).
    pub fn calls_under_way(&self) -> usize {
        CALLS_UNDER_WAY - self.inner.admission.available_permits()
    }

    /// How many of this handle's writes wait for their answer (a write
    /// whose caller gave up waits no more).
    pub fn writes_waiting(&self) -> usize {
        self.inner.acks.waiting()
    }
}

mod acks;
mod calls;
mod open;
mod stuck;
#[cfg(test)]
mod tests;
mod watch;
mod writes;

pub use stuck::{PING_INTERVAL, RECONNECT_DELAY_MAX, STUCK_AFTER};
pub use writes::first_dated_revision;
