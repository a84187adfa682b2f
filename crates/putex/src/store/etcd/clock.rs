//! The etcd store's clock: the etcd leader's, read through a lease.
//!
//! etcd keeps no time with a key. What it does keep on the leader's clock
//! is every lease's expiry: `LeaseTimeToLive` answers the seconds left,
//! rounded down. A lease granted for [`CLOCK_TTL`] and never kept alive is
//! therefore a stopwatch on the leader: `granted − left` seconds have
//! passed since it was granted, to within the second above the reading.
//! One such lease serves every putex on a prefix (`<prefix>/=clock`
//! names it and is bound to it, so the name goes when the lease expires).
//!
//! A record is stamped with a reading taken after this handle received it
//! (so no earlier than its write), rounded **up**; a probe record — whose
//! time the standby takes as "now" (S1 b) — rounded **down**. The gap
//! between a record's stamp and a later probe's is therefore never more
//! than the time that passed on the leader's clock between the write and
//! the probe. A stamp is kept per (key, revision), so reading a record
//! again does not make it look newer. The readings only ever fall back:
//! a new leader refreshes every lease (readings restart near 0), and an
//! expired lease is replaced by a new one (they restart at 0). Either way
//! a gap comes out smaller, or "backwards", which only delays a takeover.
//! A probe read in the same second as the record comes out one step
//! "before" it by the roundings alone: the core counts up to one step
//! ([`CLOCK_STEP`], `AgentConfig::store_clock_step`) as no time passed.
//!
//! One member can read *later* than the leader: a leader cut off from its
//! peers answers `LeaseTimeToLive` from its own lease table — no quorum
//! is asked — until it notices and steps down (about one election
//! timeout), while the new leader has already refreshed every lease. A
//! record stamped through the new leader and a probe answered by the old
//! one would make a gap of the lease's whole age. Every answer carries the
//! raft term of the member that gave it, and terms only grow: a handle
//! takes no reading from a term older than one it already read from
//! ([`Terms`], `docs/safety.md` §4.2).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::calls::{client_error, retry_unsent};
use super::client::{self, Client};
use super::{pb, CLOCK_KEY};
use crate::store::{Op, StoreError, StoreTime};

/// How long the shared clock lease runs before a new one is granted (a day:
/// a lease left by a process that died costs the cluster nothing for long).
pub const CLOCK_TTL: Duration = Duration::from_secs(86_400);

/// The step in which the clock reads: a lease's TTL is whole seconds.
pub const CLOCK_STEP: Duration = Duration::from_secs(1);

const NANOS: u64 = 1_000_000_000;

/// A handle's clock: its era, the lease it reads, and its stamps.
pub(super) struct Clock {
    era: u64,
    lease: tokio::sync::Mutex<Option<Lease>>,
    stamps: Mutex<Stamps>,
    terms: Mutex<Terms>,
}

/// One reading of the clock lease.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reading {
    /// Whole seconds since the lease was granted, rounded up: the true
    /// time lies in `(seconds − 1, seconds]`.
    pub seconds: u64,
    /// The lease read.
    pub lease: i64,
    /// The raft term and the cluster of the member that answered.
    pub term: u64,
    pub cluster: u64,
}

