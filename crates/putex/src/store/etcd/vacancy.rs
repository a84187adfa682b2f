//! The etcd store's proof that a new lock record's key held nothing for a
//! while before it (S4 refined: `docs/safety.md`, "When an absent record
//! proves vacancy"; `docs/stores.md`, "First use").
//!
//! The proof needs three facts, and etcd gives each:
//!
//! - **Every acknowledged write is kept**: etcd fsyncs its log before it
//!   acknowledges and applies writes through a quorum. (A cluster restored
//!   from a snapshot loses the writes after it; see the anchor below.)
//! - **A delete of the key by anyone is visible**: etcd's history holds
//!   every change, deletes included, until it is compacted. A watch of the
//!   one key from an old revision replays its changes; if the first one is
//!   our own create, the key held no record between that revision and the
//!   create. A compacted revision proves nothing.
//! - **A clock that never jumps**: the store clock ([`super::clock`]), the
//!   leader's countdown of the shared clock lease, read in whole seconds.
//!
//! An **anchor** (`<prefix>/=vacancy.0` or `.1`) ties a revision to a
//! clock reading: `{revision r, reading x}` means revision r was applied
//! before the clock lease read x seconds (rounded up). A linearizable read
//! gives r, a clock reading taken after its answer gives x. A create at
//! revision H whose key changed nothing in (r, H) was over a key vacant
//! since r was applied: any holder whose record the key lost wrote it last
//! at or before r. The time since is at least `now − x` on the leader's
//! clock, `now` read after the create and rounded down.
//!
//! An anchor is usable only with readings of the same lease, raft term,
//! cluster and epoch as its own, and no smaller than its own: within one
//! term one leader counts the lease down on its monotonic clock. A new
//! leader refreshes every lease (its readings restart near 0), a restored
//! snapshot restarts the terms and, brought up as a new cluster, gets a new
//! epoch: each makes an anchor unusable, and so does a compaction past its
//! revision. A first use that finds no usable anchor writes one and waits
//! the whole W + G'; later first uses wait what is left. Once the newest
//! usable anchor is [`ANCHOR_EVERY`] old, a first use writes a newer one in
//! the other slot: while first uses come, one between one and two minutes
//! old is there, and a compaction that keeps the last few minutes leaves
//! the newer when it takes the older.
//!
//! A handle whose watch feed runs ([`FeedSeen`]) asks no history for an
//! anchor newer than the feed's start: the feed delivered every change of
//! the key since then, in order, up to our create.
//!
//! Anything that goes wrong proves nothing ([`Duration::ZERO`]): the create
//! stands, and the core waits the whole W + G' as without a proof.

use std::collections::HashMap;
use std::time::Duration;

use super::calls::{client_error, retry_unsent};
use super::clock::Reading;
use super::watch::prefix_end;
use super::{client, pb, rev, EtcdStore, EPOCH_KEY};

use crate::store::{Op, StoreError};

/// The two anchor records, under the prefix: a new one is written beside
/// the other, so that one older than [`ANCHOR_EVERY`] is always there.
pub(super) const ANCHOR_KEYS: [&str; 2] = ["=vacancy.0", "=vacancy.1"];
/// What both anchors' keys start with: one range reads them.
const ANCHOR_PREFIX: &str = "=vacancy.";

/// How old the newest usable anchor grows before a first use writes a
/// newer one in the other slot (seconds on the store clock): the older one
/// then proves up to twice this, and a compaction that keeps the last
/// minutes of history (etcd's periodic `--auto-compaction-retention` keeps
/// at least its retention) leaves the newer one.
const ANCHOR_EVERY: u64 = 60;

/// How long a proof waits for the handle's own watch feed to deliver the
/// create before it asks etcd's history instead.
const FEED_PATIENCE: Duration = Duration::from_millis(50);

/// The most keys whose changes [`FeedSeen`] keeps; past it, it forgets
/// them all and its coverage starts again (a proof then asks the history).
const MAX_SEEN_KEYS: usize = 100_000;

