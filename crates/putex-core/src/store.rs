//! The store as the core sees it: a message partner, not something it calls.
//!
//! The core emits [`StoreRequest`]s (with a deadline) and receives
//! [`StoreOutcome`]s. The four outcome classes of the store contract
//! (`docs/stores.md`) are kept apart on purpose: a timed-out write is
//! [`StoreOutcome::Unknown`] — it may still land — and never a conflict.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::Instant;

/// A fencing token: the store's bucket incarnation and the revision of a write.
///
/// Tokens compare by epoch first, so a re-created bucket never hands out a
/// token that compares lower than one from an older incarnation (S6).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Token {
    /// The bucket incarnation (e.g. its creation time).
    pub epoch: u64,
    /// The store's sequence number of the write; increasing per store.
    pub revision: u64,
}

impl Token {
    /// The token of the write with `revision` in bucket incarnation `epoch`
    /// (what `Display` prints as `EPOCH:REVISION`).
    pub const fn new(epoch: u64, revision: u64) -> Self {
        Token { epoch, revision }
    }

    /// The token `Display` printed as `EPOCH:REVISION`, if `s` is one.
    pub fn parse(s: &str) -> Option<Token> {
        let (epoch, revision) = s.split_once(':')?;
        Some(Token::new(epoch.parse().ok()?, revision.parse().ok()?))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.epoch, self.revision)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.epoch, self.revision)
    }
}

/// A store timestamp: when the store applied a write, on the store's clock.
///
/// `era` separates clock domains that cannot be compared: the embedded store
/// uses the boot id (a record from another boot counts as infinitely old);
/// NATS uses a single era (the stream leader's wall clock).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct StoreTime {
    /// The clock domain: the boot id's hash on the embedded store, one fixed
    /// value on NATS; times of different eras are not comparable.
    pub era: u64,
    /// Nanoseconds on that domain's clock.
    pub nanos: u64,
}

impl StoreTime {
    /// How far `self` is after `earlier`, in store time.
    pub fn gap_since(self, earlier: StoreTime) -> StoreGap {
        if self.era != earlier.era {
            return StoreGap::Unbounded;
        }
        match self.nanos.cmp(&earlier.nanos) {
            Ordering::Less => StoreGap::Backwards,
            _ => StoreGap::Forward(std::time::Duration::from_nanos(self.nanos - earlier.nanos)),
        }
    }

    /// [`gap_since`](Self::gap_since) on a store whose clock reads in steps
    /// of `step` and whose stamps are rounded apart (etcd: a record's stamp
    /// up, a probe's down): a later stamp up to one step *before* `earlier`
    /// is rounding, not a clock that went back, and counts as no time
    /// passed. With `step` zero this is `gap_since`.
    pub fn gap_since_stepped(self, earlier: StoreTime, step: std::time::Duration) -> StoreGap {
        match self.gap_since(earlier) {
            StoreGap::Backwards if u128::from(earlier.nanos - self.nanos) <= step.as_nanos() => {
                StoreGap::Forward(std::time::Duration::ZERO)
            }
            gap => gap,
        }
    }
}

/// The difference between two store timestamps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StoreGap {
    /// Same clock domain, moving forward by this much.
    Forward(std::time::Duration),
    /// Same clock domain, but the later write carries the earlier time: the
    /// store's clock stepped back (e.g. a stream-leader change).
    Backwards,
    /// Different clock domains: the earlier one is infinitely old.
    Unbounded,
}

/// Which record a request is about. The driver maps these to store keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Key {
    /// The lock record itself.
    Lock,
    /// This node's probe record, used to read the store's clock (S1 b).
    Probe,
}

/// A record as read from the store: its bytes, the token of the write that
/// put them there, and when the store applied that write.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    /// The raw value; may be garbage written by someone else.
    pub value: Vec<u8>,
    /// Epoch and revision of the write that produced it.
    pub token: Token,
    /// When the store applied it, on the store's clock.
    pub time: StoreTime,
}

