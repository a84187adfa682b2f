//! The holder's rules: renewals (H1, H3, H4, H5) and activation (S2, S3, S6).

use super::*;

impl Agent {
    // ----- holder: renewals (H1, H3, H4, H5) ---------------------------------

    pub(super) fn renew_now(&mut self) {
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

    pub(super) fn send_renew(&mut self) {
        let write = self.write_id();
        let sent = self.now;
        let paused = self.renewal_pauses();
        self.send_lock(
            LockOp::Renew {
                write,
                sent,
                paused,
            },
            self.deadline(),
        );
    }

    pub(super) fn on_store(&mut self, id: OpId, outcome: StoreOutcome) {
        if let Some(p) = &self.probe_op {
            if p.id == id {
                let step = self.probe_op.take().expect("checked").what;
                let outcome = match outcome {
                    StoreOutcome::Created { token, .. } => StoreOutcome::Written(token),
                    o => o,
                };
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
        // Only an acquisition's create can prove a vacancy (S4); to every
        // other request a `Created` answer is a plain write.
        let outcome = match outcome {
            StoreOutcome::Created { token, .. } if !matches!(what, LockOp::Acquire { .. }) => {
                StoreOutcome::Written(token)
            }
            o => o,
        };
        match what {
            LockOp::Poll => {
                if let StoreOutcome::Read(entry) = outcome {
                    self.on_lock_seen(entry.clone(), false);
                    self.note_entry(entry.as_ref());
                }
            }
            LockOp::LeaderPoll => {
                if let StoreOutcome::Read(entry) = outcome {
                    // A start-up read: what it shows counts as seen (S6),
                    // whatever follows (a later tenure's floor is above it).
                    if self.start_step == Some(StartStep::ReadForResume) {
                        self.note_entry(entry.as_ref());
                        self.resume_with_keeper(entry);
                    } else if self.start_step == Some(StartStep::ReadForPause) {
                        self.note_entry(entry.as_ref());
                        self.resume_paused(entry);
                    } else {
                        self.on_lock_seen(entry.clone(), true);
                        self.note_entry(entry.as_ref());
                    }
                } else if self.start_step == Some(StartStep::ReadForPause) {
                    // No answer: nothing says the lock is ours and paused.
                    self.start_step = Some(StartStep::Deactivating);
                    self.begin_stop(StopKind::Startup);
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
            LockOp::Renew {
                write,
                sent,
                paused,
            } => self.on_renew_outcome(write, sent, paused, outcome),
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

    pub(super) fn on_renew_outcome(
        &mut self,
        write: String,
        sent: Instant,
        paused: bool,
        outcome: StoreOutcome,
    ) {
        if !self.holding() {
            return; // H1: an ack after the licence ended restores nothing
        }
        match outcome {
            StoreOutcome::Written(token) | StoreOutcome::Created { token, .. } => {
                let from = if self.mutations.is(Rule::LicenceFromAck) {
                    self.now
                } else {
                    sent
                };
                self.extend(token, write, from);
                if paused {
                    self.pause_landed();
                } else {
                    self.operator.unpause_pending = false;
                }
            }
            StoreOutcome::Conflict => {
                self.send_lock(LockOp::Verify { then_renew: false }, self.deadline())
            }
            StoreOutcome::Unknown | StoreOutcome::Failed(_) => {
                self.failsafe_store_failed();
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
    pub(super) fn extend(&mut self, token: Token, write: String, sent: Instant) {
        self.note_token(token);
        self.trust_own_write(token);
        let licence_end = sent + self.timing.lease();
        let lease = self.lease.as_mut().expect("extend needs a lease");
        if token <= lease.token {
            return;
        }
        lease.token = token;
        lease.write = write.clone();
        lease.sent = sent;
        lease.licence_end = lease.licence_end.max(licence_end);
        self.unconfirmed.clear();
        let set = self.failsafe_written(&write);
        self.failsafe_landed(sent, set);
        if self.keeper_may_extend() {
            let end = self.lease.as_ref().expect("present").licence_end;
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Extend(end)));
        }
        // Resuming after the licence ran out while paused: now there is a
        // deadline for the keeper to hold (O2).
        self.rearm();
    }

    /// Whether the keeper takes a new deadline now: the service may run or
    /// the keeper is armed, failover is not paused and the keeper was not
    /// let go.
    pub(super) fn keeper_may_extend(&self) -> bool {
        let armed = self
            .tenure
            .as_ref()
            .is_some_and(|t| matches!(t.keeper, KeeperArm::Armed { .. }));
        let let_go = self.tenure.as_ref().is_some_and(|t| t.let_go);
        (self.service_may_run() || armed) && !self.paused() && !let_go
    }

    /// H3/H4: an own-writes read after a conflict or before the next CAS.
    pub(super) fn on_verify(&mut self, entry: Option<Entry>, then_renew: bool) {
        if !self.holding() {
            // A standby verifying an acquisition whose outcome was unknown.
            self.on_lock_seen(entry.clone(), true);
            self.note_entry(entry.as_ref());
            return;
        }
        let lease_token = self.lease.as_ref().expect("holding").token;
        let Some(entry) = entry else {
            return self.lose(Reason::Lost(LossCause::RecordAbsent), Some(lease_token));
        };
        if entry.token.epoch != lease_token.epoch {
            return self.lose(Reason::Lost(LossCause::StoreRecreated), Some(lease_token));
        }
        if entry.token < lease_token {
            // S6: the store lost our writes. Stop, and remember what it shows
            // now as an absent-like record.
            self.trusted = Some(self.trusted.map_or(lease_token, |t| t.max(lease_token)));
            self.lose(Reason::Lost(LossCause::StoreRegressed), Some(lease_token));
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
            self.lose(Reason::Lost(LossCause::RevisionReused), Some(lease_token));
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
        // H4 for the release: one of our releases whose reply was lost (the
        // next one, over the older token, conflicted with it) has landed.
        // It is ours, not someone else's record: the tenure ends released.
        if let Some(r) = record.record().filter(|r| {
            self.role == Role::SteppingDown
                && r.instance == self.id.instance
                && r.state == LockState::Released
                && self.release_writes.contains(&r.write)
        }) {
            let write = r.write.clone();
            return self.on_release_outcome(&write, StoreOutcome::Written(entry.token));
        }
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
                let paused = record.record().is_some_and(|r| r.paused.is_some());
                self.extend(entry.token, u.write, u.sent);
                if paused {
                    self.pause_landed();
                } else {
                    self.operator.unpause_pending = false;
                }
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
                    Some(r) if r.state == LockState::Revoked => LossCause::Revoked,
                    Some(r) => LossCause::HeldBy {
                        node: r.node.clone(),
                        write: r.write.clone(),
                    },
                    None => LossCause::Unreadable,
                };
                self.lose(Reason::Lost(why), Some(lease_token));
            }
        }
    }

    /// Tells the keeper to let the tenure's deadline go: its stop is proven,
    /// or nothing started under it. No extension follows (the keeper would
    /// refuse it).
    pub(super) fn let_keeper_go(&mut self) {
        self.outputs
            .push_back(Output::Keeper(KeeperCommand::Disarm));
        if let Some(t) = self.tenure.as_mut() {
            t.let_go = true;
        }
    }

    /// The lock is lost or the licence ended: emergency stop if the service
    /// may run, and forget the lease.
    pub(super) fn lose(&mut self, reason: Reason, token: Option<Token>) {
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
        self.release_writes.clear();
        self.operator.handover = None;
        self.operator.pause = PauseState::Off;
        self.operator.unpause_pending = false;
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

    pub(super) fn leave_confirming(&mut self, reason: Reason) {
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
        let unstarted_s3 = self.tenure.as_ref().is_some_and(|t| {
            matches!(
                t.acquire.kind,
                AcquireKind::Released | AcquireKind::Handover
            )
        });
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
    pub(super) fn give_back_unstarted(&mut self, reason: Reason) {
        let token = self.lease.as_ref().map(|l| l.token);
        let armed = self
            .tenure
            .as_ref()
            .is_some_and(|t| t.keeper != KeeperArm::NotArmed);
        if armed {
            self.let_keeper_go();
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

    pub(super) fn try_activate(&mut self) {
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
    pub(super) fn on_keeper_ack(&mut self, command: KeeperCommand, ok: bool) {
        let armed = match command {
            KeeperCommand::Arm(at) if self.on_rearm_ack(at, ok) => return,
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
    pub(super) fn keeper_guards(&self) -> bool {
        self.mutations.is(Rule::ActivateBeforeArmed)
            || self
                .tenure
                .as_ref()
                .is_some_and(|t| matches!(t.keeper, KeeperArm::Armed { until } if self.now < until))
    }

    /// An activation held back for the keeper (its acknowledged deadline
    /// had passed) goes on once it is ahead again.
    pub(super) fn continue_activation(&mut self) {
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

    pub(super) fn on_hook(&mut self, hook: Hook, ok: bool) {
        if hook == Hook::Rejoin {
            return self.on_rejoin_hook(ok);
        }
        if self.role != Role::Active || (!ok && self.paused()) {
            // While paused a failed hook stops nothing: the operator owns
            // the service (O2).
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

    pub(super) fn on_service_exited(&mut self) {
        if self.role == Role::Active && !self.paused() {
            self.step_down(Reason::ServiceExited);
        }
    }
}