/// What this handle's watch feed delivered, for proofs without a watch of
/// their own: the feed delivers every change under the prefix, in revision
/// order, after the revision it started at, so once it delivered our
/// create at H it had delivered every change of that key before H since its
/// start. A long-running process (the gateway, an agent) proves from this
/// as soon as an anchor newer than its feed's start is old enough; etcd's
/// history is asked only for what came before.
pub(super) struct FeedSeen {
    state: parking_lot::Mutex<Seen>,
    bumped: tokio::sync::watch::Sender<()>,
}

#[derive(Default)]
struct Seen {
    /// Which feed this is of the handle's: what an earlier feed still
    /// delivers after a later one started is not taken.
    feed: u64,
    /// The running feed's start: every change after this revision is
    /// delivered. `None`: no feed runs.
    from: Option<u64>,
    /// The last two revisions at which each key changed since `from`, the
    /// older first (0: none).
    changes: HashMap<String, [u64; 2]>,
}

impl FeedSeen {
    pub(super) fn new() -> FeedSeen {
        FeedSeen {
            state: parking_lot::Mutex::new(Seen::default()),
            bumped: tokio::sync::watch::Sender::new(()),
        }
    }

    /// A feed started: it delivers every change after revision `from`.
    /// Returns its number, which its deliveries carry.
    pub(super) fn started(&self, from: u64) -> u64 {
        let mut seen = self.state.lock();
        let feed = seen.feed + 1;
        *seen = Seen {
            feed,
            from: Some(from),
            changes: HashMap::new(),
        };
        drop(seen);
        self.bumped.send_replace(());
        feed
    }

    /// Feed `feed` delivered these changes (key, revision), in order.
    pub(super) fn delivered<'a>(&self, feed: u64, changes: impl Iterator<Item = (&'a str, u64)>) {
        let mut seen = self.state.lock();
        if seen.feed != feed || seen.from.is_none() {
            return;
        }
        for (key, revision) in changes {
            if seen.changes.len() >= MAX_SEEN_KEYS && !seen.changes.contains_key(key) {
                // Forget them all: covered again from this revision on.
                *seen = Seen {
                    feed,
                    from: Some(revision),
                    changes: HashMap::new(),
                };
                continue;
            }
            let last = seen.changes.entry(key.to_owned()).or_default();
            *last = [last[1], revision];
        }
        drop(seen);
        self.bumped.send_replace(());
    }

    /// Feed `feed` ended: nothing is covered until another starts.
    pub(super) fn ended(&self, feed: u64) {
        let mut seen = self.state.lock();
        if seen.feed == feed {
            seen.from = None;
            seen.changes.clear();
        }
        drop(seen);
        self.bumped.send_replace(());
    }

    /// The running feed's start, if one runs.
    fn from(&self) -> Option<u64> {
        self.state.lock().from
    }

    /// Once the feed delivered `key`'s change at `created`: the feed's start
    /// and the revision of the key's change before `created` since then (0:
    /// none). `None` when no feed covers it (none runs, it started after
    /// `created` or restarted, or the key changed again since).
    async fn before(&self, key: &str, created: u64) -> Option<(u64, u64)> {
        let mut bumped = self.bumped.subscribe();
        loop {
            {
                let seen = self.state.lock();
                let from = seen.from.filter(|from| *from < created)?;
                match seen.changes.get(key) {
                    Some([before, last]) if *last == created => return Some((from, *before)),
                    Some([_, last]) if *last > created => return None,
                    _ => {}
                }
            }
            bumped.changed().await.ok()?;
        }
    }
}

/// The anchor's value: revision `revision` was applied before the clock
/// lease `lease` read `reading` seconds, in raft term `term` of `cluster`,
/// under the store epoch `epoch`.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
struct Anchor {
    v: u32,
    epoch: u64,
    cluster: u64,
    term: u64,
    lease: i64,
    revision: u64,
    reading: u64,
}

impl Anchor {
    /// Whether a reading taken now may be measured against this anchor.
    fn usable_with(&self, now: &Reading, epoch: u64) -> bool {
        self.v == 1
            && self.epoch == epoch
            && self.cluster == now.cluster
            && self.term == now.term
            && self.lease == now.lease
            && self.reading <= now.seconds
    }

