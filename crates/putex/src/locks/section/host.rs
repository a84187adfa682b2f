//! The host of a section's slot agents: one per slot, sharing one keeper
//! and one CMD; the first slot to arm the keeper wins and CMD runs under it.

use super::once::{claim_period, done_in, period_key, record_once};
use super::shared::Shared;
use super::*;

pub(super) struct SlotHost {
    pub(super) slot: usize,
    pub(super) shared: Arc<Shared>,
    /// The slot's record's host state (S6: the highest token seen).
    pub(super) highest: HostState,
    /// The slot's lock key for its transition records, when it is not
    /// `lock.<name>` (a semaphore slot).
    pub(super) record_key: Option<String>,
    /// Transition records made before any slot won: written if this slot
    /// wins (arms the keeper first), dropped otherwise.
    pub(super) pending: Mutex<Vec<TransitionRecord>>,
}

impl SlotHost {
    /// Writes the winner's transition records; keeps them while no slot
    /// has won yet.
    fn record(&self, from: Role, to: Role, reason: &Reason, token: Option<Token>) {
        let Some(rec) =
            self.shared
                .history
                .record(from, to, reason, token, self.record_key.as_deref())
        else {
            return;
        };
        let winner = self.shared.lock().winner;
        let mut pending = self.pending.lock();
        match winner {
            Some(w) if w == self.slot => self.shared.history.send(rec),
            Some(_) => pending.clear(),
            // Back to standby before winning: nothing ran under this slot.
            None if to == Role::Standby => pending.clear(),
            None => pending.push(rec),
        }
    }
}

