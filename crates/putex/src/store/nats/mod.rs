//! The distributed store: a NATS JetStream KV bucket (default `putex`).
//!
//! - **Writes** are publishes to `$KV.<bucket>.<key>` with the
//!   `Nats-Expected-Last-Subject-Sequence` header (0 for a create), made
//!   here rather than through `kv::Store::update` so that the server's error
//!   code reaches the classifier, and answered on one subscription per
//!   handle ([`acks`]): 10071 (wrong last sequence) **and** 10164 (what a
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

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream::StorageType};
use async_nats::{HeaderMap, ServerAddr};
use futures::future::BoxFuture;
use futures::StreamExt;

use super::hub::Hub;
use super::keys::{validate_filter, validate_key};
use super::url::{NatsAuth, NatsConfig};
use super::{
    check_guarded, with_deadline, Entry, Op, ReadMode, Store, StoreError, StoreTime, Token,
    WatchEvent, WatchStream, Write, RETIRED_KEPT,
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
/// A per-message TTL (nats-server 2.11 and later, on a stream that allows
/// them): the message is removed when it passes.
const NATS_TTL: &str = "Nats-TTL";
/// With `sub`: the message replaces every earlier message of its subject.
const NATS_ROLLUP: &str = "Nats-Rollup";
const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
/// With [`EXPECTED_LAST_SUBJECT_SEQ`]: the subject whose last sequence is
/// compared, when it is not the published one (nats-server 2.11+): a
/// guarded write.
const EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";
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
    /// whole bucket ([`feed`]).
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
    /// after [`RETIRED_KEPT`]: then nothing of the key is left.
    Retire,
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

/// Nanoseconds since the Unix epoch of an async-nats timestamp (a
/// `time::OffsetDateTime`, used here without naming the `time` crate).
/// How often a store handle re-reads its bucket's epoch (one stream-info
/// request) even without a reconnect.
const EPOCH_RECHECK: Duration = Duration::from_secs(5);

/// Removes a watch's consumer from the server when the watch is dropped
/// (best effort: the server removes it anyway after its inactive
/// threshold).
struct RemoveConsumerOnDrop {
    stream: jetstream::stream::Stream,
    name: String,
}

impl Drop for RemoveConsumerOnDrop {
    fn drop(&mut self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let stream = self.stream.clone();
            let name = std::mem::take(&mut self.name);
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), stream.delete_consumer(&name))
                    .await;
            });
        }
    }
}

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

    /// Publishes to the key's subject; `expect` is the required last
    /// revision of the key (0 = none) — or, with `guard`, of that key
    /// instead (a guarded write) —, `marker` says whether it is a value or
    /// which marker.
    /// Returns the revision written.
    async fn publish(
        &self,
        op: Op,
        key: &str,
        value: &[u8],
        expect: Option<u64>,
        guard: Option<&str>,
        marker: Marker,
    ) -> Result<u64, StoreError> {
        let subject = format!("{}{key}", self.inner.subject_prefix);
        let mut headers = HeaderMap::new();
        if let Some(rev) = expect {
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQ,
                async_nats::HeaderValue::from(rev),
            );
            if let Some(guard) = guard {
                let guard = format!("{}{guard}", self.inner.subject_prefix);
                headers.insert(EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, guard.as_str());
            }
        }
        match marker {
            Marker::None => {}
            Marker::Delete => headers.insert(KV_OPERATION, "DEL"),
            Marker::Retire => {
                headers.insert(KV_OPERATION, "PURGE");
                headers.insert(NATS_ROLLUP, "sub");
                headers.insert(NATS_TTL, format!("{}s", RETIRED_KEPT.as_secs()).as_str());
            }
        }
        self.inner
            .acks
            .publish(subject, headers, value.to_vec())
            .await
            .map_err(|e| match e {
                acks::WriteError::Conflict => StoreError::conflict(op, key),
                acks::WriteError::Unknown(why) => StoreError::unknown(op, key, why),
            })
    }

    /// Runs one call of this handle within `timeout`: first the wait for
    /// its turn ([`CALLS_UNDER_WAY`], first come first served), then the
    /// call that `start` makes. The call's state (kilobytes: the client's
    /// request futures) is allocated only once it is admitted; a call
    /// waiting its turn is a few dozen bytes. Helpers a call makes take no
    /// turn of their own, so a call never waits on itself.
    async fn call<'a, T>(
        &'a self,
        op: Op,
        key: &'a str,
        timeout: Duration,
        start: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = with_deadline(op, key, timeout, async {
            let _turn = self
                .inner
                .admission
                .acquire()
                .await
                .map_err(|e| StoreError::unknown(op, key, e))?;
            start().await
        })
        .await;
        let call = match op {
            Op::Get | Op::Open | Op::Watch => stuck::Call::Read,
            Op::Create | Op::Update | Op::Put | Op::Delete | Op::Guarded => stuck::Call::Write,
        };
        let answered = result.as_ref().map_or_else(|e| !e.is_unknown(), |_| true);
        self.note_answer(call, answered, started);
        result
    }

    /// Notes whether a call was answered; reconnects (to another server)
    /// when no write, or no read, has been for [`stuck::STUCK_AFTER`]
    /// although the client is connected, if it knows of another server.
    fn note_answer(&self, call: stuck::Call, answered: bool, started: std::time::Instant) {
        let now = std::time::Instant::now();
        if !self.inner.stuck.note(call, answered, started, now) {
            return;
        }
        let client = &self.inner.client;
        let info = client.server_info();
        let others_known = self.inner.servers > 1 || !info.connect_urls.is_empty();
        if client.connection_state() != async_nats::connection::State::Connected || !others_known {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            // A server that answers nothing at all is left to the client's
            // pings (it may be the client's own network that is cut, and a
            // reconnect would then wait out a connection timeout past the
            // cut's end); one that answers but not its calls is cut off
            // from its cluster.
            if !store.server_echoes().await {
                tracing::debug!(
                    server = %format_args!("{}:{}", info.host, info.port),
                    "NATS calls unanswered and the server silent: left to the pings"
                );
                return;
            }
            tracing::warn!(
                server = %format_args!("{}:{}", info.host, info.port),
                after = ?stuck::STUCK_AFTER,
                "NATS calls unanswered although the server answers (cut off from its cluster?): reconnecting to another"
            );
            store.inner.choice.leave();
            if let Err(e) = store.inner.client.force_reconnect().await {
                tracing::debug!(error = %e, "the reconnect could not be asked for");
            }
        });
    }

    /// Whether the server connected to answers at all: a message this
    /// handle publishes to a subject of its own comes back through the
    /// server within [`stuck::ECHO_WITHIN`]. False when it does not, or the
    /// probe cannot be made (a user not allowed to publish to its inbox).
    async fn server_echoes(&self) -> bool {
        use futures::FutureExt;
        let client = &self.inner.client;
        let mut echo = self.inner.echo.lock().await;
        if echo.is_none() {
            let subject = format!("{}.alive", client.new_inbox());
            match client.subscribe(subject.clone()).await {
                Ok(sub) => *echo = Some((subject, sub)),
                Err(_) => return false,
            }
        }
        let Some((subject, sub)) = echo.as_mut() else {
            return false;
        };
        // An echo of an earlier probe that came late.
        while let Some(Some(_)) = sub.next().now_or_never() {}
        if client.publish(subject.clone(), "".into()).await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(stuck::ECHO_WITHIN, sub.next()).await,
            Ok(Some(_))
        )
    }

    /// A write to `key` that lands only if `expected` holds: the key's own
    /// last revision, or with `guard` that key's (a guarded write).
    async fn cas(
        &self,
        op: Op,
        key: &str,
        (value, marker): (&[u8], Marker),
        expected: Token,
        guard: Option<&str>,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        validate_key(key)?;
        self.call(op, key, timeout, || {
            Box::pin(async move {
                // A bucket re-created since restarted its revisions, and its
                // record of this key may be at `expected.revision` too — unless
                // the revision is dated (at least its epoch, `dated`): then no
                // other incarnation of the bucket has it, a compare-and-swap on
                // it cannot hit another bucket's record, and the epoch cached as
                // for every other call will do. Otherwise the epoch as the
                // stream leader has it now.
                let cached = dated(expected) && {
                    self.refresh_epoch(op, key).await?;
                    expected.epoch == self.epoch()
                };
                let epoch = if cached {
                    expected.epoch
                } else {
                    self.read_epoch(op, key).await?
                };
                if expected.epoch != epoch {
                    return Err(StoreError::conflict(op, key));
                }
                if expected.revision == 0 {
                    // Revision 0 would mean "must not exist": not a CAS on a record.
                    return Err(StoreError::conflict(op, key));
                }
                match self
                    .publish(op, key, value, Some(expected.revision), guard, marker)
                    .await
                {
                    Ok(revision) => Ok(Token::new(epoch, revision)),
                    Err(e) => {
                        if cached && e.is_conflict() {
                            // Maybe the bucket was re-created: the caller's
                            // next read re-reads the epoch first and labels
                            // what it finds with the new one at once.
                            self.inner.epoch_stale.store(true, Ordering::SeqCst);
                        }
                        Err(e)
                    }
                }
            })
        })
        .await
    }
}