    /// The vacancy proven from this anchor at reading `now`: the lower end
    /// of `now`'s second less the upper end of the anchor's.
    fn vacant_for(&self, now: &Reading) -> Duration {
        Duration::from_secs(now.seconds.saturating_sub(1).saturating_sub(self.reading))
    }
}

/// Which anchors may prove against reading `now`, oldest first, and the
/// slot a new anchor goes in: the other one's, once the newest usable one is
/// [`ANCHOR_EVERY`] old; the first, when none is usable.
fn plan(
    anchors: [Option<Anchor>; 2],
    now: &Reading,
    epoch: u64,
) -> (Vec<(usize, Anchor)>, Option<usize>) {
    let mut usable: Vec<(usize, Anchor)> = anchors
        .into_iter()
        .enumerate()
        .filter_map(|(slot, a)| a.filter(|a| a.usable_with(now, epoch)).map(|a| (slot, a)))
        .collect();
    usable.sort_by_key(|(_, a)| a.reading);
    let rotate = match usable.last() {
        None => Some(0),
        Some((slot, a)) if now.seconds - a.reading >= ANCHOR_EVERY => Some(1 - slot),
        Some(_) => None,
    };
    (usable, rotate)
}

/// The first change of a key a watch replays from a revision on.
enum FirstChange {
    /// A change at this revision, and whether it created the key there.
    At { revision: u64, created: bool },
    /// The revision asked for was compacted.
    Compacted,
}

