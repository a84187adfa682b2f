//! `putex run`: the failover agent.
//!
//! Start-up, in the order S5 asks for:
//!
//! 1. take the host-local lock file for (store, lock) — `flock` on
//!    `<keeper dir>/<store hash>-<lock>.lock`; a second agent for the same
//!    lock and store on this host refuses to start (exit 4);
//! 2. read the state file beside it (`….state`: the previous instance id, the
//!    boot id, the highest fencing token seen, S6) and write the new
//!    instance id into it;
//! 3. open the store (exit 3 if it does not answer) and check the timing
//!    against it (replication, p99 latency);
//! 4. adopt the keeper on the well-known socket, or start one; an adopted
//!    keeper that still guards a running service gives the core its
//!    deadline ([`PreviousInstance::keeper_deadline`]), so the service keeps
//!    running;
//! 5. run the core [`Agent`] through [`driver::run_with_inputs`] with an
//!    [`AgentHost`] until it exits.
//!
//! The [`AgentHost`] carries out what the core asks: health checks and the
//! fence/activate hooks through [`HookRunner`], stops and the licence
//! deadline through the keeper (which owns the child in child mode and runs
//! the deactivate hook in hook mode), the highest token into the state file,
//! and transitions into the log, the member record and a transition record
//! ([`crate::observe::history`], written in the background for `putex history`).
//!
//! Signals: the first SIGTERM or SIGINT asks the core for a graceful stop and
//! release; a second one makes an emergency stop through the keeper and exits
//! at once (exit 1) without a release.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use nix::fcntl::{Flock, FlockArg};
use putex_core::{
    Agent, AgentConfig, Event, ExitReason, HealthMode, Identity, Input, Instant, KeeperCommand,
    PreviousInstance, Role, StopKind, Token,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::Instrument;

use super::check::{check_store, measure_store, open_store};
use super::config::{AgentArgs, AgentSettings, ServiceMode, Strictness};
use super::CliError;
use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::store::{keys, AnyStore, Store};
use crate::supervision::hooks::{health_arg, Hook, HookEnv, HookKind, HookRunner};
use crate::supervision::keeper::{
    socket_path, KeeperClient, KeeperConfig, KeeperError, KeeperEvent,
};
use crate::supervision::process::TreeSnapshot;

/// Extra time a stop may take past the core's deadline before it is
/// reported unproven: the keeper's own SIGKILL wait ends right at it.
const STOP_SLACK: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------
// Host-local files: the lock file and the state file.

/// Paths of the host-local files for (store, lock).
#[derive(Clone, Debug)]
pub struct LocalPaths {
    /// The keeper's socket.
    pub socket: PathBuf,
    /// The lock file (flock) that admits one agent per (store, lock).
    pub lock_file: PathBuf,
    /// The state file: previous instance, boot id, highest token.
    pub state_file: PathBuf,
}

impl LocalPaths {
    /// The paths in `dir` for `store_id` and `lock`.
    pub fn new(dir: &Path, store_id: &str, lock: &str) -> LocalPaths {
        let socket = socket_path(dir, store_id, lock);
        LocalPaths {
            lock_file: socket.with_extension("lock"),
            state_file: socket.with_extension("state"),
            socket,
        }
    }
}

/// The held lock file; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct LocalLock {
    _file: Flock<File>,
}

impl LocalLock {
    /// Takes the lock file, or explains who holds it (exit 4).
    pub fn acquire(path: &Path, lock: &str, store: &str) -> Result<LocalLock, CliError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| CliError::Other(format!("lock file {}: {e}", path.display())))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut f) => {
                let _ = f.set_len(0);
                let _ = writeln!(&mut *f, "{}", std::process::id());
                Ok(LocalLock { _file: f })
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let pid = std::fs::read_to_string(path).unwrap_or_default();
                Err(CliError::Duplicate(format!(
                    "another putex agent (pid {}) already runs lock {lock:?} for store {store} on \
                     this host (lock file {}); one agent per lock and host",
                    pid.trim(),
                    path.display()
                )))
            }
            Err((_, e)) => Err(CliError::Other(format!(
                "lock file {}: cannot lock it: {e}",
                path.display()
            ))),
        }
    }
}

