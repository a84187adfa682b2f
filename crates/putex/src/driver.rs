//! The driver: runs a core [`Agent`] against a store, the boot-time clock and
//! a [`Host`] that carries out everything else.
//!
//! The loop is quinn's: feed the machine one input with the current
//! `CLOCK_BOOTTIME` reading, drain its outputs, sleep until its next timeout.
//! Nothing that takes time blocks the machine: store calls run concurrently
//! inside the driver's task (a set of futures polled alongside its other
//! sources), and a health check, hook or stop runs as its own task that
//! comes back as an [`Input`] on a channel — unless its future is ready at
//! once (a host with nothing to run: the lease library, a gateway), when it
//! is fed back at once. Store calls get their
//! deadline from the machine (H5) and are reported as `Unknown` when it
//! passes. A watch on the lock record, polled by the driver's task itself,
//! turns changes into [`Input::Watch`] and is re-established from the last
//! seen revision when it breaks.
//!
//! One process may run 10,000 drivers (one per lease): a driver is one task,
//! and its channels ([`InputSender`]) cost a few hundred bytes until used.
//!
//! The driver holds no safety logic of its own: every decision is the core's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{BoxStream, FuturesUnordered};
use futures::StreamExt;
use putex_core::{
    Agent, Blocker, Event, ExitReason, HealthMode, Input, Instant, KeeperCommand, Key, Output,
    StopKind, StoreOp, StoreOutcome, Token,
};

use crate::clock;
use crate::observe::metrics::Metrics;
use crate::store::{AnyStore, ReadMode, Store};

/// Everything the driver asks of the host besides the store: hooks, the
/// service, the keeper and the host state file. The agent CLI implements it
/// with hooks and a keeper; the lease library with notifications.
///
/// Futures must finish by their deadline (reporting failure if they had to
/// give up); the driver does not wait for them in any case.
pub trait Host: Send + Sync + 'static {
    /// Runs the health check with `mode` as its last argument.
    fn health_check(&self, mode: HealthMode, deadline: Instant) -> BoxFuture<'static, bool>;
    /// Runs the fence hook; `true` when it succeeded.
    fn fence(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool>;
    /// Starts the service; `true` when it started.
    fn activate(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool>;
    /// Stops the service; `true` only with proof that it stopped (H6).
    fn stop(&self, kind: StopKind, deadline: Instant) -> BoxFuture<'static, bool>;
    /// Passes a command to the keeper, in the order given; the future says
    /// whether the keeper carried it out (`false`: refused, failed or
    /// unreachable). The core starts the service only once the keeper
    /// acknowledged the tenure's `Arm`. A host without a keeper answers
    /// `true` at once.
    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool>;
    /// Persists the highest fencing token seen for the lock (S6).
    fn persist_highest(&self, token: Token);
    /// Runs the rejoin hook (O4) against `holder`; `true` when it exited 0.
    /// A host without one has nothing to rejoin.
    fn rejoin(&self, holder: Option<String>, deadline: Instant) -> BoxFuture<'static, bool> {
        let _ = (holder, deadline);
        futures::future::ready(true).boxed()
    }
    /// Runs `--position` now rather than at its next round; its result
    /// comes back as `Input::Position` (O1: a switchover's target catching
    /// up). A host without `--position` ignores it.
    fn sample_position(&self) {}
    /// Something worth logging or observing happened.
    fn event(&self, event: &Event);
    /// Why the machine would not take the lock over now (`None`: it would,
    /// or holds it), after each step: what status shows as "why not".
    fn candidacy(&self, blocker: Option<Blocker>) {
        let _ = blocker;
    }
    /// Failsafe (F1): the core's answer to the request the host injected
    /// as `Input::Failsafe` with this `id`. A host that injects none
    /// never hears of one.
    fn failsafe_answer(&self, id: u64, answer: putex_core::FailsafeAnswer) {
        let _ = (id, answer);
    }
    /// Failsafe (F3): asks every one of `members` for a grant of this
    /// holding at `token` in `round`, all at once, by `deadline`; the
    /// future gives the members that granted. A host without failsafe
    /// asks nobody, and a round nobody granted extends nothing.
    fn failsafe_ask(
        &self,
        round: u64,
        token: Token,
        members: Vec<putex_core::FailsafeMember>,
        deadline: Instant,
    ) -> BoxFuture<'static, Vec<putex_core::FailsafeMember>> {
        let _ = (round, token, members, deadline);
        futures::future::ready(Vec::new()).boxed()
    }
    /// Where the driver records its progress and store calls, if anywhere.
    fn metrics(&self) -> Option<&Metrics> {
        None
    }
    /// A write of the lock record by this machine landed at `token` with
    /// `value` (before the machine hears of it): what guarded writes
    /// compare against (`docs/locks.md`, "Guarded writes").
    fn lock_written(&self, token: Token, value: &[u8]) {
        let _ = (token, value);
    }
}