impl EtcdStore {
    /// How long `key`, created at revision `created` by this handle, was
    /// provably without a record before it (zero: no proof).
    pub(super) async fn vacancy(&self, key: &str, created: u64) -> Duration {
        match self.prove_vacancy(key, created).await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(key, error = %e, "etcd: no proof of the key's vacancy");
                Duration::ZERO
            }
        }
    }

    async fn prove_vacancy(&self, key: &str, created: u64) -> Result<Duration, StoreError> {
        let (anchors, now) = tokio::try_join!(
            self.read_anchors(key),
            self.inner
                .clock
                .read(&self.inner.client, &self.inner.prefix, Op::Create, key)
        )?;
        let epoch = self.inner.epoch.load(std::sync::atomic::Ordering::Acquire);
        let (usable, rotate) = plan(anchors, &now, epoch);
        if let Some(slot) = rotate {
            self.write_anchor(slot, key).await?;
        }
        // The oldest anchor that proves: its revision before our create, and
        // no change of the key between them — first as this handle's feed
        // saw it, if it ran since the anchor.
        let fed = self.inner.seen.from();
        if usable
            .iter()
            .any(|(_, a)| a.revision < created && fed.is_some_and(|from| a.revision >= from))
        {
            let seen = tokio::time::timeout(FEED_PATIENCE, self.inner.seen.before(key, created));
            if let Ok(Some((from, before))) = seen.await {
                let proving = usable.iter().find(|(_, a)| {
                    a.revision < created && a.revision >= from && a.revision >= before
                });
                if let Some((_, anchor)) = proving {
                    return Ok(anchor.vacant_for(&now));
                }
            }
        }
        let mut changed = 0;
        let mut compacted = None;
        for (slot, anchor) in usable {
            if anchor.revision >= created || anchor.revision < changed {
                continue;
            }
            match self.first_change(key, anchor.revision + 1).await? {
                FirstChange::At {
                    revision,
                    created: true,
                } if revision == created => {
                    return Ok(anchor.vacant_for(&now));
                }
                FirstChange::At { revision, .. } => changed = revision,
                FirstChange::Compacted => compacted = Some(slot),
            }
        }
        // Compacted and none newer proved: a new anchor in its place.
        if let Some(slot) = compacted.filter(|_| rotate.is_none()) {
            self.write_anchor(slot, key).await?;
        }
        Ok(Duration::ZERO)
    }

    /// The anchors that are there and parse.
    async fn read_anchors(&self, about: &str) -> Result<[Option<Anchor>; 2], StoreError> {
        let start = self.full(ANCHOR_PREFIX).into_bytes();
        let request = pb::RangeRequest {
            range_end: prefix_end(&start),
            key: start,
            ..Default::default()
        };
        let resp = retry_unsent(|| self.inner.client.range(request.clone()))
            .await
            .map_err(|e| client_error(Op::Create, about, e))?;
        self.check_cluster(Op::Create, about, resp.header.as_ref())?;
        let mut anchors = [None, None];
        for kv in &resp.kvs {
            if let Some(slot) = ANCHOR_KEYS
                .iter()
                .position(|k| kv.key == self.full(k).as_bytes())
            {
                anchors[slot] = serde_json::from_slice(&kv.value).ok();
            }
        }
        Ok(anchors)
    }

    /// Writes a new anchor in `slot`: a revision read first, then a clock
    /// reading.
    async fn write_anchor(&self, slot: usize, about: &str) -> Result<(), StoreError> {
        let (epoch, bytes) = self.inner.epoch_record.lock().clone();
        let request = pb::RangeRequest {
            key: self.full(EPOCH_KEY).into_bytes(),
            ..Default::default()
        };
        let resp = retry_unsent(|| self.inner.client.range(request.clone()))
            .await
            .map_err(|e| client_error(Op::Create, about, e))?;
        let revision = self.check_cluster(Op::Create, about, resp.header.as_ref())?;
        if resp.kvs.first().map(|kv| &kv.value) != Some(&bytes) {
            // The epoch changed under this handle: its next write finds out.
            return Ok(());
        }
        let reading = self
            .inner
            .clock
            .read(&self.inner.client, &self.inner.prefix, Op::Create, about)
            .await?;
        let anchor = Anchor {
            v: 1,
            epoch,
            cluster: reading.cluster,
            term: reading.term,
            lease: reading.lease,
            revision,
            reading: reading.seconds,
        };
        let request = pb::PutRequest {
            key: self.full(ANCHOR_KEYS[slot]).into_bytes(),
            value: serde_json::to_vec(&anchor).unwrap_or_default(),
            ..Default::default()
        };
        retry_unsent(|| self.inner.client.put(request.clone()))
            .await
            .map_err(|e| client_error(Op::Create, about, e))?;
        Ok(())
    }

    /// The first change of `key` from revision `from` on, replayed by a
    /// watch of that one key.
    async fn first_change(&self, key: &str, from: u64) -> Result<FirstChange, StoreError> {
        let request = pb::WatchCreateRequest {
            key: self.full(key).into_bytes(),
            start_revision: rev(from),
            ..Default::default()
        };
        let mut stream = retry_unsent(|| self.inner.client.watch(request.clone()))
            .await
            .map_err(|e| client_error(Op::Watch, key, e))?;
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return Err(StoreError::unknown(Op::Watch, key, "the watch ended")),
                Err(e) => return Err(client_error(Op::Watch, key, e)),
            };
            if resp.compact_revision > 0 {
                return Ok(FirstChange::Compacted);
            }
            if resp.canceled {
                return Err(StoreError::unknown(
                    Op::Watch,
                    key,
                    format_args!("the watch was cancelled: {}", resp.cancel_reason),
                ));
            }
            if let Some(ev) = resp.events.first() {
                let kv = ev.kv.as_ref();
                let revision = kv.map_or(0, |kv| u64::try_from(kv.mod_revision).unwrap_or(0));
                let created = !client::is_delete(ev)
                    && kv.is_some_and(|kv| kv.create_revision == kv.mod_revision);
                return Ok(FirstChange::At { revision, created });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(seconds: u64) -> Reading {
        Reading {
            seconds,
            lease: 7,
            term: 3,
            cluster: 9,
        }
    }

    const ANCHOR: Anchor = Anchor {
        v: 1,
        epoch: 5,
        cluster: 9,
        term: 3,
        lease: 7,
        revision: 100,
        reading: 40,
    };

    /// The proof is the lower end of now's second less the upper end of
    /// the anchor's: never more than the leader's clock ran between them.
    #[test]
    fn a_vacancy_is_the_readings_gap_less_a_second() {
        assert_eq!(ANCHOR.vacant_for(&reading(40)), Duration::ZERO);
        assert_eq!(ANCHOR.vacant_for(&reading(41)), Duration::ZERO);
        assert_eq!(ANCHOR.vacant_for(&reading(53)), Duration::from_secs(12));
    }

    /// A new anchor goes beside the newest once it is a minute old, and in
    /// the first slot when none is usable; the oldest usable proves first.
    #[test]
    fn a_new_anchor_is_written_beside_a_minute_old_one() {
        let at = |reading| Some(Anchor { reading, ..ANCHOR });
        let slots = |(usable, rotate): (Vec<(usize, Anchor)>, Option<usize>)| {
            (usable.iter().map(|(s, _)| *s).collect::<Vec<_>>(), rotate)
        };
        assert_eq!(
            slots(plan([None, None], &reading(41), 5)),
            (vec![], Some(0))
        );
        assert_eq!(
            slots(plan([at(40), None], &reading(99), 5)),
            (vec![0], None)
        );
        assert_eq!(
            slots(plan([at(40), None], &reading(100), 5)),
            (vec![0], Some(1))
        );
        assert_eq!(
            slots(plan([at(40), at(70)], &reading(100), 5)),
            (vec![0, 1], None)
        );
        assert_eq!(
            slots(plan([at(140), at(70)], &reading(200), 5)),
            (vec![1, 0], Some(1))
        );
        assert_eq!(
            slots(plan([at(40), at(70)], &reading(100), 6)),
            (vec![], Some(0)),
            "another epoch"
        );
    }

    /// The feed's view: once it delivered the create, the key's change
    /// before it; nothing from a feed that started after an earlier one,
    /// nor once it ended, nor for a create before its start.
    #[tokio::test]
    async fn a_feed_tells_the_change_before_a_create_it_delivered() {
        let seen = FeedSeen::new();
        assert_eq!(seen.before("lock.a", 20).await, None, "no feed");
        let first = seen.started(10);
        seen.delivered(first, [("lock.a", 12), ("lock.b", 13)].into_iter());
        let waiting = seen.before("lock.a", 20);
        seen.delivered(first, [("lock.a", 20)].into_iter());
        assert_eq!(waiting.await, Some((10, 12)));
        assert_eq!(seen.before("lock.b", 13).await, Some((10, 0)));
        assert_eq!(seen.before("lock.b", 9).await, None, "before the feed");
        // A later feed: the earlier one's late deliveries are not taken.
        let second = seen.started(30);
        seen.delivered(first, [("lock.c", 31)].into_iter());
        seen.delivered(second, [("lock.c", 35)].into_iter());
        assert_eq!(seen.before("lock.c", 35).await, Some((30, 0)));
        seen.ended(first);
        assert_eq!(seen.from(), Some(30), "the earlier feed's end ends nothing");
        seen.ended(second);
        assert_eq!(seen.before("lock.c", 35).await, None, "ended");
    }

    /// An anchor measures only readings of its own lease, term, cluster
    /// and epoch, and none that went back (a refreshed lease).
    #[test]
    fn an_anchor_is_used_only_with_readings_of_its_own_leader_and_lease() {
        assert!(ANCHOR.usable_with(&reading(41), 5));
        assert!(!ANCHOR.usable_with(&reading(41), 6), "another epoch");
        assert!(!ANCHOR.usable_with(&reading(39), 5), "readings went back");
        let other = |f: fn(&mut Reading)| {
            let mut r = reading(41);
            f(&mut r);
            ANCHOR.usable_with(&r, 5)
        };
        assert!(!other(|r| r.term = 4), "a new leader");
        assert!(!other(|r| r.term = 2), "a deposed leader, or a restore");
        assert!(!other(|r| r.lease = 8), "a new clock lease");
        assert!(!other(|r| r.cluster = 1), "another cluster");
    }
}
