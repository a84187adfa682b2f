//! The section's decisions, without IO: which slot agents get a turn or
//! must stop, when the section winds down, what a signal does, and how the
//! section ended.
//!
//! [`run`](super::run) reads what happened (a [`Round`] of the shared
//! state, a signal, a timer, a slot agent's exit), hands it to
//! [`SectionState`] and carries out the [`SlotCommand`]s it returns. The
//! rules, each pinned down by a unit test below:
//!
//! - a slot's agent competes only while the fair queue gives us the turn,
//!   no other slot of ours has won, and the section is not winding down;
//! - once a slot's record is ours, or while one is visibly released, only
//!   that slot competes (one CAS, not N that take slots other clients wait
//!   for, only to give the extra ones back); with none, or the view
//!   unknown, every slot competes (an absent record, or a dead holder's,
//!   is taken by the first-use and staleness rules, which only the slot's
//!   agent applies);
//! - a slot that lost the race for CMD to another slot of ours is shut
//!   down at once (its lock is given back);
//! - the section winds down (every agent shut down, once) when CMD's run
//!   is over, the wait ran out, a signal ended the wait, `max_duration`
//!   passed, or an agent ended on its own;
//! - a signal reaches CMD once it runs; before that it ends the wait;
//! - the [`Conclusion`] ranks what happened: an unproven stop first (CMD's
//!   tree may still run), then a run already done, a loss, a timeout, a
//!   finished run, set-up errors, an interruption, and last "not acquired".

use putex_core::agent::ExitReason;

use super::shared::State;
use super::*;

/// What the loop must tell one slot's agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotCommand {
    /// `Input::Turn(turn)`: compete for the slot, or stop competing.
    Turn {
        slot: usize,
        /// Whether it may compete.
        turn: bool,
    },
    /// `Input::Shutdown`: give the slot back and end.
    Shutdown { slot: usize },
}

/// What the loop read of the section before it waits again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Round {
    /// The fair queue gives us the turn (or there is no queue).
    pub(super) queue_turn: bool,
    /// The slot whose agent armed the keeper first.
    pub(super) winner: Option<usize>,
    /// The one slot to compete for while no slot has won: the one whose
    /// record we won first, else one seen released
    /// ([`State::preferred_slot`]); `None` when there is none, and every
    /// slot competes.
    pub(super) preferred: Option<usize>,
    /// Slots that lost the race for CMD since the last round.
    pub(super) losers: Vec<usize>,
    /// CMD's run is over: it exited, the lock was lost, the period was
    /// already done, or the once record or the spawn failed.
    pub(super) over: bool,
}

impl Round {
    /// The round as the shared state shows it; takes its losers.
    pub(super) fn read(state: &mut State, queue_turn: bool) -> Round {
        Round {
            queue_turn,
            winner: state.winner,
            preferred: state.preferred_slot(),
            losers: std::mem::take(&mut state.losers),
            over: state.exit.is_some()
                || state.lost.is_some()
                || state.already_done.is_some()
                || state.once_failed.is_some()
                || state.spawn_failed.is_some(),
        }
    }
}

/// What a signal does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SignalAction {
    /// Forward it to CMD, which runs.
    Forward,
    /// Nothing to forward: it ends the wait (or the section is already
    /// winding down).
    EndsTheWait,
}

/// How the section ended, once every agent has.
#[derive(Debug)]
pub(super) enum Conclusion {
    Outcome(Outcome),
    /// The lock was not acquired: the caller asks the store who holds it.
    NotAcquired,
    /// The section could not do what it was asked.
    Error(SectionError),
}

/// The section's bookkeeping between rounds (the seven flags the loop
/// would otherwise steer by).
#[derive(Debug)]
pub(super) struct SectionState {
    /// The last turn sent to each slot's agent.
    turns_sent: Vec<Option<bool>>,
    /// Slots whose agent was told to shut down.
    stopped: Vec<bool>,
    /// Every agent was told to shut down.
    winding_down: bool,
    /// A slot won (armed the keeper): the lock is being taken or held.
    acquiring: bool,
    /// The signal that ended the wait.
    interrupted: Option<i32>,
    /// The wait ran out, or an agent ended on its own.
    not_acquired: bool,
    /// Why an agent ended without being told to (S5's duplicate node id,
    /// a failed start-up stop): the section's error, not "not acquired".
    ended_on_its_own: Option<SectionError>,
    /// CMD ran past `max_duration`.
    timed_out: bool,
    /// An agent task failed: its stop is not proven.
    unproven: bool,
}

