//! Scenario tests of the agent, one rule at a time, with a hand-driven store.
//!
//! The simulation (`tests/sim`) hammers the same rules with random faults;
//! these tests spell out single timelines so that a reader can see each rule
//! at work: S4 on first use, S3 over a release, S1 with its two witnesses, S2,
//! H1's licence from the send time, H3/H4 on conflicts.

use std::time::Duration;

use putex_core::mutation::{Mutations, Rule};
use putex_core::{
    Agent, AgentConfig, Entry, FailsafeAnswer, FailsafeRefusal, FailsafeRequest, HealthMode,
    Identity, Input, KeeperCommand, Key, LockRecord, LockState, Observed, OpId, Output, Reason,
    Role, StopKind, StoreOp, StoreOutcome, StoreTime, Timing, TimingConfig, Token,
};

const SEC: u64 = 1_000_000_000;

fn at(secs: f64) -> putex_core::Instant {
    putex_core::Instant::from_nanos((secs * 1e9) as u64)
}

fn timing() -> Timing {
    // R = 1 s, F = 10, C = 2: T = 10 s, G = 2 s, ε = 1 %: W ≈ 10.202 s.
    TimingConfig::default().validate().unwrap()
}

/// One agent and everything it asked for that is still unanswered.
struct Harness {
    agent: Agent,
    now: f64,
    out: Vec<Output>,
    /// Whether the keeper acknowledges every `Arm` at once.
    auto_arm: bool,
    /// A write a test kept, to show it back later.
    last_write: Option<StoreOp>,
}

impl Harness {
    fn new(node: &str) -> Harness {
        Harness::with_stops(node, true)
    }

    /// An agent whose host's stops are (or are not) proven by a supervisor.
    fn with_stops(node: &str, supervised_stops: bool) -> Harness {
        Harness::with_config(node, supervised_stops, Mutations::NONE)
    }

    /// An agent with one or more safety rules switched off (mutation proofs).
    fn with_config(node: &str, supervised_stops: bool, mutations: Mutations) -> Harness {
        Harness::from_config(node, supervised_stops, mutations, None)
    }

    /// An agent that remembers `highest` from an earlier run (its host state).
    fn with_highest(node: &str, highest: Token) -> Harness {
        Harness::from_config(node, true, Mutations::NONE, Some(highest))
    }

    fn from_config(
        node: &str,
        supervised_stops: bool,
        mutations: Mutations,
        highest_token: Option<Token>,
    ) -> Harness {
        Harness::configured(node, |c| {
            c.highest_token = highest_token;
            c.supervised_stops = supervised_stops;
            c.mutations = mutations;
        })
    }

    /// An agent with a supervised keeper, configured further by `set`.
    fn configured(node: &str, set: impl FnOnce(&mut AgentConfig)) -> Harness {
        let mut config = config_for(node);
        set(&mut config);
        let mut h = Harness::started(config);
        // S5: the service is made sure to be stopped first.
        h.answer_stop(StopKind::Startup, true);
        assert_eq!(h.agent.role(), Role::Standby);
        h
    }

    /// An agent of `config` started at 100 s, its first outputs collected.
    fn started(config: AgentConfig) -> Harness {
        let mut h = Harness {
            agent: Agent::new(config, at(100.0)),
            now: 100.0,
            out: Vec::new(),
            auto_arm: true,
            last_write: None,
        };
        h.drain();
        h
    }

    /// Answers the pending stop of `kind`: `ok` is the proof (H6).
    fn answer_stop(&mut self, kind: StopKind, ok: bool) {
        let stop = self.take(|o| matches!(o, Output::Stop { kind: k, .. } if *k == kind));
        let Output::Stop { id, .. } = stop else {
            unreachable!()
        };
        self.input(Input::Stopped { id, ok });
    }

    /// Collects the outputs. The keeper acknowledges each `Arm` at once
    /// (as a healthy local keeper does), unless `arm_replies` says otherwise.
    fn drain(&mut self) {
        while let Some(o) = self.agent.poll_output() {
            if let Output::Keeper(command @ KeeperCommand::Arm(_)) = o {
                if self.auto_arm {
                    self.agent
                        .handle(at(self.now), Input::KeeperAck { command, ok: true });
                }
            }
            self.out.push(o);
        }
    }

    fn input(&mut self, input: Input) {
        self.agent.handle(at(self.now), input);
        self.drain();
    }

    /// Moves time forward, waking the agent at every timeout on the way.
    fn advance_to(&mut self, t: f64) {
        while let Some(due) = self.agent.poll_timeout() {
            let next = due.as_nanos() as f64 / 1e9;
            if next > t {
                break;
            }
            self.now = next.max(self.now);
            // The exact instant: a round trip through f64 can land a
            // nanosecond early and wake the agent before anything is due.
            self.agent.handle_timeout(due.max(at(self.now)));
            self.drain();
        }
        self.now = t;
        self.agent.handle_timeout(at(t));
        self.drain();
    }

    fn take(&mut self, pred: impl Fn(&Output) -> bool) -> Output {
        let i = self
            .out
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("expected output not found in {:#?}", self.out));
        self.out.remove(i)
    }

    fn find(&self, pred: impl Fn(&Output) -> bool) -> bool {
        self.out.iter().any(pred)
    }

    /// Answers every pending health check.
    fn health(&mut self, ok: bool) {
        while let Some(i) = self
            .out
            .iter()
            .position(|o| matches!(o, Output::HealthCheck { .. }))
        {
            let Output::HealthCheck { id, .. } = self.out.remove(i) else {
                unreachable!()
            };
            self.input(Input::Health { id, ok });
        }
    }

    /// The next store request.
    fn store(&mut self) -> (OpId, StoreOp) {
        match self.take(|o| matches!(o, Output::Store(_))) {
            Output::Store(r) => (r.id, r.op),
            _ => unreachable!(),
        }
    }

    fn reply(&mut self, id: OpId, outcome: StoreOutcome) {
        self.input(Input::Store { id, outcome });
    }

    /// Drops every pending request (they are left unanswered).
    fn forget_store(&mut self) {
        self.out.retain(|o| !matches!(o, Output::Store(_)));
    }

    /// Takes the pending release: a CAS writing a `released` record.
    fn release_write(&mut self) -> (OpId, Token) {
        let (id, op) = self.store();
        let StoreOp::Update {
            value, expected, ..
        } = op
        else {
            panic!("{op:?}")
        };
        assert!(
            matches!(Observed::decode(&value), Observed::Record(r) if r.state == LockState::Released)
        );
        (id, expected)
    }

    fn activated(&self) -> bool {
        self.find(|o| matches!(o, Output::Fence { .. }))
    }
}

/// Node `node` (instance `NODE-i1` on `NODE-machine`) with a supervised
/// keeper and the default timing.
fn config_for(node: &str) -> AgentConfig {
    let identity = Identity {
        node: node.into(),
        machine: format!("{node}-machine"),
        instance: format!("{node}-i1"),
    };
    AgentConfig {
        supervised_stops: true,
        ..AgentConfig::new(identity, timing())
    }
}

fn entry(record: &LockRecord, revision: u64, store_secs: f64) -> Entry {
    Entry {
        value: record.encode(),
        token: Token::new(1, revision),
        time: StoreTime {
            era: 1,
            nanos: (store_secs * 1e9) as u64,
        },
    }
}

fn holder(state: LockState, lease_ms: u64) -> LockRecord {
    LockRecord {
        v: 1,
        node: "other".into(),
        machine: "other-machine".into(),
        instance: "other-i1".into(),
        state,
        write: "other-i1-1".into(),
        lease_ms,
        gap_ms: 2000,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    }
}

/// Runs a standby round: health check passes, the poll reads `found`.
fn look(h: &mut Harness, found: Option<Entry>) {
    h.health(true);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { .. }), "{op:?}");
    h.reply(id, StoreOutcome::Read(found));
}

#[test]
fn s4_first_use_waits_w_plus_g_after_creating() {
    let mut h = Harness::new("a");
    look(&mut h, None);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Create { .. }), "{op:?}");
    h.reply(id, StoreOutcome::Written(Token::new(1, 1)));
    assert_eq!(h.agent.role(), Role::Confirming);
    // Never in silence: the host is told how long and why, at once.
    let said = h.out.iter().find_map(|o| match o {
        Output::Event(putex_core::Event::AbsentWait { wait, why }) => Some((*wait, *why)),
        _ => None,
    });
    let (wait, why) = said.expect("no AbsentWait event for the first use");
    assert_eq!(why, putex_core::AbsentWhy::FirstUse);
    assert!(
        (wait.as_secs_f64() - 12.202).abs() < 0.01,
        "the wait said is {wait:?}, not W + G'"
    );
    // Keep renewing through the wait; W(10 s) + G = 12.202 s.
    let mut revision = 1;
    for second in 1..=12 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        if let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            revision += 1;
            h.reply(r.id, StoreOutcome::Written(Token::new(1, revision)));
        }
        assert!(!h.activated(), "activated {second} s after creating");
    }
    h.advance_to(112.3);
    assert!(h.activated());
    assert_eq!(h.agent.role(), Role::Active);
}

/// S4 refined: a create that the store proves vacant for at least W + G'
/// activates at once, and says nothing of a wait.
#[test]
fn s4_a_create_proven_vacant_long_enough_activates_at_once() {
    let mut h = Harness::new("a");
    look(&mut h, None);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Create { .. }), "{op:?}");
    h.reply(
        id,
        StoreOutcome::Created {
            token: Token::new(1, 1),
            vacant_for: Duration::from_secs(3600),
        },
    );
    assert!(h.activated(), "a proven vacancy owes no wait");
    assert!(
        !h.out
            .iter()
            .any(|o| matches!(o, Output::Event(putex_core::Event::AbsentWait { .. }))),
        "no wait to announce"
    );
}

/// S4 refined: a store made moments ago proves a short vacancy; what is
/// left of W + G' is waited, and said, with its reason.
#[test]
fn s4_a_short_vacancy_leaves_the_rest_of_the_wait() {
    let mut h = Harness::new("a");
    look(&mut h, None);
    let (id, _) = h.store();
    h.reply(
        id,
        StoreOutcome::Created {
            token: Token::new(1, 1),
            vacant_for: Duration::from_secs(10),
        },
    );
    let said = h.out.iter().find_map(|o| match o {
        Output::Event(putex_core::Event::AbsentWait { wait, why }) => Some((*wait, *why)),
        _ => None,
    });
    let (wait, why) = said.expect("no AbsentWait event");
    assert_eq!(why, putex_core::AbsentWhy::YoungStore);
    assert!(
        (wait.as_secs_f64() - 2.202).abs() < 0.01,
        "the wait said is {wait:?}, not W + G' - 10 s"
    );
    h.advance_to(101.0);
    h.health(true);
    if let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
        let Output::Store(r) = h.out.remove(i) else {
            unreachable!()
        };
        h.reply(r.id, StoreOutcome::Written(Token::new(1, 2)));
    }
    assert!(!h.activated(), "activated before the rest of the wait");
    h.advance_to(102.3);
    assert!(h.activated());
}

#[test]
fn s3_a_released_record_is_taken_and_activated_at_once() {
    let mut h = Harness::new("a");
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, op) = h.store();
    let StoreOp::Update {
        expected, value, ..
    } = op
    else {
        panic!("{op:?}")
    };
    assert_eq!(expected, Token::new(1, 7));
    let Observed::Record(r) = Observed::decode(&value) else {
        panic!()
    };
    assert_eq!(r.state, LockState::Confirming);
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    let fence = h.take(|o| matches!(o, Output::Fence { .. }));
    assert!(matches!(fence, Output::Fence { token, .. } if token == Token::new(1, 8)));
    assert_eq!(h.agent.role(), Role::Active);
}

#[test]
fn turn_holds_back_an_acquisition_until_it_is_ours() {
    // A fair queue (putex lock) holds back every waiter but the first: the
    // released record is seen, but not taken, until the turn comes.
    let mut h = Harness::new("a");
    h.input(Input::Turn(false));
    let released = entry(&holder(LockState::Released, 10_000), 7, 50.0);
    look(&mut h, Some(released.clone()));
    assert!(
        !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
        "took the lock out of turn"
    );
    h.input(Input::Watch(Some(released)));
    assert!(!h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))));
    // Our turn: taken at once, without waiting for the next round.
    h.input(Input::Turn(true));
    let (_, op) = h.store();
    assert!(
        matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(1, 7)),
        "{op:?}"
    );
}

#[test]
fn s1_takeover_needs_w_on_the_own_clock_and_w_on_the_store_clock() {
    let mut h = Harness::new("a");
    // The holder advertises T = 20 s, more than our 10 s: W = 20·1.01/0.99.
    let held = entry(&holder(LockState::Active, 20_000), 5, 1000.0);
    look(&mut h, Some(held.clone()));
    let w = 20.0 * 1.01 / 0.99;
    // (a) not before W on our clock, whatever we poll.
    for second in 1..=20 {
        h.advance_to(100.0 + f64::from(second));
        // Every poll still shows the same revision.
        look(&mut h, Some(held.clone()));
        assert!(
            !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Put { .. } | StoreOp::Update { .. }))),
            "probed or took over {second} s after first seeing the record"
        );
    }
    h.advance_to(100.0 + w + 0.001);
    // (b) the probe: the store's clock says only 15 s passed — not yet.
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Put { .. }), "{op:?}");
    h.reply(id, StoreOutcome::Written(Token::new(1, 6)));
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    let probe = Entry {
        value: b"{}".to_vec(),
        token: Token::new(1, 6),
        time: StoreTime {
            era: 1,
            nanos: 1015 * SEC,
        },
    };
    h.reply(id, StoreOutcome::Read(Some(probe)));
    assert!(!h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))));
    // A second probe a round later shows W on the store's clock too.
    h.advance_to(100.0 + w + 0.9);
    look(&mut h, Some(held.clone()));
    h.advance_to(100.0 + w + 1.1);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Put { .. }), "{op:?}");
    h.reply(id, StoreOutcome::Written(Token::new(1, 7)));
    let (id, _) = h.store();
    let probe = Entry {
        value: b"{}".to_vec(),
        token: Token::new(1, 7),
        time: StoreTime {
            era: 1,
            nanos: 1021 * SEC,
        },
    };
    h.reply(id, StoreOutcome::Read(Some(probe)));
    // The record as the leader has it after the witness: still the same.
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    h.reply(id, StoreOutcome::Read(Some(held.clone())));
    let (id, op) = h.store();
    let StoreOp::Update { expected, .. } = op else {
        panic!("{op:?}")
    };
    assert_eq!(expected, Token::new(1, 5), "a CAS on the stale revision");
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    assert_eq!(h.agent.role(), Role::Confirming);
    // S2: G' (2 s) of renewals before the fence and activate hooks.
    let taken = h.now;
    h.advance_to(taken + 1.9);
    assert!(!h.activated());
    h.advance_to(taken + 2.01);
    assert!(h.activated());
}

