//! Measuring a store before relying on it: replication and the p99 of its
//! compare-and-swaps, the facts [`Timing::check_store`] judges (R must be at
//! least ten times the p99; a replicated bucket needs T to ride through a
//! leader election).
//!
//! One measurement times [`CAS_SAMPLES`] compare-and-swaps back to back on
//! this node's probe record. A p99 too slow for R is measured again
//! ([`REMEASURE_PAUSE`] apart, see [`measure_store`]) and the lowest counts:
//! a store that is slow every time is still refused, a busy moment of the
//! host is not.
//!
//! On the embedded store, processes **take turns** to measure
//! ([`SqliteStore::measurement_turn`]): its writers queue for one file
//! lock, so agents started together (`putex demo`, a host booting)
//! timed each other's writes — three at once measured a p99 of 20–160 ms
//! where one alone measured 0.4–12 ms on the same loaded machine — and
//! all three refused `--renew 100ms`.
//!
//! [`SqliteStore::measurement_turn`]: super::SqliteStore::measurement_turn

use std::fmt;
use std::time::{Duration, Instant};

use putex_core::time::Human;
use putex_core::{StoreFacts, Timing, TimingError};

use super::keys;
use super::NodeId;
use super::{AnyStore, ReadMode, Store, StoreError};

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// One of the measurement's store calls failed (a conflict, a
    /// timeout, an unreachable store): nothing was judged.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// How many compare-and-swaps one measurement of [`measure_store`] times:
/// enough that its p99 is not simply the slowest one.
pub const CAS_SAMPLES: usize = 100;

/// How many measurements [`measure_store`] makes at least before a p99
/// too slow for R counts, and for how long it goes on measuring while each
/// is too slow ([`REMEASURE_FOR`]), up to [`CAS_MEASUREMENTS_MAX`].
pub const CAS_MEASUREMENTS: usize = 3;

/// How long [`measure_store`] goes on measuring a store that is too slow
/// for R, from its first measurement: a busy moment of a loaded host
/// (another build, an fsync behind other writes) lasts a second or two.
pub const REMEASURE_FOR: Duration = Duration::from_secs(3);

/// The most measurements [`measure_store`] makes.
pub const CAS_MEASUREMENTS_MAX: usize = 10;

/// How many compare-and-swaps of one measurement may go unanswered within
/// their deadline (each counts as a sample of the whole deadline) before
/// the measurement fails: a stalled `fsync` on a busy disk is a slow
/// sample, a store that does not answer fails the start within seconds.
pub const UNANSWERED_SAMPLES: usize = 3;

/// The pause before a measurement is made again.
pub const REMEASURE_PAUSE: Duration = Duration::from_millis(200);

/// What [`measure_store`] found.
#[derive(Clone, Debug)]
pub struct StoreMeasurement {
    /// For [`Timing::check_store`]: the lowest p99 of [`Self::p99s`].
    pub facts: StoreFacts,
    /// The median compare-and-swap round trip (of the measurement whose p99
    /// counts).
    pub median_cas: Duration,
    /// Replicas of the bucket (1 for the embedded store).
    pub replicas: usize,
    /// The p99 of every measurement made, in order (one, or up to
    /// [`CAS_MEASUREMENTS`] when the first were too slow for R).
    pub p99s: Vec<Duration>,
}

impl StoreMeasurement {
    /// Judges the facts by the timing rules ([`Timing::check_store`]); a
    /// broken rule comes back with how the store was measured.
    pub fn check(&self, timing: &Timing) -> Result<(), StoreCheckError> {
        timing
            .check_store(&self.facts)
            .map_err(|rule| StoreCheckError {
                rule,
                measured: Box::new(self.clone()),
            })
    }
}

/// How the store was measured, for people: what, how many, how often, and
/// every p99.
impl fmt::Display for StoreMeasurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replica(s); the p99 of {CAS_SAMPLES} compare-and-swaps of this node's probe \
             record, back to back",
            self.replicas
        )?;
        let p99s: Vec<String> = self.p99s.iter().map(|d| Human(*d).to_string()).collect();
        match p99s.as_slice() {
            [] => Ok(()),
            [one] => write!(f, ", was {one}"),
            more => write!(
                f,
                ", in {} measurements {} apart, was {} (the lowest counts)",
                more.len(),
                Human(REMEASURE_PAUSE),
                more.join(", ")
            ),
        }
    }
}

/// The store, as measured, does not suit the timing: the rule broken
/// (naming the option to change) and the measurement it was judged on.
#[derive(Debug, thiserror::Error)]
#[error("{rule} (measured at start-up: {measured})")]
pub struct StoreCheckError {
    /// The rule broken.
    pub rule: TimingError,
    /// What was measured (boxed: an error stays small to return).
    pub measured: Box<StoreMeasurement>,
}