impl SectionState {
    /// A section competing for `slots` slots.
    pub(super) fn new(slots: usize) -> SectionState {
        SectionState {
            turns_sent: vec![None; slots],
            stopped: vec![false; slots],
            winding_down: false,
            acquiring: false,
            interrupted: None,
            not_acquired: false,
            ended_on_its_own: None,
            timed_out: false,
            unproven: false,
        }
    }

    /// The commands a round calls for: turns that changed, losers to shut
    /// down, and — once the section is over — every agent shut down.
    pub(super) fn round(&mut self, round: Round) -> Vec<SlotCommand> {
        let mut commands = Vec::new();
        // A slot whose agent is gone (a loser, shut down) competes no
        // more: preferring it would leave nobody competing.
        let preferred =
            (round.preferred).filter(|p| !self.stopped[*p] && !round.losers.contains(p));
        for slot in 0..self.turns_sent.len() {
            let ours = match round.winner {
                Some(w) => w == slot,
                None => preferred.is_none_or(|p| p == slot),
            };
            let turn = round.queue_turn && ours && !self.winding_down;
            if self.turns_sent[slot] != Some(turn) {
                self.turns_sent[slot] = Some(turn);
                commands.push(SlotCommand::Turn { slot, turn });
            }
        }
        for slot in round.losers {
            if !std::mem::replace(&mut self.stopped[slot], true) {
                commands.push(SlotCommand::Shutdown { slot });
            }
        }
        self.acquiring = round.winner.is_some();
        let ending =
            round.over || self.not_acquired || self.interrupted.is_some() || self.timed_out;
        if ending && !self.winding_down {
            self.winding_down = true;
            for (slot, stopped) in self.stopped.iter_mut().enumerate() {
                *stopped = true;
                commands.push(SlotCommand::Shutdown { slot });
            }
        }
        commands
    }

    /// The wait for the lock still runs (its timer matters).
    pub(super) fn waiting(&self) -> bool {
        !self.acquiring && !self.winding_down
    }

    /// CMD may still be stopped for running past `max_duration`.
    pub(super) fn watching_the_duration(&self) -> bool {
        !self.timed_out && !self.winding_down
    }

    /// A signal arrived; `spawned` says whether CMD runs.
    pub(super) fn on_signal(&mut self, signal: i32, spawned: bool) -> SignalAction {
        if spawned && !self.winding_down {
            return SignalAction::Forward;
        }
        // Waiting, or taking the lock (the fencing gap): stop trying. Once
        // the section winds down, the first signal that ended it is kept.
        if !self.winding_down || (self.interrupted.is_none() && !self.acquiring) {
            self.interrupted = Some(signal);
        }
        SignalAction::EndsTheWait
    }

    /// The wait for the lock ran out.
    pub(super) fn on_wait_over(&mut self) {
        self.not_acquired = true;
    }

    /// CMD ran past `max_duration`: it is to be stopped.
    pub(super) fn on_max_duration(&mut self) {
        self.timed_out = true;
    }

    /// A slot's agent ended, for `exit`. One that was not told to (another
    /// host runs with our node id, a failed start-up) ends the section with
    /// that as its error.
    pub(super) fn on_agent_exit(&mut self, slot: usize, exit: &ExitReason) {
        if !self.stopped[slot] {
            self.not_acquired = true;
            if self.ended_on_its_own.is_none() {
                self.ended_on_its_own = match exit {
                    ExitReason::Shutdown { .. } => None,
                    ExitReason::DuplicateNode { machine } => Some(SectionError::DuplicateNode {
                        machine: machine.clone(),
                    }),
                    ExitReason::StartupStopFailed => Some(SectionError::Keeper(
                        "the start-up stop failed: a command of an earlier run may still run; \
                         not starting"
                            .into(),
                    )),
                };
            }
        }
    }

    /// A slot's agent task failed (panicked): whatever it supervised is not
    /// proven stopped.
    pub(super) fn on_agent_failed(&mut self) {
        self.unproven = true;
    }