/// S1 refinement (v), both sides: once W has passed on both clocks, a
/// standby reads the record from the leader before it swaps. A replica
/// stuck on revision 5 showed it holding contents A; the store lost that
/// record and reused revision 5 for B, which the standby never judged. The
/// leader read shows B: no stale takeover with G' (taking B after W of A
/// would displace a record nobody judged); the standby owes at least the
/// absent wait. With the leader read switched off
/// (`StaleTakeoverUnconfirmed`) it swaps at once and activates G' later.
#[test]
fn s1_a_stale_takeover_reads_the_leader_after_the_witness() {
    for switched_off in [false, true] {
        let mutations = if switched_off {
            Mutations::only(Rule::StaleTakeoverUnconfirmed)
        } else {
            Mutations::NONE
        };
        let mut h = Harness::with_config("a", true, mutations);
        let seen = entry(&holder(LockState::Active, 10_000), 5, 1000.0);
        look(&mut h, Some(seen.clone()));
        for second in 1..=10 {
            h.advance_to(100.0 + f64::from(second));
            look(&mut h, Some(seen.clone()));
        }
        h.advance_to(100.0 + 10.3);
        let (id, op) = h.store();
        assert!(matches!(op, StoreOp::Put { .. }), "{op:?}");
        h.reply(id, StoreOutcome::Written(Token::new(1, 6)));
        let (id, _) = h.store();
        let probe = Entry {
            value: b"{}".to_vec(),
            token: Token::new(1, 6),
            time: StoreTime {
                era: 1,
                nanos: 1011 * SEC,
            },
        };
        h.reply(id, StoreOutcome::Read(Some(probe)));
        let (id, op) = h.store();
        if switched_off {
            assert!(
                matches!(op, StoreOp::Update { .. }),
                "switched off, it swaps at once: {op:?}"
            );
        } else {
            assert!(
                matches!(op, StoreOp::Get { leader: true, .. }),
                "no leader read after the witness: {op:?}"
            );
            let mut other = holder(LockState::Active, 10_000);
            other.write = "other-i1-77".into();
            h.reply(id, StoreOutcome::Read(Some(entry(&other, 5, 1010.0))));
        }
        // Whatever it swapped (if anything), it must not be active G' later.
        let swap = h
            .out
            .iter()
            .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })));
        let id = match (switched_off, swap) {
            (true, _) => id,
            (false, Some(i)) => {
                let Output::Store(r) = h.out.remove(i) else {
                    unreachable!()
                };
                r.id
            }
            (false, None) => continue,
        };
        h.reply(id, StoreOutcome::Written(Token::new(1, 7)));
        let taken = h.now;
        let mut revision = 7;
        while h.now < taken + 2.5 {
            h.advance_to(h.now + 0.5);
            h.health(true);
            while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
                let Output::Store(r) = h.out.remove(i) else {
                    unreachable!()
                };
                revision += 1;
                h.reply(r.id, StoreOutcome::Written(Token::new(1, revision)));
            }
        }
        assert_eq!(
            h.activated(),
            switched_off,
            "switched off: {switched_off}; activated G' after swapping over an unjudged record"
        );
    }
}

/// Holds the lock (over a released record) and returns the harness.
fn holding() -> Harness {
    holding_with(Harness::new("a"))
}

/// `h`, active with token 1:8 over a released record.
fn holding_with(mut h: Harness) -> Harness {
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    let _ = h.take(|o| matches!(o, Output::Fence { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Fence,
        ok: true,
    });
    let _ = h.take(|o| matches!(o, Output::Activate { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Activate,
        ok: true,
    });
    h.out.clear();
    h
}

#[test]
fn h1_the_licence_runs_from_the_send_time_and_a_late_ack_restores_nothing() {
    let mut h = holding();
    // The acquisition was sent at 100 s: the licence ends at 110 s. Every
    // renewal from now on goes unanswered.
    for second in 1..=9 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        assert_eq!(h.agent.role(), Role::Active);
    }
    let (late_id, _) = h.store();
    h.forget_store();
    h.advance_to(110.0);
    assert_eq!(h.agent.role(), Role::Lapsed);
    assert!(h.find(|o| matches!(
        o,
        Output::Stop {
            kind: StopKind::Emergency,
            ..
        }
    )));
    // The reply to a renewal sent at 109 s arrives now: it restores nothing.
    h.reply(late_id, StoreOutcome::Written(Token::new(1, 20)));
    assert_eq!(h.agent.role(), Role::Lapsed);
}

/// K = 3 failed `active` checks in a row, after --start-grace (5 s): standby
/// checks until 105 s do not count.
fn fail_three_active_checks(h: &mut Harness) {
    h.advance_to(104.5);
    h.out.clear();
    for second in 5..=7 {
        h.advance_to(100.0 + f64::from(second));
        let check = h.take(|o| matches!(o, Output::HealthCheck { .. }));
        let Output::HealthCheck { id, mode, .. } = check else {
            unreachable!()
        };
        assert_eq!(mode, HealthMode::Active);
        h.input(Input::Health { id, ok: false });
        h.forget_store();
    }
}

#[test]
fn h2_k_failed_active_checks_step_down_then_release_with_proof() {
    let mut h = holding();
    fail_three_active_checks(&mut h);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    h.answer_stop(StopKind::Graceful, true);
    let (id, _) = h.release_write();
    h.reply(id, StoreOutcome::Written(Token::new(1, 30)));
    assert_eq!(h.agent.role(), Role::Standby);
}

/// Answers every pending renewal (a CAS writing `active` or `confirming`) with a new
/// revision, so that the lease stays alive; returns how many.
fn renew_all(h: &mut Harness, revision: &mut u64) -> usize {
    let mut n = 0;
    while let Some(i) = h.out.iter().position(|o| {
        matches!(o, Output::Store(r) if matches!(&r.op, StoreOp::Update { value, .. }
            if matches!(Observed::decode(value), Observed::Record(rec)
                if matches!(rec.state, LockState::Active | LockState::Confirming))))
    }) {
        let Output::Store(r) = h.out.remove(i) else {
            unreachable!()
        };
        *revision += 1;
        h.reply(r.id, StoreOutcome::Written(Token::new(1, *revision)));
        n += 1;
    }
    n
}

#[test]
fn h6_a_failed_graceful_stop_keeps_the_lease_retries_and_releases_only_with_proof() {
    let mut h = holding();
    h.input(Input::ServiceExited);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    h.forget_store();
    h.answer_stop(StopKind::Graceful, false);
    // The service may still run: the holder keeps the lock (no release, no
    // lapse) and alarms.
    assert_eq!(h.agent.role(), Role::SteppingDown);
    assert_eq!(h.agent.unproven_stops(), 1);
    assert!(h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::StopUnproven {
            attempts: 1,
            holding: true,
            ..
        })
    )));
    assert!(
        !h.find(|o| matches!(o, Output::Store(_))),
        "no release without proof"
    );
    // For a minute — far past T and --stop-timeout — every round renews
    // (without health checks) and tries the stop again, harder.
    let mut revision = 8;
    for second in 1..=60 {
        h.advance_to(100.0 + f64::from(second));
        assert!(!h.find(|o| matches!(o, Output::HealthCheck { .. })));
        assert_eq!(renew_all(&mut h, &mut revision), 1, "renews at {second} s");
        assert_eq!(h.agent.role(), Role::SteppingDown, "at {second} s");
        h.answer_stop(StopKind::Emergency, false);
    }
    assert_eq!(h.agent.unproven_stops(), 61);
    // The next stop proves it: now, and only now, the release.
    h.advance_to(161.0);
    renew_all(&mut h, &mut revision);
    h.answer_stop(StopKind::Emergency, true);
    assert!(h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::StopProven { after: 61 })
    )));
    let (id, expected) = h.release_write();
    assert_eq!(expected, Token::new(1, revision));
    h.reply(id, StoreOutcome::Written(Token::new(1, revision + 1)));
    assert_eq!(h.agent.role(), Role::Standby);
    assert_eq!(h.agent.unproven_stops(), 0);
}

#[test]
fn h2_a_graceful_stop_past_the_stop_timeout_is_escalated_while_the_lease_is_renewed() {
    let mut h = holding();
    h.input(Input::ServiceExited);
    h.forget_store();
    // --stop-timeout is 30 s; the graceful stop never answers.
    let mut revision = 8;
    for second in 1..=30 {
        h.advance_to(100.0 + f64::from(second));
        renew_all(&mut h, &mut revision);
    }
    assert_eq!(h.agent.role(), Role::SteppingDown);
    h.advance_to(130.5);
    renew_all(&mut h, &mut revision);
    h.answer_stop(StopKind::Emergency, true);
    let (id, _) = h.release_write();
    h.reply(id, StoreOutcome::Written(Token::new(1, revision + 1)));
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn a_holder_whose_keeper_died_stops_the_service_itself_while_renewing() {
    let mut h = holding();
    h.input(Input::KeeperLost);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    // The keeper's deadline guards nothing any more: an emergency stop at
    // once, made by the agent (the host stops the tree without the keeper).
    h.answer_stop(StopKind::Emergency, false);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    let mut revision = 8;
    for second in 1..=15 {
        h.advance_to(100.0 + f64::from(second));
        assert_eq!(renew_all(&mut h, &mut revision), 1);
        h.answer_stop(StopKind::Emergency, second == 15);
    }
    let (id, _) = h.release_write();
    h.reply(id, StoreOutcome::Written(Token::new(1, revision + 1)));
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn a_lapsed_holder_retries_an_unproven_emergency_stop_and_never_exits() {
    let mut h = holding();
    h.forget_store();
    // No renewal answers: the licence ends at 110 s.
    for second in 1..=10 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        h.forget_store();
    }
    assert_eq!(h.agent.role(), Role::Lapsed);
    for second in 11..=20 {
        h.answer_stop(StopKind::Emergency, false);
        assert_eq!(h.agent.role(), Role::Lapsed);
        h.advance_to(100.0 + f64::from(second));
        h.forget_store();
    }
    assert!(!h.find(|o| matches!(o, Output::Exit(_))));
    h.answer_stop(StopKind::Emergency, true);
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn the_service_starts_only_once_the_keeper_armed_the_deadline() {
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    // S3 allows activating at once, but the keeper must hold the deadline
    // first: the node stays `confirming` until it says so.
    assert_eq!(h.agent.role(), Role::Confirming);
    let arm = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_))));
    let Output::Keeper(command) = arm else {
        unreachable!()
    };
    // The keeper is slow to answer: nothing starts meanwhile, renewals go on.
    let mut revision = 8;
    for second in 1..=3 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        assert_eq!(renew_all(&mut h, &mut revision), 1);
        assert!(!h.activated());
        assert_eq!(h.agent.role(), Role::Confirming);
    }
    h.input(Input::KeeperAck { command, ok: true });
    assert_eq!(h.agent.role(), Role::Active);
    assert!(h.activated());
    // The renewals made while waiting moved the licence on: the keeper
    // hears of it at once.
    assert!(h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Extend(_)))));
}

#[test]
fn a_refused_arm_means_no_activation() {
    // Over an absent record (S4): W + G of confirming first.
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(&mut h, None);
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 1)));
    let mut revision = 1;
    for second in 1..=13 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        renew_all(&mut h, &mut revision);
    }
    let Output::Keeper(command) = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_))))
    else {
        unreachable!()
    };
    // An answer for another deadline (an earlier tenure's) changes nothing.
    h.input(Input::KeeperAck {
        command: KeeperCommand::Arm(at(1.0)),
        ok: false,
    });
    assert_eq!(h.agent.role(), Role::Confirming);
    h.input(Input::KeeperAck { command, ok: false });
    // Never activated: back to standby, and no release (H6: a hidden
    // holder may still be inside the gap this tenure owed).
    assert_eq!(h.agent.role(), Role::Standby);
    assert!(!h.activated());
    assert!(!h.find(|o| matches!(o, Output::Activate { .. })));
    assert!(!h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))));
}

#[test]
fn a_tenure_over_a_release_that_started_nothing_is_given_back() {
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    assert_eq!(h.agent.role(), Role::Confirming);
    let _arm = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_))));
    // A shutdown while the keeper's answer is on its way: nothing ran, and
    // the predecessor proved its stop (S3), so the lock is given back at
    // once instead of going stale for everyone else.
    h.input(Input::Shutdown);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    assert!(h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm))));
    assert!(
        !h.find(|o| matches!(o, Output::Stop { .. })),
        "nothing to stop"
    );
    let (id, expected) = h.release_write();
    assert_eq!(expected, Token::new(1, 8));
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert!(h.find(|o| matches!(
        o,
        Output::Exit(putex_core::ExitReason::Shutdown { released: true })
    )));
    assert!(!h.activated());
}

/// A shutdown while the swap over a released record is on its way waits
/// for its outcome: landed, the lock is given back at once (S3; exiting
/// would leave a `confirming` record that everyone waits out for W + G');
/// refused, it exits at once; unanswered, it exits at the swap's deadline
/// (the store timeout), without waiting for a verification.
#[test]
fn a_shutdown_during_an_acquisition_waits_for_it_and_gives_a_landed_one_back() {
    for outcome in ["landed", "conflict", "unanswered"] {
        let mut h = Harness::new("a");
        look(
            &mut h,
            Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
        );
        let (swap, _) = h.store();
        let asked = h.now;
        h.input(Input::Shutdown);
        assert_eq!(
            h.agent.role(),
            Role::Standby,
            "{outcome}: exited with the swap on its way"
        );
        match outcome {
            "landed" => {
                h.reply(swap, StoreOutcome::Written(Token::new(1, 8)));
                assert_eq!(h.agent.role(), Role::SteppingDown, "{outcome}");
                let (id, expected) = h.release_write();
                assert_eq!(expected, Token::new(1, 8));
                h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
                assert!(h.find(|o| matches!(
                    o,
                    Output::Exit(putex_core::ExitReason::Shutdown { released: true })
                )));
                assert!(!h.activated(), "activated during a shutdown");
            }
            "conflict" => {
                h.reply(swap, StoreOutcome::Conflict);
                assert_eq!(h.agent.role(), Role::Exited, "{outcome}");
            }
            _ => {
                h.forget_store();
                let mut exited_at = None;
                for step in 1..=1200 {
                    h.advance_to(asked + f64::from(step) / 100.0);
                    h.health(true);
                    h.forget_store();
                    if h.agent.role() == Role::Exited {
                        exited_at = Some(h.now - asked);
                        break;
                    }
                }
                let timeout = timing().store_timeout().as_secs_f64();
                let exited_at = exited_at.expect("never exited");
                assert!(
                    exited_at <= timeout + 0.1,
                    "exited {exited_at} s after the shutdown"
                );
            }
        }
        assert_eq!(h.agent.role(), Role::Exited, "{outcome}");
    }
}