/// What the state file holds (S5, S6).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalState {
    /// The instance id of the agent that wrote it.
    pub instance: String,
    /// The boot id when it was written.
    pub boot_id: String,
    /// The highest fencing token seen for the lock.
    pub highest: Option<Token>,
    /// What identifies the service's process tree (child mode), as the
    /// keeper last reported it: a restarted agent, or one whose keeper
    /// died, finds and kills it with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSnapshot>,
}

impl LocalState {
    /// Reads the state file; a missing or unreadable one is "no previous
    /// instance" (logged when unreadable).
    pub fn load(path: &Path) -> Option<LocalState> {
        let text = std::fs::read_to_string(path).ok()?;
        match serde_json::from_str(&text) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable state file; ignoring it");
                None
            }
        }
    }

    /// Writes the state file atomically (a temporary file, then rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("state.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).expect("state serialises"))?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    }
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Member records.

/// A node's member record for a lock (`member.<lock>.<node>`), written by
/// the agent every few R and at each transition; read by `putex status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Format version (1).
    pub v: u32,
    /// The node id.
    pub node: String,
    /// The agent's instance id.
    pub instance: String,
    /// The agent's role (`standby`, `active`, …).
    pub role: String,
    /// Whether the last health check passed (`None` before the first).
    pub healthy: Option<bool>,
    /// The last health check: `active ok`, `standby failed`, ….
    pub last_health: Option<String>,
    /// The fencing token while holding the lock.
    pub token: Option<String>,
    /// The agent's R, in milliseconds (status judges staleness by it).
    pub renew_ms: u64,
    /// The agent's pid.
    pub pid: u32,
    /// Something an operator must look at, e.g. `stop unproven`: a stop
    /// could not prove the service stopped, and it may still run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
}

// ---------------------------------------------------------------------------
// The keeper, replaced when it died.

/// The agent's keeper. One that died is replaced by a new one when the next
/// tenure arms it (its old tree was stopped without it first: the core
/// releases nothing before that is proven).
struct KeeperSlot {
    config: KeeperConfig,
    current: Mutex<Arc<KeeperClient>>,
    /// Every keeper's events, in one stream ([`pump_keeper_events`]).
    events: mpsc::UnboundedSender<KeeperEvent>,
}

