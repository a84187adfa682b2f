//! Watches: one etcd watch over the whole prefix per handle feeds every
//! watch through the hub, each change stamped with the store clock; a
//! watch's catch-up is read after it subscribed — the latest state, or the
//! changes since a revision through a watch of its own up to a marker this
//! handle writes — and the feed's copies of it are dropped. A compacted
//! revision is read as the latest state.

use std::sync::Arc;
use std::time::Duration;

use super::calls::{client_error, retry_unsent};
use super::{client, pb, rev, EtcdStore, Inner, Raw, CATCH_UP_KEY, EPOCH_KEY};
use crate::store::hub::Hub;
use crate::store::keys::filter_matches;
use crate::store::{Op, StoreError};

impl EtcdStore {
    /// The etcd range a watch filter selects: `(start, end)`; `end` empty
    /// for one key.
    fn range(&self, filter: &str) -> (String, Vec<u8>) {
        let start = self.full(filter);
        if filter.is_empty() || filter.ends_with('.') {
            let end = prefix_end(start.as_bytes());
            (start, end)
        } else {
            (start, Vec::new())
        }
    }

    /// Every record under `filter` as of now (the prefix's own records
    /// left out), and the revision read at.
    pub(super) async fn read_range(&self, filter: &str) -> Result<(Vec<Raw>, u64), StoreError> {
        let (start, end) = self.range(filter);
        let request = pb::RangeRequest {
            key: start.into_bytes(),
            range_end: end,
            ..Default::default()
        };
        let resp = retry_unsent(|| self.inner.client.range(request.clone()))
            .await
            .map_err(|e| client_error(Op::Watch, filter, e))?;
        let upto = self.check_cluster(Op::Watch, filter, resp.header.as_ref())?;
        let mut raws: Vec<Raw> = resp
            .kvs
            .iter()
            .filter_map(|kv| self.raw_of(kv))
            .filter(|r| filter_matches(filter, &r.key))
            .collect();
        // etcd answers in key order; a watch delivers in revision order.
        raws.sort_by_key(|r| r.revision);
        Ok((raws, upto))
    }

    /// The changes under `filter` from revision `from` up to now, deletes
    /// included, and the revision they reach. They are read by an etcd
    /// watch of their own over the whole prefix, up to a marker this
    /// handle writes (`<prefix>/=catchup`) once the watch runs: the watch
    /// delivers in revision order, so every change before the marker has
    /// come when the marker does. (etcd before 3.5.8 answers a progress
    /// request before it has sent what it owes, so progress cannot say
    /// "caught up".) Resuming is rare — after a feed failed — so the extra
    /// write costs little. A compacted `from` is read as the latest state
    /// (the contract allows coalescing; deletes before it are lost to etcd).
    pub(super) async fn read_since(
        &self,
        filter: &str,
        from: u64,
    ) -> Result<(Vec<Raw>, u64), StoreError> {
        let (now, upto) = self.read_range(filter).await?;
        if from > upto {
            return Ok((Vec::new(), upto));
        }
        let request = pb::WatchCreateRequest {
            start_revision: rev(from),
            ..self.whole_prefix()
        };
        let mut stream = retry_unsent(|| self.inner.client.watch(request.clone()))
            .await
            .map_err(|e| client_error(Op::Watch, filter, e))?;
        let marker_key = self.full(CATCH_UP_KEY);
        let mut marker: Option<u64> = None;
        let mut raws = Vec::new();
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    return Err(StoreError::unknown(
                        Op::Watch,
                        filter,
                        "the catch-up watch ended",
                    ))
                }
                Err(e) => return Err(client_error(Op::Watch, filter, e)),
            };
            if resp.compact_revision > 0 {
                // Compacted: the latest state stands for the changes.
                let latest = now.into_iter().filter(|r| r.revision >= from).collect();
                return Ok((latest, upto));
            }
            if resp.canceled {
                return Err(StoreError::unknown(
                    Op::Watch,
                    filter,
                    format_args!("the catch-up watch was cancelled: {}", resp.cancel_reason),
                ));
            }
            if resp.created {
                // Registered: what is written from now on comes after all
                // it owes. The marker's revision is where to stop.
                let request = pb::PutRequest {
                    key: marker_key.clone().into_bytes(),
                    ..Default::default()
                };
                let put = retry_unsent(|| self.inner.client.put(request.clone()))
                    .await
                    .map_err(|e| client_error(Op::Watch, filter, e))?;
                marker = Some(self.check_cluster(Op::Watch, filter, put.header.as_ref())?);
                continue;
            }
            for ev in &resp.events {
                let Some(kv) = &ev.kv else { continue };
                let revision = u64::try_from(kv.mod_revision).unwrap_or(0);
                if kv.key == marker_key.as_bytes() {
                    if marker.is_some_and(|m| revision >= m) {
                        return Ok((raws, upto));
                    }
                    continue;
                }
                let Some(mut raw) = self.raw_of(kv) else {
                    continue;
                };
                if !filter_matches(filter, &raw.key) || raw.revision > upto {
                    continue;
                }
                if client::is_delete(ev) {
                    raw.value = None;
                }
                raws.push(raw);
            }
        }
    }

    /// A watch of every key under the prefix, from now on.
    fn whole_prefix(&self) -> pb::WatchCreateRequest {
        let start = self.inner.prefix.clone().into_bytes();
        pb::WatchCreateRequest {
            range_end: prefix_end(&start),
            key: start,
            ..Default::default()
        }
    }

    /// Starts the handle's watch feed unless one runs: one etcd watch over
    /// the whole prefix from now on, whose events a task hands to the hub.
    pub(super) async fn start_feed(&self, filter: &str) -> Result<(), StoreError> {
        let mut stop = self.inner.starting.lock().await;
        if self.inner.hub.is_live() {
            return Ok(());
        }
        let request = self.whole_prefix();
        let mut signed_in_again = false;
        let (stream, from) = loop {
            let mut stream = retry_unsent(|| self.inner.client.watch(request.clone()))
                .await
                .map_err(|e| client_error(Op::Watch, filter, e))?;
            // Registered once etcd says so: what is written after that is fed.
            match stream.message().await {
                Ok(Some(r)) if r.created && !r.canceled => {
                    let from = r.header.as_ref().map_or(0, |h| h.revision);
                    break (stream, u64::try_from(from).unwrap_or(0));
                }
                // etcd refuses a watch whose token expired by cancelling it
                // ("invalid auth token"; "permission denied" from etcd 3.5.1),
                // which the client's own sign-in again does not see: once
                // signed in again, a watch still refused is refused.
                Ok(Some(r)) if !signed_in_again && refused_for_its_token(&r.cancel_reason) => {
                    signed_in_again = true;
                    self.inner
                        .client
                        .refresh_token()
                        .await
                        .map_err(|e| client_error(Op::Watch, filter, e))?;
                }
                Ok(Some(r)) => {
                    return Err(StoreError::unknown(
                        Op::Watch,
                        filter,
                        format_args!("etcd did not start the watch: {}", r.cancel_reason),
                    ))
                }
                Ok(None) => return Err(StoreError::unknown(Op::Watch, filter, "the watch ended")),
                Err(e) => return Err(client_error(Op::Watch, filter, e)),
            }
        };
        let fed = self.inner.seen.started(from);
        let token = tokio_util::sync::CancellationToken::new();
        *stop = Some(token.clone().drop_guard());
        tokio::spawn(feed(
            Arc::downgrade(&self.inner.hub),
            Arc::downgrade(&self.inner),
            stream,
            token,
            fed,
        ));
        self.inner.hub.revive();
        Ok(())
    }
}