#[test]
fn an_unanswered_arm_gives_up_at_the_activate_timeout() {
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    let mut revision = 8;
    // --activate-timeout is 60 s; keep the lease alive meanwhile.
    for second in 1..=59 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        renew_all(&mut h, &mut revision);
        assert_eq!(h.agent.role(), Role::Confirming);
    }
    h.advance_to(160.0);
    // Given back (a tenure over a release that started nothing), and the
    // keeper, which may still get the `Arm`, is told to let it go.
    assert_eq!(h.agent.role(), Role::SteppingDown);
    assert!(!h.activated());
    assert!(h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm))));
    let (id, _) = h.release_write();
    h.reply(id, StoreOutcome::Written(Token::new(1, revision + 1)));
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn h3_h4_a_conflict_with_our_own_landed_write_is_adopted_a_foreign_one_is_lost() {
    let mut h = holding();
    // A renewal times out (unknown), but it landed.
    h.advance_to(101.0);
    h.health(true);
    let (id, op) = h.store();
    let StoreOp::Update { value, .. } = op else {
        panic!("{op:?}")
    };
    h.reply(id, StoreOutcome::Unknown);
    let landed = Entry {
        value,
        token: Token::new(1, 9),
        time: StoreTime {
            era: 1,
            nanos: 60 * SEC,
        },
    };
    // The next round first reads from the leader and adopts it (H4).
    h.advance_to(102.0);
    h.health(true);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    h.reply(id, StoreOutcome::Read(Some(landed)));
    assert_eq!(h.agent.role(), Role::Active);
    assert_eq!(
        h.agent.licence_end(),
        Some(at(111.0)),
        "licence from the unknown write's send time"
    );
    let (id, op) = h.store();
    let StoreOp::Update { expected, .. } = op else {
        panic!("{op:?}")
    };
    assert_eq!(expected, Token::new(1, 9));
    // This CAS conflicts: someone else's write is there (H3).
    h.reply(id, StoreOutcome::Conflict);
    let (id, _) = h.store();
    h.reply(
        id,
        StoreOutcome::Read(Some(entry(
            &holder(LockState::Confirming, 10_000),
            10,
            70.0,
        ))),
    );
    assert_eq!(h.agent.role(), Role::Lapsed);
    assert!(h.out.iter().any(|o| matches!(
        o,
        Output::Event(putex_core::Event::Transition {
            reason: Reason::Lost(_),
            ..
        })
    )));
}

#[test]
fn store_deadlines_never_reach_past_the_licence() {
    let mut h = holding();
    for second in 1..=9 {
        h.advance_to(100.0 + f64::from(second) + 0.95);
        h.health(true);
        for o in &h.out {
            if let Output::Store(r) = o {
                assert!(r.deadline <= at(110.0), "H5: deadline {:?}", r.deadline);
            }
        }
        h.forget_store();
    }
}

#[test]
fn h2_a_node_that_stepped_down_for_health_backs_off_before_acquiring_again() {
    let mut h = holding();
    fail_three_active_checks(&mut h);
    h.answer_stop(StopKind::Graceful, true);
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 30)));
    assert_eq!(h.agent.role(), Role::Standby);
    let stepped_down = h.now;
    let released = entry(&holder(LockState::Released, 10_000), 31, 80.0);
    // Healthy again and the lock is free, but the back-off (T = 10 s) holds.
    for second in 1..=9 {
        h.advance_to(stepped_down + f64::from(second));
        look(&mut h, Some(released.clone()));
        assert!(
            !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
            "acquired {second} s after a health step-down"
        );
    }
    h.advance_to(stepped_down + 10.5);
    look(&mut h, Some(released));
    let (_, op) = h.store();
    assert!(matches!(op, StoreOp::Update { .. }), "{op:?}");
}

#[test]
fn transition_reasons_explain_themselves() {
    let r = Reason::AcquiredStale {
        revision: Token::new(1, 41),
        unchanged_for: Duration::from_millis(10_210),
        store_age: Some(Duration::from_millis(10_240)),
    };
    assert_eq!(
        r.to_string(),
        "lock stale: rev 1:41 unchanged for 10.21s, store age 10.24s"
    );
}

#[test]
fn s3_our_own_acquisition_seen_first_by_the_watch_does_not_delay_activation() {
    let mut h = Harness::new("a");
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, op) = h.store();
    let StoreOp::Update { value, .. } = op else {
        panic!("{op:?}")
    };
    // The watch delivers our own write before the CAS reply arrives.
    let ours = Entry {
        value,
        token: Token::new(1, 8),
        time: StoreTime {
            era: 1,
            nanos: 51 * SEC,
        },
    };
    h.input(Input::Watch(Some(ours)));
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    assert!(
        h.activated(),
        "S3 activates at once; the floor is taken when the CAS is sent"
    );
}

#[test]
fn s5_a_shutdown_during_the_start_up_stop_exits_when_it_finishes() {
    let identity = Identity {
        node: "a".into(),
        machine: "m".into(),
        instance: "i".into(),
    };
    let config = AgentConfig {
        supervised_stops: true,
        ..AgentConfig::new(identity, timing())
    };
    let mut agent = Agent::new(config, at(1.0));
    let Some(Output::Stop { id, .. }) = agent.poll_output() else {
        panic!("a start-up stop first")
    };
    agent.handle(at(1.1), Input::Shutdown);
    agent.handle(at(1.2), Input::Stopped { id, ok: true });
    let outputs: Vec<Output> = std::iter::from_fn(|| agent.poll_output()).collect();
    assert!(
        outputs
            .iter()
            .any(|o| matches!(o, Output::Exit(putex_core::ExitReason::Shutdown { .. }))),
        "{outputs:#?}"
    );
    assert_eq!(agent.role(), Role::Exited);
}

#[test]
fn huge_advertised_leases_saturate_and_are_never_stale() {
    // Persistent `putex id` claims advertise a ten-year lease on a lock
    // record; a corrupt record may advertise u64::MAX ms. The time
    // arithmetic saturates: no panic, and the holder is never taken over.
    for lease_ms in [10 * 365 * 24 * 3600 * 1000, u64::MAX] {
        for state in [LockState::Active, LockState::Revoked] {
            let mut h = Harness::new("a");
            let mut rec = holder(state, lease_ms);
            rec.gap_ms = u64::MAX;
            let held = entry(&rec, 5, 1000.0);
            h.input(Input::Watch(Some(held.clone())));
            look(&mut h, Some(held.clone()));
            let mut reads = 0;
            // Whole days pass at once (a suspended host), then some rounds.
            for day in 1..=3 {
                h.now = 100.0 + f64::from(day) * 86_400.0;
                h.agent.handle_timeout(at(h.now));
                h.drain();
                for _ in 0..3 {
                    h.health(true);
                    while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
                        let Output::Store(r) = h.out.remove(i) else {
                            unreachable!()
                        };
                        assert!(
                            matches!(r.op, StoreOp::Get { .. }),
                            "{state:?} lease {lease_ms} ms: took over on day {day}: {:?}",
                            r.op
                        );
                        h.reply(r.id, StoreOutcome::Read(Some(held.clone())));
                        reads += 1;
                    }
                    h.advance_to(h.now + 1.0);
                }
                assert_eq!(h.agent.role(), Role::Standby);
            }
            assert!(reads >= 6, "the standby kept polling: {reads} reads");
        }
    }
}

#[test]
fn release_request_gives_the_lock_back_and_takes_it_again_in_one_write() {
    // The lease library's `Lock`: release, stay a standby out of turn, and
    // on the next turn take the lock back with a single CAS over our own
    // `released` record — no read, no fresh health check.
    let mut h = holding();
    h.input(Input::Turn(false));
    h.input(Input::Release);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    h.answer_stop(StopKind::Graceful, true);
    let (id, _) = h.release_write();
    // The reply alone tells the standby what the record is now: no read,
    // no waiting for the watch (a polled store's watch lags).
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert_eq!(h.agent.role(), Role::Standby);
    assert!(
        !h.find(|o| matches!(o, Output::Store(_))),
        "nothing to do out of turn: {:?}",
        h.out
    );
    h.input(Input::Turn(true));
    let (id, op) = h.store();
    assert!(
        matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(1, 9)),
        "{op:?}"
    );
    h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
    assert_eq!(h.agent.role(), Role::Active);
    assert!(h.find(|o| matches!(o, Output::Fence { token, .. } if *token == Token::new(1, 10))));
}

#[test]
fn the_release_may_take_until_the_licence_ends() {
    // After a proven stop nothing is left but the release: a busy store
    // that answers after the usual store timeout still frees the lock for
    // the waiters at once, instead of leaving them W + G'.
    let mut h = holding();
    let licence_end = h.agent.licence_end().expect("holding");
    h.input(Input::Release);
    h.answer_stop(StopKind::Graceful, true);
    let Output::Store(r) = h.take(|o| matches!(o, Output::Store(_))) else {
        unreachable!()
    };
    assert!(matches!(r.op, StoreOp::Update { .. }), "{:?}", r.op);
    assert_eq!(r.deadline, licence_end);
    h.reply(r.id, StoreOutcome::Written(Token::new(1, 9)));
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn after_an_ordinary_step_down_health_is_proven_again_and_the_old_view_is_forgotten() {
    // A child that exited (or any step-down but a release request) must
    // pass a standby check again before the node re-acquires, and the
    // record seen before the tenure is not CASed against.
    let mut h = holding();
    h.input(Input::ServiceExited);
    h.answer_stop(StopKind::Graceful, true);
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert_eq!(h.agent.role(), Role::Standby);
    assert!(
        !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
        "re-acquired without a health check or a fresh view: {:?}",
        h.out
    );
}

#[test]
fn h6_the_release_waits_for_the_renewal_in_flight() {
    // A release sent while a renewal is out would conflict with it when it
    // lands, leaving the lock to go stale: it waits for the renewal's reply.
    let mut h = holding();
    h.input(Input::Release);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    // The next round renews (stepping down renews without health checks).
    h.advance_to(h.now + 1.0);
    let (renewal, op) = h.store();
    assert!(matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(1, 8)));
    h.answer_stop(StopKind::Graceful, true);
    assert!(
        !h.find(|o| matches!(o, Output::Store(_))),
        "released while the renewal was out: {:?}",
        h.out
    );
    h.reply(renewal, StoreOutcome::Written(Token::new(1, 9)));
    let (id, expected) = h.release_write();
    assert_eq!(expected, Token::new(1, 9), "released over the renewal");
    h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
    assert_eq!(h.agent.role(), Role::Standby);
}

/// H4 for the release: a renewal whose outcome was unknown lands late,
/// after the release was sent over the older token, which then conflicts.
/// The holder reads its own writes, adopts the late renewal and releases
/// over it, so the next holder takes the lock at once (S3) instead of
/// waiting W + G' for it to go stale. A conflict with someone else's record
/// is a loss, not released over.
#[test]
fn h6_a_release_that_conflicts_with_our_own_late_renewal_is_sent_again_over_it() {
    for theirs in [false, true] {
        let mut h = holding();
        h.advance_to(h.now + 1.0);
        h.health(true);
        let (renewal, op) = h.store();
        let StoreOp::Update { value: late, .. } = op else {
            panic!("{op:?}")
        };
        h.reply(renewal, StoreOutcome::Unknown);
        h.input(Input::Release);
        h.answer_stop(StopKind::Graceful, true);
        let (id, expected) = h.release_write();
        assert_eq!(expected, Token::new(1, 8));
        // The renewal lands now, at 1:9: the release conflicts.
        h.reply(id, StoreOutcome::Conflict);
        let (read, op) = h.store();
        assert!(
            matches!(op, StoreOp::Get { leader: true, .. }),
            "no own-writes read after the conflict: {op:?}"
        );
        let found = if theirs {
            holder(LockState::Confirming, 10_000).encode()
        } else {
            late.clone()
        };
        h.reply(
            read,
            StoreOutcome::Read(Some(Entry {
                value: found,
                token: Token::new(1, 9),
                time: StoreTime {
                    era: 1,
                    nanos: 61 * SEC,
                },
            })),
        );
        if theirs {
            assert!(
                !h.find(
                    |o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))
                ),
                "released over someone else's record: {:?}",
                h.out
            );
            assert_ne!(h.agent.role(), Role::SteppingDown);
        } else {
            // The stop is proven and the keeper let go: the late renewal
            // extends the licence, but no extension goes to a keeper that
            // would refuse it (and alarm a script's stderr).
            let disarmed = h
                .out
                .iter()
                .position(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm)))
                .expect("the keeper is let go after the proven stop");
            assert!(
                !h.out[disarmed..]
                    .iter()
                    .any(|o| matches!(o, Output::Keeper(KeeperCommand::Extend(_)))),
                "an extension after the disarm: {:?}",
                h.out
            );
            let (id, expected) = h.release_write();
            assert_eq!(expected, Token::new(1, 9), "released over the late renewal");
            h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
            assert_eq!(h.agent.role(), Role::Standby);
            assert!(h.find(|o| matches!(
                o,
                Output::Event(putex_core::Event::Transition {
                    reason: Reason::Released,
                    ..
                })
            )));
        }
    }
}

/// H4 for the release, and H3 read rightly: a stepping-down holder whose
/// first release's reply never came (its keeper died meanwhile: a second
/// emergency stop, proven, sent a second release over the same token) finds
/// the second conflicting and its own-writes read showing the *first*
/// release. That is its own write, not another node's record: the tenure
/// ends released, without an emergency stop or a "lost, held by" itself
/// (found in chaos seeds 1450, 1802, 2300). A release of someone else's
/// instance at that revision is still a loss.
#[test]
fn h6_our_own_earlier_release_found_by_the_own_writes_read_ends_the_tenure_released() {
    for theirs in [false, true] {
        let mut h = holding();
        h.advance_to(h.now + 1.0);
        h.health(true);
        let (renewal, _) = h.store();
        h.reply(renewal, StoreOutcome::Unknown);
        h.input(Input::Shutdown);
        h.answer_stop(StopKind::Graceful, true);
        let (first, op) = h.store();
        let StoreOp::Update {
            value: released, ..
        } = op
        else {
            panic!("{op:?}")
        };
        // The first release lands (its reply is lost); the keeper dies.
        h.input(Input::KeeperLost);
        h.answer_stop(StopKind::Emergency, true);
        let (second, expected) = h.release_write();
        assert_eq!(expected, Token::new(1, 8));
        let _ = first;
        h.reply(second, StoreOutcome::Conflict);
        let (read, op) = h.store();
        assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
        let found = if theirs {
            let mut r = holder(LockState::Released, 10_000);
            r.write = "other-i1-9".into();
            r.encode()
        } else {
            released
        };
        h.out.clear();
        h.reply(
            read,
            StoreOutcome::Read(Some(Entry {
                value: found,
                token: Token::new(1, 9),
                time: StoreTime {
                    era: 1,
                    nanos: 61 * SEC,
                },
            })),
        );
        let lost = h.find(|o| {
            matches!(
                o,
                Output::Event(putex_core::Event::Transition {
                    reason: Reason::Lost(_),
                    ..
                })
            )
        });
        if theirs {
            assert!(lost, "someone else's release taken for ours: {:?}", h.out);
        } else {
            assert!(!lost, "our own release taken for a loss: {:?}", h.out);
            assert!(!h.find(|o| matches!(o, Output::Stop { .. })), "{:?}", h.out);
            assert!(h.find(|o| matches!(
                o,
                Output::Event(putex_core::Event::Transition {
                    reason: Reason::Released,
                    ..
                })
            )));
            assert!(h.find(|o| matches!(
                o,
                Output::Exit(putex_core::ExitReason::Shutdown { released: true })
            )));
        }
    }
}

