//! Stopping: graceful and emergency stops, their proof, the release (H2, H6).

use super::*;

impl Agent {
    // ----- stopping (H2, H6) --------------------------------------------------

    pub(super) fn begin_stop(&mut self, kind: StopKind) {
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
    pub(super) fn step_down(&mut self, reason: Reason) {
        self.step_down_with(reason, StopKind::Graceful);
    }

    /// Stop on purpose with a stop of `kind`, renewing the lease until the
    /// stop is proven; then release (H6). An emergency kind is for a holder
    /// whose keeper died: nothing else guards the deadline any more.
    pub(super) fn step_down_with(&mut self, reason: Reason, kind: StopKind) {
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
    pub(super) fn retry_unproven_stop(&mut self) {
        if self.unproven > 0 && self.stop.is_none() {
            self.begin_stop(StopKind::Emergency);
        }
    }

    /// A stop did not prove the service stopped: it may still run. Alarm,
    /// and try again every round. A holder keeps its lease (renewing, no
    /// health checks, no release): it is alive and connected, so the lease
    /// is honest, and letting it lapse would let a standby start a second
    /// service. One that already lost the lock can only retry.
    pub(super) fn on_unproven_stop(&mut self, kind: StopKind) {
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

    pub(super) fn on_stopped(&mut self, id: StopId, ok: bool) {
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
                // escalated it): release. Nothing is left to escalate: the
                // stop timeout no longer applies (an emergency stop of a
                // service proven down would only abandon the release on
                // its way and send another).
                self.step_down_deadline = None;
                self.let_keeper_go();
                self.write_release();
            }
            Role::Lapsed => {
                self.note_proven();
                // Nothing left for the keeper to guard.
                self.let_keeper_go();
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

    pub(super) fn note_proven(&mut self) {
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

    pub(super) fn write_release(&mut self) {
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
        // anyway, the release conflicts, and `on_release_outcome` reads our
        // own writes and releases over it (refinement (y)); failing that,
        // the lock goes stale the slow, safe way (H6).
        let until = lease.licence_end;
        self.lock_op = None;
        let write = self.write_id();
        // The stop is behind us and nothing else is left to do: the release
        // may take until the licence ends (a busy store answers a write
        // after the usual store timeout more often than not), and every
        // waiter gains from it landing instead of waiting W + G'.
        self.send_lock(LockOp::Release { write }, until);
    }

    pub(super) fn on_release_outcome(&mut self, write: &str, outcome: StoreOutcome) {
        if self.role != Role::SteppingDown {
            return;
        }
        let token = self.lease.as_ref().map(|l| l.token);
        // H4 for the release: a renewal of ours whose outcome was unknown
        // may have landed late, moving the record past the token the
        // release expected. Read our own writes; if one of them is there,
        // it is adopted (`on_verify`) and the release is sent again over it
        // (`advance`), instead of leaving the lock to go stale (W + G').
        if outcome == StoreOutcome::Conflict
            && !self.unconfirmed.is_empty()
            && self
                .lease
                .as_ref()
                .is_some_and(|l| self.now < l.licence_end)
        {
            self.release_wanted = true;
            self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
            return;
        }
        let released = matches!(outcome, StoreOutcome::Written(_));
        if let StoreOutcome::Written(t) = outcome {
            self.note_token(t);
        }
        if !released && self.mutations.is(Rule::ReleaseWithoutProof) {
            return;
        }
        // What we wrote, as a standby will judge it (a release handed to
        // another node is theirs for D, O1).
        let written = self.release_record(write);
        self.lease = None;
        self.tenure = None;
        self.release_writes.clear();
        self.unconfirmed.clear();
        self.step_down_deadline = None;
        self.operator.handover = None;
        self.operator.pause = PauseState::Off;
        self.operator.unpause_pending = false;
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
                self.trust_own_write(t);
                Some(Seen {
                    entry: Some((t, None)),
                    observed: Some(Observed::Record(written)),
                    first_seen: self.now,
                    absent_like: false,
                    new_epoch: false,
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

    pub(super) fn on_release_request(&mut self) {
        if self.paused() {
            return;
        }
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
    pub(super) fn on_keeper(&mut self, reason: Reason) {
        if self.paused() {
            // O2: the keeper was disarmed; a resume arms one again (and
            // stays paused if there is none).
            return;
        }
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

    pub(super) fn on_shutdown(&mut self) {
        self.shutdown = true;
        if self.swap_in_flight() {
            // Its outcome decides how to leave (`shutdown_awaits_swap`).
            self.shutdown_awaits_swap = true;
            return;
        }
        self.finish_shutdown();
    }

    /// The swap a shutdown waited for was answered (taken or not) or ran
    /// past its deadline (unknown: nobody waits for a verification).
    pub(super) fn on_swap_settled_in_shutdown(&mut self) {
        self.shutdown_awaits_swap = false;
        self.finish_shutdown();
    }

    fn finish_shutdown(&mut self) {
        if self.paused() {
            // O2: the operator owns the service; the paused record stays
            // and nobody takes over until a resume.
            return self.exit(ExitReason::Shutdown { released: false });
        }
        match self.role {
            Role::Active => self.step_down(Reason::Shutdown),
            Role::Confirming => self.leave_confirming(Reason::Shutdown),
            Role::Standby => self.exit(ExitReason::Shutdown { released: false }),
            // Still reading whether this node holds the lock paused: nothing
            // says so yet, and S5 wants the service stopped before exiting.
            Role::Starting if self.start_step == Some(StartStep::ReadForPause) => {
                self.start_step = Some(StartStep::Deactivating);
                self.begin_stop(StopKind::Startup);
            }
            Role::Starting if self.stop.is_none() => {
                self.exit(ExitReason::Shutdown { released: false })
            }
            _ => {} // finishes when the running stop does
        }
    }

    pub(super) fn exit(&mut self, reason: ExitReason) {
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
}
