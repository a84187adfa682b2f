//! A named lease for Rust programs: the core's rules driven against a store.
//!
//! [`Lease::acquire`] waits until this process holds the lock named `name`
//! by every rule of the agent (S1–S6: staleness waits, the fencing gap,
//! the clean-release fast path) and returns a [`Lease`] carrying its fencing
//! token. While the lease is held it is renewed in the background once per R
//! (H1–H5). [`Lease::lost`] completes when it is lost — the licence ended,
//! another holder took it, or the record was revoked — and from then on the
//! program must stop acting on the protected resource: that is the lease's
//! emergency stop. [`Lease::release`] hands it over at once (H6, S3).
//!
//! ```
//! use std::time::Duration;
//! use putex::lease::{Lease, LeaseOptions};
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
//! let mut lease = Lease::acquire(store, LeaseOptions::new("report", "host-a", timing)).await?;
//! println!("holding with fencing token {}", lease.token());
//! // ... work, passing lease.token() to the protected resource ...
//! assert!(lease.is_held());
//! let released = lease.release().await?;
//! assert!(released);
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex};

use futures::future::{self, BoxFuture, FutureExt};
use putex_core::{
    Agent, AgentConfig, Event, ExitReason, HealthMode, Identity, Instant, KeeperCommand, Reason,
    Role, StopKind, Timing, TimingConfig, TimingError, Token,
};
use thiserror::Error;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::store::{keys, AnyStore};

/// What a lease is for and how it is timed.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// The lock name: `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// This node's id (e.g. the hostname).
    pub node: String,
    /// R, F, C, ε and the rest.
    pub timing: TimingConfig,
}

impl LeaseOptions {
    /// Options for lock `name` held as `node`.
    pub fn new(name: impl Into<String>, node: impl Into<String>, timing: TimingConfig) -> Self {
        LeaseOptions {
            name: name.into(),
            node: node.into(),
            timing,
        }
    }
}

/// Why a lease could not be acquired or released.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The timing settings cannot work.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// The lock or node name is not valid.
    #[error(transparent)]
    Name(#[from] keys::NameError),
    /// The agent stopped before the lease was held.
    #[error("the lease machine exited before acquiring: {0:?}")]
    Exited(ExitReason),
}

/// Why a held lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The licence ended without a newer successful renewal (H1).
    LicenceEnded,
    /// Another holder, a revocation or a store regression (H3, S6, S7).
    TakenOver(String),
    /// Released on request.
    Released,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Held(Token),
    Ended(Lost),
}

/// The host side of a lease: no hooks, no keeper; activation and
/// emergency stops are notifications.
struct LeaseHost {
    state: watch::Sender<State>,
}

impl Host for LeaseHost {
    fn health_check(&self, _mode: HealthMode, _deadline: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(&self, token: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        self.state.send_replace(State::Held(token));
        future::ready(true).boxed()
    }

    fn stop(&self, kind: StopKind, _deadline: Instant) -> BoxFuture<'static, bool> {
        // The program is the service: an emergency stop is the notification
        // that it must stop acting; a graceful one is its own release call.
        if kind == StopKind::Emergency {
            self.state.send_if_modified(|s| {
                if matches!(s, State::Held(_)) {
                    *s = State::Ended(Lost::LicenceEnded);
                    true
                } else {
                    false
                }
            });
        }
        future::ready(true).boxed()
    }

    fn keeper(&self, _command: KeeperCommand) {}

    fn persist_highest(&self, _token: Token) {}

    fn event(&self, event: &Event) {
        if let Event::Transition {
            from, to, reason, ..
        } = event
        {
            tracing::debug!(%from, %to, ?reason, "lease transition");
            if matches!(from, Role::Active | Role::SteppingDown) {
                let lost = match reason {
                    Reason::LicenceEnded => Lost::LicenceEnded,
                    Reason::Released | Reason::Shutdown => Lost::Released,
                    other => Lost::TakenOver(format!("{other:?}")),
                };
                self.state.send_if_modified(|s| {
                    if matches!(s, State::Held(_)) {
                        *s = State::Ended(lost);
                        true
                    } else {
                        false
                    }
                });
            }
        }
    }
}

