//! Operator controls: switchover (O1), pause (O2), candidate order (O3)
//! and rejoin (O4).
//!
//! None of them weakens H1–H6 or S1–S7; each only holds back or hands on
//! what those rules allow:
//!
//! - O1: a switchover is a graceful step-down (H2, H6) whose release names
//!   a target; others leave such a release alone for D, then it is an
//!   ordinary one (S3). Unless the operator waived the lag, the target
//!   takes it only once within `--max-lag` (its position catching up with
//!   what the stopped holder wrote last), for at most those D.
//! - O2: a pause exists only through the holder's own record. The keeper is
//!   disarmed only once a paused renewal is known to have landed (after
//!   which no standby takes the record over, and a takeover CAS on an older
//!   revision fails), and armed again before the unpaused record is sent.
//! - O3: eligibility (priority, rejoin, lag) only removes candidates; the
//!   deferral only delays an acquisition by at most D.
//! - O4: a node whose tenure ended without a proven clean release runs its
//!   rejoin hook before it may take over again.

use super::*;

impl Operator {
    /// The pause the next renewal writes into the record, if any.
    pub(super) fn pause_to_write(&self) -> Option<&Pause> {
        match &self.pause {
            PauseState::Off => None,
            PauseState::Pausing(p) | PauseState::Paused(p) => Some(p),
            PauseState::Resuming { pause, .. } => Some(pause),
        }
    }
}

/// How candidates are ranked (O3): position, then priority, then node id.
fn rank(position: Option<u64>, priority: u32, node: &str) -> (Option<u64>, u32, &str) {
    (position, priority, node)
}

impl Agent {
    /// Failover is paused: a paused renewal landed and no unpaused one has
    /// been sent. The keeper does not guard the service, health does not
    /// count and the licence does not end the tenure.
    pub(super) fn paused(&self) -> bool {
        matches!(
            self.operator.pause,
            PauseState::Paused(_) | PauseState::Resuming { .. }
        )
    }

    /// The pause in force (O2), if any.
    pub fn pause(&self) -> Option<&Pause> {
        match &self.operator.pause {
            PauseState::Paused(p) => Some(p),
            PauseState::Resuming { pause, .. } => Some(pause),
            PauseState::Off | PauseState::Pausing(_) => None,
        }
    }

    /// Active with the service up (its activation finished): what a pause,
    /// a switchover and a failback start from.
    fn service_up(&self) -> bool {
        self.role == Role::Active
            && matches!(
                self.tenure.as_ref().map(|t| t.service),
                Some(Service::Up { .. })
            )
    }

    /// Whether a renewal of ours should say the lock is paused.
    pub(super) fn renewal_pauses(&self) -> bool {
        self.operator.pause_to_write().is_some()
    }

    // ----- O3: candidates -------------------------------------------------

    pub(super) fn on_members(&mut self, members: Vec<Candidate>) {
        self.operator.candidates = members
            .into_iter()
            .filter(|m| m.node != self.id.node)
            .collect();
        // O5: who is preferred and ready now; keep when each became so.
        let preferred: Vec<String> = self
            .operator
            .candidates
            .iter()
            .filter(|c| {
                c.ready
                    && c.priority > self.operator.priority
                    && self.lag_beyond(c.position).is_none()
            })
            .map(|c| c.node.clone())
            .collect();
        let now = self.now;
        let mut since = std::mem::take(&mut self.operator.preferred_since);
        since.retain(|(n, _)| preferred.contains(n));
        for n in preferred {
            if !since.iter().any(|(m, _)| *m == n) {
                since.push((n, now));
            }
        }
        self.operator.preferred_since = since;
    }

