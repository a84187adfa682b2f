//! Unit tests of the NATS backend that need no server.

use super::open::{has_durability_fix, parse_version};
use super::*;

#[test]
fn versions() {
    assert_eq!(parse_version("2.15.1"), Some((2, 15, 1)));
    assert_eq!(parse_version("2.11.0-RC.1"), Some((2, 11, 0)));
    assert_eq!(parse_version("v2.10"), Some((2, 10, 0)));
    assert_eq!(parse_version("x"), None);
    assert!(parse_version("2.10.29").unwrap() < MIN_SERVER);
    assert!(parse_version("2.11.0").unwrap() >= MIN_SERVER);
    assert!(has_durability_fix((2, 12, 3)));
    assert!(has_durability_fix((2, 15, 1)));
    assert!(has_durability_fix((2, 11, 12)));
    assert!(!has_durability_fix((2, 12, 1)));
    assert!(!has_durability_fix((2, 11, 11)));
}

#[test]
fn conflicts_and_unknowns() {
    use jetstream::context::{PublishError, PublishErrorKind as K};
    let js_err = |code: u64| {
        let e: jetstream::Error = serde_json::from_str(&format!(
            r#"{{"code":400,"err_code":{code},"description":"wrong last sequence"}}"#
        ))
        .unwrap();
        PublishError::with_source(K::Other, e)
    };
    // 10164 arrives as `Other` from a replicated stream: still a conflict.
    for code in [10071, 10164] {
        assert!(
            publish_error(Op::Update, "k", &js_err(code)).is_conflict(),
            "{code}"
        );
    }
    assert!(publish_error(Op::Update, "k", &PublishError::new(K::WrongLastSequence)).is_conflict());
    // Everything else may have landed.
    for e in [
        PublishError::new(K::TimedOut),
        PublishError::new(K::BrokenPipe),
        PublishError::new(K::StreamNotFound),
        PublishError::new(K::Other),
        js_err(10163),
        js_err(10077),
    ] {
        assert!(publish_error(Op::Update, "k", &e).is_unknown(), "{e:?}");
    }
}

#[test]
fn filters() {
    assert_eq!(nats_filter(""), ">");
    assert_eq!(nats_filter("member.pg."), "member.pg.>");
    assert_eq!(nats_filter("lock.pg"), "lock.pg");
}
