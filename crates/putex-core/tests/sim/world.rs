//! The simulated world: hosts with drifting clocks, agents, keepers and
//! services; a linearizable store with its own clock; a network that delays,
//! drops, duplicates and holds messages; and the faults of the scenario.
//!
//! Real time is a `u64` of nanoseconds owned by the world. Every host reads
//! its own [`Clock`]; agents only ever see their host's readings. Events run
//! in (time, sequence) order, so a (profile, seed) pair replays exactly.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use putex_core::{
    Agent, AgentConfig, Entry, Event, ExitReason, Hook, Identity, Input, KeeperCommand, Key,
    LockRecord, LockState, Observed, OpId, Output, PreviousInstance, Reason, Role, StopId,
    StopKind, StoreOp, StoreOutcome, StoreTime, Timing, Token,
};

use putex_core::mutation::Rule;

use crate::check::Checker;
use crate::clock::Clock;
use crate::rng::Rng;
use crate::scenario::{FaultKind, Scenario, MS, SEC};

type Instant = putex_core::Instant;

#[derive(Debug)]
enum Ev {
    Wake {
        h: usize,
        gen: u64,
    },
    Deliver {
        h: usize,
        gen: u64,
        input: Input,
    },
    Arrive {
        h: usize,
        gen: u64,
        id: OpId,
        op: StoreOp,
    },
    KeeperCheck {
        h: usize,
        kgen: u64,
    },
    /// A command reaches the keeper (in the order sent, after a delay).
    KeeperCmd {
        h: usize,
        /// The agent connection it came on; the newest one controls.
        conn: u64,
        boot: u64,
        cmd: KeeperCommand,
    },
    StopDone {
        h: usize,
        sgen: u64,
    },
    StallEnd {
        h: usize,
        gen: u64,
    },
    Restart {
        h: usize,
    },
    Heal {
        h: usize,
        what: Heal,
    },
    Jump {
        h: usize,
        delta: i64,
    },
    Fault,
    Probe,
    LivenessDeadline {
        id: u64,
    },
    /// Every host's agent hears of the other members (O3), as its host
    /// reads their records from the store each round.
    Members,
    /// The operator resumes failover (O2).
    Resume,
    /// The agent is killed and started again at once, and its host's clock
    /// jumps as it comes back (failsafe's F4).
    RestartAndJump {
        h: usize,
        delta: i64,
    },
    /// The store's clock jumps (a fault scheduled earlier).
    StoreJump {
        delta: i64,
    },
    /// Failsafe: a holder's ask reaches a member (F1).
    PeerAsk {
        from: usize,
        from_gen: u64,
        to: usize,
        round: u64,
        request: putex_core::FailsafeRequest,
    },
    /// Failsafe: a member's grant reaches the holder that asked.
    PeerGrant {
        to: usize,
        gen: u64,
        round: u64,
        member: putex_core::FailsafeMember,
    },
    /// Failsafe: a holder's round of asks is over; its verdicts go in.
    RoundEnd {
        h: usize,
        gen: u64,
        round: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum Heal {
    Links,
    Health,
    StaleView,
    StorePause,
    /// The agent of this generation may acquire again.
    Turn(u64),
    /// The host's store handle, which noticed its file was replaced, opens
    /// the new one.
    Reopen,
    /// Failsafe: the host reaches its peers again.
    Peers,
}

struct Scheduled {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeeperState {
    Disarmed,
    Armed(u64),
    Fired,
}

struct StopProc {
    done_at: u64,
    ok: bool,
    ids: Vec<StopId>,
    /// The keeper fired: its emergency stop keeps its budget (an
    /// assumption), stuck or not.
    fired: bool,
}

/// What a host's disk keeps across agent restarts and reboots.
#[derive(Default)]
struct Persisted {
    highest: Option<Token>,
    instance: Option<String>,
    boot: u64,
}

pub struct Host {
    pub timing: Timing,
    clock: Clock,
    boot: u64,
    agent: Option<Box<Agent>>,
    agent_gen: u64,
    instances: u64,
    pub instance: String,
    stalled_until: u64,
    queued: VecDeque<Input>,
    next_wake: Option<u64>,
    keeper_alive: bool,
    keeper: KeeperState,
    kgen: u64,
    /// The agent connection that controls the keeper (an agent generation).
    keeper_conn: u64,
    /// When the keeper is done with the commands sent so far.
    keeper_busy_until: u64,
    /// Until then, stops of a service whose holder must keep its lease
    /// (stepping down, or lapsed on purpose) prove nothing and leave it
    /// running: an unkillable process, orphans of a dead keeper not found.
    stuck_until: u64,
    /// The last transition to `lapsed` gave the lease up on purpose
    /// (stop failed or timed out, keeper lost), not because it was lost.
    lapsed_on_purpose: bool,
    pub running: bool,
    sgen: u64,
    stop: Option<StopProc>,
    persisted: Persisted,
    healthy: bool,
    link_to: bool,
    link_from: bool,
    /// Failsafe: cut off from the other hosts too (peer messages lost).
    peer_off: bool,
    hold_until: u64,
    stale_view_since: Option<u64>,
    /// Until then, this host's store handle fails every call as unknown
    /// (its file was replaced under it).
    store_lost_until: u64,
    watch_last: u64,
    restart_after_exit: Option<u64>,
    op_keys: HashMap<OpId, Key>,
    /// Stepped store clock: the era of this agent's handle, and the stamp
    /// it gave each lock record it received.
    stamp_era: u64,
    stamps: HashMap<Token, u64>,
    // Checker bookkeeping, per agent instance unless noted.
    /// When each record (revision and contents: a rollback can reuse a
    /// revision) was first delivered, on the host's clock.
    pub first_seen: HashMap<(Token, u64), u64>,
    /// When the host last saw the record absent, on its clock.
    pub absent_since: Option<u64>,
    /// Highest lock token delivered by reads and watches (host-wide, like its disk).
    pub max_seen: Option<Token>,
    pub max_seen_before_tenure: Option<Token>,
    /// `max_seen` when the host last sent an acquisition.
    pub max_seen_at_acquire: Option<Token>,
    /// Tokens that arrived below what the host had seen, or in a new epoch.
    pub regressed: std::collections::HashSet<Token>,
    pub tenure_token: Option<Token>,
    /// Local time the tenure's acquisition was acknowledged.
    pub tenure_ack: Option<u64>,
    pub absent_before_tenure: Option<u64>,
    /// The vacancy the store proved to each of this host's creates (S4).
    pub vacancy_given: HashMap<Token, std::time::Duration>,
    pub activated_in_tenure: bool,
    /// The tenure was taken over a `released` record (S3): one that never
    /// started anything may be given back.
    pub tenure_over_release: bool,
    pub previous_instance: Option<String>,
    /// O3: `--priority`.
    pub priority: u32,
    /// O4: this host's last tenure ran the service and did not end in a
    /// proven release (host-wide, like its state file).
    pub tenure_open: bool,
    /// O4: the running agent must rejoin before it may take over.
    pub rejoin_pending: bool,
    /// O3: what its member record last said: ready, and when written.
    member: Option<(bool, u64)>,
    /// O5: for each other node, since when (local time) the members this
    /// agent was given have shown it ready without a break.
    pub ready_view: HashMap<String, u64>,
    /// Its own releases the store applied, by request: a releaser knows
    /// its release from the reply, before any watch shows it (O1's hold
    /// runs from there).
    release_writes: HashMap<OpId, (Token, u64)>,
    /// Per rollback (index into `Store::lost`), what this host was shown
    /// of it (host-wide, like its disk): see [`RollbackView`].
    pub rollbacks: Vec<RollbackView>,
    /// Its lock writes the store applied, by request: the reply shows the
    /// host where its own write landed.
    lock_writes: HashMap<OpId, (Token, u64)>,
    /// (k) Its lock writes that begin a holding, by (agent generation,
    /// request): a `confirming` record sent while not holding.
    acquisitions: std::collections::HashSet<(u64, OpId)>,
}

/// What one host was shown of one rollback. A node can tell that the store
/// went back only if it knew a record the rollback lost *and* was shown,
/// after the rollback, a record written since at or below that record's
/// revision (a lower revision, or the same one with other contents): that
/// is what S6 reads. A node that knew no lost record of another writer, or
/// was shown since only records above what it knew (its own swap landing
/// above its view, after a one-way partition held back everything else:
/// chaos seeds 311349, 324459), sees a store whose history looks whole.
#[derive(Clone, Copy, Debug, Default)]
pub struct RollbackView {
    /// The highest lost record of another writer the host was shown.
    pub known_lost: Option<Token>,
    /// A record written after the rollback, at or below `known_lost`, was
    /// shown to the host after it knew `known_lost`.
    pub evidence: bool,
}

impl Host {
    pub fn local(&self, now: u64) -> u64 {
        self.clock.local(now)
    }
    pub fn role(&self) -> Option<Role> {
        self.agent.as_ref().map(|a| a.role())
    }
}

/// A lock record a rollback lost: revision, contents (fingerprint), the
/// writer's node.
pub type LostRecord = (Token, u64, String);

/// One rollback of the store, for the checkers.
pub struct RolledBack {
    /// When, real time.
    pub at: u64,
    /// The lock records it lost.
    pub lost: Vec<LostRecord>,
}

/// A lock write the store applied, for the checkers.
#[derive(Clone, Debug)]
pub struct Applied {
    pub token: Token,
    pub prev: Option<Entry>,
    pub value: Vec<u8>,
    /// For `released` records: whether the writer was active in its tenure
    /// and its service was down when the release landed (H6).
    pub proven: bool,
}

struct Version {
    real: u64,
    entry: Option<Entry>,
}

pub struct Store {
    epoch: u64,
    rev: u64,
    versions: Vec<Version>,
    probes: Vec<Option<Entry>>,
    clock: Clock,
    paused_until: u64,
    /// Until then, a deposed leader answers leader reads with its view as
    /// of `deposed_at` (a leader change: reads that should see every
    /// acknowledged write do not).
    deposed_until: u64,
    deposed_at: u64,
    pub log: Vec<Applied>,
    admin_writes: u64,
    /// The highest revision a rollback lost.
    pub lost_high: Option<Token>,
    /// Each rollback: when and what it lost.
    pub lost: Vec<RolledBack>,
    /// When each lock record (revision, contents) was written, real time.
    pub written_at: HashMap<(Token, u64), u64>,
    /// When this epoch began, on the store's clock.
    epoch_began: u64,
    /// Someone deleted the lock record in this epoch: a marker is left.
    deleted: bool,
    /// (k) Which holding wrote each lock record (revision, contents): the
    /// writer host and a holding number. A host's write continues the
    /// holding of the record it replaced if that record is its own and the
    /// write began no holding; records of no host have none.
    holdings: HashMap<(Token, u64), (usize, u64)>,
    next_holding: u64,
    /// (k) Epochs in which the store lost acknowledged writes: revisions
    /// are reused there, and a token check is as good as the token (S6).
    rolled_back: std::collections::HashSet<u64>,
}

impl Store {
    fn current(&self) -> Option<&Entry> {
        self.versions.last().and_then(|v| v.entry.as_ref())
    }

    fn as_of(&self, real: u64) -> Option<Entry> {
        self.versions
            .iter()
            .rev()
            .find(|v| v.real <= real)
            .and_then(|v| v.entry.clone())
    }

    fn stamp(&mut self, now: u64) -> (Token, StoreTime) {
        self.rev += 1;
        (
            Token::new(self.epoch, self.rev),
            StoreTime {
                era: 1,
                nanos: self.clock.local(now),
            },
        )
    }
}

pub struct World {
    pub sc: Scenario,
    rng: Rng,
    pub now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    pub hosts: Vec<Host>,
    /// Failsafe: the asks delivered to members, by the id the member's
    /// answer carries: (holder, its agent generation, round, member).
    peer_asks: HashMap<u64, (usize, u64, u64, putex_core::FailsafeMember)>,
    next_peer_id: u64,
    /// Failsafe: each holder's round of asks in flight and its grants.
    rounds: HashMap<usize, (u64, u64, Vec<putex_core::FailsafeMember>)>,
    pub store: Store,
    pub check: Checker,
    pub trace: Option<Vec<String>>,
    calm_until: u64,
    active_faults: u32,
    last_instant_fault: u64,
    last_clock_fault: u64,
    probe_pending: bool,
    liveness_id: u64,
    pub faults_injected: u32,
    /// Whether each release write was sent with proof (H6), by write id.
    release_proofs: HashMap<String, bool>,
    /// O2: a pause is in force (asked for and not yet resumed).
    pausing: bool,
    /// (k) Every activation: host, fencing token, the holding it began.
    activations: Vec<(usize, Token, u64)>,
    /// (k) The holding label of the lock write under way.
    pending_holding: Option<(usize, u64)>,
}

impl World {
    pub fn new(sc: Scenario, trace: bool) -> World {
        let mut rng = Rng::new(sc.seed.wrapping_mul(0x9e37_79b9) ^ 0xabcdef);
        let hosts = (0..sc.hosts)
            .map(|i| {
                let timing = sc.timings[i].validate().expect("valid timing");
                let boot_local = rng.range(SEC, 100 * SEC);
                Host {
                    timing,
                    clock: Clock::new(0, boot_local, sc.host_rates[i]),
                    boot: 1,
                    agent: None,
                    agent_gen: 0,
                    instances: 0,
                    instance: String::new(),
                    stalled_until: 0,
                    queued: VecDeque::new(),
                    next_wake: None,
                    keeper_alive: true,
                    keeper: KeeperState::Disarmed,
                    kgen: 0,
                    keeper_conn: 0,
                    keeper_busy_until: 0,
                    stuck_until: 0,
                    lapsed_on_purpose: false,
                    running: false,
                    sgen: 0,
                    stop: None,
                    persisted: Persisted::default(),
                    healthy: true,
                    link_to: true,
                    link_from: true,
                    peer_off: false,
                    hold_until: 0,
                    stale_view_since: None,
                    store_lost_until: 0,
                    watch_last: 0,
                    restart_after_exit: None,
                    op_keys: HashMap::new(),
                    stamp_era: 0,
                    stamps: HashMap::new(),
                    first_seen: HashMap::new(),
                    absent_since: None,
                    max_seen: None,
                    max_seen_before_tenure: None,
                    max_seen_at_acquire: None,
                    regressed: Default::default(),
                    tenure_token: None,
                    tenure_ack: None,
                    absent_before_tenure: None,
                    vacancy_given: HashMap::new(),
                    activated_in_tenure: false,
                    tenure_over_release: false,
                    previous_instance: None,
                    priority: sc.priorities[i],
                    tenure_open: false,
                    rejoin_pending: false,
                    member: None,
                    ready_view: HashMap::new(),
                    release_writes: HashMap::new(),
                    rollbacks: Vec::new(),
                    lock_writes: HashMap::new(),
                    acquisitions: std::collections::HashSet::new(),
                }
            })
            .collect();
        let store = Store {
            epoch: 1,
            rev: 0,
            versions: Vec::new(),
            probes: vec![None; sc.hosts],
            clock: Clock::new(0, 1_700_000_000 * SEC, sc.store_rate),
            paused_until: 0,
            deposed_until: 0,
            deposed_at: 0,
            log: Vec::new(),
            admin_writes: 0,
            lost_high: None,
            lost: Vec::new(),
            written_at: HashMap::new(),
            epoch_began: (1_700_000_000 * SEC).saturating_sub(sc.store_age),
            deleted: false,
            holdings: HashMap::new(),
            next_holding: 0,
            rolled_back: std::collections::HashSet::new(),
        };
        let check = Checker::new(&sc);
        let mut w = World {
            sc,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            hosts,
            store,
            check,
            trace: trace.then(Vec::new),
            calm_until: 0,
            active_faults: 0,
            last_instant_fault: 0,
            last_clock_fault: 0,
            probe_pending: false,
            liveness_id: 0,
            faults_injected: 0,
            release_proofs: HashMap::new(),
            pausing: false,
            activations: Vec::new(),
            pending_holding: None,
            peer_asks: HashMap::new(),
            next_peer_id: 0,
            rounds: HashMap::new(),
        };
        if w.sc.operator || w.sc.failsafe {
            w.at(0, Ev::Members);
        }
        for h in 0..w.sc.hosts {
            let start = w.rng.range(0, 200 * MS);
            w.at(start, Ev::Restart { h });
        }
        if !w.sc.faults.is_empty() {
            let first = w.sc.duration / 6 + w.rng.range(w.sc.fault_gap.0, w.sc.fault_gap.1);
            w.at(first, Ev::Fault);
        }
        if w.sc.liveness_probes {
            for frac in [25u64, 50, 75] {
                w.at(w.sc.duration * frac / 100, Ev::Probe);
            }
        }
        w
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        }));
    }

