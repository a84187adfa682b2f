//! Failsafe (F1–F4 in `docs/failsafe-design.md`): a holder rides out a
//! store outage on its members' grants.
//!
//! **A member's side.** During a store outage a holder asks the other
//! members of its lock directly for a *grant*: a renewal delivered peer to
//! peer. A member grants only what it could have seen through the store —
//! the newest record it knows is the requester's own holding record — and
//! only while it is not holding, confirming or acquiring the lock itself.
//! A grant is then an observation of the holder, exactly as a new revision
//! seen through the store:
//!
//! - S1 (a): the member's own-clock wait W starts again at the grant;
//! - S1 (b): the store's clock cannot see a grant, so the store-clock
//!   witness counts from a *floor*: the store time of the first probe the
//!   member sends after its last grant. Any staleness check under way
//!   (a probe, its result) is abandoned and starts again after the grant.
//!
//! F4: a member cannot remember grants it gave before a restart, so an
//! agent with failsafe on starts as if it had just granted (its floor is
//! pending until its first probe).
//!
//! **A holder's side.** Its records carry the failsafe set (F2: every
//! member reported, by node and machine, and the cap). When a renewal
//! does not land, each healthy round of an active holder asks every member
//! of the union of the sets its possibly-newest writes carried (H4); a
//! round in which every one granted extends the licence as a renewal would
//! — to the round's send time + T, if it has not ended — and never past
//! the last landed renewal + `failsafe_max` (the cap). A node outside the
//! set, and a taker of an absent record, waits W over T + the cap, by when
//! a holder running on grants has stopped. The first write that lands
//! ends the failsafe.

use super::{Agent, KeeperCommand, Observed, Output, Role};
use crate::mutation::Rule;
use crate::record::{FailsafeMember, FailsafeSet, LockRecord, LockState};
use crate::store::{StoreGap, StoreTime};
use crate::time::Instant;

pub use super::vocabulary::{FailsafeAnswer, FailsafeRefusal, FailsafeRequest};

/// A holder's failsafe state (F2, F3).
#[derive(Clone, Debug, Default)]
pub(super) struct HolderSide {
    /// The members as last reported, each with when (own clock).
    members: Vec<(FailsafeMember, Instant)>,
    /// Every member of a set in a write of ours that may be the newest
    /// record: the last landed one's and any sent since (H4).
    union: Vec<FailsafeMember>,
    /// The set of our last write that landed.
    landed: Vec<FailsafeMember>,
    /// Our writes sent since the last that landed, with their sets.
    sent: Vec<(String, Option<FailsafeSet>)>,
    /// The send time of our last write that landed: the cap counts from it.
    last_landed: Option<Instant>,
    /// Our last renewal did not land (failed, or its outcome unknown).
    store_failed: bool,
    /// The round of asks in flight.
    round: Option<AskRound>,
    next_round: u64,
    /// Since when the licence has run on grants.
    since: Option<Instant>,
}

impl HolderSide {
    /// F2: whether every write of ours that may be the newest record — the
    /// last that landed, and each sent since — carries a set.
    fn every_newest_has_a_set(&self) -> bool {
        !self.landed.is_empty()
            && self
                .sent
                .iter()
                .all(|(_, set)| set.as_ref().is_some_and(|s| !s.members.is_empty()))
    }
}

/// One round of asks (F3).
#[derive(Clone, Debug)]
struct AskRound {
    number: u64,
    /// `s`: when the asks went out.
    sent: Instant,
    asked: Vec<FailsafeMember>,
}

/// Where the store-clock floor of a member's takeover stands (F1 b).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Floor {
    /// No grant given (failsafe off, or none since a start without it):
    /// the record's own store time is the only floor.
    None,
    /// A grant was given, or the agent started with failsafe on (F4): the
    /// first probe sent from now on sets the floor, and is no witness.
    Pending,
    /// The store time of the first probe sent after the last grant.
    Set(StoreTime),
}

impl Agent {
    /// F1: answers a holder's request for a grant from the core's state,
    /// at once.
    pub(super) fn on_failsafe_request(&mut self, request: FailsafeRequest) {
        let answer = match self.failsafe_refusal(&request) {
            Some(why) => FailsafeAnswer::Refused(why),
            None => {
                self.grant();
                FailsafeAnswer::Granted
            }
        };
        self.outputs.push_back(Output::FailsafeAnswer {
            id: request.id,
            answer,
        });
    }

