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
//! [`Lease::loss_signal`] hands the same news to any number of tasks (a
//! [`LossSignal`] clones, and each clone can await it, or turn it into a
//! [`CancellationToken`](tokio_util::sync::CancellationToken)). Releasing writes a `released` record, so the
//! next holder starts at once (H6, S3).
//!
//! [`Lease::try_acquire`] (and [`Lock::try_acquire`]) return at once with
//! [`LeaseError::Held`] when someone holds the lock, as `putex lock
//! --no-wait` does; [`Lease::acquire_timeout`] gives up with
//! [`LeaseError::TimedOut`]. Every error is a variant to match
//! ([`LeaseError`]).
//!
//! ```
//! use std::time::Duration;
//! use putex::locks::lease::{Lease, LeaseError, Lock, LeaseOptions};
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
//! let mut lock = Lock::new(store.clone(), LeaseOptions::new("report", "host-a", timing.clone())?)?;
//! let mut last = None;
//! for _ in 0..3 {
//!     let token = lock.acquire().await?;
//!     assert!(last.is_none_or(|t| token > t), "tokens increase");
//!     last = Some(token);
//!     // ... work ...
//!     assert!(lock.release().await?);
//! }
//! lock.close().await?;
//!
//! // Tasks that must stop when the lease is lost, each with its own signal.
//! let lease = Lease::acquire(store.clone(), LeaseOptions::new("report", "host-a", timing.clone())?).await?;
//! let signal = lease.loss_signal();
//! let worker = tokio::spawn({
//!     let signal = signal.clone();
//!     async move {
//!         tokio::select! {
//!             lost = signal.lost() => println!("stopping: {lost}"),
//!             () = tokio::time::sleep(Duration::from_millis(50)) => println!("work done"),
//!         }
//!     }
//! });
//! worker.await?;
//! assert!(!signal.is_lost());
//!
//! // Someone else's turn? Not now, and say who.
//! match Lease::try_acquire(store, LeaseOptions::new("report", "host-b", timing)?).await {
//!     Err(LeaseError::Held { holder, token, .. }) => {
//!         // `token` is the record's revision: the tenure's token, or a
//!         // later renewal's.
//!         assert_eq!(holder, "host-a");
//!         assert!(token >= lease.token());
//!     }
//!     other => panic!("{other:?}"),
//! }
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

mod error;
mod host;
mod signal;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use putex_core::{
    Agent, AgentConfig, ExitReason, Identity, Input, Reason, Role, Timing, TimingConfig, Token,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use self::error::{LeaseError, Lost};
pub(in crate::locks) use self::host::View;
use self::host::{LeaseTenure, LockHost};
pub use self::signal::LossSignal;
use super::guard::Guard;
use crate::clock;
use crate::driver::{self, Keys};
use crate::observe::metrics::Metrics;
use crate::store::{keys, AnyStore, Name, NameError, NodeId, ReadMode, Store};

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
#[must_use = "a lock stands by until it is closed or dropped; dropped at once, it never holds"]
pub struct Lock {
    name: Name,
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
            name: options.name,
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
        Some(self.guard_of(token))
    }

    /// Completes when the lock is no longer held — at once if it is not —
    /// with how its last tenure ended; from then on stop acting on the
    /// protected resource. (Other tasks can wait for the same through a
    /// [`Lock::loss_signal`].)
    pub async fn lost(&mut self) -> Lost {
        let held = self.view.borrow().held;
        match held {
            Some(token) => self.signal(token).lost().await,
            None => self
                .view
                .borrow()
                .ended
                .clone()
                .map_or(Lost::Released, |(_, how)| how),
        }
    }

    /// The end of the current tenure as a value any number of tasks can
    /// hold and await; `None` when the lock is not held.
    pub fn loss_signal(&self) -> Option<LossSignal> {
        self.token().map(|token| self.signal(token))
    }

    fn guard_of(&self, token: Token) -> Guard {
        Guard::of(
            self.store.clone(),
            self.key.clone(),
            token,
            Arc::new(LeaseTenure(self.view.clone())),
            &self.timing,
        )
    }