    fn log(&mut self, f: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>10.4}s {}", self.now as f64 / 1e9, f()));
        }
    }

    /// Runs to the end of the scenario or the first violation.
    pub fn run(&mut self) -> Result<(), String> {
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.at > self.sc.duration {
                break;
            }
            self.now = s.at;
            self.step(s.ev);
            if let Some(v) = self.check.violation.take() {
                self.log(|| format!("VIOLATION {v}"));
                return Err(v);
            }
        }
        self.now = self.sc.duration;
        self.check.finish(self.now);
        self.check.violation.take().map_or(Ok(()), Err)
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Wake { h, gen } => {
                let host = &mut self.hosts[h];
                if host.agent_gen != gen || host.next_wake != Some(self.now) {
                    return;
                }
                host.next_wake = None;
                if host.stalled_until > self.now {
                    return;
                }
                let local = Instant::from_nanos(host.local(self.now));
                if let Some(a) = host.agent.as_mut() {
                    a.handle_timeout(local);
                }
                self.drain(h);
            }
            // The operator's standing request is read from the store, in
            // order: one overtaken by a newer request on its way is stale
            // (a pause arriving after the resume would pause again).
            Ev::Deliver {
                input: Input::Pause(_),
                ..
            } if !self.pausing => {}
            Ev::Deliver {
                input: Input::Resume,
                ..
            } if self.pausing => {}
            Ev::Deliver { h, gen, input } => self.deliver(h, gen, input),
            Ev::Arrive { h, gen, id, op } => {
                if self.hosts[h].store_lost_until > self.now {
                    // The handle's file was replaced: every call fails as
                    // unknown, applied nowhere.
                    self.reply(h, gen, id, StoreOutcome::Unknown);
                    return;
                }
                let deposed_read = matches!(
                    op,
                    StoreOp::Get {
                        key: Key::Lock,
                        leader: true
                    }
                ) && self.store.deposed_until > self.now;
                if self.store.paused_until > self.now && !deposed_read {
                    let at = self.store.paused_until + self.rng.range(0, MS);
                    self.at(at, Ev::Arrive { h, gen, id, op });
                    return;
                }
                self.apply(h, gen, id, op);
            }
            Ev::KeeperCheck { h, kgen } => self.keeper_check(h, kgen),
            Ev::KeeperCmd { h, conn, boot, cmd } => self.keeper_cmd(h, conn, boot, cmd),
            Ev::StopDone { h, sgen } => self.stop_done(h, sgen),
            Ev::StallEnd { h, gen } => {
                let host = &mut self.hosts[h];
                if host.agent_gen != gen {
                    return;
                }
                host.stalled_until = 0;
                let queued: Vec<Input> = host.queued.drain(..).collect();
                self.log(|| format!("h{h} resumes with {} queued inputs", queued.len()));
                for input in queued {
                    self.deliver(h, gen, input);
                }
                let host = &mut self.hosts[h];
                let local = Instant::from_nanos(host.local(self.now));
                if let Some(a) = host.agent.as_mut() {
                    a.handle_timeout(local);
                }
                self.drain(h);
            }
            Ev::Restart { h } => self.start_agent(h),
            Ev::Heal { h, what } => self.heal(h, what),
            Ev::Jump { h, delta } => self.jump(h, delta),
            Ev::RestartAndJump { h, delta } => {
                if self.hosts[h].agent.is_some() && !self.unguarded(h) {
                    self.log(|| format!("h{h} agent restarts, cut off from its peers"));
                    self.kill_agent(h);
                    self.start_agent(h);
                    // After its first reads: its own clock has seen the
                    // record for W at once.
                    let r = self.hosts[h].timing.renew().as_nanos() as u64;
                    self.at(self.now + r / 2, Ev::Jump { h, delta });
                    // The holder's asks do not reach it as it comes back
                    // (a restart takes a while): its grants before the
                    // restart are all that keeps the holder alive.
                    self.hosts[h].peer_off = true;
                    self.active_faults += 1;
                    let t = self.lease_of(h);
                    self.at(
                        self.now + 3 * t,
                        Ev::Heal {
                            h,
                            what: Heal::Peers,
                        },
                    );
                }
            }
            Ev::Fault => self.inject(),
            Ev::Probe => self.probe(),
            Ev::LivenessDeadline { id } => {
                // Why nothing happened, for the replay log.
                for h in 0..self.hosts.len() {
                    let why = self.hosts[h]
                        .agent
                        .as_ref()
                        .map(|a| (a.role(), a.blocker()));
                    self.log(|| format!("h{h} at the liveness deadline: {why:?}"));
                }
                self.check.liveness_deadline(id, self.now)
            }
            Ev::Members => self.members(),
            Ev::StoreJump { delta } => {
                self.log(|| format!("store clock jumps {delta} ns"));
                self.store.clock.jump(self.now, delta);
            }
            Ev::Resume => self.resume(),
            Ev::PeerAsk {
                from,
                from_gen,
                to,
                round,
                request,
            } => {
                if self.hosts[to].agent.is_none() {
                    return;
                }
                self.next_peer_id += 1;
                let id = self.next_peer_id;
                let member = putex_core::FailsafeMember {
                    node: format!("node{to}"),
                    machine: format!("machine{to}"),
                };
                self.peer_asks.insert(id, (from, from_gen, round, member));
                let gen = self.hosts[to].agent_gen;
                self.deliver(
                    to,
                    gen,
                    Input::Failsafe(putex_core::FailsafeRequest { id, ..request }),
                );
            }
            Ev::PeerGrant {
                to,
                gen,
                round,
                member,
            } => {
                if let Some((g, r, granted)) = self.rounds.get_mut(&to) {
                    if *g == gen && *r == round && !granted.contains(&member) {
                        granted.push(member);
                    }
                }
            }
            Ev::RoundEnd { h, gen, round } => {
                let Some((g, r, granted)) = self.rounds.remove(&h) else {
                    return;
                };
                if g != gen || r != round {
                    self.rounds.insert(h, (g, r, granted));
                    return;
                }
                self.deliver(h, gen, Input::FailsafeVerdicts { round, granted });
            }
        }
    }

    // ----- agents ------------------------------------------------------------

    fn start_agent(&mut self, h: usize) {
        let now = self.now;
        let host = &mut self.hosts[h];
        if host.agent.is_some() {
            return;
        }
        if !host.keeper_alive {
            // A reboot: the boot-time clock starts again near zero.
            let rate = host.clock.rate_ppm();
            host.clock = Clock::new(now, self.rng.range(SEC, 10 * SEC), rate);
            host.keeper_alive = true;
            host.keeper = KeeperState::Disarmed;
            host.kgen += 1;
        }
        host.instances += 1;
        let instance = format!("h{h}i{}", host.instances);
        let local = host.local(now);
        let same_boot = host.persisted.boot == host.boot;
        let previous = host.persisted.instance.clone().map(|i| PreviousInstance {
            instance: i,
            same_boot,
            keeper_deadline: match host.keeper {
                // Adopted only while it runs the service and is not stopping it.
                KeeperState::Armed(d)
                    if same_boot && local < d && host.running && host.stop.is_none() =>
                {
                    Some(Instant::from_nanos(d))
                }
                _ => None,
            },
        });
        host.previous_instance = host.persisted.instance.clone();
        host.persisted.instance = Some(instance.clone());
        host.persisted.boot = host.boot;
        host.instance = instance.clone();
        host.agent_gen += 1;
        // The new agent's connection takes the keeper over.
        host.keeper_conn = host.agent_gen;
        host.first_seen.clear();
        host.ready_view.clear();
        host.absent_since = None;
        host.tenure_token = None;
        host.activated_in_tenure = false;
        host.stalled_until = 0;
        host.queued.clear();
        host.next_wake = None;
        host.op_keys.clear();
        let identity = Identity {
            node: format!("node{h}"),
            machine: format!("machine{h}"),
            instance,
        };
        host.rejoin_pending = self.sc.operator && host.tenure_open;
        let config = AgentConfig {
            previous: previous.clone(),
            highest_token: host.persisted.highest,
            supervised_stops: true,
            priority: host.priority,
            rejoin: host.rejoin_pending,
            failback_after: self.sc.failback_after,
            store_clock_step: self.sc.store_step,
            failsafe: self.sc.failsafe,
            failsafe_max: self.sc.failsafe_max,
            mutations: self.sc.mutations,
            ..AgentConfig::new(identity, host.timing.clone())
        };
        host.agent = Some(Box::new(Agent::new(config, Instant::from_nanos(local))));
        self.log(|| format!("h{h} agent starts (previous {previous:?})"));
        self.drain(h);
        if self.pausing {
            // The host reads the standing pause request at start.
            let gen = self.hosts[h].agent_gen;
            self.deliver(h, gen, Input::Pause(sim_pause()));
        }
    }

    fn deliver(&mut self, h: usize, gen: u64, input: Input) {
        let now = self.now;
        let host = &mut self.hosts[h];
        if host.agent_gen != gen || host.agent.is_none() {
            return;
        }
        if host.stalled_until > now {
            host.queued.push_back(input);
            return;
        }
        let input = self.stamp_stepped(h, input);
        self.note_input(h, &input);
        let host = &mut self.hosts[h];
        let local = Instant::from_nanos(host.local(now));
        if self.trace.is_some() {
            let text = describe_input(&input);
            self.log(|| format!("h{h} <- {text}"));
        }
        let host = &mut self.hosts[h];
        host.agent.as_mut().expect("checked").handle(local, input);
        self.drain(h);
    }

    /// On a store whose clock reads in steps (etcd, `docs/safety.md` §4.2):
    /// the host's handle stamps what it receives with a reading of the
    /// store's clock in whole steps taken now, after receipt (`e ≤ q <
    /// e + step`): a lock record with `q + 2 steps`, kept per token so a
    /// re-read does not move it; a probe with `q + 1 step`. Each agent
    /// generation is a handle of its own: an era no other shares.
    fn stamp_stepped(&mut self, h: usize, input: Input) -> Input {
        let step = self.sc.store_step.as_nanos() as u64;
        if step == 0 {
            return input;
        }
        let e = self.store.clock.local(self.now);
        let q = e.div_ceil(step) * step;
        let host = &mut self.hosts[h];
        let era = 1_000 + h as u64 * 1_000_000 + host.agent_gen;
        if host.stamp_era != era {
            host.stamp_era = era;
            host.stamps.clear();
        }
        let mut stamp_record = |entry: &mut Entry| {
            let nanos = *host.stamps.entry(entry.token).or_insert(q + 2 * step);
            entry.time = StoreTime { era, nanos };
        };
        match input {
            Input::Watch(Some(mut entry)) => {
                stamp_record(&mut entry);
                Input::Watch(Some(entry))
            }
            Input::Store {
                id,
                outcome: StoreOutcome::Read(Some(mut entry)),
            } => {
                if host.op_keys.get(&id) == Some(&Key::Probe) {
                    entry.time = StoreTime {
                        era,
                        nanos: q + step,
                    };
                } else {
                    stamp_record(&mut entry);
                }
                Input::Store {
                    id,
                    outcome: StoreOutcome::Read(Some(entry)),
                }
            }
            other => other,
        }
    }

    /// A lock record shown to a host (delivered, or its own write's reply):
    /// what it tells the host of each rollback ([`RollbackView`]).
    fn shown(store: &Store, host: &mut Host, token: Token, fp: u64, own: bool) {
        if host.rollbacks.len() < store.lost.len() {
            host.rollbacks
                .resize(store.lost.len(), RollbackView::default());
        }
        let written = store.written_at.get(&(token, fp)).copied();
        for (rollback, view) in store.lost.iter().zip(host.rollbacks.iter_mut()) {
            if !own
                && rollback
                    .lost
                    .iter()
                    .any(|(t, f, _)| *t == token && *f == fp)
            {
                view.known_lost = view.known_lost.max(Some(token));
            } else if written.is_some_and(|w| w > rollback.at)
                && view
                    .known_lost
                    .is_some_and(|k| k.epoch == token.epoch && token <= k)
            {
                view.evidence = true;
            }
        }
    }

    /// What the checkers need to know about what a host has seen.
    fn note_input(&mut self, h: usize, input: &Input) {
        let local = self.hosts[h].local(self.now);
        let host = &mut self.hosts[h];
        let entry = match input {
            Input::Watch(e) => Some(e.as_ref()),
            Input::Store {
                id,
                outcome: StoreOutcome::Read(e),
            } if host.op_keys.get(id) == Some(&Key::Lock) => Some(e.as_ref()),
            _ => None,
        };
        if let Input::Store { id, .. } = input {
            host.op_keys.remove(id);
            if let Some(key) = host.release_writes.remove(id) {
                host.first_seen.entry(key).or_insert(local);
            }
            if let Some((token, fp)) = host.lock_writes.remove(id) {
                if matches!(
                    input,
                    Input::Store {
                        outcome: StoreOutcome::Written(_),
                        ..
                    }
                ) {
                    Self::shown(&self.store, host, token, fp, true);
                }
            }
        }
        if let Input::Members(members) = input {
            host.ready_view
                .retain(|n, _| members.iter().any(|m| m.ready && m.node == *n));
            for m in members.iter().filter(|m| m.ready) {
                host.ready_view.entry(m.node.clone()).or_insert(local);
            }
        }
        match entry {
            Some(Some(e)) => {
                host.first_seen
                    .entry((e.token, fingerprint(&e.value)))
                    .or_insert(local);
                let own = matches!(Observed::decode(&e.value), Observed::Record(r) if r.instance == host.instance);
                Self::shown(&self.store, host, e.token, fingerprint(&e.value), own);
                if own {
                    return; // our own records say nothing about other holders
                }
                if let Some(m) = host.max_seen {
                    if (e.token.epoch == m.epoch && e.token < m) || e.token.epoch > m.epoch {
                        // Absent-like for this host (S6): a regression or a new epoch.
                        host.regressed.insert(e.token);
                    }
                }
                if host.max_seen.is_none_or(|m| e.token > m) {
                    host.max_seen = Some(e.token);
                }
            }
            // The latest absence seen: a create lands only while the record
            // is absent, so the core's S4 wait (from the create's reply) is
            // never shorter than one measured from here. Late events of a
            // present record do not erase it.
            Some(None) => host.absent_since = Some(local),
            None => {}
        }
    }

    fn drain(&mut self, h: usize) {
        while let Some(out) = self.hosts[h].agent.as_mut().and_then(|a| a.poll_output()) {
            self.output(h, out);
        }
        let now = self.now;
        let host = &mut self.hosts[h];
        let Some(agent) = host.agent.as_ref() else {
            return;
        };
        let Some(t) = agent.poll_timeout() else {
            return;
        };
        let real = host.clock.real_at(t.as_nanos(), now);
        if host.next_wake.is_none_or(|w| real < w || w < now) {
            host.next_wake = Some(real);
            let gen = host.agent_gen;
            self.at(real, Ev::Wake { h, gen });
        }
    }

    fn local_to_real(&self, h: usize, local: u64) -> u64 {
        self.hosts[h].clock.real_at(local, self.now)
    }

    /// Real time after `dur` nanoseconds of host `h`'s clock.
    fn after_local(&self, h: usize, dur: u64) -> u64 {
        self.local_to_real(h, self.hosts[h].local(self.now) + dur)
    }

    fn output(&mut self, h: usize, out: Output) {
        if self.trace.is_some() {
            let text = describe_output(&out);
            self.log(|| format!("h{h} -> {text}"));
        }
        let gen = self.hosts[h].agent_gen;
        match out {
            Output::Store(req) => {
                let key = match &req.op {
                    StoreOp::Get { key, .. }
                    | StoreOp::Create { key, .. }
                    | StoreOp::Update { key, .. }
                    | StoreOp::Put { key, .. } => *key,
                };
                self.hosts[h].op_keys.insert(req.id, key);
                // What the host had seen when it sent an acquisition: the
                // core's S6 floor is taken at the same moment.
                let acquiring = key == Key::Lock
                    && matches!(
                        req.op,
                        StoreOp::Create { .. } | StoreOp::Update { .. } | StoreOp::Put { .. }
                    )
                    && self.hosts[h].role() == Some(Role::Standby);
                if acquiring {
                    self.hosts[h].max_seen_at_acquire = self.hosts[h].max_seen;
                }
                // (k) A `confirming` record sent while not holding begins a
                // holding (a renewal sent while confirming may be emitted in
                // the step that activates, or one that ends the tenure).
                if let StoreOp::Create { value, .. }
                | StoreOp::Update { value, .. }
                | StoreOp::Put { value, .. } = &req.op
                {
                    let holding = matches!(
                        self.hosts[h].role(),
                        Some(Role::Confirming | Role::Active | Role::SteppingDown | Role::Lapsed)
                    );
                    let confirming = matches!(Observed::decode(value),
                        Observed::Record(r) if r.state == LockState::Confirming);
                    if key == Key::Lock && confirming && !holding {
                        self.hosts[h].acquisitions.insert((gen, req.id));
                    }
                }
                if let StoreOp::Update { value, .. } = &req.op {
                    // H6 is judged when the release is sent: it may land late.
                    if let Observed::Record(r) = Observed::decode(value) {
                        if r.state == LockState::Released {
                            let host = &self.hosts[h];
                            // Proof: our stop (we activated), or — for a
                            // tenure over a proven release that never ran
                            // anything — our predecessor's.
                            let proven = !host.running
                                && (host.activated_in_tenure || host.tenure_over_release);
                            self.release_proofs.insert(r.write, proven);
                        }
                    }
                }
                self.send_request(h, gen, req.id, req.op);
            }
            Output::HealthCheck { id, deadline, .. } => {
                let timeout = self.hosts[h].timing.healthcheck_timeout().as_nanos() as u64;
                // Liveness windows measure a healthy cluster: no random failures.
                let calm = self.now < self.calm_until;
                let slow = !calm && self.rng.chance(self.sc.slow_check);
                let dur = if slow {
                    timeout * 3 / 2
                } else {
                    self.rng.range(MS / 10, timeout / 2)
                };
                let ok = self.hosts[h].healthy
                    && !slow
                    && (calm || !self.rng.chance(self.sc.health_fail));
                let at = if slow {
                    self.local_to_real(h, deadline.as_nanos())
                } else {
                    self.after_local(h, dur)
                };
                self.at(
                    at,
                    Ev::Deliver {
                        h,
                        gen,
                        input: Input::Health { id, ok },
                    },
                );
            }
            Output::Fence { .. } => {
                let dur = self.rng.range(MS / 10, 50 * MS);
                let at = self.after_local(h, dur);
                let input = Input::Hook {
                    hook: Hook::Fence,
                    ok: true,
                };
                self.at(at, Ev::Deliver { h, gen, input });
            }
            Output::Activate { token, .. } => {
                self.on_activate(h, token);
                let dur = self.rng.range(MS, 500 * MS);
                let at = self.after_local(h, dur);
                let input = Input::Hook {
                    hook: Hook::Activate,
                    ok: !self.rng.chance(self.sc.activate_fail),
                };
                self.at(at, Ev::Deliver { h, gen, input });
            }
            Output::Stop { id, kind, .. } => self.begin_stop(h, Some(id), kind),
            Output::Keeper(cmd) => {
                // Commands travel a socket to the keeper in order; now and
                // then the keeper is slow to read them.
                // Liveness windows measure a healthy cluster: a healthy keeper.
                let calm = self.now < self.calm_until;
                let d = if !calm && self.rng.chance(self.sc.keeper_slow) {
                    self.rng.range(10 * MS, 200 * MS)
                } else {
                    self.rng.range(MS / 50, 2 * MS)
                };
                let host = &mut self.hosts[h];
                let at = (self.now + d).max(host.keeper_busy_until);
                host.keeper_busy_until = at;
                let (conn, boot) = (gen, host.boot);
                self.at(at, Ev::KeeperCmd { h, conn, boot, cmd });
            }
            Output::Rejoin { .. } => {
                let dur = self.rng.range(10 * MS, 300 * MS);
                let at = self.after_local(h, dur);
                let input = Input::Hook {
                    hook: Hook::Rejoin,
                    ok: !self.rng.chance(0.2),
                };
                self.at(at, Ev::Deliver { h, gen, input });
            }
            Output::PersistHighest(t) => self.hosts[h].persisted.highest = Some(t),
            // The simulated hosts publish no position (no --max-lag): a
            // host without --position ignores the request.
            Output::SamplePosition => {}
            Output::FailsafeAnswer { id, answer } => self.failsafe_answer(h, id, &answer),
            // The round ends at the store timeout, as the core's deadline
            // says (on the holder's clock; near enough here).
            Output::FailsafeAsk {
                round,
                token,
                members,
                ..
            } => self.failsafe_ask(h, gen, round, token, &members),
            Output::Event(e) => self.on_event(h, e),
            Output::Exit(reason) => {
                let host = &mut self.hosts[h];
                host.agent = None;
                host.agent_gen += 1;
                host.next_wake = None;
                if !matches!(reason, ExitReason::Shutdown { .. }) {
                    self.check.fail(
                        "exit",
                        self.now,
                        format!("h{h} exited unexpectedly: {reason:?}"),
                    );
                }
                if let Some(delay) = self.hosts[h].restart_after_exit.take() {
                    self.at(self.now + delay, Ev::Restart { h });
                }
            }
        }
    }

    fn on_event(&mut self, h: usize, e: Event) {
        if e == Event::Rejoined {
            self.hosts[h].rejoin_pending = false;
        }
        if let Event::Transition {
            from,
            to,
            reason,
            token,
        } = &e
        {
            let local = self.hosts[h].local(self.now);
            let host = &mut self.hosts[h];
            if *to == Role::Confirming {
                host.tenure_token = *token;
                host.tenure_ack = Some(local);
                host.absent_before_tenure = host.absent_since;
                host.activated_in_tenure = false;
                host.tenure_over_release =
                    matches!(reason, Reason::AcquiredReleased | Reason::AcquiredHandover);
                host.max_seen_before_tenure = host.max_seen_at_acquire;
                // (g) O3/O4: only eligible nodes take over.
                if host.priority == 0 || host.rejoin_pending {
                    let why = if host.priority == 0 {
                        "has priority 0"
                    } else {
                        "has not rejoined"
                    };
                    self.check.fail(
                        "g/ineligible",
                        self.now,
                        format!("h{h} takes the lock ({reason:?}) but {why} (O3/O4)"),
                    );
                }
                // (h) O1: a release handed to another node is theirs for D.
                if let Err(msg) = crate::check::handover_respected(self, h, local) {
                    self.check
                        .fail("h/handover", self.now, format!("h{h}: {msg}"));
                }
            }
            let host = &mut self.hosts[h];
            if *to == Role::Active {
                // Also a resume with an adopted keeper (no activation output).
                host.activated_in_tenure = true;
                host.tenure_open = true;
            }
            if *reason == Reason::Released {
                host.tenure_open = false;
            }
            // O2/O4: a paused tenure taken back after a restart went on; no
            // one else held the lock meanwhile, so there is nothing to rejoin.
            if *reason == Reason::ResumedPaused {
                host.rejoin_pending = false;
            }
            // (j) O5: a failback only after the target was ready for the
            // whole hold-down, as this node heard it.
            if let (Reason::Failback { to }, Some(hold)) = (reason, self.sc.failback_after) {
                let since = host.ready_view.get(to).copied();
                let hold = hold.as_nanos() as u64;
                if since.is_none_or(|s| local < s + hold) {
                    let ready_for = since.map(|s| (local - s) as f64 / 1e9);
                    self.check.fail(
                        "j/failback",
                        self.now,
                        format!(
                            "h{h} fails back to {to} ready for {ready_for:?} s, hold-down {:.3} s (O5)",
                            hold as f64 / 1e9
                        ),
                    );
                }
            }
            if *to == Role::Lapsed {
                host.lapsed_on_purpose = matches!(
                    reason,
                    Reason::StopFailed | Reason::StopTimedOut | Reason::KeeperLost
                );
            }
            self.check.transition(h, *from, *to, reason, self.now);
        }
    }

    fn on_activate(&mut self, h: usize, token: Token) {
        let now = self.now;
        let local = self.hosts[h].local(now);
        let running: Vec<usize> = (0..self.hosts.len())
            .filter(|&o| o != h && self.hosts[o].running)
            .collect();
        // A store that lost acknowledged writes broke its contract. A node
        // that was never shown evidence of a rollback ([`RollbackView`]:
        // a lost record of another writer, then a record written since at
        // or below it) cannot tell (S6 works only for those that were);
        // only the fencing token protects it then from the writers of the
        // lost records. Such an activation may overlap with a node whose
        // records that rollback lost, and on a token at or below one that
        // rollback lost it is not judged by (b) and (d). Every other check
        // stays on.
        let host = &self.hosts[h];
        let unwitnessed: Vec<&Vec<LostRecord>> = self
            .store
            .lost
            .iter()
            .enumerate()
            .filter(|(i, _)| !host.rollbacks.get(*i).is_some_and(|v| v.evidence))
            .map(|(_, r)| &r.lost)
            .collect();
        let excused = |o: usize| {
            let node = format!("node{o}");
            unwitnessed
                .iter()
                .any(|lost| lost.iter().any(|(_, _, n)| *n == node))
        };
        let running: Vec<usize> = running.into_iter().filter(|&o| !excused(o)).collect();
        let judged = !unwitnessed
            .iter()
            .any(|lost| lost.iter().any(|(t, _, _)| token <= *t));
        if !unwitnessed.is_empty() {
            self.check.stats.unwitnessed_rollbacks += 1;
        }
        // (f) the service starts only under an armed keeper.
        let host = &self.hosts[h];
        if !host.keeper_alive || !matches!(host.keeper, KeeperState::Armed(d) if d > local) {
            let keeper = host.keeper;
            let alive = host.keeper_alive;
            self.check.fail(
                "f/unguarded",
                now,
                format!(
                    "h{h} starts its service with token {token:?} while its keeper is \
                     {keeper:?} (alive: {alive}): nobody would stop it at the deadline"
                ),
            );
        }
        // (a) never two services at once.
        if let Some(&o) = running.first() {
            self.check.fail(
                "a/overlap",
                now,
                format!("h{h} activates with token {token:?} while h{o}'s service still runs"),
            );
        }
        // (b) tokens of successive holders increase; no one acts on a regressed one.
        let host = &self.hosts[h];
        if judged {
            self.check.token(h, token, host.max_seen_before_tenure, now);
            // (d) not earlier than the node's own rules allow on its own clock.
            let verdict = crate::check::earliest_activation(self, h, local);
            if let Err(msg) = verdict {
                self.check.fail("d/early", now, format!("h{h}: {msg}"));
            }
        }
        let host = &mut self.hosts[h];
        host.activated_in_tenure = true;
        if !host.running {
            host.running = true;
        }
        self.check.activated(h, token, now);
        // (k) The holding that activated: the one that wrote `token`.
        let holding = self
            .store
            .holdings
            .iter()
            .find(|((t, _), (writer, _))| *t == token && *writer == h)
            .map(|(_, (_, holding))| *holding);
        if let Some(holding) = holding {
            self.activations.push((h, token, holding));
            self.check_token_holds();
        }
    }

    // ----- store and network -------------------------------------------------

    fn send_request(&mut self, h: usize, gen: u64, id: OpId, op: StoreOp) {
        let host = &self.hosts[h];
        let calm = self.now < self.calm_until;
        if !host.link_to || (!calm && self.rng.chance(self.sc.req_loss)) {
            return;
        }
        let hold = host.hold_until;
        let d = self.rng.range(self.sc.req_delay.0, self.sc.req_delay.1);
        // Requests are never duplicated: the store contract says a conflict
        // means "definitely not applied", which a replayed CAS would break.
        // Replies are duplicated and reordered (see `reply`).
        let at = (self.now + d).max(hold);
        self.at(at, Ev::Arrive { h, gen, id, op });
    }

    fn reply(&mut self, h: usize, gen: u64, id: OpId, outcome: StoreOutcome) {
        let host = &self.hosts[h];
        let calm = self.now < self.calm_until;
        if !host.link_from || (!calm && self.rng.chance(self.sc.reply_loss)) {
            return;
        }
        let d = if self.sc.late_replies && !calm && self.rng.chance(0.5) {
            let st = host.timing.store_timeout().as_nanos() as u64;
            self.rng.range(st * 8 / 10, st * 98 / 100)
        } else {
            self.rng.range(self.sc.reply_delay.0, self.sc.reply_delay.1)
        };
        let at = (self.now + d).max(host.hold_until);
        if self.rng.chance(self.sc.dup) {
            let again = at + self.rng.range(0, 50 * MS);
            let input = Input::Store {
                id,
                outcome: outcome.clone(),
            };
            self.at(again, Ev::Deliver { h, gen, input });
        }
        self.at(
            at,
            Ev::Deliver {
                h,
                gen,
                input: Input::Store { id, outcome },
            },
        );
    }

    fn apply(&mut self, h: usize, gen: u64, id: OpId, op: StoreOp) {
        let outcome = match op {
            StoreOp::Get {
                key: Key::Lock,
                leader,
            } => {
                let entry = match self.hosts[h].stale_view_since {
                    _ if leader && self.store.deposed_until > self.now => {
                        self.store.as_of(self.store.deposed_at)
                    }
                    Some(since) if !leader => self.store.as_of(since),
                    _ if !leader && self.sc.replica_lag > 0 => {
                        let lag = self.rng.range(0, self.sc.replica_lag);
                        self.store.as_of(self.now.saturating_sub(lag))
                    }
                    _ => self.store.current().cloned(),
                };
                StoreOutcome::Read(entry)
            }
            StoreOp::Get {
                key: Key::Probe, ..
            } => StoreOutcome::Read(self.store.probes[h].clone()),
            StoreOp::Create {
                key: Key::Lock,
                value,
            } => {
                if self.store.current().is_some() {
                    StoreOutcome::Conflict
                } else {
                    let vacant_for = self.vacancy();
                    let key = fingerprint(&value);
                    let token = self.write_lock_by(h, gen, id, value);
                    self.hosts[h].lock_writes.insert(id, (token, key));
                    match vacant_for {
                        Some(vacant_for) => {
                            self.hosts[h].vacancy_given.insert(token, vacant_for);
                            StoreOutcome::Created { token, vacant_for }
                        }
                        None => StoreOutcome::Written(token),
                    }
                }
            }
            StoreOp::Update {
                key: Key::Lock,
                value,
                expected,
            } => {
                if self.store.current().map(|e| e.token) == Some(expected) {
                    self.check_unpause(h, &value);
                    let released = matches!(Observed::decode(&value),
                        Observed::Record(r) if r.state == LockState::Released);
                    let key = fingerprint(&value);
                    let token = self.write_lock_by(h, gen, id, value);
                    if released {
                        self.hosts[h].release_writes.insert(id, (token, key));
                    }
                    self.hosts[h].lock_writes.insert(id, (token, key));
                    StoreOutcome::Written(token)
                } else {
                    StoreOutcome::Conflict
                }
            }
            StoreOp::Put {
                key: Key::Lock,
                value,
            } => StoreOutcome::Written(self.write_lock_by(h, gen, id, value)),
            StoreOp::Put {
                key: Key::Probe,
                value,
            }
            | StoreOp::Create {
                key: Key::Probe,
                value,
            } => {
                let (token, time) = self.store.stamp(self.now);
                self.store.probes[h] = Some(Entry { value, token, time });
                StoreOutcome::Written(token)
            }
            StoreOp::Update {
                key: Key::Probe, ..
            } => StoreOutcome::Conflict,
        };
        self.reply(h, gen, id, outcome);
    }

    /// S4 refined: how long the store proves the lock key was vacant, as a
    /// durable store with a steady clock proves it: since the epoch began,
    /// and not at all over a delete marker or on a store that loses
    /// writes. `None`: no proof (a plain `Written`).
    fn vacancy(&self) -> Option<std::time::Duration> {
        let m = self.sc.mutations;
        if !self.sc.durable && !m.is(Rule::VacancyOnLossyStore) {
            return None;
        }
        if self.store.deleted && !m.is(Rule::VacancyIgnoresDelete) {
            return None;
        }
        let began = if m.is(Rule::VacancyIgnoresStoreAge) {
            0
        } else {
            self.store.epoch_began
        };
        let now = self.store.clock.local(self.now);
        Some(std::time::Duration::from_nanos(now.saturating_sub(began)))
    }

    /// A lock write of host `h`'s request `(gen, id)`, labelled with the
    /// holding it belongs to (k).
    fn write_lock_by(&mut self, h: usize, gen: u64, id: OpId, value: Vec<u8>) -> Token {
        let begins = self.hosts[h].acquisitions.remove(&(gen, id));
        let continued = self
            .store
            .current()
            .and_then(|e| self.store.holdings.get(&(e.token, fingerprint(&e.value))))
            .filter(|(writer, _)| *writer == h && !begins)
            .map(|(_, holding)| *holding);
        let holding = continued.unwrap_or_else(|| {
            self.store.next_holding += 1;
            self.store.next_holding
        });
        self.pending_holding = Some((h, holding));
        self.write_lock(value)
    }

    fn write_lock(&mut self, value: Vec<u8>) -> Token {
        let (token, time) = self.store.stamp(self.now);
        if let Some(label) = self.pending_holding.take() {
            self.store
                .holdings
                .insert((token, fingerprint(&value)), label);
        }
        let prev = self.store.current().cloned();
        let entry = Entry { value, token, time };
        let proven = match Observed::decode(&entry.value) {
            Observed::Record(r) if r.state == LockState::Released => {
                self.release_proofs.get(&r.write).copied().unwrap_or(false)
            }
            _ => false,
        };
        self.store
            .written_at
            .insert((token, fingerprint(&entry.value)), self.now);
        self.store.log.push(Applied {
            token,
            prev,
            value: entry.value.clone(),
            proven,
        });
        self.store.versions.push(Version {
            real: self.now,
            entry: Some(entry.clone()),
        });
        self.broadcast(Some(entry));
        self.check_token_holds();
        token
    }

    /// (k) The token check (`LockRecord::holds_token`) on the store's
    /// record now, for every token any host activated on: it says "held"
    /// exactly when the record was written by the holding that activated
    /// on the token and is `confirming` or `active` — never a previous
    /// holder's token (safety), always the current one's (liveness). Not
    /// judged in an epoch whose store lost acknowledged writes.
    fn check_token_holds(&mut self) {
        let epoch = self.store.epoch;
        self.activations.retain(|(_, t, _)| t.epoch == epoch);
        if self.store.rolled_back.contains(&epoch) || self.activations.is_empty() {
            return;
        }
        let current = self.store.current().map(|e| {
            let label = self
                .store
                .holdings
                .get(&(e.token, fingerprint(&e.value)))
                .copied();
            (e.token, Observed::decode(&e.value), label)
        });
        for &(h, token, holding) in &self.activations {
            let (says, truth) = match &current {
                Some((at, Observed::Record(r), label)) => (
                    r.holds_token(*at, token),
                    *label == Some((h, holding))
                        && matches!(r.state, LockState::Confirming | LockState::Active),
                ),
                _ => (false, false),
            };
            if says != truth {
                let record = describe_entry(self.store.current());
                let msg = format!(
                    "h{h}'s token {token:?} (holding {holding}) checks as {} on {record}",
                    if says { "held" } else { "not held" }
                );
                self.check.fail("k/token-check", self.now, msg);
                return;
            }
        }
    }

    fn broadcast(&mut self, entry: Option<Entry>) {
        for h in 0..self.hosts.len() {
            let host = &self.hosts[h];
            if host.agent.is_none()
                || !host.link_from
                || host.stale_view_since.is_some()
                || host.store_lost_until > self.now
            {
                continue;
            }
            let d = self.rng.range(self.sc.watch_delay.0, self.sc.watch_delay.1);
            let at = (self.now + d).max(host.watch_last).max(host.hold_until);
            self.hosts[h].watch_last = at;
            let gen = self.hosts[h].agent_gen;
            if self.rng.chance(self.sc.dup) {
                // A duplicated event, possibly after newer ones.
                let again = at + self.rng.range(0, 50 * MS);
                let input = Input::Watch(entry.clone());
                self.at(again, Ev::Deliver { h, gen, input });
            }
            self.at(
                at,
                Ev::Deliver {
                    h,
                    gen,
                    input: Input::Watch(entry.clone()),
                },
            );
        }
    }

    // ----- keeper and service --------------------------------------------------

    /// The keeper carries out a command and answers the agent.
    fn keeper_cmd(&mut self, h: usize, conn: u64, boot: u64, cmd: KeeperCommand) {
        let local = self.hosts[h].local(self.now);
        let calm = self.now < self.calm_until;
        let refuse = !calm && self.rng.chance(self.sc.arm_refuse);
        let host = &mut self.hosts[h];
        if host.boot != boot || host.keeper_conn != conn {
            return; // the host rebooted, or a newer agent controls the keeper
        }
        if !host.keeper_alive {
            if !matches!(cmd, KeeperCommand::Arm(_)) {
                return; // nobody reads it; the agent knows the keeper is gone
            }
            // The host starts a new keeper for the new tenure.
            host.keeper_alive = true;
            host.keeper = KeeperState::Disarmed;
            host.kgen += 1;
        }
        let deadline = match (cmd, host.keeper) {
            // Refused: its deadline already passed, or the keeper failed.
            (KeeperCommand::Arm(d), _) if refuse || d.as_nanos() <= local => None,
            (KeeperCommand::Arm(d), _) => Some(d),
            // The keeper refuses extensions that arrive after its deadline.
            (KeeperCommand::Extend(d), KeeperState::Armed(cur)) if local < cur => Some(d),
            (KeeperCommand::Extend(_), _) => None,
            (KeeperCommand::Disarm, _) => {
                host.keeper = KeeperState::Disarmed;
                host.kgen += 1;
                None
            }
        };
        // (i) O2: a running service loses its keeper only to a pause that
        // landed: the store holds a paused record of this tenure (written
        // by this instance, or by the earlier one whose tenure it resumed
        // with the adopted keeper: the same node).
        if cmd == KeeperCommand::Disarm && host.running && host.stop.is_none() {
            let instance = host.instance.clone();
            let node = format!("node{h}");
            let tenure = host.tenure_token;
            let landed = self.store.log.iter().rev().any(|a| {
                tenure.is_none_or(|t| a.token >= t)
                    && matches!(Observed::decode(&a.value),
                        Observed::Record(r) if (r.instance == instance || r.node == node)
                            && r.paused.is_some())
            });
            if !landed {
                self.check.fail(
                    "i/pause",
                    self.now,
                    format!("h{h}'s keeper is disarmed while its service runs and no paused record of its tenure landed (O2)"),
                );
            }
        }
        let host = &mut self.hosts[h];
        let ok = deadline.is_some() || cmd == KeeperCommand::Disarm;
        if let Some(d) = deadline {
            let d = match host.keeper {
                // Never moves backwards.
                KeeperState::Armed(cur) if matches!(cmd, KeeperCommand::Extend(_)) => {
                    cur.max(d.as_nanos())
                }
                _ => d.as_nanos(),
            };
            host.keeper = KeeperState::Armed(d);
            host.kgen += 1;
            let kgen = host.kgen;
            let at = self.local_to_real(h, d);
            self.at(at, Ev::KeeperCheck { h, kgen });
        }
        self.log(|| format!("h{h} keeper {cmd:?} ok={ok}"));
        let at = self.now + self.rng.range(MS / 50, MS);
        let input = Input::KeeperAck { command: cmd, ok };
        self.at(
            at,
            Ev::Deliver {
                h,
                gen: conn,
                input,
            },
        );
    }

    fn keeper_check(&mut self, h: usize, kgen: u64) {
        let local = self.hosts[h].local(self.now);
        let host = &mut self.hosts[h];
        if host.kgen != kgen || !host.keeper_alive {
            return;
        }
        let KeeperState::Armed(d) = host.keeper else {
            return;
        };
        if local < d {
            let at = self.local_to_real(h, d);
            self.at(at, Ev::KeeperCheck { h, kgen });
            return;
        }
        host.keeper = KeeperState::Fired;
        host.kgen += 1;
        self.log(|| format!("h{h} keeper fires"));
        self.begin_stop(h, None, StopKind::Emergency);
        let gen = self.hosts[h].agent_gen;
        self.at(
            self.now,
            Ev::Deliver {
                h,
                gen,
                input: Input::KeeperFired,
            },
        );
    }

    fn begin_stop(&mut self, h: usize, id: Option<StopId>, kind: StopKind) {
        let gen = self.hosts[h].agent_gen;
        if !self.hosts[h].running && self.hosts[h].stop.is_none() {
            if let Some(id) = id {
                let dur = self.rng.range(MS / 10, 20 * MS);
                let at = self.after_local(h, dur);
                self.at(
                    at,
                    Ev::Deliver {
                        h,
                        gen,
                        input: Input::Stopped { id, ok: true },
                    },
                );
            }
            return;
        }
        let timing = &self.hosts[h].timing;
        let (dur, ok) = match kind {
            StopKind::Emergency => {
                let max = timing.emergency_timeout().as_nanos() as u64;
                let d = if self.sc.full_stops {
                    max
                } else {
                    self.rng.range(0, max)
                };
                (d, true)
            }
            StopKind::Graceful => {
                let max = timing.stop_timeout().as_nanos() as f64 * self.sc.graceful_slowness;
                (
                    self.rng.range(MS, max as u64),
                    !self.rng.chance(self.sc.graceful_fail),
                )
            }
            StopKind::Startup => (self.rng.range(MS, 200 * MS), true),
        };
        let done_at = self.after_local(h, dur);
        let host = &mut self.hosts[h];
        let reschedule = match &mut host.stop {
            Some(p) => {
                if let Some(id) = id {
                    p.ids.push(id);
                }
                p.fired |= id.is_none();
                // An emergency (or start-up) stop escalates a running
                // graceful one: it ends by its own deadline and succeeds.
                if kind != StopKind::Graceful {
                    p.ok = true;
                }
                if done_at < p.done_at {
                    p.done_at = done_at;
                    p.ok = ok;
                    true
                } else {
                    false
                }
            }
            None => {
                host.stop = Some(StopProc {
                    done_at,
                    ok,
                    ids: id.into_iter().collect(),
                    fired: id.is_none(),
                });
                true
            }
        };
        if reschedule {
            host.sgen += 1;
            let sgen = host.sgen;
            self.at(done_at, Ev::StopDone { h, sgen });
        }
    }

    fn stop_done(&mut self, h: usize, sgen: u64) {
        let host = &mut self.hosts[h];
        if host.sgen != sgen {
            return;
        }
        let Some(mut p) = host.stop.take() else {
            return;
        };
        // A stuck service (see `stuck_until`) survives the stop.
        let keeps_lease = match host.agent.as_ref().map(|a| a.role()) {
            Some(Role::SteppingDown) => true,
            Some(Role::Lapsed) => host.lapsed_on_purpose,
            _ => false,
        };
        if host.running && host.stuck_until > self.now && keeps_lease && !p.fired {
            p.ok = false;
        }
        if p.ok {
            host.running = false;
        }
        let gen = host.agent_gen;
        self.log(|| format!("h{h} stop done ok={}", p.ok));
        for id in p.ids {
            self.at(
                self.now,
                Ev::Deliver {
                    h,
                    gen,
                    input: Input::Stopped { id, ok: p.ok },
                },
            );
        }
    }

    // ----- faults ------------------------------------------------------------

    fn holder(&self) -> Option<usize> {
        (0..self.hosts.len()).find(|&h| self.hosts[h].role() == Some(Role::Active))
    }

    fn target(&mut self) -> usize {
        match self.holder() {
            Some(h) if self.rng.chance(0.6) => h,
            _ => self.rng.range(0, self.hosts.len() as u64 - 1) as usize,
        }
    }

    fn lease_of(&self, h: usize) -> u64 {
        self.hosts[h].timing.lease().as_nanos() as u64
    }

    fn inject(&mut self) {
        if self.now < self.calm_until || self.probe_pending {
            let at = self.calm_until.max(self.now + SEC);
            self.at(at, Ev::Fault);
            return;
        }
        let total: u32 = self.sc.faults.iter().map(|f| f.1).sum();
        let mut pick = self.rng.range(0, u64::from(total) - 1) as u32;
        let mut kind = self.sc.faults[0].0;
        for (k, w) in self.sc.faults.clone() {
            if pick < w {
                kind = k;
                break;
            }
            pick -= w;
        }
        let h = self.target();
        let t = self.lease_of(h);
        // S1 (b) guards against one faulty clock at a time: the standby's or
        // the store's. Both at once is outside the assumptions, so clock
        // faults stay well apart (a staleness wait covers at most 2W).
        let clock_fault = matches!(
            kind,
            FaultKind::NodeJump
                | FaultKind::StoreJump
                | FaultKind::IsolateAndJump
                | FaultKind::IsolateAndStoreJump
                | FaultKind::LeaderChange
        );
        if clock_fault {
            if self.now < self.last_clock_fault + 5 * self.check.failover_bound {
                let next = self.now + self.rng.range(self.sc.fault_gap.0, self.sc.fault_gap.1);
                self.at(next, Ev::Fault);
                return;
            }
            self.last_clock_fault = self.now;
        }
        let r = self.hosts[h].timing.renew().as_nanos() as u64;
        self.faults_injected += 1;
        self.log(|| format!("FAULT {kind:?} on h{h}"));
        use FaultKind::*;
        match kind {
            HostCrash => {
                if self.hosts[h].agent.is_some() || self.hosts[h].keeper_alive {
                    self.crash(h);
                    let at = self.now + self.rng.range(t / 5, 2 * t);
                    self.at(at, Ev::Restart { h });
                }
            }
            // A frozen or killed agent whose keeper is dead leaves its
            // service unguarded: outside the assumptions, not injected.
            AgentKill | Stall if self.unguarded(h) => {}
            AgentKill => {
                if self.hosts[h].agent.is_some() {
                    self.kill_agent(h);
                    let at = self.now + self.rng.range(0, t * 3 / 2);
                    self.at(at, Ev::Restart { h });
                }
            }
            Stall => {
                let base = *self.rng.pick(&[t / 2, t, 3 * t]);
                let dur = self.rng.range(base * 8 / 10, base * 12 / 10);
                let host = &mut self.hosts[h];
                if host.agent.is_some() && host.stalled_until <= self.now {
                    host.stalled_until = self.now + dur;
                    let gen = host.agent_gen;
                    self.at(self.now + dur, Ev::StallEnd { h, gen });
                }
            }
            Partition | OneWay => {
                let longest = if self.sc.failsafe { 5 * t } else { 3 * t };
                let dur = self.rng.range(t / 2, longest);
                let host = &mut self.hosts[h];
                if kind == Partition {
                    host.link_to = false;
                    host.link_from = false;
                    // Failsafe: half the partitions cut the host off from
                    // its peers too; the others leave it the peer network
                    // (the store is what failed).
                    if self.sc.failsafe {
                        host.peer_off = self.rng.chance(0.5);
                    }
                } else if self.rng.chance(0.5) {
                    host.link_to = false;
                } else {
                    host.link_from = false;
                }
                self.active_faults += 1;
                self.at(
                    self.now + dur,
                    Ev::Heal {
                        h,
                        what: Heal::Links,
                    },
                );
            }
            StorePause => {
                // Failsafe: some outages outlast the cap (3T).
                let longest = if self.sc.failsafe { 5 * t } else { 2 * t };
                let dur = self.rng.range(t / 10, longest);
                self.store.paused_until = self.now + dur;
                self.active_faults += 1;
                self.at(
                    self.now + dur,
                    Ev::Heal {
                        h,
                        what: Heal::StorePause,
                    },
                );
            }
            Rollback => {
                let k = self.rng.range(1, 20);
                let floor = self.store.versions.first().map_or(0, |v| {
                    v.entry
                        .as_ref()
                        .map_or(0, |e| e.token.revision.saturating_sub(1))
                });
                let old_rev = self.store.rev;
                let new_rev = old_rev.saturating_sub(k).max(floor);
                self.store.rev = new_rev;
                let mut lost = Vec::new();
                for v in &self.store.versions {
                    if let Some(e) = v.entry.as_ref().filter(|e| e.token.revision > new_rev) {
                        let node = match Observed::decode(&e.value) {
                            Observed::Record(r) => r.node,
                            Observed::Garbage => String::new(),
                        };
                        lost.push((e.token, fingerprint(&e.value), node));
                    }
                }
                self.store.lost.push(RolledBack { at: self.now, lost });
                self.store.rolled_back.insert(self.store.epoch);
                self.store
                    .versions
                    .retain(|v| v.entry.as_ref().is_none_or(|e| e.token.revision <= new_rev));
                for p in &mut self.store.probes {
                    if p.as_ref().is_some_and(|e| e.token.revision > new_rev) {
                        *p = None;
                    }
                }
                self.check.rollback_happened = true;
                let high = Token::new(self.store.epoch, old_rev);
                self.store.lost_high = Some(self.store.lost_high.map_or(high, |l| l.max(high)));
                self.last_instant_fault = self.now;
            }
            Recreate => {
                self.recreate();
                self.last_instant_fault = self.now;
            }
            OperatorDelete => {
                if self.store.current().is_some() {
                    self.store.rev += 1;
                    self.store.deleted = true;
                    self.store.versions.push(Version {
                        real: self.now,
                        entry: None,
                    });
                    self.broadcast(None);
                    self.check_token_holds();
                    self.last_instant_fault = self.now;
                }
            }
            StoreReplaced => {
                // The store's file is replaced by a new, empty one. Every
                // handle notices at its next call (the path no longer names
                // its file) and fails it as unknown, until it opens the new
                // file: at once for some, up to T later for others.
                for host in 0..self.hosts.len() {
                    let until = self.now + self.rng.range(0, t);
                    self.hosts[host].store_lost_until = until;
                    self.active_faults += 1;
                    self.at(
                        until,
                        Ev::Heal {
                            h: host,
                            what: Heal::Reopen,
                        },
                    );
                }
                self.recreate();
                self.last_instant_fault = self.now;
            }
            LeaderChange => {
                // A stream-leader election: writes wait for it; the deposed
                // leader keeps answering "leader" reads from its frozen
                // view meanwhile; the new leader's clock is offset from the
                // old one's.
                let dur = self.rng.range(t / 4, t);
                self.store.paused_until = self.now + dur;
                self.store.deposed_at = self.now;
                self.store.deposed_until = self.now + dur;
                let delta = self.rng.range(t / 10, t) as i64;
                let delta = if self.rng.chance(0.5) { delta } else { -delta };
                self.store.clock.jump(self.now, delta);
                self.active_faults += 1;
                self.at(
                    self.now + dur,
                    Ev::Heal {
                        h,
                        what: Heal::StorePause,
                    },
                );
                self.last_instant_fault = self.now + dur;
            }
            WatchReplay => {
                // A watch re-established from an older revision: the last
                // few versions again, in order, then the present.
                let host = &self.hosts[h];
                if host.agent.is_some() && host.link_from && host.stale_view_since.is_none() {
                    let k = self.rng.range(1, 6) as usize;
                    let from = self.store.versions.len().saturating_sub(k);
                    let replay: Vec<Option<Entry>> = self.store.versions[from..]
                        .iter()
                        .map(|v| v.entry.clone())
                        .collect();
                    let gen = self.hosts[h].agent_gen;
                    let mut at = self.now.max(self.hosts[h].watch_last);
                    for entry in replay {
                        at += self.rng.range(MS / 10, MS);
                        self.at(
                            at,
                            Ev::Deliver {
                                h,
                                gen,
                                input: Input::Watch(entry),
                            },
                        );
                    }
                    self.hosts[h].watch_last = at;
                }
            }
            NodeJump => {
                // A faulty forward jump (no real time passes). S1 (b) makes it
                // harmless for a standby's staleness wait; a holder's G' and
                // licence are measured on its clock alone, so a jump there is
                // outside the assumptions (rates within ε) and not injected.
                if self.hosts[h].role() == Some(Role::Standby) {
                    let delta = self.rng.range(t / 10, 2 * t) as i64;
                    self.jump(h, delta);
                    self.last_instant_fault = self.now;
                }
            }
            StoreJump => {
                let delta = self.rng.range(t / 10, 3 * t) as i64;
                let delta = if self.rng.chance(0.5) { delta } else { -delta };
                self.store.clock.jump(self.now, delta);
                self.last_instant_fault = self.now;
            }
            Garbage => {
                self.write_lock(b"\x00\xffnot a putex record".to_vec());
                self.last_instant_fault = self.now;
            }
            Revoke => {
                if let Some(Observed::Record(r)) =
                    self.store.current().map(|e| Observed::decode(&e.value))
                {
                    self.store.admin_writes += 1;
                    let drop_set = self.sc.mutations.is(Rule::FailsafeRevokeDropsSet);
                    let revoked = LockRecord {
                        state: LockState::Revoked,
                        write: format!("admin-{}", self.store.admin_writes),
                        failsafe: if drop_set { None } else { r.failsafe.clone() },
                        ..r
                    };
                    self.write_lock(revoked.encode());
                    self.last_instant_fault = self.now;
                }
            }
            Switchover => {
                if let Some(a) = self.holder() {
                    let others: Vec<usize> = (0..self.hosts.len()).filter(|&o| o != a).collect();
                    let to = if self.rng.chance(0.5) {
                        None
                    } else {
                        Some(format!("node{}", self.rng.pick(&others)))
                    };
                    let gen = self.hosts[a].agent_gen;
                    let input = Input::Switchover {
                        to,
                        allow_lag: false,
                    };
                    self.at(self.now + MS, Ev::Deliver { h: a, gen, input });
                }
            }
            Pause => {
                if !self.pausing {
                    self.pausing = true;
                    self.log(|| "OPERATOR pause".to_string());
                    for o in 0..self.hosts.len() {
                        if self.hosts[o].agent.is_some() && self.hosts[o].link_from {
                            let gen = self.hosts[o].agent_gen;
                            let input = Input::Pause(sim_pause());
                            let at = self.now + self.rng.range(MS / 10, 5 * MS);
                            self.at(at, Ev::Deliver { h: o, gen, input });
                        }
                    }
                    let at = self.now + self.rng.range(t, 5 * t);
                    self.at(at, Ev::Resume);
                }
            }
            HealthFlap => {
                let dur = self.rng.range(r, 3 * t);
                self.hosts[h].healthy = false;
                self.active_faults += 1;
                self.at(
                    self.now + dur,
                    Ev::Heal {
                        h,
                        what: Heal::Health,
                    },
                );
            }
            Shutdown => {
                let host = &mut self.hosts[h];
                if host.agent.is_some() && host.restart_after_exit.is_none() {
                    host.restart_after_exit = Some(self.rng.range(r, 2 * t));
                    let gen = host.agent_gen;
                    self.at(
                        self.now,
                        Ev::Deliver {
                            h,
                            gen,
                            input: Input::Shutdown,
                        },
                    );
                }
            }
            StaleView => {
                if self.hosts[h].stale_view_since.is_none() {
                    let dur = self.rng.range(t, 4 * t);
                    self.hosts[h].stale_view_since = Some(self.now);
                    self.active_faults += 1;
                    self.at(
                        self.now + dur,
                        Ev::Heal {
                            h,
                            what: Heal::StaleView,
                        },
                    );
                }
            }
            ChildExit => {
                if let Some(a) = self.holder() {
                    if self.hosts[a].running && self.hosts[a].stop.is_none() {
                        self.hosts[a].running = false;
                        let gen = self.hosts[a].agent_gen;
                        self.at(
                            self.now,
                            Ev::Deliver {
                                h: a,
                                gen,
                                input: Input::ServiceExited,
                            },
                        );
                    }
                }
            }
            Release => {
                if let Some(a) = self.holder() {
                    if self.hosts[a].running && self.hosts[a].stop.is_none() {
                        let gen = self.hosts[a].agent_gen;
                        for input in [Input::Turn(false), Input::Release] {
                            self.at(self.now, Ev::Deliver { h: a, gen, input });
                        }
                        self.active_faults += 1;
                        let back = self.rng.range(0, 2 * t);
                        self.at(
                            self.now + back,
                            Ev::Heal {
                                h: a,
                                what: Heal::Turn(gen),
                            },
                        );
                    }
                }
            }
            StuckStop => {
                // The holder's service cannot be stopped (or the stop cannot
                // be proven) for a while, and the holder is asked to stop:
                // it must keep its lease until a stop proves it.
                if let Some(a) = self.holder() {
                    if self.hosts[a].running && self.hosts[a].stop.is_none() {
                        let ta = self.lease_of(a);
                        self.hosts[a].stuck_until = self.now + self.rng.range(2 * ta, 6 * ta);
                        let gen = self.hosts[a].agent_gen;
                        let input = if self.rng.chance(0.5) {
                            Input::ServiceExited
                        } else {
                            self.hosts[a].restart_after_exit = Some(self.rng.range(r, 2 * t));
                            Input::Shutdown
                        };
                        self.at(self.now, Ev::Deliver { h: a, gen, input });
                    }
                }
            }
            KeeperDeath => {
                // The keeper is killed (OOM); the service lives on, and half
                // the time its tree is not found at once (orphans).
                let host = &mut self.hosts[h];
                // Not under a frozen agent: a keeper and its agent both out
                // of action is outside the assumptions.
                if host.keeper_alive && host.agent.is_some() && host.stalled_until <= self.now {
                    host.keeper_alive = false;
                    host.keeper = KeeperState::Disarmed;
                    host.kgen += 1;
                    if host.running && self.rng.chance(0.5) {
                        let th = self.lease_of(h);
                        self.hosts[h].stuck_until = self.now + self.rng.range(2 * th, 6 * th);
                    }
                    let gen = self.hosts[h].agent_gen;
                    let input = Input::KeeperLost;
                    self.at(self.now, Ev::Deliver { h, gen, input });
                }
            }
            HoldTraffic => {
                let dur = self.rng.range(t, 2 * t);
                self.hosts[h].hold_until = self.now + dur;
                self.last_instant_fault = self.now + dur;
            }
            IsolateAndJump => {
                if let Some(a) = self.holder() {
                    let standbys: Vec<usize> = (0..self.hosts.len())
                        .filter(|&b| self.hosts[b].role() == Some(Role::Standby))
                        .collect();
                    if !standbys.is_empty() {
                        let b = *self.rng.pick(&standbys);
                        self.cut_off_for_3t(a);
                        let w = self.hosts[b].timing.staleness_wait(
                            self.hosts[a]
                                .timing
                                .lease()
                                .max(self.hosts[b].timing.lease()),
                        );
                        // On a stepped store clock also jumps past 2W: the
                        // fallback for a clock that went back must not let
                        // them through (`docs/safety.md` §4.2).
                        let w = w.as_nanos() as u64;
                        let delta = if !self.sc.store_step.is_zero() && self.rng.chance(0.5) {
                            (2 * w + self.rng.range(0, w)) as i64
                        } else {
                            w as i64
                        };
                        if self.sc.failsafe && self.rng.chance(0.5) {
                            // F4: the standby restarts once the holder's
                            // record is W old on the store's clock (the holder
                            // runs on grants), and its clock jumps as it comes
                            // back: only its floor stands in the way.
                            let at = self.now + w + self.rng.range(r, 2 * r);
                            self.at(at, Ev::RestartAndJump { h: b, delta });
                        } else {
                            let at = self.now + self.rng.range(0, r);
                            self.at(at, Ev::Jump { h: b, delta });
                        }
                        self.last_instant_fault = self.now;
                    }
                }
            }
            IsolateAndStoreJump => {
                if let Some(a) = self.holder() {
                    let ta = self.cut_off_for_3t(a);
                    // Forward by the longest W, once the holder runs on
                    // grants: a member's own clock is the one witness left.
                    let w = (0..self.hosts.len())
                        .map(|b| {
                            let tb = self.hosts[b].timing.lease();
                            self.hosts[b]
                                .timing
                                .staleness_wait(self.hosts[a].timing.lease().max(tb))
                        })
                        .max()
                        .expect("hosts")
                        .as_nanos() as i64;
                    self.at(self.now + ta, Ev::StoreJump { delta: w });
                    self.last_instant_fault = self.now;
                }
            }
            PeerCut => {
                let dur = self.rng.range(t / 2, 3 * t);
                self.hosts[h].peer_off = true;
                self.active_faults += 1;
                self.at(
                    self.now + dur,
                    Ev::Heal {
                        h,
                        what: Heal::Peers,
                    },
                );
            }
        }
        let next = self.now + self.rng.range(self.sc.fault_gap.0, self.sc.fault_gap.1);
        self.at(next, Ev::Fault);
    }

    /// Cuts host `a` off from the store (not from its peers) for 3 of its
    /// T; returns its T.
    fn cut_off_for_3t(&mut self, a: usize) -> u64 {
        let host = &mut self.hosts[a];
        host.link_to = false;
        host.link_from = false;
        self.active_faults += 1;
        let ta = self.lease_of(a);
        self.at(
            self.now + 3 * ta,
            Ev::Heal {
                h: a,
                what: Heal::Links,
            },
        );
        ta
    }

    /// The bucket is deleted and made anew: a new epoch, nothing in it.
    fn recreate(&mut self) {
        self.store.epoch += 1;
        self.store.epoch_began = self.store.clock.local(self.now);
        self.store.deleted = false;
        self.store.rev = 0;
        self.store.versions.clear();
        self.store.probes.iter_mut().for_each(|p| *p = None);
        self.broadcast(None);
    }

    /// Whether host `h`'s service may run with no keeper to stop it.
    fn unguarded(&self, h: usize) -> bool {
        let host = &self.hosts[h];
        !host.keeper_alive && (host.running || host.stop.is_some())
    }

    fn jump(&mut self, h: usize, delta: i64) {
        self.log(|| format!("h{h} clock jumps {:.3}s", delta as f64 / 1e9));
        let now = self.now;
        let host = &mut self.hosts[h];
        host.clock.jump(now, delta);
        // Timers computed from the old mapping fire late: re-arm them now.
        host.next_wake = Some(now);
        let gen = host.agent_gen;
        let kgen = host.kgen;
        self.at(now, Ev::Wake { h, gen });
        self.at(now, Ev::KeeperCheck { h, kgen });
    }

    fn heal(&mut self, h: usize, what: Heal) {
        self.active_faults = self.active_faults.saturating_sub(1);
        match what {
            Heal::Links => {
                let host = &mut self.hosts[h];
                let watch_back = !host.link_from;
                host.link_to = true;
                host.link_from = true;
                host.peer_off = false;
                if watch_back {
                    self.rewatch(h);
                }
            }
            Heal::Health => self.hosts[h].healthy = true,
            Heal::StaleView => {
                self.hosts[h].stale_view_since = None;
                self.rewatch(h);
            }
            Heal::StorePause => {}
            Heal::Peers => self.hosts[h].peer_off = false,
            Heal::Turn(gen) => self.deliver(h, gen, Input::Turn(true)),
            Heal::Reopen => {
                self.hosts[h].store_lost_until = 0;
                self.rewatch(h);
            }
        }
    }

    /// The watch is re-established from the last revision: deliver the present.
    fn rewatch(&mut self, h: usize) {
        let entry = self.store.current().cloned();
        let gen = self.hosts[h].agent_gen;
        let at = self.now.max(self.hosts[h].watch_last);
        self.hosts[h].watch_last = at;
        self.at(
            at,
            Ev::Deliver {
                h,
                gen,
                input: Input::Watch(entry),
            },
        );
    }

    fn crash(&mut self, h: usize) {
        self.log(|| format!("h{h} host crash"));
        let host = &mut self.hosts[h];
        host.running = false;
        host.stop = None;
        host.sgen += 1;
        host.keeper_alive = false;
        host.keeper = KeeperState::Disarmed;
        host.kgen += 1;
        host.boot += 1;
        host.link_to = true;
        host.link_from = true;
        host.hold_until = 0;
        host.stale_view_since = None;
        host.restart_after_exit = None;
        self.kill_agent(h);
    }

    fn kill_agent(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        host.agent = None;
        host.agent_gen += 1;
        host.stalled_until = 0;
        host.queued.clear();
        host.next_wake = None;
    }

    /// (c): crash the active host in calm conditions; some node must be active
    /// within the failover bound.
    fn probe(&mut self) {
        // While paused nobody may take over (O2): nothing to time, until
        // the holder's record says it is resumed.
        let record_paused = self.store.current().is_some_and(
            |e| matches!(Observed::decode(&e.value), Observed::Record(r) if r.paused.is_some()),
        );
        let calm = !self.pausing
            && !record_paused
            && self.active_faults == 0
            && self.store.paused_until <= self.now
            && self.now > self.last_instant_fault + self.check.failover_bound * 2;
        let holder = self.holder().filter(|&a| {
            let host = &self.hosts[a];
            host.running && host.stalled_until <= self.now && host.stop.is_none()
        });
        let standby_ready = (0..self.hosts.len()).any(|b| {
            let host = &self.hosts[b];
            Some(b) != holder
                && host.role() == Some(Role::Standby)
                && host.priority > 0
                && !host.rejoin_pending
                && host.healthy
                && host.stalled_until <= self.now
                && host
                    .agent
                    .as_ref()
                    .is_some_and(|a| a.backoff_until().is_none())
        });
        match holder {
            Some(a) if calm && standby_ready => {
                self.probe_pending = false;
                self.liveness_id += 1;
                let id = self.liveness_id;
                let deadline = self.now + self.check.failover_bound;
                self.calm_until = deadline;
                self.log(|| {
                    format!(
                        "PROBE crash h{a}, someone must activate by {:.3}s",
                        deadline as f64 / 1e9
                    )
                });
                self.check.open_liveness(id, self.now, a);
                self.crash(a);
                let t = self.lease_of(a);
                let at = deadline + self.rng.range(0, t);
                self.at(at, Ev::Restart { h: a });
                self.at(deadline, Ev::LivenessDeadline { id });
            }
            _ => {
                // Hold further faults until the world is calm enough to measure.
                self.probe_pending = true;
                let r = self.hosts[0].timing.renew().as_nanos() as u64;
                self.at(self.now + r, Ev::Probe);
            }
        }
    }
}

