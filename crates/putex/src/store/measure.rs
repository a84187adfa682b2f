//! Measuring a store before relying on it: replication and the p99 of its
//! compare-and-swaps, the facts [`Timing::check_store`] judges (R must be at
//! least ten times the p99; a replicated bucket needs T to ride through a
//! leader election).

use std::time::Duration;

use putex_core::StoreFacts;
#[cfg(doc)]
use putex_core::Timing;

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

/// How many measurements [`measure_store`] makes at most: a p99 that is
/// too slow for R is measured again (after a pause) before it counts, so
/// that a moment of load on the host does not refuse a sound setting.
pub const CAS_MEASUREMENTS: usize = 3;

/// What [`measure_store`] found.
#[derive(Clone, Debug)]
pub struct StoreMeasurement {
    /// For [`Timing::check_store`].
    pub facts: StoreFacts,
    /// The median compare-and-swap round trip.
    pub median_cas: Duration,
    /// Replicas of the bucket (1 for the embedded store).
    pub replicas: usize,
}

/// Learns the store facts: replication, and the p99 of [`CAS_SAMPLES`]
/// compare-and-swaps on this node's probe record. When `renew` is given
/// and the p99 is above a tenth of it, the measurement is repeated (up to
/// [`CAS_MEASUREMENTS`] in all, 200 ms apart) and the lowest p99 counts: a
/// store that is slow every time is still refused, a busy moment is not.
pub async fn measure_store(
    store: &AnyStore,
    node: &NodeId,
    timeout: Duration,
    renew: Option<Duration>,
) -> Result<StoreMeasurement, MeasureError> {
    let mut best = measure_once(store, node, timeout).await?;
    for _ in 1..CAS_MEASUREMENTS {
        let slow = renew.is_some_and(|r| best.facts.p99_cas.is_some_and(|p| r < p * 10));
        if !slow {
            break;
        }
        tracing::info!(
            p99 = ?best.facts.p99_cas,
            "the store's compare-and-swaps were slow; measuring again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = measure_once(store, node, timeout).await?;
        if again.facts.p99_cas < best.facts.p99_cas {
            best = again;
        }
    }
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
    let mut token = store.put(&key, value, timeout).await?;
    let mut samples = Vec::with_capacity(CAS_SAMPLES);
    for _ in 0..CAS_SAMPLES {
        let started = std::time::Instant::now();
        token = store.update(&key, value, token, timeout).await?;
        samples.push(started.elapsed());
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
