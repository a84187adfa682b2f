//! Store requests and what they carry: deadlines that never outlive the
//! licence (H5), the records this node writes, and the tokens it learns to
//! trust from its own writes and others' (S6).

use super::*;

impl Agent {
    /// H5: a store call's deadline never reaches past the licence (unless
    /// failover is paused: then the licence does not end the tenure, O2).
    pub(super) fn deadline(&self) -> Instant {
        let d = self.now + self.timing.store_timeout();
        match &self.lease {
            Some(_) if self.paused() => d,
            Some(l) => d.min(l.licence_end),
            None => d,
        }
    }

    pub(super) fn send_lock(&mut self, what: LockOp, deadline: Instant) {
        let id = self.op_id();
        let mut written = None;
        let op = match &what {
            LockOp::Poll => StoreOp::Get {
                key: Key::Lock,
                leader: false,
            },
            LockOp::Verify { .. } | LockOp::LeaderPoll => StoreOp::Get {
                key: Key::Lock,
                leader: true,
            },
            LockOp::Acquire { write, acquire, .. } => {
                let mut record = self.record_of(LockState::Confirming, write, Some(acquire));
                if self.mutations.is(Rule::AcquisitionInheritsSince) {
                    record.since = self.seen.as_ref().and_then(|s| {
                        let over = s.observed.as_ref().and_then(Observed::record);
                        over.and_then(|r| r.since).or(s.entry.map(|e| e.0))
                    });
                }
                let value = record.encode();
                written = Some((write.clone(), record.failsafe));
                match self.seen.as_ref().and_then(|s| s.entry) {
                    Some(_) if self.mutations.is(Rule::TakeoverByPut) => StoreOp::Put {
                        key: Key::Lock,
                        value,
                    },
                    Some((token, _)) => StoreOp::Update {
                        key: Key::Lock,
                        value,
                        expected: token,
                    },
                    None => StoreOp::Create {
                        key: Key::Lock,
                        value,
                    },
                }
            }
            LockOp::Renew { write, paused, .. } => {
                let paused = *paused;
                let state = if self.role == Role::Confirming {
                    LockState::Confirming
                } else {
                    LockState::Active
                };
                let acquire = self
                    .tenure
                    .as_ref()
                    .filter(|_| state == LockState::Confirming)
                    .map(|t| t.acquire.clone());
                let mut record = self.record_of(state, write, acquire.as_ref());
                if paused {
                    record.paused = self.operator.pause_to_write().cloned();
                }
                written = Some((write.clone(), record.failsafe.clone()));
                StoreOp::Update {
                    key: Key::Lock,
                    value: record.encode(),
                    expected: self.lease.as_ref().expect("renew needs a lease").token,
                }
            }
            LockOp::Release { write } => {
                self.release_writes.push(write.clone());
                StoreOp::Update {
                    key: Key::Lock,
                    value: self.release_record(write).encode(),
                    expected: self.lease.as_ref().expect("release needs a lease").token,
                }
            }
            LockOp::ReleaseRevoked { write, expected } => StoreOp::Update {
                key: Key::Lock,
                value: self.record(LockState::Released, write, None),
                expected: *expected,
            },
        };
        if matches!(op, StoreOp::Get { .. }) {
            self.trusted_at_read = self.trusted;
        }
        if let Some((write, set)) = written {
            self.failsafe_sent(write, set);
        }
        self.lock_op = Some(Pending { id, deadline, what });
        if self.recent_lock_ops.len() == RECENT_LOCK_OPS {
            self.recent_lock_ops.pop_front();
        }
        self.recent_lock_ops.push_back(id);
        self.outputs
            .push_back(Output::Store(StoreRequest { id, op, deadline }));
    }

    /// Our `released` record: to the switchover's target, if there is one
    /// (O1).
    pub(super) fn release_record(&self, write: &str) -> LockRecord {
        let mut record = self.record_of(LockState::Released, write, None);
        if let Some(handover) = self.operator.handover.clone() {
            record.hold_ms = ceil_millis(self.operator.defer);
            record.to = Some(handover.to);
            record.catch_up = handover.catch_up;
        }
        record
    }