/// The pause every simulated operator asks for.
fn sim_pause() -> putex_core::Pause {
    putex_core::Pause {
        by: "sim".into(),
        reason: "maintenance".into(),
    }
}

impl World {
    // ----- failsafe: the peer network (F1, F3) ------------------------------

    /// Whether a peer message between `a` and `b` is lost to a cut.
    fn peer_cut(&self, a: usize, b: usize) -> bool {
        self.hosts[a].peer_off || self.hosts[b].peer_off
    }

    /// A holder's round of asks: each member gets its ask after a delay
    /// (or never: loss, a cut); the round's verdicts go in at its deadline,
    /// the store timeout, with whatever grants arrived by then.
    fn failsafe_ask(
        &mut self,
        h: usize,
        gen: u64,
        round: u64,
        token: putex_core::Token,
        members: &[putex_core::FailsafeMember],
    ) {
        let st = self.hosts[h].timing.store_timeout().as_nanos() as u64;
        self.rounds.insert(h, (gen, round, Vec::new()));
        self.at(self.now + st, Ev::RoundEnd { h, gen, round });
        let instance = self.hosts[h].instance.clone();
        for m in members {
            let Some(to) = (0..self.hosts.len())
                .find(|&o| m.node == format!("node{o}") && m.machine == format!("machine{o}"))
            else {
                continue;
            };
            if self.peer_cut(h, to) || self.rng.chance(self.sc.req_loss) {
                continue;
            }
            let request = putex_core::FailsafeRequest {
                id: 0,
                node: format!("node{h}"),
                machine: format!("machine{h}"),
                instance: instance.clone(),
                token,
            };
            // Delayed (so reordered), and sometimes duplicated, even long
            // after its round.
            let copies = if self.rng.chance(self.sc.dup) { 2 } else { 1 };
            for copy in 0..copies {
                let latest = if copy == 0 { st / 2 } else { 4 * st };
                let at = self.now + self.rng.range(MS / 10, latest);
                self.at(
                    at,
                    Ev::PeerAsk {
                        from: h,
                        from_gen: gen,
                        to,
                        round,
                        request: request.clone(),
                    },
                );
            }
        }
    }

