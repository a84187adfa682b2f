//! Scenario profiles: what a seeded run looks like before it starts.
//!
//! A [`Profile`] names a family of runs; [`Scenario::generate`] draws one
//! concrete run from it with a seed: the number of hosts, ε, each host's
//! timing and clock rate, network delays and losses, and which faults the
//! run injects. The same (profile, seed) always yields the same run.

use std::time::Duration;

use putex_core::mutation::Mutations;
use putex_core::{Drift, TimingConfig};

use crate::rng::Rng;

pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

/// A family of runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Every fault, mixed at random, with liveness probes.
    Chaos,
    /// Only jitter below the budget: there must be no transitions (check e).
    Jitter,
    /// Jitter plus occasional lost replies and requests (H4): no transitions.
    Lossy,
    /// Replies that arrive near their deadline, holders cut off (H1).
    LateAcks,
    /// Clocks pinned at the ε extremes, holders cut off (S1, S2).
    Skewed,
    /// Hosts with different T and G (configuration mismatch).
    Mixed,
    /// Mixed timing with every clock pinned at an ε extreme and emergency
    /// stops that take their whole budget: the worst case for T' and G'.
    MixedSkewed,
    /// Standbys whose watch breaks and whose reads come from a lagging replica.
    StaleView,
    /// Frequent graceful step-downs and shutdowns, slow stops (H6, S3).
    StepDowns,
    /// Standby clocks that jump forward while the holder is cut off (S1 b).
    ClockJumps,
    /// Operator controls (O1–O4): switchovers, pauses and resumes,
    /// priorities and rejoins, amid crashes, partitions and stalls.
    Operator,
    /// The etcd store's clock (`docs/safety.md` §4.2, "On etcd"): each
    /// handle stamps what it receives with a reading in whole seconds, a
    /// record's rounded up and a probe's down; standby clocks jump while
    /// the holder is cut off, holders crash, the store's clock steps.
    EtcdClock,
    /// Chaos on a store that keeps every acknowledged write and proves how
    /// long a key was vacant (the embedded store, S4 refined): no
    /// rollbacks, a clock that never jumps; records deleted by an operator,
    /// buckets re-created and files replaced under running holders.
    Durable,
    /// Chaos with every agent running failsafe (`docs/failsafe-design.md`):
    /// the members' side so far — each start takes a store-clock floor
    /// (F4) before any takeover. No holder asks for grants yet.
    Failsafe,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Chaos => "chaos",
            Profile::Jitter => "jitter",
            Profile::Lossy => "lossy",
            Profile::LateAcks => "late-acks",
            Profile::Skewed => "skewed",
            Profile::Mixed => "mixed",
            Profile::MixedSkewed => "mixed-skewed",
            Profile::StaleView => "stale-view",
            Profile::StepDowns => "step-downs",
            Profile::ClockJumps => "clock-jumps",
            Profile::Operator => "operator",
            Profile::EtcdClock => "etcd-clock",
            Profile::Durable => "durable",
            Profile::Failsafe => "failsafe",
        }
    }

    pub fn parse(s: &str) -> Option<Profile> {
        [
            Profile::Chaos,
            Profile::Jitter,
            Profile::Lossy,
            Profile::LateAcks,
            Profile::Skewed,
            Profile::Mixed,
            Profile::MixedSkewed,
            Profile::StaleView,
            Profile::StepDowns,
            Profile::ClockJumps,
            Profile::Operator,
            Profile::EtcdClock,
            Profile::Durable,
            Profile::Failsafe,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// A fault the run can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Host dies with its service; reboots later.
    HostCrash,
    /// `kill -9` of the agent only; the keeper and service live on.
    AgentKill,
    /// SIGSTOP of the agent for T/2, T or 3T; the keeper keeps time.
    Stall,
    /// Both directions between one host and the store.
    Partition,
    /// One direction only.
    OneWay,
    /// The store stops answering for a while.
    StorePause,
    /// The store loses its last writes (acknowledged ones too).
    Rollback,
    /// The bucket is deleted and re-created: a new epoch.
    Recreate,
    /// A host's clock jumps forward without real time passing.
    NodeJump,
    /// The store's clock steps forwards or backwards.
    StoreJump,
    /// Someone writes garbage into the lock record.
    Garbage,
    /// An administrator revokes the lock (S7).
    Revoke,
    /// A host's health check fails for a while.
    HealthFlap,
    /// `systemctl stop`, then start again later.
    Shutdown,
    /// A host's watch breaks and its reads come from a lagging replica.
    StaleView,
    /// The supervised child exits on its own.
    ChildExit,
    /// The holder gives the lock back and stays a standby, out of turn for
    /// a while (the lease library's `Lock`: `Turn(false)` + `Release`).
    Release,
    /// A host's traffic is held for ≥ T, then delivered all at once.
    HoldTraffic,
    /// The holder is cut off and a standby's clock jumps forward by W.
    IsolateAndJump,
    /// The holder's service cannot be stopped (or the stop not proven) for
    /// 2–6 T, and the holder is asked to stop (child exit or shutdown).
    StuckStop,
    /// A keeper is killed; the service lives on, its tree sometimes not
    /// found for 2–6 T.
    KeeperDeath,
    /// The store's file is replaced under running clients: each handle
    /// fails its calls as unknown until it opens the new (empty) store.
    StoreReplaced,
    /// A stream-leader change: writes pause, the deposed leader answers
    /// leader reads from its stale view, the store clock's offset changes.
    LeaderChange,
    /// A host's watch replays the last few versions.
    WatchReplay,
    /// O1: the holder is asked to hand over (to a named node or the best).
    Switchover,
    /// O2: failover is paused for a while, then resumed (forced with a
    /// revocation once the paused holder's host is down).
    Pause,
    /// An operator deletes the lock record (`kv del`, a row deleted): the
    /// store keeps a delete marker.
    OperatorDelete,
    /// Failsafe: the holder is cut off from the store (not from its peers)
    /// and the store's clock jumps forward by W.
    IsolateAndStoreJump,
    /// Failsafe: a host is cut off from its peers (not from the store).
    PeerCut,
}

/// One concrete run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub hosts: usize,
    pub drift: Drift,
    pub timings: Vec<TimingConfig>,
    pub host_rates: Vec<u64>,
    pub store_rate: u64,
    /// Emergency stops take their whole budget.
    pub full_stops: bool,
    pub duration: u64,
    /// Request and reply delays (ns): uniform in the range.
    pub req_delay: (u64, u64),
    pub reply_delay: (u64, u64),
    /// Half the replies arrive just before the store deadline.
    pub late_replies: bool,
    pub watch_delay: (u64, u64),
    pub req_loss: f64,
    pub reply_loss: f64,
    pub dup: f64,
    /// Normal reads lag the leader by up to this much.
    pub replica_lag: u64,
    pub health_fail: f64,
    pub slow_check: f64,
    pub graceful_fail: f64,
    pub activate_fail: f64,
    /// Graceful stops take up to this multiple of the stop timeout.
    pub graceful_slowness: f64,
    /// Chance that the keeper is slow (10–200 ms) to read a command.
    pub keeper_slow: f64,
    /// Chance that the keeper refuses an `Arm`.
    pub arm_refuse: f64,
    pub faults: Vec<(FaultKind, u32)>,
    /// Real time between fault episodes.
    pub fault_gap: (u64, u64),
    /// Crash the active host in calm conditions and time the failover (c).
    pub liveness_probes: bool,
    /// After the first activation nothing may change (e).
    pub expect_no_transitions: bool,
    /// Operator controls in play (O1–O4): members are reported, the
    /// failover bound grows by D, crashed holders rejoin.
    pub operator: bool,
    /// Each host's `--priority` (all 1 unless `operator`).
    pub priorities: Vec<u32>,
    /// O5: every host's `--failback-after`, in some operator seeds.
    pub failback_after: Option<Duration>,
    /// The step in which the store's clock reads, as each host's handle
    /// stamps records (etcd: 1 s); zero: the store stamps its writes
    /// exactly (NATS, the embedded store).
    pub store_step: Duration,
    /// The store keeps every acknowledged write and answers a create of
    /// the lock record with how long the key was vacant (S4 refined).
    pub durable: bool,
    /// How old the store is when the run starts (ns of its clock).
    pub store_age: u64,
    /// Every agent runs with failsafe on.
    pub failsafe: bool,
    /// Failsafe's cap (`--failsafe-max`), the same on every host: three
    /// times the longest T.
    pub failsafe_max: Duration,
    pub mutations: Mutations,
}

