//! The standby's rules, second half: taking the lock — two witnesses or a
//! probe (S1), the swap, confirmation and what an acquisition owes (S2–S4),
//! adopting a swap whose answer was lost (H4).

use super::operator::is_paused;
use super::*;

impl Agent {
    // ----- standby: acquiring (S1–S4) ---------------------------------------

    pub(super) fn standby_try_acquire(&mut self) {
        if !self.eligible() {
            return;
        }
        if self.previous.is_some() {
            self.maybe_resume_without_keeper();
            if self.lock_op.is_some() {
                return;
            }
        }
        let Some(seen) = self.seen.clone() else {
            return;
        };
        let gap_of = |t: &Timing, o: &Option<Observed>| match o {
            Some(Observed::Record(r)) => t.gap_against(r.gap()),
            _ => t.gap_unknown(),
        };
        let previous = seen
            .observed
            .as_ref()
            .and_then(|o| o.record())
            .map(|r| r.node.clone());
        let record = seen.observed.as_ref().and_then(|o| o.record());
        // O1: a release handed to this node is taken at once, or once this
        // node caught up: within --max-lag of the highest position it knows
        // (unless the operator waived the lag). It waits for that at most
        // the release's hold, asking for a fresh --position sample each time
        // one arrives; after the hold it is an ordinary release, which O3
        // below keeps a node still behind from taking.
        let handed_to_me = record.filter(|r| {
            !seen.absent_like
                && r.state == LockState::Released
                && r.to.as_deref() == Some(self.id.node.as_str())
        });
        if let Some(r) = handed_to_me {
            if !self.must_catch_up(r) {
                return self.acquire_released(AcquireKind::Handover, previous);
            }
            if self.now < seen.first_seen + r.hold() {
                if !self.operator.position_wanted {
                    self.operator.position_wanted = true;
                    self.outputs.push_back(Output::SamplePosition);
                }
                return;
            }
        }
        // O3: beyond --max-lag this node takes nothing over.
        if !self.within_lag() {
            return;
        }
        // O2: a paused record is never stale (a record that reached us
        // through a regression is judged as absent: S6 first).
        if !seen.absent_like
            && record.is_some_and(is_paused)
            && !self.mutations.is(Rule::TakeoverWhilePaused)
        {
            return;
        }
        // O1: a release handed to another node is theirs for a while.
        if let Some(r) = record.filter(|r| r.state == LockState::Released && !seen.absent_like) {
            if r.to.is_some()
                && self.now < seen.first_seen + r.hold()
                && !self.mutations.is(Rule::TakeHandedToOther)
            {
                return;
            }
        }
        // O3: a better candidate acts first; this node D later.
        let defer = self.deferral();
        if seen.absent_like {
            if self.now < seen.first_seen + defer {
                return;
            }
            if let Some(due) = self.new_epoch_due(&seen) {
                if self.now < due + defer {
                    return;
                }
                // S6 (z): a record of a re-created bucket unchanged for W
                // since we first saw it on our clock. Our clock alone is one
                // witness: the store's must agree too, and the leader must
                // still show the record (S1 b, refinement (v)), exactly as
                // for a stale record. Then it is judged as absent, with that
                // W already waited (S4 counted from the first sighting), so
                // only G' is owed after the swap.
                let (owed_lease, owed_gap) = self.absent_owed(&seen);
                if self.mutations.is(Rule::NewEpochOwnClockOnly) {
                    let unchanged_for = self.now.saturating_since(seen.first_seen);
                    return self.acquire(Acquire {
                        kind: AcquireKind::Stale,
                        owed_lease,
                        owed_gap,
                        previous,
                        evidence: Some((unchanged_for, None)),
                        floor: None,
                        reused: false,
                        foreign_seen: None,
                        over: None,
                    });
                }
                let w = self.timing.staleness_wait(owed_lease);
                return self.take_when_witnessed(&seen, w, owed_lease, owed_gap, previous);
            }
            // S4/S6: take it, then wait W + G' (`absent_owed`): a holder
            // whose record is gone may not know it yet.
            let (owed_lease, owed_gap) = self.absent_owed(&seen);
            return self.acquire(Acquire {
                kind: AcquireKind::Absent,
                owed_lease,
                owed_gap,
                previous,
                evidence: None,
                floor: None,
                reused: false,
                foreign_seen: None,
                over: None,
            });
        }
        let released =
            matches!(&seen.observed, Some(Observed::Record(r)) if r.state == LockState::Released);
        if released && self.now < seen.first_seen + defer {
            return;
        }
        if released {
            return self.acquire_released(AcquireKind::Released, previous);
        }
        // S1: held, revoked or unreadable — two witnesses of staleness. On
        // a store whose clock reads in steps each standby's witness lands
        // up to two steps apart: an outranked one defers by those too (O3).
        let w = self.wait_for(&seen);
        let spread = if defer.is_zero() {
            Duration::ZERO
        } else {
            self.store_clock_step * 2
        };
        if self.now < seen.first_seen + w + defer + spread {
            return;
        }
        let owed_gap = gap_of(&self.timing, &seen.observed);
        self.take_when_witnessed(&seen, w, self.timing.lease(), owed_gap, previous);
    }