    /// A member's answer: a grant travels back to the holder that asked
    /// (or is lost); a refusal is the absence of a grant.
    fn failsafe_answer(
        &mut self,
        member_host: usize,
        id: u64,
        answer: &putex_core::FailsafeAnswer,
    ) {
        let Some((to, gen, round, member)) = self.peer_asks.remove(&id) else {
            return;
        };
        if *answer != putex_core::FailsafeAnswer::Granted
            || self.peer_cut(member_host, to)
            || self.rng.chance(self.sc.reply_loss)
        {
            return;
        }
        let st = self.hosts[to].timing.store_timeout().as_nanos() as u64;
        let copies = if self.rng.chance(self.sc.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.now + self.rng.range(MS / 10, st / 2);
            self.at(
                at,
                Ev::PeerGrant {
                    to,
                    gen,
                    round,
                    member: member.clone(),
                },
            );
        }
    }

    // ----- operator controls (O1–O4) ---------------------------------------

    /// Each round every host writes its member record and reads the others'
    /// (those written within the last 3 R count as fresh: a host that just
    /// died is still a candidate for a while, which costs at most D).
    fn members(&mut self) {
        let r = self.hosts[0].timing.renew().as_nanos() as u64;
        let now = self.now;
        for h in 0..self.hosts.len() {
            let host = &self.hosts[h];
            let Some(agent) = host.agent.as_ref() else {
                continue;
            };
            if host.stalled_until > now || !host.link_to {
                continue;
            }
            // Outside the operator profile members are reported for
            // failsafe's set only: none is ready, so none outranks (O3).
            let ready = self.sc.operator
                && agent.role() == Role::Standby
                && host.healthy
                && !host.rejoin_pending
                && agent.backoff_until().is_none();
            self.hosts[h].member = Some((ready, now));
        }
        for h in 0..self.hosts.len() {
            if self.hosts[h].agent.is_none() || !self.hosts[h].link_from {
                continue;
            }
            let others: Vec<putex_core::Candidate> = (0..self.hosts.len())
                .filter(|&o| o != h)
                .filter_map(|o| {
                    let host = &self.hosts[o];
                    let (ready, at) = host.member?;
                    (now < at + 3 * r).then(|| putex_core::Candidate {
                        node: format!("node{o}"),
                        priority: host.priority,
                        position: None,
                        ready,
                        machine: Some(format!("machine{o}")),
                    })
                })
                .collect();
            let gen = self.hosts[h].agent_gen;
            let at = now + self.rng.range(MS / 10, 5 * MS);
            self.at(
                at,
                Ev::Deliver {
                    h,
                    gen,
                    input: Input::Members(others),
                },
            );
            if !self.sc.operator {
                continue;
            }
            // The standing request, as the host reads it each round: a
            // host cut off when it changed learns of it now.
            let input = if self.pausing {
                Input::Pause(sim_pause())
            } else {
                Input::Resume
            };
            self.at(at, Ev::Deliver { h, gen, input });
        }
        self.at(now + r, Ev::Members);
    }

