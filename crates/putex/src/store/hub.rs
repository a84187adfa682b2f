//! One change feed per store handle, shared by every watch on it.
//!
//! A process holding 10,000 leases watches 10,000 keys. Giving each watch a
//! subscription of its own costs the store one consumer per lease (NATS
//! allows 1,000 per stream) or one polling connection and thread per lease
//! (SQLite). Instead a backend runs **one feed** per handle — every change
//! to every key, in revision order — and a [`Hub`] hands each change to the
//! watches whose filter selects it.
//!
//! A watch is a [`Subscription`] taken *before* the backend reads the
//! watch's starting state (its catch-up), so nothing written after that
//! read can be missed: it is in the feed after the subscription began. The
//! stream ([`Subscription::into_stream`]) delivers the catch-up, then the
//! feed's events with a revision above everything delivered so far — the
//! feed's copies of what the catch-up already showed are dropped. So, as
//! the store contract says, revisions only increase within one watch, and
//! the latest state of every selected key is delivered (a catch-up may
//! coalesce older changes of a key into its latest, which the contract
//! allows).
//!
//! When the feed fails the hub fails every subscription with that error
//! (their streams end; watchers re-establish from their last revision, as
//! the contract asks) and refuses new ones until the backend started a new
//! feed ([`Hub::revive`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::StreamExt;

use super::keys::filter_matches;
use super::{StoreError, WatchEvent, WatchStream};

type Sender = mpsc::UnboundedSender<Result<WatchEvent, StoreError>>;

/// The watches of one store handle, fed by the handle's one change feed.
#[derive(Default)]
pub(crate) struct Hub {
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reg = self.lock();
        f.debug_struct("Hub")
            .field("live", &reg.live)
            .field("keys", &reg.exact.len())
            .field("prefixes", &reg.prefixes.len())
            .finish()
    }
}

#[derive(Default)]
struct Registry {
    /// Whether a feed runs: subscriptions taken now will be fed.
    live: bool,
    next_id: u64,
    /// Watches of one key, by key.
    exact: HashMap<String, HashMap<u64, Sender>>,
    /// Watches of a prefix (`member.pg.`) or of everything (`""`).
    prefixes: HashMap<u64, (String, Sender)>,
}

impl Hub {
    /// A hub with no feed yet.
    pub(crate) fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// Marks the feed as running: subscriptions are taken again.
    pub(crate) fn revive(&self) {
        self.lock().live = true;
    }

    /// Whether a feed runs.
    pub(crate) fn is_live(&self) -> bool {
        self.lock().live
    }

    /// Starts a watch of `filter` (a key, a prefix ending in `.`, or `""`),
    /// fed from now on; `None` while no feed runs.
    pub(crate) fn subscribe(self: &Arc<Self>, filter: &str) -> Option<Subscription> {
        // futures' channel: a few hundred bytes until used (tokio's takes a
        // block of 32 events, 3.3 KB, per watch up front).
        let (tx, rx) = mpsc::unbounded();
        let mut reg = self.lock();
        if !reg.live {
            return None;
        }
        reg.next_id += 1;
        let id = reg.next_id;
        if filter.is_empty() || filter.ends_with('.') {
            reg.prefixes.insert(id, (filter.to_owned(), tx));
        } else {
            reg.exact
                .entry(filter.to_owned())
                .or_default()
                .insert(id, tx);
        }
        Some(Subscription {
            hub: self.clone(),
            id,
            filter: filter.to_owned(),
            rx,
        })
    }

    /// Hands one change from the feed to every watch that selects its key.
    pub(crate) fn dispatch(&self, event: &WatchEvent) {
        let reg = self.lock();
        if let Some(watchers) = reg.exact.get(&event.key) {
            for tx in watchers.values() {
                let _ = tx.unbounded_send(Ok(event.clone()));
            }
        }
        for (filter, tx) in reg.prefixes.values() {
            if filter_matches(filter, &event.key) {
                let _ = tx.unbounded_send(Ok(event.clone()));
            }
        }
    }

    /// The feed failed: every watch ends with `error`, and no new one is
    /// taken until [`Hub::revive`].
    pub(crate) fn fail(&self, error: impl Fn() -> StoreError) {
        let mut reg = self.lock();
        reg.live = false;
        for (_, watchers) in reg.exact.drain() {
            for (_, tx) in watchers {
                let _ = tx.unbounded_send(Err(error()));
            }
        }
        for (_, (_, tx)) in reg.prefixes.drain() {
            let _ = tx.unbounded_send(Err(error()));
        }
    }

    /// How many watches the hub feeds.
    pub(crate) fn watches(&self) -> usize {
        let reg = self.lock();
        reg.exact.values().map(HashMap::len).sum::<usize>() + reg.prefixes.len()
    }

