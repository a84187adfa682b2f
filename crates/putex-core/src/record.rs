//! Lock records: the versioned JSON that putex writes to the store.
//!
//! A record names its holder (node id, machine id, per-start instance id),
//! the holder's state, the unique id of the write that produced it (H3/H4),
//! and the timing it advertises so that takers can use the larger of theirs
//! and its own (`docs/safety.md`).
//!
//! Anything that does not parse as a record of a known version is
//! [`Observed::Garbage`]: it is never read as `released` (S1 treats it as a
//! stale record, H3 treats it as a lost lock).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Token;

/// The record format version written by this crate.
pub const RECORD_VERSION: u32 = 1;

/// The holder's state as written in its record.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    /// Took the lock and is waiting out the fencing gap; not running the service.
    Confirming,
    /// May be running the service.
    Active,
    /// Stopped gracefully with proof (H6); the lock is free at once (S3).
    Released,
    /// Removed by an administrator (S7); takers treat it as stale.
    Revoked,
}

/// A lock record.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LockRecord {
    /// Format version; [`RECORD_VERSION`].
    pub v: u32,
    /// The holder's node id (default: hostname).
    pub node: String,
    /// The holder's machine id (`/etc/machine-id`).
    pub machine: String,
    /// The holder agent's per-start instance id.
    pub instance: String,
    /// The holder's state.
    pub state: LockState,
    /// Unique id of the write that produced this record.
    pub write: String,
    /// Advertised lease duration T, in milliseconds (rounded up).
    pub lease_ms: u64,
    /// Advertised emergency-stop gap G, in milliseconds (rounded up).
    pub gap_ms: u64,
    /// O1: a `released` record handed to this node by a switchover. For
    /// [`LockRecord::hold_ms`] after a node first sees the release, only
    /// that node takes it; afterwards it is an ordinary released record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// O1: how long (milliseconds, on each reader's own clock from when it
    /// first sees the record) a release [`to`](LockRecord::to) someone is
    /// theirs alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_ms: u64,
    /// O1: the release's target takes it only once its own position is
    /// within `--max-lag` of the highest position it knows, waiting for that
    /// (a stopped holder's last writes still reaching it) at most
    /// [`hold_ms`](LockRecord::hold_ms); a target that has not caught up by
    /// then takes nothing, and the release is an ordinary one. Set unless
    /// the operator waived the lag (`putex switchover --allow-lag`). Absent
    /// (false) in records of older versions: taken at once, as they were.
    #[serde(default, skip_serializing_if = "is_false")]
    pub catch_up: bool,
    /// O2: failover is paused. Nobody takes over a paused record; its
    /// holder starts and stops nothing and renews regardless of health
    /// (health and position checks still run and are reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// The holding this record belongs to: the fencing token (`EPOCH:REVISION`)
    /// of its first write, carried by every later write of the same holding
    /// (renewals, activation, pause, release). Absent on a holding's first
    /// write, whose own revision is that token. Read by
    /// [`LockRecord::holds_token`]; unreadable text counts as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "token_text::serialize",
        deserialize_with = "token_text::deserialize"
    )]
    pub since: Option<Token>,
    /// F2 (failsafe, `docs/failsafe-design.md`): the members that must all
    /// grant for the holder's licence to run on without the store, and how
    /// long it may at most. Absent in an ordinary record, and in every
    /// `released` one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<FailsafeSet>,
}

/// F2: a failsafe record's set and cap.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct FailsafeSet {
    /// Every other member of the lock, by node and machine.
    pub members: Vec<FailsafeMember>,
    /// The longest the holder runs on grants after its last renewal that
    /// landed (`--failsafe-max`), in milliseconds.
    pub max_ms: u64,
}

/// One member of a failsafe set: a node id and the machine it runs on (two
/// hosts given one node id by mistake are two members).
#[derive(Clone, PartialEq, Eq, Debug, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FailsafeMember {
    /// Its node id.
    pub node: String,
    /// Its machine id.
    pub machine: String,
}