    /// O5: the preferred member that has been ready for the whole
    /// hold-down, and when that will be for the earliest one.
    fn failback_due(&self) -> Option<(String, Instant)> {
        let hold = self.operator.failback_after?;
        let hold = if self.mutations.is(Rule::FailbackWithoutHoldDown) {
            Duration::ZERO
        } else {
            hold
        };
        let best = self
            .operator
            .preferred_since
            .iter()
            .filter_map(|(n, t)| {
                let c = self.operator.candidates.iter().find(|c| c.node == *n)?;
                Some((rank(c.position, c.priority, &c.node), n, *t + hold))
            })
            .max_by(|a, b| a.0.cmp(&b.0))?;
        Some((best.1.clone(), best.2))
    }

    /// O5: hand back to a preferred member once its hold-down has passed;
    /// only through a switchover (O1), so every check of O1 applies.
    pub(super) fn maybe_fail_back(&mut self) {
        if self.operator.pause != PauseState::Off || !self.service_up() {
            return;
        }
        let Some((to, due)) = self.failback_due() else {
            return;
        };
        if self.now < due {
            return;
        }
        self.operator.preferred_since.clear();
        self.operator.handover = Some(Handover {
            to: to.clone(),
            catch_up: true,
        });
        self.step_down(Reason::Failback { to });
    }

    /// The highest position any member (this one included) published.
    fn highest_position(&self) -> Option<u64> {
        self.operator
            .candidates
            .iter()
            .filter_map(|c| c.position)
            .chain(self.operator.position)
            .max()
    }

    /// How far `position` is behind the highest, if that is more than
    /// `--max-lag` allows: `Some(None)` when the position is unknown.
    fn lag_beyond(&self, position: Option<u64>) -> Option<Option<u64>> {
        let max = self.operator.max_lag?;
        let Some(p) = position else {
            return Some(None);
        };
        let behind = self.highest_position().unwrap_or(p).saturating_sub(p);
        (behind > max).then_some(Some(behind))
    }

    /// Whether this node's own candidacy allows a takeover (O3, O4); the
    /// lag is checked apart, because a release handed to this node waives it.
    pub(super) fn candidacy_allows(&self) -> bool {
        self.mutations.is(Rule::IgnoreEligibility)
            || (self.operator.priority > 0 && !self.operator.rejoin_needed)
    }

    /// O1: whether this node, the target of `release`, must catch up
    /// before it takes it: the release asks for that and this node is
    /// beyond `--max-lag` (an operator's `--allow-lag` on this node waives
    /// it too).
    pub(super) fn must_catch_up(&self, release: &LockRecord) -> bool {
        release.catch_up && !self.within_lag()
    }

    /// Whether this node is within `--max-lag` (or an operator waived it).
    pub(super) fn within_lag(&self) -> bool {
        self.mutations.is(Rule::IgnoreEligibility)
            || self.operator.lag_waived
            || self.lag_beyond(self.operator.position).is_none()
    }

    /// The best ready, eligible candidate that outranks this node, if any:
    /// this node defers to it by D (O3). The node whose record the lock
    /// shows is no candidate for it: its record went stale or was given up
    /// there, and a holder cut off from the store whose licence ended calls
    /// itself a ready standby in the member record that still reaches the
    /// store — deferring to it would only add D to every failover.
    pub(super) fn outranked_by(&self) -> Option<&Candidate> {
        let me = rank(
            self.operator.position,
            self.operator.priority,
            &self.id.node,
        );
        let recorded = self
            .seen
            .as_ref()
            .filter(|s| !s.absent_like)
            .and_then(|s| s.observed.as_ref())
            .and_then(|o| o.record())
            .map(|r| r.node.as_str());
        self.operator
            .candidates
            .iter()
            .filter(|c| Some(c.node.as_str()) != recorded)
            .filter(|c| c.ready && c.priority > 0 && self.lag_beyond(c.position).is_none())
            .filter(|c| rank(c.position, c.priority, &c.node) > me)
            .max_by(|a, b| {
                rank(a.position, a.priority, &a.node).cmp(&rank(b.position, b.priority, &b.node))
            })
    }

    /// The deferral D this node owes before acting, given the candidates.
    pub(super) fn deferral(&self) -> Duration {
        if self.outranked_by().is_some() {
            self.operator.defer
        } else {
            Duration::ZERO
        }
    }

