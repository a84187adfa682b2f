//! The checkers: what must hold at every step of every run.
//!
//! - (a) never two nodes with the service running at the same real instant;
//! - (b) fencing tokens of successive activations strictly increase, and no
//!   node activates on a token at or below one it saw before its tenure
//!   (after a store rollback, a regression is allowed only for a node that
//!   never saw the higher token: nothing can tell it);
//! - (c) liveness: after the active host crashes in calm conditions, some
//!   node activates within the failover bound;
//! - (d) no node activates earlier than its own rules allow on its own clock;
//! - (e) in runs with only jitter below the budget, nothing changes after the
//!   first activation;
//! - (f) a service starts only while its host's keeper is alive and armed
//!   with a deadline in the future: nobody else would stop it at the
//!   deadline if the agent froze (checked in `world.rs`, at activation).
//! - (g) O3/O4: a node with priority 0, or one that has not rejoined after
//!   an unclean tenure, never takes the lock (`world.rs`, at acquisition);
//! - (h) O1: a release handed to another node is not taken within its
//!   hold on the taker's clock ([`handover_respected`]);
//! - (j) O5: a failback happens only after its target was ready, without
//!   a break, for the whole hold-down, as the holder heard it (`world.rs`);
//! - (i) O2: a running service's keeper is disarmed only once a paused
//!   record of its tenure landed, and an unpaused record goes over a
//!   paused one only while the keeper is armed again (`world.rs`);
//! - (k) the token check (`LockRecord::holds_token`, behind `GET
//!   /v1/locks/{name}/check`) says "held" for exactly the tokens of the
//!   holding that wrote the store's current record, if it is `confirming`
//!   or `active` (`world.rs`, at every lock write, delete and activation).
//!
//! Each check has a mutation test in `main.rs` proving it can fail.

use std::collections::HashMap;

use putex_core::{LockState, Observed, Reason, Role, Token};

use crate::scenario::{Scenario, MS};
use crate::world::World;

#[derive(Default, Clone, Debug)]
pub struct Stats {
    pub activations: u64,
    pub liveness_checked: u64,
    pub worst_failover: u64,
    pub worst_failover_ratio: f64,
    /// Activations after a store rollback the node could not have seen.
    pub unwitnessed_rollbacks: u64,
}

pub struct Checker {
    pub violation: Option<String>,
    pub rollback_happened: bool,
    /// Real-time bound for check (c), in nanoseconds.
    pub failover_bound: u64,
    expect_no_transitions: bool,
    last_token: Option<Token>,
    confirming_host: Option<usize>,
    seen_transitions: Vec<(usize, Role, Role)>,
    windows: HashMap<u64, u64>,
    pub stats: Stats,
}

impl Checker {
    pub fn new(sc: &Scenario) -> Checker {
        let eps = u64::from(sc.drift.ppm());
        let timings: Vec<_> = sc
            .timings
            .iter()
            .map(|t| t.validate().expect("valid"))
            .collect();
        let max_t = timings.iter().map(|t| t.lease()).max().expect("hosts");
        let max_g = timings.iter().map(|t| t.gap()).max().expect("hosts");
        let max_r = timings.iter().map(|t| t.renew()).max().expect("hosts");
        let max_st = timings
            .iter()
            .map(|t| t.store_timeout())
            .max()
            .expect("hosts");
        // Failsafe (F2): a standby outside the set of the record it judges
        // waits W over T + the cap.
        let cap = sc.failsafe_max;
        let local = timings
            .iter()
            .map(|t| t.staleness_wait(t.lease_against(max_t) + cap) + t.gap_against(max_g))
            .max()
            .expect("hosts")
            + max_r * 3;
        let local = local.as_nanos() as u64;
        let real = (u128::from(local) * 1_000_000 / u128::from(1_000_000 - eps)) as u64;
        // O3: a node that defers to a better candidate (perhaps one that
        // just died) acts D later.
        let defer = if sc.operator {
            max_r.as_nanos() as u64 * 2
        } else {
            0
        };
        // A store clock that reads in steps (etcd) holds the witness up to
        // two steps and a probe period longer, and an outranked standby
        // defers by the two steps too.
        let stepped = if sc.store_step.is_zero() {
            0
        } else {
            let steps = sc.store_step.as_nanos() as u64 * 2;
            steps + max_r.as_nanos() as u64 + if sc.operator { steps } else { 0 }
        };
        let failover_bound =
            real + defer + stepped + 6 * max_st.as_nanos() as u64 + sc.watch_delay.1 + 100 * MS;
        Checker {
            violation: None,
            rollback_happened: false,
            failover_bound,
            expect_no_transitions: sc.expect_no_transitions,
            last_token: None,
            confirming_host: None,
            seen_transitions: Vec::new(),
            windows: HashMap::new(),
            stats: Stats::default(),
        }
    }

