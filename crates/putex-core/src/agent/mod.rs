//! The lease agent: one node's state machine, implementing H1–H6 and S1–S7.
//!
//! [`Agent`] is sans-IO. The driver feeds it time and outcomes through
//! [`Agent::handle`] and [`Agent::handle_timeout`], drains [`Output`]s with
//! [`Agent::poll_output`], and sleeps until [`Agent::poll_timeout`]. Nothing
//! here reads a clock, touches the network or runs a process.
//!
//! # Roles
//!
//! ```text
//!  Starting ──► Standby ──acquire──► Confirming ──G' passed,──► Active
//!                  ▲                     │        keeper armed    │
//!                  │        lost/licence │       unhealthy, exit,│shutdown
//!                  │        ended/step   │                       ▼
//!                  ├─────────────────────┘                 SteppingDown
//!                  │                                  proof ─┘   │ no proof / lost
//!                  │◄── released (H6) ──────────────────────┘    ▼
//!                  └◄────────────── emergency stop done ───── Lapsed
//! ```
//!
//! # Where each rule lives
//!
//! - H1 licence: `Lease::licence_end` is the *send* time of the last
//!   successful write plus T; `expire_licence` ends it.
//! - H2 healthy renewals: `start_round` and `on_health`.
//! - H3/H4 conflicts and unknown outcomes: `on_verify` and `adopt`.
//! - H5 deadlines: `deadline`.
//! - H6 release only with proof: `on_stopped`; a stop that proves nothing
//!   keeps the lease and is retried: `on_unproven_stop`,
//!   `retry_unproven_stop`.
//! - Keeper: nothing starts before it acknowledged the arm: `try_activate`,
//!   `on_keeper_ack`; a dead keeper: `on_keeper`.
//! - S1 two witnesses: `standby_try_acquire` and `probe_verdict`.
//! - S2 confirmation, S3 clean release, S4 absent record: `on_acquired`.
//! - S5 start-up and identity: `start` and `observe_lock`.
//! - S6 store regression: `observe_lock`, `Tenure::floor`.
//! - S7 revocation: records in state `revoked` are lost to holders and stale
//!   to takers.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::mutation::{Mutations, Rule};
use crate::record::{ceil_millis, LockRecord, LockState, Observed, ProbeRecord, RECORD_VERSION};
use crate::store::{
    Entry, Key, OpId, StoreGap, StoreOp, StoreOutcome, StoreRequest, StoreTime, Token,
};
use crate::time::Instant;
use crate::timing::Timing;

/// How many recent lock-record operations are remembered for their late
/// replies.
const RECENT_LOCK_OPS: usize = 32;

/// Who this agent is (S5): node id, machine id and a per-start instance id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The node id (default: hostname; may be an FQDN).
    pub node: String,
    /// The machine id, to detect two hosts configured with one node id.
    pub machine: String,
    /// Unique per start of the agent; write ids are derived from it.
    pub instance: String,
}

/// What this host remembers of the agent's previous instance (S5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousInstance {
    /// The instance id the previous agent saved locally.
    pub instance: String,
    /// Whether the host has not rebooted since (boot id unchanged).
    pub same_boot: bool,
    /// The licence deadline of the previous instance's keeper, if that keeper
    /// is still alive, still runs the service, and was adopted.
    pub keeper_deadline: Option<Instant>,
}

/// Everything an [`Agent`] needs to start.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Who this agent is.
    pub identity: Identity,
    /// Validated timing.
    pub timing: Timing,
    /// The previous instance on this host, if any (S5).
    pub previous: Option<PreviousInstance>,
    /// The highest fencing token this host has persisted for the lock (S6).
    pub highest_token: Option<Token>,
    /// The host's stops are proven by a supervisor that kills the whole
    /// service tree (the keeper of `putex run` and `putex lock`). Only then
    /// does a holder whose record an administrator revoked free it with
    /// `released` once its stop is proven (S7). A program that is its own
    /// service (a library lease, an HTTP client) merely *hears* of the loss:
    /// its revoked record stays for takers to judge after W + G' (H6).
    pub supervised_stops: bool,
    /// Test-only: safety rules switched off to prove the simulation's
    /// checkers catch them. Always empty outside tests.
    #[doc(hidden)]
    pub mutations: Mutations,
}

/// The agent's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Making sure the service is not running before anything else (S5).
    Starting,
    /// Not holding the lock; watching it.
    Standby,
    /// Holding the lock, waiting out the fencing gap before activating (S2).
    Confirming,
    /// Holding the lock and running (or starting) the service.
    Active,
    /// Stopping the service on purpose, still renewing (H2).
    SteppingDown,
    /// The licence ended or the lock was lost: emergency stop under way.
    Lapsed,
    /// The agent has finished; see the [`Output::Exit`] it emitted.
    Exited,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Starting => "starting",
            Role::Standby => "standby",
            Role::Confirming => "confirming",
            Role::Active => "active",
            Role::SteppingDown => "stepping-down",
            Role::Lapsed => "lapsed",
            Role::Exited => "exited",
        })
    }
}

/// Which health check to run; it is passed to the check as its last argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthMode {
    /// The thorough check of a running service.
    Active,
    /// "Could this node take over?"
    Standby,
}

/// Why the service is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopKind {
    /// Before anything else at start-up: make sure it is not running (S5).
    Startup,
    /// On purpose, no time pressure; the holder keeps renewing.
    Graceful,
    /// The licence ended or the lock was lost: must finish within the budget.
    Emergency,
}

/// A hook the agent runs around activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// Fence the previous holder out of the protected resource.
    Fence,
    /// Start the service (or spawn the child).
    Activate,
}

/// Identifies a health check so a late result can be ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CheckId(pub u64);

/// Identifies a stop request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StopId(pub u64);

/// Something that happened outside the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The outcome of a [`StoreRequest`].
    Store {
        /// The request.
        id: OpId,
        /// What became of it.
        outcome: StoreOutcome,
    },
    /// The lock record changed (from a watch); `None` if it was deleted.
    Watch(Option<Entry>),
    /// A health check finished; a timed-out check is `ok: false`.
    Health {
        /// The check.
        id: CheckId,
        /// Whether it passed.
        ok: bool,
    },
    /// A fence or activate hook finished.
    Hook {
        /// Which hook.
        hook: Hook,
        /// Whether it exited 0 in time.
        ok: bool,
    },
    /// A stop finished. `ok` means proof: the hook exited 0, or the child and
    /// all its descendants are gone.
    Stopped {
        /// The stop request.
        id: StopId,
        /// Whether the service is proven stopped.
        ok: bool,
    },
    /// The supervised child exited on its own.
    ServiceExited,
    /// The keeper answered a [`KeeperCommand`]: `ok` when it carried it
    /// out, `false` when it refused it or could not be reached. The service
    /// is started only once the keeper acknowledged the tenure's
    /// [`KeeperCommand::Arm`]: until then nobody would stop it at the
    /// licence deadline if the agent froze.
    KeeperAck {
        /// The command answered.
        command: KeeperCommand,
        /// Whether the keeper carried it out.
        ok: bool,
    },
    /// The keeper reached its deadline and made the emergency stop.
    KeeperFired,
    /// The keeper died.
    KeeperLost,
    /// Stop on purpose (SIGTERM, `systemctl stop`).
    Shutdown,
    /// Whether it is this node's turn to acquire: a host that queues its
    /// waiters fairly (`putex lock`) holds back all but the first. It only
    /// ever delays an acquisition, so it cannot weaken any rule; staleness
    /// is still observed while it is not our turn. Initially `true`.
    Turn(bool),
    /// Give the lock back and stay a standby: a program that takes the same
    /// lock again and again (the lease library's `Lock`). The holder stops
    /// the service gracefully while renewing and writes `released` (H2, H6),
    /// exactly as for [`Input::Shutdown`], but does not exit, and health need
    /// not be re-proven before it acquires again. Pair it with
    /// `Turn(false)` to stay out until asked. Ignored unless holding; while
    /// confirming, the tenure is abandoned without a release (as for a
    /// shutdown: the previous holder may still be inside its gap).
    Release,
}

/// A command for the keeper, the process that owns the service (`docs/supervision.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeeperCommand {
    /// Start a tenure: stop the service at this deadline unless extended.
    Arm(Instant),
    /// Move the deadline; refused by the keeper if its deadline has passed.
    Extend(Instant),
    /// The service was stopped gracefully: no deadline any more.
    Disarm,
}

/// Why the agent exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// Shut down on request.
    Shutdown {
        /// Whether a `released` record was written (fast handover).
        released: bool,
    },
    /// Another machine is running with our node id (S5).
    DuplicateNode {
        /// The other machine's id.
        machine: String,
    },
    /// The start-up deactivation failed: the service may be running.
    StartupStopFailed,
}

/// Why the role changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Start-up finished.
    Started,
    /// Took a free (`released`) record (S3).
    AcquiredReleased,
    /// Took a stale record after both witnesses (S1).
    AcquiredStale {
        /// The revision that went stale.
        revision: Token,
        /// How long this node saw it unchanged, on its own clock (S1 a).
        unchanged_for: Duration,
        /// Its age on the store's clock at the last probe (S1 b); `None`
        /// when the store's clocks could not be compared.
        store_age: Option<Duration>,
    },
    /// Created an absent record, or took one after a store regression (S4/S6).
    AcquiredAbsent,
    /// Took over the previous instance's record (S5).
    Resumed,
    /// The fencing gap passed.
    Activated,
    /// The licence ended without a newer successful write (H1).
    LicenceEnded,
    /// Another writer holds the record, or it is gone or revoked (H3).
    Lost(String),
    /// K failed health checks in a row (H2).
    Unhealthy,
    /// Shutdown requested.
    Shutdown,
    /// The program gave the lock back ([`Input::Release`]).
    ReleaseRequested,
    /// The supervised child exited on its own.
    ServiceExited,
    /// The fence or activate hook failed.
    ActivationFailed,
    /// The keeper refused to arm the tenure's deadline (or could not be
    /// reached): the service is not started unguarded.
    KeeperRefused,
    /// The graceful stop exceeded `--stop-timeout` (H2).
    StopTimedOut,
    /// The graceful stop did not prove the service stopped (H6).
    StopFailed,
    /// The keeper fired.
    KeeperFired,
    /// The keeper died.
    KeeperLost,
    /// The graceful stop finished and a `released` record was written (H6).
    Released,
    /// The graceful stop finished but the release could not be written.
    ReleaseFailed,
    /// The emergency stop finished.
    Stopped,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: &Duration| format!("{:.2}s", d.as_secs_f64());
        match self {
            Reason::Started => f.write_str("started; the service is not running here"),
            Reason::AcquiredReleased => f.write_str("lock released by its holder (S3)"),
            Reason::AcquiredStale {
                revision,
                unchanged_for,
                store_age,
            } => {
                write!(
                    f,
                    "lock stale: rev {revision} unchanged for {}",
                    secs(unchanged_for)
                )?;
                match store_age {
                    Some(age) => write!(f, ", store age {}", secs(age)),
                    None => f.write_str(", store clock not comparable"),
                }
            }
            Reason::AcquiredAbsent => {
                f.write_str("no usable lock record (first use, or the store lost it: S4/S6)")
            }
            Reason::Resumed => f.write_str("resumed this host's previous tenure (S5)"),
            Reason::Activated => f.write_str("fencing gap passed (S2)"),
            Reason::LicenceEnded => f.write_str("licence ended without a newer renewal (H1)"),
            Reason::Lost(why) => write!(f, "lock lost: {why} (H3)"),
            Reason::Unhealthy => f.write_str("health checks failed K times in a row (H2)"),
            Reason::Shutdown => f.write_str("shutdown requested"),
            Reason::ReleaseRequested => f.write_str("release requested"),
            Reason::ServiceExited => f.write_str("the service exited on its own"),
            Reason::ActivationFailed => f.write_str("the fence or activate hook failed"),
            Reason::KeeperRefused => {
                f.write_str("the keeper did not arm the licence deadline; not starting unguarded")
            }
            Reason::StopTimedOut => f.write_str("graceful stop exceeded --stop-timeout (H2)"),
            Reason::StopFailed => {
                f.write_str("graceful stop did not prove the service stopped (H6)")
            }
            Reason::KeeperFired => f.write_str("the keeper reached the licence deadline"),
            Reason::KeeperLost => f.write_str("the keeper died"),
            Reason::Released => f.write_str("service stopped; lock released (H6)"),
            Reason::ReleaseFailed => f.write_str(
                "service stopped; the release could not be written, the lock will go stale",
            ),
            Reason::Stopped => f.write_str("emergency stop finished"),
        }
    }
}