    /// How the section ended, from what the agents recorded in `state`.
    pub(super) fn conclude(self, state: State, max_duration: Option<Duration>) -> Conclusion {
        let outcome = if self.unproven {
            Outcome::StopUnproven
        } else if let Some((period, by)) = state.already_done {
            Outcome::AlreadyDone { period, by }
        } else if let Some(reason) = state.lost {
            Outcome::Lost { reason }
        } else if self.timed_out && state.spawned.is_some() {
            Outcome::TimedOut {
                after: max_duration.unwrap_or_default(),
                released: state.released,
            }
        } else if let (Some(exit), Some(token)) = (state.exit, state.spawned.or(state.spawning)) {
            // CMD's exit, as the keeper reported it: it ran, even if the
            // section wound down before the spawn's own answer was read.
            Outcome::Finished {
                exit,
                token,
                released: state.released,
            }
        } else if let Some(e) = state.once_failed {
            return Conclusion::Error(SectionError::Store(e));
        } else if let Some(e) = state.spawn_failed {
            return Conclusion::Error(SectionError::Keeper(format!(
                "cannot start the command: {e}"
            )));
        } else if let Some(signal) = self.interrupted {
            Outcome::Interrupted { signal }
        } else if let Some(e) = self.ended_on_its_own {
            return Conclusion::Error(e);
        } else {
            return Conclusion::NotAcquired;
        };
        Conclusion::Outcome(outcome)
    }
}