impl Scenario {
    pub fn generate(profile: Profile, seed: u64, mutations: Mutations) -> Scenario {
        let mut rng = Rng::new(seed ^ (profile as u64) << 56);
        let hosts = rng.range(3, 5) as usize;
        let drift_ppm = match profile {
            Profile::Skewed | Profile::ClockJumps | Profile::MixedSkewed | Profile::EtcdClock => {
                *rng.pick(&[50_000u32, 100_000])
            }
            Profile::LateAcks => 1_000,
            _ => *rng.pick(&[1_000u32, 10_000, 10_000, 50_000, 100_000]),
        };
        let drift = Drift::from_ppm(drift_ppm);
        let extremes = match profile {
            Profile::Skewed
            | Profile::ClockJumps
            | Profile::LateAcks
            | Profile::MixedSkewed
            | Profile::EtcdClock => true,
            Profile::Jitter | Profile::Lossy => false,
            _ => rng.chance(0.3),
        };
        let rate = |rng: &mut Rng| -> u64 {
            let e = u64::from(drift_ppm);
            if extremes {
                if rng.chance(0.5) {
                    1_000_000 - e
                } else {
                    1_000_000 + e
                }
            } else {
                rng.range(1_000_000 - e, 1_000_000 + e)
            }
        };
        let (renew_ms, failures, confirm) = match profile {
            Profile::Lossy => (
                *rng.pick(&[250u64, 1000]),
                rng.range(6, 10) as u32,
                rng.range(1, 3) as u32,
            ),
            Profile::LateAcks => (1000, rng.range(3, 6) as u32, rng.range(1, 2) as u32),
            _ => (
                *rng.pick(&[100u64, 250, 1000]),
                rng.range(2, 10) as u32,
                rng.range(1, 3) as u32,
            ),
        };
        let renew = Duration::from_millis(renew_ms);
        let base = |rng: &mut Rng, failures: u32, confirm: u32| TimingConfig {
            renew,
            failures,
            confirm,
            unhealthy: rng.range(1, 3) as u32,
            successes: rng.range(1, 2) as u32,
            max_drift: drift,
            start_grace: Duration::from_millis(rng.range(0, 2 * renew_ms)),
            stop_timeout: Duration::from_millis(rng.range(500, 3000)),
            activate_timeout: Duration::from_secs(10),
            ..TimingConfig::default()
        };
        let mixed = matches!(profile, Profile::Mixed | Profile::MixedSkewed)
            || (matches!(profile, Profile::Chaos | Profile::Failsafe) && rng.chance(0.3));
        let mut timings: Vec<TimingConfig> = (0..hosts)
            .map(|_| {
                if mixed {
                    let f = rng.range(2, 12) as u32;
                    let c = rng.range(1, 4) as u32;
                    base(&mut rng, f, c)
                } else {
                    base(&mut rng, failures, confirm)
                }
            })
            .collect();
        // After a lost record S4 protects up to --max-lease and --max-gap:
        // set them to the longest lease and gap in the run, as an operator
        // with mixed settings must.
        let max_t = timings
            .iter()
            .map(|t| t.renew * t.failures)
            .max()
            .expect("hosts");
        let max_g = timings
            .iter()
            .map(|t| t.renew * t.confirm)
            .max()
            .expect("hosts");
        for t in &mut timings {
            if mixed || rng.chance(0.2) {
                t.max_lease = Some(max_t);
                t.max_gap = Some(max_g);
            }
        }
        let host_rates = (0..hosts).map(|_| rate(&mut rng)).collect();
        let store_rate = rate(&mut rng);
        let slowest = timings
            .iter()
            .map(|t| {
                let v = t.validate().expect("scenario timings are valid");
                v.staleness_wait(max_t) + v.gap() * 2
            })
            .max()
            .expect("hosts");
        let failover = slowest.as_nanos() as u64 + 4 * renew_ms * MS;
        let duration = (60 * SEC).max(10 * failover);
        let store_timeout = renew_ms * MS * 2 / 5;
        let benign = matches!(profile, Profile::Jitter | Profile::Lossy);
        let mut s = Scenario {
            seed,
            hosts,
            drift,
            timings,
            host_rates,
            store_rate,
            full_stops: extremes || rng.chance(0.3),
            duration,
            req_delay: (MS / 10, store_timeout / 6),
            reply_delay: (MS / 10, store_timeout / 6),
            late_replies: profile == Profile::LateAcks,
            watch_delay: (MS / 10, store_timeout / 4),
            req_loss: if benign { 0.0 } else { 0.01 },
            reply_loss: if benign { 0.0 } else { 0.01 },
            dup: 0.005,
            replica_lag: if benign { 0 } else { store_timeout },
            health_fail: if benign { 0.0 } else { 0.01 },
            slow_check: if benign { 0.0 } else { 0.01 },
            graceful_fail: 0.05,
            activate_fail: if benign { 0.0 } else { 0.01 },
            graceful_slowness: 1.3,
            keeper_slow: if benign { 0.0 } else { 0.05 },
            arm_refuse: if benign { 0.0 } else { 0.02 },
            faults: vec![],
            fault_gap: (failover / 4, failover),
            liveness_probes: !benign,
            expect_no_transitions: benign,
            operator: false,
            priorities: vec![1; hosts],
            failback_after: None,
            store_step: Duration::ZERO,
            durable: false,
            store_age: 0,
            failsafe: profile == Profile::Failsafe,
            failsafe_max: Duration::ZERO,
            mutations,
        };
        use FaultKind::*;
        s.faults = match profile {
            Profile::Chaos => chaos_faults(),
            // Chaos on a store that keeps what it acknowledged (failsafe's
            // durability assumption: no rollbacks), with longer outages of
            // the whole store and of single hosts, cuts between peers, and
            // the store's clock jumping while a holder runs on grants.
            Profile::Failsafe => chaos_faults()
                .into_iter()
                .filter_map(|(kind, weight)| match kind {
                    Rollback => None,
                    StorePause | Partition | Revoke => Some((kind, weight + 2)),
                    _ => Some((kind, weight)),
                })
                .chain([(IsolateAndStoreJump, 2), (PeerCut, 3)])
                .collect(),
            Profile::Jitter | Profile::Lossy => vec![],
            Profile::LateAcks => vec![(Partition, 4), (Stall, 2), (HostCrash, 1)],
            Profile::Skewed => vec![(Partition, 4), (Stall, 3), (HostCrash, 1), (AgentKill, 1)],
            Profile::Mixed | Profile::MixedSkewed => {
                vec![(Partition, 4), (Stall, 3), (HostCrash, 2), (Shutdown, 1)]
            }
            Profile::StaleView => vec![
                (StaleView, 6),
                (Partition, 1),
                (HostCrash, 1),
                (LeaderChange, 3),
                (WatchReplay, 3),
            ],
            Profile::StepDowns => vec![
                (Shutdown, 5),
                (HealthFlap, 5),
                (ChildExit, 3),
                (Release, 4),
                (Partition, 2),
                (HostCrash, 1),
                (StuckStop, 4),
                (KeeperDeath, 3),
            ],
            Profile::ClockJumps => vec![(IsolateAndJump, 5), (NodeJump, 1), (Partition, 1)],
            // Chaos without what a durable store with a steady clock does
            // not do (rollbacks, store-clock steps, leader changes), and
            // more of what empties a key under a running holder.
            Profile::Durable => chaos_faults()
                .into_iter()
                .filter_map(|(kind, weight)| match kind {
                    Rollback => Some((OperatorDelete, 3)),
                    Recreate | StoreReplaced => Some((kind, 2)),
                    StoreJump | LeaderChange => None,
                    _ => Some((kind, weight)),
                })
                .collect(),
            Profile::EtcdClock => vec![
                (IsolateAndJump, 5),
                (NodeJump, 1),
                (Partition, 2),
                (HostCrash, 2),
                (Stall, 1),
                (StoreJump, 1),
            ],
            // Faults that rewrite or lose the lock record behind a paused
            // holder (rollbacks, re-created buckets, foreign writes) are
            // outside what a pause can protect (`docs/safety.md`, O2).
            Profile::Operator => vec![
                (Switchover, 5),
                (Pause, 4),
                (HostCrash, 3),
                (AgentKill, 2),
                (Partition, 3),
                (Stall, 2),
                (HealthFlap, 2),
                (Shutdown, 1),
            ],
        };
        if profile == Profile::Operator {
            s.operator = true;
            // Some seeds have a node that never takes over; at least two
            // can.
            for p in s.priorities.iter_mut() {
                *p = rng.range(1, 3) as u32;
            }
            if rng.chance(0.5) {
                let last = s.priorities.len() - 1;
                s.priorities[last] = 0;
            }
            if rng.chance(0.5) {
                let t = s.timings[0].renew * s.timings[0].failures;
                s.failback_after = Some(t * rng.range(1, 4) as u32);
            }
        }
        // Switches inside the timing functions reach the agents and the
        // checker alike: only the overlap check can see them.
        for t in &mut s.timings {
            t.mutations = mutations;
        }
        if profile == Profile::Lossy {
            s.req_loss = 0.01;
            s.reply_loss = 0.03;
        }
        if profile == Profile::StepDowns {
            s.graceful_fail = 0.1;
            s.graceful_slowness = 2.0;
            s.full_stops = true;
        }
        if profile == Profile::StaleView {
            s.replica_lag = 0;
        }
        if profile == Profile::Failsafe {
            let max_t = s
                .timings
                .iter()
                .map(|t| t.renew * t.failures)
                .max()
                .expect("hosts");
            s.failsafe_max = max_t * 3;
        }
        if profile == Profile::Durable {
            s.durable = true;
            // A store made moments ago, one a little older, one of long ago.
            s.store_age = *rng.pick(&[0, failover / 3, 3600 * SEC]);
        }
        if profile == Profile::EtcdClock {
            // A witness lands up to two steps and a probe period late.
            s.store_step = Duration::from_secs(1);
            let late = 2 * SEC + renew_ms * MS;
            s.fault_gap = (s.fault_gap.0 + late, s.fault_gap.1 + late);
            s.duration = s.duration.max(10 * (failover + late));
        }
        s
    }
}

/// Every fault, with its weight: the chaos profile's mix.
fn chaos_faults() -> Vec<(FaultKind, u32)> {
    use FaultKind::*;
    vec![
        (HostCrash, 6),
        (AgentKill, 5),
        (Stall, 5),
        (Partition, 5),
        (OneWay, 4),
        (StorePause, 3),
        (Rollback, 1),
        (Recreate, 1),
        (NodeJump, 2),
        (StoreJump, 2),
        (Garbage, 1),
        (Revoke, 1),
        (HealthFlap, 4),
        (Shutdown, 3),
        (StaleView, 2),
        (ChildExit, 2),
        (Release, 2),
        (HoldTraffic, 3),
        (IsolateAndJump, 1),
        (StuckStop, 2),
        (KeeperDeath, 2),
        (StoreReplaced, 1),
        (LeaderChange, 2),
        (WatchReplay, 2),
    ]
}