/// Something operators and tests want to know about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The role changed.
    Transition {
        /// Old role.
        from: Role,
        /// New role.
        to: Role,
        /// Why.
        reason: Reason,
        /// The fencing token involved, if any.
        token: Option<Token>,
    },
    /// The store went backwards (S6): a lower revision in the same epoch.
    StoreRegressed {
        /// The highest token seen before.
        highest: Token,
        /// What the store shows now.
        now: Token,
    },
    /// A record advertises a lease above `--max-lease` or a gap above
    /// `--max-gap`.
    AdvertisedTimingAboveMax(String),
    /// A stop did not prove the service stopped: it may still run. The
    /// agent retries the stop every R until one proves it. While
    /// `holding`, it keeps renewing the lease (it is alive and connected,
    /// so the lease is honest) and never writes `released`; otherwise the
    /// lock was lost and only the fencing token protects the resource.
    /// An alarm: operators must look.
    StopUnproven {
        /// The kind of the stop that failed.
        kind: StopKind,
        /// Failed attempts in a row.
        attempts: u32,
        /// Whether the lease is still held (and renewed).
        holding: bool,
    },
    /// A stop proved the service stopped after `after` unproven attempts:
    /// the [`Event::StopUnproven`] alarm is over.
    StopProven {
        /// Failed attempts before this one.
        after: u32,
    },
}

/// Something the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Perform a store operation and report its outcome by the deadline.
    Store(StoreRequest),
    /// Run the health check with `mode` as its last argument; kill it at the
    /// deadline and report failure.
    HealthCheck {
        /// Matches the result.
        id: CheckId,
        /// Which check.
        mode: HealthMode,
        /// Kill it then.
        deadline: Instant,
    },
    /// Run the fence hook.
    Fence {
        /// The fencing token of this tenure.
        token: Token,
        /// The previous holder, if known.
        previous: Option<String>,
        /// Kill it then.
        deadline: Instant,
    },
    /// Run the activate hook (or spawn the child under the keeper).
    Activate {
        /// The fencing token of this tenure.
        token: Token,
        /// The previous holder, if known.
        previous: Option<String>,
        /// Kill it then.
        deadline: Instant,
    },
    /// Stop the service (deactivate hook or the child's whole tree).
    Stop {
        /// Matches [`Input::Stopped`].
        id: StopId,
        /// Graceful, emergency or start-up.
        kind: StopKind,
        /// The stop's time limit.
        deadline: Instant,
    },
    /// Tell the keeper.
    Keeper(KeeperCommand),
    /// Persist this as the highest fencing token seen for the lock (S6).
    PersistHighest(Token),
    /// Worth logging.
    Event(Event),
    /// The agent is done; no more outputs follow.
    Exit(ExitReason),
}

/// Our hold on the lock (H1).
#[derive(Clone, Debug)]
struct Lease {
    /// Token of our latest landed write.
    token: Token,
    /// Its write id.
    write: String,
    /// When that write was sent (`s`).
    sent: Instant,
    /// `s + T`: the licence ends here.
    licence_end: Instant,
}

/// How a tenure began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AcquireKind {
    /// Over a `released` record (S3).
    Released,
    /// Over a stale record (S1, S2).
    Stale,
    /// Record absent, regressed, or from another epoch (S4, S6).
    Absent,
    /// Our previous instance's active record (S5).
    Resume,
}

/// What was written to acquire.
#[derive(Clone, Debug)]
struct Acquire {
    kind: AcquireKind,
    /// T' and G' this tenure owes before activating; advertised while confirming.
    owed_lease: Duration,
    owed_gap: Duration,
    previous: Option<String>,
    /// Why a stale record was judged stale, for the transition's reason.
    evidence: Option<(Duration, Option<Duration>)>,
    /// The highest token seen when the acquisition was sent: activation
    /// needs a higher one (S6). Taken at send time, because our own write
    /// may reach us through the watch before its reply does.
    floor: Option<Token>,
    /// The record this acquisition expected to replace. After a store
    /// rollback a revision can be reused; if that revision turns out to hold
    /// other contents, the CAS may have hit a record we never judged (S6).
    over: Option<(Token, Option<Observed>)>,
    /// Set when, while this acquisition was in flight, its expected revision
    /// showed up with other contents (see `over`).
    reused: bool,
}

/// Where the service is in this tenure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    NotStarted,
    Fencing {
        deadline: Instant,
    },
    /// Fenced; the activation waits for the keeper to acknowledge a
    /// deadline still ahead (see [`KeeperArm::Armed`]).
    Fenced {
        deadline: Instant,
    },
    Starting {
        deadline: Instant,
    },
    Up {
        grace_until: Instant,
    },
}

/// One holding of the lock, from acquisition to stepping down.
#[derive(Clone, Debug)]
struct Tenure {
    acquire: Acquire,
    /// Activate no earlier than this (S2/S3/S4).
    activate_at: Instant,
    /// The highest token seen before this tenure: activation needs a higher
    /// one (S6).
    floor: Option<Token>,
    /// The token of the record that made us active.
    active_token: Option<Token>,
    service: Service,
    /// The keeper's hold on this tenure's deadline.
    keeper: KeeperArm,
}

/// Whether the keeper holds the tenure's licence deadline. A node leaves
/// `confirming` only once it does: nothing may start that nobody would stop
/// at the deadline if the agent froze.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeeperArm {
    NotArmed,
    /// `Arm(at)` sent; give up (and leave `confirming`) at `deadline`.
    Arming {
        at: Instant,
        deadline: Instant,
    },
    /// The keeper acknowledged a deadline of `until` (the latest `Arm` or
    /// `Extend` it said yes to). Nothing starts once `until` has passed:
    /// the keeper has fired, or will, even if our own licence (extended by
    /// a renewal whose `Extend` it has not answered yet) runs on.
    Armed {
        until: Instant,
    },
}

/// What we last saw of the lock record (standby).
#[derive(Clone, Debug)]
struct Seen {
    /// `None` when absent. The store time is `None` only for our own
    /// release, known from its reply, until a read or the watch shows it.
    entry: Option<(Token, Option<StoreTime>)>,
    observed: Option<Observed>,
    /// When we first saw this revision (S1 a).
    first_seen: Instant,
    /// Seen as absent-like: absent, regressed (S6) or a new epoch.
    absent_like: bool,
    /// When a leader read last showed this very record (revision and
    /// contents). A stale takeover needs one after the store-clock witness:
    /// a replica's old view of a revision the store has since lost and
    /// reused would make the CAS displace a record never judged (S1, S6).
    leader_at: Option<Instant>,
}

/// A write whose outcome is unknown (H4).
#[derive(Clone, Debug)]
struct Unconfirmed {
    write: String,
    sent: Instant,
    acquire: Option<Acquire>,
}

#[derive(Clone, Debug)]
enum LockOp {
    /// Standby read (possibly from a replica).
    Poll,
    /// Own-writes read before the next CAS (H4, `then_renew`) or after a
    /// conflict or a foreign write seen by the watch (H3).
    Verify {
        then_renew: bool,
    },
    /// Standby read that must come from the leader (S6 check).
    LeaderPoll,
    Acquire {
        write: String,
        sent: Instant,
        acquire: Box<Acquire>,
    },
    Renew {
        write: String,
        sent: Instant,
    },
    Release {
        write: String,
    },
    /// `released` over an administrator's `revoked` record of our own
    /// tenure, once our stop is proven (S7).
    ReleaseRevoked {
        write: String,
        expected: Token,
    },
}

#[derive(Clone, Debug)]
struct Pending<T> {
    id: OpId,
    deadline: Instant,
    what: T,
}

#[derive(Clone, Debug)]
enum ProbeStep {
    Write,
    Read { token: Token },
}

/// The store-clock witness for one seen revision (S1 b).
#[derive(Clone, Copy, Debug)]
struct ProbeResult {
    for_token: Token,
    time: StoreTime,
    at: Instant,
}

#[derive(Clone, Copy, Debug)]
struct HealthRun {
    id: CheckId,
    mode: HealthMode,
    deadline: Instant,
}

#[derive(Clone, Copy, Debug)]
struct StopRun {
    id: StopId,
    kind: StopKind,
}

/// The startup sequence (S5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartStep {
    /// Adopted keeper: read the record to resume.
    ReadForResume,
    /// Deactivate first.
    Deactivating,
}

/// One node's lease state machine. See the [module docs](self).
#[derive(Debug)]
pub struct Agent {
    id: Identity,
    timing: Timing,
    previous: Option<PreviousInstance>,
    mutations: Mutations,

    role: Role,
    start_step: Option<StartStep>,
    now: Instant,
    next_round: Instant,
    next_op: u64,
    next_write: u64,
    next_check: u64,
    next_stop: u64,

    lease: Option<Lease>,
    tenure: Option<Tenure>,
    unconfirmed: Vec<Unconfirmed>,
    lock_op: Option<Pending<LockOp>>,
    /// The newest lock-record operations sent, to recognise their late
    /// replies (whose tokens still count for S6).
    recent_lock_ops: VecDeque<OpId>,
    probe_op: Option<Pending<ProbeStep>>,
    probe: Option<ProbeResult>,
    seen: Option<Seen>,
    highest: Option<Token>,
    /// The newest token we trust as the store's present; lowered to the
    /// regressed token when the store goes backwards (S6), so that records
    /// written after the regression are judged normally again.
    trusted: Option<Token>,
    /// A record with our node id and another machine id was seen at this token.
    duplicate_seen: Option<Token>,
    /// An administrator revoked our tenure's record at this token while the
    /// service may have run: once the stop is proven, `released` goes over
    /// it, so the next holder need not wait W + G' (S7).
    revoked_over: Option<Token>,
    /// See [`AgentConfig::supervised_stops`].
    supervised_stops: bool,

