//! Identity pools (`putex id`): unique small numbers from a range — a
//! snowflake worker id 1..254 per machine, a shard number — claimed
//! atomically and never duplicated.
//!
//! # Guarantees
//!
//! - **Unique.** At any time an id of a pool is held by at most one claim,
//!   also under concurrent claims from many hosts and processes, on every
//!   backend. This rests only on the store's create and compare-and-swap:
//!   an id record becomes a claim by a create (of an id never used) or a
//!   compare-and-swap on the revision of its `released` record, so two
//!   claimers can never both succeed. No decision depends on timing.
//! - **One id per name, idempotent.** A claim is made for a *name* (default:
//!   the hostname) and persists until it is released. Claiming again with
//!   the same name returns the same id; concurrent claims with one name end
//!   with one id, which every caller gets.
//! - **No silent sharing.** A claim records the machine id. A claim with the
//!   same name from another machine (a cloned VM with the same hostname) is
//!   refused, never handed the same id.
//! - **Nothing deleted behind a holder's back.** Release writes `released`
//!   (by the owner) or `revoked` (`--force`, `docs/safety.md` S7) into the id record;
//!   id records are never deleted. `revoked` ids are not handed out again
//!   (their holder may still use them). Unreadable records are treated as
//!   taken and reported by [`check`].
//! - **Crash-safe.** A claim is a sequence of single-record writes (name
//!   record `pending`, id record taken, name record `bound`). A crash between
//!   them leaves records that the next claim with the same name resumes, and
//!   that [`check`] explains.
//!
//! # Records
//!
//! Under the prefix `id.<pool>.` (see [`keys`]):
//!
//! | key | value |
//! |---|---|
//! | `id.<pool>.meta` | the pool's range, fixed by its first claim: `{"v":1,"kind":"meta","pool":…,"first":1,"last":254}` |
//! | `id.<pool>.<n>` | id `n`: a [`LockRecord`] (node = the claim name, machine, instance, state, write id, lease, gap) with the extra fields `pool`, `id` and `kind: "claim"` |
//! | `id.<pool>.name.<name>` | the name's index record ([`NameRecord`]): `pending` while a claim runs, then `bound` to its id; retired at release ([`Store::retire`]: nothing of it stays, so names used once — a job id — do not pile up in every read of the pool) |
//! | `id.<pool>.scan` | a marker written by every read of the whole pool (see [`crate::store::snapshot_synced`]) |
//!
//! An id record is an ordinary lock record so that an id can also be held
//! for the duration of a command by the lock state machine on the same key:
//! a persistent claim is `active` with a lease of [`CLAIM_LEASE`] (ten
//! years), so the state machine sees it as held and never stale; a
//! `released` id is free for either kind of claimer.
//!
//! # The claim, step by step
//!
//! 1. Read the name record. Bound to id `n` whose record names us back (same
//!    name, same machine, `active`): that is the answer. Another machine:
//!    refused. Pending: another process is claiming this name; wait for it
//!    (a pending record unchanged for [`Options::pending_takeover`] is taken
//!    over by compare-and-swap).
//! 2. Create the name record `pending` (exclusive), or compare-and-swap it to
//!    `pending` over a broken binding or a stalled pending record.
//! 3. Read the whole pool and take an id: first an id record of ours left by
//!    an interrupted claim, then never-used ids in ascending order, then
//!    `released` ids, oldest first ([`free_candidates`]). Create or
//!    compare-and-swap; on a conflict try the next one, re-reading the pool
//!    after a few conflicts. None left: [`IdError::Exhausted`].
//! 4. Compare-and-swap the name record to `bound` to the id. If someone
//!    changed it meanwhile, give the id back (compare-and-swap to `released`
//!    on our own revision, so an id somebody else took over is never
//!    touched) and start again.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use putex_core::record::{ceil_millis, LockRecord, LockState, Observed, RECORD_VERSION};
use putex_core::store::{Entry, StoreGap, StoreTime, Token};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::identity::instance_id;
use crate::store::{keys, snapshot_synced, Name, NodeId, ReadMode, Store, StoreError};