    fn unsubscribe(&self, id: u64, filter: &str) {
        let mut reg = self.lock();
        if reg.prefixes.remove(&id).is_none() {
            if let Some(watchers) = reg.exact.get_mut(filter) {
                watchers.remove(&id);
                if watchers.is_empty() {
                    reg.exact.remove(filter);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves the maps consistent (every
        // change is one insert or remove): go on with them.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One watch's place in the [`Hub`]: the feed's events for its filter,
/// queued from the moment it was taken. Dropping it ends the watch.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    filter: String,
    rx: mpsc::UnboundedReceiver<Result<WatchEvent, StoreError>>,
}

impl Subscription {
    /// The watch's stream: `catch_up` (the backend's read of the starting
    /// state, in revision order, taken after this subscription), then the
    /// feed's events above `floor` and above everything delivered — the
    /// feed's copies of changes the catch-up covered are dropped. `floor`
    /// is the revision the catch-up read up to (or the one below the
    /// watch's starting revision, when that is higher).
    pub(crate) fn into_stream(self, catch_up: Vec<WatchEvent>, floor: u64) -> WatchStream {
        let queue: VecDeque<WatchEvent> = catch_up.into();
        let state = (self, queue, 0, floor, false);
        Box::pin(futures::stream::unfold(
            state,
            |(mut sub, mut queue, mut last, floor, ended)| async move {
                if ended {
                    return None;
                }
                while let Some(event) = queue.pop_front() {
                    if event.revision > last {
                        last = event.revision;
                        return Some((Ok(event), (sub, queue, last, floor, false)));
                    }
                }
                let last = last.max(floor);
                loop {
                    match sub.rx.next().await {
                        Some(Ok(event)) if event.revision > last => {
                            let last = event.revision;
                            return Some((Ok(event), (sub, queue, last, floor, false)));
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => return Some((Err(e), (sub, queue, last, floor, true))),
                        None => return None,
                    }
                }
            },
        ))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.id, &self.filter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use putex_core::store::{Entry, StoreTime, Token};

    fn event(key: &str, revision: u64) -> WatchEvent {
        let time = StoreTime { era: 0, nanos: 0 };
        WatchEvent {
            key: key.to_owned(),
            entry: Some(Entry {
                value: vec![],
                token: Token::new(1, revision),
                time,
            }),
            revision,
            time,
        }
    }

    async fn take(stream: &mut WatchStream, n: usize) -> Vec<(String, u64)> {
        let mut got = Vec::new();
        for _ in 0..n {
            let e = stream.next().await.unwrap().unwrap();
            got.push((e.key, e.revision));
        }
        got
    }

    #[tokio::test]
    async fn a_watch_gets_its_keys_once_each_in_revision_order() {
        let hub = Hub::new();
        hub.revive();
        let one = hub.subscribe("lock.a").unwrap();
        let prefix = hub.subscribe("lock.").unwrap();
        let all = hub.subscribe("").unwrap();
        // The catch-up read up to 5 and saw lock.a at 4; the feed then
        // delivers 4 and 5 again (written before the read, fed after), 6.
        for (k, r) in [("lock.a", 4), ("lock.b", 5), ("lock.a", 6), ("member.x", 7)] {
            hub.dispatch(&event(k, r));
        }
        let mut one = one.into_stream(vec![event("lock.a", 4)], 5);
        assert_eq!(take(&mut one, 1).await, [("lock.a".into(), 4)]);
        assert_eq!(take(&mut one, 1).await, [("lock.a".into(), 6)]);
        let mut prefix = prefix.into_stream(vec![], 0);
        assert_eq!(
            take(&mut prefix, 3).await,
            [
                ("lock.a".into(), 4),
                ("lock.b".into(), 5),
                ("lock.a".into(), 6)
            ]
        );
        let mut all = all.into_stream(vec![], 6);
        assert_eq!(take(&mut all, 1).await, [("member.x".into(), 7)]);
        assert_eq!(hub.watches(), 3);
        drop((one, prefix, all));
        assert_eq!(hub.watches(), 0);
    }

    #[tokio::test]
    async fn a_failed_feed_ends_every_watch_and_refuses_new_ones_until_revived() {
        let hub = Hub::new();
        assert!(hub.subscribe("lock.a").is_none(), "no feed yet");
        hub.revive();
        let mut w = hub.subscribe("lock.a").unwrap().into_stream(vec![], 0);
        hub.fail(|| StoreError::config("the file was replaced"));
        assert!(w.next().await.unwrap().is_err());
        assert!(w.next().await.is_none());
        assert!(hub.subscribe("lock.a").is_none());
        hub.revive();
        assert!(hub.subscribe("lock.a").is_some());
    }
}