/// Who paused failover and why (O2), as written in the holder's record.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Pause {
    /// Who asked (e.g. `user@host` of the `putex pause` command).
    pub by: String,
    /// The operator's reason; may be empty.
    #[serde(default)]
    pub reason: String,
}

impl std::fmt::Display for Pause {
    /// `by ops@db3: kernel update` (or `by ops@db3` without a reason).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "by {}", self.by)?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        Ok(())
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl LockRecord {
    /// The advertised lease duration T.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// The advertised emergency-stop gap.
    pub fn gap(&self) -> Duration {
        Duration::from_millis(self.gap_ms)
    }

    /// O1: how long only [`to`](LockRecord::to) may take this release.
    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.hold_ms)
    }

    /// Serialises the record as JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lock record always serialises")
    }

    /// Whether `token` is a fencing token of the holding this record, stored
    /// at `at`, shows: the record is `confirming` or `active`, and `token`
    /// lies between the holding's first write ([`since`](LockRecord::since),
    /// or `at` itself) and `at`, in the same store incarnation.
    ///
    /// Every write to a lock key is a compare-and-swap over the previous
    /// revision, and a new holding begins with a write that carries no
    /// `since`; so the revisions from a holding's first write up to its
    /// latest are that holding's alone, and a token among them was handed
    /// out by it. Exact on a store that keeps its acknowledged writes; a
    /// store that lost some may reuse their revisions (S6), and the answer
    /// is as good as the fencing token's itself.
    pub fn holds_token(&self, at: Token, token: Token) -> bool {
        let first = self.since.filter(|s| s.epoch == at.epoch && *s <= at);
        matches!(self.state, LockState::Confirming | LockState::Active)
            && token.epoch == at.epoch
            && first.unwrap_or(at) <= token
            && token <= at
    }
}

/// `since` as the text `EPOCH:REVISION`, like every token putex shows; text
/// that is no token reads as absent rather than making the record garbage.
mod token_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Token;

    pub fn serialize<S: Serializer>(t: &Option<Token>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Token>, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(v.as_str().and_then(Token::parse))
    }
}

/// Milliseconds, rounded up, for advertising a duration in a record.
pub fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// What a stored value turned out to be.
#[derive(Clone, PartialEq, Eq, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "decoded once per store event and matched at once; a box would cost an allocation per decode"
)]
pub enum Observed {
    /// A well-formed record.
    Record(LockRecord),
    /// Bytes that are not a record putex understands.
    Garbage,
}

impl Observed {
    /// Parses a stored value. Never panics, whatever the bytes.
    ///
    /// The value must be JSON throughout: serde_json skips the fields it
    /// does not know without checking that their strings are UTF-8, so the
    /// bytes are checked first (a record with a broken extra field is not
    /// a record).
    pub fn decode(bytes: &[u8]) -> Observed {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Observed::Garbage;
        };
        match serde_json::from_str::<LockRecord>(text) {
            Ok(r) if r.v == RECORD_VERSION && !r.write.is_empty() => Observed::Record(r),
            _ => Observed::Garbage,
        }
    }

    /// The record, if the value is one.
    pub fn record(&self) -> Option<&LockRecord> {
        match self {
            Observed::Record(r) => Some(r),
            Observed::Garbage => None,
        }
    }
}

/// A probe record: a node's own record, written only to read back the
/// store's timestamp (S1 b).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// Format version; [`RECORD_VERSION`].
    pub v: u32,
    /// The probing node.
    pub node: String,
    /// Unique id of this probe write.
    pub write: String,
}

