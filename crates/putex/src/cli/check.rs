//! `putex check`: validate a configuration and print its timeline.
//!
//! Everything that does not need the store is checked by
//! [`resolve`](super::config::resolve) (names, hooks, [`TimingConfig::validate`]).
//! Then, if the store answers, `measure_store` learns what
//! [`Timing::check_store`] needs: whether the bucket is replicated (a NATS
//! stream with more than one replica: T must ride through a leader
//! election) and the p99 latency of its paced compare-and-swaps (R must be
//! at least ten times it). The timeline is printed with the measured round
//! trip.
//!
//! [`TimingConfig::validate`]: putex_core::TimingConfig::validate

use std::time::Duration;

use putex_core::time::Human;
use putex_core::Timing;

use super::config::{AgentArgs, AgentSettings, Strictness};
use super::CliError;
use crate::agent::timing_warnings;
use crate::store::measure::{measure_store, StoreMeasurement, CAS_SAMPLES};
use crate::store::AnyStore;

/// Opens the store a URL names; failure is exit code 3.
pub async fn open_store(settings: &AgentSettings) -> Result<AnyStore, CliError> {
    AnyStore::open(&settings.store)
        .await
        .map_err(|e| CliError::Store(format!("store {}: {e}", settings.store)))
}

/// Checks the store-dependent rules, naming the option and how the store
/// was measured on failure.
pub fn check_store(timing: &Timing, m: &StoreMeasurement) -> Result<(), CliError> {
    m.check(timing).map_err(|e| CliError::Usage(e.to_string()))
}

/// `putex check`: prints the settings, the store facts and the timeline.
pub async fn run(args: &AgentArgs) -> Result<(), CliError> {
    let settings = super::config::from_args(args, Strictness::Check)?;
    let t = &settings.timing;
    println!(
        "lock {}  node {}  store {}",
        settings.lock.as_deref().unwrap_or("(not given)"),
        settings.node,
        settings.store
    );
    println!(
        "R = {}  F = {}  C = {}  K = {}  S = {}  ε = {}%  health-check timeout {}  store timeout {}",
        Human(t.renew()),
        t.config().failures,
        t.config().confirm,
        t.unhealthy(),
        t.successes(),
        f64::from(t.drift().ppm()) / 10_000.0,
        Human(t.healthcheck_timeout()),
        Human(t.store_timeout()),
    );
    // From the URL: the bound of a store that cannot be reached now is
    // still the bound of its kind.
    let clock_step = settings.store.clock_step();
    let rtt = match open_store(&settings).await {
        Ok(store) => {
            debug_assert_eq!(clock_step, store.clock_step());
            let m = measure_store(
                &store,
                &settings.node,
                t.store_timeout().max(Duration::from_secs(2)),
                Some(t.renew()),
            )
            .await?;
            println!(
                "store: {} replica(s); compare-and-swap median {}, p99 {} over {} operations",
                m.replicas,
                Human(m.median_cas),
                Human(m.facts.p99_cas.unwrap_or_default()),
                CAS_SAMPLES
            );
            check_store(t, &m)?;
            for w in store.warnings().await {
                println!("warning: {w}");
            }
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
    let timeline = t.timeline_on(rtt, clock_step);
    println!("{timeline}");
    // O3: a node a better candidate outranks acts D later; a switchover's
    // release is its target's alone for D.
    let defer = t.renew() * 2;
    println!(
        "with candidates (--priority, --position): a node the best candidate outranks acts D = {} later, so the crash failover bound is at most {}",
        Human(defer),
        Human(timeline.crash_failover + defer)
    );
    let op = &settings.operator;
    println!(
        "priority {}{}{}{}",
        op.priority,
        if op.priority == 0 {
            " (never takes over)"
        } else {
            ""
        },
        op.max_lag
            .map(|l| format!("; max lag {l}"))
            .unwrap_or_default(),
        op.failback_after
            .map(|d| format!("; failback after {}", Human(d)))
            .unwrap_or_default()
    );
    if let Some(f) = &settings.failsafe {
        // What failsafe adds to the timeline (docs/safety.md, Failsafe).
        println!(
            "failsafe: during a store outage the holder keeps its service while every member grants its asks (each round, within the store timeout), for at most {} after its last renewal that landed; a member that does not grant ends its licence by T = {}",
            Human(f.max),
            Human(t.lease()),
        );
        let first_use = t.staleness_wait(t.lease_unknown() + f.max) + t.gap_unknown();
        println!(
            "failsafe: the first use of the lock (unless the store proves the name unused that long), the taker of a lost record and a node outside a record's set wait W over T' + {} and G': {}, in place of the first use's wait above",
            Human(f.max),
            Human(first_use),
        );
    }
    println!();
    println!("ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::{FileConfig, TimingArgs};
    use putex_core::StoreFacts;

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
        crate::cli::config::resolve(&a, &FileConfig::default(), Strictness::Check)
    }

    fn replicated() -> StoreMeasurement {
        StoreMeasurement {
            facts: StoreFacts {
                p99_cas: Some(Duration::from_millis(2)),
                replicated: true,
            },
            median_cas: Duration::from_millis(1),
            replicas: 3,
            p99s: vec![Duration::from_millis(2)],
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
        m.replicas = 1;
        m.facts.p99_cas = Some(Duration::from_millis(20));
        m.p99s = vec![Duration::from_micros(31_300), Duration::from_millis(20)];
        let e = check_store(&s.timing, &m).unwrap_err().to_string();
        // What to change, what was measured and how.
        assert_eq!(
            e,
            "--renew (100 ms) must be at least ten times the store's p99 compare-and-swap \
             latency (20 ms); use --renew 200ms or more (measured at start-up: 1 replica(s); \
             the p99 of 100 compare-and-swaps of this node's probe record, back to back, in 2 \
             measurements 200 ms apart, was 31.3 ms, 20 ms (the lowest counts))"
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
        let s = crate::cli::config::resolve(
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
        let m = measure_store(&store, &"n1".parse().unwrap(), Duration::from_secs(1), None)
            .await
            .unwrap();
        assert!(!m.facts.replicated);
        assert!(m.facts.p99_cas.is_some());
        assert_eq!(m.replicas, 1);
    }
}