    /// Why this member does not grant `request`, if it does not.
    fn failsafe_refusal(&self, request: &FailsafeRequest) -> Option<FailsafeRefusal> {
        if !self.failsafe {
            return Some(FailsafeRefusal::Off);
        }
        if request.node == self.id.node && request.machine == self.id.machine {
            return Some(FailsafeRefusal::Itself);
        }
        if self.mutations.is(Rule::FailsafeGrantBlind) {
            return None;
        }
        if self.role != Role::Standby {
            return Some(FailsafeRefusal::Role(self.role));
        }
        if self.acquisition_pending() || self.shutdown_awaits_swap {
            return Some(FailsafeRefusal::Acquiring);
        }
        let Some(seen) = &self.seen else {
            // Nothing read since the start: a grant only delays this
            // member (F4 already counts from the start), unless the token
            // is below one this host has seen (S6).
            return self
                .highest
                .is_some_and(|h| request.token < h)
                .then_some(FailsafeRefusal::Superseded);
        };
        if seen.absent_like {
            return Some(FailsafeRefusal::NoRecord);
        }
        match (&seen.observed, seen.entry) {
            (Some(Observed::Record(r)), Some(_))
                if r.node == request.node
                    && r.machine == request.machine
                    && r.instance == request.instance
                    && matches!(r.state, LockState::Confirming | LockState::Active) =>
            {
                None
            }
            (Some(Observed::Record(r)), Some((token, _))) => Some(FailsafeRefusal::Newest {
                node: r.node.clone(),
                state: r.state,
                token,
            }),
            _ => Some(FailsafeRefusal::NoRecord),
        }
    }

    /// A grant: the member saw the holder now. Its own-clock wait starts
    /// again (S1 a), and its store-clock witness counts from a probe sent
    /// after now (S1 b), so any check under way is abandoned.
    fn grant(&mut self) {
        let now = self.now;
        if let Some(seen) = &mut self.seen {
            if !self.mutations.is(Rule::FailsafeGrantKeepsWait) {
                seen.first_seen = now;
            }
            seen.leader_at = None;
        }
        // A probe sent before the grant may have been applied before it:
        // its late reply is ignored (`on_store` matches the pending id).
        if !self.mutations.is(Rule::FailsafeFloorFromEarlierProbe) {
            self.probe = None;
            self.probe_op = None;
        }
        if !self.mutations.is(Rule::FailsafeGrantKeepsFloor) {
            self.floor = Floor::Pending;
        }
    }

    // ----- a holder's side (F2, F3) -------------------------------------

    /// F2: the members as the host last reported them: each one with a
    /// machine id joins the set, and is remembered with the time it was
    /// last reported.
    pub(super) fn failsafe_members(&mut self, members: &[super::Candidate]) {
        let now = self.now;
        for c in members.iter().filter(|c| c.node != self.id.node) {
            let Some(machine) = c.machine.clone() else {
                continue;
            };
            let member = FailsafeMember {
                node: c.node.clone(),
                machine,
            };
            match self
                .holder_fs
                .members
                .iter_mut()
                .find(|(m, _)| *m == member)
            {
                Some((_, at)) => *at = now,
                None => self.holder_fs.members.push((member, now)),
            }
        }
    }

    /// F2: the set a write of ours in `state` carries — every member
    /// reported, until one has gone unreported for 10 R of which a write of
    /// ours that landed proves the holder could read the store (an outage
    /// never empties the set) — or none: in a release, without failsafe, or
    /// with nobody to ask (an ordinary record).
    pub(super) fn failsafe_set(&self, state: LockState) -> Option<FailsafeSet> {
        if !self.failsafe || state == LockState::Released {
            return None;
        }
        let gone = self.timing.renew() * 10;
        let landed = self.holder_fs.last_landed;
        let mut members: Vec<FailsafeMember> = self
            .holder_fs
            .members
            .iter()
            .filter(|(_, at)| landed.is_none_or(|l| l < *at + gone))
            .map(|(m, _)| m.clone())
            .collect();
        members.sort();
        (!members.is_empty()).then(|| FailsafeSet {
            members,
            max_ms: crate::record::ceil_millis(self.failsafe_max),
        })
    }

