//! Unit tests of the deadline, the wire format and a keeper process.

use super::*;

fn t(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

#[test]
fn fires_once_at_the_deadline() {
    let mut d = Deadline::default();
    assert!(!d.poll(t(0)));
    d.arm(t(0), t(100)).unwrap();
    assert!(!d.poll(t(99)));
    assert!(d.poll(t(100)));
    assert!(!d.poll(t(101)));
    assert_eq!(d, Deadline::Fired(t(100)));
}

#[test]
fn a_suspend_past_the_deadline_fires_at_once_and_refuses_extensions() {
    let mut d = Deadline::default();
    d.arm(t(1_000), t(11_000)).unwrap();
    d.extend(t(2_000), t(12_000)).unwrap();
    // The host sleeps for an hour: boot time jumps.
    let woke = t(3_602_000);
    assert_eq!(d.extend(woke, t(3_612_000)), Err(Refusal::Passed));
    assert_eq!(d, Deadline::Fired(t(12_000)));
    let mut d2 = Deadline::default();
    d2.arm(t(1_000), t(11_000)).unwrap();
    assert!(d2.poll(woke), "the first poll after the jump fires");
    assert_eq!(d2.extend(woke, t(3_612_000)), Err(Refusal::Fired));
}

#[test]
fn extensions_never_move_backwards_and_need_an_arm() {
    let mut d = Deadline::default();
    assert_eq!(d.extend(t(0), t(10)), Err(Refusal::NotArmed));
    d.arm(t(0), t(100)).unwrap();
    d.extend(t(1), t(50)).unwrap();
    assert_eq!(d.armed(), Some(t(100)));
    assert_eq!(d.arm(t(200), t(300)), Err(Refusal::Passed));
    assert!(matches!(d, Deadline::Fired(_)));
    d.arm(t(200), t(300)).unwrap();
    assert_eq!(d.armed(), Some(t(300)));
    d.disarm();
    assert!(!d.poll(t(10_000)));
    assert_eq!(Deadline::default().arm(t(5), t(5)), Err(Refusal::Passed));
}

#[test]
fn socket_paths_are_stable_and_short() {
    let p = socket_path(Path::new("/run/putex"), "nats://a:4222/putex", "pg");
    assert_eq!(
        p,
        socket_path(Path::new("/run/putex"), "nats://a:4222/putex", "pg")
    );
    assert_ne!(
        p,
        socket_path(Path::new("/run/putex"), "nats://b:4222/putex", "pg")
    );
    assert!(p.to_string_lossy().ends_with("-pg.sock"));
}

#[test]
fn wire_form_is_flat_json() {
    let m = ToKeeper::Extend {
        id: 2,
        deadline_ns: 5,
    };
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"type":"extend","id":2,"deadline_ns":5}"#
    );
    let f: FromKeeper = serde_json::from_str(r#"{"type":"fired","ok":true}"#).unwrap();
    assert_eq!(f, FromKeeper::Fired { ok: true });
}

#[test]
fn a_stop_names_its_kind_and_an_unknown_kind_is_refused_with_its_id() {
    let stop = ToKeeper::Stop {
        id: 5,
        kind: StopKind::Graceful,
    };
    let line = serde_json::to_string(&stop).unwrap();
    assert_eq!(line, r#"{"type":"stop","id":5,"kind":"graceful"}"#);
    assert_eq!(serde_json::from_str::<ToKeeper>(&line).unwrap(), stop);
    let bad = br#"{"type":"stop","id":6,"kind":"gentle"}"#;
    let e = serde_json::from_slice::<ToKeeper>(bad).unwrap_err();
    assert!(e.to_string().contains("unknown variant `gentle`"), "{e}");
    assert_eq!(server::request_id(bad), Some(6));
    assert_eq!(server::request_id(b"\xff{"), None);
}
