//! The etcd store: records under a key prefix (default `putex/`) of an
//! etcd cluster, through its v3 gRPC API.
//!
//! - **Writes** are transactions. `create` compares `create_revision == 0`,
//!   `update` and `delete` compare `mod_revision == expected`; every one of
//!   them also compares the epoch record (below) with the bytes this
//!   handle knows, in the same transaction. A failed compare is a
//!   **conflict**; a timeout, a lost connection or a leader election is
//!   **unknown** (etcd applies a proposal that timed out more often than
//!   one expects). Every call requires a member with a raft leader: one
//!   cut off from the quorum refuses at once, before proposing, and the
//!   call is made again wherever the client sends it next
//!   (`retry_unsent`). A request etcd refuses before it is proposed
//!   (permission denied, no such user, too large, the cluster out of
//!   space) is a configuration error that names the cause.
//! - **Reads** are linearizable (etcd's default, never `serializable`):
//!   they see every write acknowledged before them, our own included, from
//!   any member. [`ReadMode::Any`] reads the same way.
//! - **Revisions** are etcd's global revision: a key's `mod_revision`.
//! - **Epoch**: the record `<prefix>/=epoch` (`{"v":1,"epoch":…,"cluster":…}`),
//!   created at first use with the wall-clock time in nanoseconds and the
//!   cluster id. A handle that finds it written by another cluster (a
//!   restored snapshot brought up as a new cluster) writes a later epoch
//!   before anything else; a cluster re-created empty gets a new record
//!   with a later time. Writes compare it, so a token of another epoch
//!   never matches; every answer's header carries the cluster id, and an
//!   answer from another cluster than the one this handle opened is
//!   **unknown** and makes the handle read the epoch again (S6).
//! - **Store time** (the second witness of S1 b): etcd keeps no time with
//!   a key, so this handle reads the etcd leader's clock through a lease:
//!   one long lease shared by every putex on the prefix (`<prefix>/=clock`
//!   names it; it is never kept alive), whose remaining TTL the leader
//!   counts down. A record is stamped with a reading taken **after** the
//!   handle first received it — no earlier than the write on the leader's
//!   clock — and keeps that stamp for as long as its revision stays (so
//!   reading it again changes nothing). A probe record (`probe.<node>`),
//!   whose time stands for "now", is stamped with the lower end of its
//!   reading's second and every other record with the upper end, so the
//!   gap between a record and a later probe never exceeds the real gap on
//!   the leader's clock. A leader change refreshes leases (readings go back)
//!   and a replaced lease restarts them: the store clock only ever runs
//!   backwards, which delays a takeover (S1 b's fallback), never hastens it.
//!   Up to one step back is the roundings, not that: the agent passes
//!   [`AnyStore::clock_step`](crate::store::AnyStore::clock_step) to the core.
//!   The cost: a takeover waits up to 2 s more than on NATS (the TTL's
//!   one-second resolution, on both ends); see `docs/safety.md`.
//! - **First use** (S4 refined): a lock record's create is followed by the
//!   proof of how long its key was vacant — its history from an anchor
//!   revision timed on the store clock (`vacancy.rs`).
//! - **Watches** share one etcd watch over the prefix per handle (`store/hub.rs`);
//!   a watch from an old revision reads the changes since then with a watch
//!   of its own, and a compacted revision is re-read as the latest state.
//!
//! Durability: etcd fsyncs its write-ahead log before it acknowledges; never
//! run a putex cluster with `--unsafe-no-fsync`.
//!
//! The code: `client.rs` is the gRPC client over the generated API
//! (`api/`); `calls.rs` makes a call again while it never reached etcd and
//! classifies its failure; `open.rs` connects and settles the epoch;
//! `clock.rs` is the store clock; `vacancy.rs` proves a first use's
//! vacancy; `watch.rs` feeds the watches. The handle,
//! the epoch checks of every write and the [`Store`] operations are here.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::hub::Hub;
use super::keys::{validate_filter, validate_key, PROBE_PREFIX};
use super::{
    check_guarded, with_deadline, Created, Entry, Op, ReadMode, Store, StoreError, StoreTime,
    Token, WatchEvent, WatchStream, Write,
};

