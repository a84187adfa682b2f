//! The section's loop: the queue, one agent per slot, the keeper's events
//! and signals, until CMD has exited and the lock is given back.

use super::host::{spread_of, watch_free_slots, SlotHost};
use super::shared::{Shared, State};
use super::state::{Conclusion, Round, SectionState, SignalAction, SlotCommand};
use super::*;
use crate::observe::json::RecordState;

/// What a running section needs from its caller besides the options: the
/// signals to forward or to end the wait with.
pub type Signals = mpsc::UnboundedReceiver<i32>;

/// The section's keeper on its way: a process of its own that takes a few
/// milliseconds to start, begun before the store is opened so that the two
/// overlap ([`run_with_keeper`]).
pub struct KeeperStart {
    /// This run's instance name (the keeper's socket carries it).
    instance: Name,
    task: tokio::task::JoinHandle<Result<KeeperClient, String>>,
}

impl KeeperStart {
    /// Starts (or adopts) the keeper for `opts` in the background.
    pub fn begin(opts: &SectionOptions) -> Result<KeeperStart, SectionError> {
        std::fs::create_dir_all(&opts.keeper_dir).map_err(|source| SectionError::KeeperDir {
            dir: opts.keeper_dir.clone(),
            source,
        })?;
        let instance = crate::identity::instance_name();
        let short = &instance[..instance.len().min(12)];
        let exe = match &opts.keeper_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| SectionError::Keeper(format!("cannot find the putex binary: {e}")))?,
        };
        let config = KeeperConfig {
            exe,
            socket: crate::supervision::keeper::socket_path(
                &opts.keeper_dir,
                &opts.store_id,
                &format!("{}-{short}", opts.name),
            ),
            lock: opts.name.clone(),
            node: opts.node.clone(),
            deactivate: None,
            kv_socket: None,
            stop_timeout: opts.timing.stop_timeout(),
            emergency_timeout: opts.timing.emergency_timeout(),
            cgroup: opts.cgroup,
            quiet: true,
            // CMD's output goes where `putex lock`'s was sent.
            child_stdout: true,
        };
        let task = tokio::spawn(async move {
            KeeperClient::spawn_or_adopt(&config)
                .await
                .map(|(keeper, _)| keeper)
                .map_err(|e| e.to_string())
        });
        Ok(KeeperStart { instance, task })
    }

    async fn finish(self) -> Result<KeeperClient, SectionError> {
        match self.task.await {
            Ok(r) => r.map_err(SectionError::Keeper),
            Err(e) => Err(SectionError::Keeper(format!(
                "the keeper's start failed: {e}"
            ))),
        }
    }

    /// Tells the keeper to go once it has started: nothing will run.
    pub async fn cancel(self) {
        if let Ok(keeper) = self.finish().await {
            let _ = keeper.shutdown().await;
        }
    }
}

/// Runs `opts.argv` while holding the lock; see the [module docs](crate::locks::section).
pub async fn run(
    store: AnyStore,
    opts: SectionOptions,
    signals: Signals,
) -> Result<Outcome, SectionError> {
    run_with_keeper(store, opts, signals, None).await
}

/// [`run`] with a keeper begun before the store was opened
/// ([`KeeperStart::begin`]); it is told to go if nothing runs.
pub async fn run_with_keeper(
    store: AnyStore,
    opts: SectionOptions,
    signals: Signals,
    keeper: Option<KeeperStart>,
) -> Result<Outcome, SectionError> {
    // Nothing may return before the keeper is either used or sent away.
    let mut early = keeper;
    let r = run_inner(store, opts, signals, &mut early).await;
    if let Some(k) = early {
        k.cancel().await;
    }
    r
}

