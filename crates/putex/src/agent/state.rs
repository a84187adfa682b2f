//! What the agent's host keeps: its [`Status`] (role, token, health,
//! candidacy, the member record's content), the keeper it uses (replaced
//! when it died), and the hooks it runs. [`AgentHost`] is shared by the
//! core's [`Host`](crate::driver::Host) side ([`super::host`]), the member
//! records and follows ([`super::member`]) and the control records
//! ([`super::control`]); it depends on none of them.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use putex_core::{Blocker, Pause, Role, StopKind, Token};
use tokio::sync::{mpsc, watch, Notify};
use tracing::Instrument;

use super::settings::{AgentSettings, ServiceMode};
use crate::observe::metrics::Metrics;
use crate::supervision::hooks::{Hook, HookEnv, HookKind, HookRunner, HookStatus};
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
    /// Why the last follow hook failed (`follow failing: exit 1: …`), until
    /// one succeeds or this node leaves standby: shown as the member's
    /// `why_not`.
    pub(super) follow_failing: Option<String>,
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
    /// Every member whose record was read, fresh or not, and how long ago
    /// its record was written (`PUTEX_MEMBERS`).
    pub(super) members: Vec<(crate::store::NodeId, Duration)>,
    /// The active holder, as the member records say (`PUTEX_HOLDER`).
    pub(super) active_holder: Option<String>,
    /// Failsafe: where each member (node, machine) is asked, as the newest
    /// member record read from it says; kept through a store outage.
    pub(super) failsafe_urls: std::collections::HashMap<(String, String), String>,
    /// Failsafe (F6): the last round of asks this holder sent, and what
    /// each member answered.
    pub(super) failsafe_round: Option<FailsafeRound>,
    /// Failsafe (F6): since when the licence has run on grants (the first
    /// round every member granted since a write of ours last landed).
    pub(super) failsafe_since: Option<std::time::SystemTime>,
    /// Failsafe (F6): the first round of that stretch that not every
    /// member granted — when, and who did not and why.
    pub(super) failsafe_lost: Option<(std::time::SystemTime, String)>,
    /// Failsafe: the last round asked, and the last asked when a failsafe
    /// ended — verdicts of a round up to that one come too late to say
    /// anything.
    pub(super) failsafe_asked: u64,
    pub(super) failsafe_ended: u64,
    /// Failsafe: live members whose records say they cannot grant (no
    /// `--failsafe`, or too old to know it); while there is one, this
    /// holder asks nobody and runs on no grants.
    pub(super) failsafe_unfit: Vec<String>,
    /// The position the active holder's record last published.
    pub(super) holder_position: Option<u64>,
    /// What `--info` last printed.
    pub(super) info: std::collections::BTreeMap<String, String>,
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
    pub(super) lock: crate::store::Name,
    /// The store, for the control record's refusals.
    pub(super) store: crate::store::AnyStore,
    /// Where the hooks' `putex kv` is answered (`PUTEX_KV_SOCKET`).
    pub(super) kv_socket: Option<std::path::PathBuf>,
    pub(super) node: crate::store::NodeId,
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
    /// Wakes the `--position` feed for a sample now (O1: a switchover's
    /// target catching up).
    pub(super) position_wanted: Notify,
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
    /// `--failsafe`: this member's answers to holders' asks.
    pub(super) failsafe: Option<Arc<crate::failsafe::member::Gate>>,
    /// `--failsafe`: this holder's asks to the members during an outage.
    pub(super) asker: Option<crate::failsafe::holder::Asker>,
}

/// Failsafe (F6): one round of a holder's asks, as it went.
#[derive(Clone, Debug)]
pub(super) struct FailsafeRound {
    /// The core's number of the round.
    pub(super) round: u64,
    /// When its verdicts were in (wall clock, for people).
    pub(super) at: std::time::SystemTime,
    /// Each member asked ("node" or "node (machine)") and its verdict.
    pub(super) verdicts: Vec<(String, String)>,
}

impl FailsafeRound {
    /// As `/health` and the other status routes show it.
    fn view(&self, since: Option<std::time::SystemTime>) -> crate::http::agent::FailsafeView {
        crate::http::agent::FailsafeView {
            granted: self.all_granted(),
            since: since.map(|t| humantime::format_rfc3339_millis(t).to_string()),
            at: humantime::format_rfc3339_millis(self.at).to_string(),
            members: self
                .verdicts
                .iter()
                .map(|(node, verdict)| crate::http::agent::MemberVerdict {
                    node: node.clone(),
                    verdict: verdict.clone(),
                })
                .collect(),
        }
    }

    /// Who did not grant, and why ("node verdict; …").
    pub(super) fn missing(&self) -> String {
        let missing: Vec<String> = self
            .verdicts
            .iter()
            .filter(|(_, v)| v != "granted")
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        missing.join("; ")
    }

    /// Whether every member asked granted.
    pub(super) fn all_granted(&self) -> bool {
        self.verdicts.iter().all(|(_, v)| v == "granted")
    }
}

/// F6: the history's words for a stretch on grants from `since` to `until`,
/// with its first lost round, if any.
pub(super) fn failsafe_history(
    since: std::time::SystemTime,
    until: std::time::SystemTime,
    lost: Option<&(std::time::SystemTime, String)>,
) -> String {
    let took = until.duration_since(since).unwrap_or_default();
    let took = humantime::format_duration(Duration::from_millis(
        u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
    ));
    let from = humantime::format_rfc3339_seconds(since);
    let rounds = match lost {
        None => "every round granted".to_string(),
        Some((at, missing)) => format!(
            "a round lost at {} ({missing})",
            humantime::format_rfc3339_seconds(*at)
        ),
    };
    format!(
        "failsafe from {from} for {took}: the store did not answer, the licence ran on its members' grants; {rounds}"
    )
}

