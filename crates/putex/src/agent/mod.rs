//! The failover agent (`putex run`) as a library: [`run`] takes validated
//! [`AgentSettings`], an optional bound listener for its HTTP endpoints and
//! a [`Shutdown`], and returns why it stopped.
//!
//! Start-up, in the order S5 asks for:
//!
//! 1. take the host-local lock file for (store, lock) — `flock` on
//!    `<keeper dir>/<store hash>-<lock>.lock`; a second agent for the same
//!    lock and store on this host refuses to start
//!    ([`AgentError::AlreadyRunning`]);
//! 2. read the lock's host state beside it (`….state.json`, shared with
//!    critical sections: the previous instance id, the boot id, the highest
//!    fencing token seen, S6, the service's tree) and write the new
//!    instance id into it;
//! 3. open the store ([`AgentError::StoreUnreachable`]) and check the timing
//!    against it (replication, p99 latency);
//! 4. adopt the keeper on the well-known socket, or start one; an adopted
//!    keeper that still guards a running service gives the core its
//!    deadline ([`PreviousInstance::keeper_deadline`]), so the service keeps
//!    running;
//! 5. run the core [`Agent`] through [`driver::run_with_inputs`] with the
//!    agent's host until it exits.
//!
//! The host (`agent/host.rs`) carries out what the core asks: health checks and the
//! fence/activate hooks through [`HookRunner`], stops and the licence
//! deadline through the keeper (which owns the child in child mode and runs
//! the deactivate hook in hook mode), the highest token into the host state,
//! and transitions into the log, the member record and a transition record
//! ([`crate::observe::history`], written in the background for `putex history`).
//!
//! Shutdown: a graceful request ([`Shutdown::request`], the first SIGTERM or
//! SIGINT) asks the core for a graceful stop and release; an abort (the
//! second signal) makes an emergency stop through the keeper and returns
//! [`AgentError::Aborted`] as soon as it is done, without waiting for a
//! release. The graceful stop an abort implies goes on meanwhile: if it
//! proves the service stopped before the emergency stop returns, its
//! release is written and the next node starts at once; otherwise nothing
//! is released and the others wait for the lease to go stale.
//!
//! | module | what it holds |
//! |---|---|
//! | [`settings`] | [`AgentSettings`]: validated settings, whatever they came from |
//! | `files` | the host-local lock file (the host state is `crate::host_state`) |
//! | [`member`] | member records, what `putex status` shows of each node |
//! | `host` | the [`crate::driver::Host`] that carries out what the core asks |

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use putex_core::time::Human;
use putex_core::{Agent, AgentConfig, ExitReason, Identity, Instant, PreviousInstance, StopKind};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::Instrument;

pub mod control;
mod error;
pub(crate) mod files;
mod host;
mod info;
mod kv;
pub mod member;
pub mod settings;
mod state;

/// Why the keeper (the process that owns the service) failed: part of
/// [`AgentError`].
pub use crate::supervision::keeper::KeeperError;
pub use settings::{timing_warnings, AgentSettings, OperatorSettings, ServiceMode};

pub use self::error::{AgentError, LocalFile};
use self::files::{LocalLock, LocalPaths};
use self::host::state_writer;
use self::member::member_writer;
use self::state::{AgentHost, Inner, KeeperSlot, Status, STOP_SLACK};
use crate::clock;
use crate::driver::{self, Keys};
use crate::host_state::{HostRecord, HostState};
use crate::identity;
use crate::observe::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::store::keys;
use crate::store::measure::measure_store;
use crate::store::{AnyStore, Name, Store};
use crate::supervision::hooks::HookRunner;
use crate::supervision::keeper::{KeeperClient, KeeperConfig, KeeperEvent};
use crate::supervision::keeper_queue::KeeperQueue;

impl AgentError {
    fn local(what: LocalFile, path: &std::path::Path, source: std::io::Error) -> AgentError {
        AgentError::Local {
            what,
            path: path.to_owned(),
            source,
        }
    }
}