    /// Why this node would not take the lock over now, for status; `None`
    /// when it would (or holds it).
    pub fn blocker(&self) -> Option<Blocker> {
        if self.role != Role::Standby {
            return None;
        }
        if self.shutdown {
            return Some(Blocker::ShuttingDown);
        }
        if self.operator.priority == 0 {
            return Some(Blocker::PriorityZero);
        }
        if self.operator.rejoin_needed {
            return Some(Blocker::Rejoining);
        }
        if !self.turn {
            return Some(Blocker::NotItsTurn);
        }
        if self.ok_streak < self.timing.successes() {
            return Some(Blocker::Unhealthy);
        }
        if let Some(b) = self.backoff_until() {
            return Some(Blocker::BackingOff(b));
        }
        let seen = self.seen.as_ref()?;
        let record = seen.observed.as_ref().and_then(|o| o.record());
        if let Some(r) = record.filter(|_| !seen.absent_like) {
            if is_paused(r) {
                return Some(Blocker::Paused);
            }
            if r.state == LockState::Released {
                match &r.to {
                    // Handed to this node: taken at once, or once caught
                    // up (the lag check below says how far behind).
                    Some(to) if *to == self.id.node && !self.must_catch_up(r) => return None,
                    Some(to) if *to == self.id.node => {}
                    Some(to) if self.now < seen.first_seen + r.hold() => {
                        return Some(Blocker::HandedTo(to.clone()))
                    }
                    _ => {}
                }
            }
        }
        if let Some(lag) = self
            .lag_beyond(self.operator.position)
            .filter(|_| !self.operator.lag_waived)
        {
            return Some(Blocker::Lagging(lag));
        }
        if let Some(r) = record.filter(|r| {
            matches!(r.state, LockState::Active | LockState::Confirming) && !seen.absent_like
        }) {
            if self.now < seen.first_seen + self.timing.renew() * 2 {
                return Some(Blocker::HeldBy(r.node.clone()));
            }
        }
        if let Some(better) = self.outranked_by() {
            return Some(Blocker::Deferring(better.node.clone()));
        }
        if let Some(due) = self.new_epoch_due(seen).filter(|due| self.now < *due) {
            return Some(Blocker::Waiting(due.saturating_since(self.now)));
        }
        let held = record.is_none_or(|r| r.state != LockState::Released);
        if held && !seen.absent_like {
            let due = seen.first_seen + self.wait_for(seen);
            if self.now < due {
                return Some(Blocker::Waiting(due.saturating_since(self.now)));
            }
        }
        None
    }

    // ----- O1: switchover ---------------------------------------------------

    pub(super) fn on_switchover(&mut self, to: Option<String>, allow_lag: bool) {
        let refuse = |agent: &mut Agent, why: String| {
            agent
                .outputs
                .push_back(Output::Event(Event::SwitchoverRefused {
                    to: to.clone(),
                    why,
                }));
        };
        if self.role == Role::Standby && allow_lag && to.as_deref() == Some(&self.id.node) {
            self.operator.lag_waived = true;
            return;
        }
        if self.role != Role::Active {
            return refuse(self, format!("this node is not active ({})", self.role));
        }
        if self.operator.pause != PauseState::Off {
            return refuse(self, "failover is paused".into());
        }
        if !self.service_up() {
            return refuse(self, "the service is still starting".into());
        }
        let target = match &to {
            Some(node) if *node == self.id.node => {
                return refuse(self, format!("{node} already holds the lock"))
            }
            Some(node) => {
                let Some(c) = self.operator.candidates.iter().find(|c| c.node == *node) else {
                    return refuse(self, format!("{node} is not a member with a fresh record"));
                };
                if c.priority == 0 {
                    return refuse(self, format!("{node} is not eligible (priority 0)"));
                }
                if !c.ready {
                    return refuse(
                        self,
                        format!("{node} is not ready (failing checks, rejoining or backing off)"),
                    );
                }
                // A known position behind the highest is no reason to
                // refuse: the target catches up once this node stopped
                // writing (the release says so), or does not take it.
                if let (false, Some(None)) = (allow_lag, self.lag_beyond(c.position)) {
                    return refuse(self, format!("{node} has no known position (--max-lag)"));
                }
                node.clone()
            }
            None => {
                let best = self
                    .operator
                    .candidates
                    .iter()
                    .filter(|c| {
                        c.ready
                            && c.priority > 0
                            && (allow_lag || self.lag_beyond(c.position) != Some(None))
                    })
                    .max_by(|a, b| {
                        rank(a.position, a.priority, &a.node)
                            .cmp(&rank(b.position, b.priority, &b.node))
                    });
                match best {
                    Some(c) => c.node.clone(),
                    None => return refuse(self, "no eligible candidate".into()),
                }
            }
        };
        self.operator.handover = Some(Handover {
            to: target.clone(),
            catch_up: !allow_lag,
        });
        self.step_down(Reason::Switchover { to: target });
    }