impl ProbeRecord {
    /// Serialises the probe as JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a probe record always serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(state: LockState) -> LockRecord {
        LockRecord {
            v: 1,
            node: "db1.example.com".into(),
            machine: "m1".into(),
            instance: "i1".into(),
            state,
            write: "i1-7".into(),
            lease_ms: 10_000,
            gap_ms: 2_000,
            to: None,
            hold_ms: 0,
            catch_up: false,
            paused: None,
            since: None,
            failsafe: None,
        }
    }

    #[test]
    fn round_trips_as_readable_json() {
        let r = sample(LockState::Released);
        let bytes = r.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""state":"released""#), "{text}");
        assert_eq!(Observed::decode(&bytes), Observed::Record(r));
    }

    #[test]
    fn operator_fields_are_optional_and_round_trip() {
        // A record without them (every record before O1/O2) still reads,
        // and they are only written when set.
        let plain = sample(LockState::Active).encode();
        let text = String::from_utf8(plain).unwrap();
        assert!(
            !text.contains("paused") && !text.contains("\"to\""),
            "{text}"
        );
        let mut r = sample(LockState::Released);
        r.to = Some("db2".into());
        r.hold_ms = 2_000;
        r.paused = Some(Pause {
            by: "ops@db1".into(),
            reason: "kernel update".into(),
        });
        assert_eq!(Observed::decode(&r.encode()), Observed::Record(r));
    }

    #[test]
    fn since_is_written_as_text_and_unreadable_text_reads_as_absent() {
        let mut r = sample(LockState::Active);
        r.since = Some(Token::new(7, 40));
        let text = String::from_utf8(r.encode()).unwrap();
        assert!(text.contains(r#""since":"7:40""#), "{text}");
        assert_eq!(
            Observed::decode(text.as_bytes()),
            Observed::Record(r.clone())
        );
        for odd in [r#""x""#, "40", "null", r#""7:""#, r#"{"epoch":7}"#] {
            let text = text.replace(r#""7:40""#, odd);
            let read = Observed::decode(text.as_bytes());
            let read = read.record().expect("still a record");
            assert_eq!(read.since, None, "{text}");
        }
        let plain = String::from_utf8(sample(LockState::Active).encode()).unwrap();
        assert!(!plain.contains("since"), "{plain}");
    }

    #[test]
    fn a_token_is_held_from_the_holdings_first_write_to_its_latest() {
        let t = |r| Token::new(7, r);
        let mut r = sample(LockState::Active);
        // The holding's first write, no renewal yet: only its own revision.
        assert!(r.holds_token(t(40), t(40)));
        assert!(!r.holds_token(t(40), t(39)));
        // Renewed: every token from the first write to the latest.
        r.since = Some(t(40));
        for (token, held) in [(39, false), (40, true), (45, true), (50, true), (51, false)] {
            assert_eq!(r.holds_token(t(50), t(token)), held, "token {token}");
        }
        // Another incarnation of the store, or a `since` above the record.
        assert!(!r.holds_token(t(50), Token::new(8, 45)));
        assert!(!r.holds_token(Token::new(8, 50), t(45)));
        r.since = Some(t(60));
        assert!(!r.holds_token(t(50), t(45)) && r.holds_token(t(50), t(50)));
        // Only a holding's record holds anything.
        r.since = Some(t(40));
        for state in [LockState::Released, LockState::Revoked] {
            r.state = state;
            assert!(!r.holds_token(t(50), t(45)), "{state:?}");
        }
        r.state = LockState::Confirming;
        assert!(r.holds_token(t(50), t(45)));
    }

    #[test]
    fn garbage_is_never_a_record() {
        for bytes in [
            &b""[..],
            b"\xff\xfe\x00",
            b"{}",
            b"null",
            br#"{"v":2,"node":"a","machine":"m","instance":"i","state":"released","write":"w","lease_ms":1,"gap_ms":1}"#,
            br#"{"v":1,"node":"a","machine":"m","instance":"i","state":"freed","write":"w","lease_ms":1,"gap_ms":1}"#,
            br#"{"v":1,"node":"a","machine":"m","instance":"i","state":"released","write":"","lease_ms":1,"gap_ms":1}"#,
        ] {
            assert_eq!(Observed::decode(bytes), Observed::Garbage, "{bytes:?}");
        }
    }

    #[test]
    fn advertised_durations_round_up() {
        assert_eq!(ceil_millis(Duration::from_nanos(1_000_001)), 2);
        assert_eq!(ceil_millis(Duration::from_millis(10)), 10);
    }
}
