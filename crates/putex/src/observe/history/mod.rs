//! Transition records: who held a lock when, and why it moved.
//!
//! A NATS KV key keeps only a short history of its own (8 revisions in a
//! bucket putex creates), far too short to answer "what happened last
//! night". So every failover agent (`putex run`) and every `putex lock`
//! holder writes a **transition record** of its own for each change of its
//! role that matters — into and out of `confirming`, `active`,
//! `stepping-down` and `lapsed` — and `putex history` / `putex watch` read
//! them back.
//!
//! # Layout
//!
//! One record per transition, written once with an unconditional `put` on
//! a key of its own ([`keys::history`]):
//! `history.<lock>.<node>-<instance8>-<seq>`, where `<instance8>` is the
//! first 8 characters of the writer's instance id and `<seq>` counts that
//! writer's records from 0. The value is versioned JSON
//! ([`TransitionRecord`]):
//!
//! ```json
//! {"v":1,"lock":"pg","node":"db2","instance":"4f1c…","seq":1,"source":"run",
//!  "from":"confirming","to":"active","reason":"fencing gap passed (S2)",
//!  "reason_code":"activated","token":{"epoch":1763…,"revision":812},
//!  "at":"2026-11-22T02:35:11.123Z"}
//! ```
//!
//! # Time and order
//!
//! Records are **ordered by their store revision**, never by a clock. `at`
//! is the writer's wall clock when the transition happened: it is there for
//! people to read and is never compared with another host's. Durations —
//! the time a lock had no active holder — are measured on the **store's
//! clock**: the store timestamps of the records themselves (the entry's
//! time, which the store assigns when the record lands; `docs/stores.md`). A
//! record lands about one store round trip after its transition, so these
//! durations are good to a round trip.
//!
//! # Never in the way
//!
//! The agent never waits for a record: the writer queues it
//! (a bounded queue; a full queue drops the record with a warning) and a
//! task of its own writes the queue in order, each write with a deadline.
//! A failed write is logged and forgotten: history is best effort, the
//! lock record alone decides who holds the lock. On exit the host gives
//! the queue a bounded moment to drain.
//!
//! # Retention
//!
//! Distinct keys are not bounded by a bucket's per-key history, so the
//! writers prune: after about one write in [`PRUNE_EVERY`] (when the store
//! revision of the write, scrambled, is a multiple of it: `prune_due`)
//! the writer removes all but the lock's newest [`KEEP`] records. On NATS
//! and SQLite that is one request, the store doing the counting (a stream
//! purge with a filter and `keep`, so nothing of a removed record remains;
//! one `DELETE`); on etcd, or when the credentials may not purge the
//! stream, the records are read and the oldest deleted one by one.
//! A flush (the exit's) finishes a prune that is due or under way, so a
//! one-shot command's records are pruned too: before, `putex lock` exited
//! in the middle of every prune and its lock kept every record ever
//! written (4,005 after 1,000 runs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use putex_core::{Reason, Role, StoreGap, StoreTime, Token};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::store::{keys, snapshot_synced, AnyStore, Entry, Name, NodeId, Store, StoreError};

mod reader;
#[cfg(test)]
mod tests;
mod writer;

pub use reader::{derive, parse, read, HistoryRow, NoHolderBasis, Stored};
pub(crate) use writer::{HistoryWriter, WriterConfig};

/// The record format version this module writes and reads.
pub const RECORD_VERSION: u32 = 1;
/// How many transition records per lock the writers keep.
pub const KEEP: usize = 1000;
/// The writers prune after about one write in `PRUNE_EVERY`: one whose
/// store revision, scrambled (`prune_due`), is a multiple of it.
pub const PRUNE_EVERY: u64 = 32;

/// Whether the write that got `revision` makes a prune due: about one in
/// `every`, whatever the pattern of revisions. The revision itself would
/// not do: a `putex lock` run writes the same records in the same order
/// each time, so its transition records' revisions can keep the same
/// remainders run after run and never meet a multiple (1,000 runs pruned
/// nothing). One writer of several racing for the same revisions prunes.
pub(crate) fn prune_due(revision: u64, every: u64) -> bool {
    // splitmix64's finaliser: every bit of the revision moves the result.
    let mut z = revision.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    every > 0 && z.is_multiple_of(every)
}
/// Records a writer queues before it drops new ones.
const QUEUE: usize = 256;