    // ----- O2: pause ----------------------------------------------------------

    pub(super) fn on_pause(&mut self, pause: Pause) {
        self.operator.pause_wanted = Some(pause);
        self.apply_pause();
    }

    /// An active holder with a pause wanted starts writing it, once its
    /// service is up (an activation under way finishes first, under the
    /// keeper).
    pub(super) fn apply_pause(&mut self) {
        if self.operator.pause != PauseState::Off || !self.service_up() {
            return;
        }
        let Some(pause) = self.operator.pause_wanted.clone() else {
            return;
        };
        self.operator.pause = PauseState::Pausing(pause.clone());
        if self.mutations.is(Rule::DisarmBeforePauseLanded) {
            self.pause_landed();
        }
        self.renew_now();
    }

    /// A renewal of ours that says "paused" landed: from now on no standby
    /// takes the record over, so the keeper may let go (O2).
    pub(super) fn pause_landed(&mut self) {
        let PauseState::Pausing(pause) = &self.operator.pause else {
            return;
        };
        let pause = pause.clone();
        self.enter_paused(pause, true);
    }

    /// Failover is paused from here (O2): the keeper holds no deadline
    /// (`disarm` tells it to let go of one it may hold) and every view
    /// hears of the pause.
    pub(super) fn enter_paused(&mut self, pause: Pause, disarm: bool) {
        self.operator.pause = PauseState::Paused(pause.clone());
        if let Some(t) = self.tenure.as_mut() {
            t.keeper = KeeperArm::NotArmed;
        }
        if disarm {
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Disarm));
        }
        self.outputs.push_back(Output::Event(Event::Paused(pause)));
    }

    pub(super) fn on_resume(&mut self) {
        self.operator.pause_wanted = None;
        match self.operator.pause.clone() {
            PauseState::Off | PauseState::Resuming { .. } => {}
            // Nothing landed that stopped any rule: carry on as usual (a
            // paused write with an unknown outcome is overwritten by the
            // next renewal; the keeper was never disarmed).
            PauseState::Pausing(_) => self.operator.pause = PauseState::Off,
            PauseState::Paused(pause) => {
                self.operator.pause = PauseState::Resuming { pause, at: None };
                self.rearm();
            }
        }
    }

    /// Resuming: ask the keeper to hold the licence deadline again, once
    /// there is a licence to hold (a renewal may have to land first).
    pub(super) fn rearm(&mut self) {
        let PauseState::Resuming { pause, at: None } = &self.operator.pause else {
            return;
        };
        let Some(end) = self
            .lease
            .as_ref()
            .map(|l| l.licence_end)
            .filter(|e| *e > self.now)
        else {
            return; // the next renewal that lands calls again
        };
        let pause = pause.clone();
        self.outputs
            .push_back(Output::Keeper(KeeperCommand::Arm(end)));
        if let Some(t) = self.tenure.as_mut() {
            t.keeper = KeeperArm::Arming {
                at: end,
                deadline: self.now + self.timing.activate_timeout(),
            };
        }
        self.operator.pause = PauseState::Resuming {
            pause,
            at: Some(end),
        };
        if self.mutations.is(Rule::UnpauseBeforeRearmed) {
            self.unpause();
        }
    }

    /// The keeper answered the resume's `Arm`: `true` if it was ours.
    pub(super) fn on_rearm_ack(&mut self, at: Instant, ok: bool) -> bool {
        let PauseState::Resuming {
            pause,
            at: Some(asked),
        } = &self.operator.pause
        else {
            return false;
        };
        if *asked != at {
            return false;
        }
        if !ok {
            let pause = pause.clone();
            if let Some(t) = self.tenure.as_mut() {
                t.keeper = KeeperArm::NotArmed;
            }
            self.operator.pause = PauseState::Paused(pause);
            self.outputs.push_back(Output::Event(Event::ResumeRefused));
            return true;
        }
        if let Some(t) = self.tenure.as_mut() {
            t.keeper = KeeperArm::Armed { until: at };
        }
        let end = self.lease.as_ref().map(|l| l.licence_end);
        if let Some(end) = end.filter(|e| *e > at) {
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Extend(end)));
        }
        self.unpause();
        true
    }

    /// The keeper holds the deadline again: every rule applies from here,
    /// and the next renewal writes the record without the pause.
    fn unpause(&mut self) {
        self.operator.pause = PauseState::Off;
        self.operator.unpause_pending = true;
        self.active_fail_streak = 0;
        self.outputs.push_back(Output::Event(Event::Unpaused));
        self.renew_now();
    }

    // ----- O4: rejoin ---------------------------------------------------------

    /// A standby that must rejoin runs its hook against the holder it sees.
    pub(super) fn maybe_rejoin(&mut self) {
        if !self.operator.rejoin_needed || self.role != Role::Standby {
            return;
        }
        if let Some(deadline) = self.operator.rejoin_running {
            if self.now >= deadline {
                self.on_rejoin_hook(false);
            }
            return;
        }
        if self.operator.rejoin_retry_at.is_some_and(|t| self.now < t) {
            return;
        }
        let Some(seen) = &self.seen else { return };
        let holder = seen
            .observed
            .as_ref()
            .and_then(|o| o.record())
            .filter(|r| {
                matches!(r.state, LockState::Active | LockState::Confirming)
                    && r.node != self.id.node
            })
            .map(|r| r.node.clone());
        let deadline = self.now + self.timing.activate_timeout();
        self.operator.rejoin_running = Some(deadline);
        self.outputs.push_back(Output::Rejoin { holder, deadline });
    }

    pub(super) fn on_rejoin_hook(&mut self, ok: bool) {
        if self.operator.rejoin_running.take().is_none() {
            return;
        }
        if ok {
            self.operator.rejoin_needed = false;
            self.operator.rejoin_retry_at = None;
            self.outputs.push_back(Output::Event(Event::Rejoined));
        } else {
            self.operator.rejoin_retry_at = Some(self.now + self.timing.lease());
        }
    }

    /// Deadlines the operator controls wait for.
    pub(super) fn operator_timeout(&self) -> Option<Instant> {
        let rejoin = match (self.operator.rejoin_running, self.operator.rejoin_retry_at) {
            (Some(d), _) => Some(d),
            (None, Some(r)) if self.operator.rejoin_needed => Some(r),
            _ => None,
        };
        let failback = self
            .failback_due()
            .map(|(_, t)| t)
            .filter(|_| self.role == Role::Active);
        match (rejoin, failback) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A record that says failover is paused (O2): only a holder's own live
/// record counts; a released or revoked one never does.
pub(super) fn is_paused(r: &LockRecord) -> bool {
    r.paused.is_some() && matches!(r.state, LockState::Active | LockState::Confirming)
}