    health: Option<HealthRun>,
    ok_streak: u32,
    fail_streak: u32,
    /// Consecutive failed `active` checks: K of them step the holder down (H2).
    active_fail_streak: u32,
    /// Health step-downs since the last passing `active` check.
    health_stepdowns: u32,
    /// After a health step-down, no acquisition before this: a service that
    /// is broken everywhere must not rotate the lock forever.
    backoff_until: Option<Instant>,

    stop: Option<StopRun>,
    step_down_deadline: Option<Instant>,
    /// Stops in a row that did not prove the service stopped: it may still
    /// run. Retried every round; while holding, the lease is kept.
    unproven: u32,
    shutdown: bool,
    /// Whether the host lets this node acquire now ([`Input::Turn`]).
    turn: bool,
    /// The current step-down was asked for with [`Input::Release`]: the
    /// standby it ends in need not re-prove its health.
    keep_health: bool,
    /// The service is proven stopped and the release waits for the
    /// renewal in flight, which it would otherwise conflict with.
    release_wanted: bool,

    outputs: VecDeque<Output>,
}

impl Agent {
    /// A new agent, starting at `now`. It begins by making sure the service is
    /// not running, or by resuming an adopted keeper's tenure (S5).
    pub fn new(config: AgentConfig, now: Instant) -> Agent {
        let mut agent = Agent {
            id: config.identity,
            timing: config.timing,
            previous: config.previous,
            mutations: config.mutations,
            role: Role::Starting,
            start_step: None,
            now,
            next_round: now,
            next_op: 0,
            next_write: 0,
            next_check: 0,
            next_stop: 0,
            lease: None,
            tenure: None,
            unconfirmed: Vec::new(),
            lock_op: None,
            recent_lock_ops: VecDeque::new(),
            probe_op: None,
            probe: None,
            seen: None,
            highest: config.highest_token,
            trusted: config.highest_token,
            duplicate_seen: None,
            revoked_over: None,
            supervised_stops: config.supervised_stops,
            health: None,
            ok_streak: 0,
            fail_streak: 0,
            active_fail_streak: 0,
            health_stepdowns: 0,
            backoff_until: None,
            stop: None,
            step_down_deadline: None,
            unproven: 0,
            shutdown: false,
            turn: true,
            keep_health: false,
            release_wanted: false,
            outputs: VecDeque::new(),
        };
        agent.start(now);
        agent
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The node id.
    pub fn identity(&self) -> &Identity {
        &self.id
    }

    /// The timing in force.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The fencing token of the current tenure once active.
    pub fn active_token(&self) -> Option<Token> {
        self.tenure.as_ref().and_then(|t| t.active_token)
    }

    /// When the licence ends, while holding.
    pub fn licence_end(&self) -> Option<Instant> {
        self.lease.as_ref().map(|l| l.licence_end)
    }

    /// Feeds one input at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) {
        if self.role == Role::Exited {
            return;
        }
        self.now = self.now.max(now);
        self.expire_licence();
        match input {
            Input::Store { id, outcome } => self.on_store(id, outcome),
            Input::Watch(entry) => {
                self.on_lock_seen(entry.clone(), false);
                self.note_entry(entry.as_ref());
            }
            Input::Health { id, ok } => self.on_health(id, ok),
            Input::Hook { hook, ok } => self.on_hook(hook, ok),
            Input::Stopped { id, ok } => self.on_stopped(id, ok),
            Input::ServiceExited => self.on_service_exited(),
            Input::KeeperAck { command, ok } => self.on_keeper_ack(command, ok),
            Input::KeeperFired => self.on_keeper(Reason::KeeperFired),
            Input::KeeperLost => self.on_keeper(Reason::KeeperLost),
            Input::Shutdown => self.on_shutdown(),
            Input::Turn(ours) => self.turn = ours,
            Input::Release => self.on_release_request(),
        }
        self.advance();
    }

