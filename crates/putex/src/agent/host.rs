//! The agent's [`Host`]: what the core asks for, carried out.
//!
//! Health checks and the fence/activate hooks run through [`HookRunner`];
//! stops and the licence deadline go through the keeper (which owns the
//! child in child mode and runs the deactivate hook in hook mode), in the
//! core's order through one queue ([`keeper_ops`]); the highest token and
//! the service's tree go into the host state file; transitions into the log,
//! the member record and a transition record.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use putex_core::{
    Blocker, Event, HealthMode, Instant, KeeperCommand, Pause, Reason, Role, StopKind, Token,
};
use tokio::sync::{mpsc, watch, Notify};
use tracing::Instrument;

use super::member::MemberRecord;
use super::settings::{AgentSettings, ServiceMode};
use crate::clock;
use crate::driver::Host;
use crate::host_state::HostState;
use crate::observe::metrics::Metrics;
use crate::supervision::hooks::{health_arg, Hook, HookEnv, HookKind, HookRunner, HookStatus};
use crate::supervision::keeper::{KeeperClient, KeeperConfig, KeeperError, KeeperEvent};
use crate::supervision::keeper_queue::{KeeperQueue, KeeperSource};
use crate::supervision::process::TreeSnapshot;

/// Extra time a stop may take past the core's deadline before it is
/// reported unproven: the keeper's own SIGKILL wait ends right at it.
pub(super) const STOP_SLACK: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------
// The keeper, replaced when it died.

/// The agent's keeper. One that died is replaced by a new one when the next
/// tenure arms it (its old tree was stopped without it first: the core
/// releases nothing before that is proven).
pub(super) struct KeeperSlot {
    config: KeeperConfig,
    current: Mutex<Arc<KeeperClient>>,
    /// Every keeper's events, in one stream ([`pump_keeper_events`]).
    events: mpsc::UnboundedSender<KeeperEvent>,
}

impl KeeperSlot {
    pub(super) fn new(
        config: KeeperConfig,
        mut keeper: KeeperClient,
        events: mpsc::UnboundedSender<KeeperEvent>,
    ) -> KeeperSlot {
        forward_events(keeper.take_events(), events.clone());
        KeeperSlot {
            config,
            current: Mutex::new(Arc::new(keeper)),
            events,
        }
    }

    /// The keeper (perhaps a dead one: its calls then fail with `Lost`).
    pub(super) fn get(&self) -> Arc<KeeperClient> {
        self.current.lock().clone()
    }

    /// The keeper for a new tenure: a new one if the old one died.
    async fn for_tenure(&self) -> Result<Arc<KeeperClient>, KeeperError> {
        let keeper = self.get();
        if !keeper.is_lost() {
            return Ok(keeper);
        }
        tracing::warn!("the keeper died earlier; starting a new one for this tenure");
        let (mut fresh, _) = KeeperClient::spawn_or_adopt(&self.config).await?;
        forward_events(fresh.take_events(), self.events.clone());
        let fresh = Arc::new(fresh);
        *self.current.lock() = fresh.clone();
        Ok(fresh)
    }
}

impl KeeperSource for Arc<KeeperSlot> {
    fn current(&self) -> Arc<KeeperClient> {
        self.get()
    }

    fn for_tenure(&self) -> BoxFuture<'_, Result<Arc<KeeperClient>, KeeperError>> {
        Box::pin(KeeperSlot::for_tenure(self))
    }
}

/// Copies one keeper's events into the agent's single stream.
fn forward_events(
    mut from: mpsc::UnboundedReceiver<KeeperEvent>,
    to: mpsc::UnboundedSender<KeeperEvent>,
) {
    tokio::spawn(
        async move {
            while let Some(ev) = from.recv().await {
                if to.send(ev).is_err() {
                    return;
                }
            }
        }
        .in_current_span(),
    );
}

// ---------------------------------------------------------------------------
// The host.

