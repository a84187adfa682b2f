//! Critical sections: a command that runs only while a lock is held, and is
//! stopped — with everything it started — before the lock can pass on.
//!
//! This is `putex lock NAME -- CMD` as a library. [`run`] holds the lock by
//! the agent's own rules (the core [`Agent`] through the [`driver`], H1–H6
//! and S1–S7), so a critical section is exactly as safe as a failover
//! service:
//!
//! - CMD is spawned by a **keeper** ([`crate::supervision::keeper`]) armed with the
//!   licence deadline: if this process stalls (SIGSTOP) or dies (SIGKILL),
//!   the keeper kills CMD's whole tree (cgroup scope or subreaper) at the
//!   deadline, before a taker's staleness wait W can end;
//! - when the lock is lost (another holder, revocation, licence ended) CMD's
//!   tree is stopped at once (emergency stop) and [`Outcome::Lost`] is
//!   returned;
//! - when CMD exits, what is left of its tree is stopped too (a graceful
//!   stop), and only then is `released` written (H6): the next waiter starts
//!   within a few store round trips (S3);
//! - `max_duration` stops a CMD that runs too long, so a hung job cannot
//!   hold the lock forever by being renewed.
//!
//! **Semaphores** (`limit` N > 1) are N ordinary locks, the slots
//! `sem.<name>.0` … `sem.<name>.<N−1>`. Every name's limit (1 for a plain
//! lock) is recorded in `sem.<name>` by its first client's create, so that
//! of clients disagreeing on N the first definition wins and the others
//! are refused ([`targets`]). One agent
//! runs per slot, and while a slot is seen released only one of them
//! competes; the first to arm the keeper wins, and CMD runs under that
//! slot alone. A slot that another agent of ours took as well is given
//! back when it would activate.
//!
//! **Waiting** is watch-driven: a release reaches the waiters as a watch
//! event, and the first waiter in the fair queue ([`crate::locks::queue`]) takes
//! it within milliseconds. A semaphore of N slots admits the first N
//! waiters of its queue at once, so N run at the same time.
//!
//! **Once per period** (`once`): before waiting, and again once the lock is
//! held, the `once.<name>` record is read; if it records a run in the
//! current period (UTC on the store's clock, or an explicit key) CMD is not
//! run ([`Outcome::AlreadyDone`]). With [`OnceMode::AtLeast`] a successful
//! run is recorded while the lock is still held, just before the release,
//! so the next holder sees it — unless the lock is lost in between, when it
//! runs CMD again. With [`OnceMode::AtMost`] the period is claimed by a
//! compare-and-swap before CMD starts, so CMD never starts twice in a
//! period.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{self, BoxFuture, FutureExt};
use parking_lot::Mutex;
use putex_core::{
    Agent, AgentConfig, Event, HealthMode, Identity, Input, Instant, KeeperCommand, LockState,
    Observed, Reason, Role, StopKind, Timing, Token,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Notify};

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::host_state::HostState;
use crate::locks::queue::{Ticket, Waiter};
use crate::observe::history::{HistoryWriter, TransitionRecord, WriterConfig};
use crate::store::{keys, AnyStore, Name, NodeId, ReadMode, Store, StoreError};
use crate::supervision::keeper::{KeeperClient, KeeperConfig, KeeperEvent};
use crate::supervision::keeper_queue::KeeperQueue;

mod host;
pub mod kv;
mod limits;
mod once;
mod run;
mod shared;
mod state;

/// How CMD ended: part of [`Outcome::Finished`].
pub use crate::supervision::process::Exit;
pub use limits::{targets, LimitMismatch, SemaphoreRecord};
pub use once::{done_in, period_key, OnceRecord, OnceState};
pub use run::{run, run_with_keeper, KeeperStart, Signals};

/// How long to wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until it is acquired.
    Forever,
    /// At most this long; an acquisition already under way (the fencing gap
    /// of a takeover) is finished.
    For(Duration),
    /// Only if it is free now: held by another, or others queue for it, is
    /// [`Outcome::NotAcquired`] at once.
    No,
}

/// Run once per period across all hosts ([`OnceMode`] says what "once" means).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Once {
    /// Periods of this length aligned to the Unix epoch in UTC on the
    /// store's clock: `24h` is once per UTC day.
    Every(Duration),
    /// An explicit period key (e.g. a date the caller computed).
    Key(String),
}

