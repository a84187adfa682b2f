//! One ordered queue of requests to a keeper, shared by every host that
//! drives a core machine (the failover agent, `putex lock`).
//!
//! The core emits keeper commands (arm, extend, disarm), child spawns and
//! stops in an order that matters: an extension must not overtake the arm
//! it extends, a spawn must not overtake the arm that guards it, and a stop
//! must come after both. Hosts answer the core from several tasks, so every
//! request goes through one [`KeeperQueue`], served by one task, in the
//! order it was made. [`KeeperQueue::barrier`] waits until everything asked
//! for before it was carried out.

use std::sync::Arc;

use futures::future::BoxFuture;
use putex_core::{KeeperCommand, Token};
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::keeper::{KeeperClient, KeeperError};
use super::process::TreeInfo;

/// Where the queue finds its keeper.
pub trait KeeperSource: Send + Sync + 'static {
    /// The keeper now (perhaps a dead one: its calls then fail with
    /// [`KeeperError::Lost`]).
    fn current(&self) -> Arc<KeeperClient>;

    /// The keeper for a new tenure; a source that can replace a dead
    /// keeper does it here.
    fn for_tenure(&self) -> BoxFuture<'_, Result<Arc<KeeperClient>, KeeperError>>;
}

/// A keeper that is never replaced (`putex lock`: a dead keeper ends the
/// section).
impl KeeperSource for Arc<KeeperClient> {
    fn current(&self) -> Arc<KeeperClient> {
        self.clone()
    }

    fn for_tenure(&self) -> BoxFuture<'_, Result<Arc<KeeperClient>, KeeperError>> {
        Box::pin(async move { Ok(self.clone()) })
    }
}

/// A request that may be withdrawn before its turn comes (an activation
/// whose service must not start any more).
pub type StillWanted = Box<dyn FnOnce() -> bool + Send>;

enum Op {
    Command {
        command: KeeperCommand,
        token: Option<Token>,
        previous: Option<String>,
        reply: oneshot::Sender<bool>,
    },
    Spawn {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        still_wanted: StillWanted,
        reply: oneshot::Sender<Result<(i32, TreeInfo), String>>,
    },
    Barrier(oneshot::Sender<()>),
}

/// The ordered queue; cloning it shares the queue.
#[derive(Clone)]
pub struct KeeperQueue {
    tx: mpsc::UnboundedSender<Op>,
}

impl KeeperQueue {
    /// Starts the task that serves the queue (in the current span); it ends
    /// when every clone of the queue is dropped.
    pub fn start(source: impl KeeperSource) -> KeeperQueue {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(source, rx).in_current_span());
        KeeperQueue { tx }
    }

    /// Carries out a keeper command; `true` when the keeper did. An arm
    /// names the tenure's token and the previous holder (for the deactivate
    /// hook the keeper may run alone).
    pub fn command(
        &self,
        command: KeeperCommand,
        token: Option<Token>,
        previous: Option<String>,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Op::Command {
            command,
            token,
            previous,
            reply,
        });
        async move { rx.await.unwrap_or(false) }
    }

    /// Has the keeper spawn the child, unless `still_wanted` says no when
    /// its turn comes: the child's pid and where its tree lives.
    pub fn spawn_child(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        still_wanted: StillWanted,
    ) -> impl std::future::Future<Output = Result<(i32, TreeInfo), String>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Op::Spawn {
            argv,
            env,
            still_wanted,
            reply,
        });
        async move {
            rx.await
                .unwrap_or_else(|_| Err("the keeper queue is gone".into()))
        }
    }

    /// Completes once every request made before it was carried out.
    pub fn barrier(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.tx.send(Op::Barrier(tx)).is_ok();
        async move {
            if sent {
                let _ = rx.await;
            }
        }
    }
}

async fn serve(source: impl KeeperSource, mut rx: mpsc::UnboundedReceiver<Op>) {
    while let Some(op) = rx.recv().await {
        match op {
            Op::Command {
                command,
                token,
                previous,
                reply,
            } => {
                let r = match command {
                    KeeperCommand::Arm(d) => match source.for_tenure().await {
                        Ok(keeper) => keeper.arm(d, token, previous).await,
                        Err(e) => Err(e),
                    },
                    other => source.current().apply(other).await,
                };
                match &r {
                    Ok(()) => tracing::trace!(?command, "keeper"),
                    // A refused extension means the deadline passed: the
                    // keeper fires and reports it, which ends the licence.
                    // A refused arm keeps the service from starting.
                    Err(e) => tracing::warn!(?command, error = %e, "keeper refused or failed"),
                }
                let _ = reply.send(r.is_ok());
            }
            Op::Spawn {
                argv,
                env,
                still_wanted,
                reply,
            } => {
                if !still_wanted() {
                    let _ = reply.send(Err("withdrawn: a stop was asked for since".into()));
                    continue;
                }
                let r = source
                    .current()
                    .spawn_child(argv, env)
                    .await
                    .map_err(|e| e.to_string());
                let _ = reply.send(r);
            }
            Op::Barrier(tx) => {
                let _ = tx.send(());
            }
        }
    }
}
