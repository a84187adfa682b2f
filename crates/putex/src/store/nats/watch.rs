//! Watches: one ordered consumer over the whole bucket per handle feeds
//! every watch through the hub; a watch's catch-up is read after it
//! subscribed — a key's last message from the stream leader, or a prefix's
//! changes through a consumer of their own — and the feed's copies of it
//! are dropped. Consumers are removed when their watch is done.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;

use super::{nats_filter, Inner, NatsStore, KV_OPERATION, NATS_ERA};
use crate::store::hub::Hub;
use crate::store::{Entry, Op, StoreError, StoreTime, WatchEvent};

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

/// How long a prefix catch-up waits for its next message before it asks
/// the stream again what the prefix's newest message is.
const QUIET: Duration = Duration::from_millis(250);

impl NatsStore {
    /// The key's last message (a delete marker included) as a watch event,
    /// and its revision (0 when the key never existed).
    pub(super) async fn read_last(&self, key: &str) -> Result<(Vec<WatchEvent>, u64), StoreError> {
        let subject = format!("{}{key}", self.inner.kv.prefix);
        let Some(m) = self.last_message(&subject, key).await? else {
            return Ok((vec![], 0));
        };
        let deleted = is_delete_marker(m.headers.get(KV_OPERATION).map(|v| v.as_str()), None);
        let event = self.event(
            key.to_owned(),
            m.sequence,
            nanos!(m.time),
            deleted,
            m.payload.to_vec(),
        );
        Ok((vec![event], m.sequence))
    }

    /// The newest message on `subject` (a wildcard too) from the stream
    /// leader, if any; errors name `name`.
    async fn last_message(
        &self,
        subject: &str,
        name: &str,
    ) -> Result<Option<jetstream::message::StreamMessage>, StoreError> {
        use jetstream::stream::LastRawMessageErrorKind as K;
        match self
            .inner
            .kv
            .stream
            .get_last_raw_message_by_subject(subject)
            .await
        {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == K::NoMessageFound => Ok(None),
            Err(e) => Err(StoreError::unknown(Op::Watch, name, e)),
        }
    }

    /// The changes under a prefix (`""`: all) — the latest of every key, or
    /// those from `from_revision` — read by a consumer of their own until it
    /// has caught up, and the last revision read. Prefix watches are few
    /// (members and control records of an agent); the consumer is removed
    /// as soon as it has been read.
    ///
    /// "Caught up" is a revision, not a count: the prefix's newest message
    /// is read from the stream leader before the consumer is made, and the
    /// catch-up ends with it or with the first later message (the consumer
    /// delivers in revision order; a key written again after it comes with
    /// its newer message, which the feed also has). The counts nats-server
    /// reports cannot end it: under writes to the prefix's keys it was seen
    /// to count one message short at the consumer's creation (a key written
    /// just before the watch, lost: 2 runs in 300 of
    /// `store_nats_prefix_watch_starts_with_the_key_written_before_it`
    /// beside a busy loop) and to say
    /// "0 pending" on a message with one of the set still to come (a
    /// snapshot's marker, lost: 3 runs in 20 of
    /// `store_nats_snapshots_miss_no_busy_key` under load). When nothing comes for [`QUIET`], the prefix's
    /// newest message is read again: it may be gone before it was
    /// delivered (a retired key's marker expiring), and then what was read
    /// is all there is.
    pub(super) async fn read_changes(
        &self,
        filter: &str,
        from_revision: Option<u64>,
    ) -> Result<(Vec<WatchEvent>, u64), StoreError> {
        let start = from_revision.unwrap_or(0).max(1);
        let Some(mut newest) = self.newest_revision(filter).await? else {
            return Ok((Vec::new(), 0));
        };
        if newest < start {
            return Ok((Vec::new(), 0));
        }
        let deliver_policy = match from_revision {
            None => jetstream::consumer::DeliverPolicy::LastPerSubject,
            Some(_) => jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
        };
        let (consumer, _remove) = self
            .ordered_consumer("putex watch catch-up", filter, filter, deliver_policy)
            .await?;
        let mut events = Vec::new();
        let mut upto = 0;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| StoreError::unknown(Op::Watch, filter, e))?;
        while upto < newest {
            let message = match tokio::time::timeout(QUIET, messages.next()).await {
                Ok(Some(message)) => {
                    message.map_err(|e| StoreError::unknown(Op::Watch, filter, e))?
                }
                Ok(None) => {
                    return Err(StoreError::unknown(Op::Watch, filter, "the consumer ended"))
                }
                // Nothing came: the newest message may be gone (a retired
                // key's marker expired); what the prefix holds now decides.
                Err(_) => match self.newest_revision(filter).await? {
                    Some(now) if now > upto => {
                        newest = now;
                        continue;
                    }
                    _ => break,
                },
            };
            let event = self.message_event(&message, filter)?;
            upto = event.revision;
            events.push(event);
        }
        Ok((events, upto))
    }

    /// The revision of the newest message under `filter` (a delete marker
    /// included), from the stream leader; `None` when there is none.
    async fn newest_revision(&self, filter: &str) -> Result<Option<u64>, StoreError> {
        let subject = format!("{}{}", self.inner.kv.prefix, nats_filter(filter));
        Ok(self
            .last_message(&subject, filter)
            .await?
            .map(|m| m.sequence))
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
    pub(super) async fn start_feed(&self, filter: &str) -> Result<(), StoreError> {
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
