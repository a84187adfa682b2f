//! Named leases for Rust programs: the core's rules driven against a store.
//!
//! Two ways in, with the same rules (S1–S6 to acquire: staleness waits, the
//! fencing gap, the clean-release fast path; H1–H6 while holding):
//!
//! - [`Lock`] is a lock this program takes and gives back again and again.
//!   It keeps one agent and one watch on the record for its whole life, so
//!   it always knows the record: taking a lock its last holder released is
//!   **one CAS**, and so is giving it back. Use it for anything that locks
//!   more than once.
//! - [`Lease`] is one tenure: [`Lease::acquire`] starts an agent, waits until
//!   it holds the lock, and [`Lease::release`] gives it back and stops the
//!   agent. Besides the CAS it reads the record and sets up a watch first.
//!
//! While held, a lease is renewed in the background once per R. [`Lock::lost`]
//! (or [`Lease::lost`]) completes when it is lost — the licence ended, another
//! holder took it, or the record was revoked — and from then on the program
//! must stop acting on the protected resource: that is its emergency stop.
//! Releasing writes a `released` record, so the next holder starts at once
//! (H6, S3).
//!
//! ```
//! use std::time::Duration;
//! use putex::locks::lease::{Lease, Lock, LeaseOptions};
//! use putex::store::{AnyStore, MemoryStore};
//! use putex::core::TimingConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = AnyStore::from(MemoryStore::new());
//! // A fast profile for a single-process store: R = 100 ms, T = 300 ms, G = 100 ms.
//! let timing = TimingConfig {
//!     renew: Duration::from_millis(100),
//!     failures: 3,
//!     confirm: 1,
//!     ..TimingConfig::default()
//! };
//!
//! // One tenure.
//! let lease = Lease::acquire(store.clone(), LeaseOptions::new("report", "host-a", timing.clone())?).await?;
//! println!("holding with fencing token {}", lease.token());
//! // ... work, passing lease.token() to the protected resource ...
//! assert!(lease.is_held());
//! assert!(lease.release().await?);
//!
//! // Many tenures through one lock.
//! let mut lock = Lock::new(store, LeaseOptions::new("report", "host-a", timing)?)?;
//! let mut last = None;
//! for _ in 0..3 {
//!     let token = lock.acquire().await?;
//!     assert!(last.is_none_or(|t| token > t), "tokens increase");
//!     last = Some(token);
//!     // ... work ...
//!     assert!(lock.release().await?);
//! }
//! lock.close().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use futures::future::{self, BoxFuture, FutureExt};
use putex_core::{
    Agent, AgentConfig, Event, ExitReason, HealthMode, Identity, Input, Instant, KeeperCommand,
    LockRecord, LockState, LossCause, Reason, Role, StopKind, Timing, TimingConfig, TimingError,
    Token,
};
use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::observe::metrics::Metrics;

use super::guard::Guard;
use crate::store::{keys, AnyStore, Name, NameError, NodeId};

/// What a lease is for and how it is timed.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// The lock's name; its record is `lock.<name>`.
    pub name: Name,
    /// This node's id (e.g. the hostname).
    pub node: NodeId,
    /// R, F, C, ε and the rest.
    pub timing: TimingConfig,
    /// Where the lease records its store calls and progress; `None`:
    /// nowhere. One [`Metrics`] per lock, each in a sub-registry with a
    /// label of its own, keeps several locks' series apart.
    pub metrics: Option<Metrics>,
}

impl LeaseOptions {
    /// Options for lock `name` held as `node`, both checked here: a name is
    /// `[A-Za-z0-9_-]{1,64}`, a node id may also have dots (an FQDN).
    pub fn new(name: &str, node: &str, timing: TimingConfig) -> Result<Self, NameError> {
        Ok(LeaseOptions {
            name: name.parse()?,
            node: node.parse()?,
            timing,
            metrics: None,
        })
    }

    /// The same options, recording into `metrics`.
    pub fn with_metrics(self, metrics: Metrics) -> Self {
        LeaseOptions {
            metrics: Some(metrics),
            ..self
        }
    }
}

/// Why a lease could not be acquired or released.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// [`LeaseOptions::timing`] cannot work: validating it failed.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// The agent stopped (another machine runs with this node id, S5), or
    /// the lock was closed.
    #[error("the lease machine exited: {0:?}")]
    Exited(ExitReason),
}

/// Why a held lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The licence ended without a newer successful renewal (H1).
    LicenceEnded,
    /// The record is no longer ours: another holder, a revocation, or a
    /// store that lost or replaced it (H3, S6, S7).
    TakenOver(LossCause),
    /// Released on request.
    Released,
    /// Ended for another of the core's reasons (the keeper fired or died, a
    /// stop failed, …).
    Ended(Reason),
}

