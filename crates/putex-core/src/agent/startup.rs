//! Start-up (S5): deactivating whatever a previous instance left, or
//! adopting its keeper and resuming, before the first round.

use super::*;

impl Agent {
    // ----- start-up (S5) -------------------------------------------------

    pub(super) fn start(&mut self, now: Instant) {
        let adopt = self
            .previous
            .as_ref()
            .and_then(|p| p.keeper_deadline.filter(|d| p.same_boot && now < *d));
        if adopt.is_some() {
            self.start_step = Some(StartStep::ReadForResume);
            self.send_lock(LockOp::LeaderPoll, self.now + self.timing.store_timeout());
        } else if self.previous.is_some() {
            self.start_step = Some(StartStep::ReadForPause);
            self.send_lock(LockOp::LeaderPoll, self.now + self.timing.store_timeout());
        } else {
            self.start_step = Some(StartStep::Deactivating);
            self.begin_stop(StopKind::Startup);
        }
    }

    pub(super) fn finish_start(&mut self) {
        self.start_step = None;
        self.set_role(Role::Standby, Reason::Started, None);
        self.next_round = self.now;
    }

    /// O2: called with the leader read made at start-up without a keeper to
    /// adopt. A record of this node (and machine) that says failover is
    /// paused is taken back without a start-up stop: nobody takes a paused
    /// record over, the operator owns the service, and stopping it because
    /// putex restarted (an upgrade, a crash, a reboot) is exactly what a
    /// pause promises not to do. The first renewal swaps it over the read
    /// revision, still paused; should the record have changed meanwhile (a
    /// forced resume), that swap fails and the node loses, stopping the
    /// service as any holder that lost would. Anything else: the start-up
    /// stop (S5).
    pub(super) fn resume_paused(&mut self, entry: Option<Entry>) {
        let ours = entry
            .as_ref()
            .and_then(|e| match Observed::decode(&e.value) {
                Observed::Record(r)
                    if r.node == self.id.node
                        && r.machine == self.id.machine
                        && r.state == LockState::Active =>
                {
                    r.paused
                        .clone()
                        .map(|pause| (e.token, r.write.clone(), pause, r.since))
                }
                _ => None,
            });
        let Some((token, write, pause, since)) = ours else {
            self.start_step = Some(StartStep::Deactivating);
            self.begin_stop(StopKind::Startup);
            return;
        };
        // No licence to hold: while paused none ends the tenure (O2); the
        // first renewal that lands starts one for a later resume.
        let lease = Lease {
            token,
            write,
            sent: self.now,
            licence_end: self.now,
        };
        self.take_back(lease, KeeperArm::NotArmed, since);
        // The tenure goes on: nothing to rejoin (O4).
        self.operator.rejoin_needed = false;
        self.set_role(Role::Active, Reason::ResumedPaused, Some(token));
        self.enter_paused(pause, false);
        self.renew_now();
    }

    /// S5/O2: this host's earlier tenure, found on record, goes on under
    /// this instance with the service up, on `lease`, the keeper holding
    /// `keeper`; the earlier instance has no more say.
    /// `since` is what the record found says of the tenure's first write.
    pub(super) fn take_back(&mut self, lease: Lease, keeper: KeeperArm, since: Option<Token>) {
        let token = lease.token;
        self.note_token(token);
        self.lease = Some(lease);
        self.tenure = Some(Tenure {
            acquire: self.resume_acquire(),
            activate_at: self.now,
            floor: None,
            active_token: Some(token),
            first: since
                .filter(|s| s.epoch == token.epoch && *s <= token)
                .unwrap_or(token),
            service: Service::Up {
                grace_until: self.now,
            },
            keeper,
            let_go: false,
        });
        self.start_step = None;
        self.previous = None;
    }

    /// An acquisition that resumes this host's earlier tenure (S5): it owes
    /// the own T and G, nothing more.
    pub(super) fn resume_acquire(&self) -> Acquire {
        Acquire {
            kind: AcquireKind::Resume,
            owed_lease: self.timing.lease(),
            owed_gap: self.timing.gap(),
            previous: None,
            evidence: None,
            floor: None,
            reused: false,
            foreign_seen: None,
            over: None,
        }
    }

    /// Called with the leader read made at start-up when a keeper was adopted.
    pub(super) fn resume_with_keeper(&mut self, entry: Option<Entry>) {
        let prev = self
            .previous
            .clone()
            .expect("resume needs a previous instance");
        let deadline = prev.keeper_deadline.expect("resume needs a keeper");
        let ours = entry
            .as_ref()
            .and_then(|e| match Observed::decode(&e.value) {
                Observed::Record(r)
                    if r.instance == prev.instance
                        && r.node == self.id.node
                        && r.state == LockState::Active =>
                {
                    Some((e.token, r))
                }
                _ => None,
            });
        match ours {
            Some((token, record)) if self.now < deadline => {
                // The service kept running under the keeper: carry on renewing.
                let lease = Lease {
                    token,
                    write: record.write,
                    sent: deadline - self.timing.lease(),
                    licence_end: deadline,
                };
                self.take_back(lease, KeeperArm::Armed { until: deadline }, record.since);
                self.set_role(Role::Active, Reason::Resumed, Some(token));
                // O2: a paused record whose keeper was not disarmed yet (the
                // agent died in between) stays paused, and the keeper lets go.
                if let Some(pause) = record.paused {
                    self.enter_paused(pause, true);
                }
                self.renew_now();
            }
            _ => {
                // Not ours any more: the adopted keeper's service must stop.
                self.start_step = Some(StartStep::Deactivating);
                self.begin_stop(StopKind::Startup);
            }
        }
    }
}