    pub fn fail(&mut self, check: &str, now: u64, msg: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("({check}) at {:.4}s: {msg}", now as f64 / 1e9));
        }
    }

    /// (b) at an activation.
    pub fn token(&mut self, h: usize, token: Token, before_tenure: Option<Token>, now: u64) {
        if let Some(m) = before_tenure {
            if token <= m {
                self.fail(
                    "b/regressed",
                    now,
                    format!("h{h} activates on token {token:?}, not above {m:?} it saw before"),
                );
            }
        }
        if let Some(last) = self.last_token {
            let unwitnessed = self.rollback_happened && before_tenure.is_none_or(|m| m < last);
            if token <= last && !unwitnessed {
                self.fail(
                    "b/order",
                    now,
                    format!("h{h} activates on token {token:?} after an activation on {last:?}"),
                );
            }
        }
    }

    pub fn activated(&mut self, _h: usize, token: Token, now: u64) {
        self.last_token = Some(token);
        self.stats.activations += 1;
        let closed: Vec<(u64, u64)> = self.windows.drain().collect();
        for (_, opened) in closed {
            let took = now - opened;
            self.stats.liveness_checked += 1;
            self.stats.worst_failover = self.stats.worst_failover.max(took);
            self.stats.worst_failover_ratio = self
                .stats
                .worst_failover_ratio
                .max(took as f64 / self.failover_bound as f64);
        }
    }

    /// (e) in runs where nothing may change.
    pub fn transition(&mut self, h: usize, from: Role, to: Role, reason: &Reason, now: u64) {
        if !self.expect_no_transitions {
            return;
        }
        let first_time = !self.seen_transitions.contains(&(h, from, to));
        self.seen_transitions.push((h, from, to));
        let allowed = match (from, to) {
            (Role::Starting, Role::Standby) => first_time,
            (Role::Standby, Role::Confirming) => {
                first_time && *self.confirming_host.get_or_insert(h) == h
            }
            (Role::Confirming, Role::Active) => first_time,
            _ => false,
        };
        if !allowed {
            self.fail(
                "e/transition",
                now,
                format!("h{h} {from} -> {to} ({reason:?}) in a run with only jitter"),
            );
        }
    }

    pub fn open_liveness(&mut self, id: u64, now: u64, _crashed: usize) {
        self.windows.insert(id, now);
    }

    pub fn liveness_deadline(&mut self, id: u64, now: u64) {
        if let Some(opened) = self.windows.remove(&id) {
            self.fail(
                "c/liveness",
                now,
                format!(
                    "no activation within the failover bound {:.3}s after the active host crashed at {:.3}s",
                    self.failover_bound as f64 / 1e9,
                    opened as f64 / 1e9
                ),
            );
        }
    }

    pub fn finish(&mut self, _now: u64) {}
}