    fn signal(&self, token: Token) -> LossSignal {
        LossSignal {
            name: self.name.clone(),
            token,
            view: self.view.clone(),
        }
    }

    /// Takes the lock if nobody holds it, else returns at once with
    /// [`LeaseError::Held`] naming the holder, as `putex lock --no-wait`
    /// does. "Holds" is what the record says: a holder that died holds it
    /// until its record goes stale (W), which [`Lock::acquire_timeout`]
    /// waits for. A lock seen free is taken within a few round trips;
    /// should another program take it first, this gives up after
    /// 2R + 5 s with [`LeaseError::TimedOut`]. A store that does not
    /// answer the first read is [`LeaseError::Unavailable`].
    pub async fn try_acquire(&mut self) -> Result<Token, LeaseError> {
        if let Some(token) = self.token() {
            return Ok(token);
        }
        let entry = self
            .store
            .get(&self.key, ReadMode::Leader, self.timing.store_timeout())
            .await
            .map_err(LeaseError::Unavailable)?;
        if let Some(e) = entry {
            if let Some((holder, state)) = crate::locks::guard::holder_in_the_way(&e.value) {
                return Err(LeaseError::Held {
                    name: self.name.clone(),
                    holder,
                    state,
                    token: e.token,
                });
            }
        }
        let grace = self.timing.renew() * 2 + self.timing.store_timeout().max(NO_WAIT_GRACE);
        self.acquire_timeout(grace).await
    }

    /// [`Lock::acquire`], giving up after `wait` with
    /// [`LeaseError::TimedOut`]; nothing is held then.
    pub async fn acquire_timeout(&mut self, wait: Duration) -> Result<Token, LeaseError> {
        match tokio::time::timeout(wait, self.acquire()).await {
            Ok(done) => done,
            Err(_) => Err(LeaseError::TimedOut {
                name: self.name.clone(),
                waited: wait,
            }),
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

/// How long [`Lock::try_acquire`] may take over a lock it saw free (as
/// `putex lock --no-wait`).
const NO_WAIT_GRACE: Duration = Duration::from_secs(5);

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = self.view.borrow().role;
        f.debug_struct("Lock")
            .field("name", &self.name.as_str())
            .field("token", &self.token().map(|t| t.to_string()))
            .field("state", &role.to_string())
            .finish()
    }
}

/// One tenure of a lock: acquired, renewed in the background, released.
/// Dropping it gives the lock back in the background (see [`Lock`]);
/// [`Lease::release`] waits for that and says whether it was written.
#[must_use = "a lease dropped at once is given back at once"]
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

    /// Takes lock `options.name` if nobody holds it, else returns at once
    /// with [`LeaseError::Held`] (see [`Lock::try_acquire`]).
    pub async fn try_acquire(store: AnyStore, options: LeaseOptions) -> Result<Lease, LeaseError> {
        let mut lock = Lock::new(store, options)?;
        let token = lock.try_acquire().await?;
        Ok(Lease { lock, token })
    }

    /// [`Lease::acquire`], giving up after `wait` with
    /// [`LeaseError::TimedOut`].
    pub async fn acquire_timeout(
        store: AnyStore,
        options: LeaseOptions,
        wait: Duration,
    ) -> Result<Lease, LeaseError> {
        let mut lock = Lock::new(store, options)?;
        let token = lock.acquire_timeout(wait).await?;
        Ok(Lease { lock, token })
    }

    /// The token while the lease is held, else [`LeaseError::Lost`] with
    /// how it ended: a check before each action on the resource (which may
    /// still end at any moment: the token is what protects it).
    pub fn check(&self) -> Result<Token, LeaseError> {
        if !self.loss_signal().is_lost() {
            return Ok(self.token);
        }
        Err(LeaseError::Lost(
            self.lock.view.borrow().how_ended(self.token),
        ))
    }

    /// The end of this tenure as a value any number of tasks can hold and
    /// await.
    pub fn loss_signal(&self) -> LossSignal {
        self.lock.signal(self.token)
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
        self.lock.guard_of(self.token)
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

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.lock.name.as_str())
            .field("token", &self.token.to_string())
            .field("held", &self.is_held())
            .finish()
    }
}