#[test]
fn s7_a_revoked_holder_frees_the_lock_once_its_stop_is_proven() {
    let mut h = holding();
    // An administrator revokes our record (keeping our identity).
    let revoked = LockRecord {
        v: 1,
        node: "a".into(),
        machine: "a-machine".into(),
        instance: "a-i1".into(),
        state: LockState::Revoked,
        write: "admin-1".into(),
        lease_ms: 10_000,
        gap_ms: 2000,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    };
    h.input(Input::Watch(Some(entry(&revoked, 9, 60.0))));
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    h.reply(id, StoreOutcome::Read(Some(entry(&revoked, 9, 60.0))));
    assert_eq!(h.agent.role(), Role::Lapsed);
    // No release before the stop is proven.
    assert!(!h.find(|o| matches!(o, Output::Store(_))));
    h.answer_stop(StopKind::Emergency, true);
    assert_eq!(h.agent.role(), Role::Standby);
    let (id, expected) = h.release_write();
    assert_eq!(
        expected,
        Token::new(1, 9),
        "released over the revoked record"
    );
    h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
}

/// S6: a record a holder saw above its own (here the taker's, by watch)
/// is part of what the store has shown. When a rollback later shows the
/// node, now a standby, an older `released` record between the two, it is
/// a regression to be judged by the leader and waited out as absent —
/// never a clean release to take at once (found by the deep sweep, seed
/// chaos:164586). With the rule switched off, the node takes it at once.
#[test]
fn s6_a_record_seen_while_holding_makes_a_rolled_back_release_suspect() {
    for switched_off in [false, true] {
        let mutations = if switched_off {
            Mutations::only(Rule::HolderViewUntrusted)
        } else {
            Mutations::NONE
        };
        let mut h = holding_with(Harness::with_config("a", true, mutations));
        // Another node's record at 1:10 (above our 1:8): the lock is lost.
        let theirs = entry(&holder(LockState::Active, 10_000), 10, 60.0);
        h.input(Input::Watch(Some(theirs.clone())));
        let (id, op) = h.store();
        assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
        h.reply(id, StoreOutcome::Read(Some(theirs)));
        assert_eq!(h.agent.role(), Role::Lapsed);
        h.answer_stop(StopKind::Emergency, true);
        assert_eq!(h.agent.role(), Role::Standby);
        h.out.clear();
        // The store rolls back to 1:9, a release between the two.
        h.input(Input::Watch(Some(entry(
            &holder(LockState::Released, 10_000),
            9,
            61.0,
        ))));
        // A standby takes nothing before a healthy check.
        let t = h.now + 1.1;
        h.advance_to(t);
        h.health(true);
        let rolled_back = entry(&holder(LockState::Released, 10_000), 9, 61.0);
        let op = loop {
            match h.store() {
                (id, StoreOp::Get { leader: false, .. }) => {
                    h.reply(id, StoreOutcome::Read(Some(rolled_back.clone())))
                }
                (_, op) => break op,
            }
        };
        if switched_off {
            assert!(
                matches!(op, StoreOp::Update { .. }),
                "switched off, the release is taken at once: {op:?}"
            );
        } else {
            assert!(
                matches!(op, StoreOp::Get { leader: true, .. }),
                "a record below what we saw is asked of the leader first: {op:?}"
            );
        }
    }
}

/// A program that is its own service (a library lease, an HTTP client)
/// only hears of the loss; nothing proves it stopped acting, so its revoked
/// record stays for takers to judge after W + G'.
#[test]
fn s7_a_revoked_holder_without_a_supervisor_leaves_the_record_to_the_takers() {
    let mut h = holding_with(Harness::with_stops("a", false));
    let revoked = LockRecord {
        v: 1,
        node: "a".into(),
        machine: "a-machine".into(),
        instance: "a-i1".into(),
        state: LockState::Revoked,
        write: "admin-1".into(),
        lease_ms: 10_000,
        gap_ms: 2000,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    };
    h.input(Input::Watch(Some(entry(&revoked, 9, 60.0))));
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Read(Some(entry(&revoked, 9, 60.0))));
    assert_eq!(h.agent.role(), Role::Lapsed);
    h.answer_stop(StopKind::Emergency, true);
    assert_eq!(h.agent.role(), Role::Standby);
    assert!(
        !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
        "no release over the revoked record"
    );
}

#[test]
fn s7_a_revoked_record_of_a_tenure_that_never_ran_is_left_to_the_takers() {
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(&mut h, None);
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 1)));
    assert_eq!(h.agent.role(), Role::Confirming);
    let revoked = LockRecord {
        v: 1,
        node: "a".into(),
        machine: "a-machine".into(),
        instance: "a-i1".into(),
        state: LockState::Revoked,
        write: "admin-1".into(),
        lease_ms: 10_000,
        gap_ms: 2000,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    };
    h.forget_store();
    h.input(Input::Watch(Some(entry(&revoked, 2, 60.0))));
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Read(Some(entry(&revoked, 2, 60.0))));
    assert_eq!(h.agent.role(), Role::Standby);
    assert!(
        !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
        "no release: a hidden holder may still be inside the gap (H6)"
    );
}

/// Found by the million-seed sweep (regression `r14`): the agent froze
/// after its renewal but before the keeper read the `Extend`; the keeper
/// fired at the older deadline; on waking, the fence hook's result came in
/// before the keeper's "fired", and the service started under a fired
/// keeper. Nothing starts once the keeper's last acknowledged deadline has
/// passed: the activation waits for an acknowledged extension.
#[test]
fn the_service_never_starts_past_the_keepers_acknowledged_deadline() {
    let mut h = Harness::new("a");
    h.auto_arm = false;
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    let Output::Keeper(arm) = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_)))) else {
        unreachable!()
    };
    h.input(Input::KeeperAck {
        command: arm,
        ok: true,
    });
    assert_eq!(h.agent.role(), Role::Active);
    let _fence = h.take(|o| matches!(o, Output::Fence { .. }));
    // Renewals go on (the keeper's answers to their extensions are late),
    // past the deadline the keeper acknowledged (the Arm's, 110 s).
    let mut revision = 8;
    for second in 1..=10 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        renew_all(&mut h, &mut revision);
    }
    h.advance_to(110.5);
    h.input(Input::Hook {
        hook: putex_core::Hook::Fence,
        ok: true,
    });
    assert!(
        !h.find(|o| matches!(o, Output::Activate { .. })),
        "started under a keeper whose deadline passed"
    );
    // An extension the keeper acknowledges: now it may start.
    let ext = h
        .out
        .iter()
        .rev()
        .find_map(|o| match o {
            Output::Keeper(c @ KeeperCommand::Extend(_)) => Some(*c),
            _ => None,
        })
        .expect("extensions were sent");
    h.input(Input::KeeperAck {
        command: ext,
        ok: true,
    });
    assert!(h.find(|o| matches!(o, Output::Activate { .. })));
}

#[test]
fn s6_a_bucket_we_wrote_to_ourselves_is_no_re_created_bucket_afterwards() {
    // Trusting the first incarnation (1:73, from its host state), the node
    // finds the record gone, creates it in a re-created bucket (2:1) and
    // holds it.
    let mut h = Harness::with_highest("a", Token::new(1, 73));
    look(&mut h, None);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Create { .. }), "{op:?}");
    h.reply(id, StoreOutcome::Written(Token::new(2, 1)));
    let mut revision = 1;
    for second in 1..=13 {
        h.advance_to(100.0 + f64::from(second));
        h.health(true);
        while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            revision += 1;
            h.reply(r.id, StoreOutcome::Written(Token::new(2, revision)));
        }
    }
    assert!(h.activated());
    for hook in [putex_core::Hook::Fence, putex_core::Hook::Activate] {
        h.input(Input::Hook { hook, ok: true });
    }
    assert_eq!(h.agent.role(), Role::Active);
    // It gives the lock back (as `Lock` does), out of turn for now.
    h.input(Input::Turn(false));
    h.input(Input::Release);
    h.answer_stop(StopKind::Graceful, true);
    let (id, _) = h.release_write();
    revision += 1;
    h.reply(id, StoreOutcome::Written(Token::new(2, revision)));
    assert_eq!(h.agent.role(), Role::Standby);
    h.out.clear();

    // Another node takes it: a live record of the incarnation our own
    // writes landed in. It is judged as any live record (W), never as a
    // re-created bucket taken at once.
    let at_store = |token: Token, secs: f64| Entry {
        value: holder(LockState::Active, 10_000).encode(),
        token,
        time: StoreTime {
            era: 1,
            nanos: (secs * 1e9) as u64,
        },
    };
    let taken = at_store(Token::new(2, revision + 1), 90.0);
    h.input(Input::Watch(Some(taken.clone())));
    h.input(Input::Turn(true));
    let start = h.now;
    let answer = |h: &mut Harness, found: &Entry| {
        h.health(true);
        while let Some(i) = h
            .out
            .iter()
            .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Get { .. })))
        {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            h.reply(r.id, StoreOutcome::Read(Some(found.clone())));
        }
    };
    for second in 0..=9 {
        h.advance_to(start + f64::from(second));
        answer(&mut h, &taken);
        assert!(
            !h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. }))),
            "a live holder's record taken {second} s after it was first seen: {:?}",
            h.out
        );
        h.out.retain(|o| !matches!(o, Output::Store(_)));
    }
    // The other side: a record of a newer incarnation still is a re-created
    // bucket (S6), absent-like: taken once it stayed unchanged for W.
    h.advance_to(start + 10.0);
    let recreated = at_store(Token::new(3, 1), 99.0);
    answer(&mut h, &recreated);
    standby_until(&mut h, start + 30.0, &recreated);
    assert!(
        h.now >= start + 10.0 + 10.2,
        "taken {} s after",
        h.now - start - 10.0
    );
    let (_, op) = h.store();
    assert!(
        matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(3, 1)),
        "{op:?}"
    );
}

/// S6 for a re-created bucket, both sides. A node whose host state trusts
/// an older incarnation (1:73) finds a record of a newer one (2:5). If it
/// changes — a holder of the new incarnation renews it — it is a live
/// record: never taken (before this, the newcomer took it at once and
/// deposed a healthy holder, once per node that joined). If it stays
/// unchanged for W, it is judged as absent with that W already waited:
/// taken, and activated G' later (W + G' from the first sighting, as S4).
#[test]
fn s6_a_holder_of_a_re_created_bucket_is_not_deposed_by_a_newcomer() {
    let record = |revision: u64| Entry {
        value: holder(LockState::Active, 10_000).encode(),
        token: Token::new(2, revision),
        time: StoreTime {
            era: 1,
            nanos: (100.0 + revision as f64) as u64 * 1_000_000_000,
        },
    };
    // Renewed every second: never taken in 40 s.
    let mut h = Harness::with_highest("a", Token::new(1, 73));
    let mut revision = 5;
    look(&mut h, Some(record(revision)));
    for _ in 0..40 {
        assert!(
            !acquiring(&h),
            "a live record of the new incarnation taken: {:?}",
            h.out
        );
        revision += 1;
        h.input(Input::Watch(Some(record(revision))));
        let next = h.now + 1.0;
        standby_until(&mut h, next, &record(revision));
    }
    assert!(!acquiring(&h), "{:?}", h.out);

    // Unchanged: not before W (10.2 s), then taken as absent.
    let mut h = Harness::with_highest("a", Token::new(1, 73));
    look(&mut h, Some(record(5)));
    let first = h.now;
    standby_until(&mut h, first + 30.0, &record(5));
    assert!(
        acquiring(&h),
        "a dead record of the new incarnation never taken"
    );
    assert!(
        h.now >= first + 10.2,
        "taken {} s after it was first seen",
        h.now - first
    );
    assert!(
        h.now < first + 10.6,
        "taken {} s after it was first seen",
        h.now - first
    );
    let (id, op) = h.store();
    assert!(
        matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(2, 5)),
        "{op:?}"
    );
    h.reply(id, StoreOutcome::Written(Token::new(2, 6)));
    let taken = h.now;
    let mut revision = 6;
    let mut renew_until = |h: &mut Harness, t: f64| {
        while h.now < t {
            let next = (h.now + 0.5).min(t);
            h.advance_to(next);
            h.health(true);
            while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
                let Output::Store(r) = h.out.remove(i) else {
                    unreachable!()
                };
                revision += 1;
                h.reply(r.id, StoreOutcome::Written(Token::new(2, revision)));
            }
        }
    };
    renew_until(&mut h, taken + 1.9);
    assert_eq!(h.agent.role(), Role::Confirming);
    assert!(!h.activated(), "activated before G' after taking it");
    renew_until(&mut h, taken + 2.5);
    assert!(h.activated(), "not active G' after taking it");

    // Our own clock alone is not enough (S1 b): a standby whose clock
    // jumped sees W pass while the store's clock says 2 s. It probes and
    // waits — until the store's clock has W too — and takes nothing
    // before. With the witness switched off (`NewEpochOwnClockOnly`) it
    // takes the record on its own clock's word (chaos seeds 127069,
    // 330876, 361948, 373709, 453510: a holder of the new incarnation
    // still ran).
    for switched_off in [false, true] {
        let mutations = if switched_off {
            Mutations::only(Rule::NewEpochOwnClockOnly)
        } else {
            Mutations::NONE
        };
        let mut h = Harness::from_config("a", true, mutations, Some(Token::new(1, 73)));
        look(&mut h, Some(record(5)));
        let first = h.now;
        // 8 s of the agent's clock are 0.2 s of the store's: a jump.
        let jumped = |now: f64| 105.0 + ((now - first) - 8.0).max(0.2 * (now - first) / 8.0);
        standby_with_store_clock(&mut h, first + 30.0, &record(5), jumped);
        let taken_after = h.now - first;
        if switched_off {
            assert!(taken_after < 10.6, "the mutation took {taken_after} s");
        } else {
            assert!(
                taken_after >= 8.0 + 10.2,
                "taken {taken_after} s after first sight, before W on the store's clock"
            );
            assert!(acquiring(&h), "never taken once both clocks saw W");
        }
    }
}