    /// F3 (H4): our write `write` carrying `set` was sent: until one lands,
    /// every member of any set sent may be in the newest record.
    pub(super) fn failsafe_sent(&mut self, write: String, set: Option<FailsafeSet>) {
        let fs = &mut self.holder_fs;
        for m in set.iter().flat_map(|s| &s.members) {
            if !fs.union.contains(m) {
                fs.union.push(m.clone());
            }
        }
        fs.sent.push((write, set));
    }

    /// The set our write `write` carried, if we sent one since the last
    /// that landed.
    pub(super) fn failsafe_written(&self, write: &str) -> Option<FailsafeSet> {
        self.holder_fs
            .sent
            .iter()
            .find(|(w, _)| w == write)
            .and_then(|(_, s)| s.clone())
    }

    /// A write of ours sent at `sent`, carrying `set`, landed: the store
    /// answers, the failsafe (if any) ends, and the cap counts from `sent`.
    /// After writes that did not land, the unreported time of the members
    /// still in the set starts again now: they could not be reported while
    /// the store did not answer, and a set emptied by the outage would
    /// leave the next one (moments later, before their records are read
    /// again) unprotected. `sent` may be the outage's start (a renewal
    /// whose answer was lost, found landed when the store answers), so
    /// the restart is at now.
    pub(super) fn failsafe_landed(&mut self, sent: Instant, set: Option<FailsafeSet>) {
        let gone = self.timing.renew() * 10;
        let now = self.now;
        let fs = &mut self.holder_fs;
        if fs.store_failed {
            let landed = fs.last_landed;
            for (_, at) in &mut fs.members {
                if landed.is_none_or(|l| l < *at + gone) {
                    *at = (*at).max(now);
                }
            }
        }
        fs.last_landed = Some(fs.last_landed.map_or(sent, |l| l.max(sent)));
        fs.store_failed = false;
        fs.round = None;
        fs.since = None;
        fs.landed = set.map(|s| s.members).unwrap_or_default();
        fs.union = fs.landed.clone();
        fs.sent.clear();
    }

    /// A renewal of ours failed or its outcome is unknown: the next healthy
    /// round asks the members (F1).
    pub(super) fn failsafe_store_failed(&mut self) {
        self.holder_fs.store_failed = true;
    }

    /// F3: in a healthy round of an active holder whose last renewal did
    /// not land, ask every member of the union, beside the round's store
    /// renewal — if every record of ours that may be the newest carries a
    /// set (F2). One without (written before any member was reported)
    /// makes no reader wait for the cap: the licence then ends as without
    /// failsafe.
    pub(super) fn failsafe_ask(&mut self) {
        if !self.failsafe
            || self.role != Role::Active
            || !self.holder_fs.store_failed
            || self.paused()
            || self.holder_fs.union.is_empty()
        {
            return;
        }
        if !self.holder_fs.every_newest_has_a_set()
            && !self.mutations.is(Rule::FailsafeAskWithoutRecordedSet)
        {
            return;
        }
        let Some(lease) = &self.lease else { return };
        if self.now >= lease.licence_end {
            return;
        }
        let token = lease.token;
        let fs = &mut self.holder_fs;
        fs.next_round += 1;
        let asked = if self.mutations.is(Rule::FailsafeAsksOnlyLanded) {
            fs.landed.clone()
        } else {
            fs.union.clone()
        };
        fs.round = Some(AskRound {
            number: fs.next_round,
            sent: self.now,
            asked: asked.clone(),
        });
        self.outputs.push_back(Output::FailsafeAsk {
            round: fs.next_round,
            token,
            members: asked,
            deadline: self.now + self.timing.store_timeout(),
        });
    }