/// (d): the earliest local time at which host `h` may activate, by the rules
/// it is bound by, judged from what the simulation delivered to it.
pub fn earliest_activation(w: &World, h: usize, local: u64) -> Result<(), String> {
    let host = &w.hosts[h];
    let t = &host.timing;
    let tenure = host.tenure_token.ok_or("activated without acquiring")?;
    // A rollback can reuse a revision: match the writer too.
    let applied = w
        .store
        .log
        .iter()
        .rev()
        .find(|a| {
            a.token == tenure
                && matches!(Observed::decode(&a.value), Observed::Record(r) if r.instance == host.instance)
        })
        .ok_or("tenure write not in the store log")?;
    let ack = host.tenure_ack.ok_or("no acquisition time")?;
    let secs = |n: u64| n as f64 / 1e9;
    let wait = |d: std::time::Duration| d.as_nanos() as u64;
    let Some(prev) = &applied.prev else {
        // S4: created over an absent record.
        let since = host
            .absent_before_tenure
            .ok_or("created a record it never saw absent")?;
        // Less what the store proved of the key's vacancy (S4 refined).
        let vacant_for = host.vacancy_given.get(&tenure).copied().unwrap_or_default();
        let owed =
            (t.staleness_wait(t.lease_unknown()) + t.gap_unknown()).saturating_sub(vacant_for);
        let need = since + wait(owed);
        return if local >= need {
            Ok(())
        } else {
            Err(format!(
                "activated at {:.3}s over an absent record first seen at {:.3}s: S4 needs {:.3}s",
                secs(local),
                secs(since),
                secs(need)
            ))
        };
    };
    let observed = Observed::decode(&prev.value);
    if let Observed::Record(r) = &observed {
        if r.state == LockState::Released {
            // S3 over a release; H6 says it must have been written with proof.
            let proven = w
                .store
                .log
                .iter()
                .rev()
                .find(|a| a.token == prev.token && a.value == prev.value)
                .is_some_and(|a| a.proven);
            return if proven {
                Ok(())
            } else {
                Err(format!(
                    "activated over a released record {:?} by {} written without proof (H6)",
                    prev.token, r.instance
                ))
            };
        }
        if Some(&r.instance) == host.previous_instance.as_ref() && r.state == LockState::Active {
            // S5: resuming the previous instance's tenure after G.
            let need = ack + wait(t.gap());
            return if local >= need {
                Ok(())
            } else {
                Err(format!(
                    "resumed and activated before G (S5) at {:.3}s",
                    secs(local)
                ))
            };
        }
    }
    let (lease, gap) = match &observed {
        Observed::Record(r) => (t.lease_against(r.lease()), t.gap_against(r.gap())),
        Observed::Garbage => (t.lease_unknown(), t.gap_unknown()),
    };
    let key = (prev.token, crate::world::fingerprint(&prev.value));
    let first = *host
        .first_seen
        .get(&key)
        .ok_or_else(|| format!("took over record {:?} that it never saw (S1)", prev.token))?;
    let stale_need = (first + wait(t.staleness_wait(lease) + gap)).max(ack + wait(gap));
    let regressed = host.regressed.contains(&prev.token);
    let (absent_lease, absent_gap) = match &observed {
        Observed::Record(r) => (
            t.lease_unknown().max(r.lease()),
            t.gap_unknown().max(r.gap()),
        ),
        Observed::Garbage => (t.lease_unknown(), t.gap_unknown()),
    };
    let absent_need = first + wait(t.staleness_wait(absent_lease) + absent_gap);
    if local >= stale_need || (regressed && local >= absent_need) {
        Ok(())
    } else {
        Err(format!(
            "activated at {:.3}s over {:?} first seen at {:.3}s (T'={:?}, G'={:?}): S1/S2 need {:.3}s",
            secs(local),
            prev.token,
            secs(first),
            lease,
            gap,
            secs(stale_need)
        ))
    }
}

/// (h): host `h` took the lock at `local` (its clock); if it was over a
/// release handed to another node, the hold must have passed since it
/// first saw that release.
pub fn handover_respected(w: &World, h: usize, local: u64) -> Result<(), String> {
    let host = &w.hosts[h];
    let Some(tenure) = host.tenure_token else {
        return Ok(());
    };
    let Some(applied) = w.store.log.iter().rev().find(|a| {
        a.token == tenure
            && matches!(Observed::decode(&a.value), Observed::Record(r) if r.instance == host.instance)
    }) else {
        return Ok(());
    };
    let Some(prev) = &applied.prev else {
        return Ok(());
    };
    let Observed::Record(r) = Observed::decode(&prev.value) else {
        return Ok(());
    };
    let me = format!("node{h}");
    let Some(to) =
        r.to.as_ref()
            .filter(|to| r.state == LockState::Released && **to != me)
    else {
        return Ok(());
    };
    let key = (prev.token, crate::world::fingerprint(&prev.value));
    let Some(first) = host.first_seen.get(&key) else {
        return Err(format!("took a release handed to {to} that it never saw"));
    };
    let hold = r.hold().as_nanos() as u64;
    if local < first + hold {
        return Err(format!(
            "took a release handed to {to} {:.3}s after first seeing it, within its hold of {:.3}s (O1)",
            (local - first) as f64 / 1e9,
            hold as f64 / 1e9
        ));
    }
    Ok(())
}