/// The first revision of a bucket created at `epoch` (nanoseconds): its
/// creation time in microseconds. A bucket putex creates counts its
/// revisions from there ([`NatsStore::open`]), so they lie in
/// `[epoch / 1000, epoch / 1000 + writes)`; they stay below 2^53 (until the
/// year 2255), where JSON readers such as JavaScript stay exact.
pub fn first_dated_revision(epoch: u64) -> u64 {
    epoch / 1_000
}

/// Whether a token's revision is *dated*: at least the first revision of
/// its epoch ([`first_dated_revision`]). A later incarnation's dated
/// revisions all lie above it (its epoch is later, and no bucket takes a
/// write per microsecond over its life), and an undated bucket's far below
/// (it counts from 1). A dated revision therefore names its incarnation,
/// and a compare-and-swap on it needs no epoch read first
/// (`docs/stores.md`).
fn dated(token: Token) -> bool {
    token.revision >= first_dated_revision(token.epoch)
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
            (value, Marker::None),
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
            (&[], Marker::Delete),
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
        self.cas(Op::Delete, key, (&[], marker), expected, None, timeout)
            .await
            .map(drop)
    }

    /// One write, published with the guard's last revision as its
    /// expectation (`Nats-Expected-Last-Subject-Sequence-Subject`): the
    /// stream leader checks and appends in one step. NATS has no such
    /// check over several subjects at once: a batch is refused.
    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        check_guarded(guard_key, writes)?;
        let [write] = writes else {
            return Err(StoreError::config(
                "NATS makes one guarded write at a time (a batch needs etcd or the embedded store)",
            ));
        };
        let body = match write {
            Write::Put { value, .. } => (value.as_slice(), Marker::None),
            Write::Delete { .. } => (&[][..], Marker::Delete),
        };
        let key = write.key();
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

    /// The key's last message (a delete marker included) as a watch event,
    /// and its revision (0 when the key never existed).
    async fn read_last(&self, key: &str) -> Result<(Vec<WatchEvent>, u64), StoreError> {
        let subject = format!("{}{key}", self.inner.kv.prefix);
        use jetstream::stream::LastRawMessageErrorKind as K;
        match self
            .inner
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(m) => {
                let deleted =
                    is_delete_marker(m.headers.get(KV_OPERATION).map(|v| v.as_str()), None);
                let event = self.event(
                    key.to_owned(),
                    m.sequence,
                    nanos!(m.time),
                    deleted,
                    m.payload.to_vec(),
                );
                Ok((vec![event], m.sequence))
            }
            Err(e) if e.kind() == K::NoMessageFound => Ok((vec![], 0)),
            Err(e) => Err(StoreError::unknown(Op::Watch, key, e)),
        }
    }

    /// The changes under a prefix (`""`: all) — the latest of every key, or
    /// those from `from_revision` — read by a consumer of their own until it
    /// has caught up, and the last revision read. Prefix watches are few
    /// (members and control records of an agent); the consumer is removed
    /// as soon as it has been read.
    async fn read_changes(
        &self,
        filter: &str,
        from_revision: Option<u64>,
    ) -> Result<(Vec<WatchEvent>, u64), StoreError> {
        let deliver_policy = match from_revision {
            None => jetstream::consumer::DeliverPolicy::LastPerSubject,
            Some(r) => jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: r.max(1),
            },
        };
        let (consumer, _remove) = self
            .ordered_consumer("putex watch catch-up", filter, filter, deliver_policy)
            .await?;
        let mut events = Vec::new();
        let mut upto = 0;
        // What the consumer had to deliver when it was made: read that
        // much, not "until nothing is pending" — under a key written
        // without pause something always is. What comes after is the
        // feed's. Nor does a message saying "0 pending" end it early:
        // under writes to the filter's keys nats-server was seen to say so
        // with one message of the set still to come (a snapshot's marker,
        // written just before: lost, the snapshot waited out its deadline;
        // store_nats_snapshots_miss_no_busy_key under load, 3 runs in 20).
        // Every message of the set comes, or a newer one on its key that
        // replaced it (a bucket keeps history; a delete is a message too).
        let mut left = consumer.cached_info().num_pending;
        if left == 0 {
            return Ok((events, upto));
        }
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
            let event = self.message_event(&message, filter)?;
            upto = event.revision;
            events.push(event);
            left -= 1;
            if left == 0 {
                break;
            }
        }
        Ok((events, upto))
    }

    /// An ordered push consumer over the keys `selects` (a watch filter),
    /// removed when the returned guard is dropped; errors name `filter`.
    async fn ordered_consumer(
        &self,
        description: &str,
        selects: &str,
        filter: &str,
        deliver_policy: jetstream::consumer::DeliverPolicy,
    ) -> Result<
        (
            jetstream::consumer::Consumer<jetstream::consumer::push::OrderedConfig>,
            RemoveConsumerOnDrop,
        ),
        StoreError,
    > {
        let kv = &self.inner.kv;
        let consumer = kv
            .stream
            .create_consumer(jetstream::consumer::push::OrderedConfig {
                deliver_subject: self.inner.client.new_inbox(),
                description: Some(description.to_owned()),
                filter_subject: format!("{}{}", kv.prefix, nats_filter(selects)),
                replay_policy: jetstream::consumer::ReplayPolicy::Instant,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
        let remove = RemoveConsumerOnDrop {
            stream: kv.stream.clone(),
            name: consumer.cached_info().name.clone(),
        };
        Ok((consumer, remove))
    }

    /// Starts the handle's watch feed unless one runs: an ordered consumer
    /// over every key of the bucket, from now on, whose messages a task
    /// hands to the hub.
    async fn start_feed(&self, filter: &str) -> Result<(), StoreError> {
        let mut stop = self.inner.starting.lock().await;
        if self.inner.hub.is_live() {
            return Ok(());
        }
        let (consumer, remove) = self
            .ordered_consumer(
                "putex watch feed",
                "",
                filter,
                jetstream::consumer::DeliverPolicy::New,
            )
            .await?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
        let token = tokio_util::sync::CancellationToken::new();
        *stop = Some(token.clone().drop_guard());
        tokio::spawn(feed(
            std::sync::Arc::downgrade(&self.inner.hub),
            self.clone_weak(),
            messages,
            remove,
            token,
        ));
        self.inner.hub.revive();
        Ok(())
    }

    fn clone_weak(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// A consumer's message as a watch event.
    fn message_event(
        &self,
        message: &jetstream::Message,
        filter: &str,
    ) -> Result<WatchEvent, StoreError> {
        let info = message
            .info()
            .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
        let headers = message.headers.as_ref();
        let deleted = is_delete_marker(
            headers
                .and_then(|h| h.get(KV_OPERATION))
                .map(|v| v.as_str()),
            headers
                .and_then(|h| h.get("Nats-Marker-Reason"))
                .map(|v| v.as_str()),
        );
        let key = message
            .subject
            .strip_prefix(self.inner.kv.prefix.as_str())
            .unwrap_or(message.subject.as_str())
            .to_owned();
        let event = self.event(
            key,
            info.stream_sequence,
            nanos!(info.published),
            deleted,
            message.payload.to_vec(),
        );
        Ok(event)
    }

    fn event(
        &self,
        key: String,
        revision: u64,
        nanos: u64,
        deleted: bool,
        value: Vec<u8>,
    ) -> WatchEvent {
        let time = StoreTime {
            era: NATS_ERA,
            nanos,
        };
        WatchEvent {
            key,
            entry: (!deleted).then(|| Entry {
                value,
                token: self.token(revision),
                time,
            }),
            revision,
            time,
        }
    }
}

/// Whether a message is a delete: a `KV-Operation` other than `PUT`, or a
/// server marker (a purge, a removed message).
fn is_delete_marker(operation: Option<&str>, marker_reason: Option<&str>) -> bool {
    match operation {
        Some(op) => op != "PUT",
        None => marker_reason.is_some(),
    }
}

/// The feed of one handle: every message of the bucket, handed to the hub.
/// Ends (removing its consumer) when the handle is gone; on an error it
/// fails every watch, and the next watch starts a new feed.
async fn feed(
    hub: std::sync::Weak<Hub>,
    store: std::sync::Weak<Inner>,
    mut messages: jetstream::consumer::push::Ordered,
    _remove: RemoveConsumerOnDrop,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let next = tokio::select! {
            next = messages.next() => next,
            () = stop.cancelled() => return,
        };
        let (Some(hub), Some(inner)) = (hub.upgrade(), store.upgrade()) else {
            return;
        };
        let store = NatsStore { inner };
        let failed = match next {
            Some(Ok(message)) => match store.message_event(&message, "") {
                Ok(event) => {
                    hub.dispatch(&event);
                    continue;
                }
                Err(e) => e,
            },
            Some(Err(e)) => StoreError::unknown(Op::Watch, "", e),
            None => StoreError::unknown(Op::Watch, "", "the watch feed ended"),
        };
        hub.fail(|| failed.clone());
        return;
    }
}

mod acks;
mod open;
mod stuck;
#[cfg(test)]
mod tests;

pub use stuck::{PING_INTERVAL, STUCK_AFTER};
