//! What can go wrong with a lease, one variant per outcome, and how a
//! held lease ended.

use std::fmt;
use std::time::Duration;

use putex_core::time::Human;
use putex_core::{ExitReason, LockState, LossCause, Reason, TimingError, Token};
use thiserror::Error;

use crate::observe::json::RecordState;
use crate::store::{Name, NameError, StoreError};

/// Why a lease could not be acquired, kept or released: one variant per
/// outcome a caller may want to tell apart.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A lock name or node id is not valid ([`LeaseOptions::new`](super::LeaseOptions::new)).
    #[error(transparent)]
    Name(#[from] NameError),
    /// [`LeaseOptions::timing`](super::LeaseOptions::timing) cannot work: validating it failed.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// Someone holds the lock ([`Lease::try_acquire`](super::Lease::try_acquire)): `holder` is its
    /// node id as its record says, `token` the record's revision.
    #[error("lock {name:?} is held by {holder} (record {token}, {})", held_state(*.state))]
    Held {
        /// The lock.
        name: Name,
        /// The holder's node id (or why the record could not be read).
        holder: String,
        /// The record's state (`None`: the record is unreadable).
        state: Option<LockState>,
        /// The record's revision as a token `epoch:revision`.
        token: Token,
    },
    /// The lock was not acquired within the wait
    /// ([`Lease::acquire_timeout`](super::Lease::acquire_timeout)); nothing is held.
    #[error("lock {name:?} not acquired within {}", Human(*.waited))]
    TimedOut {
        /// The lock.
        name: Name,
        /// How long it waited.
        waited: Duration,
    },
    /// The store did not answer ([`Lease::try_acquire`](super::Lease::try_acquire) reads the record
    /// first); nothing is held.
    #[error("the store did not answer: {0}")]
    Unavailable(#[source] StoreError),
    /// The lease is no longer held ([`Lease::check`](super::Lease::check)), and how it ended.
    #[error("the lease was lost: {0}")]
    Lost(Lost),
    /// The lock's agent stopped: another machine runs with this node id
    /// (S5), or the lock was closed.
    #[error("the lease machine exited: {}", exit_text(.0))]
    Exited(ExitReason),
}

fn held_state(state: Option<LockState>) -> String {
    state
        .map_or(RecordState::Unreadable, RecordState::from)
        .to_string()
}

fn exit_text(reason: &ExitReason) -> String {
    match reason {
        ExitReason::Shutdown { .. } => "the lock was closed".into(),
        ExitReason::DuplicateNode { machine } => {
            format!("another machine ({machine}) runs with this node id (S5): give each its own")
        }
        ExitReason::StartupStopFailed => "its start-up stop failed".into(),
    }
}

/// Why a held lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The licence ended without a newer successful renewal (H1).
    LicenceEnded,
    /// The record is no longer ours: another holder, a revocation, or a
    /// store that lost or replaced it (H3, S6, S7).
    TakenOver(LossCause),
    /// Released on request.
    Released,
    /// Ended for another of the core's reasons (the keeper fired or died, a
    /// stop failed, …).
    Ended(Reason),
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::LicenceEnded => f.write_str("the licence ended without a newer renewal (H1)"),
            Lost::TakenOver(cause) => write!(f, "the record is no longer ours: {cause:?}"),
            Lost::Released => f.write_str("released"),
            Lost::Ended(reason) => write!(f, "ended: {reason:?}"),
        }
    }
}
