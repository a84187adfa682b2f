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
//! # Files
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the configuration, the [`Agent`], its state and its public interface |
//! | `vocabulary.rs` | [`Role`], [`Input`], [`Output`], [`Event`], [`Reason`], [`LossCause`] |
//! | `startup.rs` | start-up: deactivate, or adopt the keeper and resume (S5) |
//! | `rounds.rs` | time and rounds: the licence's end (H1), deadlines, health checks (H2) |
//! | `requests.rs` | store requests and their deadlines (H5), the records written, trusted tokens (S6) |
//! | `holder.rs` | renewals (H1, H3, H4, H5) and activation (S2, S3, S6) |
//! | `stopping.rs` | graceful and emergency stops, their proof, the release (H2, H6) |
//! | `standby.rs` | observing the record: staleness, epochs, a replaced store (S1, S4–S6) |
//! | `acquire.rs` | taking the lock: witnesses and probes, the swap, confirmation (S1–S4) |
//! | `operator.rs` | switchover, pause, candidate order, rejoin (O1–O4) |
//! | `failsafe.rs` | failsafe: a member's grants and store-clock floor, a holder's set, asks, extension and cap (F1–F4) |
//!
//! # Where each rule lives
//!
//! Each rule's section in `docs/safety.md` ends with a **Code.** paragraph
//! naming the functions that carry it (H1–H6, S1–S7, the keeper); O1–O5
//! are `operator.rs` (`docs/safety.md`, "Operator controls").

use std::collections::VecDeque;
use std::time::Duration;

use crate::mutation::{Mutations, Rule};
use crate::record::{
    ceil_millis, LockRecord, LockState, Observed, Pause, ProbeRecord, RECORD_VERSION,
};
use crate::store::{
    Entry, Key, OpId, StoreGap, StoreOp, StoreOutcome, StoreRequest, StoreTime, Token,
};
use crate::time::Instant;
use crate::timing::Timing;

mod acquire;
mod failsafe;
mod holder;
mod operator;
mod requests;
mod rounds;
mod standby;
mod startup;
mod stopping;
mod vocabulary;

pub use self::vocabulary::{
    AbsentWhy, Blocker, Candidate, CheckId, Event, ExitReason, FailsafeAnswer, FailsafeRefusal,
    FailsafeRequest, HealthMode, Hook, Input, KeeperCommand, LossCause, Output, Reason, Role,
    StopId, StopKind,
};

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
    /// O3: 0 never takes over; among eligible standbys a higher one is
    /// preferred (after a higher position). Default 1.
    pub priority: u32,
    /// O3: a standby whose position is more than this behind the highest
    /// position any member published does not take over.
    pub max_lag: Option<u64>,
    /// O1/O3: the bounded delay D. Standbys that a better candidate
    /// outranks act D after it would; a record released to a switchover's
    /// target is the target's alone for D. Default 2 R.
    pub defer: Duration,
    /// O4: this node's previous tenure ended without a proven clean
    /// release: it may not take over until its rejoin hook has succeeded.
    pub rejoin: bool,
    /// O5: while holding, hand the lock back (a switchover) to a member
    /// with a higher priority once it has been ready and within
    /// `--max-lag` for this long without a break. `None`: never.
    pub failback_after: Option<Duration>,
    /// The step in which the store's clock reads (etcd: 1 s, a lease's TTL
    /// in whole seconds; zero for NATS and the embedded store). A probe
    /// stamped up to one step before the record it is compared with is
    /// rounding, not a backwards clock (S1 b); and a standby a better
    /// candidate outranks defers a stale takeover by two steps more than D,
    /// the spread of two standbys' witnesses (O3).
    pub store_clock_step: Duration,
    /// Failsafe (`docs/failsafe-design.md`): this member grants a holder's
    /// requests during a store outage (F1) and starts as if it had just
    /// granted (F4). Off: every request is refused, and a holder writes no
    /// set and asks nobody.
    pub failsafe: bool,
    /// F3's cap (`--failsafe-max`): the longest a holder runs on grants
    /// after its last renewal that landed. Default 2 minutes.
    pub failsafe_max: Duration,
    /// Test-only: safety rules switched off to prove the simulation's
    /// checkers catch them. Always empty outside tests.
    #[doc(hidden)]
    pub mutations: Mutations,
}