/// At the start of a failsafe agent: refuses a key that a live member of
/// the lock does not share (by its name and both fingerprints), and warns
/// of live members without failsafe, beside which no holder asks anyone.
/// A member record that cannot be read is left to the run.
async fn check_failsafe_members(
    store: &AnyStore,
    lock: &Name,
    node: &str,
    ours: &str,
) -> Result<(), AgentError> {
    let members = match crate::report::status::lock_status(store, lock).await {
        Ok(st) => st.members,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the lock's members to compare failsafe keys");
            return Ok(());
        }
    };
    let live = members
        .iter()
        .filter(|m| m.node != node && !m.silent && m.role != "exited");
    for m in live {
        match &m.failsafe {
            Some(f) if f.key != ours => {
                return Err(AgentError::FailsafeKeyMismatch {
                    lock: lock.to_string(),
                    node: m.node.clone(),
                    theirs: f.key.clone(),
                    ours: ours.to_owned(),
                })
            }
            Some(_) => {}
            None => tracing::warn!(
                member = %m.node,
                "member {} runs without --failsafe: no holder of this lock asks anyone until every member runs with it",
                m.node
            ),
        }
    }
    Ok(())
}

/// Runs the failover agent until it stops: asked to ([`Shutdown`]), or
/// because the core exits (another machine uses this node id, the start-up
/// stop failed). `http`, when given, serves `/primary`, `/replica`,
/// `/health`, `/metrics` and the status page.
pub async fn run(
    settings: AgentSettings,
    http: Option<TcpListener>,
    shutdown: Shutdown,
) -> Result<ExitReason, AgentError> {
    let lock = settings.lock.clone().ok_or(AgentError::NoLock)?;
    let node = settings.node.clone();
    let store_id = settings.store_id();

    // 1. The lock file (S5).
    std::fs::create_dir_all(&settings.keeper_dir)
        .map_err(|e| AgentError::local(LocalFile::KeeperDir, &settings.keeper_dir, e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ =
            std::fs::set_permissions(&settings.keeper_dir, std::fs::Permissions::from_mode(0o700));
    }
    let paths = LocalPaths::new(&settings.keeper_dir, &store_id, &lock);
    let _local_lock = LocalLock::acquire(&paths.lock_file, &lock, &store_id)?;

    // 2. The lock's host state (S5, S6), shared with critical sections.
    let host_state = HostState::new(&settings.keeper_dir, &store_id, &keys::lock(&lock)).for_agent(
        &settings.keeper_dir,
        &store_id,
        &lock,
    );
    let boot = identity::boot_id();
    let instance = identity::instance_name();
    // What was on record before this instance wrote its name (an empty
    // record when nothing was): the previous agent's instance, the highest
    // token, and a tree that stays on record until a stop proves it gone.
    let previous_state = {
        let (file, instance, boot) = (host_state.clone(), instance.to_string(), boot.clone());
        tokio::task::spawn_blocking(move || {
            let mut previous = HostRecord::default();
            file.update(|r| {
                previous = r.clone();
                r.instance = instance;
                r.boot_id = boot;
            })
            .map(|_| previous)
        })
        .await
        .expect("the host state task does not panic")
        .map_err(|e| AgentError::local(LocalFile::HostStateFile, host_state.path(), e))?
    };
    let highest = previous_state.highest;
    let orphans = previous_state.tree.clone();
    // O4: a tenure that may have run the service and ended without a proven
    // release makes a node with --rejoin resynchronise first.
    let rejoin = settings.operator.rejoin.is_some() && previous_state.tenure_open;
    if rejoin {
        tracing::warn!("the last tenure here ended without a clean release: rejoining first (O4)");
    }

    // 3. The store.
    let store =
        AnyStore::open(&settings.store)
            .await
            .map_err(|source| AgentError::StoreUnreachable {
                url: settings.store.to_string(),
                source,
            })?;
    let m = measure_store(
        &store,
        &node,
        settings.timing.store_timeout().max(Duration::from_secs(1)),
        Some(settings.timing.renew()),
    )
    .await?;
    m.check(&settings.timing)?;
    tracing::info!(
        store = %settings.store,
        replicas = m.replicas,
        p99_cas = %Human(m.facts.p99_cas.unwrap_or_default()),
        "store ok"
    );
    if let Some(failsafe) = &settings.failsafe {
        check_failsafe_members(&store, &lock, &node, &failsafe.key.fingerprint()).await?;
    }
    for w in timing_warnings(&settings.timing) {
        tracing::warn!("{w}");
    }
    for w in store.warnings().await {
        tracing::warn!("{w}");
    }
    let timeline = settings.timing.timeline(m.median_cas);
    tracing::info!(
        lease = %Human(timeline.lease),
        staleness_wait = %Human(timeline.staleness_wait),
        gap = %Human(timeline.gap),
        bound = %Human(timeline.crash_failover),
        "timing"
    );

    // 4. The keeper.
    let deactivate = match &settings.service {
        Some(ServiceMode::Hooks { deactivate, .. }) => Some(deactivate.clone()),
        _ => None,
    };
    let exe = match &settings.keeper_exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe().map_err(AgentError::NoKeeperExe)?,
    };
    // The hooks' guarded writes (`putex kv`): a socket beside the keeper's,
    // answered while the agent runs. Without it, hooks run without
    // PUTEX_KV_SOCKET (and `putex kv` says why it cannot write).
    let kv_listener = match crate::locks::section::kv::KvListener::bind(paths.kv_socket.clone()) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(path = %paths.kv_socket.display(), error = %e, "cannot listen for the hooks' guarded writes (putex kv)");
            None
        }
    };
    let kv_socket = kv_listener.as_ref().map(|l| l.path().to_owned());
    let keeper_config = KeeperConfig {
        exe,
        socket: paths.socket.clone(),
        lock: lock.clone(),
        node: node.clone(),
        deactivate,
        kv_socket: kv_socket.clone(),
        stop_timeout: settings.timing.stop_timeout(),
        emergency_timeout: settings.timing.emergency_timeout(),
        cgroup: !settings.no_cgroup,
        quiet: false,
        child_stdout: false,
    };
    let (keeper, adopted) = KeeperClient::spawn_or_adopt(&keeper_config).await?;
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
    // Sections alone leave no instance on record: no previous agent then.
    let previous = (!previous_state.instance.is_empty()).then(|| {
        let same_boot = !boot.is_empty() && previous_state.boot_id == boot;
        PreviousInstance {
            instance: previous_state.instance,
            same_boot,
            keeper_deadline: keeper_deadline.filter(|_| same_boot),
        }
    });
    let adopted_tree = keeper.snapshot();
    let (events_tx, events) = mpsc::unbounded_channel();
    let keeper = Arc::new(KeeperSlot::new(keeper_config, keeper, events_tx));

    // 5. The agent.
    let ops = KeeperQueue::start(keeper.clone());
    let mut registry = Registry::with_prefix("putex");
    let metrics = Metrics::register(&mut registry);
    let (inject, inputs) = driver::input_channel();
    let host = AgentHost {
        inner: Arc::new(Inner {
            lock: lock.clone(),
            store: store.clone(),
            kv_socket,
            node: node.clone(),
            instance: instance.to_string(),
            settings: settings.clone(),
            runner: if settings.no_cgroup {
                HookRunner::without_cgroup()
            } else {
                HookRunner::detect()
            },
            keeper,
            orphans: Mutex::new(orphans.clone()),
            ops,
            status: Mutex::new(Status {
                highest,
                tree: adopted_tree.or(orphans.clone()),
                rejoin_pending: rejoin,
                tenure_open: previous_state.tenure_open,
                ..Status::default()
            }),
            stops: watch::Sender::new(0),
            member_dirty: Notify::new(),
            position_wanted: Notify::new(),
            resync: tokio::sync::Mutex::new(()),
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
            metrics: metrics.clone(),
            registry,
            asker: settings.failsafe.clone().map(|f| {
                crate::failsafe::holder::Asker::new(
                    f.key,
                    lock.to_string(),
                    crate::failsafe::auth::Holder {
                        node: node.to_string(),
                        machine: identity::machine_id(),
                        instance: instance.to_string(),
                    },
                )
            }),
            failsafe: settings.failsafe.clone().map(|f| {
                Arc::new(crate::failsafe::member::Gate::new(
                    f.key,
                    lock.to_string(),
                    crate::failsafe::auth::Peer {
                        node: node.to_string(),
                        machine: identity::machine_id(),
                    },
                    inject.clone(),
                    metrics.clone(),
                ))
            }),
        }),
    };
    let _kv = kv_listener.map(|l| {
        crate::locks::section::kv::KvServer::answering(Arc::new(kv::AgentKv(host.clone())), l)
    });
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(interval) = crate::supervision::systemd::watchdog_interval() {
        let renew = settings.timing.renew();
        tracing::info!(
            ?interval,
            "systemd watchdog: pinging while the state machine progresses"
        );
        let metrics = host.inner.metrics.clone();
        tasks.spawn(
            crate::supervision::systemd::watchdog(interval, move || {
                crate::http::agent::live(metrics.since_progress(), renew)
            })
            .in_current_span(),
        );
    }
    tasks.spawn(pump_keeper_events(events, inject.clone(), host.clone()).in_current_span());
    let member_key = keys::member(&lock, &node);
    tasks.spawn(member_writer(host.clone(), store.clone(), member_key).in_current_span());
    tasks.spawn(
        member::member_feed(host.clone(), store.clone(), lock.clone(), inject.clone())
            .in_current_span(),
    );
    if settings.operator.position.is_some() {
        tasks.spawn(member::position_feed(host.clone(), inject.clone()).in_current_span());
    }
    tasks.spawn(info::info_feed(host.clone()).in_current_span());
    tasks.spawn(
        control::control_feed(host.clone(), store.clone(), lock.clone(), inject.clone())
            .in_current_span(),
    );
    tasks.spawn(state_writer(host.clone(), host_state, boot, orphans).in_current_span());

    // A second request (the operator's second signal) stops at once.
    let aborted = {
        let emergency = settings.timing.emergency_timeout();
        let inner = host.inner.clone();
        let shutdown = shutdown.clone();
        async move {
            shutdown.aborted().cancelled().await;
            tracing::error!(
                "asked again to stop: emergency stop; the lock is released only if the stop under \
                 way proves the service stopped in time"
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
        }
    };
    let graceful = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.graceful().cancelled().await;
            crate::supervision::systemd::notify("STOPPING=1");
            tracing::info!(
                "stopping gracefully and releasing the lock (a second signal stops at once)"
            );
        }
    };

    let agent = Agent::new(
        AgentConfig {
            previous,
            highest_token: highest,
            supervised_stops: true,
            priority: settings.operator.priority,
            max_lag: settings.operator.max_lag,
            rejoin,
            failback_after: settings.operator.failback_after,
            store_clock_step: store.clock_step(),
            failsafe: settings.failsafe.is_some(),
            failsafe_max: settings
                .failsafe
                .as_ref()
                .map_or(settings::DEFAULT_FAILSAFE_MAX, |f| f.max),
            ..AgentConfig::new(
                Identity {
                    node: node.to_string(),
                    machine: identity::machine_id(),
                    instance: instance.to_string(),
                },
                settings.timing.clone(),
            )
        },
        clock::boot_time_now(),
    );
    let keys = Keys {
        lock: keys::lock(&lock),
        probe: keys::probe(&node),
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
        let page = crate::report::web::router(store.clone(), Some(vec![lock.clone()]));
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
    let driven = driver::run_with_inputs(
        agent,
        store.clone(),
        keys,
        Arc::new(host.clone()),
        graceful,
        inputs,
    );
    let exit = tokio::select! {
        exit = driven => exit,
        () = aborted => {
            // The emergency stop was made (or tried). The lock was released
            // only if the graceful stop under way proved the service
            // stopped before this; nothing more is sent.
            let _ = http_stop.send(());
            tasks.abort_all();
            return Err(AgentError::Aborted);
        }
    };
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
        let key = keys::member(&lock, &node);
        let bytes = serde_json::to_vec(&rec).expect("member record serialises");
        let _ = store
            .put(&key, &bytes, settings.timing.store_timeout())
            .await;
    }
    if let ExitReason::Shutdown { released } = exit {
        if host.inner.keeper.get().shutdown().await.is_err() {
            tracing::debug!("the keeper stays (it still guards something, or is gone)");
        }
        tracing::info!(released, "agent stopped");
        if host
            .inner
            .emergency_requested
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(AgentError::Aborted);
        }
    }
    Ok(exit)
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
    inject: driver::InputSender,
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
                host.inner.metrics.keeper_fired();
                tracing::error!(
                    ok,
                    "the keeper's deadline passed: it made the emergency stop"
                )
            }
            KeeperEvent::ChildExited(exit) => tracing::warn!(?exit, "the child exited"),
            KeeperEvent::Lost => tracing::error!("the keeper is gone"),
        }
        if let Some(input) = ev.to_input() {
            if inject.unbounded_send(input).is_err() {
                return;
            }
        }
    }
}