/// Where the driver's machine keeps its records.
#[derive(Clone, Debug)]
pub struct Keys {
    /// The lock record's key.
    pub lock: String,
    /// This node's probe record's key.
    pub probe: String,
}

impl Keys {
    fn of(&self, key: Key) -> &str {
        match key {
            Key::Lock => &self.lock,
            Key::Probe => &self.probe,
        }
    }
}

/// Runs `agent` until it exits, and returns why.
///
/// When `shutdown` completes the agent is asked to stop gracefully (H2, H6:
/// graceful stop while still renewing, then release); the driver keeps
/// running it until it has done so.
pub async fn run(
    agent: Agent,
    store: AnyStore,
    keys: Keys,
    host: Arc<dyn Host>,
    shutdown: impl Future<Output = ()>,
) -> ExitReason {
    let (_inject, inputs) = input_channel();
    run_with_inputs(agent, store, keys, host, shutdown, inputs).await
}

/// Sends a driver inputs from the host's own sources ([`run_with_inputs`]).
pub type InputSender = mpsc::UnboundedSender<Input>;
/// The driver's end of an [`InputSender`].
pub type InputReceiver = mpsc::UnboundedReceiver<Input>;

/// A channel of inputs for [`run_with_inputs`]: unbounded, in order, and
/// small until used (futures' channel allocates per message; tokio's
/// allocates a block of 32 inputs up front, 2.6 KB per driver).
pub fn input_channel() -> (InputSender, InputReceiver) {
    mpsc::unbounded()
}

/// [`run`], with a channel for inputs that come from the host's own sources
/// (the keeper's `fired`, `child-exited` and its loss). When every sender of
/// `inputs` is gone the channel is simply no longer read.
pub fn run_with_inputs(
    agent: Agent,
    store: AnyStore,
    keys: Keys,
    host: Arc<dyn Host>,
    shutdown: impl Future<Output = ()>,
    inputs: InputReceiver,
) -> impl Future<Output = ExitReason> {
    // The machine (2 KB) is boxed: an async fn keeps its arguments twice in
    // its state (rust-lang/rust#62958), and a process may run 10,000 drivers.
    drive(Box::new(agent), store, keys, host, shutdown, inputs)
}

async fn drive(
    mut agent: Box<Agent>,
    store: AnyStore,
    keys: Keys,
    host: Arc<dyn Host>,
    shutdown: impl Future<Output = ()>,
    mut inputs: InputReceiver,
) -> ExitReason {
    let mut inputs_open = true;
    let mut tasks = HostTasks::new();
    let mut changes = lock_changes(store.clone(), keys.lock.clone());
    let mut shutdown = std::pin::pin!(shutdown);
    let mut shutting_down = false;
    let mut calls = StoreCalls::new();
    // One timer, moved only when the machine's next timeout moves: most
    // steps (a store reply, a watch event) leave it where it was.
    let mut timer = std::pin::pin!(tokio::time::sleep(NO_TIMEOUT));
    let mut timer_for = None;
    let exit = loop {
        let mut exited = None;
        while let Some(output) = agent.poll_output() {
            match output {
                Output::Exit(reason) => exited = Some(reason),
                other => {
                    if let Some(input) =
                        dispatch(other, &store, &keys, &host, &mut tasks, &mut calls)
                    {
                        agent.handle(clock::boot_time_now(), input);
                    }
                }
            }
        }
        if let Some(reason) = exited {
            break reason;
        }
        host.candidacy(agent.blocker());
        if let Some(metrics) = host.metrics() {
            metrics.progress();
        }
        let next = agent.poll_timeout();
        if next != timer_for || timer.is_elapsed() {
            timer_for = next;
            let sleep = next.map_or(NO_TIMEOUT, clock::until);
            timer.as_mut().reset(tokio::time::Instant::now() + sleep);
        }
        // The host's own inputs go first: one it sends while an output is
        // dispatched (the lease library's `Turn(false)` on activation) must
        // reach the machine before anything that output leads to.
        tokio::select! {
            biased;
            input = inputs.next(), if inputs_open => match input {
                Some(input) => agent.handle(clock::boot_time_now(), input),
                None => inputs_open = false,
            },
            Some(input) = calls.next(), if !calls.is_empty() => {
                agent.handle(clock::boot_time_now(), input);
            }
            input = tasks.next(), if tasks.running > 0 => {
                agent.handle(clock::boot_time_now(), input);
            }
            Some(input) = changes.next() => agent.handle(clock::boot_time_now(), input),
            () = &mut timer => agent.handle_timeout(clock::boot_time_now()),
            () = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                agent.handle(clock::boot_time_now(), Input::Shutdown);
            }
        }
    };
    exit
}