/// S6 refinement (w), deterministic: a standby swaps over a `released`
/// record (1:29); before the reply it sees another node's acquisition over
/// the same release (1:30) by watch; a rollback loses that write and the
/// swap lands (1:38). The swap went over a record the store lost, whose
/// writer may believe it holds the lock: no activation at once (S3), the
/// absent wait W + G' instead. With the rule switched off
/// (`AcquireOverLostRecord`) the node activates at once.
#[test]
fn s6_a_swap_that_lands_over_a_record_others_took_owes_the_absent_wait() {
    for switched_off in [false, true] {
        let mutations = if switched_off {
            Mutations::only(Rule::AcquireOverLostRecord)
        } else {
            Mutations::NONE
        };
        let mut h = Harness::with_config("a", true, mutations);
        look(
            &mut h,
            Some(entry(&holder(LockState::Released, 10_000), 29, 50.0)),
        );
        let (id, op) = h.store();
        assert!(
            matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(1, 29)),
            "{op:?}"
        );
        let mut theirs = holder(LockState::Confirming, 10_000);
        theirs.write = "other-i1-2".into();
        h.input(Input::Watch(Some(entry(&theirs, 30, 50.1))));
        h.reply(id, StoreOutcome::Written(Token::new(1, 38)));
        if switched_off {
            assert!(h.activated(), "switched off, it activates at once");
        } else {
            assert_eq!(h.agent.role(), Role::Confirming);
            assert!(!h.activated(), "activated over a lost record");
            assert!(
                h.find(|o| matches!(
                    o,
                    Output::Event(putex_core::Event::AbsentWait {
                        why: putex_core::AbsentWhy::StoreWentBack,
                        ..
                    })
                )),
                "the wait was not said: {:?}",
                h.out
            );
            // W(10 s) + G'(2 s) ≈ 12.2 s later, not before.
            let mut revision = 38;
            for second in 1..=12 {
                h.advance_to(h.now + 1.0);
                h.health(true);
                while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
                    let Output::Store(r) = h.out.remove(i) else {
                        unreachable!()
                    };
                    let outcome = match r.op {
                        StoreOp::Get { .. } => StoreOutcome::Read(None),
                        _ => {
                            revision += 1;
                            StoreOutcome::Written(Token::new(1, revision))
                        }
                    };
                    h.reply(r.id, outcome);
                }
                assert!(!h.activated(), "activated {second} s after the swap");
            }
            h.advance_to(h.now + 0.5);
            assert!(h.activated(), "not active after W + G'");
        }
    }
}

/// S6, a rollback deeper than the swap's landing (chaos seed 115352): a
/// standby swaps over a `released` record (1:29); by watch it sees another
/// node's acquisition and renewals (1:30–1:33), which a rollback then loses,
/// and its swap lands at 1:30 — a revision *below* what it saw. The evidence
/// may come before the swap's reply (refinement (w), `AcquireOverLostRecord`)
/// or after it, while the keeper's arm is on its way
/// (`ForeignAboveWhileConfirming`); either way the other node may believe it
/// holds the lock, and the tenure owes the absent wait W + G', not S3's
/// nothing. Each rule switched off: it activates as soon as its own-writes
/// read shows its record.
#[test]
fn s6_a_swap_that_lands_below_records_others_wrote_owes_the_absent_wait() {
    for (rule, evidence_after_reply) in [
        (None, false),
        (None, true),
        (Some(Rule::AcquireOverLostRecord), false),
        (Some(Rule::ForeignAboveWhileConfirming), true),
    ] {
        let mutations = rule.map_or(Mutations::NONE, Mutations::only);
        let mut h = Harness::with_config("a", true, mutations);
        h.auto_arm = false;
        look(
            &mut h,
            Some(entry(&holder(LockState::Released, 10_000), 29, 50.0)),
        );
        let (id, op) = h.store();
        assert!(
            matches!(op, StoreOp::Update { expected, .. } if expected == Token::new(1, 29)),
            "{op:?}"
        );
        let theirs = |revision: u64| {
            let mut r = holder(LockState::Active, 10_000);
            r.write = format!("other-i1-{revision}");
            entry(&r, revision, 50.0 + revision as f64 / 100.0)
        };
        let StoreOp::Update { value, .. } = op else {
            unreachable!()
        };
        // What the store holds now, as an own-writes read shows it.
        let mut current = Entry {
            value,
            token: Token::new(1, 30),
            time: StoreTime {
                era: 1,
                nanos: 51 * SEC,
            },
        };
        if !evidence_after_reply {
            for revision in 30..=33 {
                h.input(Input::Watch(Some(theirs(revision))));
            }
        }
        h.reply(id, StoreOutcome::Written(Token::new(1, 30)));
        assert_eq!(h.agent.role(), Role::Confirming);
        if evidence_after_reply {
            // Above ours only: one at our own revision is refinement (s).
            for revision in 31..=33 {
                h.input(Input::Watch(Some(theirs(revision))));
            }
        }
        // The keeper acknowledges; own-writes reads show our record, which
        // every renewal moves on.
        let mut step = |h: &mut Harness, secs: f64| {
            h.advance_to(h.now + secs);
            h.health(true);
            while let Some(i) = h.out.iter().position(|o| {
                matches!(
                    o,
                    Output::Store(_)
                        | Output::Keeper(KeeperCommand::Arm(_) | KeeperCommand::Extend(_))
                )
            }) {
                match h.out.remove(i) {
                    Output::Keeper(command) => h.input(Input::KeeperAck { command, ok: true }),
                    Output::Store(r) => {
                        let outcome = match r.op {
                            StoreOp::Get { .. } => StoreOutcome::Read(Some(current.clone())),
                            StoreOp::Update { value, .. } => {
                                current.token.revision += 1;
                                current.value = value;
                                StoreOutcome::Written(current.token)
                            }
                            op => panic!("{op:?}"),
                        };
                        h.reply(r.id, outcome);
                    }
                    _ => unreachable!(),
                }
            }
        };
        step(&mut h, 0.01);
        if rule.is_some() {
            step(&mut h, 0.01);
            assert!(h.activated(), "{rule:?} switched off: it activates at once");
            continue;
        }
        assert!(!h.activated(), "activated over records the store lost");
        for second in 1..=12 {
            step(&mut h, 1.0);
            assert!(
                !h.activated(),
                "activated {second} s after the swap (evidence after the reply: {evidence_after_reply})"
            );
        }
        step(&mut h, 0.5);
        assert!(
            h.activated(),
            "not active after W + G' (evidence after the reply: {evidence_after_reply})"
        );
    }
}

// ----- operator controls (O1–O4) ----------------------------------------------

fn candidate(node: &str, position: Option<u64>, ready: bool) -> putex_core::Candidate {
    putex_core::Candidate {
        node: node.into(),
        priority: 1,
        position,
        ready,
        machine: None,
    }
}

fn pause() -> putex_core::Pause {
    putex_core::Pause {
        by: "ops@box".into(),
        reason: "maintenance".into(),
    }
}

/// The record a lock write carries.
fn written(op: &StoreOp) -> LockRecord {
    let (StoreOp::Update { value, .. }
    | StoreOp::Create { value, .. }
    | StoreOp::Put { value, .. }) = op
    else {
        panic!("not a write: {op:?}")
    };
    match Observed::decode(value) {
        Observed::Record(r) => r,
        Observed::Garbage => panic!("not a record"),
    }
}

fn acquiring(h: &Harness) -> bool {
    h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })))
}

/// A standby's time passing until `t`: every check passes and every read
/// shows `found`. The store's clock runs with the agent's, and read `found`'s
/// store time when the agent first saw it (for the probe of S1 b).
fn standby_until(h: &mut Harness, t: f64, found: &Entry) {
    let from = (h.now, found.time.nanos as f64 / 1e9);
    standby_with_store_clock(h, t, found, |now| from.1 + (now - from.0));
}

/// [`standby_until`] with the store's clock given as a function of the
/// agent's (seconds): the probe's store time (S1 b) is read from it.
fn standby_with_store_clock(h: &mut Harness, t: f64, found: &Entry, store: impl Fn(f64) -> f64) {
    let mut probe = Token::new(found.token.epoch, 1_000_000);
    while h.now < t {
        let next = (h.now + 0.25).min(t);
        h.advance_to(next);
        h.health(true);
        while let Some(i) = h.out.iter().position(|o| {
            matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Get { .. } | StoreOp::Put { key: Key::Probe, .. }))
        }) {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            let outcome = match r.op {
                StoreOp::Put { .. } => {
                    probe.revision += 1;
                    StoreOutcome::Written(probe)
                }
                StoreOp::Get { key: Key::Probe, .. } => StoreOutcome::Read(Some(Entry {
                    value: b"{}".to_vec(),
                    token: probe,
                    time: StoreTime {
                        era: found.time.era,
                        nanos: (store(h.now) * 1e9) as u64,
                    },
                })),
                _ => StoreOutcome::Read(Some(found.clone())),
            };
            h.reply(r.id, outcome);
        }
        if acquiring(h) {
            return;
        }
    }
}

/// A holder's time passing by `secs`: checks say `ok`, every write lands.
fn holder_for(h: &mut Harness, secs: f64, ok: bool, revision: &mut u64) {
    let until = h.now + secs;
    while h.now < until {
        h.advance_to((h.now + 1.0).min(until));
        h.health(ok);
        while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            *revision += 1;
            h.reply(r.id, StoreOutcome::Written(Token::new(1, *revision)));
        }
    }
}

#[test]
fn o1_a_switchover_stops_gracefully_then_releases_to_its_target() {
    let mut h = holding();
    h.input(Input::Members(vec![candidate("b", None, true)]));
    h.input(Input::Switchover {
        to: Some("b".into()),
        allow_lag: false,
    });
    assert_eq!(h.agent.role(), Role::SteppingDown);
    assert!(
        !h.find(|o| matches!(o, Output::Store(_))),
        "released before the stop"
    );
    h.answer_stop(StopKind::Graceful, true);
    let (id, op) = h.store();
    let r = written(&op);
    assert_eq!(r.state, LockState::Released);
    assert_eq!(r.to.as_deref(), Some("b"));
    assert_eq!(r.hold_ms, 2_000, "handed over for D = 2 R");
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert_eq!(h.agent.role(), Role::Standby);
}

#[test]
fn o1_a_switchover_to_a_target_that_does_not_qualify_is_refused() {
    let cases: [(Vec<putex_core::Candidate>, Option<&str>, bool, &str); 5] = [
        (vec![], Some("b"), false, "not a member"),
        (
            vec![candidate("b", None, false)],
            Some("b"),
            false,
            "not ready",
        ),
        (
            vec![putex_core::Candidate {
                priority: 0,
                ..candidate("b", None, true)
            }],
            Some("b"),
            false,
            "priority 0",
        ),
        (
            vec![candidate("b", None, false)],
            None,
            false,
            "no eligible",
        ),
        (vec![], Some("a"), false, "already holds"),
    ];
    for (members, to, allow_lag, why) in cases {
        let mut h = holding();
        h.input(Input::Members(members));
        h.input(Input::Switchover {
            to: to.map(Into::into),
            allow_lag,
        });
        assert_eq!(h.agent.role(), Role::Active, "{why}");
        assert!(
            h.find(|o| matches!(o, Output::Event(putex_core::Event::SwitchoverRefused { why: w, .. }) if w.contains(why))),
            "{why}: {:#?}",
            h.out
        );
    }
}

/// O1, the holder's side: a target behind the highest position is not
/// refused (under load it always is, by what was written since it last
/// published): the release asks it to catch up, unless `--allow-lag`
/// waived that. A target whose position is unknown is still refused.
#[test]
fn o1_a_lagging_target_is_handed_a_release_it_must_catch_up_to() {
    for allow_lag in [false, true] {
        let mut h = Harness::configured("a", |c| c.max_lag = Some(10));
        h.input(Input::Position(Some(1_000)));
        let mut h = holding_with(h);
        h.input(Input::Members(vec![candidate("b", Some(500), true)]));
        h.input(Input::Switchover {
            to: Some("b".into()),
            allow_lag,
        });
        assert_eq!(h.agent.role(), Role::SteppingDown, "allow_lag {allow_lag}");
        h.answer_stop(StopKind::Graceful, true);
        let (_, op) = h.store();
        let r = written(&op);
        assert_eq!(r.to.as_deref(), Some("b"));
        assert_eq!(r.catch_up, !allow_lag, "allow_lag {allow_lag}");
    }
    for to in [Some("b"), None] {
        let mut h = Harness::configured("a", |c| c.max_lag = Some(10));
        h.input(Input::Position(Some(1_000)));
        let mut h = holding_with(h);
        h.input(Input::Members(vec![candidate("b", None, true)]));
        h.input(Input::Switchover {
            to: to.map(Into::into),
            allow_lag: false,
        });
        assert_eq!(h.agent.role(), Role::Active, "to {to:?}");
    }
}

#[test]
fn o1_without_a_target_the_best_candidate_is_chosen() {
    let mut h = holding();
    h.input(Input::Members(vec![
        candidate("b", Some(10), true),
        candidate("c", Some(30), true),
        candidate("d", Some(50), false),
    ]));
    h.input(Input::Switchover {
        to: None,
        allow_lag: false,
    });
    h.answer_stop(StopKind::Graceful, true);
    let (_, op) = h.store();
    assert_eq!(
        written(&op).to.as_deref(),
        Some("c"),
        "most data among the ready"
    );
}

fn handed_to(to: &str) -> LockRecord {
    LockRecord {
        to: Some(to.into()),
        hold_ms: 2_000,
        catch_up: false,
        ..holder(LockState::Released, 10_000)
    }
}

#[test]
fn o1_a_release_handed_to_another_node_is_theirs_for_d() {
    let mut h = Harness::new("a");
    let release = entry(&handed_to("b"), 7, 50.0);
    look(&mut h, Some(release.clone()));
    assert!(!acquiring(&h), "took a release handed to b at once");
    assert_eq!(
        h.agent.blocker(),
        Some(putex_core::Blocker::HandedTo("b".into()))
    );
    standby_until(&mut h, 101.99, &release);
    assert!(!acquiring(&h));
    standby_until(&mut h, 102.5, &release);
    assert!(acquiring(&h), "an ordinary release once D has passed");
    assert!(
        h.now < 102.3,
        "taken at {} (D, plus the read of that round)",
        h.now
    );
}

/// A release that does not ask its target to catch up (`--allow-lag`, or
/// a record of an older version) is taken at once, whatever the lag.
#[test]
fn o1_the_target_takes_a_release_without_catch_up_at_once_even_beyond_max_lag() {
    let mut h = Harness::configured("b", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(0)));
    h.input(Input::Members(vec![candidate("c", Some(100), true)]));
    look(&mut h, Some(entry(&handed_to("b"), 7, 50.0)));
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Written(Token::new(1, 8)));
    assert!(h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::Transition {
            reason: Reason::AcquiredHandover,
            ..
        })
    )));
    assert!(h.activated(), "S3: activated at once");
}

fn handed_to_catching_up(to: &str) -> LockRecord {
    LockRecord {
        catch_up: true,
        ..handed_to(to)
    }
}

