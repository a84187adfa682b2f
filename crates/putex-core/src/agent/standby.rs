//! The standby's rules, first half: observing the record — staleness, store
//! epochs, a replaced store, back-off and eligibility (S1, S4–S6). Taking it
//! is `acquire.rs`.

use super::operator::is_paused;
use super::*;

impl Agent {
    // ----- standby: observing (S1, S4–S6) ------------------------------------

    /// After start-up without an adopted keeper: a record of our previous
    /// instance that was `active` on this boot is resumed after G (S5).
    pub(super) fn resume_without_keeper_check(&mut self) {
        if self.lock_op.is_none() {
            self.send_lock(LockOp::LeaderPoll, self.deadline());
        }
    }

    pub(super) fn on_lock_seen(&mut self, entry: Option<Entry>, leader: bool) {
        if self.role == Role::Exited {
            return;
        }
        if self.holding() {
            self.check_replaced(entry.as_ref());
            self.holder_sees(entry);
            return;
        }
        let observed = entry.as_ref().map(|e| Observed::decode(&e.value));
        // S6: the revision our in-flight acquisition expects, with other
        // contents: the store reused it, and the CAS may hit a record we
        // never judged. Remember it for when the reply comes (our own write
        // may be seen before that reply and replace what we saw).
        if let (
            Some(e),
            Some(Pending {
                what: LockOp::Acquire { acquire, .. },
                ..
            }),
        ) = (&entry, self.lock_op.as_mut())
        {
            if let Some((t, expected)) = &acquire.over {
                if *t == e.token && observed.as_ref() != expected.as_ref() {
                    acquire.reused = true;
                }
            }
        }
        // S5: a live record with our node id from another machine.
        if let (Some(e), Some(Observed::Record(r))) = (&entry, &observed) {
            if r.node == self.id.node
                && r.machine != self.id.machine
                && matches!(r.state, LockState::Active | LockState::Confirming)
            {
                match self.duplicate_seen {
                    Some(t) if t != e.token => {
                        return self.exit(ExitReason::DuplicateNode {
                            machine: r.machine.clone(),
                        })
                    }
                    _ => self.duplicate_seen = Some(e.token),
                }
            }
        }
        // H4: an acquisition of ours whose outcome was unknown has landed.
        if let Some(e) = &entry {
            if self.role == Role::Standby && self.adopt_acquisition(e) {
                return;
            }
        }
        let mut absent_like = entry.is_none();
        let mut new_epoch = false;
        if let Some(e) = &entry {
            match self.trusted {
                Some(t) if e.token.epoch == t.epoch && e.token < t => {
                    // A leader read sent before the watch showed `t` may
                    // answer with the store as it was then: old news, not
                    // a regression (unless it is below what was trusted
                    // when it was sent).
                    let overtaken = leader
                        && self
                            .trusted_at_read
                            .is_none_or(|f| f.epoch != e.token.epoch || e.token >= f);
                    if !leader || overtaken {
                        // Maybe a lagging replica, or an overtaken read;
                        // ask the leader (again).
                        if self.lock_op.is_none() && self.role == Role::Standby {
                            self.send_lock(LockOp::LeaderPoll, self.deadline());
                        }
                        return;
                    }
                    // S6: the store went backwards; never trust what it lost.
                    self.outputs.push_back(Output::Event(Event::StoreRegressed {
                        highest: self.highest.unwrap_or(t),
                        now: e.token,
                    }));
                    absent_like = true;
                    self.trusted = Some(e.token);
                }
                Some(t) if e.token.epoch < t.epoch => return, // an old incarnation, seen late
                Some(t) if e.token.epoch > t.epoch => {
                    // S6: a re-created bucket counts as an absent record
                    // (once it stays unchanged for W: `new_epoch_due`).
                    absent_like = true;
                    new_epoch = true;
                    self.trusted = Some(e.token);
                }
                _ => self.trusted = Some(self.trusted.map_or(e.token, |t| t.max(e.token))),
            }
        }
        // S6: one revision with two contents — the store lost the one we saw
        // first and handed its revision to another write. Which of them is
        // current, and whose writer still believes it holds the lock, this
        // node cannot tell: the record is judged as absent (chaos seed
        // 384865: a late watch event of our own lost release, seen after
        // the write that reused its revision, was taken as a clean release).
        if let (Some(e), Some(s)) = (&entry, &self.seen) {
            if s.entry.is_some_and(|(t, _)| t == e.token)
                && s.observed != observed
                && !self.mutations.is(Rule::ReusedRevisionTrusted)
            {
                self.outputs.push_back(Output::Event(Event::StoreRegressed {
                    highest: self.highest.unwrap_or(e.token),
                    now: e.token,
                }));
                absent_like = true;
            }
        }
        let key = entry.as_ref().map(|e| (e.token, Some(e.time)));
        // After a rollback a revision can be reused by another write: the
        // same revision with other contents is a new record (S1 a restarts).
        let same = self
            .seen
            .as_ref()
            .is_some_and(|s| s.entry == key && s.observed == observed);
        // Our own release, known from its reply, now with its store time.
        let timed = match (&mut self.seen, &key) {
            (Some(s), Some((t, time))) if s.observed == observed => match &mut s.entry {
                Some((st, stime @ None)) if st == t => {
                    *stime = *time;
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !same && !timed {
            if let Some(Observed::Record(r)) = &observed {
                if let Some(w) = self.timing.advertised_timing_warning(r.lease(), r.gap()) {
                    self.outputs
                        .push_back(Output::Event(Event::AdvertisedTimingAboveMax(w)));
                }
            }
            self.seen = Some(Seen {
                entry: key,
                observed,
                first_seen: self.now,
                absent_like,
                new_epoch,
                leader_at: leader.then_some(self.now),
            });
            self.probe = None;
            self.probe_op = None;
        } else if leader {
            if let Some(s) = self.seen.as_mut() {
                s.leader_at = Some(self.now);
            }
        }
    }

    /// Whether `entry` is the write our lease runs on (same write id).
    pub(super) fn is_lease_write(&self, entry: &Entry) -> bool {
        let Some(lease) = &self.lease else {
            return false;
        };
        matches!(Observed::decode(&entry.value), Observed::Record(r) if r.write == lease.write)
    }

    /// While confirming: if the revision our acquisition replaced shows up
    /// with other contents, the store reused it (S6): wait as for an absent
    /// record, counted from now.
    pub(super) fn check_replaced(&mut self, entry: Option<&Entry>) {
        if self.role != Role::Confirming {
            return;
        }
        let Some(e) = entry else { return };
        // Another writer's record at our own revision, seen after our write
        // was acknowledged: the store lost that acknowledged write (a
        // rollback) and handed its revision to us. Its writer may believe it
        // holds the lock until it reads ours: owe what an absent record
        // owes, counted from now (S6).
        let Some(lease_token) = self.lease.as_ref().map(|l| l.token) else {
            return;
        };
        if e.token == lease_token && !self.is_lease_write(e) {
            return self.owe_absent_wait(e.token);
        }
        // Another writer's record above ours: on a store that keeps its
        // writes it replaced ours, and the own-writes read that follows
        // ends the tenure (H3). If that read shows ours instead, the store
        // lost the record we saw, and its writer may believe it holds the
        // lock (S6): wait as for an absent record either way (chaos seed
        // 115352, where the evidence arrived after the swap's reply).
        if e.token.epoch == lease_token.epoch && e.token > lease_token {
            let ours = matches!(Observed::decode(&e.value), Observed::Record(r) if r.instance == self.id.instance);
            if !ours && !self.mutations.is(Rule::ForeignAboveWhileConfirming) {
                return self.owe_absent_wait(e.token);
            }
        }
        let Some(tenure) = self.tenure.as_mut() else {
            return;
        };
        let Some((t, expected)) = &tenure.acquire.over else {
            return;
        };
        if e.token != *t || Some(Observed::decode(&e.value)) == *expected {
            return;
        }
        let t = *t;
        if let Some(tenure) = self.tenure.as_mut() {
            tenure.acquire.over = None;
        }
        self.owe_absent_wait(t);
    }

    /// The confirming tenure rests on a store that lost records (S6): it
    /// owes what an absent record owes, counted from now.
    pub(super) fn owe_absent_wait(&mut self, token: Token) {
        let Some(tenure) = self.tenure.as_ref() else {
            return;
        };
        let mut acquire = tenure.acquire.clone();
        self.downgrade_to_absent(&mut acquire, token);
        let wait = self.absent_wait(&acquire);
        let tenure = self.tenure.as_mut().expect("present");
        tenure.activate_at = tenure.activate_at.max(self.now + wait);
        tenure.acquire = acquire;
        let wait = tenure.activate_at.saturating_since(self.now);
        self.outputs.push_back(Output::Event(Event::AbsentWait {
            wait,
            why: AbsentWhy::StoreWentBack,
        }));
    }

    /// A holder sees the record change under it (from a watch or poll).
    pub(super) fn holder_sees(&mut self, entry: Option<Entry>) {
        let Some(lease) = &self.lease else { return };
        if let Some(e) = &entry {
            if e.token == lease.token && self.is_lease_write(e) {
                return;
            }
            let ours = matches!(Observed::decode(&e.value), Observed::Record(r) if r.instance == self.id.instance);
            if ours && e.token.epoch == lease.token.epoch && e.token < lease.token {
                return; // one of our own earlier writes, seen late
            }
        }
        // Anything else — a newer write (ours, H4, or someone else's, H3), a
        // foreign record below our token or in another epoch (a regression,
        // S6), or the record gone — is for the leader read to judge.
        if self.lock_op.is_none() {
            self.send_lock(LockOp::Verify { then_renew: false }, self.deadline());
        }
    }

    /// S5 without an adopted keeper: our previous instance's active record on
    /// this boot is taken over and activated after G instead of W.
    pub(super) fn maybe_resume_without_keeper(&mut self) {
        let Some(prev) = self.previous.clone() else {
            return;
        };
        let Some(seen) = &self.seen else { return };
        // A record that reached us through a regression is not evidence of
        // anything (S6): it is judged as absent, never resumed.
        let resumable = prev.same_boot
            && !seen.absent_like
            && matches!(&seen.observed, Some(Observed::Record(r))
                if r.instance == prev.instance && r.node == self.id.node
                    && r.machine == self.id.machine && r.state == LockState::Active);
        // Only the first look counts: afterwards the record is judged normally.
        self.previous = None;
        if !resumable || self.lock_op.is_some() {
            return;
        }
        let acquire = self.resume_acquire();
        self.acquire(acquire);
    }

    /// When the standby should look again at a stale-looking record.
    pub(super) fn staleness_due(&self) -> Option<Instant> {
        let seen = self.seen.as_ref()?;
        if self.lock_op.is_some() || self.probe_op.is_some() {
            return None;
        }
        let defer = self.deferral();
        let a = if seen.absent_like {
            // A record of a re-created bucket is judged once unchanged for
            // W, then with the store's witness like any stale record (S6 z).
            self.new_epoch_due(seen)? + defer
        } else {
            if let Some(Observed::Record(r)) = &seen.observed {
                if is_paused(r) && !self.mutations.is(Rule::TakeoverWhilePaused) {
                    return None;
                }
                if r.state == LockState::Released {
                    // O1/O3: a release handed to another node, or one a better
                    // candidate takes first.
                    let hold = match &r.to {
                        Some(to) if *to != self.id.node => r.hold(),
                        _ => Duration::ZERO,
                    };
                    return Some(seen.first_seen + hold.max(defer)).filter(|t| *t > self.now);
                }
            }
            seen.first_seen + self.wait_for(seen) + defer
        };
        match self.probe {
            Some(p) if Some(p.for_token) == seen.entry.map(|x| x.0) => {
                Some(a.max(p.at + self.timing.renew()))
            }
            _ => Some(a),
        }
        .filter(|t| *t > self.now)
    }

    /// When a record first seen in a new epoch may be judged as absent: once
    /// it has stayed unchanged for W, T' being the larger of `--max-lease`
    /// (else the own T) and what it advertises, as an absent record owes.
    /// `None` for any other record.
    pub(super) fn new_epoch_due(&self, seen: &Seen) -> Option<Instant> {
        if !seen.new_epoch {
            return None;
        }
        let (lease, _) = self.absent_owed(seen);
        Some(seen.first_seen + self.timing.staleness_wait(lease))
    }

    /// What taking an absent-like record owes (S4/S6): T' = `--max-lease`
    /// (else the own T) and G' = `--max-gap` (else the own G), or what a
    /// record that survived advertises if larger, as for any taker.
    pub(super) fn absent_owed(&self, seen: &Seen) -> (Duration, Duration) {
        let record = seen.observed.as_ref().and_then(|o| o.record());
        // F2, the cap: a holder whose record the store lost (or re-created)
        // may still run on its members' grants for up to its cap.
        // A confirming record advertises what its tenure owes, which
        // covers any earlier holder's cap already: only its own writer's
        // cap (after T' of `--max-lease` at most) is added, so the owed
        // wait does not grow by a cap with every lost record.
        let cap = self.absent_cap(record);
        let unknown = self.timing.lease_unknown() + cap;
        match record {
            Some(r) if r.state == LockState::Confirming => (
                unknown.max(r.lease()),
                self.timing.gap_unknown().max(r.gap()),
            ),
            Some(r) => (
                unknown.max(r.lease() + cap),
                self.timing.gap_unknown().max(r.gap()),
            ),
            None => (unknown, self.timing.gap_unknown()),
        }
    }

    /// W for what we see: T' is the larger of ours and the advertised T, or
    /// `--max-lease` when the holder's T is unknown (S1, S4).
    pub(super) fn wait_for(&self, seen: &Seen) -> Duration {
        let lease = match &seen.observed {
            Some(Observed::Record(r)) if !self.mutations.is(Rule::IgnoreAdvertisedLease) => {
                // F2: outside a failsafe record's set, T + its cap.
                self.timing.lease_against(r.lease()) + self.outside_failsafe(r).unwrap_or_default()
            }
            Some(Observed::Record(_)) => self.timing.lease(),
            Some(Observed::Garbage) | None => self.timing.lease_unknown().max(self.timing.lease()),
        };
        if self.mutations.is(Rule::NoDriftFactor) {
            lease
        } else {
            self.timing.staleness_wait(lease)
        }
    }

    pub(super) fn eligible(&self) -> bool {
        self.role == Role::Standby
            && !self.shutdown
            && self.turn
            && self.ok_streak >= self.timing.successes()
            && self.lock_op.is_none()
            && self.backoff_until.is_none_or(|b| self.now >= b)
            && self.candidacy_allows()
    }

    /// After a health step-down: wait T, doubling with each repeat up to 16 T,
    /// before acquiring again. A passing `active` check resets the count.
    pub(super) fn back_off(&mut self) {
        self.health_stepdowns = self.health_stepdowns.saturating_add(1);
        let factor = 1u32 << (self.health_stepdowns.min(5) - 1);
        self.backoff_until = Some(self.now + self.timing.lease() * factor);
    }

    /// When a node that stepped down for health may acquire again.
    pub fn backoff_until(&self) -> Option<Instant> {
        self.backoff_until.filter(|b| *b > self.now)
    }
}
