//! Unit tests of the gateway's timing and records.

use super::*;

fn record(state: LockState, instance: &str, write: &str) -> LockRecord {
    LockRecord {
        v: 1,
        node: "gw1".into(),
        machine: "m".into(),
        instance: instance.into(),
        state,
        write: write.into(),
        lease_ms: 1000,
        gap_ms: 200,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    }
}

#[test]
fn only_grant_and_renewal_writes_are_http_grants() {
    let yes = |w: &str| is_http_grant(&record(LockState::Active, "abc", w));
    assert!(yes("abc-grant"));
    assert!(yes("abc-renew-42"));
    // The core's writes (acquisition, renewals of `putex lock` and
    // agents), another instance's grant, and malformed ids.
    for w in [
        "abc-0",
        "abc-17",
        "xyz-grant",
        "abc-renew-",
        "abc-renew-x",
        "abcgrant",
    ] {
        assert!(!yes(w), "{w}");
    }
    // A pid-based fallback instance id holds a dash.
    assert!(is_http_grant(&record(
        LockState::Active,
        "12-3",
        "12-3-grant"
    )));
    assert!(!is_http_grant(&record(LockState::Active, "12-3", "12-3-4")));
    for state in [
        LockState::Confirming,
        LockState::Released,
        LockState::Revoked,
    ] {
        assert!(!is_http_grant(&record(state, "abc", "abc-grant")));
    }
}