/// O1, the target's side: beyond `--max-lag` it does not take the release
/// but asks for a fresh position, once per sample; within `--max-lag` it
/// takes it at once.
#[test]
fn o1_a_target_behind_takes_its_release_once_it_caught_up() {
    let mut h = Harness::configured("b", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(0)));
    h.input(Input::Members(vec![candidate("a", Some(100), true)]));
    look(&mut h, Some(entry(&handed_to_catching_up("b"), 7, 50.0)));
    assert!(!acquiring(&h), "took the release 100 behind");
    assert_eq!(
        h.agent.blocker(),
        Some(putex_core::Blocker::Lagging(Some(100)))
    );
    let samples = h
        .out
        .iter()
        .filter(|o| matches!(o, Output::SamplePosition))
        .count();
    assert_eq!(samples, 1, "one sample asked for");
    let _ = h.take(|o| matches!(o, Output::SamplePosition));
    h.input(Input::Position(Some(50)));
    assert!(!acquiring(&h), "took the release 50 behind");
    let _ = h.take(|o| matches!(o, Output::SamplePosition));
    assert!(
        !h.find(|o| matches!(o, Output::SamplePosition)),
        "asked twice for one sample"
    );
    h.input(Input::Position(Some(95)));
    assert!(acquiring(&h), "did not take the release within --max-lag");
    assert_eq!(h.agent.blocker(), None);
}

/// O1, bounded: a target that has not caught up within the release's hold
/// takes nothing (O3); the release is an ordinary one, which a candidate
/// within `--max-lag` takes once D passed.
#[test]
fn o1_a_target_that_does_not_catch_up_within_the_hold_takes_nothing() {
    let release = entry(&handed_to_catching_up("b"), 7, 50.0);
    let mut h = Harness::configured("b", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(0)));
    h.input(Input::Members(vec![candidate("a", Some(100), true)]));
    look(&mut h, Some(release.clone()));
    standby_until(&mut h, 104.0, &release);
    assert!(!acquiring(&h), "took the release while 100 behind");
    assert_eq!(
        h.agent.blocker(),
        Some(putex_core::Blocker::Lagging(Some(100)))
    );
    let mut other = Harness::configured("a", |c| c.max_lag = Some(10));
    other.input(Input::Position(Some(100)));
    other.input(Input::Members(vec![candidate("b", Some(0), true)]));
    look(&mut other, Some(release.clone()));
    assert!(!acquiring(&other), "took a release handed to b at once");
    standby_until(&mut other, 102.5, &release);
    assert!(acquiring(&other), "the release was not taken after D");
}

/// Mutation proof for O1's catch-up: with `--max-lag` ignored
/// (`IgnoreEligibility`) the target takes the release 100 behind at once.
#[test]
fn mutation_a_target_that_does_not_catch_up_is_seen() {
    let mut h = Harness::configured("b", |c| {
        c.max_lag = Some(10);
        c.mutations = Mutations::only(Rule::IgnoreEligibility);
    });
    h.input(Input::Position(Some(0)));
    h.input(Input::Members(vec![candidate("a", Some(100), true)]));
    look(&mut h, Some(entry(&handed_to_catching_up("b"), 7, 50.0)));
    assert!(acquiring(&h));
}

#[test]
fn mutation_taking_a_release_handed_to_another_is_seen() {
    let mut h = Harness::with_config("a", true, Mutations::only(Rule::TakeHandedToOther));
    look(&mut h, Some(entry(&handed_to("b"), 7, 50.0)));
    assert!(acquiring(&h));
}

/// Pauses `h` (active): the paused renewal is sent and lands at 1:9.
fn paused(mut h: Harness) -> Harness {
    h.input(Input::Pause(pause()));
    let (id, op) = h.store();
    assert_eq!(written(&op).paused, Some(pause()));
    h.last_write = Some(op);
    assert!(
        !h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm))),
        "disarmed before the paused record landed"
    );
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert!(h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm))));
    assert!(h.find(|o| matches!(o, Output::Event(putex_core::Event::Paused(_)))));
    h.out.clear();
    h
}

#[test]
fn o2_a_pause_whose_write_is_unknown_disarms_nothing() {
    let mut h = holding();
    h.input(Input::Pause(pause()));
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Unknown);
    assert!(!h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Disarm))));
    assert_eq!(h.agent.pause(), None);
    // The licence still ends the tenure: H1 holds until a pause lands.
    for _ in 0..12 {
        h.advance_to(h.now + 1.0);
        h.health(true);
        h.forget_store();
    }
    assert_eq!(h.agent.role(), Role::Lapsed);
}

#[test]
fn o2_while_paused_nothing_is_stopped_and_health_does_not_count() {
    let mut h = paused(holding());
    // Failing checks and a store that answers nothing for 3 T.
    for _ in 0..30 {
        h.advance_to(h.now + 1.0);
        h.health(false);
        h.forget_store();
    }
    h.input(Input::ServiceExited);
    assert_eq!(h.agent.role(), Role::Active);
    assert!(
        !h.find(|o| matches!(o, Output::Stop { .. })),
        "stopped something"
    );
    assert!(!h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Extend(_)))));
    // A renewal gets through again: still paused, still ours (first the
    // own-writes read of H4: nothing of the unanswered ones landed).
    h.advance_to(h.now + 1.0);
    h.health(false);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    let ours = Entry {
        value: written(h.last_write.as_ref().unwrap()).encode(),
        token: Token::new(1, 9),
        time: StoreTime { era: 1, nanos: 0 },
    };
    h.reply(id, StoreOutcome::Read(Some(ours)));
    let (id, op) = h.store();
    assert!(written(&op).paused.is_some());
    h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
    assert_eq!(h.agent.role(), Role::Active);
    // A shutdown exits without stopping or releasing.
    h.input(Input::Shutdown);
    assert_eq!(h.agent.role(), Role::Exited);
    assert!(!h.find(|o| matches!(o, Output::Stop { .. } | Output::Store(_))));
}

#[test]
fn o2_a_resume_arms_the_keeper_before_the_unpaused_record_is_written() {
    let mut h = paused(holding());
    h.auto_arm = false;
    h.input(Input::Resume);
    let arm = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_))));
    assert!(
        !h.find(|o| matches!(o, Output::Store(_))),
        "wrote before the keeper armed"
    );
    let Output::Keeper(command) = arm else {
        unreachable!()
    };
    h.input(Input::KeeperAck { command, ok: true });
    assert!(h.find(|o| matches!(o, Output::Event(putex_core::Event::Unpaused))));
    let (id, op) = h.store();
    assert_eq!(written(&op).paused, None);
    h.reply(id, StoreOutcome::Written(Token::new(1, 10)));
    // Every rule again: K failed checks (after the start grace) step down.
    let mut revision = 10;
    holder_for(&mut h, 6.0, true, &mut revision);
    holder_for(&mut h, 3.0, false, &mut revision);
    assert_eq!(h.agent.role(), Role::SteppingDown);
}

#[test]
fn o2_a_resume_the_keeper_refuses_stays_paused() {
    let mut h = paused(holding());
    h.auto_arm = false;
    h.input(Input::Resume);
    let Output::Keeper(command) = h.take(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_))))
    else {
        unreachable!()
    };
    h.input(Input::KeeperAck { command, ok: false });
    assert!(h.find(|o| matches!(o, Output::Event(putex_core::Event::ResumeRefused))));
    assert!(h.agent.pause().is_some());
    assert!(!h.find(|o| matches!(o, Output::Store(_))));
}

fn paused_record() -> LockRecord {
    LockRecord {
        paused: Some(pause()),
        ..holder(LockState::Active, 10_000)
    }
}

#[test]
fn o2_a_standby_never_takes_over_a_paused_record() {
    let mut h = Harness::new("a");
    let record = entry(&paused_record(), 5, 50.0);
    look(&mut h, Some(record.clone()));
    for _ in 0..60 {
        h.advance_to(h.now + 1.0);
        look(&mut h, Some(record.clone()));
        assert!(
            !h.find(|o| matches!(o, Output::Store(r) if !matches!(r.op, StoreOp::Get { .. }))),
            "probed or took over a paused record"
        );
    }
    assert_eq!(h.agent.blocker(), Some(putex_core::Blocker::Paused));
    // Resumed by someone else (revoked over the paused record): stale from
    // then on, W + G' later.
    let revoked = entry(
        &LockRecord {
            state: LockState::Revoked,
            ..paused_record()
        },
        6,
        110.0,
    );
    h.input(Input::Watch(Some(revoked)));
    let from = h.now;
    h.advance_to(from + 10.0);
    assert!(!acquiring(&h));
}

#[test]
fn mutation_taking_over_a_paused_record_is_seen() {
    let mut h = Harness::with_config("a", true, Mutations::only(Rule::TakeoverWhilePaused));
    let record = entry(&paused_record(), 5, 50.0);
    look(&mut h, Some(record.clone()));
    standby_until(&mut h, 111.0, &record);
    assert!(acquiring(&h), "the paused record was not taken over");
}

#[test]
fn o3_priority_zero_never_takes_over() {
    let mut h = Harness::configured("a", |c| c.priority = 0);
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    h.advance_to(h.now + 30.0);
    assert!(!acquiring(&h));
    assert_eq!(h.agent.blocker(), Some(putex_core::Blocker::PriorityZero));
}

#[test]
fn o3_beyond_max_lag_nothing_is_taken() {
    let mut h = Harness::configured("a", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(50)));
    h.input(Input::Members(vec![candidate("b", Some(100), false)]));
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    assert!(!acquiring(&h));
    assert_eq!(
        h.agent.blocker(),
        Some(putex_core::Blocker::Lagging(Some(50)))
    );
    // Caught up: taken.
    h.input(Input::Position(Some(95)));
    assert!(acquiring(&h));
}

#[test]
fn o3_a_better_candidate_acts_first_and_the_others_d_later() {
    let mut h = Harness::new("a");
    h.input(Input::Position(Some(10)));
    h.input(Input::Members(vec![candidate("b", Some(20), true)]));
    let release = entry(&holder(LockState::Released, 10_000), 7, 50.0);
    look(&mut h, Some(release.clone()));
    assert!(!acquiring(&h));
    assert_eq!(
        h.agent.blocker(),
        Some(putex_core::Blocker::Deferring("b".into()))
    );
    standby_until(&mut h, 101.99, &release);
    assert!(!acquiring(&h));
    standby_until(&mut h, 102.5, &release);
    assert!(acquiring(&h), "b did not act: this node does, D later");
    assert!(
        h.now < 102.3,
        "taken at {} (D, plus the read of that round)",
        h.now
    );
}

#[test]
fn o4_a_node_that_must_rejoin_takes_nothing_until_its_hook_succeeds() {
    let mut h = Harness::configured("a", |c| c.rejoin = true);
    look(
        &mut h,
        Some(entry(&holder(LockState::Active, 10_000), 5, 50.0)),
    );
    let rejoin = h.take(|o| matches!(o, Output::Rejoin { .. }));
    assert!(matches!(rejoin, Output::Rejoin { holder: Some(ref n), .. } if n == "other"));
    h.input(Input::Hook {
        hook: putex_core::Hook::Rejoin,
        ok: false,
    });
    assert_eq!(h.agent.blocker(), Some(putex_core::Blocker::Rejoining));
    let release = entry(&holder(LockState::Released, 10_000), 6, 60.0);
    h.input(Input::Watch(Some(release.clone())));
    assert!(!acquiring(&h), "took the lock before rejoining");
    // Tried again after T; this time it works.
    let from = h.now;
    standby_until(&mut h, from + 10.1, &release);
    assert!(!acquiring(&h), "took the lock before rejoining");
    let _ = h.take(|o| matches!(o, Output::Rejoin { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Rejoin,
        ok: true,
    });
    assert!(h.find(|o| matches!(o, Output::Event(putex_core::Event::Rejoined))));
    standby_until(&mut h, from + 12.0, &release);
    assert!(acquiring(&h));
}

#[test]
fn o1_the_releaser_itself_leaves_its_handover_to_the_target() {
    let mut h = holding();
    h.input(Input::Members(vec![candidate("b", None, true)]));
    h.input(Input::Switchover {
        to: Some("b".into()),
        allow_lag: false,
    });
    h.answer_stop(StopKind::Graceful, true);
    let (id, op) = h.store();
    let release = Entry {
        value: written(&op).encode(),
        token: Token::new(1, 9),
        time: StoreTime {
            era: 1,
            nanos: 60 * SEC,
        },
    };
    h.reply(id, StoreOutcome::Written(Token::new(1, 9)));
    assert_eq!(h.agent.role(), Role::Standby);
    let from = h.now;
    standby_until(&mut h, from + 1.9, &release);
    assert!(!acquiring(&h), "took back its own release handed to b");
    standby_until(&mut h, from + 2.5, &release);
    assert!(acquiring(&h), "an ordinary release once D has passed");
}

#[test]
fn o5_failback_only_after_the_preferred_node_was_ready_for_the_hold_down() {
    let mut h = Harness::configured("a", |c| c.failback_after = Some(Duration::from_secs(5)));
    let mut h = {
        h.input(Input::Members(vec![]));
        holding_with(h)
    };
    let preferred = putex_core::Candidate {
        priority: 2,
        ..candidate("b", None, true)
    };
    let mut revision = 8;
    h.input(Input::Members(vec![preferred.clone()]));
    holder_for(&mut h, 3.0, true, &mut revision);
    // A break in its readiness restarts the hold-down.
    h.input(Input::Members(vec![putex_core::Candidate {
        ready: false,
        ..preferred.clone()
    }]));
    h.input(Input::Members(vec![preferred.clone()]));
    holder_for(&mut h, 4.5, true, &mut revision);
    assert_eq!(
        h.agent.role(),
        Role::Active,
        "failed back before the hold-down"
    );
    holder_for(&mut h, 1.0, true, &mut revision);
    assert_eq!(h.agent.role(), Role::SteppingDown);
    assert!(h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::Transition {
            reason: Reason::Failback { .. },
            ..
        })
    )));
}

#[test]
fn o3_an_operator_may_let_a_lagging_standby_take_an_unheld_lock() {
    let mut h = Harness::configured("a", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(50)));
    h.input(Input::Members(vec![candidate("b", Some(100), false)]));
    let release = entry(&holder(LockState::Released, 10_000), 7, 50.0);
    look(&mut h, Some(release.clone()));
    assert!(!acquiring(&h));
    // Named with --allow-lag and no holder to ask: the waiver.
    h.input(Input::Switchover {
        to: Some("a".into()),
        allow_lag: true,
    });
    assert!(!h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::SwitchoverRefused { .. })
    )));
    let from = h.now;
    standby_until(&mut h, from + 1.5, &release);
    assert!(acquiring(&h), "the waiver did not let it take the lock");
    // Another node's name waives nothing.
    let mut h = Harness::configured("a", |c| c.max_lag = Some(10));
    h.input(Input::Position(Some(50)));
    h.input(Input::Members(vec![candidate("b", Some(100), false)]));
    look(&mut h, Some(release.clone()));
    h.input(Input::Switchover {
        to: Some("c".into()),
        allow_lag: true,
    });
    let from = h.now;
    standby_until(&mut h, from + 1.5, &release);
    assert!(!acquiring(&h));
}