impl State {
    /// CMD exited (the keeper's report, read at `now` on `CLOCK_BOOTTIME`).
    /// At or past the licence's end its exit is the keeper's stop at its
    /// deadline: the lock was lost, whichever of that and the agent's own
    /// lapse (which counts a loss only while CMD runs) the section hears
    /// first, and whether or not the keeper's `Fired` is read at all.
    pub(super) fn command_exited(&mut self, exit: Exit, now: Instant) {
        self.exit = Some(exit);
        if self.licence_until.is_some_and(|until| now >= until) {
            self.lost
                .get_or_insert_with(|| Reason::KeeperFired.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(slot: usize, turn: bool) -> SlotCommand {
        SlotCommand::Turn { slot, turn }
    }

    fn shutdown(slot: usize) -> SlotCommand {
        SlotCommand::Shutdown { slot }
    }

    fn waiting_round() -> Round {
        Round {
            queue_turn: true,
            ..Round::default()
        }
    }

    #[test]
    fn every_slot_competes_while_the_queue_gives_the_turn() {
        let mut s = SectionState::new(3);
        let off = Round::default();
        assert_eq!(
            s.round(off.clone()),
            [turn(0, false), turn(1, false), turn(2, false)]
        );
        assert_eq!(s.round(off), [], "a turn is sent only when it changes");
        assert_eq!(
            s.round(waiting_round()),
            [turn(0, true), turn(1, true), turn(2, true)]
        );
        assert!(s.waiting());
    }

    #[test]
    fn once_a_slot_wins_the_others_stop_competing_and_losers_are_shut_down() {
        let mut s = SectionState::new(3);
        s.round(waiting_round());
        let won = Round {
            winner: Some(1),
            losers: vec![2],
            ..waiting_round()
        };
        assert_eq!(s.round(won), [turn(0, false), turn(2, false), shutdown(2)]);
        assert!(
            !s.waiting(),
            "the lock is being taken: the wait timer is off"
        );
        // A loser reported twice is shut down once.
        let again = Round {
            winner: Some(1),
            losers: vec![2],
            ..waiting_round()
        };
        assert_eq!(s.round(again), []);
    }

    #[test]
    fn with_a_slot_seen_free_only_that_slot_competes() {
        let mut s = SectionState::new(3);
        let prefer = |p| Round {
            preferred: p,
            ..waiting_round()
        };
        assert_eq!(
            s.round(prefer(Some(2))),
            [turn(0, false), turn(1, false), turn(2, true)]
        );
        // Another client took it; slot 0 is free now.
        assert_eq!(s.round(prefer(Some(0))), [turn(0, true), turn(2, false)]);
        // None seen released (or the view is unknown): every slot competes.
        assert_eq!(s.round(prefer(None)), [turn(1, true), turn(2, true)]);
        // A winner outranks the preference.
        let won = Round {
            winner: Some(1),
            preferred: Some(0),
            ..waiting_round()
        };
        assert_eq!(s.round(won), [turn(0, false), turn(2, false)]);
    }

    #[test]
    fn a_slot_whose_agent_is_gone_is_never_the_only_one_competing() {
        let mut s = SectionState::new(3);
        // Slot 1 lost the race for CMD to slot 0 and is shut down; then
        // slot 0 lost its record before activating, and slot 1's record is
        // seen released.
        s.round(Round {
            winner: Some(0),
            losers: vec![1],
            ..waiting_round()
        });
        assert_eq!(
            s.round(Round {
                preferred: Some(1),
                ..waiting_round()
            }),
            [turn(1, true), turn(2, true)],
            "every live slot competes (1's agent is gone and ignores it)"
        );
        // The same when the loser and the preference come in one round.
        let mut s = SectionState::new(2);
        assert_eq!(
            s.round(Round {
                preferred: Some(1),
                losers: vec![1],
                ..waiting_round()
            }),
            [turn(0, true), turn(1, true), shutdown(1)]
        );
    }

    #[test]
    fn the_slot_to_compete_for_is_the_claimed_one_else_a_released_one() {
        let mut state = State {
            free: Some(vec![false, true, false, true]),
            spread: 5,
            ..State::default()
        };
        // Clients admitted together start at different released slots.
        assert_eq!(state.preferred_slot(), Some(3));
        state.spread = 4;
        assert_eq!(state.preferred_slot(), Some(1));
        // The record we won first is the one to keep competing for.
        state.claimed = Some(2);
        assert_eq!(state.preferred_slot(), Some(2));
        state.claimed = None;
        // Nothing seen released, or no view: every slot competes.
        state.free = Some(vec![false; 4]);
        assert_eq!(state.preferred_slot(), None);
        state.free = None;
        assert_eq!(state.preferred_slot(), None);
    }

    #[test]
    fn a_run_that_is_over_shuts_every_agent_down_once() {
        let mut s = SectionState::new(2);
        s.round(waiting_round());
        let over = Round {
            winner: Some(0),
            over: true,
            ..waiting_round()
        };
        assert_eq!(
            s.round(over.clone()),
            [turn(1, false), shutdown(0), shutdown(1)]
        );
        // Winding down: the winner stops competing too, and nobody is shut
        // down twice.
        assert_eq!(s.round(over), [turn(0, false)]);
        assert!(!s.waiting() && !s.watching_the_duration());
    }

    #[test]
    fn the_wait_running_out_ends_the_section_as_not_acquired() {
        let mut s = SectionState::new(1);
        s.round(waiting_round());
        s.on_wait_over();
        assert_eq!(s.round(waiting_round()), [shutdown(0)]);
        assert!(matches!(
            s.conclude(State::default(), None),
            Conclusion::NotAcquired
        ));
    }

    #[test]
    fn an_agent_that_ends_on_its_own_ends_the_section_one_told_to_does_not() {
        let mut s = SectionState::new(2);
        s.round(Round {
            winner: Some(0),
            losers: vec![1],
            ..waiting_round()
        });
        s.on_agent_exit(1, &ExitReason::Shutdown { released: false });
        assert_eq!(
            s.round(Round {
                winner: Some(0),
                ..waiting_round()
            }),
            []
        );
        s.on_agent_exit(
            0,
            &ExitReason::DuplicateNode {
                machine: "m2".into(),
            },
        );
        assert_eq!(
            s.round(Round {
                winner: Some(0),
                ..waiting_round()
            }),
            [shutdown(0), shutdown(1)]
        );
        // Its reason is the section's error, not "not acquired".
        assert!(matches!(
            s.conclude(State::default(), None),
            Conclusion::Error(SectionError::DuplicateNode { machine }) if machine == "m2"
        ));
    }

    #[test]
    fn a_signal_goes_to_a_running_command_and_otherwise_ends_the_wait() {
        let mut s = SectionState::new(1);
        s.round(waiting_round());
        assert_eq!(s.on_signal(15, true), SignalAction::Forward);
        assert_eq!(s.on_signal(2, false), SignalAction::EndsTheWait);
        assert_eq!(s.round(waiting_round()), [shutdown(0)]);
        // Winding down: nothing more is forwarded, and the first signal is
        // the one the section reports.
        assert_eq!(s.on_signal(15, true), SignalAction::EndsTheWait);
        assert!(matches!(
            s.conclude(State::default(), None),
            Conclusion::Outcome(Outcome::Interrupted { signal: 2 })
        ));
    }

    #[test]
    fn a_signal_while_taking_the_lock_stops_the_attempt() {
        let mut s = SectionState::new(1);
        s.round(Round {
            winner: Some(0),
            ..waiting_round()
        });
        assert_eq!(s.on_signal(15, false), SignalAction::EndsTheWait);
        assert_eq!(
            s.round(Round {
                winner: Some(0),
                ..waiting_round()
            }),
            [shutdown(0)]
        );
    }

    #[test]
    fn max_duration_stops_the_command_and_reports_a_timeout() {
        let mut s = SectionState::new(1);
        s.round(Round {
            winner: Some(0),
            ..waiting_round()
        });
        assert!(s.watching_the_duration());
        s.on_max_duration();
        assert!(!s.watching_the_duration());
        assert_eq!(
            s.round(Round {
                winner: Some(0),
                ..waiting_round()
            }),
            [shutdown(0)]
        );
        let state = State {
            spawned: Some(Token::new(1, 7)),
            exit: Some(Exit {
                code: None,
                signal: Some(15),
            }),
            released: true,
            ..State::default()
        };
        let after = Duration::from_secs(3);
        assert!(matches!(
            s.conclude(state, Some(after)),
            Conclusion::Outcome(Outcome::TimedOut { after: a, released: true }) if a == after
        ));
    }

    /// The keeper's report that CMD exited was read, and the section wound
    /// down, before the task that asked for the spawn heard its answer:
    /// CMD ran to its end, which is not "not acquired" (exit 75).
    #[test]
    fn an_exit_read_before_the_spawns_answer_is_a_finished_run() {
        let state = State {
            spawning: Some(Token::new(1, 7)),
            exit: Some(Exit {
                code: Some(0),
                signal: None,
            }),
            ..State::default()
        };
        assert!(matches!(
            SectionState::new(1).conclude(state, None),
            Conclusion::Outcome(Outcome::Finished { token, exit, .. })
                if token == Token::new(1, 7) && exit.code == Some(0)
        ));
    }

    #[test]
    fn an_unproven_stop_outranks_everything_else() {
        let mut s = SectionState::new(1);
        s.on_agent_failed();
        let state = State {
            spawned: Some(Token::new(1, 7)),
            exit: Some(Exit {
                code: Some(0),
                signal: None,
            }),
            lost: Some("taken over".into()),
            ..State::default()
        };
        assert!(matches!(
            s.conclude(state, None),
            Conclusion::Outcome(Outcome::StopUnproven)
        ));
    }

    #[test]
    fn the_outcome_ranks_done_lost_finished_then_errors() {
        let finished = || State {
            spawned: Some(Token::new(1, 7)),
            exit: Some(Exit {
                code: Some(0),
                signal: None,
            }),
            released: true,
            ..State::default()
        };
        let conclude = |state| SectionState::new(1).conclude(state, None);
        assert!(matches!(
            conclude(State {
                already_done: Some(("2026-11-27".into(), "a".into())),
                ..finished()
            }),
            Conclusion::Outcome(Outcome::AlreadyDone { .. })
        ));
        assert!(matches!(
            conclude(State {
                lost: Some("taken over".into()),
                ..finished()
            }),
            Conclusion::Outcome(Outcome::Lost { reason }) if reason == "taken over"
        ));
        assert!(matches!(
            conclude(finished()),
            Conclusion::Outcome(Outcome::Finished { released: true, .. })
        ));
        assert!(matches!(
            conclude(State {
                spawn_failed: Some("no such file".into()),
                ..State::default()
            }),
            Conclusion::Error(SectionError::Keeper(m)) if m == "cannot start the command: no such file"
        ));
    }

    /// CMD's end at or past the deadline the keeper accepted is a loss
    /// (exit 76), not CMD's status; before it, or with the keeper
    /// disarmed, CMD's own end.
    #[test]
    fn a_command_ended_at_the_licence_deadline_is_a_loss() {
        let killed = Exit {
            code: None,
            signal: Some(15),
        };
        let until = Instant::from_nanos(10_000_000_000);
        let ran = |licence_until, now| {
            let mut state = State {
                spawned: Some(Token::new(1, 7)),
                licence_until,
                ..State::default()
            };
            state.command_exited(killed, now);
            SectionState::new(1).conclude(state, None)
        };
        assert!(matches!(
            ran(Some(until), until),
            Conclusion::Outcome(Outcome::Lost { .. })
        ));
        assert!(matches!(
            ran(Some(until), Instant::from_nanos(12_000_000_000)),
            Conclusion::Outcome(Outcome::Lost { .. })
        ));
        for (licence_until, now) in [
            (Some(until), Instant::from_nanos(9_999_000_000)),
            (None, Instant::from_nanos(12_000_000_000)),
        ] {
            assert!(matches!(
                ran(licence_until, now),
                Conclusion::Outcome(Outcome::Finished { exit, .. }) if exit == killed
            ));
        }
    }
}