impl Host for SlotHost {
    fn health_check(&self, _: HealthMode, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool> {
        if !self.shared.is_winner(self.slot) {
            // Another slot of ours runs CMD: fail the activation, which
            // releases this slot (step-down, H6), and stop this agent.
            self.shared.with(|s| s.losers.push(self.slot));
            return future::ready(false).boxed();
        }
        self.shared.with(|s| s.activating = true);
        let shared = self.shared.clone();
        let slot = self.slot;
        async move {
            let o = &shared.opts;
            let timeout = o.timing.store_timeout();
            if let Some(once) = &o.once {
                // Store calls whose outcome is unknown are retried until
                // then, leaving time to start CMD.
                let left = clock::until(deadline);
                let until = tokio::time::Instant::now() + left - (left / 4).min(Duration::from_secs(5));
                let period = match period_key(&shared.store, once, &o.node, timeout, until).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the store's clock for --once-per; not running");
                        shared.with(|s| s.spawn_failed = Some(format!("once-per period: {e}")));
                        return false;
                    }
                };
                let checked = match o.once_mode {
                    OnceMode::AtLeast => {
                        patiently(until, timeout, |t| done_in(&shared.store, &o.name, &period, t))
                            .await
                    }
                    OnceMode::AtMost => claim_period(&shared, &period, token, until).await,
                };
                match checked {
                    Ok(Some(by)) => {
                        shared.with(|s| s.already_done = Some((period, by)));
                        return false;
                    }
                    Ok(None) => shared.with(|s| s.period = Some(period)),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read or claim the once-per record; not running");
                        shared.with(|s| s.once_failed = Some(e));
                        return false;
                    }
                }
            }
            let mut env = vec![
                ("PUTEX_LOCK".to_string(), o.name.to_string()),
                ("PUTEX_NODE".to_string(), o.node.to_string()),
                ("PUTEX_TOKEN".to_string(), token.to_string()),
                ("PUTEX_REVISION".to_string(), token.revision.to_string()),
                ("PUTEX_EPOCH".to_string(), token.epoch.to_string()),
            ];
            if let Some(slots) = &o.slots {
                env.push((slots.var.clone(), slots.values[slot].clone()));
            } else if o.limit > 1 {
                env.push(("PUTEX_SLOT".into(), slot.to_string()));
            }
            if let Some(p) = previous {
                env.push(("PUTEX_PREVIOUS".into(), p));
            }
            if let Some(t) = &o.title {
                env.push(("PUTEX_TITLE".into(), t.clone()));
            }
            if let Some(socket) = &shared.kv_socket {
                env.push((
                    super::kv::KV_SOCKET_VAR.into(),
                    socket.display().to_string(),
                ));
            }
            env.extend(o.env.iter().cloned());
            shared.with(|s| s.spawning = Some(token));
            let spawned = shared
                .ops
                .spawn_child(o.argv.clone(), env, Box::new(|| true));
            let result = tokio::time::timeout(clock::until(deadline), spawned).await;
            match result {
                Ok(Ok((pid, tree))) => {
                    tracing::debug!(pid, ?tree, "command started");
                    shared.with(|s| {
                        s.spawned = Some(token);
                        s.spawned_at = Some(tokio::time::Instant::now());
                    });
                    true
                }
                Ok(Err(e)) => {
                    shared.with(|s| s.spawn_failed = Some(e));
                    false
                }
                _ => {
                    shared.with(|s| s.spawn_failed = Some("the keeper did not answer".into()));
                    false
                }
            }
        }
        .boxed()
    }

    fn stop(&self, kind: StopKind, deadline: Instant) -> BoxFuture<'static, bool> {
        // Start-up stops: the keeper is new, nothing runs. A slot that did
        // not win never ran anything.
        if kind == StopKind::Startup || !self.shared.is_winner(self.slot) {
            return future::ready(true).boxed();
        }
        let shared = self.shared.clone();
        async move {
            let work = async {
                shared.ops.barrier().await;
                match shared.keeper.stop(kind).await {
                    Ok(ok) => ok,
                    // The keeper died (OOM): stop CMD's tree without it,
                    // from the keeper's last snapshot, and prove it gone.
                    // The lock is kept (renewed) until then.
                    Err(crate::supervision::keeper::KeeperError::Lost) => {
                        tracing::error!("the keeper is gone: stopping the command without it");
                        shared
                            .keeper
                            .stop_tree_without_keeper(clock::until(deadline))
                            .await
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the keeper could not stop the command");
                        false
                    }
                }
            };
            let limit = clock::until(deadline) + Duration::from_millis(100);
            let ok = tokio::time::timeout(limit, work).await.unwrap_or(false);
            tracing::debug!(ok, ?kind, "the command's stop finished");
            if ok && kind == StopKind::Graceful {
                record_once(&shared, deadline).await;
            }
            ok
        }
        .boxed()
    }

    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool> {
        let forward = self.shared.with(|s| match (command, s.winner) {
            (KeeperCommand::Arm(_), None) => {
                s.winner = Some(self.slot);
                true
            }
            (_, Some(w)) => w == self.slot,
            (_, None) => false,
        });
        let answer = if forward {
            let shared = self.shared.clone();
            let sent = self.shared.ops.command(command, None, None);
            async move {
                let ok = sent.await;
                if ok {
                    shared.with(|s| {
                        s.licence_until = match command {
                            KeeperCommand::Arm(at) | KeeperCommand::Extend(at) => Some(at),
                            KeeperCommand::Disarm => None,
                        }
                    });
                }
                ok
            }
            .boxed()
        } else {
            // Another slot of ours won: this one's activation fails and
            // releases the slot (see `activate`); its keeper is the
            // winner's.
            future::ready(true).boxed()
        };
        if matches!(command, KeeperCommand::Arm(_)) && self.shared.is_winner(self.slot) {
            let won = std::mem::take(&mut *self.pending.lock());
            for rec in won {
                self.shared.history.send(rec);
            }
        }
        answer
    }

    fn lock_written(&self, token: Token, value: &[u8]) {
        let held = crate::locks::guard::record_holds(value);
        // No wake-up: the section's loop has nothing to do with it.
        let mut s = self.shared.lock();
        let newer = s.records.get(&self.slot).is_none_or(|(t, _)| *t < token);
        if newer {
            s.records.insert(self.slot, (token, held));
        }
    }

    fn persist_highest(&self, token: Token) {
        let file = self.highest.clone();
        let write = tokio::task::spawn_blocking(move || {
            if let Err(e) = file.raise(token) {
                tracing::warn!(path = %file.path().display(), error = %e, "cannot record the highest token");
            }
        });
        let mut writes = self.shared.persisting.lock();
        writes.retain(|w| !w.is_finished());
        writes.push(write);
    }

    fn event(&self, event: &Event) {
        match event {
            Event::Transition {
                from,
                to,
                reason,
                token,
            } => {
                tracing::debug!(slot = self.slot, %from, %to, %reason, "transition");
                self.shared.with(|s| {
                    // The first slot of ours to take a released record is
                    // the one to run CMD under: the others stop competing
                    // at once, instead of taking slots that other clients
                    // wait for only to give them back. (One taken from an
                    // absent or stale record owes a fencing gap first: a
                    // released slot may still beat it.) Lost before
                    // activating, it claims nothing.
                    let released =
                        matches!(reason, Reason::AcquiredReleased | Reason::AcquiredHandover);
                    if *to == Role::Confirming && released {
                        s.claimed.get_or_insert(self.slot);
                    } else if matches!(to, Role::Standby | Role::Lapsed)
                        && s.claimed == Some(self.slot)
                        && !s.activating
                    {
                        s.claimed = None;
                    }
                });
                self.record(*from, *to, reason, *token);
                let winner = self.shared.is_winner(self.slot);
                if !winner {
                    return;
                }
                match (from, to) {
                    (Role::Active | Role::Confirming, Role::Lapsed | Role::Standby) => {
                        let ours = matches!(
                            reason,
                            Reason::Released | Reason::ReleaseFailed | Reason::ActivationFailed
                        ) || matches!(reason, Reason::Shutdown);
                        self.shared.with(|s| {
                            if !s.activating && !ours {
                                // Lost before activating (the fencing gap):
                                // nothing ran; let any slot try again.
                                tracing::info!(%reason, "lost the lock before running; waiting again");
                                s.winner = None;
                            } else if !ours && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| reason.to_string());
                            }
                        });
                    }
                    (Role::SteppingDown, Role::Standby | Role::Lapsed) => {
                        self.shared.with(|s| {
                            if matches!(reason, Reason::Released) {
                                s.released = true;
                            } else if !matches!(reason, Reason::ReleaseFailed) && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| reason.to_string());
                            }
                        });
                    }
                    _ => {}
                }
            }
            Event::StoreRegressed { highest, now } => tracing::error!(
                %highest,
                %now,
                "STORE REGRESSED: the lock record's revision went backwards; treating the lock \
                 as absent (S6)"
            ),
            Event::AdvertisedTimingAboveMax(msg) => tracing::warn!("{msg}"),
            Event::StopUnproven {
                kind,
                attempts,
                holding,
            } => {
                if let Some(m) = &self.shared.opts.metrics {
                    m.stop_unproven(true);
                }
                tracing::error!(
                    slot = self.slot,
                    kind = crate::supervision::hooks::stop_name(*kind),
                    attempts,
                    holding,
                    "STOP UNPROVEN: the command's processes may still run; retrying the kill{}",
                    if *holding {
                        " and keeping the lock"
                    } else {
                        ""
                    }
                )
            }
            // Operator controls are for `putex run`; a section never
            // receives the inputs that lead to these.
            Event::SwitchoverRefused { .. }
            | Event::Paused(_)
            | Event::Unpaused
            | Event::ResumeRefused
            | Event::Rejoined => {}
            Event::AbsentWait { wait, why } => {
                // Once per run, not once per semaphore slot.
                if !self
                    .shared
                    .with(|s| std::mem::replace(&mut s.absent_wait_said, true))
                {
                    tracing::warn!(
                        slot = self.slot,
                        "{:?} taken; waiting {:.1} s before running the command: {}",
                        self.shared.opts.name.as_str(),
                        wait.as_secs_f64(),
                        why.explain()
                    );
                }
            }
            Event::StopProven { after } => {
                if let Some(m) = &self.shared.opts.metrics {
                    m.stop_unproven(false);
                }
                tracing::warn!(
                    slot = self.slot,
                    after,
                    "the command is proven stopped after all"
                );
            }
        }
    }

    fn metrics(&self) -> Option<&crate::observe::metrics::Metrics> {
        self.shared.opts.metrics.as_ref()
    }
}