impl KeeperSlot {
    fn new(
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
    fn get(&self) -> Arc<KeeperClient> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
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

/// An ordered request to the keeper. Arms, extensions and child spawns go
/// through one queue so that they reach the keeper in the core's order.
enum KeeperOp {
    /// A command, and where to say whether the keeper carried it out.
    Command(KeeperCommand, Option<Token>, oneshot::Sender<bool>),
    Spawn {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// The stop counter when the activation was asked for: a stop asked
        /// for since then cancels the spawn.
        stops_seen: u64,
        reply: oneshot::Sender<bool>,
    },
    /// Answers once every earlier op is done.
    Barrier(oneshot::Sender<()>),
}

#[derive(Default)]
struct Status {
    role: Option<Role>,
    token: Option<Token>,
    previous: Option<String>,
    healthy: Option<bool>,
    last_health: Option<String>,
    highest: Option<Token>,
    /// The activate hook (or the child's spawn) succeeded and no stop was
    /// asked for since: `/primary` answers 200 only then.
    service_up: bool,
    /// Stops in a row that proved nothing, and whether the lease is still
    /// held meanwhile (`None`: the last stop was proven).
    unproven: Option<(u32, bool)>,
    /// The service's tree as the keeper last described it (child mode).
    tree: Option<TreeSnapshot>,
}

struct Inner {
    lock: String,
    node: String,
    instance: String,
    settings: AgentSettings,
    runner: HookRunner,
    keeper: KeeperSlot,
    /// A previous instance's tree, from the state file: the start-up stop
    /// proves it gone too (S5), whoever owned it.
    orphans: Mutex<Option<TreeSnapshot>>,
    ops: mpsc::UnboundedSender<KeeperOp>,
    status: Mutex<Status>,
    /// Counts stops asked for; in-flight activations watch it.
    stops: watch::Sender<u64>,
    /// Wakes the member-record writer.
    member_dirty: Notify,
    /// Wakes the state-file writer.
    state_dirty: Notify,
    /// Writes the transition records (`putex history`); never waited for.
    history: crate::observe::history::HistoryWriter,
    /// A second signal asked for an emergency stop: exit 1 however the
    /// running stop ends.
    emergency_requested: std::sync::atomic::AtomicBool,
    /// `PUTEX_TEST_WEDGE_AFTER`: when the state machine wedges itself.
    wedge_at: Option<std::time::Instant>,
}

impl crate::http::agent::AgentView for AgentHost {
    fn snapshot(&self) -> crate::http::agent::AgentSnapshot {
        let live = crate::http::agent::live(
            crate::observe::metrics::global().since_progress(),
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
}

impl Inner {
    fn set_service_up(&self, up: bool) {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .service_up = up;
    }
}

/// The agent's [`Host`]: hooks, the keeper, the state file, member records.
#[derive(Clone)]
pub struct AgentHost {
    inner: Arc<Inner>,
}

impl Status {
    /// The role as hooks and member records name it.
    fn role_name(&self) -> String {
        self.role
            .map(|r| r.to_string())
            .unwrap_or_else(|| "starting".into())
    }
}

impl AgentHost {
    fn env(&self, token: Option<Token>) -> HookEnv {
        let st = self.inner.status.lock().unwrap_or_else(|e| e.into_inner());
        HookEnv {
            lock: self.inner.lock.clone(),
            node: self.inner.node.clone(),
            role: st.role_name(),
            token: token.or(st.token),
            previous: st.previous.clone(),
            stop: None,
        }
    }

    fn set<R>(&self, f: impl FnOnce(&mut Status) -> R) -> R {
        f(&mut self.inner.status.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn member_record(&self) -> MemberRecord {
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
            role: st.role_name(),
            healthy: st.healthy,
            last_health: st.last_health.clone(),
            token: st.token.map(|t| t.to_string()),
            renew_ms: u64::try_from(self.inner.settings.timing.renew().as_millis()).unwrap_or(0),
            pid: std::process::id(),
        })
    }

    /// Runs `kind`'s hook with its environment, at most `timeout`.
    async fn run_hook(
        inner: &Inner,
        kind: HookKind,
        command: &str,
        env: &HookEnv,
        arg: Option<&str>,
        timeout: Duration,
    ) -> bool {
        let hook = Hook::new(kind, command);
        match inner.runner.run(&hook, env, arg, timeout).await {
            Ok(o) => {
                crate::observe::metrics::global().hook(o.name, o.duration);
                if o.ok() {
                    tracing::debug!(hook = o.name, duration = ?o.duration, "hook succeeded");
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
                        let snapshot = inner
                            .status
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .tree
                            .clone();
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
        let orphans = inner
            .orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
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
        *inner.orphans.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let mut st = inner.status.lock().unwrap_or_else(|e| e.into_inner());
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
            crate::observe::metrics::global().health_check(health_arg(mode), ok);
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
        let Some(cmd) = fence else {
            return futures::future::ready(true).boxed();
        };
        let env = self.env(Some(token));
        let inner = self.inner.clone();
        let mut stops = self.inner.stops.subscribe();
        async move {
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
                let (reply, rx) = oneshot::channel();
                let _ = inner.ops.send(KeeperOp::Spawn {
                    argv,
                    env: vars,
                    stops_seen,
                    reply,
                });
                async move {
                    tokio::time::timeout(clock::until(deadline), rx)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or(false)
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
                let (tx, rx) = oneshot::channel();
                if inner.ops.send(KeeperOp::Barrier(tx)).is_ok() {
                    let _ = rx.await;
                }
                Self::do_stop(inner.clone(), kind, env, clock::until(deadline)).await
            };
            let ok = tokio::time::timeout(limit, work).await.unwrap_or(false);
            let name = crate::supervision::hooks::stop_name(kind);
            crate::observe::metrics::global().hook(&format!("stop-{name}"), started.elapsed());
            if ok {
                tracing::info!(kind = name, "service stopped");
            } else {
                if kind == StopKind::Graceful {
                    crate::observe::metrics::global().graceful_stop_failed();
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
        crate::observe::metrics::global().licence(match command {
            KeeperCommand::Arm(d) | KeeperCommand::Extend(d) => Some(d),
            KeeperCommand::Disarm => None,
        });
        let token = self.set(|st| st.token);
        let (reply, rx) = oneshot::channel();
        let _ = self
            .inner
            .ops
            .send(KeeperOp::Command(command, token, reply));
        async move { rx.await.unwrap_or(false) }.boxed()
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
                crate::observe::metrics::global().transition(*to, token.map(|t| t.revision));
                if *from == Role::Starting {
                    // Connected, and the first decision is made.
                    crate::supervision::systemd::notify("READY=1");
                }
                crate::supervision::systemd::notify(&format!("STATUS={to} ({reason})"));
                self.set(|st| {
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
                });
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
                crate::observe::metrics::global().stop_unproven(true);
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
            Event::StopProven { after } => {
                crate::observe::metrics::global().stop_unproven(false);
                self.set(|st| st.unproven = None);
                self.inner.member_dirty.notify_one();
                tracing::warn!(after, "the service is proven stopped after all");
            }
        }
    }
}

/// Carries out keeper ops in order.
async fn keeper_ops(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<KeeperOp>) {
    while let Some(op) = rx.recv().await {
        match op {
            KeeperOp::Command(cmd, token, reply) => {
                let r = match cmd {
                    KeeperCommand::Arm(d) => {
                        let previous = inner
                            .status
                            .lock()
                            .map(|s| s.previous.clone())
                            .unwrap_or(None);
                        match inner.keeper.for_tenure().await {
                            Ok(keeper) => keeper.arm(d, token, previous).await,
                            Err(e) => Err(e),
                        }
                    }
                    other => inner.keeper.get().apply(other).await,
                };
                match &r {
                    Ok(()) => tracing::trace!(?cmd, "keeper"),
                    // A refused extension means the deadline passed: the
                    // keeper fires and reports it, which ends the licence.
                    // A refused arm keeps the service from starting.
                    Err(e) => tracing::warn!(?cmd, error = %e, "keeper refused or failed"),
                }
                let _ = reply.send(r.is_ok());
            }
            KeeperOp::Spawn {
                argv,
                env,
                stops_seen,
                reply,
            } => {
                if *inner.stops.borrow() != stops_seen {
                    let _ = reply.send(false);
                    continue;
                }
                let ok = match inner.keeper.get().spawn_child(argv, env).await {
                    Ok((pid, tree)) => {
                        tracing::info!(pid, ?tree, "child started");
                        true
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the child");
                        false
                    }
                };
                let _ = reply.send(ok);
            }
            KeeperOp::Barrier(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

/// Writes the member record every 3 R and whenever something changed.
async fn member_writer(host: AgentHost, store: AnyStore, key: String) {
    let every = host.inner.settings.timing.renew() * 3;
    let timeout = host.inner.settings.timing.store_timeout();
    loop {
        let rec = host.member_record();
        // The last record (`exited`) is run_agent's to write, or not to
        // write: a refused duplicate leaves the holder's record alone.
        if host.set(|st| st.role == Some(Role::Exited)) {
            return;
        }
        let bytes = serde_json::to_vec(&rec).expect("member record serialises");
        if let Err(e) = store.put(&key, &bytes, timeout).await {
            tracing::debug!(error = %e, "member record not written");
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = host.inner.member_dirty.notified() => {}
        }
    }
}

/// Persists the highest token, the service's tree (and the instance)
/// whenever they change.
async fn state_writer(host: AgentHost, path: PathBuf, boot: String, tree: Option<TreeSnapshot>) {
    let mut written = (host.set(|st| st.highest), tree);
    loop {
        host.inner.state_dirty.notified().await;
        let now = host.set(|st| (st.highest, st.tree.clone()));
        if now == written {
            continue;
        }
        let state = LocalState {
            instance: host.inner.instance.clone(),
            boot_id: boot.clone(),
            highest: now.0,
            tree: now.1.clone(),
        };
        let p = path.clone();
        match tokio::task::spawn_blocking(move || state.save(&p)).await {
            Ok(Ok(())) => written = now,
            Ok(Err(e)) => {
                tracing::error!(path = %path.display(), error = %e, "cannot write the state file")
            }
            Err(_) => {}
        }
    }
}

/// SIGTERM and SIGINT, installed once so that no signal between two waits
/// is missed.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let err =
            |e: std::io::Error| CliError::Other(format!("cannot install signal handlers: {e}"));
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

// ---------------------------------------------------------------------------
// The command.

/// `putex run`.
pub async fn run(args: &AgentArgs) -> Result<(), CliError> {
    let settings = AgentSettings::from_args(args, Strictness::Run)?;
    let span = tracing::info_span!("agent", lock = %settings.lock_name(), node = %settings.node);
    run_agent(settings).instrument(span).await
}

async fn run_agent(settings: AgentSettings) -> Result<(), CliError> {
    let lock = settings.lock_name().to_owned();
    let node = settings.node.clone();
    let store_id = settings.store_id();
    let mut signals = Signals::install()?;

    // 1. The lock file (S5).
    std::fs::create_dir_all(&settings.keeper_dir).map_err(|e| {
        CliError::Other(format!(
            "--keeper-dir {}: {e}",
            settings.keeper_dir.display()
        ))
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ =
            std::fs::set_permissions(&settings.keeper_dir, std::fs::Permissions::from_mode(0o700));
    }
    let paths = LocalPaths::new(&settings.keeper_dir, &store_id, &lock);
    let _local_lock = LocalLock::acquire(&paths.lock_file, &lock, &store_id)?;

    // 2. The state file (S5, S6).
    let boot = boot_id();
    let previous_state = LocalState::load(&paths.state_file);
    let instance = crate::locks::lease::instance_id();
    let highest = previous_state.as_ref().and_then(|s| s.highest);
    // A previous instance's tree stays on record until a stop proves it gone.
    let orphans = previous_state.as_ref().and_then(|s| s.tree.clone());
    LocalState {
        instance: instance.clone(),
        boot_id: boot.clone(),
        highest,
        tree: orphans.clone(),
    }
    .save(&paths.state_file)
    .map_err(|e| CliError::Other(format!("state file {}: {e}", paths.state_file.display())))?;

    // The HTTP endpoints' address is taken now, so that a bad --http fails
    // before anything runs.
    let http = match settings.http {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| CliError::Usage(format!("--http {addr}: cannot listen: {e}")))?,
        ),
        None => None,
    };

    // 3. The store.
    let store = open_store(&settings).await?;
    let m = measure_store(
        &store,
        &node,
        settings.timing.store_timeout().max(Duration::from_secs(1)),
        Some(settings.timing.renew()),
    )
    .await?;
    check_store(&settings.timing, &m)?;
    tracing::info!(
        store = %settings.store,
        replicas = m.replicas,
        p99_cas = ?m.facts.p99_cas.unwrap_or_default(),
        "store ok"
    );
    for w in super::check::timing_warnings(&settings.timing) {
        tracing::warn!("{w}");
    }
    let timeline = settings.timing.timeline(m.median_cas);
    tracing::info!(
        lease = ?timeline.lease,
        staleness_wait = ?timeline.staleness_wait,
        gap = ?timeline.gap,
        bound = ?timeline.crash_failover,
        "timing"
    );

    // 4. The keeper.
    let deactivate = match &settings.service {
        Some(ServiceMode::Hooks { deactivate, .. }) => Some(deactivate.clone()),
        _ => None,
    };
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Other(format!("cannot find the putex binary: {e}")))?;
    let keeper_config = KeeperConfig {
        exe,
        socket: paths.socket.clone(),
        lock: lock.clone(),
        node: node.clone(),
        deactivate,
        stop_timeout: settings.timing.stop_timeout(),
        emergency_timeout: settings.timing.emergency_timeout(),
        cgroup: !settings.no_cgroup,
        quiet: false,
    };
    let (keeper, adopted) = KeeperClient::spawn_or_adopt(&keeper_config)
        .await
        .map_err(|e| CliError::Other(format!("keeper: {e}")))?;
    let mut keeper_deadline = None;
    if adopted {
        match keeper.status().await {
            Ok(st) => {
                let runs = match &settings.service {
                    Some(ServiceMode::Child { .. }) => {
                        st.child.as_ref().is_some_and(|c| c.tree_alive)
                    }
                    _ => true,
                };
                // A keeper still stopping the service (its deadline passed,
                // or a stop was asked for) guards no tenure to resume: the
                // service is on its way down (S5).
                if !st.fired && !st.stopping && runs {
                    keeper_deadline = st.deadline_ns.map(Instant::from_nanos);
                }
                tracing::info!(
                    pid = st.pid,
                    deadline = ?keeper_deadline,
                    stopping = st.stopping,
                    "adopted the running keeper"
                );
            }
            Err(e) => tracing::warn!(error = %e, "adopted keeper did not report its status"),
        }
    }
    let previous = previous_state.map(|s| {
        let same_boot = !boot.is_empty() && s.boot_id == boot;
        PreviousInstance {
            instance: s.instance,
            same_boot,
            keeper_deadline: keeper_deadline.filter(|_| same_boot),
        }
    });
    let adopted_tree = keeper.snapshot();
    let (events_tx, events) = mpsc::unbounded_channel();
    let keeper = KeeperSlot::new(keeper_config, keeper, events_tx);

    // 5. The agent.
    let (ops_tx, ops_rx) = mpsc::unbounded_channel();
    let (inject, inputs) = mpsc::unbounded_channel::<Input>();
    let host = AgentHost {
        inner: Arc::new(Inner {
            lock: lock.clone(),
            node: node.clone(),
            instance: instance.clone(),
            settings: settings.clone(),
            runner: if settings.no_cgroup {
                HookRunner::without_cgroup()
            } else {
                HookRunner::detect()
            },
            keeper,
            orphans: Mutex::new(orphans.clone()),
            ops: ops_tx,
            status: Mutex::new(Status {
                highest,
                tree: adopted_tree.or(orphans.clone()),
                ..Status::default()
            }),
            stops: watch::Sender::new(0),
            member_dirty: Notify::new(),
            state_dirty: Notify::new(),
            history: crate::observe::history::HistoryWriter::spawn(
                store.clone(),
                crate::observe::history::WriterConfig::new(
                    &lock,
                    &node,
                    &instance,
                    "run",
                    settings.timing.store_timeout().max(Duration::from_secs(1)),
                ),
            ),
            emergency_requested: std::sync::atomic::AtomicBool::new(false),
            wedge_at: wedge_at(),
        }),
    };
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(interval) = crate::supervision::systemd::watchdog_interval() {
        let renew = settings.timing.renew();
        tracing::info!(
            ?interval,
            "systemd watchdog: pinging while the state machine progresses"
        );
        tasks.spawn(
            crate::supervision::systemd::watchdog(interval, move || {
                crate::http::agent::live(crate::observe::metrics::global().since_progress(), renew)
            })
            .in_current_span(),
        );
    }
    tasks.spawn(keeper_ops(host.inner.clone(), ops_rx).in_current_span());
    tasks.spawn(pump_keeper_events(events, inject, host.clone()).in_current_span());
    let member_key = keys::member(&lock, &node).map_err(|e| CliError::Usage(e.to_string()))?;
    tasks.spawn(member_writer(host.clone(), store.clone(), member_key).in_current_span());
    tasks.spawn(
        state_writer(host.clone(), paths.state_file.clone(), boot, orphans).in_current_span(),
    );

    // Signals: the first shuts down gracefully, a second stops at once.
    let (first_tx, first_rx) = oneshot::channel::<()>();
    {
        let emergency = settings.timing.emergency_timeout();
        let inner = host.inner.clone();
        tasks.spawn(async move {
            signals.next().await;
            crate::supervision::systemd::notify("STOPPING=1");
            tracing::info!("signal: stopping gracefully and releasing the lock (send it again to stop at once)");
            let _ = first_tx.send(());
            signals.next().await;
            tracing::error!(
                "second signal: emergency stop; the lock is released only if the stop under way \
                 proves the service stopped in time"
            );
            inner
                .emergency_requested
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let keeper = inner.keeper.get();
            let ok = tokio::time::timeout(emergency + STOP_SLACK, keeper.stop(StopKind::Emergency))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(false);
            if ok {
                let _ = keeper.disarm().await;
            }
            std::process::exit(1);
        });
    }

    let agent = Agent::new(
        AgentConfig {
            identity: Identity {
                node: node.clone(),
                machine: crate::locks::lease::machine_id(),
                instance,
            },
            timing: settings.timing.clone(),
            previous,
            highest_token: highest,
            supervised_stops: true,
            mutations: Default::default(),
        },
        clock::boot_time_now(),
    );
    let keys = Keys {
        lock: keys::lock(&lock).map_err(|e| CliError::Usage(e.to_string()))?,
        probe: keys::probe(&node).map_err(|e| CliError::Usage(e.to_string()))?,
    };
    tracing::info!(
        mode = if matches!(settings.service, Some(ServiceMode::Child { .. })) {
            "child"
        } else {
            "hooks"
        },
        adopted,
        "agent starting"
    );
    let (http_stop, http_stopped) = oneshot::channel::<()>();
    if let Some(listener) = http {
        let view: Arc<dyn crate::http::agent::AgentView> = Arc::new(host.clone());
        let page = crate::observe::web::router(store.clone(), Some(vec![lock.clone()]));
        tracing::info!(addr = ?listener.local_addr().ok(), "serving /primary, /replica, /health, /metrics");
        tokio::spawn(
            async move {
                let stopped = async move {
                    let _ = http_stopped.await;
                };
                if let Err(e) = crate::http::agent::serve(listener, view, page, stopped).await {
                    tracing::error!(error = %e, "the HTTP endpoints failed");
                }
            }
            .in_current_span(),
        );
    }
    let exit = driver::run_with_inputs(
        agent,
        store.clone(),
        keys,
        Arc::new(host.clone()),
        async move {
            let _ = first_rx.await;
        },
        inputs,
    )
    .await;
    let _ = http_stop.send(());
    // The last transition records (the release) are worth a moment.
    host.inner.history.flush(Duration::from_secs(2)).await;

    // A last member record, so status shows the agent gone — unless the
    // record is another machine's: a refused duplicate must not mark the
    // running holder's member record `exited` (S5: it is not disturbed).
    tasks.abort_all();
    if !matches!(exit, ExitReason::DuplicateNode { .. }) {
        let mut rec = host.member_record();
        rec.role = "exited".into();
        rec.token = None;
        if let Ok(key) = keys::member(&lock, &node) {
            let bytes = serde_json::to_vec(&rec).expect("member record serialises");
            let _ = store
                .put(&key, &bytes, settings.timing.store_timeout())
                .await;
        }
    }
    match exit {
        ExitReason::Shutdown { released } => {
            if host.inner.keeper.get().shutdown().await.is_err() {
                tracing::debug!("the keeper stays (it still guards something, or is gone)");
            }
            tracing::info!(released, "agent stopped");
            if host
                .inner
                .emergency_requested
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                return Err(CliError::Other("stopped at once by a second signal".into()));
            }
            Ok(())
        }
        ExitReason::DuplicateNode { machine } => Err(CliError::Duplicate(format!(
            "another machine ({machine}) runs lock {lock:?} with node id {node:?}: give each host \
             its own --node"
        ))),
        ExitReason::StartupStopFailed => Err(CliError::Other(
            "the start-up stop (deactivate) failed: the service may be running; not starting"
                .into(),
        )),
    }
}

/// `PUTEX_TEST_WEDGE_AFTER=DUR`, a test knob: the state machine blocks its
/// thread for good DUR after start (at its next keeper command), so that the
/// tests can show the systemd watchdog stops. Never set it in production.
fn wedge_at() -> Option<std::time::Instant> {
    let d = std::env::var("PUTEX_TEST_WEDGE_AFTER").ok()?;
    let d = humantime::parse_duration(d.trim()).ok()?;
    Some(std::time::Instant::now() + d)
}

/// Turns keeper events (of every keeper the agent has had) into driver
/// inputs, and keeps the tree snapshots on record.
async fn pump_keeper_events(
    mut events: mpsc::UnboundedReceiver<KeeperEvent>,
    inject: mpsc::UnboundedSender<Input>,
    host: AgentHost,
) {
    while let Some(ev) = events.recv().await {
        match &ev {
            KeeperEvent::Tree(snapshot) => {
                tracing::debug!(?snapshot, "service tree");
                host.set(|st| st.tree = Some(snapshot.clone()));
                host.inner.state_dirty.notify_one();
            }
            KeeperEvent::Fired { ok } => {
                crate::observe::metrics::global().keeper_fired();
                tracing::error!(
                    ok,
                    "the keeper's deadline passed: it made the emergency stop"
                )
            }
            KeeperEvent::ChildExited(exit) => tracing::warn!(?exit, "the child exited"),
            KeeperEvent::Lost => tracing::error!("the keeper is gone"),
        }
        if let Some(input) = ev.to_input() {
            if inject.send(input).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_file_holder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = LocalPaths::new(dir.path(), "sqlite:///x.db", "pg");
        assert!(p.lock_file.to_string_lossy().ends_with("-pg.lock"));
        let first = LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap();
        let e = LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("already runs lock \"pg\""), "{e}");
        drop(first);
        LocalLock::acquire(&p.lock_file, "pg", "sqlite:///x.db").unwrap();
    }

    #[test]
    fn state_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.state");
        assert_eq!(LocalState::load(&p), None);
        let s = LocalState {
            instance: "i1".into(),
            boot_id: boot_id(),
            highest: Some(Token::new(5, 7)),
            tree: Some(TreeSnapshot {
                members: vec![crate::supervision::process::ProcId { pid: 42, start: 7 }],
                ..TreeSnapshot::default()
            }),
        };
        s.save(&p).unwrap();
        assert_eq!(LocalState::load(&p), Some(s));
    }
}
