//! The agent's vocabulary: roles, inputs, outputs, events and reasons.

use std::fmt;
use std::time::Duration;

use crate::record::Pause;
use crate::store::{Entry, OpId, StoreOutcome, StoreRequest, Token};
use crate::time::Instant;

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
    /// Resynchronise with the current holder after a tenure of ours that
    /// ended without a proven clean release (O4; `--rejoin`).
    Rejoin,
}

/// What another member publishes about itself (O3), as its host last read
/// it from the store. Only members whose record is fresh are passed in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its node id.
    pub node: String,
    /// Its `--priority`: 0 never takes over; higher is preferred.
    pub priority: u32,
    /// Its last `--position` (e.g. a replay LSN in bytes); `None` when it
    /// has none or its position command failed.
    pub position: Option<u64>,
    /// It says it could take over now: its standby checks pass, its rejoin
    /// is done and it is not backing off after a health step-down.
    pub ready: bool,
    /// Its machine id, if its agent says (F2: failsafe's set names members
    /// by node and machine; a member without one is left out of it, and
    /// counts as outside the set).
    pub machine: Option<String>,
}

/// Why this node would not take the lock over now: what `putex status`
/// shows as "why not".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// `--priority 0`: never takes over.
    PriorityZero,
    /// Its standby checks do not pass (yet).
    Unhealthy,
    /// Its position is this far behind the highest published one, more
    /// than `--max-lag` allows; `None` when its own position is unknown.
    Lagging(Option<u64>),
    /// Its previous tenure ended without a proven clean release and its
    /// rejoin hook has not succeeded yet (O4).
    Rejoining,
    /// The holder paused failover (O2).
    Paused,
    /// Stepped down for health recently; acquires again at this time.
    BackingOff(Instant),
    /// The record is released to another node by a switchover (O1).
    HandedTo(String),
    /// This node holds the lock, renewing it (its record changed within
    /// the last two rounds): nothing to take over.
    HeldBy(String),
    /// A better candidate acts first (O3).
    Deferring(String),
    /// The record is not stale yet (S1): this much of W is left.
    Waiting(Duration),
    /// Not this node's turn (a fair queue holds it back).
    NotItsTurn,
    /// Shutting down.
    ShuttingDown,
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::PriorityZero => f.write_str("priority 0"),
            Blocker::Unhealthy => f.write_str("unhealthy"),
            Blocker::Lagging(Some(by)) => write!(f, "lagging {by}"),
            Blocker::Lagging(None) => f.write_str("position unknown"),
            Blocker::Rejoining => f.write_str("rejoining"),
            Blocker::Paused => f.write_str("paused"),
            Blocker::BackingOff(_) => f.write_str("backing off after a health step-down"),
            Blocker::HandedTo(node) => write!(f, "handed over to {node}"),
            Blocker::HeldBy(node) => write!(f, "held by {node}"),
            Blocker::Deferring(node) => write!(f, "deferring to {node}"),
            Blocker::Waiting(left) => {
                write!(f, "waiting for W: {:.1} s left", left.as_secs_f64())
            }
            Blocker::NotItsTurn => f.write_str("not its turn"),
            Blocker::ShuttingDown => f.write_str("shutting down"),
        }
    }
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
    /// Stop on purpose (SIGTERM, `systemctl stop`). While failover is
    /// paused (O2) the agent exits without stopping anything or releasing:
    /// the paused record stays, and nobody takes over until a resume.
    Shutdown,
    /// The other members, as last read from the store (O3): whom to defer
    /// to, whom a switchover may go to, how far behind this node is.
    Members(Vec<Candidate>),
    /// This node's own position (`--position`); `None` if unknown.
    Position(Option<u64>),
    /// O1: hand the lock over to `to` (or, if `None`, the best eligible
    /// candidate): checked, then a graceful stop and a release that names
    /// the target. Refused with [`Event::SwitchoverRefused`] when the
    /// target does not qualify or this node is not active — except on a
    /// standby named as `to` with `allow_lag`: an operator's override of
    /// `--max-lag` for a lock nobody may take (until it next acquires; the
    /// staleness rules still hold).
    Switchover {
        /// The target node, or the best candidate.
        to: Option<String>,
        /// Accept a target beyond `--max-lag` (`--allow-lag`).
        allow_lag: bool,
    },
    /// O2: pause failover. Applied by an active holder through its record;
    /// remembered otherwise and applied when this node becomes active.
    Pause(Pause),
    /// O2: end a pause.
    Resume,
    /// F1 (failsafe): a holder asks this member for a grant during a store
    /// outage; answered at once with [`Output::FailsafeAnswer`].
    Failsafe(FailsafeRequest),
    /// F3 (failsafe): who granted the round [`Output::FailsafeAsk`] asked
    /// for, once every answer is in or the round's deadline passed; a
    /// member not named did not grant.
    FailsafeVerdicts {
        /// The round.
        round: u64,
        /// The members that granted it.
        granted: Vec<crate::record::FailsafeMember>,
    },
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
    /// No deadline any more: the service was stopped gracefully, or
    /// failover is paused and the operator owns the service (O2).
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
    /// Took back this node's own paused record after a restart, without a
    /// start-up stop: failover is paused and the operator owns the service
    /// (O2).
    ResumedPaused,
    /// The fencing gap passed.
    Activated,
    /// The licence ended without a newer successful write (H1).
    LicenceEnded,
    /// Another writer holds the record, or it is gone or revoked (H3).
    Lost(LossCause),
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
    /// A switchover to this node (O1).
    Switchover {
        /// The target.
        to: String,
    },
    /// Took a record released to this node by a switchover (O1).
    AcquiredHandover,
    /// A failback: a switchover to a preferred member that has been ready
    /// for the whole hold-down (O5).
    Failback {
        /// The preferred member.
        to: String,
    },
}