/// Keeps [`State::free`] from a watch of every slot's record while the
/// section runs (the caller aborts it at the end), so that the section
/// competes for one released slot at a time ([`State::preferred_slot`]).
/// A watch that fails or ends leaves the view unknown — every slot
/// competes, as without it — and all are started again after a pause.
pub(super) async fn watch_free_slots(shared: Arc<Shared>, keys: Vec<String>, timeout: Duration) {
    use futures::StreamExt;
    loop {
        let started = future::join_all(keys.iter().map(|k| shared.store.watch(k, None, timeout)));
        match started.await.into_iter().collect::<Result<Vec<_>, _>>() {
            Ok(streams) => {
                // Released means taken at once (S3). An absent record
                // (never delivered) or a deleted one is not: taking it
                // waits out the first-use wait (S4), and a holder's
                // staleness is for its slot's agent to judge.
                shared.with(|s| s.free = Some(vec![false; keys.len()]));
                // Each stream ends with a marker: the contract lets a watch
                // end, and one that did would freeze its slot's view.
                let mut events = futures::stream::select_all(streams.into_iter().enumerate().map(
                    |(slot, s)| {
                        (s.map(Some)
                            .chain(futures::stream::once(future::ready(None))))
                        .map(move |e| (slot, e))
                    },
                ));
                while let Some((slot, Some(Ok(event)))) = events.next().await {
                    let free = event.entry.is_some_and(|entry| {
                        matches!(Observed::decode(&entry.value),
                            Observed::Record(r) if r.state == LockState::Released)
                    });
                    shared.with(|s| {
                        if let Some(f) = s.free.as_mut() {
                            f[slot] = free;
                        }
                    });
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot watch the slots; every slot competes"),
        }
        shared.with(|s| s.free = None);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where a section starts looking among the free slots
/// ([`State::spread`]): a number of its own, from its instance name.
pub(super) fn spread_of(instance: &str) -> usize {
    instance.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    })
}