#[derive(Default)]
pub(super) struct Status {
    pub(super) role: Option<Role>,
    pub(super) token: Option<Token>,
    pub(super) previous: Option<String>,
    pub(super) healthy: Option<bool>,
    pub(super) last_health: Option<String>,
    pub(super) highest: Option<Token>,
    /// The activate hook (or the child's spawn) succeeded and no stop was
    /// asked for since: `/primary` answers 200 only then.
    pub(super) service_up: bool,
    /// Stops in a row that proved nothing, and whether the lease is still
    /// held meanwhile (`None`: the last stop was proven).
    pub(super) unproven: Option<(u32, bool)>,
    /// The service's tree as the keeper last described it (child mode).
    pub(super) tree: Option<TreeSnapshot>,
    /// Why the core would not take over now ("why not"), and whether that
    /// makes it not ready as a candidate (O3).
    pub(super) blocker: Option<Blocker>,
    /// The last `--position`.
    pub(super) position: Option<u64>,
    /// The pause in force by this holder's record (O2).
    pub(super) paused: Option<Pause>,
    /// The switchover request (its id) this holder is carrying out (O1).
    pub(super) switchover: Option<String>,
    /// O4: must run the rejoin hook before it may take over.
    pub(super) rejoin_pending: bool,
    /// O4: this host's last tenure may have run the service and has not
    /// ended in a proven release (kept in the host state file).
    pub(super) tenure_open: bool,
    /// The other members' `--advertise` addresses, by node.
    pub(super) addrs: std::collections::HashMap<String, String>,
    /// The active holder, as the member records say (`PUTEX_HOLDER`).
    pub(super) active_holder: Option<String>,
    /// The newest lock record this agent wrote that landed, and whether it
    /// says it holds the lock: what the hooks' guarded writes compare
    /// against ([`super::kv`]).
    pub(super) record: Option<(Token, bool)>,
    /// Cancelled when the node leaves standby: a follow hook still running
    /// then is killed, and the fence waits for it to be over
    /// ([`super::member::follow`]). A fresh one on every return to standby.
    pub(super) follow_stop: tokio_util::sync::CancellationToken,
}

pub(super) struct Inner {
    pub(super) lock: String,
    /// The lock, as a name (for its control record).
    pub(super) lock_name: crate::store::Name,
    /// The store, for the control record's refusals.
    pub(super) store: crate::store::AnyStore,
    /// Where the hooks' `putex kv` is answered (`PUTEX_KV_SOCKET`).
    pub(super) kv_socket: Option<std::path::PathBuf>,
    pub(super) node: String,
    pub(super) instance: String,
    pub(super) settings: AgentSettings,
    pub(super) runner: HookRunner,
    pub(super) keeper: Arc<KeeperSlot>,
    /// A previous instance's tree, from the host state file: the start-up stop
    /// proves it gone too (S5), whoever owned it.
    pub(super) orphans: Mutex<Option<TreeSnapshot>>,
    pub(super) ops: KeeperQueue,
    pub(super) status: Mutex<Status>,
    /// Counts stops asked for; in-flight activations watch it.
    pub(super) stops: watch::Sender<u64>,
    /// Wakes the member-record writer.
    pub(super) member_dirty: Notify,
    /// Held while the rejoin or a follow hook runs: they never overlap (both
    /// resynchronise the same service with the holder).
    pub(super) resync: tokio::sync::Mutex<()>,
    /// Wakes the state-file writer.
    pub(super) state_dirty: Notify,
    /// Writes the transition records (`putex history`); never waited for.
    pub(super) history: crate::observe::history::HistoryWriter,
    /// A second signal asked for an emergency stop: exit 1 however the
    /// running stop ends.
    pub(super) emergency_requested: std::sync::atomic::AtomicBool,
    /// `PUTEX_TEST_WEDGE_AFTER`: when the state machine wedges itself.
    pub(super) wedge_at: Option<std::time::Instant>,
    /// The agent's series, in `registry`.
    pub(super) metrics: Metrics,
    /// What `/metrics` serves.
    pub(super) registry: Registry,
}