/// Learns the store facts: replication, and the p99 of [`CAS_SAMPLES`]
/// compare-and-swaps on this node's probe record. When `renew` is given
/// and the p99 is above a tenth of it, the measurement is repeated,
/// [`REMEASURE_PAUSE`] apart, while each is too slow: at least
/// [`CAS_MEASUREMENTS`] in all, then until [`REMEASURE_FOR`] has passed,
/// never more than [`CAS_MEASUREMENTS_MAX`]. The lowest p99 counts.
pub async fn measure_store(
    store: &AnyStore,
    node: &NodeId,
    timeout: Duration,
    renew: Option<Duration>,
) -> Result<StoreMeasurement, MeasureError> {
    let began = Instant::now();
    let mut best = measure_once(store, node, timeout).await?;
    let mut p99s = best.p99s.clone();
    loop {
        let slow = renew.is_some_and(|r| best.facts.p99_cas.is_some_and(|p| r < p * 10));
        let patient = p99s.len() < CAS_MEASUREMENTS
            || (began.elapsed() < REMEASURE_FOR && p99s.len() < CAS_MEASUREMENTS_MAX);
        if !slow || !patient {
            break;
        }
        tracing::info!(
            p99 = %Human(best.facts.p99_cas.unwrap_or_default()),
            "the store's compare-and-swaps were slow; measuring again"
        );
        tokio::time::sleep(REMEASURE_PAUSE).await;
        let again = measure_once(store, node, timeout).await?;
        p99s.extend(again.p99s.iter().copied());
        if again.facts.p99_cas < best.facts.p99_cas {
            best = again;
        }
    }
    best.p99s = p99s;
    Ok(best)
}

async fn measure_once(
    store: &AnyStore,
    node: &NodeId,
    timeout: Duration,
) -> Result<StoreMeasurement, MeasureError> {
    let replicas = replicas(store).await;
    let key = keys::probe(node);
    let value = br#"{"v":1,"node":"putex-check","write":"putex-check"}"#;
    // One process at a time on the embedded store (see the module docs);
    // the turn ends with this measurement.
    let _turn = match store {
        AnyStore::Sqlite(s) => s.measurement_turn().await,
        _ => None,
    };
    // The probe record's revision: as it is, or a first one written.
    let mut token = match store.get(&key, ReadMode::Leader, timeout).await? {
        Some(entry) => entry.token,
        None => store.put(&key, value, timeout).await?,
    };
    let mut samples = Vec::with_capacity(CAS_SAMPLES);
    let mut unanswered = 0;
    for _ in 0..CAS_SAMPLES {
        let started = Instant::now();
        match store.update(&key, value, token, timeout).await {
            Ok(t) => {
                token = t;
                samples.push(started.elapsed());
            }
            // A compare-and-swap without an answer in time (an fsync that
            // stalled behind other writes to a busy disk) is a slow
            // sample, not a broken store: it counts as the whole timeout,
            // and the probe's revision is read again (the write may have
            // landed). More than UNANSWERED_SAMPLES fail the measurement.
            Err(e) if e.is_unknown() && unanswered < UNANSWERED_SAMPLES => {
                unanswered += 1;
                samples.push(started.elapsed().max(timeout));
                token = match store.get(&key, ReadMode::Leader, timeout).await? {
                    Some(entry) => entry.token,
                    None => store.put(&key, value, timeout).await?,
                };
            }
            Err(e) => return Err(e.into()),
        }
    }
    // A read, so a store that answers writes but not reads is caught here.
    store.get(&key, ReadMode::Any, timeout).await?;
    samples.sort();
    let p99 = samples[(samples.len() * 99).div_ceil(100) - 1];
    Ok(StoreMeasurement {
        facts: StoreFacts {
            p99_cas: Some(p99),
            replicated: replicas > 1,
        },
        median_cas: samples[samples.len() / 2],
        replicas,
        p99s: vec![p99],
    })
}

/// The bucket's replica count: NATS from the stream's configuration, etcd
/// its cluster's voting members, 1 for the embedded and memory stores.
async fn replicas(store: &AnyStore) -> usize {
    match store {
        AnyStore::Nats(n) => {
            let js = async_nats::jetstream::new(n.client().clone());
            match js.get_stream(format!("KV_{}", n.bucket_name())).await {
                Ok(s) => s.cached_info().config.num_replicas.max(1),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the bucket's replica count; assuming 3");
                    3
                }
            }
        }
        AnyStore::Etcd(e) => match e.members().await {
            Ok(n) => n.max(1),
            Err(err) => {
                tracing::warn!(error = %err, "cannot list the etcd cluster's members; assuming 3");
                3
            }
        },
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::Fault;
    use crate::store::MemoryStore;

    /// A compare-and-swap that lands but is answered only after its
    /// deadline (a stalled fsync) is a slow sample, not a failed start;
    /// more than [`UNANSWERED_SAMPLES`] fail the measurement.
    #[tokio::test(start_paused = true)]
    async fn unanswered_samples_are_slow_until_too_many_fail_the_measurement() {
        let memory = MemoryStore::new();
        let store = AnyStore::from(memory.clone());
        let node: NodeId = "n1".parse().unwrap();
        let key = keys::probe(&node);
        let t = Duration::from_secs(1);
        store.put(&key, b"{}", t).await.unwrap();
        memory.inject_on(&key, Fault::ApplyThenStall);
        let m = measure_store(&store, &node, t, None).await.unwrap();
        assert!(m.facts.p99_cas < Some(t), "one slow sample is not the p99");
        for _ in 0..UNANSWERED_SAMPLES {
            memory.inject_on(&key, Fault::Stall);
        }
        let m = measure_store(&store, &node, t, None).await.unwrap();
        assert_eq!(m.facts.p99_cas, Some(t), "each counts as the deadline");
        for _ in 0..=UNANSWERED_SAMPLES {
            memory.inject_on(&key, Fault::ApplyThenStall);
        }
        let e = measure_store(&store, &node, t, None).await.unwrap_err();
        assert!(
            matches!(e, MeasureError::Store(ref s) if s.is_unknown()),
            "{e}"
        );
    }
}