    /// S1: a record our own clock has seen unchanged for `w` is taken over
    /// only once the store's clock agrees (b) and a leader read after that
    /// witness still shows the very record (refinement (v)); then by a
    /// compare-and-swap on its revision, owing `owed_gap` before activating.
    pub(super) fn take_when_witnessed(
        &mut self,
        seen: &Seen,
        w: Duration,
        owed_lease: Duration,
        owed_gap: Duration,
        previous: Option<String>,
    ) {
        match self.probe_verdict(seen, w) {
            ProbeVerdict::Stale
                if !self.mutations.is(Rule::StaleTakeoverUnconfirmed)
                    && self
                        .probe
                        .is_some_and(|p| seen.leader_at.is_none_or(|t| t < p.at)) =>
            {
                // The record as the leader has it now, after the witness:
                // the same revision with other contents restarts S1 (a).
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::LeaderPoll, self.deadline());
                }
            }
            ProbeVerdict::Stale => {
                let unchanged_for = self.now.saturating_since(seen.first_seen);
                let store_age = match (self.probe, seen.entry) {
                    (Some(p), Some((_, Some(time)))) => match self.store_gap(p.time, time) {
                        StoreGap::Forward(age) => Some(age),
                        StoreGap::Backwards | StoreGap::Unbounded => None,
                    },
                    _ => None,
                };
                self.acquire(Acquire {
                    kind: AcquireKind::Stale,
                    owed_lease,
                    owed_gap,
                    previous,
                    evidence: Some((unchanged_for, store_age)),
                    floor: None,
                    reused: false,
                    foreign_seen: None,
                    over: None,
                });
            }
            ProbeVerdict::Probe => self.send_probe(),
            ProbeVerdict::Wait => {}
            ProbeVerdict::ReadFirst => {
                if self.lock_op.is_none() {
                    self.send_lock(LockOp::LeaderPoll, self.deadline());
                }
            }
        }
    }

    /// Writes this node's probe record and then reads it from the leader
    /// (`on_probe`): the store's present time, for S1 (b) and the floor of
    /// F1 (b). One at a time.
    pub(super) fn send_probe(&mut self) {
        if self.probe_op.is_some() {
            return;
        }
        let write = self.write_id();
        let value = ProbeRecord {
            v: RECORD_VERSION,
            node: self.id.node.clone(),
            write,
        }
        .encode();
        let id = self.op_id();
        let deadline = self.deadline();
        self.probe_op = Some(Pending {
            id,
            deadline,
            what: ProbeStep::Write,
        });
        self.outputs.push_back(Output::Store(StoreRequest {
            id,
            op: StoreOp::Put {
                key: Key::Probe,
                value,
            },
            deadline,
        }));
    }

    /// S3 (O1 for a handover): the previous holder proved it stopped, so
    /// the tenure owes no gap.
    pub(super) fn acquire_released(&mut self, kind: AcquireKind, previous: Option<String>) {
        self.acquire(Acquire {
            kind,
            owed_lease: self.timing.lease(),
            owed_gap: Duration::ZERO,
            previous,
            evidence: None,
            floor: None,
            reused: false,
            foreign_seen: None,
            over: None,
        });
    }

    /// S1 (b): does the store's clock agree that W has passed?
    pub(super) fn probe_verdict(&self, seen: &Seen, w: Duration) -> ProbeVerdict {
        let token = seen.entry.expect("held records have a token").0;
        let Some(p) = self.probe.filter(|p| p.for_token == token) else {
            return ProbeVerdict::Probe;
        };
        let Some(record_time) = seen.entry.expect("present").1 else {
            return ProbeVerdict::ReadFirst;
        };
        let needed = if self.mutations.is(Rule::ProbeWitnessLease) {
            match &seen.observed {
                Some(Observed::Record(r)) => self.timing.lease_against(r.lease()),
                _ => self.timing.lease(),
            }
        } else {
            w
        };
        match self.gap_with_floor(p.time, self.store_gap(p.time, record_time)) {
            StoreGap::Unbounded => ProbeVerdict::Stale,
            StoreGap::Forward(g) if g >= needed => ProbeVerdict::Stale,
            // The store's clock went backwards: (b) is met after a further W of (a).
            StoreGap::Backwards if self.now >= seen.first_seen + w + w => ProbeVerdict::Stale,
            _ if self.now >= p.at + self.timing.renew() => ProbeVerdict::Probe,
            _ => ProbeVerdict::Wait,
        }
    }

    /// How far the probe's store time `probe` is after the record's
    /// `record`, a step's rounding not taken for a backwards clock.
    pub(super) fn store_gap(&self, probe: StoreTime, record: StoreTime) -> StoreGap {
        if self.mutations.is(Rule::StepRoundingIsBackwards) {
            probe.gap_since(record)
        } else {
            probe.gap_since_stepped(record, self.store_clock_step)
        }
    }

    pub(super) fn on_probe(&mut self, step: ProbeStep, outcome: StoreOutcome) {
        match (step, outcome) {
            (ProbeStep::Write, StoreOutcome::Written(token)) => {
                let id = self.op_id();
                let deadline = self.deadline();
                self.probe_op = Some(Pending {
                    id,
                    deadline,
                    what: ProbeStep::Read { token },
                });
                self.outputs.push_back(Output::Store(StoreRequest {
                    id,
                    op: StoreOp::Get {
                        key: Key::Probe,
                        leader: true,
                    },
                    deadline,
                }));
            }
            (ProbeStep::Read { token }, StoreOutcome::Read(Some(e))) if e.token == token => {
                // F1 (b): the first probe after a grant is the floor (its
                // result then shows no time since it, so another follows).
                self.note_floor(e.time);
                if let Some(seen) = &self.seen {
                    if let Some((t, _)) = seen.entry {
                        self.probe = Some(ProbeResult {
                            for_token: t,
                            time: e.time,
                            at: self.now,
                        });
                    }
                }
            }
            _ => {} // try again on the next look
        }
    }

    pub(super) fn acquire(&mut self, mut acquire: Acquire) {
        acquire.floor = self.highest;
        acquire.over = self
            .seen
            .as_ref()
            .and_then(|s| s.entry.map(|(t, _)| (t, s.observed.clone())));
        let write = self.write_id();
        let sent = self.now;
        let deadline = self.deadline();
        self.send_lock(
            LockOp::Acquire {
                write,
                sent,
                acquire: Box::new(acquire),
            },
            deadline,
        );
    }

    pub(super) fn on_acquire_outcome(
        &mut self,
        write: String,
        sent: Instant,
        acquire: Acquire,
        outcome: StoreOutcome,
    ) {
        if self.role != Role::Standby {
            return;
        }
        match outcome {
            StoreOutcome::Written(token) => {
                self.on_acquired(token, write, sent, acquire, Duration::ZERO)
            }
            StoreOutcome::Created { token, vacant_for } => {
                self.on_acquired(token, write, sent, acquire, vacant_for)
            }
            StoreOutcome::Conflict => {
                // Someone else moved first; look again at the leader.
                self.seen = None;
                self.send_lock(LockOp::LeaderPoll, self.deadline());
            }
            StoreOutcome::Unknown | StoreOutcome::Failed(_) => {
                self.unconfirmed.push(Unconfirmed {
                    write,
                    sent,
                    acquire: Some(acquire),
                });
                self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
            }
            StoreOutcome::Read(_) => {}
        }
    }

    /// S2/S3/S4: the acquisition landed; work out when we may activate.
    /// `vacant_for`: how long the store proves the key was without a record
    /// before our create (zero for every other write, and when it cannot).
    pub(super) fn on_acquired(
        &mut self,
        token: Token,
        write: String,
        sent: Instant,
        mut acquire: Acquire,
        vacant_for: Duration,
    ) {
        let floor = acquire.floor;
        // Our new revision already seen holding someone else's write: the
        // store lost that write and handed its revision to us (S6).
        let ours_reused = self.seen.as_ref().is_some_and(|s| {
            s.entry.is_some_and(|(t, _)| t == token)
                && !matches!(&s.observed, Some(Observed::Record(r)) if r.write == write)
        });
        // A foreign record newer than the revision we replaced, seen while
        // our compare-and-swap was on its way, yet the swap landed: the
        // store lost that record (a rollback) and its writer may believe it
        // holds the lock (S6, refinement (w)). Above our own new revision
        // too: on a store that keeps its writes such a record replaced
        // ours, and the tenure is lost anyway (H3), so the wait costs
        // nothing there; after a rollback deeper than our landing it is
        // the only evidence (chaos seed 115352).
        let lost_newer = acquire.over.as_ref().is_some_and(|(t, _)| {
            acquire
                .foreign_seen
                .is_some_and(|f| f.epoch == t.epoch && f > *t)
        }) && !self.mutations.is(Rule::AcquireOverLostRecord);
        let reused = match (&acquire.over, &self.seen) {
            _ if ours_reused => Some(token),
            (Some((t, _)), _) if lost_newer => Some(*t),
            (Some((t, _)), _) if acquire.reused => Some(*t),
            (Some((t, expected)), Some(seen))
                if seen.entry.map(|x| x.0) == Some(*t) && &seen.observed != expected =>
            {
                Some(*t)
            }
            _ => None,
        };
        if let Some(t) = reused {
            self.downgrade_to_absent(&mut acquire, t);
        }
        self.note_token(token);
        self.trust_own_write(token);
        let licence_start = if self.mutations.is(Rule::LicenceFromAck) {
            self.now
        } else {
            sent
        };
        let licence_end = licence_start + self.timing.lease();
        if self.now >= licence_end {
            return;
        }
        let no_gap = self.mutations.is(Rule::NoGap);
        let wait = match acquire.kind {
            AcquireKind::Released | AcquireKind::Handover => Duration::ZERO,
            _ if no_gap => Duration::ZERO,
            AcquireKind::Stale => acquire.owed_gap,
            AcquireKind::Resume => self.timing.gap(),
            AcquireKind::Absent => {
                let wait = self.absent_wait(&acquire);
                // S4, refined: a first use whose key the store proves was
                // vacant owes only what is left of the wait; real time at
                // least `vacant_for` (within ε) passed already since any
                // holder's last write to it.
                let first_use = acquire.over.is_none() && reused.is_none();
                if first_use {
                    wait.saturating_sub(vacant_for)
                } else {
                    wait
                }
            }
        };
        let set = self.failsafe_written(&write);
        self.failsafe_landed(licence_start, set);
        self.lease = Some(Lease {
            token,
            write,
            sent: licence_start,
            licence_end,
        });
        self.unconfirmed.clear();
        self.probe = None;
        self.probe_op = None;
        let reason = match acquire.kind {
            AcquireKind::Released => Reason::AcquiredReleased,
            AcquireKind::Handover => Reason::AcquiredHandover,
            AcquireKind::Stale => {
                let (unchanged_for, store_age) = acquire.evidence.unwrap_or_default();
                Reason::AcquiredStale {
                    revision: acquire.over.as_ref().map_or(token, |o| o.0),
                    unchanged_for,
                    store_age,
                }
            }
            AcquireKind::Absent => Reason::AcquiredAbsent,
            AcquireKind::Resume => Reason::Resumed,
        };
        self.tenure = Some(Tenure {
            acquire,
            activate_at: self.now + wait,
            floor,
            active_token: None,
            first: token,
            service: Service::NotStarted,
            keeper: KeeperArm::NotArmed,
            let_go: false,
        });
        self.fail_streak = 0;
        self.operator.lag_waived = false;
        self.set_role(Role::Confirming, reason, Some(token));
        if let Some(t) = self
            .tenure
            .as_ref()
            .filter(|t| t.acquire.kind == AcquireKind::Absent)
        {
            // Never in silence: say what the activation waits for (S4, S6).
            let why = if t.acquire.over.is_none() && reused.is_none() {
                if vacant_for.is_zero() {
                    AbsentWhy::FirstUse
                } else {
                    AbsentWhy::YoungStore
                }
            } else {
                AbsentWhy::StoreWentBack
            };
            let wait = t.activate_at.saturating_since(self.now);
            if !wait.is_zero() {
                self.outputs
                    .push_back(Output::Event(Event::AbsentWait { wait, why }));
            }
        }
        // A foreign write newer than ours was already seen while the reply
        // was on its way: settle it with an own-writes read before
        // activating (H3; `try_activate` waits for the read).
        let newer = self.seen.as_ref().is_some_and(|s| {
            s.entry
                .is_some_and(|(t, _)| t.epoch == token.epoch && t > token)
                && !matches!(&s.observed, Some(Observed::Record(r)) if r.instance == self.id.instance)
        });
        if newer && self.lock_op.is_none() {
            self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
        }
        self.try_activate();
    }

    /// S4: W for T' = the owed lease, then the owed gap.
    pub(super) fn absent_wait(&self, acquire: &Acquire) -> Duration {
        let lease = if self.mutations.is(Rule::NoDriftFactor) {
            acquire.owed_lease
        } else {
            self.timing.staleness_wait(acquire.owed_lease)
        };
        lease + acquire.owed_gap
    }

    /// The record our CAS replaced was not the one we judged: the store
    /// reused a revision after losing writes (S6). Owe what an absent record
    /// owes: W(--max-lease or own T) + G.
    pub(super) fn downgrade_to_absent(&mut self, acquire: &mut Acquire, token: Token) {
        self.outputs.push_back(Output::Event(Event::StoreRegressed {
            highest: self.highest.unwrap_or(token),
            now: token,
        }));
        acquire.kind = AcquireKind::Absent;
        acquire.owed_lease = acquire
            .owed_lease
            .max(self.timing.lease_unknown() + self.absent_cap(None));
        acquire.owed_gap = acquire.owed_gap.max(self.timing.gap_unknown());
    }

    /// A standby's own-writes read after an acquisition with unknown outcome.
    pub(super) fn adopt_acquisition(&mut self, entry: &Entry) -> bool {
        let Observed::Record(r) = Observed::decode(&entry.value) else {
            return false;
        };
        if r.instance != self.id.instance || r.state != LockState::Confirming {
            return false;
        }
        let Some(u) = self
            .unconfirmed
            .iter()
            .find(|u| u.write == r.write)
            .cloned()
        else {
            return false;
        };
        let Some(acquire) = u.acquire else {
            return false;
        };
        if self.now >= u.sent + self.timing.lease() {
            return false;
        }
        self.lock_op = None;
        // Adopted from a read: the create's answer, and with it any proof
        // of vacancy, never arrived.
        self.on_acquired(entry.token, u.write, u.sent, acquire, Duration::ZERO);
        true
    }
}

pub(super) enum ProbeVerdict {
    Stale,
    Probe,
    Wait,
    /// The record's store time is not known yet: read it first.
    ReadFirst,
}
