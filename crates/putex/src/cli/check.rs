//! `putex check`: validate a configuration and print its timeline.
//!
//! Everything that does not need the store is checked by
//! [`AgentSettings::resolve`] (names, hooks, [`TimingConfig::validate`]).
//! Then, if the store answers, [`measure_store`] learns what
//! [`Timing::check_store`] needs: whether the bucket is replicated (a NATS
//! stream with more than one replica: T must ride through a leader
//! election) and the p99 latency of ~20 compare-and-swaps (R must be at
//! least ten times it). The timeline is printed with the measured round trip.
//!
//! [`TimingConfig::validate`]: putex_core::TimingConfig::validate

use std::time::Duration;

use putex_core::{StoreFacts, Timing};

use super::config::{AgentArgs, AgentSettings, Strictness};
use super::CliError;
use crate::store::{keys, AnyStore, ReadMode, Store};

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
    node: &str,
    timeout: Duration,
    renew: Option<Duration>,
) -> Result<StoreMeasurement, CliError> {
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
    node: &str,
    timeout: Duration,
) -> Result<StoreMeasurement, CliError> {
    let replicas = replicas(store).await;
    let key = keys::probe(node).map_err(|e| CliError::Usage(format!("--node: {e}")))?;
    let value = br#"{"v":1,"node":"putex-check","write":"putex-check"}"#;
    let store_err = |e: crate::store::StoreError| CliError::Store(format!("store: {e}"));
    let mut token = store.put(&key, value, timeout).await.map_err(store_err)?;
    let mut samples = Vec::with_capacity(CAS_SAMPLES);
    for _ in 0..CAS_SAMPLES {
        let started = std::time::Instant::now();
        token = store
            .update(&key, value, token, timeout)
            .await
            .map_err(store_err)?;
        samples.push(started.elapsed());
    }
    // A read, so a store that answers writes but not reads is caught here.
    store
        .get(&key, ReadMode::Any, timeout)
        .await
        .map_err(store_err)?;
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

/// The bucket's replica count: NATS from the stream's configuration, 1 for
/// the embedded and memory stores.
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
        _ => 1,
    }
}

/// Opens the store a URL names; failure is exit code 3.
pub async fn open_store(settings: &AgentSettings) -> Result<AnyStore, CliError> {
    AnyStore::open(&settings.store)
        .await
        .map_err(|e| CliError::Store(format!("store {}: {e}", settings.store)))
}