#[derive(Clone, Copy)]
struct Lease {
    id: i64,
    granted: i64,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            era: era_of_handle(),
            lease: tokio::sync::Mutex::new(None),
            stamps: Mutex::new(Stamps::default()),
            terms: Mutex::new(Terms::default()),
        }
    }

    /// The stamps of `items` — (key, revision, is a probe) — taking one
    /// reading for all that have none yet.
    pub(super) async fn stamp<'a>(
        &self,
        client: &Client,
        prefix: &str,
        (op, about): (Op, &str),
        items: impl Iterator<Item = (&'a str, u64, bool)>,
    ) -> Result<Vec<StoreTime>, StoreError> {
        let items: Vec<_> = items.collect();
        let known: Vec<Option<StoreTime>> = {
            let stamps = self.stamps.lock();
            items.iter().map(|(k, r, _)| stamps.get(k, *r)).collect()
        };
        if known.iter().all(Option::is_some) {
            return Ok(known.into_iter().flatten().collect());
        }
        let seconds = self.read(client, prefix, op, about).await?.seconds;
        let mut stamps = self.stamps.lock();
        Ok(items
            .iter()
            .zip(known)
            .map(|((key, revision, probe), known)| {
                known.unwrap_or_else(|| {
                    // The reading is within [t, t + 1 s) of the true time
                    // t: a probe gets its lower end, a record its upper
                    // end (both a second on, so that no stamp is 0).
                    let nanos = if *probe {
                        (seconds + 1) * NANOS
                    } else {
                        (seconds + 2) * NANOS
                    };
                    let time = StoreTime {
                        era: self.era,
                        nanos,
                    };
                    // Whatever came first for this revision stays.
                    match stamps.get(key, *revision) {
                        Some(t) => t,
                        None => {
                            stamps.insert(key, *revision, time);
                            time
                        }
                    }
                })
            })
            .collect())
    }

    /// The store's time now, as a probe would be stamped.
    pub(super) async fn now(&self, client: &Client, prefix: &str) -> Result<StoreTime, StoreError> {
        let seconds = self.read(client, prefix, Op::Get, CLOCK_KEY).await?.seconds;
        Ok(StoreTime {
            era: self.era,
            nanos: (seconds + 1) * NANOS,
        })
    }

    /// Forgets the stamp of a record that was deleted.
    pub(super) fn forget(&self, key: &str) {
        self.stamps.lock().remove(key);
    }

    /// Seconds on the leader's clock since the clock lease was granted
    /// (rounded up), finding or granting the lease first: the reading, with
    /// the lease, raft term and cluster it came from.
    ///
    /// The lock is held only to find or grant the lease, never across a
    /// reading: a reading that hangs (a member cut off from its peers
    /// before it knows it has no leader) holds up only its own caller,
    /// whose deadline ends it, not every read of the handle behind it.
    pub(super) async fn read(
        &self,
        client: &Client,
        prefix: &str,
        op: Op,
        about: &str,
    ) -> Result<Reading, StoreError> {
        let mut why = "the etcd clock lease kept vanishing";
        for _ in 0..3 {
            let l = self.lease(client, prefix, op, about).await?;
            let ttl = retry_unsent(|| client.lease_time_to_live(l.id))
                .await
                .map_err(|e| client_error(op, about, e))?;
            if ttl.ttl < 0 {
                // Expired or revoked: a new lease, and readings from 0.
                let mut lease = self.lease.lock().await;
                if lease.is_some_and(|now| now.id == l.id) {
                    *lease = None;
                }
                continue;
            }
            let (cluster, term) = ttl
                .header
                .as_ref()
                .map_or((0, 0), |h| (h.cluster_id, h.raft_term));
            let admitted = ttl.header.is_some() && self.terms.lock().admit(cluster, term);
            if !admitted {
                // A deposed leader's reading: asked again (it may reach a
                // current member); else unknown, and the probe comes again.
                why =
                    "an etcd member answered the clock from an older raft term (a deposed leader)";
                continue;
            }
            return Ok(Reading {
                seconds: u64::try_from(l.granted.saturating_sub(ttl.ttl)).unwrap_or(0),
                lease: l.id,
                term,
                cluster,
            });
        }
        Err(StoreError::unknown(op, about, why))
    }

    /// The clock lease this handle reads: the one it knows, or the one
    /// found or granted now (one caller at a time does that).
    async fn lease(
        &self,
        client: &Client,
        prefix: &str,
        op: Op,
        about: &str,
    ) -> Result<Lease, StoreError> {
        let mut lease = self.lease.lock().await;
        if let Some(l) = *lease {
            return Ok(l);
        }
        let l = find_or_grant(client, prefix, op, about).await?;
        *lease = Some(l);
        Ok(l)
    }
}