/// Why a holder lost its lock (H3, S6, S7): what its own-writes read
/// found instead of its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The record is gone.
    RecordAbsent,
    /// The bucket or file was re-created: the record is of another epoch.
    StoreRecreated,
    /// The store went back to an older revision than ours (S6).
    StoreRegressed,
    /// The store handed our revision out again, for someone else's write (S6).
    RevisionReused,
    /// An operator revoked the lock (S7).
    Revoked,
    /// Another node's write holds the record.
    HeldBy {
        /// Its node id.
        node: String,
        /// Its write id.
        write: String,
    },
    /// The record cannot be read (garbage, or a format from the future).
    Unreadable,
}

impl fmt::Display for LossCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossCause::RecordAbsent => f.write_str("record absent"),
            LossCause::StoreRecreated => f.write_str("bucket re-created"),
            LossCause::StoreRegressed => f.write_str("store regressed"),
            LossCause::RevisionReused => f.write_str("store reused our revision"),
            LossCause::Revoked => f.write_str("revoked"),
            LossCause::HeldBy { node, write } => write!(f, "held by {node} ({write})"),
            LossCause::Unreadable => f.write_str("record unreadable"),
        }
    }
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
            Reason::ResumedPaused => f.write_str(
                "took back this node's paused record after a restart; nothing stopped (O2)",
            ),
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
            Reason::Switchover { to } => write!(f, "switchover to {to} (O1)"),
            Reason::AcquiredHandover => f.write_str("lock handed over to this node (O1)"),
            Reason::Failback { to } => {
                write!(
                    f,
                    "failback to {to}, preferred and ready for the hold-down (O5)"
                )
            }
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
    /// A switchover was not started (O1): the holder stays.
    SwitchoverRefused {
        /// The target asked for, if any.
        to: Option<String>,
        /// Why, for people.
        why: String,
    },
    /// The holder's paused record landed (O2): the keeper is disarmed,
    /// nothing is stopped or started, nobody takes over.
    Paused(Pause),
    /// The keeper is armed again and the holder writes its record without
    /// the pause (O2): failover works again.
    Unpaused,
    /// The keeper would not arm again: the pause stays (O2).
    ResumeRefused,
    /// The rejoin hook succeeded: this node may take over again (O4).
    Rejoined,
    /// The tenure holds the lock but waits `wait` (on this node's clock,
    /// from now) before it may start anything, in case a holder whose
    /// record the store lost or never showed is still running (S4, S6).
    /// Hosts say so: a wait of W + G' must never pass in silence.
    AbsentWait {
        /// How long the activation waits from now.
        wait: Duration,
        /// Why it waits.
        why: AbsentWhy,
    },
}

/// Why a tenure owes the absent-record wait ([`Event::AbsentWait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbsentWhy {
    /// The lock record was absent: this name's first use on this store, or
    /// its record was removed, and the store cannot prove that no holder's
    /// record was lost (S4).
    FirstUse,
    /// The store proves the lock record was not there for a while, but for
    /// less than W + G': the store was made (or, on etcd, its proof began)
    /// moments ago, and a holder of a store it replaced, or whose record was
    /// lost before that, could still be running (S4).
    YoungStore,
    /// The store lost records this node saw, or handed a revision out twice
    /// (S6): a holder may believe it still holds the lock.
    StoreWentBack,
}