async fn run_inner(
    store: AnyStore,
    opts: SectionOptions,
    mut signals: Signals,
    early: &mut Option<KeeperStart>,
) -> Result<Outcome, SectionError> {
    let timing = opts.timing.clone();
    let timeout = timing.store_timeout().max(Duration::from_secs(1));
    // Store calls before waiting whose outcome is unknown are retried until
    // then: a busy store or a leader election does not fail the command.
    let setup_deadline = tokio::time::Instant::now()
        + match opts.wait {
            Wait::For(d) => d,
            Wait::No => NO_WAIT_GRACE,
            Wait::Forever => SETUP_PATIENCE,
        }
        .max(timeout);
    let keys = match &opts.slots {
        Some(slots) if slots.keys.is_empty() => {
            return Err(SectionError::Usage("nothing to compete for".into()))
        }
        Some(slots) => slots.keys.clone(),
        None => targets(&store, &opts.name, opts.limit, timeout, setup_deadline).await?,
    };

    // Already done in this period: no need to wait at all.
    if let Some(once) = &opts.once {
        let period = period_key(&store, once, &opts.node, timeout, setup_deadline).await?;
        let done = patiently(setup_deadline, timeout, |t| {
            done_in(&store, &opts.name, &period, t)
        });
        if let Some(by) = done.await? {
            return Ok(Outcome::AlreadyDone { period, by });
        }
    }
    if opts.wait == Wait::No {
        let busy = patiently(setup_deadline, timeout, |t| busy(&store, &keys, t));
        if let Some(holder) = busy.await? {
            return Ok(Outcome::NotAcquired {
                holder: Some(holder),
            });
        }
    }

    // The keeper: one per section, on a socket of its own.
    let start = match early.take() {
        Some(start) => start,
        None => KeeperStart::begin(&opts)?,
    };
    let instance = start.instance.clone();
    // The keeper starts (a process of its own: a few milliseconds; begun
    // before the store was opened when the caller could) while we join the
    // fair queue (not for --no-wait, which never waits behind anyone).
    let join_queue = async {
        if opts.wait == Wait::No || !opts.queue {
            return Ok(None);
        }
        let waiter = Waiter {
            name: opts.name.clone(),
            node: opts.node.clone(),
            instance: instance.clone(),
            renew: timing.renew(),
            store_timeout: timing.store_timeout(),
            title: opts.title.clone(),
            asked: None,
            patience: setup_deadline.saturating_duration_since(tokio::time::Instant::now()),
        };
        // One waiter per slot may try at once: with N slots free and N
        // waiters, N run.
        Ticket::join_admitting(store.clone(), waiter, keys.len())
            .await
            .map(Some)
    };
    let (keeper, ticket) = tokio::join!(start.finish(), join_queue);
    let (mut keeper, mut ticket) = match (keeper, ticket) {
        (Ok(keeper), Ok(ticket)) => (keeper, ticket),
        (Err(e), ticket) => {
            if let Ok(Some(t)) = ticket {
                t.leave().await;
            }
            return Err(e);
        }
        (Ok(keeper), Err(e)) => {
            let _ = keeper.shutdown().await;
            return Err(e.into());
        }
    };
    let mut keeper_events = keeper.take_events();
    // Set once the keeper is gone: its event channel is read no more.
    let mut keeper_gone = false;
    let keeper = Arc::new(keeper);
    let ops = KeeperQueue::start(keeper.clone());

    // Where CMD asks for guarded writes; without it CMD runs all the same
    // (and `putex kv` says why it cannot write).
    let kv_path = opts.keeper_dir.join(format!("{instance}.kv.sock"));
    let kv_listener = match super::kv::KvListener::bind(kv_path.clone()) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(path = %kv_path.display(), error = %e, "cannot listen for the command's guarded writes (putex kv)");
            None
        }
    };
    let shared = Arc::new(Shared {
        opts: opts.clone(),
        store: store.clone(),
        keeper: keeper.clone(),
        ops,
        state: Mutex::new(State::default()),
        changed: Notify::new(),
        history: HistoryWriter::spawn(
            store.clone(),
            WriterConfig::new(&opts.name, &opts.node, &instance, "lock", timeout),
        ),
        persisting: Mutex::default(),
        kv_socket: kv_listener.as_ref().map(|l| l.path().to_owned()),
    });
    // CMD's guarded writes (`putex kv`), answered while the section runs.
    let _kv = kv_listener.map(|l| super::kv::KvServer::start(shared.clone(), keys.clone(), l));

    let mut queue_turn = ticket.as_ref().map(Ticket::turn);
    // A semaphore watches its slots, to compete for one free slot at a time
    // (a set: the watch ends with the section, however it ends).
    let mut slot_view = tokio::task::JoinSet::new();
    if keys.len() > 1 {
        shared.with(|s| s.spread = spread_of(&instance));
        slot_view.spawn(watch_free_slots(shared.clone(), keys.clone(), timeout));
    }

    // One agent per slot.
    let mut inputs = Vec::new();
    let mut drivers = tokio::task::JoinSet::new();
    for (slot, key) in keys.iter().enumerate() {
        // The lock's host state, shared with an agent (`putex run`) of the
        // same lock on this host, whose files of earlier releases it reads.
        let mut highest = HostState::new(&opts.keeper_dir, &opts.store_id, key);
        if keys::lock(&opts.name) == *key {
            highest = highest.with_agent_legacy(&opts.keeper_dir, &opts.store_id, &opts.name);
        }
        let mut agent = Agent::new(
            AgentConfig {
                highest_token: highest.load().and_then(|r| r.highest),
                supervised_stops: true,
                store_clock_step: store.clock_step(),
                ..AgentConfig::new(
                    Identity {
                        node: opts.node.to_string(),
                        machine: crate::identity::machine_id(),
                        instance: instance.to_string(),
                    },
                    timing.clone(),
                )
            },
            clock::boot_time_now(),
        );
        if ticket.is_some() {
            agent.handle(clock::boot_time_now(), Input::Turn(false));
        }
        let host = Arc::new(SlotHost {
            slot,
            shared: shared.clone(),
            highest,
            record_key: (keys::lock(&opts.name) != *key).then(|| key.clone()),
            pending: Mutex::default(),
        });
        let (tx, rx) = driver::input_channel();
        inputs.push(tx);
        let store = store.clone();
        let probe = keys::probe(&opts.node);
        let keys = Keys {
            lock: key.clone(),
            probe,
        };
        drivers.spawn(async move {
            let exit =
                driver::run_with_inputs(agent, store, keys, host, future::pending(), rx).await;
            (slot, exit)
        });
    }

    let wait_until = match opts.wait {
        Wait::Forever => None,
        Wait::For(d) => Some(tokio::time::Instant::now() + d),
        // Free a moment ago: a few round trips take it. The limit only
        // matters when another waiter took it in between; it is generous
        // so that a loaded machine still gets the lock it saw free.
        Wait::No => {
            Some(tokio::time::Instant::now() + timing.renew() * 2 + timeout.max(NO_WAIT_GRACE))
        }
    };
    let mut section = SectionState::new(keys.len());
    loop {
        let queue_ok = queue_turn.as_ref().is_none_or(|t| *t.borrow());
        let (round, spawned_at) = {
            let mut s = shared.lock();
            (Round::read(&mut s, queue_ok), s.spawned_at)
        };
        let winner = round.winner;
        for command in section.round(round) {
            let (slot, input) = match command {
                SlotCommand::Turn { slot, turn } => (slot, Input::Turn(turn)),
                SlotCommand::Shutdown { slot } => (slot, Input::Shutdown),
            };
            let _ = inputs[slot].unbounded_send(input);
        }
        let max_at = opts.max_duration.zip(spawned_at).map(|(d, at)| at + d);
        tokio::select! {
            () = shared.changed.notified() => {}
            changed = async { queue_turn.as_mut().expect("checked").changed().await }, if queue_turn.is_some() => {
                if changed.is_err() {
                    queue_turn = None;
                }
            }
            ev = keeper_events.recv(), if !keeper_gone => match ev.unwrap_or(KeeperEvent::Lost) {
                KeeperEvent::ChildExited(exit) => {
                    tracing::debug!(?exit, "command exited");
                    shared.with(|s| s.command_exited(exit, clock::boot_time_now()));
                    // CMD runs once: the next in line is admitted now and
                    // is ready when the slot is given back, instead of
                    // hearing of its turn only after the release. Not with
                    // --once: the run is recorded just before the release,
                    // and a waiter admitted before that could take another
                    // slot and run again in the same period.
                    if opts.once.is_none() {
                        if let Some(t) = ticket.as_mut() {
                            t.start_leaving();
                        }
                    }
                    // All that is left is giving the lock back: no watch
                    // needs to hear of other processes' writes at once.
                    if opts.exits_after {
                        store.prepare_exit();
                    }
                }
                KeeperEvent::Tree(_) => {}
                other => {
                    if other == KeeperEvent::Lost {
                        tracing::error!("the keeper is gone: CMD is stopped without it");
                        // CMD ran under a keeper that died: it is stopped
                        // (from the keeper's last tree snapshot) before the
                        // lock is given back, and the section ends as lost.
                        shared.with(|s| {
                            if s.spawned.is_some() && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| Reason::KeeperLost.to_string());
                            }
                        });
                    } else {
                        tracing::error!("the keeper's deadline passed: it stopped the command");
                        // The licence ended with CMD running: whatever exit
                        // the keeper's stop gave CMD (which may have been
                        // read first), the lock was lost (exit 76).
                        shared.with(|s| {
                            s.lost.get_or_insert_with(|| Reason::KeeperFired.to_string());
                        });
                    }
                    if let (Some(w), Some(input)) = (winner, other.to_input()) {
                        let _ = inputs[w].unbounded_send(input);
                    }
                    if other == KeeperEvent::Lost {
                        // No more events; keep waiting for the drivers.
                        keeper_gone = true;
                    }
                }
            },
            sig = signals.recv() => match sig {
                Some(sig) => {
                    if section.on_signal(sig, spawned_at.is_some()) == SignalAction::Forward {
                        tracing::info!(signal = sig, "forwarding the signal to the command");
                        if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                            let _ = keeper.signal(s).await;
                        }
                    }
                }
                None => {
                    signals = mpsc::unbounded_channel().1;
                }
            },
            () = sleep_until(wait_until), if section.waiting() => section.on_wait_over(),
            () = sleep_until(max_at), if max_at.is_some() && section.watching_the_duration() => {
                tracing::warn!(after = ?opts.max_duration, "the command ran past --max-duration; stopping it");
                section.on_max_duration();
            }
            joined = drivers.join_next() => match joined {
                Some(Ok((slot, exit))) => {
                    tracing::debug!(slot, ?exit, "slot agent exited");
                    section.on_agent_exit(slot, &exit);
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "slot agent failed");
                    section.on_agent_failed();
                }
                None => break,
            },
        }
    }
    slot_view.abort_all();
    // The lock is given back: out of line, the keeper told to go, the
    // history written — all at once, each a round trip of its own.
    if opts.exits_after {
        store.prepare_exit();
    }
    let st = std::mem::take(&mut *shared.lock());
    let leave = async {
        if let Some(t) = ticket {
            t.leave().await;
        }
    };
    let shutdown = async {
        if keeper.shutdown().await.is_err() {
            tracing::debug!("the keeper stays until its tree is gone");
        }
    };
    tokio::join!(
        leave,
        shutdown,
        shared.history.flush(Duration::from_secs(2)),
        shared.persisted(crate::host_state::LOCK_PATIENCE),
    );
    match section.conclude(st, opts.max_duration) {
        Conclusion::Outcome(outcome) => Ok(outcome),
        Conclusion::Error(e) => Err(e),
        Conclusion::NotAcquired => {
            let holder = busy(&store, &keys, timeout).await.ok().flatten();
            Ok(Outcome::NotAcquired { holder })
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => future::pending().await,
    }
}

/// For `Wait::No`: who holds the lock (every slot) or queues for it, if
/// anyone; `None` when a slot looks free now.
async fn busy(
    store: &AnyStore,
    keys: &[String],
    timeout: Duration,
) -> Result<Option<String>, StoreError> {
    let mut holder = None;
    for key in keys {
        match store.get(key, ReadMode::Leader, timeout).await? {
            None => return Ok(None),
            Some(e) => match crate::locks::guard::holder_in_the_way(&e.value) {
                None => return Ok(None),
                Some((node, Some(state))) => {
                    holder = Some(format!("{node} ({})", RecordState::from(state)))
                }
                Some((what, None)) => holder = Some(what),
            },
        }
    }
    Ok(holder)
}