/// What the driver has told us about the agent.
#[derive(Clone, Debug)]
pub(super) struct View {
    role: Role,
    /// The fencing token of the current tenure, once active.
    pub(super) held: Option<Token>,
    /// When the licence ends (boot time), as the agent last told its
    /// "keeper". Checked against the clock at each call, so a view the
    /// driver task had no chance to update (a busy runtime) never claims a
    /// lock past its licence (H1).
    pub(super) licence_end: Option<Instant>,
    /// How the last tenure ended.
    ended: Option<Lost>,
    /// Transitions into standby so far, and the reason of the last one.
    standbys: u64,
    last_standby: Option<Reason>,
    /// The lock record this agent wrote last, and whether it says the
    /// lock is held (confirming or active): what guarded writes compare
    /// against.
    pub(super) record: Option<(Token, bool)>,
}

/// The host side of a lock: no hooks, no keeper; activation and loss are
/// notifications.
struct LockHost {
    view: watch::Sender<View>,
    /// Into the agent: `Turn(false)` on activation, so that a lost lock is
    /// never taken again behind the program's back.
    inputs: driver::InputSender,
    metrics: Option<Metrics>,
}

impl Host for LockHost {
    fn health_check(&self, _mode: HealthMode, _deadline: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(&self, token: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        self.view.send_modify(|v| {
            v.held = Some(token);
            v.ended = None;
        });
        future::ready(true).boxed()
    }

    fn stop(&self, _kind: StopKind, _deadline: Instant) -> BoxFuture<'static, bool> {
        // The program is the service: its loss was announced by the
        // transition before this stop; a graceful stop is its own release.
        future::ready(true).boxed()
    }

    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool> {
        // No keeper process: the program is the service. Its deadline is
        // the licence end, which `token()` compares with the clock.
        self.view.send_modify(|v| {
            v.licence_end = match command {
                KeeperCommand::Arm(d) | KeeperCommand::Extend(d) => Some(d),
                KeeperCommand::Disarm => None,
            }
        });
        future::ready(true).boxed()
    }

    fn persist_highest(&self, _token: Token) {}