/// The first key after every key that starts with `prefix`.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Whether etcd cancelled a watch for what may be an expired token.
fn refused_for_its_token(reason: &str) -> bool {
    reason.contains("invalid auth token") || reason.contains("permission denied")
}

/// How long the feed waits for the store clock to stamp what it received
/// before it gives up: then every watch fails and the next starts a new
/// feed (from the last revision each saw), maybe through another member.
/// Longer than `NO_LEADER_PATIENCE` (`calls.rs`), so that a reading made
/// again through an ordinary election does not end the feed.
const FEED_STAMP_TIMEOUT: Duration = Duration::from_secs(3);

/// The feed of one handle: every change under the prefix, stamped and
/// handed to the hub. Ends when the handle is gone; on an error it fails
/// every watch, and the next watch starts a new feed.
async fn feed(
    hub: std::sync::Weak<Hub>,
    store: std::sync::Weak<Inner>,
    mut stream: client::WatchStream,
    stop: tokio_util::sync::CancellationToken,
    fed: u64,
) {
    loop {
        let next = tokio::select! {
            next = stream.message() => next,
            () = stop.cancelled() => {
                if let Some(inner) = store.upgrade() {
                    inner.seen.ended(fed);
                }
                return;
            }
        };
        let (Some(hub), Some(inner)) = (hub.upgrade(), store.upgrade()) else {
            return;
        };
        let store = EtcdStore { inner };
        let failed = match next {
            Ok(Some(resp)) if resp.canceled || resp.compact_revision > 0 => StoreError::unknown(
                Op::Watch,
                "",
                format_args!("etcd cancelled the watch feed: {}", resp.cancel_reason),
            ),
            Ok(Some(resp)) => {
                if let Err(e) = store.check_cluster(Op::Watch, "", resp.header.as_ref()) {
                    e
                } else {
                    let epoch_key = store.full(EPOCH_KEY);
                    let mut raws = Vec::new();
                    for ev in &resp.events {
                        let Some(kv) = &ev.kv else { continue };
                        if kv.key == epoch_key.as_bytes() && !client::is_delete(ev) {
                            store.adopt_epoch(&kv.value);
                            continue;
                        }
                        let Some(mut raw) = store.raw_of(kv) else {
                            continue;
                        };
                        if client::is_delete(ev) {
                            raw.value = None;
                        }
                        raws.push(raw);
                    }
                    store
                        .inner
                        .seen
                        .delivered(fed, raws.iter().map(|r| (r.key.as_str(), r.revision)));
                    if raws.is_empty() {
                        continue;
                    }
                    let stamped = tokio::time::timeout(
                        FEED_STAMP_TIMEOUT,
                        store.entries(Op::Watch, "", raws),
                    );
                    match stamped.await {
                        Ok(Ok(events)) => {
                            for event in &events {
                                hub.dispatch(event);
                            }
                            continue;
                        }
                        Ok(Err(e)) => e,
                        Err(_) => StoreError::unknown(
                            Op::Watch,
                            "",
                            format_args!(
                                "the store clock gave the feed no reading within {FEED_STAMP_TIMEOUT:?}"
                            ),
                        ),
                    }
                }
            }
            Ok(None) => StoreError::unknown(Op::Watch, "", "the watch feed ended"),
            Err(e) => client_error(Op::Watch, "", e),
        };
        store.inner.seen.ended(fed);
        hub.fail(|| failed.clone());
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"putex/"), b"putex0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