    /// Our record; while confirming it advertises what the tenure still owes.
    pub(super) fn record(&self, state: LockState, write: &str, owed: Option<&Acquire>) -> Vec<u8> {
        self.record_of(state, write, owed).encode()
    }

    pub(super) fn record_of(
        &self,
        state: LockState,
        write: &str,
        owed: Option<&Acquire>,
    ) -> LockRecord {
        let (lease, gap) = match owed {
            Some(a) => (
                a.owed_lease.max(self.timing.lease()),
                a.owed_gap.max(self.timing.gap()),
            ),
            None => (self.timing.lease(), self.timing.gap()),
        };
        LockRecord {
            v: RECORD_VERSION,
            node: self.id.node.clone(),
            machine: self.id.machine.clone(),
            instance: self.id.instance.clone(),
            state,
            write: write.to_owned(),
            lease_ms: ceil_millis(lease),
            gap_ms: ceil_millis(gap),
            to: None,
            hold_ms: 0,
            catch_up: false,
            paused: None,
            since: self
                .tenure
                .as_ref()
                .map(|t| t.first)
                .filter(|_| !self.mutations.is(Rule::HoldingWithoutSince)),
            failsafe: self.failsafe_set(state),
        }
    }

    /// A write of ours landed at `token`: the store's present (S6), in a
    /// newer bucket incarnation too. A record merely *seen* in a newer
    /// incarnation is first judged as a re-created bucket (absent-like, see
    /// `on_lock_seen`); one we wrote there ourselves needs no such judging,
    /// and left untrusted it would make the next holder's record, seen after
    /// our tenure, look like a re-created bucket: taken at once (disturbing
    /// a live holder) and owing W + G' instead of W.
    pub(super) fn trust_own_write(&mut self, token: Token) {
        if self.trusted.is_none_or(|t| t < token) {
            self.trusted = Some(token);
        }
    }

    /// Remembers the highest token ever seen (S6).
    pub(super) fn note_token(&mut self, token: Token) {
        if self.highest.is_none_or(|h| token > h) {
            self.highest = Some(token);
            self.outputs.push_back(Output::PersistHighest(token));
        }
    }

    /// An entry seen by watch or read, in any role: the highest token, and
    /// the store's present as far as it is trusted (S6). A holder's view
    /// counts too: a record it saw while holding or stepping down that the
    /// store later loses must make the rolled-back record it shows then
    /// suspect, never a clean `released` to take at once.
    pub(super) fn note_entry(&mut self, entry: Option<&Entry>) {
        if let Some(e) = entry {
            self.note_token(e.token);
            // Only what arrives while an acquisition is on its way can be a
            // record the swap then displaces unseen (a judged record is never
            // below what was seen before it): no decoding on the hot path.
            if self.acquisition_pending() {
                let ours = matches!(Observed::decode(&e.value), Observed::Record(r) if r.instance == self.id.instance);
                if !ours {
                    self.note_foreign_while_acquiring(e.token);
                }
            }
            if self
                .trusted
                .is_none_or(|t| t.epoch == e.token.epoch && t < e.token)
                && !self.mutations.is(Rule::HolderViewUntrusted)
            {
                self.trusted = Some(e.token);
            }
        }
    }

    /// Every acquisition on its way, or of unknown outcome, remembers the
    /// newest foreign record seen meanwhile (S6, refinement (w)).
    pub(super) fn note_foreign_while_acquiring(&mut self, token: Token) {
        let pending = self.lock_op.as_mut().and_then(|p| match &mut p.what {
            LockOp::Acquire { acquire, .. } => Some(&mut **acquire),
            _ => None,
        });
        let unknown = self
            .unconfirmed
            .iter_mut()
            .filter_map(|u| u.acquire.as_mut());
        for acquire in pending.into_iter().chain(unknown) {
            if acquire.foreign_seen.is_none_or(|f| token > f) {
                acquire.foreign_seen = Some(token);
            }
        }
    }
}