    /// O2: the operator resumes. Every host's agent hears it (through the
    /// store, so not while cut off from it). A paused record whose holder's
    /// agent is gone and whose service is down (the host crashed, or a
    /// restarted agent's start-up stop ended it) is resumed by force:
    /// revoked, stale W + G' later. A holder that is alive but cut off, or
    /// whose service may still run, is waited for: forcing then is the
    /// operator's risk, as `docs/operations.md` says.
    fn resume(&mut self) {
        let paused = self
            .store
            .current()
            .and_then(|e| match Observed::decode(&e.value) {
                Observed::Record(r)
                    if r.paused.is_some()
                        && matches!(r.state, LockState::Active | LockState::Confirming) =>
                {
                    Some(r)
                }
                _ => None,
            });
        let holder = paused.as_ref().and_then(|r| {
            (0..self.hosts.len())
                .find(|&o| self.hosts[o].instance == r.instance && self.hosts[o].agent.is_some())
        });
        let service_up = paused.as_ref().is_some_and(|r| {
            (0..self.hosts.len()).any(|o| {
                format!("node{o}") == r.node
                    && (self.hosts[o].running || self.hosts[o].stop.is_some())
            })
        });
        let cut_off = holder.is_some_and(|o| !self.hosts[o].link_from || !self.hosts[o].link_to);
        if cut_off || (holder.is_none() && service_up) {
            let r = self.hosts[0].timing.renew().as_nanos() as u64;
            self.at(self.now + r, Ev::Resume);
            return;
        }
        self.log(|| "OPERATOR resume".to_string());
        self.pausing = false;
        for h in 0..self.hosts.len() {
            if self.hosts[h].agent.is_some() && self.hosts[h].link_from {
                let gen = self.hosts[h].agent_gen;
                let at = self.now + self.rng.range(MS / 10, 5 * MS);
                self.at(
                    at,
                    Ev::Deliver {
                        h,
                        gen,
                        input: Input::Resume,
                    },
                );
            }
        }
        if let (Some(r), None) = (paused, holder) {
            self.log(|| "OPERATOR force-resumes a dead holder's pause".to_string());
            self.store.admin_writes += 1;
            let revoked = LockRecord {
                state: LockState::Revoked,
                write: format!("admin-{}", self.store.admin_writes),
                paused: None,
                since: None,
                ..r
            };
            self.write_lock(revoked.encode());
            self.last_instant_fault = self.now;
        }
    }