impl AgentConfig {
    /// A fresh agent's configuration: no previous instance on this host,
    /// no highest token seen, stops not supervised (the program is its own
    /// service), no rule switched off. Set the rest with struct update
    /// syntax: `AgentConfig { previous, ..AgentConfig::new(identity, timing) }`.
    pub fn new(identity: Identity, timing: Timing) -> AgentConfig {
        let defer = timing.renew() * 2;
        AgentConfig {
            identity,
            timing,
            previous: None,
            highest_token: None,
            supervised_stops: false,
            priority: 1,
            max_lag: None,
            defer,
            rejoin: false,
            failback_after: None,
            store_clock_step: Duration::ZERO,
            failsafe: false,
            failsafe_max: Duration::from_secs(120),
            mutations: Mutations::NONE,
        }
    }
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
    /// Over a `released` record handed to this node by a switchover (O1, S3).
    Handover,
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
    /// The newest token seen, while this acquisition was on its way (or its
    /// outcome unknown), on a record that is not ours (another instance's,
    /// or unreadable): a swap over an older revision that lands after it
    /// landed on a store that lost that record (S6, refinement (w)).
    foreign_seen: Option<Token>,
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
    /// The token of the tenure's first write, which every later record of
    /// the tenure carries as `since` ([`LockRecord::holds_token`]).
    first: Token,
    service: Service,
    /// The keeper's hold on this tenure's deadline.
    keeper: KeeperArm,
    /// The keeper was told to let the deadline go (`Disarm`): the stop is
    /// proven, or nothing started. A disarmed keeper refuses extensions,
    /// so a renewal that lands after it (the release's own-writes read
    /// finding a late one, H4) sends none.
    let_go: bool,
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
    /// A record of an epoch newer than any this host trusted (S6: the
    /// bucket was re-created). It is judged as absent, but only once it
    /// has stayed unchanged for W: a record that changes is renewed by a
    /// holder of the new incarnation, and taking it would depose that
    /// holder for nothing.
    new_epoch: bool,
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
        /// The record it writes says failover is paused (O2).
        paused: bool,
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
    /// No keeper to adopt, but an earlier instance ran here: read the
    /// record first, in case this node holds it paused (O2), before
    /// stopping anything.
    ReadForPause,
    /// Deactivate first.
    Deactivating,
}

/// One node's lease state machine. See the [module docs](self).
#[derive(Debug)]
pub struct Agent {
    id: Identity,
    timing: Timing,
    previous: Option<PreviousInstance>,
    /// [`AgentConfig::store_clock_step`].
    store_clock_step: Duration,
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
    /// `trusted` when the last lock-record read was sent: a leader read
    /// shows the store as it was when the leader answered, and a record
    /// the watch delivered meanwhile may be newer than that without the
    /// store having gone back (S6: only a read below this is a regression).
    trusted_at_read: Option<Token>,
    /// A record with our node id and another machine id was seen at this token.
    duplicate_seen: Option<Token>,
    /// An administrator revoked our tenure's record at this token while the
    /// service may have run: once the stop is proven, `released` goes over
    /// it, so the next holder need not wait W + G' (S7).
    revoked_over: Option<Token>,
    /// See [`AgentConfig::supervised_stops`].
    supervised_stops: bool,
    /// See [`AgentConfig::failsafe`].
    failsafe: bool,
    /// The store-clock floor of a takeover after a grant (F1 b).
    floor: failsafe::Floor,
    /// [`AgentConfig::failsafe_max`].
    failsafe_max: Duration,
    /// A holder's failsafe: its set, its rounds of asks (F2, F3).
    holder_fs: failsafe::HolderSide,

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
    /// A shutdown came while an acquisition's swap was on its way: it waits
    /// for the swap's reply, or its deadline (the store timeout). Taken,
    /// the lock is left as a shutdown leaves a tenure (given back if it
    /// came over a release, S3); refused or unanswered, the agent exits.
    /// Exiting at once would leave a swap that lands with nobody behind
    /// it: a `confirming` record every other node must wait out (W + G').
    shutdown_awaits_swap: bool,
    /// Whether the host lets this node acquire now ([`Input::Turn`]).
    turn: bool,
    /// The current step-down was asked for with [`Input::Release`]: the
    /// standby it ends in need not re-prove its health.
    keep_health: bool,
    /// The service is proven stopped and the release waits for the
    /// renewal in flight, which it would otherwise conflict with.
    release_wanted: bool,
    /// The write ids of this tenure's releases sent so far: one whose reply
    /// was lost may be found landed by an own-writes read (H4 for the
    /// release), which is our release, not someone else's record (H3).
    release_writes: Vec<String>,

    /// O1–O4: switchover, pause, candidate order, rejoin.
    operator: Operator,

    outputs: VecDeque<Output>,
}

/// Where a pause stands (O2).
#[derive(Clone, Debug, PartialEq, Eq)]
enum PauseState {
    /// Failover works as usual.
    Off,
    /// Renewals carry the pause; none is known to have landed yet, so every
    /// rule still holds (the keeper stays armed).
    Pausing(Pause),
    /// A renewal carrying the pause landed: the keeper is disarmed, nothing
    /// is stopped or started, health does not count, the licence does not
    /// end the tenure.
    Paused(Pause),
    /// A resume is asked for: the keeper is being armed again (`Arm` sent
    /// at `at`); renewals carry the pause until it acknowledges.
    Resuming { pause: Pause, at: Option<Instant> },
}

/// A handover under way (O1, O5): whom the release names, and whether
/// that node must catch up before it takes it.
#[derive(Clone, Debug)]
struct Handover {
    to: String,
    /// Not waived by the operator (`--allow-lag`): the target takes the
    /// release only within `--max-lag` ([`LockRecord::catch_up`]).
    catch_up: bool,
}