    /// F3: a round every member of which granted extends the licence as a
    /// renewal would — to its send time + T — if the licence has not ended,
    /// and never past the last landed renewal + the cap. One member
    /// missing: nothing.
    pub(super) fn on_failsafe_verdicts(&mut self, round: u64, granted: &[FailsafeMember]) {
        let Some(r) = self.holder_fs.round.take_if(|r| r.number == round) else {
            return;
        };
        if !self.holding() || self.role != Role::Active {
            return;
        }
        let all = r.asked.iter().all(|m| granted.contains(m));
        // Switched off: any one grant is enough.
        let enough =
            all || (!granted.is_empty() && self.mutations.is(Rule::FailsafeExtendWithGrantMissing));
        if !enough {
            return;
        }
        let (Some(lease), Some(landed)) = (self.lease.as_mut(), self.holder_fs.last_landed) else {
            return;
        };
        if self.now >= lease.licence_end && !self.mutations.is(Rule::FailsafeReviveEndedLicence) {
            return; // H1: an ended licence is not revived
        }
        let cap = if self.mutations.is(Rule::FailsafeNoCap) {
            std::time::Duration::MAX / 4
        } else {
            self.failsafe_max
        };
        let end = (r.sent + self.timing.lease()).min(landed + cap);
        if end <= lease.licence_end {
            return;
        }
        lease.licence_end = end;
        self.holder_fs.since.get_or_insert(self.now);
        if self.keeper_may_extend() {
            self.outputs
                .push_back(Output::Keeper(KeeperCommand::Extend(end)));
        }
    }

    /// F2, the cap, for an absent-like record (S4, S6): a holder whose
    /// record the store lost may run on grants for up to its cap — the
    /// one the surviving record advertises, or this agent's own when it
    /// runs failsafe (every member of a failsafe lock does).
    pub(super) fn absent_cap(&self, record: Option<&LockRecord>) -> std::time::Duration {
        if self.mutations.is(Rule::FailsafeAbsentWithoutCap) {
            return std::time::Duration::ZERO;
        }
        let advertised = record
            .and_then(|r| r.failsafe.as_ref())
            .map_or(0, |s| s.max_ms);
        let own = if self.failsafe {
            self.failsafe_max
        } else {
            std::time::Duration::ZERO
        };
        std::time::Duration::from_millis(advertised).max(own)
    }

    /// Since when the licence runs on grants (F6), if it does.
    pub fn failsafe_since(&self) -> Option<Instant> {
        self.holder_fs.since
    }

    /// F2: a node outside the failsafe set of a held record it sees (or
    /// without failsafe) waits W over T + the cap the record advertises: by
    /// then a holder running on its members' grants has stopped.
    pub(super) fn outside_failsafe(&self, record: &LockRecord) -> Option<std::time::Duration> {
        let set = record.failsafe.as_ref()?;
        if record.state == LockState::Released || set.members.is_empty() {
            return None;
        }
        let me = FailsafeMember {
            node: self.id.node.clone(),
            machine: self.id.machine.clone(),
        };
        (!self.failsafe || !set.members.contains(&me))
            .then(|| std::time::Duration::from_millis(set.max_ms))
            .filter(|_| !self.mutations.is(Rule::FailsafeOutsiderWaitsOnlyW))
    }

    /// F1 (b), F4: a pending floor is probed for in the next standby round,
    /// not when a takeover is first considered: a floor taken only then
    /// would add W of the store's clock to the first failover after every
    /// start.
    pub(super) fn probe_floor(&mut self) {
        if self.floor == Floor::Pending {
            self.send_probe();
        }
    }

    /// F1 (b): a probe's result at store time `time` sets a pending floor;
    /// a floor the store's clock cannot be compared with any more (another
    /// era, a clock that went back) is taken again from `time`, which only
    /// delays the witness. Returns whether `time` became the floor.
    pub(super) fn note_floor(&mut self, time: StoreTime) -> bool {
        let take = match self.floor {
            Floor::None => false,
            Floor::Pending => true,
            Floor::Set(f) => !matches!(self.store_gap(time, f), StoreGap::Forward(_)),
        };
        if take {
            self.floor = Floor::Set(time);
        }
        take
    }

    /// F1 (b): the store-clock gap a probe at `probe` shows, measured from
    /// the later of the record's time `from_record` and the floor.
    pub(super) fn gap_with_floor(&self, probe: StoreTime, from_record: StoreGap) -> StoreGap {
        let Floor::Set(floor) = self.floor else {
            return from_record;
        };
        let StoreGap::Forward(since_floor) = self.store_gap(probe, floor) else {
            // `note_floor` re-takes such a floor; until then, no time.
            return StoreGap::Forward(std::time::Duration::ZERO);
        };
        match from_record {
            StoreGap::Forward(g) => StoreGap::Forward(g.min(since_floor)),
            StoreGap::Unbounded => StoreGap::Forward(since_floor),
            StoreGap::Backwards => StoreGap::Backwards,
        }
    }
}