    fn event(&self, event: &Event) {
        if let Event::AbsentWait { wait, why } = event {
            // Never in silence (S4): `putex id` and library users see it.
            tracing::warn!(
                "taken; waiting {:.1} s before it is held: {}",
                wait.as_secs_f64(),
                why.explain()
            );
        }
        let Event::Transition {
            from,
            to,
            reason,
            token,
        } = event
        else {
            return;
        };
        tracing::debug!(%from, %to, ?reason, "lease transition");
        if let Some(metrics) = &self.metrics {
            metrics.transition(*to, token.map(|t| t.revision));
        }
        if *to == Role::Active {
            // The driver reads host inputs first: this reaches the agent
            // before anything that follows the activation.
            let _ = self.inputs.unbounded_send(Input::Turn(false));
        }
        self.view.send_modify(|v| {
            v.role = *to;
            if matches!(from, Role::Active | Role::SteppingDown) && v.held.take().is_some() {
                v.ended = Some(match reason {
                    Reason::LicenceEnded => Lost::LicenceEnded,
                    Reason::Released | Reason::Shutdown | Reason::ReleaseRequested => {
                        Lost::Released
                    }
                    Reason::Lost(cause) => Lost::TakenOver(cause.clone()),
                    other => Lost::Ended(other.clone()),
                });
            }
            if *to == Role::Standby {
                v.standbys += 1;
                v.last_standby = Some(reason.clone());
            }
        });
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    fn lock_written(&self, token: Token, value: &[u8]) {
        let held = serde_json::from_slice::<LockRecord>(value)
            .is_ok_and(|r| matches!(r.state, LockState::Confirming | LockState::Active));
        self.view.send_modify(|v| {
            if v.record.is_none_or(|(t, _)| t < token) {
                v.record = Some((token, held));
            }
        });
    }
}

/// A lock this program takes and gives back, again and again.
///
/// It runs one agent, with one watch on the record, from [`Lock::new`] to
/// [`Lock::close`] (or drop), standing by between tenures without taking the
/// lock: so it always knows the record, and taking the lock from a
/// `released` record is a single CAS, as is giving it back. Tokens increase
/// from one tenure to the next, across every holder.
///
/// Dropping a lock closes it in the background: a held lock is given back
/// (graceful stop, `released` record) as by [`Lock::close`], without waiting
/// for it; an acquisition under way is abandoned. Should the runtime end
/// first, the lock goes stale after W instead, the slow, safe way.
pub struct Lock {
    host: Arc<LockHost>,
    /// For guards: the store, the lock's key and its timing.
    store: AnyStore,
    key: String,
    timing: Timing,
    view: watch::Receiver<View>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<ExitReason>>,
    exit: Option<ExitReason>,
}

impl Lock {
    /// Starts standing by for lock `options.name`; nothing is taken until
    /// [`Lock::acquire`]. Must be called within a Tokio runtime.
    pub fn new(store: AnyStore, options: LeaseOptions) -> Result<Lock, LeaseError> {
        let timing: Timing = options.timing.validate()?;
        let keys = Keys {
            lock: keys::lock(&options.name),
            probe: keys::probe(&options.node),
        };
        let identity = Identity {
            node: options.node.to_string(),
            machine: crate::identity::machine_id(),
            instance: crate::identity::instance_id(),
        };
        let now = clock::boot_time_now();
        let mut agent = Agent::new(
            // The program is the service: it only hears of a loss.
            AgentConfig {
                store_clock_step: store.clock_step(),
                ..AgentConfig::new(identity, timing.clone())
            },
            now,
        );
        agent.handle(now, Input::Turn(false));
        let (view_tx, view) = watch::channel(View {
            role: agent.role(),
            held: None,
            licence_end: None,
            ended: None,
            standbys: 0,
            last_standby: None,
            record: None,
        });
        let (inputs, inputs_rx) = driver::input_channel();
        let host = Arc::new(LockHost {
            view: view_tx,
            inputs,
            metrics: options.metrics.clone(),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let key = keys.lock.clone();
        let task = tokio::spawn(driver::run_with_inputs(
            agent,
            store.clone(),
            keys,
            host.clone(),
            async move {
                let _ = shutdown_rx.await;
            },
            inputs_rx,
        ));
        Ok(Lock {
            host,
            store,
            key,
            timing,
            view,
            shutdown: Some(shutdown_tx),
            task: Some(task),
            exit: None,
        })
    }

    /// Waits until this lock is held and returns its fencing token (at once
    /// if it is held already).
    ///
    /// On first use of a name (no record yet) this takes W + G' (S4; less
    /// what the store proves of the name's vacancy: `docs/stores.md`); over a
    /// released record it takes one CAS once the record is known (S3); over
    /// a live holder it waits for that holder to release or go stale.
    /// Cancel-safe: a cancelled acquisition never leaves the lock held.
    pub async fn acquire(&mut self) -> Result<Token, LeaseError> {
        if let Some(token) = self.token() {
            return Ok(token);
        }
        self.host.view.send_modify(|v| v.ended = None);
        let mut guard = WithdrawOnDrop {
            inputs: self.host.inputs.clone(),
            armed: true,
        };
        self.send(Input::Turn(true));
        loop {
            let (held, role) = {
                let v = self.view.borrow_and_update();
                (v.held, v.role)
            };
            if let Some(token) = held {
                guard.armed = false;
                return Ok(token);
            }
            if role == Role::Exited || self.view.changed().await.is_err() {
                guard.armed = false;
                return Err(LeaseError::Exited(self.exit_reason().await));
            }
        }
    }

    /// The fencing token while the lock is held: pass it to the protected
    /// resource. `None` once the licence has ended by the clock, even if
    /// the agent (a task on this runtime) has not run since.
    pub fn token(&self) -> Option<Token> {
        let v = self.view.borrow();
        let live = v
            .licence_end
            .is_some_and(|end| clock::boot_time_now() < end);
        v.held.filter(|_| live)
    }

    /// Whether the lock is held (it may end at any moment: prefer
    /// [`Lock::lost`]).
    pub fn is_held(&self) -> bool {
        self.token().is_some()
    }

    /// Guarded writes for the current tenure: the store makes them only
    /// while this tenure holds the lock (`docs/locks.md`, "Guarded
    /// writes"). `None` when the lock is not held.
    pub fn guard(&self) -> Option<Guard> {
        let token = self.token()?;
        Some(Guard::new(
            self.store.clone(),
            self.key.clone(),
            token,
            self.view.clone(),
            &self.timing,
        ))
    }

    /// Completes when the lock is no longer held — at once if it is not —
    /// with how its last tenure ended; from then on stop acting on the
    /// protected resource.
    pub async fn lost(&mut self) -> Lost {
        loop {
            let end = {
                let v = self.view.borrow_and_update();
                if v.held.is_none() {
                    return v.ended.clone().unwrap_or(Lost::Released);
                }
                v.licence_end
            };
            // The licence end by the clock, whether or not the agent has
            // had a chance to notice it yet.
            let Some(end) = end.filter(|e| clock::boot_time_now() < *e) else {
                return Lost::LicenceEnded;
            };
            tokio::select! {
                changed = self.view.changed() => {
                    if changed.is_err() {
                        return Lost::LicenceEnded;
                    }
                }
                () = tokio::time::sleep(clock::until(end)) => {}
            }
        }
    }

    /// Gives the lock back: a `released` record lets the next holder start
    /// at once. Returns whether the release was written; `false` when the
    /// lock was not held, or was lost meanwhile (if held and the write
    /// failed, the lock goes stale after W).
    pub async fn release(&mut self) -> Result<bool, LeaseError> {
        let before = {
            let v = self.view.borrow_and_update();
            if v.role == Role::Standby || v.role == Role::Exited {
                return Ok(false);
            }
            v.standbys
        };
        self.send(Input::Turn(false));
        self.send(Input::Release);
        loop {
            let role = {
                let v = self.view.borrow_and_update();
                if v.standbys > before {
                    return Ok(v.last_standby == Some(Reason::Released));
                }
                v.role
            };
            if role == Role::Exited || self.view.changed().await.is_err() {
                return Err(LeaseError::Exited(self.exit_reason().await));
            }
        }
    }

    /// Releases the lock if held, stops the agent, and returns whether a
    /// release was written.
    pub async fn close(mut self) -> Result<bool, LeaseError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.exit_reason().await {
            ExitReason::Shutdown { released } => Ok(released),
            other => Err(LeaseError::Exited(other)),
        }
    }

    fn send(&self, input: Input) {
        // A closed channel means the agent exited; the caller finds out
        // from the view.
        let _ = self.host.inputs.unbounded_send(input);
    }

    async fn exit_reason(&mut self) -> ExitReason {
        if let Some(task) = self.task.take() {
            let reason = task
                .await
                .unwrap_or(ExitReason::Shutdown { released: false });
            self.exit = Some(reason);
        }
        self.exit
            .clone()
            .unwrap_or(ExitReason::Shutdown { released: false })
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Dropping the shutdown sender asks the agent to shut down (H2, H6:
        // step down while renewing, release, exit); its task finishes alone.
        self.shutdown.take();
    }
}

/// Takes back the turn an acquisition asked for, and gives back what it
/// may have taken, when that acquisition is cancelled.
struct WithdrawOnDrop {
    inputs: driver::InputSender,
    armed: bool,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.inputs.unbounded_send(Input::Turn(false));
            let _ = self.inputs.unbounded_send(Input::Release);
        }
    }
}

/// One tenure of a lock: acquired, renewed in the background, released.
/// Dropping it gives the lock back in the background (see [`Lock`]);
/// [`Lease::release`] waits for that and says whether it was written.
pub struct Lease {
    lock: Lock,
    token: Token,
}

impl Lease {
    /// Waits until this process holds lock `options.name`.
    ///
    /// On first use of a name (no record yet) this takes W + G' (S4; less
    /// what the store proves of the name's vacancy: `docs/stores.md`); over a
    /// released record it takes a few store round trips (S3); over a live
    /// holder it waits for that holder to release or go stale.
    pub async fn acquire(store: AnyStore, options: LeaseOptions) -> Result<Lease, LeaseError> {
        let mut lock = Lock::new(store, options)?;
        let token = lock.acquire().await?;
        Ok(Lease { lock, token })
    }

    /// The fencing token of this tenure: pass it to the protected resource.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Whether the lease is still held (it may end at any moment: prefer
    /// [`Lease::lost`]).
    pub fn is_held(&self) -> bool {
        self.lock.token() == Some(self.token)
    }

    /// Guarded writes for this tenure: the store makes them only while
    /// this lease holds the lock (`docs/locks.md`, "Guarded writes"); once
    /// it is lost or released they fail with
    /// [`GuardError::NotHeld`](super::guard::GuardError::NotHeld).
    pub fn guard(&self) -> Guard {
        Guard::new(
            self.lock.store.clone(),
            self.lock.key.clone(),
            self.token,
            self.lock.view.clone(),
            &self.lock.timing,
        )
    }

    /// Completes when the lease is lost; from then on stop acting on the
    /// protected resource.
    pub async fn lost(&mut self) -> Lost {
        self.lock.lost().await
    }

    /// Hands the lease over: a `released` record lets the next holder start
    /// at once. Returns whether the release was written (if not, the lock
    /// goes stale after W).
    pub async fn release(self) -> Result<bool, LeaseError> {
        self.lock.close().await
    }
}