/// When a run is recorded, and so what `once` guarantees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnceMode {
    /// Record after CMD exits 0, while the lock is still held (the
    /// default): a period is never left without a successful run while
    /// hosts keep trying, but the lock lost between the run and its record
    /// (or CMD stopped half-way because the lock was lost) lets another host
    /// run CMD again in the same period.
    #[default]
    AtLeast,
    /// Claim the period before CMD starts, with a compare-and-swap on the
    /// record, and start CMD only once the claim is known to have landed:
    /// CMD is never started twice in a period, but a run that fails, is
    /// killed or loses the lock uses up the period.
    AtMost,
}

impl OnceMode {
    /// The flag's value (`at-least`, `at-most`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnceMode::AtLeast => "at-least",
            OnceMode::AtMost => "at-most",
        }
    }
}

/// What to run and how.
#[derive(Clone, Debug)]
pub struct SectionOptions {
    /// The lock (or semaphore) name.
    pub name: Name,
    /// This host's node id, written into the lock record and the queue
    /// ticket, and given to CMD as `PUTEX_NODE`.
    pub node: NodeId,
    /// A stable id of the store (URL without secrets), for host-local files.
    pub store_id: String,
    /// Validated timing (R, F, C, ε, timeouts).
    pub timing: Timing,
    /// 1 for a plain lock, N > 1 for a semaphore of N slots.
    pub limit: u32,
    /// How long to wait for the lock before giving up with
    /// [`Outcome::NotAcquired`].
    pub wait: Wait,
    /// Run only once per period across all hosts; `None`: every time.
    pub once: Option<Once>,
    /// When a run counts for `once`.
    pub once_mode: OnceMode,
    /// Stop CMD when it runs longer than this.
    pub max_duration: Option<Duration>,
    /// What the lock is held for, shown to operators and given to CMD as
    /// `PUTEX_TITLE`.
    pub title: Option<String>,
    /// CMD and its arguments (executed directly, not through a shell).
    pub argv: Vec<String>,
    /// Environment for CMD besides what putex sets (`PUTEX_LOCK`,
    /// `PUTEX_NODE`, `PUTEX_TOKEN`, `PUTEX_REVISION`, `PUTEX_EPOCH`, and
    /// `PUTEX_SLOT`, `PUTEX_PREVIOUS`, `PUTEX_TITLE` where they apply);
    /// set after those, so it may override them.
    pub env: Vec<(String, String)>,
    /// Where keeper sockets and the host-state files live.
    pub keeper_dir: PathBuf,
    /// Use a cgroup scope for CMD when possible.
    pub cgroup: bool,
    /// Wait in the fair queue of `name` ([`crate::locks::queue`]).
    pub queue: bool,
    /// Explicit lock keys to compete for, instead of `lock.<name>` or the
    /// semaphore's slots (leased ids: `id.<pool>.<n>`).
    pub slots: Option<Slots>,
    /// Where the section records its series (store calls, unproven stops);
    /// `None`: nowhere.
    pub metrics: Option<crate::observe::metrics::Metrics>,
    /// The program that runs the keeper (`<exe> keeper …`): the putex
    /// binary's path for a program that uses sections as a library;
    /// `None`: this program, which must then be the putex binary.
    pub keeper_exe: Option<PathBuf>,
    /// The process exits when the section ends and uses the store handle
    /// for nothing else (`putex lock`, `putex id --run`): once CMD has
    /// exited the handle is told ([`AnyStore::prepare_exit`]), which on
    /// SQLite takes 7–15 ms off the exit. `false` for a program that goes
    /// on using the handle: its watches would be left to poll.
    pub exits_after: bool,
}

/// Explicit lock keys for [`SectionOptions::slots`]: CMD runs under one of
/// them and gets `var` = that slot's value.
#[derive(Clone, Debug)]
pub struct Slots {
    /// Full store keys of ordinary lock records, e.g. `id.<pool>.<n>`; an
    /// empty list is a usage error.
    pub keys: Vec<String>,
    /// The environment variable naming the slot (e.g. `PUTEX_ID`).
    pub var: String,
    /// `var`'s value for each key, by position (e.g. the id `n`).
    pub values: Vec<String>,
}