#[test]
fn o2_the_unpaused_record_is_written_even_while_checks_fail() {
    // Resumed while a paused renewal is on its way and every check fails:
    // health gates renewals, not the end of a pause. Without the unpaused
    // record the paused one would outlive the tenure (nobody takes over).
    let mut h = paused(holding());
    h.advance_to(h.now + 1.0);
    h.health(false);
    let (renewal, op) = h.store();
    assert!(written(&op).paused.is_some());
    h.input(Input::Resume);
    assert!(h.find(|o| matches!(o, Output::Event(putex_core::Event::Unpaused))));
    h.reply(renewal, StoreOutcome::Written(Token::new(1, 10)));
    let (id, op) = h.store();
    assert_eq!(written(&op).paused, None, "the resume's own write");
    h.reply(id, StoreOutcome::Written(Token::new(1, 11)));
    // From here on, failed checks skip renewals again (H2).
    h.advance_to(h.now + 1.0);
    h.health(false);
    assert!(!h.find(|o| matches!(o, Output::Store(_))));
}

// ----- O2: a paused holder restarted ------------------------------------------

/// An agent started where an earlier instance (`a-i0`) ran: no keeper to
/// adopt. It reads the record before it stops anything.
fn restarted(node: &str) -> Harness {
    Harness::started(AgentConfig {
        previous: Some(putex_core::PreviousInstance {
            instance: format!("{node}-i0"),
            same_boot: false,
            keeper_deadline: None,
        }),
        ..config_for(node)
    })
}

/// The earlier instance's record: active, paused or not.
fn own_record(node: &str, paused: bool) -> LockRecord {
    LockRecord {
        node: node.into(),
        machine: format!("{node}-machine"),
        instance: format!("{node}-i0"),
        write: format!("{node}-i0-9"),
        paused: paused.then(pause),
        ..holder(LockState::Active, 10_000)
    }
}

fn stops(h: &Harness) -> bool {
    h.find(|o| matches!(o, Output::Stop { .. }))
}

/// O2, both sides: a holder restarted while paused takes its record back
/// and stops nothing, through a store outage far longer than T; without the
/// pause (or with another node's pause) the start-up stop runs (S5).
#[test]
fn o2_a_paused_holder_restarted_stops_nothing_and_keeps_the_pause() {
    let mut h = restarted("a");
    assert!(!stops(&h), "stopped before reading the record: {:?}", h.out);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    h.reply(
        id,
        StoreOutcome::Read(Some(entry(&own_record("a", true), 40, 90.0))),
    );
    assert_eq!(h.agent.role(), Role::Active);
    assert!(!stops(&h), "{:?}", h.out);
    assert!(!h.activated(), "hooks ran while paused");
    assert!(h.find(|o| matches!(
        o,
        Output::Event(putex_core::Event::Transition {
            reason: Reason::ResumedPaused,
            ..
        })
    )));
    assert!(h.agent.pause().is_some());
    // The first renewal swaps the record over, still paused, as this instance.
    let (id, op) = h.store();
    let StoreOp::Update {
        expected, value, ..
    } = &op
    else {
        panic!("{op:?}")
    };
    assert_eq!(*expected, Token::new(1, 40));
    let Observed::Record(r) = Observed::decode(value) else {
        panic!()
    };
    assert_eq!(r.instance, "a-i1");
    assert_eq!(r.paused, Some(pause()));
    h.reply(id, StoreOutcome::Written(Token::new(1, 41)));
    // The store goes away for a minute: still paused, still nothing stopped.
    for second in 1..=60 {
        h.advance_to(100.0 + f64::from(second));
        h.health(false);
        h.forget_store();
    }
    assert_eq!(h.agent.role(), Role::Active);
    assert!(!stops(&h), "{:?}", h.out);
    assert!(!h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Arm(_)))));

    // The other side: not paused, or paused by another node: stopped first.
    for record in [own_record("a", false), own_record("b", true)] {
        let mut h = restarted("a");
        let (id, _) = h.store();
        h.reply(id, StoreOutcome::Read(Some(entry(&record, 40, 90.0))));
        assert!(
            h.find(|o| matches!(
                o,
                Output::Stop {
                    kind: StopKind::Startup,
                    ..
                }
            )),
            "no start-up stop under {record:?}"
        );
        assert_eq!(h.agent.role(), Role::Starting);
    }
    // No answer from the store: nothing says it is ours and paused.
    let mut h = restarted("a");
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Unknown);
    assert!(h.find(|o| matches!(
        o,
        Output::Stop {
            kind: StopKind::Startup,
            ..
        }
    )));
}

/// O2: the record changed between the read and the swap (an operator's
/// forced resume): the swap conflicts, the node has lost, and the service
/// it took back is stopped like any lost holder's.
#[test]
fn o2_a_paused_record_resumed_by_force_meanwhile_is_lost_and_stopped() {
    let mut h = restarted("a");
    let (id, _) = h.store();
    h.reply(
        id,
        StoreOutcome::Read(Some(entry(&own_record("a", true), 40, 90.0))),
    );
    let (id, _) = h.store();
    h.reply(id, StoreOutcome::Conflict);
    let (id, op) = h.store();
    assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
    h.reply(
        id,
        StoreOutcome::Read(Some(entry(&own_record("a", false), 42, 95.0))),
    );
    assert!(
        h.find(|o| matches!(
            o,
            Output::Stop {
                kind: StopKind::Emergency,
                ..
            }
        )),
        "{:?}",
        h.out
    );
}

/// S6, both sides: a leader read that the watch overtook — sent when 1:10
/// was the newest record, answered 1:11 after the watch showed 1:12 — is
/// old news, not a regression: the standby asks the leader again, and
/// takes nothing as absent. A leader read below what was trusted when it
/// was sent is a regression (found by `putex lock --limit 4` with 16
/// clients on NATS: a false "STORE REGRESSED" once writes got faster).
#[test]
fn s6_a_leader_read_overtaken_by_the_watch_is_not_a_regression() {
    for answer in [11, 9] {
        let mut h = Harness::new("a");
        let active = |rev| entry(&holder(LockState::Active, 10_000), rev, 60.0);
        look(&mut h, Some(active(10)));
        h.forget_store();
        h.out.clear();
        // A record below the newest one seen: asked of the leader.
        h.input(Input::Watch(Some(active(8))));
        let (id, op) = h.store();
        assert!(matches!(op, StoreOp::Get { leader: true, .. }), "{op:?}");
        // Meanwhile the watch shows a newer record.
        h.input(Input::Watch(Some(active(12))));
        h.reply(id, StoreOutcome::Read(Some(active(answer))));
        let regressed =
            h.find(|o| matches!(o, Output::Event(putex_core::Event::StoreRegressed { .. })));
        if answer == 11 {
            assert!(!regressed, "an overtaken read is not a regression");
            let (_, op) = h.store();
            assert!(
                matches!(op, StoreOp::Get { leader: true, .. }),
                "the leader is asked again: {op:?}"
            );
        } else {
            assert!(regressed, "below what was trusted when sent: a regression");
        }
    }
}

/// O3, both sides: the node whose record went stale is no candidate for
/// its own lock — a holder cut off from the store calls itself a ready
/// standby once its licence ends, in a member record that still reaches
/// the store, and deferring to it added D to the failover (chaos
/// `drop-replies`, CI s20b: 653–675 ms against 606 allowed). Another
/// ready candidate that outranks this node is still deferred to.
#[test]
fn o3_the_stale_holder_is_no_candidate_for_its_own_lock() {
    for with_better_standby in [false, true] {
        let mut h = Harness::new("a");
        h.input(Input::Position(Some(10)));
        let mut members = vec![candidate("other", Some(30), true)];
        if with_better_standby {
            members.push(candidate("b", Some(20), true));
        }
        h.input(Input::Members(members));
        let held = entry(&holder(LockState::Active, 10_000), 5, 50.0);
        look(&mut h, Some(held.clone()));
        // Past the first rounds, where "held by" is the reason.
        let until = h.now + 2.5;
        standby_until(&mut h, until, &held);
        let blocker = h.agent.blocker();
        if with_better_standby {
            assert_eq!(blocker, Some(putex_core::Blocker::Deferring("b".into())));
        } else {
            assert!(
                !matches!(blocker, Some(putex_core::Blocker::Deferring(_))),
                "deferring to the stale holder: {blocker:?}"
            );
        }
    }
}

// ----- failsafe, a member's side (F1, F4) ----------------------------------

/// A standby with failsafe on (`docs/failsafe-design.md`).
fn failsafe_member() -> Harness {
    Harness::configured("a", |c| c.failsafe = true)
}

/// `other`'s request for a grant (instance `instance`, token `revision`),
/// and the member's answer.
fn ask(h: &mut Harness, instance: &str, revision: u64) -> FailsafeAnswer {
    h.input(Input::Failsafe(FailsafeRequest {
        id: 7,
        node: "other".into(),
        machine: "other-machine".into(),
        instance: instance.into(),
        token: Token::new(1, revision),
    }));
    match h.take(|o| matches!(o, Output::FailsafeAnswer { id: 7, .. })) {
        Output::FailsafeAnswer { answer, .. } => answer,
        _ => unreachable!(),
    }
}

/// F1, both sides: a member grants the holder whose record it saw last,
/// and refuses when failsafe is off, when the newest record it saw is
/// another instance's or not a holding one, when it saw none (absent), when
/// the token is below the highest its host has seen, and while it acquires
/// or holds the lock itself.
#[test]
fn f1_a_member_grants_the_holder_it_saw_last_and_refuses_everything_else() {
    let held = entry(&holder(LockState::Active, 10_000), 5, 1000.0);
    let mut off = Harness::new("a");
    look(&mut off, Some(held.clone()));
    assert_eq!(
        ask(&mut off, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::Off)
    );

    let mut h = failsafe_member();
    look(&mut h, Some(held.clone()));
    assert_eq!(ask(&mut h, "other-i1", 5), FailsafeAnswer::Granted);
    // A newer write of the same holding that this member has not read yet.
    assert_eq!(ask(&mut h, "other-i1", 9), FailsafeAnswer::Granted);
    assert!(matches!(
        ask(&mut h, "other-i2", 6),
        FailsafeAnswer::Refused(FailsafeRefusal::Newest { .. })
    ));

    let mut revoked = failsafe_member();
    let taken_away = entry(&holder(LockState::Revoked, 10_000), 5, 1000.0);
    look(&mut revoked, Some(taken_away));
    assert!(matches!(
        ask(&mut revoked, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::Newest {
            state: LockState::Revoked,
            ..
        })
    ));
    // A released record is taken at once: an acquirer refuses.
    let mut released = failsafe_member();
    let free = entry(&holder(LockState::Released, 10_000), 5, 1000.0);
    look(&mut released, Some(free));
    assert!(acquiring(&released));
    assert_eq!(
        ask(&mut released, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::Acquiring)
    );

    let mut unreadable = failsafe_member();
    let mut garbage = held.clone();
    garbage.value = b"not a record".to_vec();
    look(&mut unreadable, Some(garbage));
    assert_eq!(
        ask(&mut unreadable, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::NoRecord)
    );

    // Nothing read since the start: granted, unless the host has seen a
    // higher token (S6).
    let mut fresh = failsafe_member();
    assert_eq!(ask(&mut fresh, "other-i1", 5), FailsafeAnswer::Granted);
    let mut remembers = Harness::configured("a", |c| {
        c.failsafe = true;
        c.highest_token = Some(Token::new(1, 8));
    });
    assert_eq!(
        ask(&mut remembers, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::Superseded)
    );

    // Its swap landed: it holds the lock (confirming).
    let swap = released
        .out
        .iter()
        .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })))
        .expect("the swap");
    let Output::Store(r) = released.out.remove(swap) else {
        unreachable!()
    };
    released.reply(r.id, StoreOutcome::Written(Token::new(1, 6)));
    assert_eq!(
        ask(&mut released, "other-i1", 5),
        FailsafeAnswer::Refused(FailsafeRefusal::Role(released.agent.role()))
    );
    assert!(released.agent.role() != Role::Standby);
}

/// When a standby that saw `held` at 100 s and is granted at `grant` swaps
/// (the store's clock running with its own), or `None` by `until`.
fn takeover_after_grant(grant: Option<f64>, until: f64) -> Option<f64> {
    let held = entry(&holder(LockState::Active, 10_000), 5, 1000.0);
    let mut h = failsafe_member();
    look(&mut h, Some(held.clone()));
    if let Some(g) = grant {
        standby_until(&mut h, g, &held);
        if acquiring(&h) {
            return Some(h.now);
        }
        assert_eq!(ask(&mut h, "other-i1", 5), FailsafeAnswer::Granted);
    }
    // From here the store's clock runs 20 times the member's: only the
    // member's own clock (S1 a) holds a takeover back.
    let from = h.now;
    let store = |now: f64| 900.0 + from + (now - from) * 20.0;
    standby_with_store_clock(&mut h, until, &held, store);
    acquiring(&h).then_some(h.now)
}

/// F1 (a), both sides: a grant restarts the member's own-clock wait. Seen
/// at 100 s, the record is taken over once W (10.2 s) has passed on the
/// member's clock (the store's runs fast); granted at 106 s, not before
/// 106 s + W — and then it is.
#[test]
fn f1_a_a_grant_restarts_the_members_wait_w() {
    let w = 10.0 * 1.01 / 0.99;
    let plain = takeover_after_grant(None, 130.0).expect("a takeover without grants");
    assert!(
        (100.0 + w..100.0 + w + 1.5).contains(&plain),
        "without a grant: {plain}"
    );
    let granted = takeover_after_grant(Some(106.0), 130.0).expect("a takeover after the grant");
    assert!(
        (106.0 + w..106.0 + w + 1.5).contains(&granted),
        "granted at 106 s: {granted}"
    );
}

/// F1 (b), both sides: the store's clock counts from a probe sent after the
/// grant, not from the record's time. The member's clock runs 20 times
/// fast after the grant (its own W passes in half a second of the store's);
/// the record's store time is an outage old. Without a grant the old
/// record is stale on both clocks at once; after a grant, the takeover
/// waits until the store's clock has passed W since the floor.
#[test]
fn f1_b_after_a_grant_the_store_clock_counts_from_a_probe_sent_after_it() {
    for granted in [false, true] {
        // Written 60 s before the member first saw it (an outage of the
        // holder's: the member reaches the store, the holder does not).
        let held = entry(&holder(LockState::Active, 10_000), 5, 940.0);
        // Without a grant, failsafe off: on, the member's own start would
        // be a grant (F4, the test below).
        let mut h = if granted {
            failsafe_member()
        } else {
            Harness::new("a")
        };
        look(&mut h, Some(held.clone()));
        standby_with_store_clock(&mut h, 104.0, &held, |now| 1000.0 + (now - 100.0));
        if granted {
            assert_eq!(ask(&mut h, "other-i1", 5), FailsafeAnswer::Granted);
        }
        // From 104 s on the member's clock runs 20 times the store's.
        let store = |now: f64| 1004.0 + (now - 104.0) / 20.0;
        standby_with_store_clock(&mut h, 104.0 + 12.0, &held, store);
        let store_at_swap = store(h.now);
        if !granted {
            assert!(acquiring(&h), "no grant: stale at 10.2 s on both clocks");
            continue;
        }
        assert!(
            !acquiring(&h),
            "granted: took over after {:.2} s of the store's clock",
            store_at_swap - 1004.0
        );
        // It takes over once the store's clock passed W since the floor.
        standby_with_store_clock(&mut h, 104.0 + 20.0 * 12.0, &held, store);
        assert!(acquiring(&h), "never took over after the grant");
        let since_grant = store(h.now) - 1004.0;
        let w = 10.0 * 1.01 / 0.99;
        assert!(
            since_grant >= w,
            "only {since_grant:.2} s of the store's clock after the grant"
        );
    }
}