/// An operation the core asks the driver to perform.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreOp {
    /// Read a record. With `leader`, the read must see the caller's own
    /// latest writes (on NATS: from the stream leader, not a replica).
    Get {
        /// The record.
        key: Key,
        /// Whether the read must see our own writes.
        leader: bool,
    },
    /// Write a record that must not exist yet.
    Create {
        /// The record.
        key: Key,
        /// The new value.
        value: Vec<u8>,
    },
    /// Compare-and-swap: write only if the record is still at `expected`.
    ///
    /// The expectation carries the epoch too: a re-created bucket restarts
    /// its revisions, and a CAS against a revision of the old incarnation
    /// must be a conflict, never a hit on an unrelated record.
    Update {
        /// The record.
        key: Key,
        /// The new value.
        value: Vec<u8>,
        /// The epoch and revision the record must still be at.
        expected: Token,
    },
    /// Unconditional write; used only for the node's own probe record.
    Put {
        /// The record.
        key: Key,
        /// The new value.
        value: Vec<u8>,
    },
}

/// Identifies a request so its outcome can be matched to it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A store operation with the deadline by which the driver must answer.
///
/// When the deadline passes without a reply the driver reports
/// [`StoreOutcome::Unknown`] (H5).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoreRequest {
    /// Matches the outcome to the request.
    pub id: OpId,
    /// What to do.
    pub op: StoreOp,
    /// Answer no later than this (local boot-time clock).
    pub deadline: Instant,
}

/// What became of a store request.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreOutcome {
    /// A write was applied and produced this token.
    Written(Token),
    /// A create of the lock record was applied and produced `token`, and
    /// the store proves that no record was at the key for at least
    /// `vacant_for` before it: real time, measured on a clock whose rate is
    /// within ε and that never jumps (`docs/safety.md`, S4, "When an absent
    /// record proves vacancy"). A store that cannot prove it answers a
    /// create with [`StoreOutcome::Written`], which counts as vacant for no
    /// time at all.
    Created {
        /// The token of the create.
        token: Token,
        /// How long the key was provably without a record before it.
        vacant_for: std::time::Duration,
    },
    /// A read found this entry, or nothing.
    Read(Option<Entry>),
    /// The compare-and-swap or create definitely did not apply.
    Conflict,
    /// Timed out or lost the connection: a write may or may not have applied.
    Unknown,
    /// The store refused the request for a reason retrying will not fix.
    Failed(String),
}

impl StoreOutcome {
    /// The token of an applied write ([`StoreOutcome::Written`] or
    /// [`StoreOutcome::Created`]).
    pub fn written(&self) -> Option<Token> {
        match self {
            StoreOutcome::Written(t) | StoreOutcome::Created { token: t, .. } => Some(*t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tokens_order_by_epoch_first() {
        assert!(Token::new(2, 1) > Token::new(1, 900));
        assert!(Token::new(1, 5) < Token::new(1, 6));
    }

    #[test]
    fn a_stepped_clock_rounding_is_no_time_but_a_larger_step_back_is_backwards() {
        let sec = Duration::from_secs(1);
        let record = StoreTime {
            era: 7,
            nanos: 5_000_000_000,
        };
        let probe = |nanos| StoreTime { era: 7, nanos };
        // One step behind: the two roundings, not a clock that went back.
        assert_eq!(
            probe(4_000_000_000).gap_since_stepped(record, sec),
            StoreGap::Forward(Duration::ZERO)
        );
        assert_eq!(
            probe(7_000_000_000).gap_since_stepped(record, sec),
            StoreGap::Forward(2 * sec)
        );
        // More than a step behind: a new leader or a new lease.
        assert_eq!(
            probe(3_999_999_999).gap_since_stepped(record, sec),
            StoreGap::Backwards
        );
        // Without a step, exactly gap_since.
        assert_eq!(
            probe(4_000_000_000).gap_since_stepped(record, Duration::ZERO),
            StoreGap::Backwards
        );
        assert_eq!(
            StoreTime { era: 8, nanos: 0 }.gap_since_stepped(record, sec),
            StoreGap::Unbounded
        );
    }

    #[test]
    fn store_gaps() {
        let a = StoreTime { era: 1, nanos: 100 };
        let b = StoreTime { era: 1, nanos: 350 };
        assert_eq!(b.gap_since(a), StoreGap::Forward(Duration::from_nanos(250)));
        assert_eq!(a.gap_since(b), StoreGap::Backwards);
        assert_eq!(
            StoreTime { era: 2, nanos: 0 }.gap_since(a),
            StoreGap::Unbounded
        );
    }
}