/// The operator controls' state (O1–O4).
#[derive(Clone, Debug)]
struct Operator {
    priority: u32,
    max_lag: Option<u64>,
    defer: Duration,
    /// The other members as last reported (O3).
    candidates: Vec<Candidate>,
    /// This node's own position.
    position: Option<u64>,
    /// A pause asked for (applied when active).
    pause_wanted: Option<Pause>,
    pause: PauseState,
    /// The handover under way (a switchover's or a failback's): the
    /// release names its target.
    handover: Option<Handover>,
    /// O4: not eligible until the rejoin hook succeeds.
    rejoin_needed: bool,
    /// The rejoin hook is running until this deadline.
    rejoin_running: Option<Instant>,
    /// Do not run the rejoin hook again before this.
    rejoin_retry_at: Option<Instant>,
    /// O5: the hold-down, if failback is on.
    failback_after: Option<Duration>,
    /// O5: each preferred member's start of its unbroken readiness, as
    /// this node has heard it.
    preferred_since: Vec<(String, Instant)>,
    /// A release handed to this node that must catch up first asked for a
    /// fresh `--position` sample, which has not arrived yet (O1).
    position_wanted: bool,
    /// O3: an operator let this standby take the lock over beyond
    /// `--max-lag` (`putex switchover --to NODE --allow-lag` with no holder);
    /// until it next acquires.
    lag_waived: bool,
    /// O2: resumed, and the record without the pause has not landed yet:
    /// it is written whatever the health checks say (they gate renewals,
    /// not the end of a pause), or the paused record would outlive it.
    unpause_pending: bool,
}

impl Agent {
    /// A new agent, starting at `now`. It begins by making sure the service is
    /// not running, or by resuming an adopted keeper's tenure (S5).
    pub fn new(config: AgentConfig, now: Instant) -> Agent {
        let mut agent = Agent {
            id: config.identity,
            timing: config.timing,
            previous: config.previous,
            store_clock_step: config.store_clock_step,
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
            trusted_at_read: config.highest_token,
            duplicate_seen: None,
            revoked_over: None,
            supervised_stops: config.supervised_stops,
            failsafe: config.failsafe,
            // F4: a restarted member cannot remember its grants: it starts
            // as if it had just granted.
            floor: if config.failsafe && !config.mutations.is(Rule::FailsafeRestartWithoutWait) {
                failsafe::Floor::Pending
            } else {
                failsafe::Floor::None
            },
            failsafe_max: config.failsafe_max,
            holder_fs: failsafe::HolderSide::default(),
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
            shutdown_awaits_swap: false,
            turn: true,
            keep_health: false,
            release_wanted: false,
            release_writes: Vec::new(),
            operator: Operator {
                priority: config.priority,
                max_lag: config.max_lag,
                defer: config.defer,
                candidates: Vec::new(),
                position: None,
                pause_wanted: None,
                pause: PauseState::Off,
                handover: None,
                rejoin_needed: config.rejoin,
                rejoin_running: None,
                rejoin_retry_at: None,
                failback_after: config.failback_after,
                preferred_since: Vec::new(),
                lag_waived: false,
                position_wanted: false,
                unpause_pending: false,
            },
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
            Input::Members(members) => {
                self.failsafe_members(&members);
                self.on_members(members);
            }
            Input::Position(position) => {
                self.operator.position = position;
                self.operator.position_wanted = false;
            }
            Input::Switchover { to, allow_lag } => self.on_switchover(to, allow_lag),
            Input::Pause(pause) => self.on_pause(pause),
            Input::Resume => self.on_resume(),
            Input::Failsafe(request) => self.on_failsafe_request(request),
            Input::FailsafeVerdicts { round, granted } => {
                self.on_failsafe_verdicts(round, &granted)
            }
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
        consider(
            self.lease
                .as_ref()
                .map(|l| l.licence_end)
                .filter(|_| !self.paused()),
        );
        consider(self.lock_op.as_ref().map(|p| p.deadline));
        consider(self.probe_op.as_ref().map(|p| p.deadline));
        consider(self.health.map(|h| h.deadline));
        consider(self.step_down_deadline);
        consider(self.operator_timeout());
        if let Some(t) = &self.tenure {
            if self.role == Role::Confirming || self.paused() {
                if self.role == Role::Confirming {
                    consider(Some(t.activate_at));
                }
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

    /// An acquisition's swap is on its way (its reply not yet in, its
    /// deadline not yet passed).
    fn swap_in_flight(&self) -> bool {
        self.role == Role::Standby
            && self
                .lock_op
                .as_ref()
                .is_some_and(|p| matches!(p.what, LockOp::Acquire { .. }))
    }

    /// An acquisition's swap is on its way, or its outcome is unknown.
    fn acquisition_pending(&self) -> bool {
        self.role == Role::Standby
            && (!self.unconfirmed.is_empty()
                || self
                    .lock_op
                    .as_ref()
                    .is_some_and(|p| matches!(p.what, LockOp::Acquire { .. })))
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
}
