//! The distributed store: a NATS JetStream KV bucket (default `putex`).
//!
//! - **Writes** are JetStream publishes to `$KV.<bucket>.<key>` with the
//!   `Nats-Expected-Last-Subject-Sequence` header (0 for a create), made
//!   here rather than through `kv::Store::update` so that the server's error
//!   code reaches the classifier: 10071 (wrong last sequence) **and** 10164
//!   (what a replicated bucket answers; async-nats calls it `Other`) are
//!   conflicts; a timeout, a lost connection, "no responders" during a
//!   leader election or anything unrecognised is **unknown** — both
//!   `create` and `update` have been seen to land after a timeout.
//! - **Reads**: [`ReadMode::Leader`] asks the stream leader for the last
//!   message of the key's subject (`STREAM.MSG.GET`); [`ReadMode::Any`] uses
//!   direct get, which any replica may answer.
//! - **Epoch**: the stream's creation time in nanoseconds; a re-created
//!   bucket has a later one. A compare-and-swap (`update`, `delete`) reads
//!   it from the stream leader (a stream-info request) right before it
//!   publishes: a bucket re-created under a connected handle restarts its
//!   revisions, and a token of the old bucket must be a conflict there,
//!   never a hit on the new bucket's record at the same revision. Other
//!   calls use the epoch cached at open, re-read after every reconnect and
//!   every 5 s.
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
use futures::StreamExt;

use super::keys::{validate_filter, validate_key};
use super::url::{NatsAuth, NatsConfig};
use super::{
    with_deadline, Entry, Op, ReadMode, Store, StoreError, StoreTime, Token, WatchEvent,
    WatchStream,
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
const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";
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
}

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

/// Parses `major.minor.patch[-suffix]`.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim_start_matches('v').split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// Whether a server version has the fix for the lost-acknowledged-writes
/// bug Jepsen found in 2.12.1 (fixed in 2.12.3 and 2.11.12).
fn has_durability_fix(v: (u64, u64, u64)) -> bool {
    v >= (2, 12, 3) || (v.0 == 2 && v.1 == 11 && v.2 >= 12)
}

/// Whether a connect error is a TLS handshake that failed on certificates
/// or protocol (an untrusted server certificate, a client certificate the
/// server wants or refuses): rustls errors reach async-nats as an I/O error
/// of kind `InvalidData` (tokio-rustls wraps them so) and are filed under
/// `Io`, like a lost connection; retrying will not change them.
fn tls_refused(e: &async_nats::ConnectError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData && io.get_ref().is_some())
}

fn publish_error(op: Op, key: &str, e: &jetstream::context::PublishError) -> StoreError {
    use jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::WrongLastSequence => StoreError::conflict(op, key),
        K::Other => {
            let code = std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<jetstream::Error>())
                .map(|j| j.error_code().0);
            match code {
                Some(ERR_WRONG_LAST_SEQUENCE | ERR_WRONG_LAST_SEQUENCE_CONSTANT) => {
                    StoreError::conflict(op, key)
                }
                _ => StoreError::unknown(op, key, e),
            }
        }
        // Timed out, broken pipe, no responders (e.g. no stream leader right
        // now), anything else: the write may or may not have landed.
        _ => StoreError::unknown(op, key, e),
    }
}