impl crate::http::agent::AgentView for AgentHost {
    fn snapshot(&self) -> crate::http::agent::AgentSnapshot {
        let live = crate::http::agent::live(
            self.inner.metrics.since_progress(),
            self.inner.settings.timing.renew(),
        );
        self.set(|st| crate::http::agent::AgentSnapshot {
            lock: self.inner.lock.to_string(),
            node: self.inner.node.to_string(),
            role: st.role_name(),
            primary: st.role == Some(Role::Active) && st.service_up,
            healthy: st.healthy,
            token: st.token.map(|t| t.to_string()),
            ready: !matches!(st.role, None | Some(Role::Starting | Role::Exited)),
            live,
            position: st.position,
            lag: match (st.role, st.position, st.holder_position) {
                (Some(Role::Standby), Some(own), Some(holder)) => Some(holder.saturating_sub(own)),
                _ => None,
            },
            failsafe: st
                .failsafe_round
                .as_ref()
                .map(|r| r.view(st.failsafe_since)),
        })
    }

    fn metrics(&self) -> String {
        crate::observe::metrics::encode(&self.inner.registry)
    }

    fn failsafe(&self) -> Option<Arc<crate::failsafe::member::Gate>> {
        self.inner.failsafe.clone()
    }
}

impl Inner {
    pub(super) fn set_service_up(&self, up: bool) {
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
    /// Failsafe (F6): a round of this holder's asks is over. Logged when
    /// what it says changes: the licence running on every member's grant,
    /// or not, and who did not grant and why.
    pub(super) fn failsafe_round(&self, round: FailsafeRound) {
        let was = self.set(|st| {
            if round.round <= st.failsafe_ended {
                return None;
            }
            self.inner.metrics.failsafe_round(round.all_granted());
            if round.all_granted() && st.failsafe_since.is_none() {
                st.failsafe_since = Some(round.at);
            }
            if !round.all_granted() && st.failsafe_since.is_some() && st.failsafe_lost.is_none() {
                st.failsafe_lost = Some((round.at, round.missing()));
            }
            Some(st.failsafe_round.replace(round.clone()))
        });
        // Late: the failsafe it belonged to is over.
        let Some(was) = was else { return };
        let same = was.is_some_and(|w| {
            w.all_granted() == round.all_granted()
                && (round.all_granted() || w.verdicts == round.verdicts)
        });
        if same {
            return;
        }
        if round.all_granted() {
            let by: Vec<&str> = round.verdicts.iter().map(|(n, _)| n.as_str()).collect();
            tracing::warn!(
                granted_by = %by.join(" "),
                "failsafe: the store does not answer; every member granted, the service keeps running"
            );
        } else {
            tracing::warn!(
                missing = %round.missing(),
                "failsafe lost: not every member granted; the licence ends unless the store answers"
            );
        }
    }

    /// Failsafe (F6): the failsafe, if any, is over (`why`). A stretch on
    /// grants goes into the lock's history as a record of `role` (the
    /// holder's, while it was one) with `token`.
    pub(super) fn end_failsafe(&self, role: Role, token: Option<Token>, why: &str) {
        let (last, since, lost) = self.set(|st| {
            st.failsafe_ended = st.failsafe_asked;
            (
                st.failsafe_round.take(),
                st.failsafe_since.take(),
                st.failsafe_lost.take(),
            )
        });
        if last.is_none() {
            return;
        }
        self.inner.metrics.failsafe_over();
        tracing::warn!("failsafe over: {why}");
        if let Some(since) = since {
            self.inner.history.note(
                role,
                "failsafe",
                failsafe_history(since, std::time::SystemTime::now(), lost.as_ref()),
                token,
            );
        }
    }

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

    pub(super) fn env(&self, token: Option<Token>) -> HookEnv {
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
            members: st.members.clone(),
        }
    }

    pub(super) fn set<R>(&self, f: impl FnOnce(&mut Status) -> R) -> R {
        f(&mut self.inner.status.lock())
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
        .is_ok()
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
    ) -> Result<(), String> {
        let hook = Hook::new(kind, command);
        match inner.runner.run_until(&hook, env, arg, timeout, stop).await {
            Ok(o) => {
                inner.metrics.hook(o.name, o.duration);
                match o.failure() {
                    None => {
                        tracing::debug!(hook = o.name, duration = ?o.duration, "hook succeeded");
                        Ok(())
                    }
                    // Logged by the runner; the caller says why.
                    Some(why) if o.status == HookStatus::Cancelled => Err(why),
                    Some(why) => {
                        inner.metrics.hook_failed(o.name);
                        tracing::warn!(hook = o.name, status = ?o.status, duration = ?o.duration, "hook failed: {why}");
                        Err(why)
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "hook could not run");
                inner.metrics.hook_failed(kind.name());
                Err(format!("could not run: {e}"))
            }
        }
    }

    /// The stop itself: through the keeper, or without it if it is gone.
    /// A start-up stop also proves a previous instance's tree gone (S5): a
    /// new keeper knows nothing of an orphan its dead predecessor left.
    pub(super) async fn do_stop(
        inner: Arc<Inner>,
        kind: StopKind,
        env: HookEnv,
        limit: Duration,
    ) -> bool {
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