/// How a critical section ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// CMD ran and exited; the lock was released if `released`.
    Finished {
        /// CMD's exit status.
        exit: Exit,
        /// The fencing token of the hold CMD ran under (CMD got it as
        /// `PUTEX_TOKEN`).
        token: Token,
        /// Whether a `released` record was written.
        released: bool,
    },
    /// The lock was not acquired (`Wait::No`, or the wait ran out).
    NotAcquired {
        /// The holder's node id and state, e.g. `db1 (active)`, or `an
        /// unreadable record`; `None` if the store could not be read or a
        /// slot was free by then.
        holder: Option<String>,
    },
    /// CMD already ran successfully in this period.
    AlreadyDone {
        /// The current period's key, as in [`OnceRecord::period`].
        period: String,
        /// Who ran it, and when.
        by: String,
    },
    /// The lock was lost while CMD ran; CMD and its tree were stopped.
    Lost {
        /// Why: the core's [`Reason`] for the step down, as text, e.g.
        /// `licence ended without a newer renewal (H1)`.
        reason: String,
    },
    /// CMD ran longer than `max_duration` and was stopped.
    TimedOut {
        /// [`SectionOptions::max_duration`], which CMD outran.
        after: Duration,
        /// Whether a `released` record was written.
        released: bool,
    },
    /// A signal ended the wait before the lock was acquired.
    Interrupted {
        /// The first signal received from [`Signals`] while waiting or
        /// acquiring, e.g. 2 for SIGINT.
        signal: i32,
    },
    /// A stop could not be proven: CMD's tree may still run.
    StopUnproven,
}

/// Why a critical section could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    /// Something asked of the section cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    /// The limit is outside `1..=MAX_LIMIT`.
    #[error("the limit must be between 1 and {MAX_LIMIT} (got {0})")]
    LimitOutOfRange(u32),
    /// The name's limit was defined otherwise by its first client.
    #[error("{0}")]
    LimitMismatch(LimitMismatch),
    /// The name's limit record is not one putex wrote.
    #[error(
        "the limit record {key} holds something putex does not understand ({bytes} bytes); \
         fix or remove it"
    )]
    LimitUnreadable {
        /// The record's key (`sem.<name>`).
        key: String,
        /// The record's size in bytes; its content is not quoted.
        bytes: usize,
    },
    /// The directory for keeper sockets and host files cannot be created.
    #[error("keeper directory {}: {source}", dir.display())]
    KeeperDir {
        /// [`SectionOptions::keeper_dir`], as given.
        dir: PathBuf,
        /// What creating it failed with.
        source: std::io::Error,
    },
    /// The store failed in a way retrying will not fix, or did not answer.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The keeper could not be started, or could not prove a stop.
    #[error("keeper: {0}")]
    Keeper(String),
    /// Another host runs this lock with our node id (S5).
    #[error(
        "another machine ({machine}) uses this lock with the same node id: give each host its \
         own --node (PUTEX_NODE; default: the host name)"
    )]
    DuplicateNode {
        /// The other machine's id.
        machine: String,
    },
}

impl SectionError {
    /// Whether the section refused what it was asked (a name, a limit, a
    /// record in the way) rather than failing to reach its store or keeper:
    /// asking again the same way gets the same answer.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            SectionError::Usage(_)
                | SectionError::LimitOutOfRange(_)
                | SectionError::LimitMismatch(_)
                | SectionError::LimitUnreadable { .. }
                | SectionError::KeeperDir { .. }
        )
    }
}

/// How long `Wait::No` may take to acquire a lock it saw free.
const NO_WAIT_GRACE: Duration = Duration::from_secs(5);

/// How long a section that waits for the lock forever keeps retrying the
/// store calls before its wait (the limit record, the once-per record) while
/// their outcome is unknown: longer than a NATS stream-leader election
/// (4–9 s). `--wait DUR` retries for DUR, `--no-wait` for `NO_WAIT_GRACE`.
const SETUP_PATIENCE: Duration = Duration::from_secs(30);

/// The largest `--limit`: each slot is watched and polled by its own agent.
pub const MAX_LIMIT: u32 = 64;

/// Retries `call` while its outcome is unknown (a timeout or a lost
/// connection: the store may be busy or electing a leader), with back-off,
/// until `deadline`; each attempt's deadline is at most `timeout` and never
/// past `deadline`. A conflict, a configuration error or the last unknown
/// outcome is returned. Only for calls that may simply be repeated (reads);
/// a write must first find out by reading whether it landed.
async fn patiently<T, F, Fut>(
    deadline: tokio::time::Instant,
    timeout: Duration,
    mut call: F,
) -> Result<T, StoreError>
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = Duration::from_millis(50);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match call(timeout.min(left).max(Duration::from_millis(100))).await {
            Err(e @ StoreError::Unknown { .. })
                if tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %e, "outcome unknown; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