impl NatsStore {
    /// Connects, checks the server, and finds or creates the bucket.
    pub async fn open(cfg: &NatsConfig) -> Result<NatsStore, StoreError> {
        match tokio::time::timeout(OPEN_TIMEOUT, Self::open_inner(cfg)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timed_out(
                Op::Open,
                &cfg.servers.join(","),
                OPEN_TIMEOUT,
            )),
        }
    }

    async fn open_inner(cfg: &NatsConfig) -> Result<NatsStore, StoreError> {
        let where_ = cfg.servers.join(",");
        let scheme = if cfg.tls.required { "tls" } else { "nats" };
        let addrs = cfg
            .servers
            .iter()
            .map(|s| {
                format!("{scheme}://{s}")
                    .parse::<ServerAddr>()
                    .map_err(|e| StoreError::config(format!("NATS server {s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let mut opts = match &cfg.auth {
            NatsAuth::None => async_nats::ConnectOptions::new(),
            NatsAuth::Creds(path) => async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    StoreError::config(format!("NATS credentials file {}: {e}", path.display()))
                })?,
            NatsAuth::Nkey(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
            NatsAuth::UserPassword { user, password } => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(t) => async_nats::ConnectOptions::with_token(t.clone()),
        };
        // async-nats reads these files only while connecting, and its error
        // does not name the file: check them here.
        for (what, file) in [
            ("tls_ca", &cfg.tls.ca),
            ("tls_cert", &cfg.tls.cert),
            ("tls_key", &cfg.tls.key),
        ] {
            if let Some(path) = file {
                if let Err(e) = std::fs::File::open(path) {
                    return Err(StoreError::config(format!(
                        "NATS {what} file {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        if cfg.tls.required {
            opts = opts.require_tls(true);
        }
        if let Some(ca) = &cfg.tls.ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&cfg.tls.cert, &cfg.tls.key) {
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
        let epoch_stale = Arc::new(AtomicBool::new(false));
        let stale = epoch_stale.clone();
        opts = opts
            .name("putex")
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |ev| {
                let stale = stale.clone();
                async move {
                    match ev {
                        async_nats::Event::Connected => stale.store(true, Ordering::SeqCst),
                        async_nats::Event::Disconnected => {
                            tracing::warn!("NATS connection lost; reconnecting")
                        }
                        other => tracing::debug!(event = %other, "NATS event"),
                    }
                }
            });
        let client = opts.connect(addrs).await.map_err(|e| {
            use async_nats::ConnectErrorKind as K;
            match e.kind() {
                K::Authentication | K::AuthorizationViolation | K::Tls | K::ServerParse => {
                    StoreError::config(format!("NATS {where_}: {e}"))
                }
                K::Io if tls_refused(&e) => StoreError::config(format!(
                    "NATS {where_}: TLS handshake failed: {e}; check tls_ca (the CA that signed the server's certificate), and tls_cert and tls_key if the server verifies clients"
                )),
                _ => StoreError::unknown(Op::Open, &where_, format_args!("cannot connect: {e}")),
            }
        })?;

        let info = client.server_info();
        let version = parse_version(&info.version).ok_or_else(|| {
            StoreError::config(format!(
                "NATS {where_}: unreadable server version {:?}",
                info.version
            ))
        })?;
        if version < MIN_SERVER {
            return Err(StoreError::config(format!(
                "NATS {where_}: nats-server {} is too old; putex needs 2.11 or later (2.12.3+ or 2.11.12+ recommended)",
                info.version
            )));
        }
        if !has_durability_fix(version) {
            tracing::warn!(
                version = %info.version,
                "nats-server before 2.12.3 / 2.11.12 can lose acknowledged writes in a coordinated crash; upgrade"
            );
        }
        if !info.jetstream {
            return Err(StoreError::config(format!(
                "NATS {where_}: JetStream is not enabled on the server (start it with -js, or a jetstream block)"
            )));
        }

        let mut js = jetstream::new(client.clone());
        // Our own deadline governs each call; keep the library's out of the way.
        js.set_timeout(Duration::from_secs(60));
        let kv = Self::bucket_patiently(&js, cfg).await?;
        let stream_info = kv.stream.cached_info().clone();
        check_bucket(&cfg.bucket, cfg.replicas, &stream_info.config)?;
        let epoch = nanos!(stream_info.created);
        let subject_prefix = kv.put_prefix.clone().unwrap_or_else(|| kv.prefix.clone());
        // A bucket deleted and re-created under a live connection shows no
        // reconnect: re-read the epoch every EPOCH_RECHECK too, so that a
        // new bucket is recognised (S6) within seconds rather than taken
        // for a store that went backwards.
        let weak = Arc::downgrade(&epoch_stale);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EPOCH_RECHECK).await;
                match weak.upgrade() {
                    Some(stale) => stale.store(true, Ordering::SeqCst),
                    None => return,
                }
            }
        });
        Ok(NatsStore {
            inner: Arc::new(Inner {
                client,
                js,
                kv,
                bucket: cfg.bucket.clone(),
                subject_prefix,
                epoch: AtomicU64::new(epoch),
                epoch_stale,
            }),
        })
    }

    /// [`Self::bucket`], tried again while the answer is unknown (a request
    /// left unanswered, no meta leader yet, peers still joining); a refused
    /// configuration ends it at once. [`Self::open`]'s deadline bounds it.
    async fn bucket_patiently(
        js: &jetstream::Context,
        cfg: &NatsConfig,
    ) -> Result<kv::Store, StoreError> {
        let mut attempt = OPEN_ATTEMPT;
        loop {
            match tokio::time::timeout(attempt, Self::bucket(js, cfg)).await {
                Ok(Ok(kv)) => return Ok(kv),
                Ok(Err(e)) if !e.is_unknown() => return Err(e),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the bucket is not ready yet; trying again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {
                    tracing::debug!(after = ?attempt, "no answer about the bucket yet; asking again");
                    attempt = (attempt * 2).min(OPEN_ATTEMPT_MAX);
                }
            }
        }
    }

    async fn bucket(js: &jetstream::Context, cfg: &NatsConfig) -> Result<kv::Store, StoreError> {
        if let Ok(kv) = js.get_key_value(&cfg.bucket).await {
            return Ok(kv);
        }
        let config = kv::Config {
            bucket: cfg.bucket.clone(),
            description: "putex locks".into(),
            history: HISTORY,
            max_age: Duration::ZERO,
            storage: StorageType::File,
            num_replicas: cfg.replicas,
            ..Default::default()
        };
        match js.create_key_value(config).await {
            Ok(kv) => {
                tracing::info!(bucket = %cfg.bucket, replicas = cfg.replicas, "created the NATS KV bucket");
                Ok(kv)
            }
            // Someone else may have created it meanwhile.
            Err(create) => js.get_key_value(&cfg.bucket).await.map_err(|_| {
                let rejected = std::error::Error::source(&create)
                    .and_then(|s| s.downcast_ref::<jetstream::context::CreateStreamError>())
                    .and_then(|e| match e.kind() {
                        jetstream::context::CreateStreamErrorKind::JetStream(j) => Some(j),
                        _ => None,
                    });
                match rejected {
                    // The server refused the settings (e.g. 3 replicas on a
                    // server that is not clustered): retrying will not help.
                    // Others (no meta leader yet, peers still joining: 10008,
                    // 10023) pass while a cluster starts; those are unknown.
                    Some(j) if j.code() == 400 || CONFIG_REJECTIONS.contains(&j.error_code()) => {
                        StoreError::config(format!(
                            "NATS bucket {:?} cannot be created with {} replica(s): {j}",
                            cfg.bucket, cfg.replicas
                        ))
                    }
                    _ => StoreError::unknown(
                        Op::Open,
                        &cfg.bucket,
                        format_args!("cannot find or create the bucket: {create}"),
                    ),
                }
            }),
        }
    }

    /// The bucket's name.
    pub fn bucket_name(&self) -> &str {
        &self.inner.bucket
    }

    /// The underlying NATS client (for tests and diagnostics).
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// Removes every message of `key` from the bucket's stream (a stream
    /// purge filtered to its subject). Unlike [`Store::delete`], which
    /// appends a delete marker and keeps the old value in the key's
    /// history, nothing of the key remains, and watchers see no event.
    ///
    /// For write-once records that nobody reads any more (pruned
    /// transition records, [`crate::observe::history`]); never for lock records.
    pub async fn purge_key(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        validate_key(key)?;
        let subject = format!("{}{key}", self.inner.subject_prefix);
        with_deadline(Op::Delete, key, timeout, async {
            self.inner
                .kv
                .stream
                .purge()
                .filter(subject)
                .await
                .map(drop)
                .map_err(|e| StoreError::unknown(Op::Delete, key, e))
        })
        .await
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
                    tracing::warn!(bucket = %self.inner.bucket, old, new = epoch, "the NATS bucket was re-created: new epoch");
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
    /// revision of the key (0 = none), `delete` writes a delete marker.
    /// Returns the revision written.
    async fn publish(
        &self,
        op: Op,
        key: &str,
        value: &[u8],
        expect: Option<u64>,
        delete: bool,
    ) -> Result<u64, StoreError> {
        let subject = format!("{}{key}", self.inner.subject_prefix);
        let mut headers = HeaderMap::new();
        if let Some(rev) = expect {
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQ,
                async_nats::HeaderValue::from(rev),
            );
        }
        if delete {
            headers.insert(KV_OPERATION, "DEL");
        }
        let ack = self
            .inner
            .js
            .publish_with_headers(subject, headers, value.to_vec().into())
            .await
            .map_err(|e| publish_error(op, key, &e))?
            .await
            .map_err(|e| publish_error(op, key, &e))?;
        Ok(ack.sequence)
    }

    async fn cas(
        &self,
        op: Op,
        key: &str,
        value: &[u8],
        expected: Token,
        delete: bool,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        validate_key(key)?;
        with_deadline(op, key, timeout, async {
            // The epoch as the stream leader has it now, not as cached: a
            // bucket re-created since restarted its revisions, and its
            // record of this key may be at `expected.revision` too.
            let epoch = self.read_epoch(op, key).await?;
            if expected.epoch != epoch {
                return Err(StoreError::conflict(op, key));
            }
            if expected.revision == 0 {
                // Revision 0 would mean "must not exist": not a CAS on a record.
                return Err(StoreError::conflict(op, key));
            }
            let revision = self
                .publish(op, key, value, Some(expected.revision), delete)
                .await?;
            Ok(Token::new(epoch, revision))
        })
        .await
    }
}

/// Refuses or warns about a bucket unfit for locks.
fn check_bucket(
    bucket: &str,
    replicas: usize,
    c: &jetstream::stream::Config,
) -> Result<(), StoreError> {
    if !c.max_age.is_zero() {
        return Err(StoreError::config(format!(
            "NATS bucket {bucket:?} expires records after {:?}: a lock record must never expire. Use a bucket without a TTL (or let putex create one)",
            c.max_age
        )));
    }
    if c.allow_message_ttl {
        tracing::warn!(
            bucket,
            "the bucket allows per-message TTLs; putex never sets one"
        );
    }
    if c.max_messages_per_subject < 2 {
        tracing::warn!(
            bucket,
            history = c.max_messages_per_subject,
            "the bucket keeps no history; watchers may miss changes"
        );
    }
    if c.storage != StorageType::File {
        tracing::warn!(
            bucket,
            "the bucket is kept in memory: a server restart loses every lock record"
        );
    }
    if c.num_replicas < replicas {
        tracing::warn!(
            bucket,
            has = c.num_replicas,
            asked = replicas,
            "the bucket has fewer replicas than asked for"
        );
    }
    if c.num_replicas < 3 {
        tracing::info!(
            bucket,
            replicas = c.num_replicas,
            "the bucket is not replicated; production wants 3 or 5 replicas"
        );
    }
    Ok(())
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
        with_deadline(Op::Get, key, timeout, async {
            self.refresh_epoch(Op::Get, key).await?;
            Ok(match self.raw(key, mode).await? {
                Raw::Value(e) => Some(e),
                Raw::Absent | Raw::Deleted(_) => None,
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
        with_deadline(Op::Create, key, timeout, async {
            self.refresh_epoch(Op::Create, key).await?;
            match self.publish(Op::Create, key, value, Some(0), false).await {
                Err(StoreError::Conflict { .. }) => {}
                other => return other.map(|rev| self.token(rev)),
            }
            // The key exists, but may be only a delete marker: then create
            // means a compare-and-swap on the marker.
            match self.raw(key, ReadMode::Leader).await {
                Ok(Raw::Deleted(rev)) => self
                    .publish(Op::Create, key, value, Some(rev), false)
                    .await
                    .map(|rev| self.token(rev)),
                // The first attempt was definitely not applied.
                _ => Err(StoreError::conflict(Op::Create, key)),
            }
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
        self.cas(Op::Update, key, value, expected, false, timeout)
            .await
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        validate_key(key)?;
        with_deadline(Op::Put, key, timeout, async {
            self.refresh_epoch(Op::Put, key).await?;
            self.publish(Op::Put, key, value, None, false)
                .await
                .map(|rev| self.token(rev))
        })
        .await
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.cas(Op::Delete, key, &[], expected, true, timeout)
            .await
            .map(drop)
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        validate_filter(filter)?;
        let kv = &self.inner.kv;
        let prefix = kv.prefix.clone();
        let subject = format!("{prefix}{}", nats_filter(filter));
        // The watch's consumer is built here rather than by
        // `kv.watch_with_history`, to remove it when the watch is dropped:
        // an ephemeral consumer otherwise outlives its watch by its
        // inactive threshold (30 s, fixed by async-nats for ordered
        // consumers), and a stream allows 1,000 consumers (nats-server's
        // default), so a bucket seeing more than ~33 watches a second (each
        // lease acquisition and queue ticket starts one) would run out.
        let deliver_policy = match from_revision {
            None => jetstream::consumer::DeliverPolicy::LastPerSubject,
            Some(r) => jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: r.max(1),
            },
        };
        let messages = with_deadline(Op::Watch, filter, timeout, async {
            let consumer = kv
                .stream
                .create_consumer(jetstream::consumer::push::OrderedConfig {
                    deliver_subject: self.inner.client.new_inbox(),
                    description: Some("putex watch".to_string()),
                    filter_subject: subject,
                    replay_policy: jetstream::consumer::ReplayPolicy::Instant,
                    deliver_policy,
                    ..Default::default()
                })
                .await
                .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
            let name = consumer.cached_info().name.clone();
            let messages = consumer
                .messages()
                .await
                .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
            Ok((messages, name))
        })
        .await?;
        let (messages, name) = messages;
        let remove = RemoveConsumerOnDrop {
            stream: kv.stream.clone(),
            name,
        };
        let store = self.clone();
        let filter = filter.to_owned();
        let stream = messages.map(move |item| {
            let _owns = &remove;
            let message = item.map_err(|e| StoreError::unknown(Op::Watch, &filter, e))?;
            let info = message
                .info()
                .map_err(|e| StoreError::unknown(Op::Watch, &filter, e))?;
            let time = StoreTime {
                era: NATS_ERA,
                nanos: nanos!(info.published),
            };
            let revision = info.stream_sequence;
            let deleted = message
                .headers
                .as_ref()
                .and_then(|h| {
                    h.get("KV-Operation")
                        .map(|op| op.as_str() != "PUT")
                        .or_else(|| h.get("Nats-Marker-Reason").map(|_| true))
                })
                .unwrap_or(false);
            let key = message
                .subject
                .strip_prefix(prefix.as_str())
                .unwrap_or(message.subject.as_str())
                .to_owned();
            let entry = (!deleted).then(|| Entry {
                value: message.payload.to_vec(),
                token: store.token(revision),
                time,
            });
            Ok(WatchEvent {
                key,
                entry,
                revision,
                time,
            })
        });
        // End the stream after its first error: the caller re-establishes it.
        let mut done = false;
        let stream = stream.take_while(move |item| {
            let go = !done;
            done = item.is_err();
            futures::future::ready(go)
        });
        Ok(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests;