/// One transition of one node's role for one lock, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub v: u32,
    /// The lock (or semaphore) name.
    pub lock: String,
    /// The store key of the lock record, when it is not `lock.<lock>` (a
    /// semaphore slot, `sem.<lock>.<n>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The writer's node id.
    pub node: String,
    /// The writer's instance id (one per start of an agent or `putex lock`).
    pub instance: String,
    /// The writer's record count, from 0.
    pub seq: u64,
    /// Who wrote it: `run` (the failover agent), `lock` (`putex lock`) or
    /// `serve` (the HTTP gateway).
    pub source: String,
    /// The old role (`standby`, `confirming`, `active`, …).
    pub from: String,
    /// The role after the transition, in the words of `from`.
    pub to: String,
    /// Why, for people: the core [`Reason`]'s text.
    pub reason: String,
    /// Why, for programs: [`reason_code`].
    pub reason_code: String,
    /// The fencing token involved (the acquisition's on `confirming`, the
    /// one the service was started with on `active`). Stored with numbers
    /// (the core's form); read with numbers or strings
    /// ([`crate::observe::json`]). `putex history -o json` shows strings.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::observe::json::option_token::deserialize"
    )]
    pub token: Option<Token>,
    /// On a stale takeover: the evidence (S1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<StaleEvidence>,
    /// The writer's wall clock at the transition, RFC 3339 in UTC. For
    /// display only: order is by store revision, durations are on the
    /// store's clock.
    pub at: String,
}

/// The evidence of a stale takeover ([`Reason::AcquiredStale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleEvidence {
    /// The revision that went stale: the old holder's last write. Stored
    /// and read as [`TransitionRecord::token`] is.
    #[serde(deserialize_with = "crate::observe::json::token::deserialize")]
    pub revision: Token,
    /// How long the taker saw it unchanged, on its own clock (S1 a).
    pub unchanged_for_ms: u64,
    /// Its age on the store's clock at the taker's last probe (S1 b);
    /// absent when the store's clocks could not be compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_age_ms: Option<u64>,
}

/// A short, stable, machine-readable name for a [`Reason`]
/// (`acquired-stale`, `activated`, `keeper-fired`, …).
pub fn reason_code(reason: &Reason) -> &'static str {
    match reason {
        Reason::Started => "started",
        Reason::AcquiredReleased => "acquired-released",
        Reason::AcquiredStale { .. } => "acquired-stale",
        Reason::AcquiredAbsent => "acquired-absent",
        Reason::Resumed => "resumed",
        Reason::ResumedPaused => "resumed-paused",
        Reason::Activated => "activated",
        Reason::LicenceEnded => "licence-ended",
        Reason::Lost(_) => "lost",
        Reason::Unhealthy => "unhealthy",
        Reason::Shutdown => "shutdown",
        Reason::ReleaseRequested => "release-requested",
        Reason::ServiceExited => "service-exited",
        Reason::ActivationFailed => "activation-failed",
        Reason::KeeperRefused => "keeper-refused",
        Reason::StopTimedOut => "stop-timed-out",
        Reason::StopFailed => "stop-failed",
        Reason::KeeperFired => "keeper-fired",
        Reason::KeeperLost => "keeper-lost",
        Reason::Released => "released",
        Reason::ReleaseFailed => "release-failed",
        Reason::Stopped => "stopped",
        Reason::Switchover { .. } => "switchover",
        Reason::AcquiredHandover => "acquired-switchover",
        Reason::Failback { .. } => "failback",
    }
}

/// Whether a transition is worth a record: every one into or out of a
/// role that holds the lock (`confirming`, `active`, `stepping-down`,
/// `lapsed`). Start-up and exit of a standby are not.
pub fn is_recorded(from: Role, to: Role) -> bool {
    let holds = |r: Role| {
        matches!(
            r,
            Role::Confirming | Role::Active | Role::SteppingDown | Role::Lapsed
        )
    };
    from != to && (holds(from) || holds(to))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