impl crate::http::agent::AgentView for AgentHost {
    fn snapshot(&self) -> crate::http::agent::AgentSnapshot {
        let live = crate::http::agent::live(
            self.inner.metrics.since_progress(),
            self.inner.settings.timing.renew(),
        );
        self.set(|st| crate::http::agent::AgentSnapshot {
            lock: self.inner.lock.clone(),
            node: self.inner.node.clone(),
            role: st.role_name(),
            primary: st.role == Some(Role::Active) && st.service_up,
            healthy: st.healthy,
            token: st.token.map(|t| t.to_string()),
            ready: !matches!(st.role, None | Some(Role::Starting | Role::Exited)),
            live,
        })
    }

    fn metrics(&self) -> String {
        crate::observe::metrics::encode(&self.inner.registry)
    }
}

impl Inner {
    fn set_service_up(&self, up: bool) {
        self.status.lock().service_up = up;
    }
}

/// The agent's [`Host`]: hooks, the keeper, the host state file, member records.
#[derive(Clone)]
pub(super) struct AgentHost {
    pub(super) inner: Arc<Inner>,
}

impl Status {
    /// Whether this node could take over now, as far as its own candidacy
    /// goes (O3): a standby whose checks pass, rejoined, not backing off,
    /// priority above 0. What the record says (paused, handed to another,
    /// not stale yet) does not count against it, nor does its lag: others
    /// judge that from its position (and a switchover may allow it).
    pub(super) fn ready(&self) -> bool {
        self.role == Some(Role::Standby)
            && !self.rejoin_pending
            && !matches!(
                self.blocker,
                Some(
                    Blocker::PriorityZero
                        | Blocker::Unhealthy
                        | Blocker::Rejoining
                        | Blocker::BackingOff(_)
                        | Blocker::NotItsTurn
                        | Blocker::ShuttingDown
                )
            )
    }

    /// The role as hooks and member records name it.
    pub(super) fn role_name(&self) -> String {
        self.role
            .map(|r| r.to_string())
            .unwrap_or_else(|| "starting".into())
    }
}

impl AgentHost {
    /// The deadline of the member and control feeds' store calls: the
    /// store timeout, at least 1 s (they are not on the lease's clock).
    pub(super) fn feed_timeout(&self) -> Duration {
        self.inner
            .settings
            .timing
            .store_timeout()
            .max(Duration::from_secs(1))
    }

    /// The environment of the rejoin and follow hooks.
    pub(super) fn hook_env(&self, holder: Option<String>, addr: Option<String>) -> HookEnv {
        HookEnv {
            holder,
            holder_addr: addr,
            ..self.env(None)
        }
    }

    fn env(&self, token: Option<Token>) -> HookEnv {
        let st = self.inner.status.lock();
        HookEnv {
            lock: self.inner.lock.clone(),
            node: self.inner.node.clone(),
            role: st.role_name(),
            token: token.or(st.token),
            previous: st.previous.clone(),
            stop: None,
            holder: st.active_holder.clone(),
            holder_addr: st
                .active_holder
                .as_ref()
                .and_then(|h| st.addrs.get(h).cloned()),
            kv_socket: self.inner.kv_socket.clone(),
        }
    }

    pub(super) fn set<R>(&self, f: impl FnOnce(&mut Status) -> R) -> R {
        f(&mut self.inner.status.lock())
    }

    pub(super) fn member_record(&self) -> MemberRecord {
        self.set(|st| MemberRecord {
            alarm: st.unproven.map(|(attempts, holding)| {
                format!(
                    "stop unproven ({attempts} attempts; {})",
                    if holding {
                        "holding the lock until a stop is proven"
                    } else {
                        "the lock was lost"
                    }
                )
            }),
            v: 1,
            node: self.inner.node.clone(),
            instance: self.inner.instance.clone(),
            // O4: a standby that must rejoin first says so.
            role: if st.rejoin_pending && st.role == Some(Role::Standby) {
                "rejoining".into()
            } else {
                st.role_name()
            },
            healthy: st.healthy,
            last_health: st.last_health.clone(),
            token: st.token.map(|t| t.to_string()),
            renew_ms: u64::try_from(self.inner.settings.timing.renew().as_millis()).unwrap_or(0),
            pid: std::process::id(),
            priority: self.inner.settings.operator.priority,
            position: st.position,
            ready: Some(st.ready()),
            blocker: st.blocker.as_ref().map(ToString::to_string),
            addr: self.inner.settings.operator.advertise.clone(),
            paused: st.paused.as_ref().map(ToString::to_string),
        })
    }