/// Store calls under way, each ending in the input that reports it.
type StoreCalls = FuturesUnordered<BoxFuture<'static, Input>>;

/// How long the driver sleeps when the machine has no timeout.
const NO_TIMEOUT: Duration = Duration::from_secs(3600);

/// Checks, hooks and stops running as tasks of their own, each reporting
/// back with its input. Their channel is read only while one runs: a
/// process may run 10,000 drivers, and each look at an empty channel
/// costs a cache miss or two on every step of every driver.
struct HostTasks {
    tx: InputSender,
    rx: InputReceiver,
    /// Tasks started whose input has not been taken yet.
    running: usize,
}

impl HostTasks {
    fn new() -> HostTasks {
        let (tx, rx) = input_channel();
        HostTasks { tx, rx, running: 0 }
    }

    /// The next task's input (the driver holds a sender: never ends).
    async fn next(&mut self) -> Input {
        let input = self.rx.next().await.expect("the driver holds a sender");
        self.running -= 1;
        input
    }
}

/// Carries out one output. A store call joins `calls`; a check, hook or stop
/// that finished on its first poll is returned as the input it makes, and
/// one still running becomes one of the host's `tasks`.
fn dispatch(
    output: Output,
    store: &AnyStore,
    keys: &Keys,
    host: &Arc<dyn Host>,
    tasks: &mut HostTasks,
    calls: &mut StoreCalls,
) -> Option<Input> {
    match output {
        Output::Store(request) => {
            let store = store.clone();
            let key = keys.of(store_key(&request.op)).to_owned();
            let metrics = host.metrics().cloned();
            // The lock record as written, for the host to hear of it.
            let written = match &request.op {
                StoreOp::Create {
                    key: Key::Lock,
                    value,
                }
                | StoreOp::Update {
                    key: Key::Lock,
                    value,
                    ..
                }
                | StoreOp::Put {
                    key: Key::Lock,
                    value,
                } => Some((host.clone(), value.clone())),
                _ => None,
            };
            calls.push(Box::pin(async move {
                let timeout = clock::until(request.deadline);
                let op = op_name(&request.op);
                let started = std::time::Instant::now();
                let outcome = perform(&store, &key, request.op, timeout).await;
                if let (
                    Some((host, value)),
                    StoreOutcome::Written(token) | StoreOutcome::Created { token, .. },
                ) = (written, &outcome)
                {
                    host.lock_written(*token, &value);
                }
                tracing::trace!(
                    op,
                    key = %key,
                    outcome = outcome_name(&outcome),
                    took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                    "store call"
                );
                if let Some(metrics) = metrics {
                    metrics.store_call(op, outcome_name(&outcome), started.elapsed());
                }
                Input::Store {
                    id: request.id,
                    outcome,
                }
            }));
            None
        }
        Output::HealthCheck { id, mode, deadline } => {
            run_or_spawn(host.health_check(mode, deadline), tasks, move |ok| {
                Input::Health { id, ok }
            })
        }
        Output::Fence {
            token,
            previous,
            deadline,
        } => run_or_spawn(host.fence(token, previous, deadline), tasks, |ok| {
            Input::Hook {
                hook: putex_core::Hook::Fence,
                ok,
            }
        }),
        Output::Activate {
            token,
            previous,
            deadline,
        } => run_or_spawn(host.activate(token, previous, deadline), tasks, |ok| {
            Input::Hook {
                hook: putex_core::Hook::Activate,
                ok,
            }
        }),
        Output::Rejoin { holder, deadline } => {
            run_or_spawn(host.rejoin(holder, deadline), tasks, |ok| Input::Hook {
                hook: putex_core::Hook::Rejoin,
                ok,
            })
        }
        Output::Stop { id, kind, deadline } => {
            run_or_spawn(host.stop(kind, deadline), tasks, move |ok| Input::Stopped {
                id,
                ok,
            })
        }
        Output::Keeper(command) => run_or_spawn(host.keeper(command), tasks, move |ok| {
            Input::KeeperAck { command, ok }
        }),
        Output::PersistHighest(token) => {
            host.persist_highest(token);
            None
        }
        Output::SamplePosition => {
            host.sample_position();
            None
        }
        Output::FailsafeAsk {
            round,
            token,
            members,
            deadline,
        } => run_or_spawn(
            host.failsafe_ask(round, token, members, deadline),
            tasks,
            move |granted| Input::FailsafeVerdicts { round, granted },
        ),
        Output::FailsafeAnswer { id, answer } => {
            host.failsafe_answer(id, answer);
            None
        }
        Output::Event(event) => {
            host.event(&event);
            None
        }
        Output::Exit(_) => None,
    }
}