    /// Advances timers to `now`. Harmless when nothing is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.role == Role::Exited {
            return;
        }
        self.now = self.now.max(now);
        self.expire_licence();
        self.advance();
    }

    /// The next thing for the driver to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When to call [`Agent::handle_timeout`] next; `None` once exited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.role == Role::Exited {
            return None;
        }
        // Anything due at or before `now` was handled by the last call; what
        // is still pending waits for an input, or for the next round.
        let now = self.now;
        let mut next = self.next_round;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t.filter(|t| *t > now) {
                next = next.min(t);
            }
        };
        consider(self.lease.as_ref().map(|l| l.licence_end));
        consider(self.lock_op.as_ref().map(|p| p.deadline));
        consider(self.probe_op.as_ref().map(|p| p.deadline));
        consider(self.health.map(|h| h.deadline));
        consider(self.step_down_deadline);
        if let Some(t) = &self.tenure {
            if self.role == Role::Confirming {
                consider(Some(t.activate_at));
                if let KeeperArm::Arming { deadline, .. } = t.keeper {
                    consider(Some(deadline));
                }
            }
            match t.service {
                Service::Fencing { deadline }
                | Service::Fenced { deadline }
                | Service::Starting { deadline } => consider(Some(deadline)),
                _ => {}
            }
        }
        if self.role == Role::Standby {
            consider(self.staleness_due());
            consider(self.backoff_until);
        }
        Some(next)
    }

    // ----- start-up (S5) -------------------------------------------------

    fn start(&mut self, now: Instant) {
        let adopt = self
            .previous
            .as_ref()
            .and_then(|p| p.keeper_deadline.filter(|d| p.same_boot && now < *d));
        if adopt.is_some() {
            self.start_step = Some(StartStep::ReadForResume);
            self.send_lock(LockOp::LeaderPoll, self.now + self.timing.store_timeout());
        } else {
            self.start_step = Some(StartStep::Deactivating);
            self.begin_stop(StopKind::Startup);
        }
    }

    fn finish_start(&mut self) {
        self.start_step = None;
        self.set_role(Role::Standby, Reason::Started, None);
        self.next_round = self.now;
    }

    /// Called with the leader read made at start-up when a keeper was adopted.
    fn resume_with_keeper(&mut self, entry: Option<Entry>) {
        let prev = self
            .previous
            .clone()
            .expect("resume needs a previous instance");
        let deadline = prev.keeper_deadline.expect("resume needs a keeper");
        let ours = entry
            .as_ref()
            .and_then(|e| match Observed::decode(&e.value) {
                Observed::Record(r)
                    if r.instance == prev.instance
                        && r.node == self.id.node
                        && r.state == LockState::Active =>
                {
                    Some((e.token, r))
                }
                _ => None,
            });
        match ours {
            Some((token, record)) if self.now < deadline => {
                // The service kept running under the keeper: carry on renewing.
                self.note_token(token);
                self.lease = Some(Lease {
                    token,
                    write: record.write.clone(),
                    sent: deadline - self.timing.lease(),
                    licence_end: deadline,
                });
                self.tenure = Some(Tenure {
                    acquire: Acquire {
                        kind: AcquireKind::Resume,
                        owed_lease: self.timing.lease(),
                        owed_gap: self.timing.gap(),
                        previous: None,
                        evidence: None,
                        floor: None,
                        reused: false,
                        over: None,
                    },
                    activate_at: self.now,
                    floor: None,
                    active_token: Some(token),
                    service: Service::Up {
                        grace_until: self.now,
                    },
                    keeper: KeeperArm::Armed { until: deadline },
                });
                self.start_step = None;
                // Resumed: the previous instance has no more say (S5).
                self.previous = None;
                self.set_role(Role::Active, Reason::Resumed, Some(token));
                self.renew_now();
            }
            _ => {
                // Not ours any more: the adopted keeper's service must stop.
                self.start_step = Some(StartStep::Deactivating);
                self.begin_stop(StopKind::Startup);
            }
        }
    }

    // ----- helpers ---------------------------------------------------------

    fn set_role(&mut self, to: Role, reason: Reason, token: Option<Token>) {
        let from = self.role;
        self.role = to;
        self.outputs.push_back(Output::Event(Event::Transition {
            from,
            to,
            reason,
            token,
        }));
    }

    fn op_id(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    fn write_id(&mut self) -> String {
        self.next_write += 1;
        format!("{}-{}", self.id.instance, self.next_write)
    }

    /// H5: a store call's deadline never reaches past the licence.
    fn deadline(&self) -> Instant {
        let d = self.now + self.timing.store_timeout();
        match &self.lease {
            Some(l) => d.min(l.licence_end),
            None => d,
        }
    }

    fn send_lock(&mut self, what: LockOp, deadline: Instant) {
        let id = self.op_id();
        let op = match &what {
            LockOp::Poll => StoreOp::Get {
                key: Key::Lock,
                leader: false,
            },
            LockOp::Verify { .. } | LockOp::LeaderPoll => StoreOp::Get {
                key: Key::Lock,
                leader: true,
            },
            LockOp::Acquire { write, acquire, .. } => {
                let value = self.record(LockState::Confirming, write, Some(acquire));
                match self.seen.as_ref().and_then(|s| s.entry) {
                    Some(_) if self.mutations.is(Rule::TakeoverByPut) => StoreOp::Put {
                        key: Key::Lock,
                        value,
                    },
                    Some((token, _)) => StoreOp::Update {
                        key: Key::Lock,
                        value,
                        expected: token,
                    },
                    None => StoreOp::Create {
                        key: Key::Lock,
                        value,
                    },
                }
            }
            LockOp::Renew { write, .. } => {
                let state = if self.role == Role::Confirming {
                    LockState::Confirming
                } else {
                    LockState::Active
                };
                let acquire = self
                    .tenure
                    .as_ref()
                    .filter(|_| state == LockState::Confirming)
                    .map(|t| t.acquire.clone());
                let value = self.record(state, write, acquire.as_ref());
                StoreOp::Update {
                    key: Key::Lock,
                    value,
                    expected: self.lease.as_ref().expect("renew needs a lease").token,
                }
            }
            LockOp::Release { write } => StoreOp::Update {
                key: Key::Lock,
                value: self.record(LockState::Released, write, None),
                expected: self.lease.as_ref().expect("release needs a lease").token,
            },
            LockOp::ReleaseRevoked { write, expected } => StoreOp::Update {
                key: Key::Lock,
                value: self.record(LockState::Released, write, None),
                expected: *expected,
            },
        };
        self.lock_op = Some(Pending { id, deadline, what });
        if self.recent_lock_ops.len() == RECENT_LOCK_OPS {
            self.recent_lock_ops.pop_front();
        }
        self.recent_lock_ops.push_back(id);
        self.outputs
            .push_back(Output::Store(StoreRequest { id, op, deadline }));
    }

    /// Our record; while confirming it advertises what the tenure still owes.
    fn record(&self, state: LockState, write: &str, owed: Option<&Acquire>) -> Vec<u8> {
        let (lease, gap) = match owed {
            Some(a) => (
                a.owed_lease.max(self.timing.lease()),
                a.owed_gap.max(self.timing.gap()),
            ),
            None => (self.timing.lease(), self.timing.gap()),
        };
        LockRecord {
            v: RECORD_VERSION,
            node: self.id.node.clone(),
            machine: self.id.machine.clone(),
            instance: self.id.instance.clone(),
            state,
            write: write.to_owned(),
            lease_ms: ceil_millis(lease),
            gap_ms: ceil_millis(gap),
        }
        .encode()
    }

    /// Remembers the highest token ever seen (S6).
    fn note_token(&mut self, token: Token) {
        if self.highest.is_none_or(|h| token > h) {
            self.highest = Some(token);
            self.outputs.push_back(Output::PersistHighest(token));
        }
    }

    /// An entry seen by watch or read, in any role: the highest token, and
    /// the store's present as far as it is trusted (S6). A holder's view
    /// counts too: a record it saw while holding or stepping down that the
    /// store later loses must make the rolled-back record it shows then
    /// suspect, never a clean `released` to take at once.
    fn note_entry(&mut self, entry: Option<&Entry>) {
        if let Some(e) = entry {
            self.note_token(e.token);
            if self
                .trusted
                .is_none_or(|t| t.epoch == e.token.epoch && t < e.token)
                && !self.mutations.is(Rule::HolderViewUntrusted)
            {
                self.trusted = Some(e.token);
            }
        }
    }

    fn holding(&self) -> bool {
        matches!(
            self.role,
            Role::Confirming | Role::Active | Role::SteppingDown
        ) && self.lease.is_some()
    }

    /// Whether the service may be running in this role.
    fn service_may_run(&self) -> bool {
        matches!(self.role, Role::Active | Role::SteppingDown)
    }

    // ----- time ----------------------------------------------------------------

    /// H1: when the licence ends without a newer success, stop at once.
    fn expire_licence(&mut self) {
        let Some(lease) = &self.lease else { return };
        if self.now < lease.licence_end || !self.holding() {
            return;
        }
        let token = lease.token;
        self.lose(Reason::LicenceEnded, Some(token));
    }

    fn advance(&mut self) {
        if self.role == Role::Exited {
            return;
        }
        // Expire store calls, checks and hooks whose deadline passed.
        if let Some(p) = &self.lock_op {
            if self.now >= p.deadline {
                let id = p.id;
                self.on_store(id, StoreOutcome::Unknown);
            }
        }
        if let Some(p) = &self.probe_op {
            if self.now >= p.deadline {
                let id = p.id;
                self.on_store(id, StoreOutcome::Unknown);
            }
        }
        if let Some(h) = self.health {
            if self.now >= h.deadline {
                self.on_health(h.id, false);
            }
        }
        if let Some(t) = &self.tenure {
            match (t.service, t.keeper) {
                (_, KeeperArm::Arming { deadline, .. })
                    if self.now >= deadline && self.role == Role::Confirming =>
                {
                    self.leave_confirming(Reason::KeeperRefused);
                }
                (
                    Service::Fencing { deadline }
                    | Service::Fenced { deadline }
                    | Service::Starting { deadline },
                    _,
                ) if self.now >= deadline && self.role == Role::Active => {
                    self.step_down(Reason::ActivationFailed);
                }
                _ => {}
            }
        }
        // H2: a graceful stop past --stop-timeout becomes an emergency stop,
        // made while the lease is still renewed: the lease ends only once
        // the service is proven stopped (then released, H6), never on
        // purpose while it may still run.
        if let Some(d) = self.step_down_deadline {
            if self.now >= d && self.role == Role::SteppingDown {
                self.step_down_deadline = None;
                if self.mutations.is(Rule::UnprovenStopLetsGo) {
                    self.lose(Reason::StopTimedOut, None);
                } else {
                    self.begin_stop(StopKind::Emergency);
                }
            }
        }
        if self.role == Role::Confirming {
            self.try_activate();
        }
        if self.release_wanted && self.lock_op.is_none() && self.role == Role::SteppingDown {
            self.write_release();
        }
        if self.now >= self.next_round {
            // The first round boundary after now, skipping the rounds a
            // stall or suspend missed: computed, not stepped, so that a tiny
            // R after a long sleep costs no time (and a saturated clock no
            // endless loop).
            let renew = self.timing.renew().as_nanos().max(1);
            let behind = u128::from(self.now.as_nanos() - self.next_round.as_nanos());
            let next = u128::from(self.next_round.as_nanos()) + (behind / renew + 1) * renew;
            self.next_round = Instant::from_nanos(u64::try_from(next).unwrap_or(u64::MAX));
            self.start_round();
        }
        if self.role == Role::Standby {
            self.standby_try_acquire();
        }
    }

    // ----- rounds (H2) ---------------------------------------------------------

    fn start_round(&mut self) {
        match self.role {
            Role::Standby => {
                self.start_health(HealthMode::Standby);
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::Poll, self.deadline());
                }
            }
            Role::Confirming => self.start_health(HealthMode::Standby),
            Role::Active => {
                let mode = match self.tenure.as_ref().map(|t| t.service) {
                    Some(Service::Up { grace_until }) if self.now >= grace_until => {
                        HealthMode::Active
                    }
                    _ => HealthMode::Standby,
                };
                self.start_health(mode);
            }
            // During a graceful stop the holder renews without health checks;
            // a stop that proved nothing is tried again, as urgently as it
            // gets.
            Role::SteppingDown => {
                self.renew_now();
                self.retry_unproven_stop();
            }
            Role::Lapsed => self.retry_unproven_stop(),
            Role::Starting | Role::Exited => {}
        }
    }

    fn start_health(&mut self, mode: HealthMode) {
        if let Some(h) = self.health {
            // Still running from the last round: it missed its deadline.
            self.on_health(h.id, false);
        }
        self.next_check += 1;
        let id = CheckId(self.next_check);
        let deadline = self.now + self.timing.healthcheck_timeout();
        self.health = Some(HealthRun { id, mode, deadline });
        self.outputs
            .push_back(Output::HealthCheck { id, mode, deadline });
    }

    fn on_health(&mut self, id: CheckId, ok: bool) {
        let Some(run) = self.health else { return };
        if run.id != id {
            return;
        }
        self.health = None;
        if ok {
            self.ok_streak = self.ok_streak.saturating_add(1);
            self.fail_streak = 0;
        } else {
            self.fail_streak = self.fail_streak.saturating_add(1);
            self.ok_streak = 0;
        }
        // Only `active` checks count towards K: a service still starting
        // (standby checks during activation and --start-grace) is not unhealthy.
        if run.mode == HealthMode::Active {
            self.active_fail_streak = if ok { 0 } else { self.active_fail_streak + 1 };
            if ok {
                self.health_stepdowns = 0;
            }
        }
        match self.role {
            Role::Confirming | Role::Active if ok => self.renew_now(),
            Role::Confirming if self.fail_streak >= self.timing.unhealthy() => {
                // Leaving confirming: it never activated, so no release (H6).
                self.back_off();
                self.leave_confirming(Reason::Unhealthy);
            }
            Role::Active
                if run.mode == HealthMode::Active
                    && self.active_fail_streak >= self.timing.unhealthy() =>
            {
                self.back_off();
                self.step_down(Reason::Unhealthy);
            }
            _ => {}
        }
    }

    // ----- holder: renewals (H1, H3, H4, H5) ---------------------------------

    fn renew_now(&mut self) {
        if self.lock_op.is_some() || self.lease.is_none() {
            return; // the previous write is still out; it is bounded by its deadline
        }
        if self.unconfirmed.is_empty() {
            self.send_renew();
        } else {
            // H4: before the next CAS, see whether an unknown write landed.
            self.send_lock(LockOp::Verify { then_renew: true }, self.deadline());
        }
    }

    fn send_renew(&mut self) {
        let write = self.write_id();
        let sent = self.now;
        self.send_lock(LockOp::Renew { write, sent }, self.deadline());
    }

    fn on_store(&mut self, id: OpId, outcome: StoreOutcome) {
        if let Some(p) = &self.probe_op {
            if p.id == id {
                let step = self.probe_op.take().expect("checked").what;
                self.on_probe(step, outcome);
                return;
            }
        }
        if self.lock_op.as_ref().is_none_or(|p| p.id != id) {
            // A late or duplicated reply: acted on no more, but a record it
            // shows existed, and S6 remembers the highest token ever seen.
            if let (true, StoreOutcome::Read(Some(e))) =
                (self.recent_lock_ops.contains(&id), &outcome)
            {
                let token = e.token;
                self.note_token(token);
            }
            return;
        }
        let what = self.lock_op.take().expect("checked").what;
        match what {
            LockOp::Poll => {
                if let StoreOutcome::Read(entry) = outcome {
                    self.on_lock_seen(entry.clone(), false);
                    self.note_entry(entry.as_ref());
                }
            }
            LockOp::LeaderPoll => {
                if let StoreOutcome::Read(entry) = outcome {
                    if self.start_step == Some(StartStep::ReadForResume) {
                        self.resume_with_keeper(entry);
                    } else {
                        self.on_lock_seen(entry.clone(), true);
                        self.note_entry(entry.as_ref());
                    }
                } else if self.start_step == Some(StartStep::ReadForResume) {
                    // Retry within the keeper's deadline; otherwise deactivate.
                    let deadline = self.now + self.timing.store_timeout();
                    let keeper = self.previous.as_ref().and_then(|p| p.keeper_deadline);
                    if keeper.is_some_and(|k| deadline < k) {
                        self.send_lock(LockOp::LeaderPoll, deadline);
                    } else {
                        self.start_step = Some(StartStep::Deactivating);
                        self.begin_stop(StopKind::Startup);
                    }
                }
            }
            LockOp::Verify { then_renew } => {
                // Anything but a read: try again next round; the licence keeps running.
                if let StoreOutcome::Read(entry) = outcome {
                    self.on_verify(entry, then_renew);
                }
            }
            LockOp::Acquire {
                write,
                sent,
                acquire,
            } => self.on_acquire_outcome(write, sent, *acquire, outcome),
            LockOp::Renew { write, sent } => self.on_renew_outcome(write, sent, outcome),
            LockOp::Release { write } => self.on_release_outcome(&write, outcome),
            LockOp::ReleaseRevoked { .. } => {
                if let StoreOutcome::Written(t) = outcome {
                    self.note_token(t);
                }
                if self.shutdown {
                    let released = matches!(outcome, StoreOutcome::Written(_));
                    self.exit(ExitReason::Shutdown { released });
                }
            }
        }
    }

    fn on_renew_outcome(&mut self, write: String, sent: Instant, outcome: StoreOutcome) {
        if !self.holding() {
            return; // H1: an ack after the licence ended restores nothing
        }
        match outcome {
            StoreOutcome::Written(token) => {
                let from = if self.mutations.is(Rule::LicenceFromAck) {
                    self.now
                } else {
                    sent
                };
                self.extend(token, write, from);
            }
            StoreOutcome::Conflict => {
                self.send_lock(LockOp::Verify { then_renew: false }, self.deadline())
            }
            StoreOutcome::Unknown | StoreOutcome::Failed(_) => {
                self.unconfirmed.push(Unconfirmed {
                    write,
                    sent,
                    acquire: None,
                });
            }
            StoreOutcome::Read(_) => {}
        }
    }

    /// A write of ours landed: the licence runs from its send time (H1).
    fn extend(&mut self, token: Token, write: String, sent: Instant) {
        self.note_token(token);
        // Our own landed writes are the store's present too (S6 detection).
        if self
            .trusted
            .is_none_or(|t| t.epoch == token.epoch && t < token)
        {
            self.trusted = Some(token);
        }
        let licence_end = sent + self.timing.lease();
        let lease = self.lease.as_mut().expect("extend needs a lease");
        if token <= lease.token {
            return;
        }
        lease.token = token;
        lease.write = write;
        lease.sent = sent;
        lease.licence_end = lease.licence_end.max(licence_end);
        self.unconfirmed.clear();
        let armed = self
            .tenure
            .as_ref()
            .is_some_and(|t| matches!(t.keeper, KeeperArm::Armed { .. }));
        if self.service_may_run() || armed {
            let end = self.lease.as_ref().expect("present").licence_end;
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Extend(end)));
        }
    }

    /// H3/H4: an own-writes read after a conflict or before the next CAS.
    fn on_verify(&mut self, entry: Option<Entry>, then_renew: bool) {
        if !self.holding() {
            // A standby verifying an acquisition whose outcome was unknown.
            self.on_lock_seen(entry.clone(), true);
            self.note_entry(entry.as_ref());
            return;
        }
        let lease_token = self.lease.as_ref().expect("holding").token;
        let Some(entry) = entry else {
            return self.lose(Reason::Lost("record absent".into()), Some(lease_token));
        };
        if entry.token.epoch != lease_token.epoch {
            return self.lose(Reason::Lost("bucket re-created".into()), Some(lease_token));
        }
        if entry.token < lease_token {
            // S6: the store lost our writes. Stop, and remember what it shows
            // now as an absent-like record.
            self.trusted = Some(self.trusted.map_or(lease_token, |t| t.max(lease_token)));
            self.lose(Reason::Lost("store regressed".into()), Some(lease_token));
            self.on_lock_seen(Some(entry), true);
            return;
        }
        if entry.token == lease_token && !self.is_lease_write(&entry) {
            // Our revision, someone else's write: the store lost our write
            // and handed the revision out again (S6).
            self.outputs.push_back(Output::Event(Event::StoreRegressed {
                highest: self.highest.unwrap_or(lease_token),
                now: entry.token,
            }));
            self.lose(
                Reason::Lost("store reused our revision".into()),
                Some(lease_token),
            );
            self.on_lock_seen(Some(entry), true);
            return;
        }
        if entry.token == lease_token {
            // Nothing of ours has landed (yet): go on with the CAS. Should an
            // unknown write land later, the CAS conflicts and the next own-writes
            // read adopts it (it stays in `unconfirmed`).
            if then_renew {
                self.send_renew();
            }
            return;
        }
        self.note_token(entry.token);
        let record = Observed::decode(&entry.value);
        let landed = record.record().and_then(|r| {
            (r.instance == self.id.instance && r.state != LockState::Revoked)
                .then(|| {
                    self.unconfirmed
                        .iter()
                        .find(|u| u.write == r.write)
                        .cloned()
                })
                .flatten()
        });
        match landed {
            Some(u) if !self.mutations.is(Rule::OwnWriteIsForeign) => {
                // H4: our write landed; adopt it with its send time. Renew now
                // only if this read was part of a healthy round (H2).
                self.extend(entry.token, u.write, u.sent);
                if then_renew {
                    self.send_renew();
                }
            }
            _ => {
                if let Some(r) = record.record() {
                    if r.state == LockState::Revoked
                        && r.instance == self.id.instance
                        && self.supervised_stops
                    {
                        self.revoked_over = Some(entry.token);
                    }
                }
                let why = match record.record() {
                    Some(r) if r.state == LockState::Revoked => "revoked".to_owned(),
                    Some(r) => format!("held by {} ({})", r.node, r.write),
                    None => "record unreadable".to_owned(),
                };
                self.lose(Reason::Lost(why), Some(lease_token));
            }
        }
    }

    /// The lock is lost or the licence ended: emergency stop if the service
    /// may run, and forget the lease.
    fn lose(&mut self, reason: Reason, token: Option<Token>) {
        let service = self.service_may_run();
        let armed_idle = !service
            && self.tenure.as_ref().is_some_and(|t| {
                matches!(t.keeper, KeeperArm::Armed { .. } | KeeperArm::Arming { .. })
            });
        if armed_idle {
            // Nothing started under the keeper: it has nothing to guard.
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Disarm));
        }
        self.lease = None;
        self.tenure = None;
        // What a standby saw before this tenure is stale; judge afresh (S1).
        self.seen = None;
        self.probe = None;
        self.unconfirmed.clear();
        self.lock_op = None;
        self.release_wanted = false;
        self.keep_health = false;
        self.step_down_deadline = None;
        self.ok_streak = 0;
        if service {
            self.set_role(Role::Lapsed, reason, token);
            self.begin_stop(StopKind::Emergency);
        } else {
            // Nothing of ours ran: a revoked record stays for takers to
            // judge (the holder we displaced may still be stopping, H6).
            self.revoked_over = None;
            self.set_role(Role::Standby, reason, token);
            if self.shutdown {
                self.exit(ExitReason::Shutdown { released: false });
            }
        }
    }

    fn leave_confirming(&mut self, reason: Reason) {
        if self.mutations.is(Rule::ReleaseFromConfirming) {
            if let Some(lease) = &self.lease {
                if self.lock_op.is_none() && self.now < lease.licence_end {
                    let write = self.write_id();
                    self.send_lock(LockOp::Release { write }, self.deadline());
                }
            }
            let token = self.lease.as_ref().map(|l| l.token);
            self.lease = None;
            self.tenure = None;
            self.unconfirmed.clear();
            self.ok_streak = 0;
            self.set_role(Role::Standby, reason, token);
            return;
        }
        let unstarted_s3 = self
            .tenure
            .as_ref()
            .is_some_and(|t| t.acquire.kind == AcquireKind::Released);
        if unstarted_s3 && self.lease.is_some() {
            return self.give_back_unstarted(reason);
        }
        self.lose(reason, None);
    }

    /// H6 refinement: a tenure taken over a `released` record (S3) that
    /// started nothing may be given back. It owes no gap (its predecessor
    /// proved its stop before releasing) and nothing of ours ran, so the
    /// proof H6 asks for holds; letting it go stale instead would cost every
    /// other node W. Used when such a tenure leaves `confirming` before it
    /// activated (a shutdown or release while the keeper's acknowledgement
    /// is on its way, or a refused arm).
    fn give_back_unstarted(&mut self, reason: Reason) {
        let token = self.lease.as_ref().map(|l| l.token);
        let armed = self
            .tenure
            .as_ref()
            .is_some_and(|t| t.keeper != KeeperArm::NotArmed);
        if armed {
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Disarm));
        }
        // Stepping down with nothing to stop: renewing until the release
        // lands, exactly as after a proven graceful stop.
        self.set_role(Role::SteppingDown, reason, token);
        self.step_down_deadline = Some(self.now + self.timing.stop_timeout());
        self.release_wanted = false;
        self.health = None;
        self.write_release();
    }

    // ----- holder: activation (S2, S3, S6) -------------------------------------

    fn try_activate(&mut self) {
        let (Some(lease), Some(tenure)) = (&self.lease, &self.tenure) else {
            return;
        };
        if self.now < tenure.activate_at || self.now >= lease.licence_end {
            return;
        }
        // S6: never act on a token that is not above everything seen before.
        if tenure.floor.is_some_and(|f| lease.token <= f) {
            return;
        }
        // S2: a renewal that conflicted (or a foreign write seen meanwhile) is
        // being checked; activate only once it is settled in our favour.
        if matches!(
            self.lock_op.as_ref().map(|p| &p.what),
            Some(LockOp::Verify { .. })
        ) {
            return;
        }
        let token = lease.token;
        let licence_end = lease.licence_end;
        let previous = tenure.acquire.previous.clone();
        // The keeper must hold the licence deadline before anything starts:
        // ask it, and stay `confirming` (renewing) until it acknowledges
        // (`on_keeper_ack`).
        let unguarded = self.mutations.is(Rule::ActivateBeforeArmed);
        match tenure.keeper {
            // The keeper's acknowledged deadline has passed: it fires (or
            // has fired), whatever our licence says; an acknowledged
            // extension lets us go on, its refusal ends the tenure.
            KeeperArm::Armed { until } if self.now >= until && !unguarded => return,
            KeeperArm::Armed { .. } => {}
            KeeperArm::Arming { .. } => return,
            KeeperArm::NotArmed => {
                let deadline = self.now + self.timing.activate_timeout();
                self.tenure.as_mut().expect("present").keeper = KeeperArm::Arming {
                    at: licence_end,
                    deadline,
                };
                self.outputs
                    .push_back(Output::Keeper(KeeperCommand::Arm(licence_end)));
                if !unguarded {
                    return;
                }
            }
        }
        let deadline = self.now + self.timing.activate_timeout();
        let tenure = self.tenure.as_mut().expect("present");
        tenure.active_token = Some(token);
        tenure.service = Service::Fencing { deadline };
        self.active_fail_streak = 0;
        self.set_role(Role::Active, Reason::Activated, Some(token));
        self.outputs.push_back(Output::Fence {
            token,
            previous,
            deadline,
        });
    }

    /// The keeper answered. The answer to the tenure's `Arm` lets the node
    /// activate (once everything else allows it); a refusal, or no answer
    /// by the activate timeout, means it never does — it leaves
    /// `confirming` (no release, H6). An acknowledged `Extend` moves the
    /// keeper's deadline on, which an activation waits for once the last
    /// acknowledged one has passed. A refused `Extend` needs nothing here:
    /// the keeper fires and says so.
    fn on_keeper_ack(&mut self, command: KeeperCommand, ok: bool) {
        let armed = match command {
            KeeperCommand::Arm(at) => at,
            KeeperCommand::Extend(to) => {
                if let Some(tenure) = self.tenure.as_mut() {
                    if let (true, KeeperArm::Armed { until }) = (ok, &mut tenure.keeper) {
                        *until = (*until).max(to);
                    }
                }
                return self.continue_activation();
            }
            KeeperCommand::Disarm => return,
        };
        if self.role != Role::Confirming {
            return;
        }
        let Some(tenure) = self.tenure.as_mut() else {
            return;
        };
        let KeeperArm::Arming { at, .. } = tenure.keeper else {
            return;
        };
        if at != armed {
            return; // an earlier tenure's answer
        }
        if !ok {
            tenure.keeper = KeeperArm::NotArmed;
            return self.leave_confirming(Reason::KeeperRefused);
        }
        tenure.keeper = KeeperArm::Armed { until: at };
        // Renewals since the `Arm` moved the licence on: tell the keeper.
        let end = self.lease.as_ref().map(|l| l.licence_end);
        if let Some(end) = end.filter(|e| *e > at) {
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Extend(end)));
        }
        self.try_activate();
    }

    /// Whether the keeper's acknowledged deadline is still ahead: the
    /// condition for starting anything.
    fn keeper_guards(&self) -> bool {
        self.mutations.is(Rule::ActivateBeforeArmed)
            || self
                .tenure
                .as_ref()
                .is_some_and(|t| matches!(t.keeper, KeeperArm::Armed { until } if self.now < until))
    }

    /// An activation held back for the keeper (its acknowledged deadline
    /// had passed) goes on once it is ahead again.
    fn continue_activation(&mut self) {
        match self.role {
            Role::Confirming => self.try_activate(),
            Role::Active if self.keeper_guards() => {
                let Some(tenure) = self.tenure.as_mut() else {
                    return;
                };
                if let Service::Fenced { deadline } = tenure.service {
                    let token = tenure.active_token.expect("active has a token");
                    let previous = tenure.acquire.previous.clone();
                    tenure.service = Service::Starting { deadline };
                    self.outputs.push_back(Output::Activate {
                        token,
                        previous,
                        deadline,
                    });
                }
            }
            _ => {}
        }
    }

    fn on_hook(&mut self, hook: Hook, ok: bool) {
        if self.role != Role::Active {
            return;
        }
        let Some(tenure) = self.tenure.as_mut() else {
            return;
        };
        let token = tenure.active_token.expect("active has a token");
        match (hook, tenure.service, ok) {
            (Hook::Fence, Service::Fencing { .. }, true) => {
                let _ = token;
                let deadline = self.now + self.timing.activate_timeout();
                tenure.service = Service::Fenced { deadline };
                // Only under a keeper whose deadline is ahead (else once an
                // extension is acknowledged: `continue_activation`).
                self.continue_activation();
            }
            (Hook::Activate, Service::Starting { .. }, true) => {
                tenure.service = Service::Up {
                    grace_until: self.now + self.timing.start_grace(),
                };
                self.fail_streak = 0;
            }
            (_, Service::Fencing { .. } | Service::Starting { .. }, false) => {
                self.step_down(Reason::ActivationFailed)
            }
            _ => {}
        }
    }

    fn on_service_exited(&mut self) {
        if self.role == Role::Active {
            self.step_down(Reason::ServiceExited);
        }
    }

    // ----- stopping (H2, H6) --------------------------------------------------

    fn begin_stop(&mut self, kind: StopKind) {
        if let Some(s) = self.stop {
            if s.kind == StopKind::Emergency || s.kind == kind {
                return; // already stopping at least this urgently
            }
        }
        self.next_stop += 1;
        let id = StopId(self.next_stop);
        let limit = match kind {
            StopKind::Emergency => self.timing.emergency_timeout(),
            StopKind::Graceful | StopKind::Startup => self.timing.stop_timeout(),
        };
        self.stop = Some(StopRun { id, kind });
        self.outputs.push_back(Output::Stop {
            id,
            kind,
            deadline: self.now + limit,
        });
    }

    /// Stop on purpose: graceful stop while renewing, then release (H2, H6).
    fn step_down(&mut self, reason: Reason) {
        self.step_down_with(reason, StopKind::Graceful);
    }

    /// Stop on purpose with a stop of `kind`, renewing the lease until the
    /// stop is proven; then release (H6). An emergency kind is for a holder
    /// whose keeper died: nothing else guards the deadline any more.
    fn step_down_with(&mut self, reason: Reason, kind: StopKind) {
        if self.role != Role::Active {
            return;
        }
        let token = self.lease.as_ref().map(|l| l.token);
        self.set_role(Role::SteppingDown, reason, token);
        self.step_down_deadline = Some(self.now + self.timing.stop_timeout());
        self.release_wanted = false;
        self.keep_health = false;
        self.health = None;
        if self.mutations.is(Rule::ReleaseWithoutProof) {
            self.write_release();
        }
        self.begin_stop(kind);
    }

    /// A stop that proved nothing is tried again (emergency kind) at the
    /// next round, for as long as it takes.
    fn retry_unproven_stop(&mut self) {
        if self.unproven > 0 && self.stop.is_none() {
            self.begin_stop(StopKind::Emergency);
        }
    }

    /// A stop did not prove the service stopped: it may still run. Alarm,
    /// and try again every round. A holder keeps its lease (renewing, no
    /// health checks, no release): it is alive and connected, so the lease
    /// is honest, and letting it lapse would let a standby start a second
    /// service. One that already lost the lock can only retry.
    fn on_unproven_stop(&mut self, kind: StopKind) {
        self.unproven = self.unproven.saturating_add(1);
        let holding = self.role == Role::SteppingDown && self.lease.is_some();
        self.outputs.push_back(Output::Event(Event::StopUnproven {
            kind,
            attempts: self.unproven,
            holding,
        }));
        if holding {
            if self.mutations.is(Rule::UnprovenStopLetsGo) {
                // The rule switched off: give the lease up and stop as a
                // lapsed holder would.
                return self.lose(Reason::StopFailed, None);
            }
            // No deadline any more: the lease is kept until the proof.
            self.step_down_deadline = None;
        }
    }

    fn on_stopped(&mut self, id: StopId, ok: bool) {
        let Some(run) = self.stop else { return };
        if run.id != id {
            return;
        }
        self.stop = None;
        match self.role {
            Role::Starting => {
                if !ok {
                    return self.exit(ExitReason::StartupStopFailed);
                }
                self.outputs
                    .push_back(Output::Keeper(KeeperCommand::Disarm));
                self.finish_start();
                if self.shutdown {
                    // Asked to stop while the start-up stop ran.
                    return self.exit(ExitReason::Shutdown { released: false });
                }
                self.resume_without_keeper_check();
            }
            Role::SteppingDown | Role::Lapsed if !ok => self.on_unproven_stop(run.kind),
            Role::SteppingDown => {
                self.note_proven();
                // H6: proven stopped (the graceful stop, or a later one that
                // escalated it): release.
                self.outputs
                    .push_back(Output::Keeper(KeeperCommand::Disarm));
                self.write_release();
            }
            Role::Lapsed => {
                self.note_proven();
                // Nothing left for the keeper to guard.
                self.outputs
                    .push_back(Output::Keeper(KeeperCommand::Disarm));
                let release = self.revoked_over.take().filter(|_| self.lock_op.is_none());
                self.set_role(Role::Standby, Reason::Stopped, None);
                if let Some(expected) = release {
                    // S7: our stop is proven; free the revoked record at
                    // once (a shutdown exits once this is answered).
                    let write = self.write_id();
                    self.send_lock(LockOp::ReleaseRevoked { write, expected }, self.deadline());
                    return;
                }
                if self.shutdown {
                    self.exit(ExitReason::Shutdown { released: false });
                }
            }
            _ => {}
        }
    }

    fn note_proven(&mut self) {
        if self.unproven > 0 {
            let after = std::mem::take(&mut self.unproven);
            self.outputs
                .push_back(Output::Event(Event::StopProven { after }));
        }
    }

    /// Stops in a row that proved nothing; 0 when the last stop was proven.
    /// While it is above 0 the service may still run (see
    /// [`Event::StopUnproven`]).
    pub fn unproven_stops(&self) -> u32 {
        self.unproven
    }

    fn write_release(&mut self) {
        self.release_wanted = false;
        let Some(lease) = &self.lease else { return };
        if self.now >= lease.licence_end {
            return;
        }
        // A renewal (or its own-writes read) still out would make the
        // release conflict if it landed: wait for it, within its deadline.
        if matches!(
            self.lock_op.as_ref().map(|p| &p.what),
            Some(LockOp::Renew { .. } | LockOp::Verify { .. })
        ) {
            self.release_wanted = true;
            return;
        }
        // Anything else outstanding is abandoned: if a write of ours lands
        // anyway, the release conflicts and the lock goes stale the slow,
        // safe way (H6).
        let until = lease.licence_end;
        self.lock_op = None;
        let write = self.write_id();
        // The stop is behind us and nothing else is left to do: the release
        // may take until the licence ends (a busy store answers a write
        // after the usual store timeout more often than not), and every
        // waiter gains from it landing instead of waiting W + G'.
        self.send_lock(LockOp::Release { write }, until);
    }

    fn on_release_outcome(&mut self, write: &str, outcome: StoreOutcome) {
        if self.role != Role::SteppingDown {
            return;
        }
        let token = self.lease.as_ref().map(|l| l.token);
        let released = matches!(outcome, StoreOutcome::Written(_));
        if let StoreOutcome::Written(t) = outcome {
            self.note_token(t);
        }
        if !released && self.mutations.is(Rule::ReleaseWithoutProof) {
            return;
        }
        self.lease = None;
        self.tenure = None;
        self.unconfirmed.clear();
        self.step_down_deadline = None;
        if !std::mem::take(&mut self.keep_health) {
            self.ok_streak = 0;
        }
        // What a standby saw before this tenure is stale. The store's reply
        // says what the record is now: our `released` record at the new
        // revision (its store time comes with the next read or watch event).
        // A standby may take it over at once (S3); should anything have
        // changed meanwhile, the CAS finds out.
        self.probe = None;
        self.seen = match outcome {
            StoreOutcome::Written(t) => {
                if self.trusted.is_none_or(|x| x.epoch == t.epoch && x < t) {
                    self.trusted = Some(t);
                }
                Some(Seen {
                    entry: Some((t, None)),
                    observed: Some(Observed::decode(&self.record(
                        LockState::Released,
                        write,
                        None,
                    ))),
                    first_seen: self.now,
                    absent_like: false,
                    leader_at: None,
                })
            }
            _ => None,
        };
        let reason = if released {
            Reason::Released
        } else {
            Reason::ReleaseFailed
        };
        if self.stop.is_some() {
            // Release-without-proof mutation: the stop is still running.
            self.set_role(Role::Lapsed, reason, token);
            return;
        }
        self.set_role(Role::Standby, reason, token);
        if self.shutdown {
            self.exit(ExitReason::Shutdown { released });
        }
    }

    fn on_release_request(&mut self) {
        match self.role {
            Role::Active => {
                self.step_down(Reason::ReleaseRequested);
                self.keep_health = true;
            }
            Role::Confirming => self.leave_confirming(Reason::ReleaseRequested),
            _ => {} // not holding, or already stepping down or stopping
        }
    }

    /// The keeper fired (the licence ended at its deadline: the tenure is
    /// over) or died. A holder whose keeper died stops the service itself
    /// and steps down *while still renewing*: the lease ends only once the
    /// stop is proven (then released, H6), never on purpose while the
    /// service may run without its dead-man's switch.
    fn on_keeper(&mut self, reason: Reason) {
        let keeps_lease =
            reason == Reason::KeeperLost && !self.mutations.is(Rule::UnprovenStopLetsGo);
        match self.role {
            Role::Active if keeps_lease => self.step_down_with(reason, StopKind::Emergency),
            // A stop through the keeper falls back to one without it; with
            // none running, one is due now.
            Role::SteppingDown if keeps_lease && self.stop.is_none() => {
                self.begin_stop(StopKind::Emergency);
            }
            Role::SteppingDown if keeps_lease => {}
            Role::Lapsed => self.begin_stop(StopKind::Emergency),
            _ if self.holding() => {
                let token = self.lease.as_ref().map(|l| l.token);
                self.lose(reason, token);
            }
            _ => {}
        }
    }

    fn on_shutdown(&mut self) {
        self.shutdown = true;
        match self.role {
            Role::Active => self.step_down(Reason::Shutdown),
            Role::Confirming => self.leave_confirming(Reason::Shutdown),
            Role::Standby => self.exit(ExitReason::Shutdown { released: false }),
            Role::Starting if self.stop.is_none() => {
                self.exit(ExitReason::Shutdown { released: false })
            }
            _ => {} // finishes when the running stop does
        }
    }

    fn exit(&mut self, reason: ExitReason) {
        if self.role != Role::Exited {
            let from = self.role;
            self.role = Role::Exited;
            self.outputs.push_back(Output::Event(Event::Transition {
                from,
                to: Role::Exited,
                reason: Reason::Shutdown,
                token: None,
            }));
            self.outputs.push_back(Output::Exit(reason));
        }
    }

    // ----- standby: observing and acquiring (S1–S6) ---------------------------

    /// After start-up without an adopted keeper: a record of our previous
    /// instance that was `active` on this boot is resumed after G (S5).
    fn resume_without_keeper_check(&mut self) {
        if self.lock_op.is_none() {
            self.send_lock(LockOp::LeaderPoll, self.deadline());
        }
    }

    fn on_lock_seen(&mut self, entry: Option<Entry>, leader: bool) {
        if self.role == Role::Exited {
            return;
        }
        if self.holding() {
            self.check_replaced(entry.as_ref());
            self.holder_sees(entry);
            return;
        }
        let observed = entry.as_ref().map(|e| Observed::decode(&e.value));
        // S6: the revision our in-flight acquisition expects, with other
        // contents: the store reused it, and the CAS may hit a record we
        // never judged. Remember it for when the reply comes (our own write
        // may be seen before that reply and replace what we saw).
        if let (
            Some(e),
            Some(Pending {
                what: LockOp::Acquire { acquire, .. },
                ..
            }),
        ) = (&entry, self.lock_op.as_mut())
        {
            if let Some((t, expected)) = &acquire.over {
                if *t == e.token && observed.as_ref() != expected.as_ref() {
                    acquire.reused = true;
                }
            }
        }
        // S5: a live record with our node id from another machine.
        if let (Some(e), Some(Observed::Record(r))) = (&entry, &observed) {
            if r.node == self.id.node
                && r.machine != self.id.machine
                && matches!(r.state, LockState::Active | LockState::Confirming)
            {
                match self.duplicate_seen {
                    Some(t) if t != e.token => {
                        return self.exit(ExitReason::DuplicateNode {
                            machine: r.machine.clone(),
                        })
                    }
                    _ => self.duplicate_seen = Some(e.token),
                }
            }
        }
        // H4: an acquisition of ours whose outcome was unknown has landed.
        if let Some(e) = &entry {
            if self.role == Role::Standby && self.adopt_acquisition(e) {
                return;
            }
        }
        let mut absent_like = entry.is_none();
        if let Some(e) = &entry {
            match self.trusted {
                Some(t) if e.token.epoch == t.epoch && e.token < t => {
                    if !leader {
                        // Maybe a lagging replica; ask the leader.
                        if self.lock_op.is_none() && self.role == Role::Standby {
                            self.send_lock(LockOp::LeaderPoll, self.deadline());
                        }
                        return;
                    }
                    // S6: the store went backwards; never trust what it lost.
                    self.outputs.push_back(Output::Event(Event::StoreRegressed {
                        highest: self.highest.unwrap_or(t),
                        now: e.token,
                    }));
                    absent_like = true;
                    self.trusted = Some(e.token);
                }
                Some(t) if e.token.epoch < t.epoch => return, // an old incarnation, seen late
                Some(t) if e.token.epoch > t.epoch => {
                    // S6: a re-created bucket counts as an absent record.
                    absent_like = true;
                    self.trusted = Some(e.token);
                }
                _ => self.trusted = Some(self.trusted.map_or(e.token, |t| t.max(e.token))),
            }
        }
        let key = entry.as_ref().map(|e| (e.token, Some(e.time)));
        // After a rollback a revision can be reused by another write: the
        // same revision with other contents is a new record (S1 a restarts).
        let same = self
            .seen
            .as_ref()
            .is_some_and(|s| s.entry == key && s.observed == observed);
        // Our own release, known from its reply, now with its store time.
        let timed = match (&mut self.seen, &key) {
            (Some(s), Some((t, time))) if s.observed == observed => match &mut s.entry {
                Some((st, stime @ None)) if st == t => {
                    *stime = *time;
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !same && !timed {
            if let Some(Observed::Record(r)) = &observed {
                if let Some(w) = self.timing.advertised_timing_warning(r.lease(), r.gap()) {
                    self.outputs
                        .push_back(Output::Event(Event::AdvertisedTimingAboveMax(w)));
                }
            }
            self.seen = Some(Seen {
                entry: key,
                observed,
                first_seen: self.now,
                absent_like,
                leader_at: leader.then_some(self.now),
            });
            self.probe = None;
            self.probe_op = None;
        } else if leader {
            if let Some(s) = self.seen.as_mut() {
                s.leader_at = Some(self.now);
            }
        }
    }

    /// Whether `entry` is the write our lease runs on (same write id).
    fn is_lease_write(&self, entry: &Entry) -> bool {
        let Some(lease) = &self.lease else {
            return false;
        };
        matches!(Observed::decode(&entry.value), Observed::Record(r) if r.write == lease.write)
    }

    /// While confirming: if the revision our acquisition replaced shows up
    /// with other contents, the store reused it (S6): wait as for an absent
    /// record, counted from now.
    fn check_replaced(&mut self, entry: Option<&Entry>) {
        if self.role != Role::Confirming {
            return;
        }
        let Some(e) = entry else { return };
        // Another writer's record at our own revision, seen after our write
        // was acknowledged: the store lost that acknowledged write (a
        // rollback) and handed its revision to us. Its writer may believe it
        // holds the lock until it reads ours: owe what an absent record
        // owes, counted from now (S6).
        let lease_token = self.lease.as_ref().map(|l| l.token);
        if Some(e.token) == lease_token && !self.is_lease_write(e) {
            let Some(tenure) = self.tenure.as_mut() else {
                return;
            };
            let mut acquire = tenure.acquire.clone();
            self.downgrade_to_absent(&mut acquire, e.token);
            let wait = self.absent_wait(&acquire);
            let tenure = self.tenure.as_mut().expect("present");
            tenure.activate_at = tenure.activate_at.max(self.now + wait);
            tenure.acquire = acquire;
            return;
        }
        let Some(tenure) = self.tenure.as_mut() else {
            return;
        };
        let Some((t, expected)) = &tenure.acquire.over else {
            return;
        };
        if e.token != *t || Some(Observed::decode(&e.value)) == *expected {
            return;
        }
        let t = *t;
        let mut acquire = tenure.acquire.clone();
        acquire.over = None;
        self.downgrade_to_absent(&mut acquire, t);
        let wait = self.absent_wait(&acquire);
        let tenure = self.tenure.as_mut().expect("present");
        tenure.activate_at = tenure.activate_at.max(self.now + wait);
        tenure.acquire = acquire;
    }

    /// A holder sees the record change under it (from a watch or poll).
    fn holder_sees(&mut self, entry: Option<Entry>) {
        let Some(lease) = &self.lease else { return };
        if let Some(e) = &entry {
            if e.token == lease.token && self.is_lease_write(e) {
                return;
            }
            let ours = matches!(Observed::decode(&e.value), Observed::Record(r) if r.instance == self.id.instance);
            if ours && e.token.epoch == lease.token.epoch && e.token < lease.token {
                return; // one of our own earlier writes, seen late
            }
        }
        // Anything else — a newer write (ours, H4, or someone else's, H3), a
        // foreign record below our token or in another epoch (a regression,
        // S6), or the record gone — is for the leader read to judge.
        if self.lock_op.is_none() {
            self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
        }
    }

    /// S5 without an adopted keeper: our previous instance's active record on
    /// this boot is taken over and activated after G instead of W.
    fn maybe_resume_without_keeper(&mut self) {
        let Some(prev) = self.previous.clone() else {
            return;
        };
        let Some(seen) = &self.seen else { return };
        // A record that reached us through a regression is not evidence of
        // anything (S6): it is judged as absent, never resumed.
        let resumable = prev.same_boot
            && !seen.absent_like
            && matches!(&seen.observed, Some(Observed::Record(r))
                if r.instance == prev.instance && r.node == self.id.node
                    && r.machine == self.id.machine && r.state == LockState::Active);
        // Only the first look counts: afterwards the record is judged normally.
        self.previous = None;
        if !resumable || self.lock_op.is_some() {
            return;
        }
        self.acquire(Acquire {
            kind: AcquireKind::Resume,
            owed_lease: self.timing.lease(),
            owed_gap: self.timing.gap(),
            previous: None,
            evidence: None,
            floor: None,
            reused: false,
            over: None,
        });
    }

    /// When the standby should look again at a stale-looking record.
    fn staleness_due(&self) -> Option<Instant> {
        let seen = self.seen.as_ref()?;
        if seen.absent_like || self.lock_op.is_some() || self.probe_op.is_some() {
            return None;
        }
        if let Some(Observed::Record(r)) = &seen.observed {
            if r.state == LockState::Released {
                return None;
            }
        }
        let w = self.wait_for(seen);
        let a = seen.first_seen + w;
        match self.probe {
            Some(p) if Some(p.for_token) == seen.entry.map(|x| x.0) => {
                Some(a.max(p.at + self.timing.renew()))
            }
            _ => Some(a),
        }
    }

    /// W for what we see: T' is the larger of ours and the advertised T, or
    /// `--max-lease` when the holder's T is unknown (S1, S4).
    fn wait_for(&self, seen: &Seen) -> Duration {
        let lease = match &seen.observed {
            Some(Observed::Record(r)) if !self.mutations.is(Rule::IgnoreAdvertisedLease) => {
                self.timing.lease_against(r.lease())
            }
            Some(Observed::Record(_)) => self.timing.lease(),
            Some(Observed::Garbage) | None => self.timing.lease_unknown().max(self.timing.lease()),
        };
        if self.mutations.is(Rule::NoDriftFactor) {
            lease
        } else {
            self.timing.staleness_wait(lease)
        }
    }

    fn eligible(&self) -> bool {
        self.role == Role::Standby
            && !self.shutdown
            && self.turn
            && self.ok_streak >= self.timing.successes()
            && self.lock_op.is_none()
            && self.backoff_until.is_none_or(|b| self.now >= b)
    }

    /// After a health step-down: wait T, doubling with each repeat up to 16 T,
    /// before acquiring again. A passing `active` check resets the count.
    fn back_off(&mut self) {
        self.health_stepdowns = self.health_stepdowns.saturating_add(1);
        let factor = 1u32 << (self.health_stepdowns.min(5) - 1);
        self.backoff_until = Some(self.now + self.timing.lease() * factor);
    }

    /// When a node that stepped down for health may acquire again.
    pub fn backoff_until(&self) -> Option<Instant> {
        self.backoff_until.filter(|b| *b > self.now)
    }

    fn standby_try_acquire(&mut self) {
        if !self.eligible() {
            return;
        }
        if self.previous.is_some() {
            self.maybe_resume_without_keeper();
            if self.lock_op.is_some() {
                return;
            }
        }
        let Some(seen) = self.seen.clone() else {
            return;
        };
        let gap_of = |t: &Timing, o: &Option<Observed>| match o {
            Some(Observed::Record(r)) => t.gap_against(r.gap()),
            _ => t.gap_unknown(),
        };
        let previous = seen
            .observed
            .as_ref()
            .and_then(|o| o.record())
            .map(|r| r.node.clone());
        if seen.absent_like {
            // S4/S6: take it, then wait W (T' = --max-lease or own T) + G'
            // (--max-gap or own G): a holder whose record is gone may not
            // know it yet. A record that survived a regression still
            // advertises timing: use the larger values, as for any taker.
            let (owed_lease, owed_gap) = match seen.observed.as_ref().and_then(|o| o.record()) {
                Some(r) => (
                    self.timing.lease_unknown().max(r.lease()),
                    self.timing.gap_unknown().max(r.gap()),
                ),
                None => (self.timing.lease_unknown(), self.timing.gap_unknown()),
            };
            return self.acquire(Acquire {
                kind: AcquireKind::Absent,
                owed_lease,
                owed_gap,
                previous,
                evidence: None,
                floor: None,
                reused: false,
                over: None,
            });
        }
        let released =
            matches!(&seen.observed, Some(Observed::Record(r)) if r.state == LockState::Released);
        if released {
            // S3: the previous holder proved it stopped.
            return self.acquire(Acquire {
                kind: AcquireKind::Released,
                owed_lease: self.timing.lease(),
                owed_gap: Duration::ZERO,
                previous,
                evidence: None,
                floor: None,
                reused: false,
                over: None,
            });
        }
        // S1: held, revoked or unreadable — two witnesses of staleness.
        let w = self.wait_for(&seen);
        if self.now < seen.first_seen + w {
            return;
        }
        match self.probe_verdict(&seen, w) {
            ProbeVerdict::Stale
                if !self.mutations.is(Rule::StaleTakeoverUnconfirmed)
                    && self
                        .probe
                        .is_some_and(|p| seen.leader_at.is_none_or(|t| t < p.at)) =>
            {
                // The record as the leader has it now, after the witness:
                // the same revision with other contents restarts S1 (a).
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::LeaderPoll, self.deadline());
                }
            }
            ProbeVerdict::Stale => {
                let owed_gap = gap_of(&self.timing, &seen.observed);
                let unchanged_for = self.now.saturating_since(seen.first_seen);
                let store_age = match (self.probe, seen.entry) {
                    (Some(p), Some((_, Some(time)))) => match p.time.gap_since(time) {
                        StoreGap::Forward(age) => Some(age),
                        StoreGap::Backwards | StoreGap::Unbounded => None,
                    },
                    _ => None,
                };
                self.acquire(Acquire {
                    kind: AcquireKind::Stale,
                    owed_lease: self.timing.lease(),
                    owed_gap,
                    previous,
                    evidence: Some((unchanged_for, store_age)),
                    floor: None,
                    reused: false,
                    over: None,
                });
            }
            ProbeVerdict::Probe => {
                if self.probe_op.is_none() {
                    let write = self.write_id();
                    let value = ProbeRecord {
                        v: RECORD_VERSION,
                        node: self.id.node.clone(),
                        write,
                    }
                    .encode();
                    let id = self.op_id();
                    let deadline = self.deadline();
                    self.probe_op = Some(Pending {
                        id,
                        deadline,
                        what: ProbeStep::Write,
                    });
                    self.outputs.push_back(Output::Store(StoreRequest {
                        id,
                        op: StoreOp::Put {
                            key: Key::Probe,
                            value,
                        },
                        deadline,
                    }));
                }
            }
            ProbeVerdict::Wait => {}
            ProbeVerdict::ReadFirst => {
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::LeaderPoll, self.deadline());
                }
            }
        }
    }

    /// S1 (b): does the store's clock agree that W has passed?
    fn probe_verdict(&self, seen: &Seen, w: Duration) -> ProbeVerdict {
        let token = seen.entry.expect("held records have a token").0;
        let Some(p) = self.probe.filter(|p| p.for_token == token) else {
            return ProbeVerdict::Probe;
        };
        let Some(record_time) = seen.entry.expect("present").1 else {
            return ProbeVerdict::ReadFirst;
        };
        let needed = if self.mutations.is(Rule::ProbeWitnessLease) {
            match &seen.observed {
                Some(Observed::Record(r)) => self.timing.lease_against(r.lease()),
                _ => self.timing.lease(),
            }
        } else {
            w
        };
        match p.time.gap_since(record_time) {
            StoreGap::Unbounded => ProbeVerdict::Stale,
            StoreGap::Forward(g) if g >= needed => ProbeVerdict::Stale,
            // The store's clock went backwards: (b) is met after a further W of (a).
            StoreGap::Backwards if self.now >= seen.first_seen + w + w => ProbeVerdict::Stale,
            _ if self.now >= p.at + self.timing.renew() => ProbeVerdict::Probe,
            _ => ProbeVerdict::Wait,
        }
    }

    fn on_probe(&mut self, step: ProbeStep, outcome: StoreOutcome) {
        match (step, outcome) {
            (ProbeStep::Write, StoreOutcome::Written(token)) => {
                let id = self.op_id();
                let deadline = self.deadline();
                self.probe_op = Some(Pending {
                    id,
                    deadline,
                    what: ProbeStep::Read { token },
                });
                self.outputs.push_back(Output::Store(StoreRequest {
                    id,
                    op: StoreOp::Get {
                        key: Key::Probe,
                        leader: true,
                    },
                    deadline,
                }));
            }
            (ProbeStep::Read { token }, StoreOutcome::Read(Some(e))) if e.token == token => {
                if let Some(seen) = &self.seen {
                    if let Some((t, _)) = seen.entry {
                        self.probe = Some(ProbeResult {
                            for_token: t,
                            time: e.time,
                            at: self.now,
                        });
                    }
                }
            }
            _ => {} // try again on the next look
        }
    }

    fn acquire(&mut self, mut acquire: Acquire) {
        acquire.floor = self.highest;
        acquire.over = self
            .seen
            .as_ref()
            .and_then(|s| s.entry.map(|(t, _)| (t, s.observed.clone())));
        let write = self.write_id();
        let sent = self.now;
        let deadline = self.deadline();
        self.send_lock(
            LockOp::Acquire {
                write,
                sent,
                acquire: Box::new(acquire),
            },
            deadline,
        );
    }

    fn on_acquire_outcome(
        &mut self,
        write: String,
        sent: Instant,
        acquire: Acquire,
        outcome: StoreOutcome,
    ) {
        if self.role != Role::Standby {
            return;
        }
        match outcome {
            StoreOutcome::Written(token) => self.on_acquired(token, write, sent, acquire),
            StoreOutcome::Conflict => {
                // Someone else moved first; look again at the leader.
                self.seen = None;
                self.send_lock(LockOp::LeaderPoll, self.deadline());
            }
            StoreOutcome::Unknown | StoreOutcome::Failed(_) => {
                self.unconfirmed.push(Unconfirmed {
                    write,
                    sent,
                    acquire: Some(acquire),
                });
                self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
            }
            StoreOutcome::Read(_) => {}
        }
    }

    /// S2/S3/S4: the acquisition landed; work out when we may activate.
    fn on_acquired(&mut self, token: Token, write: String, sent: Instant, mut acquire: Acquire) {
        let floor = acquire.floor;
        // Our new revision already seen holding someone else's write: the
        // store lost that write and handed its revision to us (S6).
        let ours_reused = self.seen.as_ref().is_some_and(|s| {
            s.entry.is_some_and(|(t, _)| t == token)
                && !matches!(&s.observed, Some(Observed::Record(r)) if r.write == write)
        });
        let reused = match (&acquire.over, &self.seen) {
            _ if ours_reused => Some(token),
            (Some((t, _)), _) if acquire.reused => Some(*t),
            (Some((t, expected)), Some(seen))
                if seen.entry.map(|x| x.0) == Some(*t) && &seen.observed != expected =>
            {
                Some(*t)
            }
            _ => None,
        };
        if let Some(t) = reused {
            self.downgrade_to_absent(&mut acquire, t);
        }
        self.note_token(token);
        let licence_start = if self.mutations.is(Rule::LicenceFromAck) {
            self.now
        } else {
            sent
        };
        let licence_end = licence_start + self.timing.lease();
        if self.now >= licence_end {
            return;
        }
        let no_gap = self.mutations.is(Rule::NoGap);
        let wait = match acquire.kind {
            AcquireKind::Released => Duration::ZERO,
            _ if no_gap => Duration::ZERO,
            AcquireKind::Stale => acquire.owed_gap,
            AcquireKind::Resume => self.timing.gap(),
            AcquireKind::Absent => self.absent_wait(&acquire),
        };
        self.lease = Some(Lease {
            token,
            write,
            sent: licence_start,
            licence_end,
        });
        self.unconfirmed.clear();
        self.probe = None;
        self.probe_op = None;
        let reason = match acquire.kind {
            AcquireKind::Released => Reason::AcquiredReleased,
            AcquireKind::Stale => {
                let (unchanged_for, store_age) = acquire.evidence.unwrap_or_default();
                Reason::AcquiredStale {
                    revision: acquire.over.as_ref().map_or(token, |o| o.0),
                    unchanged_for,
                    store_age,
                }
            }
            AcquireKind::Absent => Reason::AcquiredAbsent,
            AcquireKind::Resume => Reason::Resumed,
        };
        self.tenure = Some(Tenure {
            acquire,
            activate_at: self.now + wait,
            floor,
            active_token: None,
            service: Service::NotStarted,
            keeper: KeeperArm::NotArmed,
        });
        self.fail_streak = 0;
        self.set_role(Role::Confirming, reason, Some(token));
        // A foreign write newer than ours was already seen while the reply
        // was on its way: settle it with an own-writes read before
        // activating (H3; `try_activate` waits for the read).
        let newer = self.seen.as_ref().is_some_and(|s| {
            s.entry
                .is_some_and(|(t, _)| t.epoch == token.epoch && t > token)
                && !matches!(&s.observed, Some(Observed::Record(r)) if r.instance == self.id.instance)
        });
        if newer && self.lock_op.is_none() {
            self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
        }
        self.try_activate();
    }

    /// S4: W for T' = the owed lease, then the owed gap.
    fn absent_wait(&self, acquire: &Acquire) -> Duration {
        let lease = if self.mutations.is(Rule::NoDriftFactor) {
            acquire.owed_lease
        } else {
            self.timing.staleness_wait(acquire.owed_lease)
        };
        lease + acquire.owed_gap
    }

    /// The record our CAS replaced was not the one we judged: the store
    /// reused a revision after losing writes (S6). Owe what an absent record
    /// owes: W(--max-lease or own T) + G.
    fn downgrade_to_absent(&mut self, acquire: &mut Acquire, token: Token) {
        self.outputs.push_back(Output::Event(Event::StoreRegressed {
            highest: self.highest.unwrap_or(token),
            now: token,
        }));
        acquire.kind = AcquireKind::Absent;
        acquire.owed_lease = acquire.owed_lease.max(self.timing.lease_unknown());
        acquire.owed_gap = acquire.owed_gap.max(self.timing.gap_unknown());
    }

    /// A standby's own-writes read after an acquisition with unknown outcome.
    fn adopt_acquisition(&mut self, entry: &Entry) -> bool {
        let Observed::Record(r) = Observed::decode(&entry.value) else {
            return false;
        };
        if r.instance != self.id.instance || r.state != LockState::Confirming {
            return false;
        }
        let Some(u) = self
            .unconfirmed
            .iter()
            .find(|u| u.write == r.write)
            .cloned()
        else {
            return false;
        };
        let Some(acquire) = u.acquire else {
            return false;
        };
        if self.now >= u.sent + self.timing.lease() {
            return false;
        }
        self.lock_op = None;
        self.on_acquired(entry.token, u.write, u.sent, acquire);
        true
    }
}

enum ProbeVerdict {
    Stale,
    Probe,
    Wait,
    /// The record's store time is not known yet: read it first.
    ReadFirst,
}
