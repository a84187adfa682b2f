//! Failsafe, a member's side (F1, F4 in `docs/failsafe-design.md`).
//!
//! During a store outage a holder asks the other members of its lock
//! directly for a *grant*: a renewal delivered peer to peer. A member
//! grants only what it could have seen through the store — the newest
//! record it knows is the requester's own holding record — and only while
//! it is not holding, confirming or acquiring the lock itself. A grant is
//! then an observation of the holder, exactly as a new revision seen
//! through the store:
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
//! This module only *delays* a member's takeover; the holder's side (F3,
//! the licence extended by a round in which every member granted) is not
//! built yet, and nothing in `putex` sends requests: the design's status
//! says where the work stands.

use super::{Agent, Observed, Output, Role};
use crate::record::LockState;
use crate::store::{StoreGap, StoreTime};

pub use super::vocabulary::{FailsafeAnswer, FailsafeRefusal, FailsafeRequest};

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
        self.last_grant = Some(now);
        if let Some(seen) = &mut self.seen {
            seen.first_seen = now;
            seen.leader_at = None;
        }
        // A probe sent before the grant may have been applied before it:
        // its late reply is ignored (`on_store` matches the pending id).
        self.probe = None;
        self.probe_op = None;
        self.floor = Floor::Pending;
    }

    /// The time of the last grant this agent gave, or of its start with
    /// failsafe on (F4).
    pub fn last_grant(&self) -> Option<crate::time::Instant> {
        self.last_grant
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