    /// Runs `kind`'s hook with its environment, at most `timeout`.
    pub(super) async fn run_hook(
        inner: &Inner,
        kind: HookKind,
        command: &str,
        env: &HookEnv,
        arg: Option<&str>,
        timeout: Duration,
    ) -> bool {
        Self::run_hook_until(
            inner,
            kind,
            command,
            env,
            arg,
            timeout,
            std::future::pending(),
        )
        .await
    }

    /// [`run_hook`](Self::run_hook), killing the hook's tree (and waiting
    /// for it) when `stop` completes first.
    pub(super) async fn run_hook_until(
        inner: &Inner,
        kind: HookKind,
        command: &str,
        env: &HookEnv,
        arg: Option<&str>,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> bool {
        let hook = Hook::new(kind, command);
        match inner.runner.run_until(&hook, env, arg, timeout, stop).await {
            Ok(o) => {
                inner.metrics.hook(o.name, o.duration);
                if o.ok() {
                    tracing::debug!(hook = o.name, duration = ?o.duration, "hook succeeded");
                } else if o.status == HookStatus::Cancelled {
                    // Logged by the runner; the caller says why.
                } else {
                    tracing::warn!(hook = o.name, status = ?o.status, duration = ?o.duration, "hook failed");
                }
                o.ok()
            }
            Err(e) => {
                tracing::error!(error = %e, "hook could not run");
                false
            }
        }
    }

    /// The stop itself: through the keeper, or without it if it is gone.
    /// A start-up stop also proves a previous instance's tree gone (S5): a
    /// new keeper knows nothing of an orphan its dead predecessor left.
    async fn do_stop(inner: Arc<Inner>, kind: StopKind, env: HookEnv, limit: Duration) -> bool {
        let started = std::time::Instant::now();
        let keeper = inner.keeper.get();
        let ok = match keeper.stop(kind).await {
            Ok(ok) => ok,
            Err(KeeperError::Lost) => {
                tracing::error!(?kind, "keeper lost: stopping the service without it");
                match &inner.settings.service {
                    Some(ServiceMode::Hooks { deactivate, .. }) => {
                        let env = HookEnv {
                            stop: Some(kind),
                            ..env
                        };
                        Self::run_hook(&inner, HookKind::Deactivate, deactivate, &env, None, limit)
                            .await
                    }
                    _ => {
                        // What the keeper last reported, kept by the host
                        // across keepers; else what this client knows.
                        let snapshot = inner.status.lock().tree.clone();
                        match snapshot {
                            Some(s) => s.kill(limit).await,
                            None => keeper.stop_tree_without_keeper(limit).await,
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(?kind, error = %e, "keeper could not stop the service");
                false
            }
        };
        if !ok || kind != StopKind::Startup {
            return ok;
        }
        let orphans = inner.orphans.lock().clone();
        let Some(orphans) = orphans else {
            return true;
        };
        let survivors = orphans.survivors(&crate::supervision::process::proc_table());
        if !survivors.is_empty() {
            tracing::warn!(
                ?survivors,
                "a previous instance's service processes still run; killing them (S5)"
            );
        }
        let left = limit.saturating_sub(started.elapsed());
        if !orphans.kill(left).await {
            return false;
        }
        *inner.orphans.lock() = None;
        let mut st = inner.status.lock();
        if st.tree.as_ref() == Some(&orphans) {
            st.tree = None;
            inner.state_dirty.notify_one();
        }
        true
    }
}

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
        self.set(|st| {
            if st.record.is_none_or(|(t, _)| t < token) {
                st.record = Some((token, holds));
            }
        });
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
                "lock {:?} taken; waiting {:.1} s before activating: {}",
                self.inner.lock_name.as_str(),
                wait.as_secs_f64(),
                why.explain()
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
                    let (store, lock) = (self.inner.store.clone(), self.inner.lock_name.clone());
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