    /// (i) O2: an unpaused record written over a paused one of the same
    /// tenure while the service runs needs the keeper armed again first.
    fn check_unpause(&mut self, h: usize, value: &[u8]) {
        let Observed::Record(new) = Observed::decode(value) else {
            return;
        };
        if new.paused.is_some() || !matches!(new.state, LockState::Active) {
            return;
        }
        let was_paused = self.store.current().is_some_and(|e| {
            matches!(Observed::decode(&e.value),
                Observed::Record(r) if r.instance == new.instance && r.paused.is_some())
        });
        let host = &self.hosts[h];
        if !was_paused || !host.running || host.instance != new.instance {
            return;
        }
        let local = host.local(self.now);
        // Armed, or fired and stopping the service (the licence ended:
        // H1's emergency stop, which no takeover can beat).
        let armed = host.keeper_alive
            && (matches!(host.keeper, KeeperState::Armed(d) if d > local)
                || (host.keeper == KeeperState::Fired && host.stop.is_some()));
        if !armed {
            let keeper = host.keeper;
            self.check.fail(
                "i/pause",
                self.now,
                format!("h{h} unpauses while its service runs and its keeper is {keeper:?} (O2)"),
            );
        }
    }
}

/// A stable hash of a stored value, to tell reused revisions apart.
pub fn fingerprint(value: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

fn describe_input(input: &Input) -> String {
    match input {
        Input::Store { id, outcome } => format!("store {id:?} {}", describe_outcome(outcome)),
        Input::Watch(e) => format!("watch {}", describe_entry(e.as_ref())),
        other => format!("{other:?}"),
    }
}

fn describe_outcome(o: &StoreOutcome) -> String {
    match o {
        StoreOutcome::Read(e) => format!("read {}", describe_entry(e.as_ref())),
        other => format!("{other:?}"),
    }
}

pub fn describe_entry(e: Option<&Entry>) -> String {
    match e {
        None => "absent".into(),
        Some(e) => match Observed::decode(&e.value) {
            Observed::Record(r) => format!(
                "{:?} {} {:?} {} T={}ms G={}ms",
                e.token, r.instance, r.state, r.write, r.lease_ms, r.gap_ms
            ),
            Observed::Garbage => format!("{:?} <garbage>", e.token),
        },
    }
}

fn describe_output(o: &Output) -> String {
    match o {
        Output::Store(r) => {
            let op = match &r.op {
                StoreOp::Get { key, leader } => format!("get {key:?} leader={leader}"),
                StoreOp::Create { key, .. } => format!("create {key:?}"),
                StoreOp::Update {
                    key,
                    expected,
                    value,
                } => format!(
                    "update {key:?} expect {expected:?} {}",
                    match Observed::decode(value) {
                        Observed::Record(r) => format!("{:?} {}", r.state, r.write),
                        Observed::Garbage => "?".into(),
                    }
                ),
                StoreOp::Put { key, .. } => format!("put {key:?}"),
            };
            format!("{:?} {op}", r.id)
        }
        Output::Event(Event::Transition {
            from,
            to,
            reason,
            token,
        }) => {
            format!("{from} -> {to} ({}) {token:?}", describe_reason(reason))
        }
        other => format!("{other:?}"),
    }
}

fn describe_reason(r: &Reason) -> String {
    format!("{r:?}")
}