mod api;
mod calls;
mod client;
mod clock;
mod open;
mod vacancy;
mod watch;

use api::etcdserverpb::{self as pb, ResponseHeader};
use api::mvccpb::KeyValue;
use calls::{client_error, detached, retry_unsent};
use client::Client;
use clock::Clock;

pub use clock::{CLOCK_STEP, CLOCK_TTL};

/// How long opening (connecting, reading or writing the epoch) may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(15);

/// The epoch record, under the prefix: `=` is no name character, so no
/// putex key is ever this one.
const EPOCH_KEY: &str = "=epoch";
/// The record naming the shared clock lease.
const CLOCK_KEY: &str = "=clock";
/// The marker a watch resumed from an old revision writes to know it has
/// caught up.
const CATCH_UP_KEY: &str = "=catchup";

/// A handle on a prefix of an etcd cluster; clones share the connection.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// `<prefix>/`.
    prefix: String,
    /// The epoch this handle writes under, and its record's bytes (writes
    /// compare them); `epoch` mirrors the first for reads without the lock.
    epoch: AtomicU64,
    epoch_record: Mutex<(u64, Vec<u8>)>,
    /// The cluster this handle opened; an answer from another one makes
    /// every operation read the epoch again first.
    cluster: AtomicU64,
    epoch_stale: AtomicBool,
    /// The store clock and the stamps it gave ([`clock`]).
    clock: Clock,
    /// What the feed delivered, for a first use's proof (`vacancy.rs`).
    seen: vacancy::FeedSeen,
    /// Every watch on this handle, fed by one etcd watch (`watch::feed`).
    hub: Arc<Hub>,
    /// Held while a feed starts; holds the feed's stop.
    starting: tokio::sync::Mutex<Option<tokio_util::sync::DropGuard>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.inner.prefix)
            .field("epoch", &self.inner.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The epoch record's value.
#[derive(serde::Serialize, serde::Deserialize)]
struct EpochRecord {
    v: u32,
    epoch: u64,
    cluster: u64,
}

/// How a watch event's or a read's key-value came.
struct Raw {
    key: String,
    revision: u64,
    value: Option<Vec<u8>>,
}

impl EtcdStore {
    pub(crate) fn handle_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The key prefix this handle works under, with its trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// Sets the epoch and its record's bytes together.
    fn set_epoch(&self, epoch: u64, bytes: &[u8]) {
        let mut record = self.inner.epoch_record.lock();
        *record = (epoch, bytes.to_vec());
        self.inner.epoch.store(epoch, Ordering::Release);
    }

    fn token(&self, revision: u64) -> Token {
        Token::new(self.inner.epoch.load(Ordering::Acquire), revision)
    }

    /// The putex key of an etcd key under the prefix (`None`: outside it,
    /// or one of this backend's own records).
    fn short<'a>(&self, full: &'a [u8]) -> Option<&'a str> {
        let key = std::str::from_utf8(full)
            .ok()?
            .strip_prefix(self.inner.prefix.as_str())?;
        (!key.starts_with('=')).then_some(key)
    }

    /// Checks an answer's cluster: another cluster than the one opened
    /// means the handle's epoch may be wrong (S6).
    fn check_cluster(
        &self,
        op: Op,
        key: &str,
        header: Option<&ResponseHeader>,
    ) -> Result<u64, StoreError> {
        let Some(h) = header else {
            return Err(StoreError::unknown(
                op,
                key,
                "etcd answered without a header",
            ));
        };
        let opened = self.inner.cluster.load(Ordering::Acquire);
        if h.cluster_id != opened {
            self.inner.epoch_stale.store(true, Ordering::Release);
            return Err(StoreError::unknown(
                op,
                key,
                format_args!(
                    "the etcd cluster answering ({:x}) is not the one opened ({opened:x}); a write may or may not have been applied, and the epoch is read again",
                    h.cluster_id
                ),
            ));
        }
        u64::try_from(h.revision)
            .map_err(|_| StoreError::unknown(op, key, "etcd answered a negative revision"))
    }

    /// Reads the epoch again if an answer came from another cluster.
    async fn fresh_epoch(&self, op: Op, key: &str) -> Result<(), StoreError> {
        if self.inner.epoch_stale.load(Ordering::Acquire) {
            self.ensure_epoch(op, key).await?;
        }
        Ok(())
    }

    /// A transaction whose compares include the epoch record's; on a
    /// failed compare it reads the epoch record, and adopts a new epoch.
    async fn cas(
        &self,
        op: Op,
        key: &str,
        expected_epoch: Option<u64>,
        compare: pb::Compare,
        then: Vec<pb::RequestOp>,
    ) -> Result<Token, StoreError> {
        self.fresh_epoch(op, key).await?;
        let epoch_key = self.full(EPOCH_KEY);
        let (epoch, bytes) = self.inner.epoch_record.lock().clone();
        if expected_epoch.is_some_and(|e| e != epoch) {
            return Err(StoreError::conflict(op, key));
        }
        let txn = client::txn(
            [compare, client::value_is(epoch_key.clone(), bytes.clone())],
            then,
            [client::get_op(epoch_key)],
        );
        let resp = detached(self.inner.client.clone(), |client| async move {
            retry_unsent(|| client.txn(txn.clone())).await
        })
        .await
        .map_err(|e| client_error(op, key, e))?;
        let revision = self.check_cluster(op, key, resp.header.as_ref())?;
        if resp.succeeded {
            return Ok(Token::new(epoch, revision));
        }
        // Not applied. If the epoch record changed, adopt it: the next read
        // carries the new epoch.
        for g in client::ranges(&resp) {
            match g.kvs.first() {
                Some(e) if e.value != bytes => self.adopt_epoch(&e.value),
                None => self.inner.epoch_stale.store(true, Ordering::Release),
                _ => {}
            }
        }
        Err(StoreError::conflict(op, key))
    }

    fn adopt_epoch(&self, bytes: &[u8]) {
        if let Ok(r) = serde_json::from_slice::<EpochRecord>(bytes) {
            self.set_epoch(r.epoch, bytes);
        } else {
            self.inner.epoch_stale.store(true, Ordering::Release);
        }
    }

    /// Stamps raw records with the store clock (one reading for all that
    /// need one) and makes entries of them.
    async fn entries(
        &self,
        op: Op,
        key: &str,
        raws: Vec<Raw>,
    ) -> Result<Vec<WatchEvent>, StoreError> {
        let stamps = self
            .inner
            .clock
            .stamp(
                &self.inner.client,
                &self.inner.prefix,
                (op, key),
                raws.iter()
                    .map(|r| (r.key.as_str(), r.revision, r.key.starts_with(PROBE_PREFIX))),
            )
            .await?;
        Ok(raws
            .into_iter()
            .zip(stamps)
            .map(|(raw, time)| {
                if raw.value.is_none() {
                    self.inner.clock.forget(&raw.key);
                }
                WatchEvent {
                    entry: raw.value.map(|value| Entry {
                        value,
                        token: self.token(raw.revision),
                        time,
                    }),
                    key: raw.key,
                    revision: raw.revision,
                    time,
                }
            })
            .collect())
    }

    fn raw_of(&self, kv: &KeyValue) -> Option<Raw> {
        Some(Raw {
            key: self.short(&kv.key)?.to_owned(),
            revision: u64::try_from(kv.mod_revision).ok()?,
            value: Some(kv.value.clone()),
        })
    }

    /// How long ago `t` (a store time of this handle) was, on the store's
    /// clock: `None` when the clock cannot be read or `t` is of another
    /// handle.
    pub async fn age(&self, t: StoreTime) -> Option<Duration> {
        let now = self
            .inner
            .clock
            .now(&self.inner.client, &self.inner.prefix)
            .await
            .ok()?;
        match now.gap_since(t) {
            putex_core::StoreGap::Forward(d) => Some(d),
            _ => None,
        }
    }

    /// How many voting members the cluster has.
    pub async fn members(&self) -> Result<usize, StoreError> {
        let resp = with_deadline(Op::Get, "members", Duration::from_secs(5), async {
            retry_unsent(|| self.inner.client.member_list())
                .await
                .map_err(|e| client_error(Op::Get, "members", e))
        })
        .await?;
        Ok(resp.members.iter().filter(|m| !m.is_learner).count())
    }

    /// How many watches this handle's feed serves (all share one etcd watch).
    pub fn watches(&self) -> usize {
        self.inner.hub.watches()
    }

    /// A warning when etcd keeps its whole history: revision 1 is still
    /// readable although the cluster is at revision `min_revision` or
    /// later. Every renewal is a new revision, and etcd never compacts
    /// unless told to (`--auto-compaction-retention`, off by default):
    /// the backend grows until its quota, and then etcd refuses every
    /// write (`NOSPACE`). `None` when it compacts, when it is younger, or
    /// when it cannot be asked.
    pub async fn history_warning_from(&self, min_revision: u64) -> Option<String> {
        let key = self.full(EPOCH_KEY);
        let resp = with_deadline(Op::Get, EPOCH_KEY, Duration::from_secs(5), async {
            let request = pb::RangeRequest {
                key: key.into_bytes(),
                revision: 1,
                count_only: true,
                ..Default::default()
            };
            retry_unsent(|| self.inner.client.range(request.clone()))
                .await
                .map_err(|e| client_error(Op::Get, EPOCH_KEY, e))
        })
        .await
        .ok()?;
        let now = resp
            .header
            .map_or(0, |h| u64::try_from(h.revision).unwrap_or(0));
        (now >= min_revision).then(|| {
            format!(
                "etcd has not compacted its history (revision 1 of {now} is still readable): \
                 every renewal is a new revision, and without compaction the backend grows \
                 until its quota (--quota-backend-bytes, 2 GiB by default), when etcd refuses \
                 every write (NOSPACE); run etcd with --auto-compaction-mode=periodic \
                 --auto-compaction-retention=1h (docs/stores.md, etcd, History)"
            )
        })
    }
}