/// F4, both sides: a member started with failsafe on takes its store-clock
/// floor with its first rounds, so its first failover is not delayed by a
/// further W (a floor taken only when the takeover is first considered
/// would add it); and it counts from that floor, not from the old record's
/// time: a record that looks an outage old on the store's clock waits for
/// W of it after the start.
#[test]
fn f4_a_started_member_counts_the_store_clock_from_its_start() {
    let w = 10.0 * 1.01 / 0.99;
    let held = entry(&holder(LockState::Active, 10_000), 5, 1000.0);
    // The floor is probed for in the first round, before any takeover.
    let mut h = failsafe_member();
    h.health(true);
    assert!(
        h.find(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Put { key: Key::Probe, .. }))),
        "no floor probe in the first round: {:#?}",
        h.out
    );
    let mut h = failsafe_member();
    standby_until(&mut h, 100.0 + w + 2.0, &held);
    assert!(acquiring(&h), "the first failover was delayed");
    // The record is 1,000 s old on the store's clock; the member's own
    // clock runs 20 times fast: not before W of the store's clock.
    for failsafe in [false, true] {
        let mut h = Harness::configured("a", |c| c.failsafe = failsafe);
        let store = |now: f64| 2000.0 + (now - 100.0) / 20.0;
        standby_with_store_clock(&mut h, 100.0 + 12.0, &held, store);
        assert_eq!(
            acquiring(&h),
            !failsafe,
            "failsafe {failsafe}: took over after {:.2} s of the store's clock",
            store(h.now) - 2000.0
        );
    }
}

// ----- failsafe, a holder's side (F2, F3) ----------------------------------

fn member(node: &str) -> putex_core::FailsafeMember {
    putex_core::FailsafeMember {
        node: node.into(),
        machine: format!("{node}-machine"),
    }
}

/// Node "a" with failsafe on (cap `max` seconds), members b and c
/// reported, active over a released record with token 1:8 at 100 s.
fn failsafe_holder(max: f64) -> Harness {
    failsafe_holder_and_record(max).0
}

/// [`failsafe_holder`] and the record its acquisition wrote (revision 8).
fn failsafe_holder_and_record(max: f64) -> (Harness, LockRecord) {
    let mut h = Harness::configured("a", |c| {
        c.failsafe = true;
        c.failsafe_max = Duration::from_secs_f64(max);
    });
    let with_machine = |n: &str| putex_core::Candidate {
        machine: Some(format!("{n}-machine")),
        ..candidate(n, None, false)
    };
    h.input(Input::Members(vec![with_machine("b"), with_machine("c")]));
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let swap = h
        .out
        .iter()
        .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })))
        .expect("the swap");
    let Output::Store(r) = h.out.remove(swap) else {
        unreachable!()
    };
    let record = written(&r.op);
    assert_eq!(
        record.failsafe.as_ref().map(|s| s.members.clone()),
        Some(vec![member("b"), member("c")]),
        "the acquisition carries the set"
    );
    h.reply(r.id, StoreOutcome::Written(Token::new(1, 8)));
    let _ = h.take(|o| matches!(o, Output::Fence { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Fence,
        ok: true,
    });
    let _ = h.take(|o| matches!(o, Output::Activate { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Activate,
        ok: true,
    });
    h.out.clear();
    assert_eq!(h.agent.role(), Role::Active);
    (h, record)
}

/// One round of the outage: the health check passes, every store request
/// fails; returns the round's ask, if any.
fn outage_round(h: &mut Harness, t: f64) -> Option<(u64, Vec<putex_core::FailsafeMember>)> {
    h.advance_to(t);
    h.health(true);
    while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
        let Output::Store(r) = h.out.remove(i) else {
            unreachable!()
        };
        h.reply(r.id, StoreOutcome::Unknown);
    }
    let i = h
        .out
        .iter()
        .position(|o| matches!(o, Output::FailsafeAsk { .. }))?;
    match h.out.remove(i) {
        Output::FailsafeAsk { round, members, .. } => Some((round, members)),
        _ => unreachable!(),
    }
}

/// F3, both sides: once a renewal did not land, each healthy round asks
/// every member; a round in which all granted extends the licence to the
/// round's send time + T (and the keeper's deadline with it), one in which
/// a member is missing extends nothing, and an ended licence is not
/// revived.
#[test]
fn f3_a_round_every_member_granted_extends_the_licence_one_missing_does_not() {
    let mut h = failsafe_holder(120.0);
    // The licence: 100 s + T = 110 s. The store goes down at 101 s.
    assert!(
        outage_round(&mut h, 101.0).is_none(),
        "asked before a renewal failed"
    );
    let (round, asked) = outage_round(&mut h, 102.0).expect("no ask after a failed renewal");
    assert_eq!(asked, vec![member("b"), member("c")]);
    h.input(Input::FailsafeVerdicts {
        round,
        granted: vec![member("b"), member("c")],
    });
    assert_eq!(
        h.agent.licence_end(),
        Some(at(112.0)),
        "all granted: 102 s + T"
    );
    assert!(h.find(|o| matches!(o, Output::Keeper(KeeperCommand::Extend(e)) if *e == at(112.0))));
    assert_eq!(h.agent.failsafe_since(), Some(at(102.0)));
    // A round with one member missing: nothing.
    let (round, _) = outage_round(&mut h, 103.0).unwrap();
    h.input(Input::FailsafeVerdicts {
        round,
        granted: vec![member("b")],
    });
    assert_eq!(
        h.agent.licence_end(),
        Some(at(112.0)),
        "one missing extended it"
    );
    // A late verdict of an older round counts for nothing.
    let (round, _) = outage_round(&mut h, 104.0).unwrap();
    h.input(Input::FailsafeVerdicts {
        round: round - 1,
        granted: vec![member("b"), member("c")],
    });
    assert_eq!(
        h.agent.licence_end(),
        Some(at(112.0)),
        "an old round extended it"
    );
    // Nobody grants any more: the licence ends at 112 s, the service stops.
    for t in 105..=113 {
        let _ = outage_round(&mut h, f64::from(t));
    }
    assert!(
        h.agent.role() != Role::Active,
        "still active past its licence"
    );
    assert!(h.find(|o| matches!(
        o,
        Output::Stop {
            kind: StopKind::Emergency,
            ..
        }
    )));
}

/// F2 under F3, both sides (sim seeds failsafe:129307, 158459, 166279): a
/// holder that took the lock before any member was reported landed a
/// record without a set, which nobody waits the cap for — while that
/// record may be the newest it asks nobody, whatever its later renewals
/// (which did not land) carried; once a renewal with the set landed, an
/// outage is ridden out on grants.
#[test]
fn f3_a_holder_whose_newest_record_may_lack_the_set_asks_nobody() {
    let mut h = Harness::configured("a", |c| {
        c.failsafe = true;
        c.failsafe_max = Duration::from_secs(120);
    });
    look(
        &mut h,
        Some(entry(&holder(LockState::Released, 10_000), 7, 50.0)),
    );
    let swap = h
        .out
        .iter()
        .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })))
        .expect("the swap");
    let Output::Store(r) = h.out.remove(swap) else {
        unreachable!()
    };
    assert_eq!(written(&r.op).failsafe, None, "no member yet, no set");
    h.reply(r.id, StoreOutcome::Written(Token::new(1, 8)));
    let _ = h.take(|o| matches!(o, Output::Fence { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Fence,
        ok: true,
    });
    let _ = h.take(|o| matches!(o, Output::Activate { .. }));
    h.input(Input::Hook {
        hook: putex_core::Hook::Activate,
        ok: true,
    });
    h.out.clear();
    let with_machine = |n: &str| putex_core::Candidate {
        machine: Some(format!("{n}-machine")),
        ..candidate(n, None, false)
    };
    h.input(Input::Members(vec![with_machine("b")]));
    // The store goes down: renewals carrying {b} do not land.
    for t in 101..=111 {
        assert!(
            outage_round(&mut h, f64::from(t)).is_none(),
            "asked at {t} s while its newest record may carry no set"
        );
    }
    assert!(
        h.agent.role() != Role::Active,
        "ran past T without the store"
    );

    // The other side: a holder whose set landed rides the outage out.
    let mut h = failsafe_holder(120.0);
    let _ = outage_round(&mut h, 101.0);
    let (round, members) = outage_round(&mut h, 102.0).expect("no ask with its set landed");
    h.input(Input::FailsafeVerdicts {
        round,
        granted: members,
    });
    assert_eq!(h.agent.licence_end(), Some(at(112.0)));
}

/// F2's set across outages, both sides: a second outage moments after the
/// first (before the members' records are read again) is ridden out on
/// grants too — the outage's time does not count against the members —
/// and the asks name them. Whether the outage's first renewal was lost,
/// or landed with its answer lost (found when the store answers).
#[test]
fn f2_a_second_outage_right_after_the_first_keeps_the_set() {
    for first_landed in [false, true] {
        second_outage_keeps_the_set(first_landed);
    }
}

fn second_outage_keeps_the_set(first_landed: bool) {
    let (mut h, acquired) = failsafe_holder_and_record(120.0);
    // The outage's first renewal, its answer lost.
    h.advance_to(101.0);
    h.health(true);
    let i = h
        .out
        .iter()
        .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Update { .. })))
        .expect("a renewal at 101 s");
    let Output::Store(r) = h.out.remove(i) else {
        unreachable!()
    };
    let first = written(&r.op);
    h.reply(r.id, StoreOutcome::Unknown);
    h.out.clear();
    for t in 102..=127 {
        let (round, members) = outage_round(&mut h, f64::from(t)).expect("an ask");
        h.input(Input::FailsafeVerdicts {
            round,
            granted: members,
        });
    }
    // The store is back at 128 s, after more than 10 R without members'
    // reports: the read of the record answers (nothing
    // of the outage landed), and the next renewal lands.
    h.advance_to(128.0);
    h.health(true);
    let i = h
        .out
        .iter()
        .position(|o| matches!(o, Output::Store(r) if matches!(r.op, StoreOp::Get { .. })))
        .unwrap_or_else(|| panic!("a read: {:?}", h.out));
    let Output::Store(r) = h.out.remove(i) else {
        unreachable!()
    };
    let (mut newest, mut revision) = if first_landed {
        (first, 9)
    } else {
        (acquired, 8)
    };
    h.reply(
        r.id,
        StoreOutcome::Read(Some(entry(&newest, revision, 128.0))),
    );
    // Back for 5 s (more renewals than one land), every read showing the
    // newest record.
    let mut landed = 0;
    for i in 1..=10 {
        let t = 128.0 + 0.5 * f64::from(i);
        h.advance_to(t);
        h.health(true);
        while let Some(i) = h.out.iter().position(|o| matches!(o, Output::Store(_))) {
            let Output::Store(r) = h.out.remove(i) else {
                unreachable!()
            };
            match r.op {
                StoreOp::Update { .. } => {
                    newest = written(&r.op);
                    assert_eq!(
                        newest.failsafe.as_ref().map(|s| s.members.clone()),
                        Some(vec![member("b"), member("c")]),
                        "a renewal at {t} s, after an outage, carries the set \
                         (its first renewal landed: {first_landed})"
                    );
                    revision += 1;
                    h.reply(r.id, StoreOutcome::Written(Token::new(1, revision)));
                    landed += 1;
                }
                StoreOp::Get { .. } => {
                    h.reply(r.id, StoreOutcome::Read(Some(entry(&newest, revision, t))));
                }
                _ => h.reply(r.id, StoreOutcome::Unknown),
            }
        }
    }
    assert!(landed > 1, "{landed} renewals after the outage");
    h.out.clear();
    // Down again at once: the next renewal still carries the set, and the
    // round after it asks both members.
    let _ = outage_round(&mut h, 134.0);
    for t in 135..=145 {
        let (round, members) = outage_round(&mut h, f64::from(t))
            .unwrap_or_else(|| panic!("no ask at {t} s in the second outage"));
        assert_eq!(members, vec![member("b"), member("c")]);
        h.input(Input::FailsafeVerdicts {
            round,
            granted: members,
        });
        assert_eq!(h.agent.licence_end(), Some(at(f64::from(t) + 10.0)));
    }
    assert_eq!(h.agent.role(), Role::Active);
}

/// The cap, both sides: grants extend the licence to at most the last
/// landed renewal + `--failsafe-max`, and within it as far as T allows.
#[test]
fn f3_grants_never_extend_past_the_cap() {
    let mut h = failsafe_holder(13.0);
    // Landed at 100 s (the acquisition): cap 113 s.
    let _ = outage_round(&mut h, 101.0);
    let mut end = None;
    for t in 102..=120 {
        let Some((round, members)) = outage_round(&mut h, f64::from(t)) else {
            break;
        };
        h.input(Input::FailsafeVerdicts {
            round,
            granted: members,
        });
        end = h.agent.licence_end();
    }
    assert_eq!(end, Some(at(113.0)), "past the cap");
    assert!(h.agent.role() != Role::Active);
}

/// F2, both sides: a node outside a held record's failsafe set waits W over
/// T + the cap the record advertises before it takes over; a member of the
/// set waits W over T, as for any record.
#[test]
fn f2_a_node_outside_the_set_waits_w_over_t_plus_the_cap() {
    for inside in [false, true] {
        let mut record = holder(LockState::Active, 10_000);
        record.failsafe = Some(putex_core::FailsafeSet {
            members: vec![if inside { member("a") } else { member("b") }],
            max_ms: 20_000,
        });
        let held = entry(&record, 5, 1000.0);
        let mut h = Harness::configured("a", |c| c.failsafe = true);
        look(&mut h, Some(held.clone()));
        let w = 10.0 * 1.01 / 0.99;
        // The store's clock runs with the node's, from the record's time.
        let store = |now: f64| 900.0 + now;
        standby_with_store_clock(&mut h, 100.0 + w + 3.0, &held, store);
        assert_eq!(acquiring(&h), inside, "inside the set: {inside}");
        if !inside {
            let w_cap = 30.0 * 1.01 / 0.99;
            standby_with_store_clock(&mut h, 100.0 + w_cap - 0.5, &held, store);
            assert!(!acquiring(&h), "outside the set, before W over T + the cap");
            standby_with_store_clock(&mut h, 100.0 + w_cap + 3.0, &held, store);
            assert!(acquiring(&h), "outside the set, never: {:#?}", h.out);
        }
    }
}
