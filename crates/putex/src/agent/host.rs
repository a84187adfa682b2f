//! The agent's [`Host`]: what the core asks for, carried out.
//!
//! Health checks and the fence/activate hooks run through [`HookRunner`];
//! stops and the licence deadline go through the keeper (which owns the
//! child in child mode and runs the deactivate hook in hook mode), in the
//! core's order through one queue ([`keeper_ops`]); the highest token and
//! the service's tree go into the host state file; transitions into the log,
//! the member record and a transition record.

use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use putex_core::{
    Blocker, Event, HealthMode, Instant, KeeperCommand, Reason, Role, StopKind, Token,
};

use super::settings::ServiceMode;
use super::state::{AgentHost, STOP_SLACK};
use crate::clock;
use crate::driver::Host;
use crate::host_state::HostState;
use crate::observe::metrics::Metrics;
use crate::supervision::hooks::{health_arg, HookKind};
use crate::supervision::process::TreeSnapshot;

impl Host for AgentHost {
    fn health_check(&self, mode: HealthMode, deadline: Instant) -> BoxFuture<'static, bool> {
        let Some(cmd) = self.inner.settings.healthcheck.clone() else {
            return futures::future::ready(true).boxed();
        };
        let env = self.env(None);
        let timeout = clock::until(deadline).min(self.inner.settings.timing.healthcheck_timeout());
        let this = self.clone();
        async move {
            let ok = Self::run_hook(
                &this.inner,
                HookKind::Health,
                &cmd,
                &env,
                Some(health_arg(mode)),
                timeout,
            )
            .await;
            this.inner.metrics.health_check(health_arg(mode), ok);
            let changed = this.set(|st| {
                let changed = st.healthy != Some(ok);
                st.healthy = Some(ok);
                st.last_health = Some(format!(
                    "{} {}",
                    health_arg(mode),
                    if ok { "ok" } else { "failed" }
                ));
                changed
            });
            if changed {
                tracing::info!(mode = health_arg(mode), ok, "health changed");
                this.inner.member_dirty.notify_one();
            }
            ok
        }
        .boxed()
    }

    fn fence(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool> {
        self.set(|st| st.previous.clone_from(&previous));
        let fence = match &self.inner.settings.service {
            Some(ServiceMode::Hooks { fence, .. } | ServiceMode::Child { fence, .. }) => {
                fence.clone()
            }
            None => None,
        };
        let env = self.env(Some(token));
        let inner = self.inner.clone();
        let mut stops = self.inner.stops.subscribe();
        async move {
            // A follow hook started while this node was a standby was told
            // to stop when it left standby (`follow_stop`): nothing starts
            // before it is over, or it could stop or rewind the service
            // this node is about to run. It holds `resync` while it runs.
            let followed = tokio::time::timeout(clock::until(deadline), inner.resync.lock()).await;
            if followed.is_err() {
                tracing::error!("a follow or rejoin hook was still running at the fence's deadline");
                return false;
            }
            drop(followed);
            let Some(cmd) = fence else {
                return true;
            };
            tokio::select! {
                ok = Self::run_hook(&inner, HookKind::Fence, &cmd, &env, None, clock::until(deadline)) => ok,
                _ = stops.changed() => false,
            }
        }
        .boxed()
    }

    fn activate(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool> {
        self.set(|st| st.previous.clone_from(&previous));
        let env = self.env(Some(token));
        let inner = self.inner.clone();
        let mut stops = self.inner.stops.subscribe();
        let stops_seen = *stops.borrow_and_update();
        let up = self.inner.clone();
        let activation = match self.inner.settings.service.clone() {
            Some(ServiceMode::Hooks { activate, .. }) => async move {
                tokio::select! {
                    ok = Self::run_hook(&inner, HookKind::Activate, &activate, &env, None, clock::until(deadline)) => ok,
                    // A stop cancels the activation (the hook is killed); the
                    // deactivate hook then runs through the keeper.
                    _ = stops.changed() => false,
                }
            }
            .boxed(),
            Some(ServiceMode::Child { argv, .. }) => {
                let vars: Vec<(String, String)> = env
                    .vars(HookKind::Activate)
                    .into_iter()
                    .filter(|(k, _)| *k != "PUTEX_HOOK")
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
                // A stop asked for since the activation began withdraws
                // the spawn.
                let stops = inner.stops.subscribe();
                let still_wanted = Box::new(move || *stops.borrow() == stops_seen);
                let spawned = inner.ops.spawn_child(argv, vars, still_wanted);
                async move {
                    match tokio::time::timeout(clock::until(deadline), spawned).await {
                        Ok(Ok((pid, tree))) => {
                            tracing::info!(pid, ?tree, "child started");
                            true
                        }
                        Ok(Err(e)) => {
                            tracing::error!(error = %e, "cannot start the child");
                            false
                        }
                        Err(_) => false,
                    }
                }
                .boxed()
            }
            None => futures::future::ready(false).boxed(),
        };
        async move {
            let ok = activation.await;
            // Up only if no stop was asked for meanwhile.
            if ok && *up.stops.borrow() == stops_seen {
                up.set_service_up(true);
            }
            ok
        }
        .boxed()
    }

    fn stop(&self, kind: StopKind, deadline: Instant) -> BoxFuture<'static, bool> {
        self.inner.stops.send_modify(|n| *n += 1);
        let env = self.env(None);
        let inner = self.inner.clone();
        async move {
            let limit = clock::until(deadline) + STOP_SLACK;
            let started = std::time::Instant::now();
            inner.set_service_up(false);
            let work = async {
                // Let every earlier keeper op (an arm, a spawn) finish first,
                // so that the stop is the last word.
                inner.ops.barrier().await;
                Self::do_stop(inner.clone(), kind, env, clock::until(deadline)).await
            };
            let ok = tokio::time::timeout(limit, work).await.unwrap_or(false);
            let name = crate::supervision::hooks::stop_name(kind);
            inner
                .metrics
                .hook(&format!("stop-{name}"), started.elapsed());
            if ok {
                tracing::info!(kind = name, "service stopped");
            } else {
                if kind == StopKind::Graceful {
                    inner.metrics.graceful_stop_failed();
                }
                tracing::error!(kind = name, "stop not proven");
            }
            ok
        }
        .boxed()
    }

    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool> {
        if let Some(at) = self.inner.wedge_at {
            if std::time::Instant::now() >= at {
                // PUTEX_TEST_WEDGE_AFTER: block the state machine's thread
                // for good, as a deadlock would (the watchdog test).
                tracing::error!("PUTEX_TEST_WEDGE_AFTER: wedging the state machine");
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
        }
        self.inner.metrics.licence(match command {
            KeeperCommand::Arm(d) | KeeperCommand::Extend(d) => Some(d),
            KeeperCommand::Disarm => None,
        });
        let (token, previous) = self.set(|st| (st.token, st.previous.clone()));
        self.inner.ops.command(command, token, previous).boxed()
    }

    fn rejoin(&self, holder: Option<String>, deadline: Instant) -> BoxFuture<'static, bool> {
        let Some(cmd) = self.inner.settings.operator.rejoin.clone() else {
            return futures::future::ready(true).boxed();
        };
        let mut env = self.env(None);
        env.holder_addr = holder
            .as_ref()
            .and_then(|h| self.set(|st| st.addrs.get(h).cloned()));
        env.holder = holder;
        let inner = self.inner.clone();
        async move {
            let _resync = inner.resync.lock().await;
            tracing::info!(holder = ?env.holder, "rejoining: running the rejoin hook (O4)");
            let timeout = clock::until(deadline);
            Self::run_hook(&inner, HookKind::Rejoin, &cmd, &env, None, timeout).await
        }
        .boxed()
    }

    fn candidacy(&self, blocker: Option<Blocker>) {
        let changed = self.set(|st| {
            let was = st.ready();
            let kind = |b: &Option<Blocker>| b.as_ref().map(std::mem::discriminant);
            let changed = kind(&st.blocker) != kind(&blocker);
            st.blocker = blocker;
            changed || was != st.ready()
        });
        if changed {
            self.inner.member_dirty.notify_one();
        }
    }

    fn lock_written(&self, token: Token, value: &[u8]) {
        let holds = crate::locks::guard::record_holds(value);
        let role = self.set(|st| {
            if st.record.is_none_or(|(t, _)| t < token) {
                st.record = Some((token, holds));
            }
            st.role.unwrap_or(Role::Standby)
        });
        // F3: a write that landed ends the failsafe.
        self.end_failsafe(role, Some(token), "the store answers again");
    }

    fn sample_position(&self) {
        self.inner.position_wanted.notify_one();
    }

    fn failsafe_answer(&self, id: u64, answer: putex_core::FailsafeAnswer) {
        if let Some(gate) = &self.inner.failsafe {
            gate.deliver(id, answer);
        }
    }

    fn failsafe_ask(
        &self,
        round: u64,
        token: Token,
        members: Vec<putex_core::FailsafeMember>,
        deadline: Instant,
    ) -> BoxFuture<'static, Vec<putex_core::FailsafeMember>> {
        let Some(asker) = self.inner.asker.clone() else {
            return futures::future::ready(Vec::new()).boxed();
        };
        // A live member that cannot grant: an agent too old to know
        // failsafe would not honour the set either. Ask nobody.
        let unfit = self.set(|st| {
            st.failsafe_asked = st.failsafe_asked.max(round);
            st.failsafe_unfit.clone()
        });
        if !unfit.is_empty() {
            self.failsafe_round(super::state::FailsafeRound {
                round,
                at: std::time::SystemTime::now(),
                verdicts: unfit
                    .into_iter()
                    .map(|n| {
                        (
                            n,
                            "not asked: its agent runs without --failsafe (or is too old \
                             to know it); no holder runs on grants beside it"
                                .to_string(),
                        )
                    })
                    .collect(),
            });
            return futures::future::ready(Vec::new()).boxed();
        }
        // A member whose record never said where it is asked cannot grant.
        let (targets, unknown): (Vec<_>, Vec<_>) = self.set(|st| {
            members
                .iter()
                .map(|m| {
                    let url = st
                        .failsafe_urls
                        .get(&(m.node.clone(), m.machine.clone()))
                        .cloned();
                    (m.clone(), url)
                })
                .partition(|(_, url)| url.is_some())
        });
        let targets: Vec<crate::failsafe::holder::Target> = targets
            .into_iter()
            .map(|(m, url)| crate::failsafe::holder::Target {
                member: crate::failsafe::auth::Peer {
                    node: m.node,
                    machine: m.machine,
                },
                url: url.expect("partitioned"),
            })
            .collect();
        let host = self.clone();
        let within = crate::clock::until(deadline);
        async move {
            let verdicts = asker
                .ask_round(&token.to_string(), round, &targets, within)
                .await;
            let granted: Vec<putex_core::FailsafeMember> = verdicts
                .iter()
                .filter(|(_, v)| v.is_grant())
                .map(|(p, _)| putex_core::FailsafeMember {
                    node: p.node.clone(),
                    machine: p.machine.clone(),
                })
                .collect();
            let mut said: Vec<(String, String)> = verdicts
                .iter()
                .map(|(p, v)| (p.node.clone(), v.to_string()))
                .collect();
            said.extend(unknown.into_iter().map(|(m, _)| {
                (
                    m.node,
                    "not asked: its member record names no failsafe endpoint".to_string(),
                )
            }));
            host.failsafe_round(super::state::FailsafeRound {
                round,
                at: std::time::SystemTime::now(),
                verdicts: said,
            });
            granted
        }
        .boxed()
    }

    fn persist_highest(&self, token: Token) {
        self.set(|st| {
            if st.highest.is_none_or(|h| token > h) {
                st.highest = Some(token);
            }
        });
        self.inner.state_dirty.notify_one();
    }

    fn event(&self, event: &Event) {
        match event {
            Event::Transition {
                from,
                to,
                reason,
                token,
            } => {
                self.inner
                    .metrics
                    .transition(*to, token.map(|t| t.revision));
                if *from == Role::Starting {
                    // Connected, and the first decision is made.
                    crate::supervision::systemd::notify("READY=1");
                }
                crate::supervision::systemd::notify(&format!("STATUS={to} ({reason})"));
                let tenure = match (to, reason) {
                    (Role::Active, _) => Some(true),
                    (_, Reason::Released) => Some(false),
                    _ => None,
                };
                if let Some(open) = tenure {
                    if self.set(|st| std::mem::replace(&mut st.tenure_open, open)) != open {
                        self.inner.state_dirty.notify_one();
                    }
                }
                if !matches!(to, Role::Active | Role::SteppingDown) {
                    self.set(|st| {
                        st.paused = None;
                        st.switchover = None;
                    });
                }
                // A holder's follow waits for the start-up stop (`follow`
                // skips it while starting): follow it now.
                // Back in standby (from start-up, or from a tenure that may
                // have cut a follow short): follow whoever holds it now.
                let follow = self.set(|st| {
                    st.role = Some(*to);
                    match to {
                        Role::Standby | Role::Starting | Role::Exited => {
                            st.token = None;
                            st.previous = None;
                        }
                        _ => {
                            if token.is_some() {
                                st.token = *token;
                            }
                        }
                    }
                    if *to == Role::Standby {
                        if st.follow_stop.is_cancelled() {
                            st.follow_stop = Default::default();
                        }
                    } else {
                        st.follow_stop.cancel();
                        st.follow_failing = None;
                    }
                    let own = Some(self.inner.node.as_str());
                    (*to == Role::Standby)
                        .then(|| st.active_holder.clone())
                        .flatten()
                        .filter(|h| Some(h.as_str()) != own)
                });
                if let Some(holder) = follow {
                    super::member::follow(self, Some(holder));
                }
                // lock and node come from the agent's span.
                // e.g. `standby -> confirming (lock stale: rev 1:41 unchanged
                // for 10.21s, store age 10.24s)`.
                tracing::info!(
                    role = %to,
                    from = %from,
                    reason = ?reason,
                    token = token.map(tracing::field::display),
                    revision = token.map(|t| t.revision),
                    "transition {from} -> {to} ({reason})"
                );
                self.inner.member_dirty.notify_one();
                if *from == Role::Active {
                    // Its stretch on grants (if any) goes into the history
                    // before the transition that ended it.
                    self.end_failsafe(Role::Active, *token, "the holder is no longer active");
                }
                self.inner.history.transition(*from, *to, reason, *token);
            }
            Event::StoreRegressed { highest, now } => tracing::error!(
                %highest,
                %now,
                "STORE REGRESSED: the lock record's revision went backwards (lost writes?); \
                 treating the lock as absent (S6)"
            ),
            Event::AdvertisedTimingAboveMax(msg) => {
                tracing::warn!("{msg}")
            }
            Event::StopUnproven {
                kind,
                attempts,
                holding,
            } => {
                self.inner.metrics.stop_unproven(true);
                self.set(|st| st.unproven = Some((*attempts, *holding)));
                self.inner.member_dirty.notify_one();
                if *holding {
                    tracing::error!(
                        kind = crate::supervision::hooks::stop_name(*kind),
                        attempts,
                        "STOP UNPROVEN: the service may still run; keeping the lock (renewing, no \
                         release) and retrying the stop every round"
                    );
                } else {
                    tracing::error!(
                        kind = crate::supervision::hooks::stop_name(*kind),
                        attempts,
                        "STOP UNPROVEN after the lock was lost: the service may still run beside \
                         the next holder; only the fencing token protects the resource; retrying \
                         the stop every round"
                    );
                }
            }
            Event::AbsentWait { wait, why } => tracing::warn!(
                wait_ms = wait.as_millis() as u64,
                "lock {:?} taken; waiting {:.1} s before activating: {}{}",
                self.inner.lock.as_str(),
                wait.as_secs_f64(),
                why.explain(),
                match &self.inner.settings.failsafe {
                    Some(f) => format!(
                        "; with failsafe the wait includes --failsafe-max ({}): a holder whose \
                         record was lost may run on its members' grants that long \
                         (docs/safety.md, Failsafe)",
                        humantime::format_duration(f.max)
                    ),
                    None => String::new(),
                }
            ),
            Event::StopProven { after } => {
                self.inner.metrics.stop_unproven(false);
                self.set(|st| st.unproven = None);
                self.inner.member_dirty.notify_one();
                tracing::warn!(after, "the service is proven stopped after all");
            }
            Event::SwitchoverRefused { to, why } => {
                tracing::warn!(to = to.as_deref(), "switchover refused: {why}");
                if let Some(id) = self.set(|st| st.switchover.take()) {
                    let (store, lock) = (self.inner.store.clone(), self.inner.lock.clone());
                    let (why, timeout) = (why.clone(), self.inner.settings.timing.store_timeout());
                    tokio::spawn(async move {
                        super::control::refuse(&store, &lock, &id, &why, timeout).await;
                    });
                }
            }
            Event::Paused(pause) => {
                tracing::warn!(
                    by = %pause.by,
                    reason = %pause.reason,
                    "PAUSED: failover is off; the keeper is disarmed and putex stops nothing"
                );
                let token = self.set(|st| {
                    st.paused = Some(pause.clone());
                    st.token
                });
                self.inner.member_dirty.notify_one();
                let why = format!("failover paused {pause} (O2)");
                self.inner.history.operator("paused", why, token);
            }
            Event::Unpaused => {
                tracing::info!("resumed: failover is on again, the keeper armed");
                let token = self.set(|st| {
                    st.paused = None;
                    st.token
                });
                self.inner.member_dirty.notify_one();
                self.inner.history.operator(
                    "unpaused",
                    "failover resumed; the keeper guards the service again (O2)".into(),
                    token,
                );
            }
            Event::ResumeRefused => {
                tracing::error!("resume failed: the keeper did not arm; failover stays paused")
            }
            Event::Rejoined => {
                tracing::info!("rejoin hook succeeded: eligible again (O4)");
                let holder = self.set(|st| {
                    st.rejoin_pending = false;
                    st.active_holder.clone()
                });
                self.inner.member_dirty.notify_one();
                // A follow deferred while rejoining, or a holder that changed
                // meanwhile: follow whoever holds it now.
                if holder.is_some() && holder.as_deref() != Some(self.inner.node.as_str()) {
                    super::member::follow(self, holder);
                }
            }
        }
    }

    fn metrics(&self) -> Option<&Metrics> {
        Some(&self.inner.metrics)
    }
}

/// Persists the highest token, the service's tree (and the instance)
/// whenever they change, into the lock's host state.
pub(super) async fn state_writer(
    host: AgentHost,
    file: HostState,
    boot: String,
    tree: Option<TreeSnapshot>,
) {
    let mut written = host.set(|st| (st.highest, tree, st.tenure_open));
    loop {
        host.inner.state_dirty.notified().await;
        let now = host.set(|st| (st.highest, st.tree.clone(), st.tenure_open));
        if now == written {
            continue;
        }
        let (instance, boot, f) = (host.inner.instance.clone(), boot.clone(), file.clone());
        let (highest, tree, tenure_open) = now.clone();
        let update = move || {
            f.update(|r| {
                r.instance = instance;
                r.boot_id = boot;
                r.raise(highest);
                r.tree = tree;
                r.tenure_open = tenure_open;
            })
        };
        match tokio::task::spawn_blocking(update).await {
            Ok(Ok(_)) => written = now,
            Ok(Err(e)) => {
                tracing::error!(path = %file.path().display(), error = %e, "cannot write the host state file")
            }
            Err(_) => {}
        }
    }
}
