//! Timing's derivations and refusals, one rule per test.

use super::*;

#[test]
fn defaults_validate() {
    let t = TimingConfig::default().validate().unwrap();
    assert_eq!(t.lease(), Duration::from_secs(10));
    assert_eq!(t.gap(), Duration::from_secs(2));
    assert_eq!(t.sched_margin(), Duration::from_millis(50));
    assert_eq!(t.emergency_timeout(), t.emergency_budget());
    assert!(t.emergency_budget() > Duration::from_millis(1900));
}

#[test]
fn errors_name_the_option() {
    let mut c = TimingConfig {
        failures: 1,
        ..TimingConfig::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "--failures must be at least 2 (got 1)"
    );
    c.failures = 10;
    c.emergency_timeout = Some(Duration::from_millis(1500));
    c.confirm = 1;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("--emergency-timeout 1.5 s exceeds the budget"),
        "{e}"
    );
    assert!(e.contains("= 930 ms"), "{e}");
    c.confirm = 2;
    c.healthcheck_timeout = Some(Duration::from_millis(700));
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("--healthcheck-timeout (700 ms) + --store-timeout (400 ms)"),
        "{e}"
    );
}

#[test]
fn max_lease_and_max_gap_bound_what_an_absent_record_owes() {
    let mut c = TimingConfig {
        max_gap: Some(Duration::from_secs(1)),
        ..TimingConfig::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "--max-gap (1 s) is shorter than this node's own fencing gap G = C·R = 2 s"
    );
    c.max_gap = Some(Duration::from_secs(5));
    c.max_lease = Some(Duration::from_secs(30));
    let t = c.validate().unwrap();
    assert_eq!(t.gap_unknown(), Duration::from_secs(5));
    assert_eq!(
        t.gap_against(Duration::from_secs(3)),
        Duration::from_secs(3)
    );
    assert_eq!(
        t.timeline(Duration::ZERO).absent_wait,
        t.staleness_wait(Duration::from_secs(30)) + Duration::from_secs(5)
    );
    let w = t
        .advertised_timing_warning(Duration::from_secs(10), Duration::from_secs(8))
        .unwrap();
    assert!(w.contains("fencing gap 8 s, above --max-gap 5 s"), "{w}");
    assert!(t
        .advertised_timing_warning(Duration::from_secs(10), Duration::from_secs(2))
        .is_none());
    let plain = TimingConfig::default().validate().unwrap();
    assert_eq!(plain.gap_unknown(), plain.gap());
}

/// r52: the refusal printed `126.09374ms` (Debug) for people and as
/// the value to pass: now three significant digits for what was
/// measured and a rounded-up flag value for what to pass.
#[test]
fn r52_store_refusals_print_durations_for_people() {
    let fast = TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap();
    let facts = StoreFacts {
        p99_cas: Some(Duration::from_nanos(12_609_374)),
        replicated: false,
    };
    let e = fast.check_store(&facts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--renew (100 ms) must be at least ten times the store's p99 compare-and-swap \
         latency (12.6 ms); use --renew 130ms or more"
    );
    assert!(matches!(
        e,
        TimingError::RenewTooShortForStore { suggest, .. } if suggest == Duration::from_millis(130)
    ));
    let ms = Duration::from_millis;
    let up = |d: Duration| FlagValue(round_up_for_flag(d)).to_string();
    assert_eq!(up(Duration::from_nanos(126_093_740)), "130ms");
    assert_eq!(up(ms(100)), "100ms");
    assert_eq!(up(Duration::from_micros(99_100)), "100ms");
    assert_eq!(up(ms(1261)), "1300ms");
    assert_eq!(up(ms(2000)), "2s");
    assert_eq!(up(Duration::from_micros(12_600_001)), "13s");
    assert_eq!(up(Duration::from_micros(50)), "1ms");
    assert_eq!(up(ms(7)), "7ms");
    // Never below what it suggests.
    for n in [1u64, 9, 99, 101, 999, 1001, 12_345, 987_654_321] {
        let d = Duration::from_micros(n * 37);
        assert!(round_up_for_flag(d) >= d, "{d:?}");
    }
}

#[test]
fn store_checks() {
    let t = TimingConfig::default().validate().unwrap();
    let slow = StoreFacts {
        p99_cas: Some(Duration::from_millis(150)),
        replicated: false,
    };
    assert!(matches!(
        t.check_store(&slow),
        Err(TimingError::RenewTooShortForStore { .. })
    ));
    let fast = TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap();
    let replicated = StoreFacts {
        p99_cas: None,
        replicated: true,
    };
    let e = fast.check_store(&replicated).unwrap_err().to_string();
    assert!(e.contains("--allow-short-lease"), "{e}");
    assert!(t.check_store(&replicated).is_ok());
}

#[test]
fn timeline_explains_the_defaults() {
    let t = TimingConfig::default().validate().unwrap();
    let line = t.timeline(Duration::from_millis(2));
    assert_eq!(
        line.crash_failover,
        t.staleness_wait(t.lease()) + t.gap() + Duration::from_millis(6)
    );
    let text = line.to_string();
    assert!(text.contains("W = 10.2 s"), "{text}");
    assert!(text.contains("crash failover"), "{text}");
}