impl AbsentWhy {
    /// For people: what the wait is for, and where the rule is explained.
    pub fn explain(self) -> &'static str {
        match self {
            AbsentWhy::FirstUse => {
                "its record is absent (the name's first use on this store, or a record \
                 someone removed) and this store cannot prove that no holder's record was \
                 lost, so such a holder could still be running; later runs start at once \
                 (docs/safety.md, S4)"
            }
            AbsentWhy::YoungStore => {
                "the store was made moments ago (on etcd: its proof that names were unused \
                 began moments ago), and a holder whose record it does not have could still \
                 be running; later first uses start at once (docs/safety.md, S4)"
            }
            AbsentWhy::StoreWentBack => {
                "the store lost records this node had seen, and a holder whose record it lost \
                 could still be running (docs/safety.md, S6)"
            }
        }
    }
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
    /// Run the rejoin hook (O4) against the current holder; report it with
    /// [`Input::Hook`] ([`Hook::Rejoin`]).
    Rejoin {
        /// The node holding the lock now, if any.
        holder: Option<String>,
        /// Kill it then.
        deadline: Instant,
    },
    /// Run `--position` now and report it with [`Input::Position`]: a
    /// release was handed to this node, which waits to catch up (O1). A
    /// host without `--position` ignores it.
    SamplePosition,
    /// F3 (failsafe): ask every one of `members` for a grant of this
    /// holding at `token`, at once, by `deadline`; report with
    /// [`Input::FailsafeVerdicts`].
    FailsafeAsk {
        /// The round, for the verdicts.
        round: u64,
        /// The token of the holder's latest landed write.
        token: Token,
        /// Whom to ask.
        members: Vec<crate::record::FailsafeMember>,
        /// The round's deadline (the store timeout from now): report by
        /// then, with every member not heard from as not granted.
        deadline: Instant,
    },
    /// F1 (failsafe): the answer to [`Input::Failsafe`] with that `id`.
    FailsafeAnswer {
        /// The request's id.
        id: u64,
        /// Granted, or why not.
        answer: FailsafeAnswer,
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

/// F1: a holder's request for a grant, as a member receives it (the
/// shell has checked its authenticity, F5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailsafeRequest {
    /// The host's id for this request, echoed in the answer.
    pub id: u64,
    /// The requester's node id.
    pub node: String,
    /// The requester's machine id.
    pub machine: String,
    /// The requester's instance (its record names it).
    pub instance: String,
    /// The token of the requester's latest landed write.
    pub token: Token,
}

/// A member's answer to a [`FailsafeRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailsafeAnswer {
    /// Granted: this member will not take over before W has passed from
    /// now on its own clock and on the store's (F1).
    Granted,
    /// Refused, and why.
    Refused(FailsafeRefusal),
}

/// Why a member refused a grant (F1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailsafeRefusal {
    /// This agent runs without failsafe.
    Off,
    /// The request names this very agent.
    Itself,
    /// This agent is not a standby (holding, confirming, starting, …).
    Role(Role),
    /// This agent is acquiring the lock (a swap on its way or unconfirmed).
    Acquiring,
    /// The newest record seen here is not the requester's holding record.
    Newest {
        /// That record's holder.
        node: String,
        /// Its state.
        state: crate::record::LockState,
        /// Its token.
        token: Token,
    },
    /// The record is absent here, or unreadable.
    NoRecord,
    /// The request's token is below the highest this host has seen (S6).
    Superseded,
}

impl fmt::Display for FailsafeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailsafeRefusal::Off => f.write_str("failsafe is off on this member"),
            FailsafeRefusal::Itself => f.write_str("the request names this member itself"),
            FailsafeRefusal::Role(role) => write!(f, "this member is {role}"),
            FailsafeRefusal::Acquiring => f.write_str("this member is acquiring the lock"),
            FailsafeRefusal::Newest { node, state, token } => write!(
                f,
                "the newest record here is {node}'s, {state:?} at {token}"
            ),
            FailsafeRefusal::NoRecord => f.write_str("no holding record here"),
            FailsafeRefusal::Superseded => {
                f.write_str("the token is below the highest this host has seen")
            }
        }
    }
}