mod claim;
mod listing;
mod problems;
mod records;
#[cfg(test)]
mod tests;
mod view;

pub(crate) use claim::pool_range;
pub use claim::{claim, free_candidates, release, Claimed, Released};
pub use listing::{check, list, CheckReport, ListEntry, Listing};
pub use problems::{BrokenBinding, PoolProblem};
pub use records::{NameRecord, NameState};
pub(crate) use view::PoolView;

/// The lease a persistent claim advertises: ten years. The lock state
/// machine, should it run on the same key, treats the claim as held and
/// never stale.
pub const CLAIM_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The most ids a pool may hold: [`IdRange::new`] refuses a larger range.
pub const MAX_POOL_SIZE: u64 = 65_536;

/// The `kind` field of a persistent claim's id record.
pub(crate) const CLAIM_KIND: &str = "claim";

/// Conflicting writes after which a claimer reads the pool again.
const RESNAPSHOT_AFTER: usize = 4;

/// How often a claimer waiting for a pending claim of its name looks again.
const PENDING_POLL: Duration = Duration::from_millis(50);

/// Attempts of a release that keeps meeting concurrent writes.
const RELEASE_ATTEMPTS: usize = 10;

/// A range of ids, `first..=last`, at most [`MAX_POOL_SIZE`] of them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct IdRange {
    first: u64,
    last: u64,
}

impl IdRange {
    /// The range `first..=last`.
    pub fn new(first: u64, last: u64) -> Result<IdRange, IdError> {
        if first > last {
            return Err(IdError::Range(format!(
                "{first}-{last} is backwards: the first id must not be above the last (for example {last}-{first})"
            )));
        }
        if last - first >= MAX_POOL_SIZE {
            return Err(IdError::Range(format!(
                "{first}-{last} has {} ids; a pool holds at most {MAX_POOL_SIZE}",
                u128::from(last - first) + 1
            )));
        }
        Ok(IdRange { first, last })
    }

    /// The lowest id of the range (it is in the range).
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The highest id of the range (it is in the range).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// How many ids the range holds.
    pub fn size(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Whether `n` is in the range.
    pub fn contains(&self, n: u64) -> bool {
        (self.first..=self.last).contains(&n)
    }
}

impl fmt::Display for IdRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for IdRange {
    type Err = IdError;

    /// Parses `FIRST-LAST`, e.g. `1-254`.
    fn from_str(s: &str) -> Result<IdRange, IdError> {
        let s = s.trim();
        let bad = |why: String| {
            IdError::Range(format!(
                "{why}; write it as FIRST-LAST with whole numbers, for example 1-254"
            ))
        };
        if s.is_empty() {
            return Err(bad("it is empty".into()));
        }
        let Some((a, b)) = s.split_once('-') else {
            return Err(bad(format!("{s:?} has no '-'")));
        };
        let num = |t: &str| {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad(format!("{t:?} in {s:?} is not a whole number")));
            }
            t.parse::<u64>()
                .map_err(|_| bad(format!("{t:?} in {s:?} is too large")))
        };
        IdRange::new(num(a)?, num(b)?)
    }
}