/// Polls `work` once: finished, its input is returned; otherwise it goes on
/// as one of `tasks`, which sends its input when done.
fn run_or_spawn<T: Send + 'static>(
    mut work: BoxFuture<'static, T>,
    tasks: &mut HostTasks,
    input: impl FnOnce(T) -> Input + Send + 'static,
) -> Option<Input> {
    if let Some(ok) = (&mut work).now_or_never() {
        return Some(input(ok));
    }
    tasks.running += 1;
    let tx = tasks.tx.clone();
    tokio::spawn(async move {
        let ok = work.await;
        let _ = tx.unbounded_send(input(ok));
    });
    None
}

fn op_name(op: &StoreOp) -> &'static str {
    match op {
        StoreOp::Get { .. } => "get",
        StoreOp::Create { .. } => "create",
        StoreOp::Update { .. } => "update",
        StoreOp::Put { .. } => "put",
    }
}

fn outcome_name(outcome: &StoreOutcome) -> &'static str {
    match outcome {
        StoreOutcome::Written(_) | StoreOutcome::Created { .. } | StoreOutcome::Read(_) => "ok",
        StoreOutcome::Conflict => "conflict",
        StoreOutcome::Unknown => "unknown",
        StoreOutcome::Failed(_) => "failed",
    }
}

fn store_key(op: &StoreOp) -> Key {
    match op {
        StoreOp::Get { key, .. }
        | StoreOp::Create { key, .. }
        | StoreOp::Update { key, .. }
        | StoreOp::Put { key, .. } => *key,
    }
}

/// Performs one store operation and classifies its outcome.
async fn perform(store: &AnyStore, key: &str, op: StoreOp, timeout: Duration) -> StoreOutcome {
    let result = match op {
        StoreOp::Get { leader, .. } => {
            let mode = if leader {
                ReadMode::Leader
            } else {
                ReadMode::Any
            };
            return match store.get(key, mode, timeout).await {
                Ok(entry) => StoreOutcome::Read(entry),
                Err(e) => failed(&e),
            };
        }
        StoreOp::Create {
            key: Key::Lock,
            value,
        } => {
            // S4 refined: the store says how long the key was vacant.
            return match store.create_vacant(key, &value, timeout).await {
                Ok(c) if c.vacant_for.is_zero() => StoreOutcome::Written(c.token),
                Ok(c) => StoreOutcome::Created {
                    token: c.token,
                    vacant_for: c.vacant_for,
                },
                Err(e) => failed(&e),
            };
        }
        StoreOp::Create { value, .. } => store.create(key, &value, timeout).await,
        StoreOp::Update {
            value, expected, ..
        } => store.update(key, &value, expected, timeout).await,
        StoreOp::Put { value, .. } => store.put(key, &value, timeout).await,
    };
    match result {
        Ok(token) => StoreOutcome::Written(token),
        Err(e) => failed(&e),
    }
}

/// The outcome of a call that did not succeed; a call that timed out, or
/// was refused, is logged at debug (a conflict is an answer, not a fault).
fn failed(e: &crate::store::StoreError) -> StoreOutcome {
    let outcome = e.outcome();
    if !matches!(outcome, StoreOutcome::Conflict) {
        tracing::debug!(error = %e, "store call failed");
    }
    outcome
}

/// Changes of the lock record as inputs for the machine: a stream that never
/// ends, re-establishing the watch from the last seen revision whenever it
/// breaks (after a pause). Polling by the machine covers the gaps.
fn lock_changes(store: AnyStore, key: String) -> BoxStream<'static, Input> {
    struct Watching {
        store: AnyStore,
        key: String,
        from: Option<u64>,
        stream: Option<crate::store::WatchStream>,
    }
    let start = Watching {
        store,
        key,
        from: None,
        stream: None,
    };
    futures::stream::unfold(start, |mut w| async move {
        loop {
            if let Some(stream) = &mut w.stream {
                if let Some(Ok(event)) = stream.next().await {
                    w.from = Some(event.revision + 1);
                    return Some((Input::Watch(event.entry), w));
                }
                w.stream = None;
            } else {
                match w.store.watch(&w.key, w.from, Duration::from_secs(2)).await {
                    Ok(stream) => {
                        w.stream = Some(stream);
                        continue;
                    }
                    Err(e) => tracing::debug!(key = %w.key, error = %e, "watch failed; retrying"),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .boxed()
}