/// Checks the store-dependent rules, naming the option on failure.
pub fn check_store(timing: &Timing, m: &StoreMeasurement) -> Result<(), CliError> {
    timing
        .check_store(&m.facts)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Settings that validate but do not do what they seem to: each a sentence
/// naming the options, for `putex check` to print and `putex run` to log.
pub fn timing_warnings(t: &Timing) -> Vec<String> {
    let mut w = Vec::new();
    let (k, f) = (t.unhealthy(), t.config().failures);
    if k >= f {
        // A failed check skips its renewal (H2): after K − 1 of them the
        // licence has K − 1 rounds fewer to run, and with K ≥ F it ends
        // about when the K-th check is due.
        w.push(format!(
            "--unhealthy ({k}) is not below --failures ({f}): a holder whose health checks \
             fail lapses when its licence ends (an emergency stop, no release, a full \
             stale takeover) before it can step down gracefully after {k} failed checks; \
             use --unhealthy {} or more --failures",
            f - 1
        ));
    }
    w
}

/// `putex check`: prints the settings, the store facts and the timeline.
pub async fn run(args: &AgentArgs) -> Result<(), CliError> {
    let settings = AgentSettings::from_args(args, Strictness::Check)?;
    let t = &settings.timing;
    println!(
        "lock {}  node {}  store {}",
        settings.lock.as_deref().unwrap_or("(not given)"),
        settings.node,
        settings.store
    );
    println!(
        "R = {:?}  F = {}  C = {}  K = {}  S = {}  ε = {}%  health-check timeout {:?}  store timeout {:?}",
        t.renew(),
        t.config().failures,
        t.config().confirm,
        t.unhealthy(),
        t.successes(),
        f64::from(t.drift().ppm()) / 10_000.0,
        t.healthcheck_timeout(),
        t.store_timeout(),
    );
    let rtt = match open_store(&settings).await {
        Ok(store) => {
            let m = measure_store(
                &store,
                &settings.node,
                t.store_timeout().max(Duration::from_secs(2)),
                Some(t.renew()),
            )
            .await?;
            println!(
                "store: {} replica(s); compare-and-swap median {:?}, p99 {:?} over {} operations",
                m.replicas,
                m.median_cas,
                m.facts.p99_cas.unwrap_or_default(),
                CAS_SAMPLES
            );
            check_store(t, &m)?;
            m.median_cas
        }
        Err(e) => {
            println!(
                "warning: {e}; the store-dependent checks (replication, latency) were skipped"
            );
            t.store_timeout()
        }
    };
    for w in timing_warnings(t) {
        println!("warning: {w}");
    }
    println!();
    println!("{}", t.timeline(rtt));
    println!();
    println!("ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::{FileConfig, TimingArgs};

    fn fast(extra: impl FnOnce(&mut AgentArgs)) -> Result<AgentSettings, CliError> {
        let mut a = AgentArgs {
            timing: TimingArgs {
                renew: Some(Duration::from_millis(100)),
                failures: Some(3),
                confirm: Some(1),
                ..TimingArgs::default()
            },
            ..AgentArgs::default()
        };
        extra(&mut a);
        AgentSettings::resolve(&a, &FileConfig::default(), Strictness::Check)
    }

    fn replicated() -> StoreMeasurement {
        StoreMeasurement {
            facts: StoreFacts {
                p99_cas: Some(Duration::from_millis(2)),
                replicated: true,
            },
            median_cas: Duration::from_millis(1),
            replicas: 3,
        }
    }

    #[test]
    fn a_short_lease_on_a_replicated_bucket_needs_allow_short_lease() {
        let s = fast(|_| {}).unwrap();
        let e = check_store(&s.timing, &replicated()).unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(e.to_string().contains("--allow-short-lease"), "{e}");
        let s = fast(|a| a.timing.allow_short_lease = true).unwrap();
        check_store(&s.timing, &replicated()).unwrap();
    }

    #[test]
    fn renew_must_be_ten_times_the_p99() {
        let s = fast(|_| {}).unwrap();
        let mut m = replicated();
        m.facts.replicated = false;
        m.facts.p99_cas = Some(Duration::from_millis(20));
        let e = check_store(&s.timing, &m).unwrap_err().to_string();
        assert!(
            e.starts_with("--renew (100ms) must be at least ten times"),
            "{e}"
        );
    }

    #[test]
    fn unhealthy_not_below_failures_is_warned_about() {
        let s = fast(|_| {}).unwrap(); // K = 3, F = 3
        let w = timing_warnings(&s.timing);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("--unhealthy (3) is not below --failures (3)"),
            "{w:?}"
        );
        assert!(w[0].contains("use --unhealthy 2"), "{w:?}");
        let s = fast(|a| a.unhealthy = Some(2)).unwrap();
        assert!(timing_warnings(&s.timing).is_empty());
        let s = AgentSettings::resolve(
            &AgentArgs::default(),
            &FileConfig::default(),
            Strictness::Check,
        )
        .unwrap(); // the defaults: K = 3, F = 10
        assert!(timing_warnings(&s.timing).is_empty());
    }

    #[tokio::test]
    async fn measures_the_memory_store() {
        let store = AnyStore::from(crate::store::MemoryStore::new());
        let m = measure_store(&store, "n1", Duration::from_secs(1), None)
            .await
            .unwrap();
        assert!(!m.facts.replicated);
        assert!(m.facts.p99_cas.is_some());
        assert_eq!(m.replicas, 1);
    }
}