/// The revision from which a cluster that never compacted is warned
/// about: about 16 hours of one lock with two agents at R = 1 s, past the
/// first compaction of any periodic retention up to that.
pub const HISTORY_WARNING_REVISIONS: u64 = 100_000;

impl Store for EtcdStore {
    fn times_are_first_seen(&self) -> bool {
        true
    }

    fn epoch(&self) -> u64 {
        self.inner.epoch.load(Ordering::Acquire)
    }

    async fn get(
        &self,
        key: &str,
        _mode: ReadMode,
        timeout: Duration,
    ) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        with_deadline(Op::Get, key, timeout, async {
            self.fresh_epoch(Op::Get, key).await?;
            let full = self.full(key);
            let request = pb::RangeRequest {
                key: full.into_bytes(),
                ..Default::default()
            };
            let resp = retry_unsent(|| self.inner.client.range(request.clone()))
                .await
                .map_err(|e| client_error(Op::Get, key, e))?;
            self.check_cluster(Op::Get, key, resp.header.as_ref())?;
            let raws: Vec<Raw> = resp.kvs.iter().filter_map(|kv| self.raw_of(kv)).collect();
            if raws.is_empty() {
                self.inner.clock.forget(key);
                return Ok(None);
            }
            let mut events = self.entries(Op::Get, key, raws).await?;
            Ok(events.pop().and_then(|e| e.entry))
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
        let full = self.full(key);
        with_deadline(Op::Create, key, timeout, async {
            self.cas(
                Op::Create,
                key,
                None,
                client::create_revision_is(full.clone(), 0),
                vec![client::put_op(full, value, 0)],
            )
            .await
        })
        .await
    }

    /// A create, then the proof of how long the key was vacant before it
    /// (`vacancy.rs`), within the same deadline: a proof not done by then
    /// is none.
    async fn create_vacant(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Created, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let token = self.create(key, value, timeout).await?;
        let vacant_for = tokio::time::timeout_at(deadline, self.vacancy(key, token.revision))
            .await
            .unwrap_or(Duration::ZERO);
        Ok(Created { token, vacant_for })
    }

    async fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        validate_key(key)?;
        let full = self.full(key);
        with_deadline(Op::Update, key, timeout, async {
            self.cas(
                Op::Update,
                key,
                Some(expected.epoch),
                client::mod_revision_is(full.clone(), rev(expected.revision)),
                vec![client::put_op(full, value, 0)],
            )
            .await
        })
        .await
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        validate_key(key)?;
        with_deadline(Op::Put, key, timeout, async {
            self.fresh_epoch(Op::Put, key).await?;
            let request = pb::PutRequest {
                key: self.full(key).into_bytes(),
                value: value.to_vec(),
                ..Default::default()
            };
            let resp = detached(self.inner.client.clone(), |client| async move {
                retry_unsent(|| client.put(request.clone())).await
            })
            .await
            .map_err(|e| client_error(Op::Put, key, e))?;
            let revision = self.check_cluster(Op::Put, key, resp.header.as_ref())?;
            Ok(self.token(revision))
        })
        .await
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        validate_key(key)?;
        let full = self.full(key);
        with_deadline(Op::Delete, key, timeout, async {
            self.cas(
                Op::Delete,
                key,
                Some(expected.epoch),
                client::mod_revision_is(full.clone(), rev(expected.revision)),
                vec![client::delete_op(full)],
            )
            .await?;
            self.inner.clock.forget(key);
            Ok(())
        })
        .await
    }

    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        check_guarded(guard_key, writes)?;
        let then = writes
            .iter()
            .map(|w| match w {
                Write::Put { key, value } => client::put_op(self.full(key), value.clone(), 0),
                Write::Delete { key } => client::delete_op(self.full(key)),
            })
            .collect();
        with_deadline(Op::Guarded, guard_key, timeout, async {
            let token = self
                .cas(
                    Op::Guarded,
                    guard_key,
                    Some(guard.epoch),
                    client::mod_revision_is(self.full(guard_key), rev(guard.revision)),
                    then,
                )
                .await?;
            for w in writes {
                if let Write::Delete { key } = w {
                    self.inner.clock.forget(key);
                }
            }
            Ok(token)
        })
        .await
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        validate_filter(filter)?;
        with_deadline(Op::Watch, filter, timeout, async {
            let subscription = loop {
                if let Some(s) = self.inner.hub.subscribe(filter) {
                    break s;
                }
                Box::pin(self.start_feed(filter)).await?;
            };
            // The catch-up, read after the subscription began; the feed's
            // copies of it are dropped.
            let after = from_revision.map_or(0, |r| r.saturating_sub(1));
            let (raws, upto) = match from_revision {
                None => self.read_range(filter).await?,
                Some(r) => Box::pin(self.read_since(filter, r)).await?,
            };
            let catch_up = self
                .entries(Op::Watch, filter, raws)
                .await?
                .into_iter()
                .filter(|e| e.revision > after)
                .collect();
            Ok(subscription.into_stream(catch_up, upto.max(after)))
        })
        .await
    }
}

/// A revision as etcd's signed integer (revisions never reach 2^63).
fn rev(r: u64) -> i64 {
    i64::try_from(r).unwrap_or(i64::MAX)
}