/// A held lease. Dropping it without [`Lease::release`] stops renewing it;
/// the lock then goes stale after W, the slow, safe way.
pub struct Lease {
    token: Token,
    state: watch::Receiver<State>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<ExitReason>>,
}

impl Lease {
    /// Waits until this process holds lock `options.name`.
    ///
    /// On first use of a name (no record yet) this takes W + G (S4); over a
    /// released record it takes a few store round trips (S3); over a live
    /// holder it waits for that holder to release or go stale.
    pub async fn acquire(store: AnyStore, options: LeaseOptions) -> Result<Lease, LeaseError> {
        let timing: Timing = options.timing.validate()?;
        let keys = Keys {
            lock: keys::lock(&options.name)?,
            probe: keys::probe(&options.node)?,
        };
        let identity = Identity {
            node: options.node.clone(),
            machine: machine_id(),
            instance: instance_id(),
        };
        let agent = Agent::new(
            AgentConfig {
                identity,
                timing,
                previous: None,
                highest_token: None,
                mutations: Default::default(),
            },
            clock::boot_time_now(),
        );
        let (state_tx, mut state) = watch::channel(State::Waiting);
        let host = Arc::new(LeaseHost { state: state_tx });
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let mut task = tokio::spawn(driver::run(agent, store, keys, host, async move {
            let _ = shutdown_rx.await;
        }));
        loop {
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let held = match *state.borrow() {
                        State::Held(token) => Some(token),
                        _ => None,
                    };
                    if let Some(token) = held {
                        return Ok(Lease {
                            token,
                            state,
                            shutdown: Some(shutdown_tx),
                            task: Some(task),
                        });
                    }
                }
                exit = &mut task => {
                    let reason = exit.unwrap_or(ExitReason::Shutdown { released: false });
                    return Err(LeaseError::Exited(reason));
                }
            }
        }
        let reason = task
            .await
            .unwrap_or(ExitReason::Shutdown { released: false });
        Err(LeaseError::Exited(reason))
    }

    /// The fencing token of this tenure: pass it to the protected resource.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Whether the lease is still held (it may end at any moment: prefer
    /// [`Lease::lost`]).
    pub fn is_held(&self) -> bool {
        matches!(*self.state.borrow(), State::Held(_))
    }

    /// Completes when the lease is lost; from then on stop acting on the
    /// protected resource.
    pub async fn lost(&mut self) -> Lost {
        loop {
            if let State::Ended(lost) = &*self.state.borrow_and_update() {
                return lost.clone();
            }
            if self.state.changed().await.is_err() {
                return Lost::LicenceEnded;
            }
        }
    }

    /// Hands the lease over: a `released` record lets the next holder start
    /// at once. Returns whether the release was written (if not, the lock
    /// goes stale after W).
    pub async fn release(mut self) -> Result<bool, LeaseError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().expect("a lease owns its driver");
        match task.await {
            Ok(ExitReason::Shutdown { released }) => Ok(released),
            Ok(other) => Err(LeaseError::Exited(other)),
            Err(_) => Ok(false),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// `/etc/machine-id`, or a stand-in where there is none.
///
/// `PUTEX_MACHINE_ID`, when set and not empty, replaces it. It is a test
/// knob (the end-to-end tests run two "machines" on one host to check the
/// duplicate-node-id refusal, S5); never set it in production, where two
/// hosts must never share a machine id.
pub fn machine_id() -> String {
    if let Some(id) = std::env::var("PUTEX_MACHINE_ID")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
    {
        return id;
    }
    std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-machine".into())
}

/// A fresh random id for this start (the kernel's UUID generator).
pub fn instance_id() -> String {
    static FALLBACK: Mutex<u64> = Mutex::new(0);
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().replace('-', ""))
        .unwrap_or_else(|_| {
            let mut n = FALLBACK.lock().expect("not poisoned");
            *n += 1;
            format!("{}-{}", std::process::id(), n)
        })
}
