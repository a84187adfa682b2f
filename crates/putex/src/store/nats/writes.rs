//! The writes: a publish to the key's subject with the expected last
//! revision in its headers, answered on the handle's one subscription
//! ([`acks`]), and the compare-and-swap around it — which on a bucket with
//! *dated* revisions ([`first_dated_revision`]) needs no epoch read first,
//! and on an undated one reads the epoch from the stream leader right
//! before it publishes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::HeaderMap;

use super::{acks, Body, Marker, NatsStore, KV_OPERATION};
use crate::store::keys::validate_key;
use crate::store::{Op, Store, StoreError, Token, Write, RETIRED_KEPT};

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
/// An atomic batch's headers (ADR-50, nats-server 2.12+): its id, each
/// message's place in it, and on the last, the commit.
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

impl NatsStore {
    /// Publishes to the key's subject; `expect` is the required last
    /// revision of the key (0 = none) — or, with `guard`, of that key
    /// instead (a guarded write) —, `marker` says whether it is a value or
    /// which marker.
    /// Returns the revision written.
    pub(super) async fn publish(
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

    /// Publishes `writes` as one atomic batch (nats-server 2.12+, on a
    /// stream that allows them, [`NatsStore::allow_atomic`]): every message
    /// carries the guard's expectation (`guard`'s last revision is
    /// `guard_revision`), which the stream checks against its state before
    /// the batch when the last message commits it; all land or none does.
    /// Every message but the last is published without a reply; the stream
    /// answers the commit with the revision of the batch's last message.
    async fn publish_batch(
        &self,
        writes: &[Write],
        guard_revision: u64,
        guard: &str,
    ) -> Result<u64, StoreError> {
        let key = writes.first().map_or("", Write::key);
        self.allow_atomic().await?;
        let inbox = self.inner.client.new_inbox();
        let id = inbox.rsplit('.').next().unwrap_or(&inbox).to_owned();
        let guard = format!("{}{guard}", self.inner.subject_prefix);
        let n = writes.len();
        for (i, write) in writes.iter().enumerate() {
            let mut headers = HeaderMap::new();
            headers.insert(BATCH_ID, id.as_str());
            headers.insert(BATCH_SEQUENCE, async_nats::HeaderValue::from(i + 1));
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQ,
                async_nats::HeaderValue::from(guard_revision),
            );
            headers.insert(EXPECTED_LAST_SUBJECT_SEQ_SUBJECT, guard.as_str());
            let value = match write {
                Write::Put { value, .. } => value.clone(),
                Write::Delete { .. } => {
                    headers.insert(KV_OPERATION, "DEL");
                    Vec::new()
                }
            };
            let subject = format!("{}{}", self.inner.subject_prefix, write.key());
            let sent = if i + 1 == n {
                headers.insert(BATCH_COMMIT, "1");
                self.inner.acks.publish(subject, headers, value).await
            } else {
                self.inner
                    .acks
                    .send(subject, headers, value)
                    .await
                    .map(|()| 0)
            };
            let revision = sent.map_err(|e| match e {
                acks::WriteError::Conflict => StoreError::conflict(Op::Guarded, key),
                acks::WriteError::Unknown(why) => StoreError::unknown(Op::Guarded, key, why),
            })?;
            if i + 1 == n {
                return Ok(revision);
            }
        }
        unreachable!("a batch has a last message")
    }

    /// A write to `key` that lands only if `expected` holds: the key's own
    /// last revision, or with `guard` that key's (a guarded write).
    pub(super) async fn cas(
        &self,
        op: Op,
        key: &str,
        body: Body<'_>,
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
                let written = match (body, guard) {
                    (Body::One(value, marker), _) => {
                        self.publish(op, key, value, Some(expected.revision), guard, marker)
                            .await
                    }
                    (Body::Batch(writes), Some(guard)) => {
                        self.publish_batch(writes, expected.revision, guard).await
                    }
                    (Body::Batch(_), None) => unreachable!("only a guarded write is a batch"),
                };
                match written {
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