/// The prefix's clock lease: the one `<prefix>/=clock` names, or a new one
/// this handle grants and names there (a race lost is a lease revoked).
async fn find_or_grant(
    client: &Client,
    prefix: &str,
    op: Op,
    about: &str,
) -> Result<Lease, StoreError> {
    let key = format!("{prefix}{CLOCK_KEY}");
    let err = |e| client_error(op, about, e);
    let named = pb::RangeRequest {
        key: key.clone().into_bytes(),
        ..Default::default()
    };
    let named = retry_unsent(|| client.range(named.clone()))
        .await
        .map_err(err)?;
    if let Some(id) = named.kvs.first().map(|kv| kv.lease) {
        let ttl = retry_unsent(|| client.lease_time_to_live(id))
            .await
            .map_err(err)?;
        if ttl.ttl >= 0 {
            return Ok(Lease {
                id,
                granted: ttl.granted_ttl,
            });
        }
    }
    let ttl = i64::try_from(CLOCK_TTL.as_secs()).unwrap_or(i64::MAX);
    let granted = retry_unsent(|| client.lease_grant(ttl))
        .await
        .map_err(err)?;
    let txn = client::txn(
        [client::create_revision_is(key.clone(), 0)],
        [client::put_op(
            key.clone(),
            granted.id.to_string(),
            granted.id,
        )],
        [client::get_op(key)],
    );
    let resp = retry_unsent(|| client.txn(txn.clone()))
        .await
        .map_err(err)?;
    if resp.succeeded {
        return Ok(Lease {
            id: granted.id,
            granted: granted.ttl,
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(granted.id)).await;
    for g in client::ranges(&resp) {
        if let Some(kv) = g.kvs.first() {
            let id = kv.lease;
            let ttl = retry_unsent(|| client.lease_time_to_live(id))
                .await
                .map_err(err)?;
            if ttl.ttl >= 0 {
                return Ok(Lease {
                    id,
                    granted: ttl.granted_ttl,
                });
            }
        }
    }
    Err(StoreError::unknown(
        op,
        about,
        "the etcd clock lease changed while it was being read; try again",
    ))
}

/// The newest raft term a handle's clock readings came from, in the
/// cluster that gave them.
#[derive(Default)]
struct Terms {
    cluster: u64,
    term: u64,
}

impl Terms {
    /// Whether a reading answered in `term` by a member of `cluster` may be
    /// used: not when it is older than a term already read from (a leader
    /// deposed without knowing it yet). Remembers the newest. Another
    /// cluster (re-created or restored) starts over: its lease is another,
    /// and its readings start again from 0.
    fn admit(&mut self, cluster: u64, term: u64) -> bool {
        if cluster != self.cluster {
            *self = Terms { cluster, term };
            return true;
        }
        if term < self.term {
            return false;
        }
        self.term = term;
        true
    }
}

/// Store times of this backend: one clock domain per handle.
fn era_of_handle() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let seed = crate::store::wall_nanos() ^ (u64::from(std::process::id()) << 32) ^ n;
    // Never the NATS era (1) or 0.
    crate::store::fnv1a(&seed.to_le_bytes()) | 2
}

/// The stamp each record got when this handle first received its
/// current revision (bounded: past [`MAX_STAMPS`] they are all
/// dropped — a record stamped again only looks younger, which delays a
/// takeover, never hastens it).
#[derive(Default)]
struct Stamps {
    by_key: HashMap<String, (u64, StoreTime)>,
}

/// The most records whose stamps a handle keeps.
const MAX_STAMPS: usize = 200_000;

impl Stamps {
    fn get(&self, key: &str, revision: u64) -> Option<StoreTime> {
        self.by_key
            .get(key)
            .filter(|(r, _)| *r == revision)
            .map(|(_, t)| *t)
    }

    fn insert(&mut self, key: &str, revision: u64, time: StoreTime) {
        if self.by_key.len() >= MAX_STAMPS {
            self.by_key.clear();
        }
        self.by_key.insert(key.to_owned(), (revision, time));
    }

    fn remove(&mut self, key: &str) {
        self.by_key.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Terms only grow within a cluster: a reading from an older term (a
    /// deposed leader's) is refused after a newer one, and one from the
    /// same or a newer term is taken; another cluster starts over.
    #[test]
    fn a_reading_from_an_older_raft_term_is_refused() {
        let mut terms = Terms::default();
        assert!(terms.admit(7, 5));
        assert!(terms.admit(7, 5));
        assert!(terms.admit(7, 6), "a new leader's");
        assert!(
            !terms.admit(7, 5),
            "the deposed leader's, after the new one's"
        );
        assert!(terms.admit(7, 6));
        assert!(terms.admit(9, 2), "a re-created cluster starts over");
        assert!(!terms.admit(9, 1));
    }
}
