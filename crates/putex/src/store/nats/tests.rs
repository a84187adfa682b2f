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
fn filters() {
    assert_eq!(nats_filter(""), ">");
    assert_eq!(nats_filter("member.pg."), "member.pg.>");
    assert_eq!(nats_filter("lock.pg"), "lock.pg");
}
