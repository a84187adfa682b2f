//! Time and rounds: the licence's end (H1), deadlines that pass, and the
//! round that runs health checks and renews (H2).

use super::*;

impl Agent {
    // ----- time ----------------------------------------------------------------

    /// H1: when the licence ends without a newer success, stop at once.
    pub(super) fn expire_licence(&mut self) {
        let Some(lease) = &self.lease else { return };
        if self.now < lease.licence_end || !self.holding() {
            return;
        }
        // O2: a paused record is taken over by nobody; the operator owns
        // the service, and the holder renews again when it can.
        if self.paused() {
            return;
        }
        let token = lease.token;
        self.lose(Reason::LicenceEnded, Some(token));
    }

    pub(super) fn advance(&mut self) {
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
        if self.shutdown_awaits_swap && !self.swap_in_flight() {
            self.on_swap_settled_in_shutdown();
            if self.role == Role::Exited {
                return;
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
        // O2: a resume whose `Arm` the keeper did not answer in time.
        if let (
            PauseState::Resuming { at: Some(at), .. },
            Some(KeeperArm::Arming { deadline, .. }),
        ) = (&self.operator.pause, self.tenure.as_ref().map(|t| t.keeper))
        {
            if self.now >= deadline {
                let at = *at;
                self.on_rearm_ack(at, false);
            }
        }
        if self.role == Role::Active {
            if self.operator.unpause_pending {
                self.renew_now();
            }
            self.apply_pause();
            self.maybe_fail_back();
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
            self.maybe_rejoin();
            self.standby_try_acquire();
        }
    }

    // ----- rounds (H2) ---------------------------------------------------------

    pub(super) fn start_round(&mut self) {
        match self.role {
            Role::Standby => {
                self.start_health(HealthMode::Standby);
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::Poll, self.deadline());
                }
                self.probe_floor();
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

    pub(super) fn start_health(&mut self, mode: HealthMode) {
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

    pub(super) fn on_health(&mut self, id: CheckId, ok: bool) {
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
            // O2: while paused the holder renews whatever its checks say.
            Role::Active if self.paused() => self.renew_now(),
            Role::Confirming | Role::Active if ok => {
                self.renew_now();
                self.failsafe_ask();
            }
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
}
