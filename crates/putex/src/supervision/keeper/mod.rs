//! The keeper: a dead-man's switch that owns the service (`docs/supervision.md`).
//!
//! The agent may be frozen (SIGSTOP, a stalled VM thread), OOM-killed or
//! crashed while its service runs. The keeper is a small process of its own —
//! `putex keeper <lock> --socket …`, the same binary — with no network and no
//! store. It
//!
//! - holds an absolute licence deadline on `CLOCK_BOOTTIME`, as a `timerfd`
//!   with `TFD_TIMER_ABSTIME` (never tokio's monotonic timers, which stop
//!   during suspend): after a resume past the deadline it fires at once;
//! - refuses extensions that arrive after its deadline ([`Deadline`]);
//! - at the deadline, alone, makes the emergency stop — kills the child's tree,
//!   or runs the deactivate hook with `PUTEX_STOP=emergency` — and reports
//!   `fired`;
//! - spawns the child (child mode) and owns its tree: a cgroup v2 scope, or
//!   itself as child subreaper ([`crate::supervision::process`]); graceful stops go through
//!   it too, so the service has one owner;
//! - ignores SIGTERM, SIGINT and SIGHUP (it catches and logs them), sets
//!   `oom_score_adj` to −1000 (best effort), and outlives its agent: a
//!   restarted agent finds it at the well-known socket path for its
//!   (store, lock) ([`socket_path`]) and adopts it.
//!
//! If the keeper dies, the agent's [`KeeperClient`] sees the socket close at
//! once and reports [`KeeperEvent::Lost`]; the agent then makes its own
//! emergency stop ([`KeeperClient::stop_tree_without_keeper`]) and steps down.
//!
//! # Protocol
//!
//! One JSON object per line over a Unix stream socket. Requests carry an `id`
//! that the reply repeats; requests are served concurrently (an `extend` is
//! answered while a graceful `stop` is still running). Events carry no `id`.
//!
//! ```text
//! → {"type":"arm","id":1,"deadline_ns":123456789000,"token":{"epoch":1,"revision":7},"previous":null}
//! → {"type":"extend","id":2,"deadline_ns":124456789000}
//! → {"type":"disarm","id":3}
//! → {"type":"spawn-child","id":4,"argv":["/bin/sh","-c","exec my-service"],"env":[["K","V"]]}
//! → {"type":"stop","id":5,"kind":"graceful"}            # or "emergency", "startup"
//! → {"type":"signal","id":6,"signal":15}                 # to the child's process group
//! → {"type":"status","id":7}
//! → {"type":"shutdown","id":8}                           # only when disarmed and nothing runs
//! ← {"type":"ok","id":2}
//! ← {"type":"refused","id":2,"reason":"deadline passed"}
//! ← {"type":"spawned","id":4,"pid":4242,"tree":{"cgroup":"/sys/fs/cgroup/unified/putex-pg-4241"}}
//! ← {"type":"stopped","id":5,"ok":true}
//! ← {"type":"status","id":7,"status":{…}}
//! ← {"type":"error","id":4,"message":"…"}
//! ← {"type":"fired","ok":true}                           # event: the deadline passed, emergency stop done
//! ← {"type":"child-exited","code":0,"signal":null}       # event
//! ← {"type":"tree","snapshot":{"members":[{"pid":4242,"start":981}],"groups":[…],"sessions":[…]}}  # event
//! ```
//!
//! The `tree` event tells the agent, whenever it changes (checked at most
//! every 500 ms and at each child exit), what identifies the service's tree
//! ([`TreeSnapshot`]): so that the agent, which persists it, can find and
//! kill the tree without the keeper — after the keeper died, or at its next
//! start.
//!
//! Only the newest connection controls the keeper: a restarted agent's
//! connection replaces its predecessor's.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use parking_lot::Mutex;
use putex_core::agent::{Input, KeeperCommand, StopKind};
use putex_core::{Instant, Token};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::clock::boot_time_now;
use crate::store::{Name, NodeId};
use crate::supervision::hooks::{Hook, HookEnv, HookKind, HookRunner};
use crate::supervision::process::{self, CgroupRoot, Exit, Tree, TreeInfo, TreeSnapshot};

mod client;
mod deadline;
mod server;
mod sys;
#[cfg(test)]
mod tests;
mod wire;

pub use client::{KeeperClient, KeeperConfig, KeeperEvent};
pub use deadline::{Deadline, Refusal};
pub use server::{run_keeper, KeeperOptions};
pub use wire::{ChildStatus, FromKeeper, KeeperStatus, ToKeeper};

// ---------------------------------------------------------------------------
// Paths.

/// The default directory for keeper sockets: `/run/putex` for root, else
/// `$XDG_RUNTIME_DIR/putex`, else `/tmp/putex-<uid>`.
pub fn default_keeper_dir() -> PathBuf {
    let uid = nix::unistd::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/putex");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("putex"),
        _ => PathBuf::from(format!("/tmp/putex-{uid}")),
    }
}

/// The well-known socket of the keeper for (`store`, `lock`) in `dir`:
/// `<dir>/<hash of store id>-<lock>.sock`. `store` is any string identifying
/// the store (URL and bucket); it is hashed to keep the path short.
pub fn socket_path(dir: &Path, store: &str, lock: &str) -> PathBuf {
    // FNV-1a, 64 bit: stable across releases and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in store.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    dir.join(format!("{h:016x}-{lock}.sock"))
}

// ---------------------------------------------------------------------------
// Errors.

/// Errors of the keeper and its client.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The socket could not be bound, connected or used.
    #[error("keeper socket {path}: {source}")]
    Socket {
        /// The keeper's socket, `<keeper dir>/<store hash>-<lock>.sock`.
        path: PathBuf,
        /// The error binding, connecting or using it gave.
        source: io::Error,
    },
    /// Another keeper already answers on the socket.
    #[error("a keeper already runs on {0}")]
    AlreadyRunning(PathBuf),
    /// The keeper process could not be started or did not become ready.
    #[error("starting the keeper ({exe}): {message}")]
    Start {
        /// The program started as `<exe> keeper …`: the putex binary.
        exe: PathBuf,
        /// What failed: the spawn's error, an exit before `ready`, no
        /// `ready` within 10 s, or a socket that does not answer.
        message: String,
    },
    /// The keeper refused the request.
    #[error("keeper refused: {0}")]
    Refused(String),
    /// The keeper could not carry out the request.
    #[error("keeper error: {0}")]
    Failed(String),
    /// The keeper is gone (its socket closed).
    #[error("keeper lost")]
    Lost,
    /// A reply that does not fit the request.
    #[error("unexpected keeper reply: {0:?}")]
    Unexpected(Box<FromKeeper>),
    /// Setting up the keeper process failed.
    #[error("keeper setup: {0}")]
    Setup(String),
}