/// Why an identity-pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    /// A malformed or oversized range.
    #[error("range {0}")]
    Range(String),
    /// The claim asked for another range than the pool has.
    #[error(
        "pool {pool} has the range {stored}, this claim asks for {asked} (a pool's range is \
         fixed by its first claim; for another range use another pool)"
    )]
    RangeMismatch {
        /// The pool's name, as passed to the call.
        pool: String,
        /// The range in the pool's meta record.
        stored: IdRange,
        /// The range the call passed.
        asked: IdRange,
    },
    /// The pool does not exist yet and no range was given.
    #[error("pool {pool} does not exist yet: its first claim must give its range")]
    NoRange {
        /// The pool's name, as passed to the call.
        pool: String,
    },
    /// Every id of the range is taken.
    #[error("pool {pool}: all {size} ids are claimed{detail}")]
    Exhausted {
        /// The pool's name, as passed to the call.
        pool: String,
        /// How many ids the pool's range holds ([`IdRange::size`]).
        size: u64,
        /// What else holds ids (revoked, unreadable), if anything.
        detail: String,
    },
    /// The name is held (or being claimed) by another machine.
    #[error(
        "name {name} {what} in pool {pool}, claimed by machine {holder}; this machine is {this}: \
         a cloned machine? give it a name of its own, or force the old claim's release",
        what = held_what(*id),
        holder = short(holder),
        this = short(this)
    )]
    OtherMachine {
        /// The pool's name, as passed to the call.
        pool: String,
        /// The claim name the call was for ([`Claimant::name`]).
        name: String,
        /// The id it holds, if bound.
        id: Option<u64>,
        /// The machine id the name's records hold, in full (the message
        /// shortens it).
        holder: String,
        /// This machine's id.
        this: String,
    },
    /// A release of another machine's claim, not forced.
    #[error(
        "name {name} {what} in pool {pool}, claimed by machine {holder}; this machine is {this}: \
         release it on that machine, or force the release to revoke it (the holder is not told: \
         make sure it no longer uses the id)",
        what = held_what(*id),
        holder = short(holder),
        this = short(this)
    )]
    NotOwner {
        /// The pool's name, as passed to the call.
        pool: String,
        /// The claim name the call was for ([`Claimant::name`]).
        name: String,
        /// The id it holds, if known.
        id: Option<u64>,
        /// The machine id the name's records hold, in full (the message
        /// shortens it).
        holder: String,
        /// This machine's id.
        this: String,
    },
    /// Concurrent writers kept changing the records until the deadline.
    #[error(
        "pool {pool}: the claim or release of name {name} did not finish within {waited:?} \
         (another process keeps changing its records); try again"
    )]
    Busy {
        /// The pool's name, as passed to the call.
        pool: String,
        /// The claim name the call was for ([`Claimant::name`]).
        name: String,
        /// How long it tried.
        waited: Duration,
    },
    /// A record in the way cannot be read.
    #[error("{key}: the record cannot be read (garbage, or written by another putex version)")]
    Unreadable {
        /// The pool's name, as passed to the call.
        pool: String,
        /// The unreadable record's full key, e.g. `id.<pool>.meta` or
        /// `id.<pool>.name.<name>`.
        key: String,
        /// The claim name whose record it is, if it is one (a forced
        /// release of that name removes it).
        name: Option<String>,
    },
    /// The store failed (unreachable, timed out, refused).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

fn held_what(id: Option<u64>) -> String {
    match id {
        Some(n) => format!("holds id {n}"),
        None => "is being claimed".into(),
    }
}

/// A machine id shortened for messages and tables: 12 characters and `…`.
pub(crate) fn short(machine: &str) -> String {
    if machine.chars().count() > 12 {
        let s: String = machine.chars().take(12).collect();
        format!("{s}…")
    } else {
        machine.to_owned()
    }
}

/// Who claims: the claim name and the machine it runs on.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claimant {
    /// The claim name (default: the hostname), a node id.
    pub name: NodeId,
    /// The machine id ([`crate::identity::machine_id`]).
    pub machine: String,
}

/// Timeouts of the pool operations.
#[derive(Clone, Debug)]
pub struct Options {
    /// The deadline of each single store call (default 5 s);
    /// [`deadline`](Options::deadline) bounds a whole claim or release.
    pub timeout: Duration,
    /// How long a `pending` name record may stay unchanged (on this host's
    /// clock) before a claim with the same name takes it over.
    pub pending_takeover: Duration,
    /// How long a claim or release may keep retrying against concurrent
    /// writers before it gives up with [`IdError::Busy`].
    pub deadline: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(5),
            pending_takeover: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
        }
    }
}
