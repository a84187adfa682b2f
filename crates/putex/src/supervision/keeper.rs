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
use crate::supervision::hooks::{Hook, HookEnv, HookKind, HookRunner};
use crate::supervision::process::{self, CgroupRoot, Exit, Tree, TreeInfo, TreeSnapshot};

// ---------------------------------------------------------------------------
// The deadline, as a pure value.

/// Why the keeper refused an `arm` or `extend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No deadline is armed.
    #[error("not armed")]
    NotArmed,
    /// The deadline had passed when the request arrived: the licence ended.
    #[error("deadline passed")]
    Passed,
    /// The keeper fired; only a new `arm` starts another tenure.
    #[error("fired")]
    Fired,
}

/// The keeper's licence deadline: a pure state machine taking `now`.
///
/// Time comes in as a boot-time reading, so a suspend is just a jump of
/// `now`: after one that passes the deadline, [`Deadline::poll`] fires at once
/// and a late [`Deadline::extend`] is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deadline {
    /// No tenure: nothing to stop at any time.
    #[default]
    Disarmed,
    /// Stop at this instant unless extended first.
    Armed(Instant),
    /// The deadline passed; the emergency stop was made.
    Fired(Instant),
}

impl Deadline {
    /// Starts a tenure ending at `at`. Refused if `at` is not in the future.
    pub fn arm(&mut self, now: Instant, at: Instant) -> Result<(), Refusal> {
        if let Deadline::Armed(d) = *self {
            if now >= d {
                self.poll(now);
                return Err(Refusal::Passed);
            }
        }
        if at <= now {
            return Err(Refusal::Passed);
        }
        *self = Deadline::Armed(at);
        Ok(())
    }

    /// Moves the deadline to `at` (never backwards). Refused when the
    /// current deadline has passed — even if the timer has not been
    /// serviced yet — or when not armed.
    pub fn extend(&mut self, now: Instant, at: Instant) -> Result<(), Refusal> {
        match *self {
            Deadline::Disarmed => Err(Refusal::NotArmed),
            Deadline::Fired(_) => Err(Refusal::Fired),
            Deadline::Armed(d) if now >= d => {
                *self = Deadline::Fired(d);
                Err(Refusal::Passed)
            }
            Deadline::Armed(d) => {
                *self = Deadline::Armed(d.max(at));
                Ok(())
            }
        }
    }

    /// Ends the tenure without a stop (the service was stopped gracefully).
    pub fn disarm(&mut self) {
        *self = Deadline::Disarmed;
    }

    /// Returns `true` exactly once, when `now` has reached the deadline: the
    /// caller makes the emergency stop.
    pub fn poll(&mut self, now: Instant) -> bool {
        match *self {
            Deadline::Armed(d) if now >= d => {
                *self = Deadline::Fired(d);
                true
            }
            _ => false,
        }
    }

    /// The armed deadline, if any.
    pub fn armed(&self) -> Option<Instant> {
        match *self {
            Deadline::Armed(d) => Some(d),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Wire protocol.

/// A request to the keeper (see the module docs for the wire form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ToKeeper {
    /// Start a tenure.
    Arm {
        /// Request id.
        id: u64,
        /// Boot-time nanoseconds.
        deadline_ns: u64,
        /// The tenure's fencing token, for the deactivate hook's environment.
        token: Option<Token>,
        /// The previous holder, for the deactivate hook's environment.
        previous: Option<String>,
    },
    /// Move the deadline.
    Extend {
        /// Request id.
        id: u64,
        /// Boot-time nanoseconds.
        deadline_ns: u64,
    },
    /// End the tenure without a stop.
    Disarm {
        /// Request id.
        id: u64,
    },
    /// Start the child (child mode).
    SpawnChild {
        /// Request id.
        id: u64,
        /// Program and arguments.
        argv: Vec<String>,
        /// Extra environment.
        env: Vec<(String, String)>,
    },
    /// Stop the service.
    Stop {
        /// Request id.
        id: u64,
        /// `startup`, `graceful` or `emergency`.
        kind: String,
    },
    /// Send a signal to the child's process group.
    Signal {
        /// Request id.
        id: u64,
        /// Signal number.
        signal: i32,
    },
    /// Report the keeper's state.
    Status {
        /// Request id.
        id: u64,
    },
    /// Exit; refused while armed or while the child's tree lives.
    Shutdown {
        /// Request id.
        id: u64,
    },
}

/// A message from the keeper: a reply (with `id`) or an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum FromKeeper {
    /// Done.
    Ok {
        /// Request id.
        id: u64,
    },
    /// Not done, on purpose.
    Refused {
        /// Request id.
        id: u64,
        /// Why.
        reason: String,
    },
    /// The child runs.
    Spawned {
        /// Request id.
        id: u64,
        /// Its pid.
        pid: i32,
        /// Where its tree lives.
        tree: TreeInfo,
    },
    /// A stop finished.
    Stopped {
        /// Request id.
        id: u64,
        /// Proof: the hook exited 0, or the whole tree is gone.
        ok: bool,
    },
    /// The keeper's state.
    Status {
        /// Request id.
        id: u64,
        /// The state.
        status: KeeperStatus,
    },
    /// The request failed.
    Error {
        /// Request id.
        id: u64,
        /// Why.
        message: String,
    },
    /// Event: the deadline passed and the emergency stop was made.
    Fired {
        /// Whether the stop is proven.
        ok: bool,
    },
    /// Event: the child exited on its own.
    ChildExited {
        /// Exit code.
        code: Option<i32>,
        /// Terminating signal.
        signal: Option<i32>,
    },
    /// Event: what identifies the service's tree now.
    Tree {
        /// Members, groups, sessions, cgroup.
        snapshot: TreeSnapshot,
    },
}

impl FromKeeper {
    fn id(&self) -> Option<u64> {
        match self {
            FromKeeper::Ok { id }
            | FromKeeper::Refused { id, .. }
            | FromKeeper::Spawned { id, .. }
            | FromKeeper::Stopped { id, .. }
            | FromKeeper::Status { id, .. }
            | FromKeeper::Error { id, .. } => Some(*id),
            FromKeeper::Fired { .. } | FromKeeper::ChildExited { .. } | FromKeeper::Tree { .. } => {
                None
            }
        }
    }
}

/// What `status` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeeperStatus {
    /// The keeper's pid.
    pub pid: i32,
    /// The lock it keeps.
    pub lock: String,
    /// The boot-time clock when the status was taken (ns).
    pub now_ns: u64,
    /// The armed deadline (ns), if any.
    pub deadline_ns: Option<u64>,
    /// Whether the keeper fired (and has not been re-armed since).
    pub fired: bool,
    /// `cgroup` or `subreaper`.
    pub mode: String,
    /// The child, if one was spawned.
    pub child: Option<ChildStatus>,
    /// Whether a stop is running.
    pub stopping: bool,
    /// What identifies the service's tree (see [`FromKeeper::Tree`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<TreeSnapshot>,
}

/// The child as `status` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildStatus {
    /// Its pid.
    pub pid: i32,
    /// Where its tree lives.
    pub tree: TreeInfo,
    /// How it exited, if it did.
    pub exit: Option<Exit>,
    /// Whether any process of its tree still lives.
    pub tree_alive: bool,
}

fn parse_stop_kind(s: &str) -> Option<StopKind> {
    match s {
        "startup" => Some(StopKind::Startup),
        "graceful" => Some(StopKind::Graceful),
        "emergency" => Some(StopKind::Emergency),
        _ => None,
    }
}

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
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Another keeper already answers on the socket.
    #[error("a keeper already runs on {0}")]
    AlreadyRunning(PathBuf),
    /// The keeper process could not be started or did not become ready.
    #[error("starting the keeper ({exe}): {message}")]
    Start {
        /// The binary.
        exe: PathBuf,
        /// Why.
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

// ---------------------------------------------------------------------------
// The keeper process.

/// How a keeper runs (the flags of `putex keeper`).
#[derive(Clone, Debug)]
pub struct KeeperOptions {
    /// The lock name (shown in `ps` and given to hooks).
    pub lock: String,
    /// The node id, for hooks.
    pub node: String,
    /// The socket to listen on.
    pub socket: PathBuf,
    /// The deactivate hook (hook mode), run for stops when no child exists.
    pub deactivate: Option<String>,
    /// `--stop-timeout`: how long a graceful stop waits after SIGTERM.
    pub stop_timeout: Duration,
    /// The emergency-stop timeout: SIGTERM, then SIGKILL, all within it.
    pub emergency_timeout: Duration,
    /// Use a cgroup scope when possible; `false` forces the subreaper.
    pub cgroup: bool,
    /// Print `ready <pid>` on stdout once listening (for the spawner).
    pub announce: bool,
    /// Routine messages to the log only, not stderr (`putex lock`, whose
    /// stderr belongs to a script).
    pub quiet: bool,
}

/// Runs a keeper until it is shut down or idle. Blocks; builds its own
/// single-threaded runtime.
pub fn run_keeper(opts: KeeperOptions) -> Result<(), KeeperError> {
    QUIET.store(opts.quiet, Ordering::Relaxed);
    let _ = nix::unistd::setsid();
    let _ = nix::sys::prctl::set_name(c"putex-keeper");
    if let Err(e) = process::set_oom_score_adj(-1000) {
        klog(
            &opts.lock,
            &format!("cannot set oom_score_adj to -1000: {e}"),
        );
    }
    if let Err(e) = process::set_child_subreaper() {
        klog(&opts.lock, &format!("cannot become child subreaper: {e}"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| KeeperError::Setup(format!("runtime: {e}")))?;
    rt.block_on(async move {
        ignore_stop_signals(&opts.lock)?;
        serve(opts).await
    })
}

/// Catches SIGTERM, SIGINT and SIGHUP and only logs them. Handlers (unlike
/// a blocked mask or `SIG_IGN`) are not inherited across `exec`, so the child
/// still gets default dispositions.
fn ignore_stop_signals(lock: &str) -> Result<(), KeeperError> {
    use tokio::signal::unix::{signal, SignalKind};
    for (kind, name) in [
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::interrupt(), "SIGINT"),
        (SignalKind::hangup(), "SIGHUP"),
    ] {
        let mut s = signal(kind).map_err(|e| KeeperError::Setup(format!("{name} handler: {e}")))?;
        let lock = lock.to_string();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                klog(
                    &lock,
                    &format!(
                        "ignoring {name}: the keeper stops only by request or at its deadline"
                    ),
                );
            }
        });
    }
    Ok(())
}

/// Set by `--quiet`: routine messages ([`klog`]) go to the log only;
/// alarms ([`kalarm`]) still reach stderr.
static QUIET: AtomicBool = AtomicBool::new(false);

/// A routine keeper message: stderr (the agent's journal) and the log.
fn klog(lock: &str, msg: &str) {
    tracing::info!(lock, "{msg}");
    if !QUIET.load(Ordering::Relaxed) {
        eprintln!("putex keeper[{lock}]: {msg}");
    }
}

/// A keeper message that must be seen even when quiet: the deadline passed.
fn kalarm(lock: &str, msg: &str) {
    tracing::warn!(lock, "{msg}");
    eprintln!("putex keeper[{lock}]: {msg}");
}

/// A `timerfd` on `CLOCK_BOOTTIME` with an absolute expiry. A thread of its
/// own blocks reading it and reports each expiry on a channel; setting the
/// timer from the event loop changes what that read waits for.
struct BootTimer(Arc<TimerFd>, Arc<std::sync::atomic::AtomicBool>);

impl BootTimer {
    fn start() -> Result<(BootTimer, mpsc::UnboundedReceiver<()>), KeeperError> {
        let fd = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC)
            .map_err(|e| KeeperError::Setup(format!("timerfd: {e}")))?;
        let fd = Arc::new(fd);
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = fd.clone();
        std::thread::Builder::new()
            .name("deadline".into())
            .spawn(move || loop {
                if reader.wait().is_err() || tx.send(()).is_err() {
                    return;
                }
            })
            .map_err(|e| KeeperError::Setup(format!("timer thread: {e}")))?;
        Ok((BootTimer(fd, Arc::default()), rx))
    }

    fn set(&self, at: Option<Instant>) {
        let r = match at {
            Some(at) => self.0.set(
                Expiration::OneShot(TimeSpec::from_duration(Duration::from_nanos(
                    at.as_nanos().max(1),
                ))),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.0.unset(),
        };
        let failed = r.is_err();
        if let Err(e) = r {
            tracing::error!(error = %e, "timerfd_settime failed; relying on the 50 ms check");
        }
        self.1.store(failed, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the last `set` failed: the event loop then checks the
    /// deadline every 50 ms instead of trusting the timerfd.
    fn degraded(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn bind(socket: &Path) -> Result<UnixListener, KeeperError> {
    let err = |source| KeeperError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(KeeperError::AlreadyRunning(socket.to_path_buf()));
        }
        std::fs::remove_file(socket).map_err(err)?;
    }
    if let Some(dir) = socket.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    let l = UnixListener::bind(socket).map_err(err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}

struct Child {
    pid: i32,
    tree: Tree,
    /// Where the tree lives, for the agent: the scope, or the child's own
    /// process group (in the subreaper fallback, [`Tree::info`] names the
    /// keeper, which is no use to anyone once the keeper is gone).
    info: TreeInfo,
    exit: Option<Exit>,
}

enum StopOrigin {
    Request { conn: u64, id: u64 },
    Fire,
}

enum Ev {
    Accepted(UnixStream),
    Msg(u64, Option<ToKeeper>),
    Timer,
    Child,
    StopDone(StopOrigin, bool),
    Tick,
}

/// The controlling connection: id, outbox, reader and writer tasks.
type Conn = (
    u64,
    mpsc::UnboundedSender<FromKeeper>,
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
);

struct State {
    opts: KeeperOptions,
    me: i32,
    deadline: Deadline,
    token: Option<Token>,
    previous: Option<String>,
    cgroup_root: Option<CgroupRoot>,
    child: Option<Child>,
    /// The controlling connection: id, outbox, reader and writer tasks.
    conn: Option<Conn>,
    ever_connected: bool,
    stopping: usize,
    shutdown: bool,
    /// The last tree snapshot sent, and when the tree was last looked at.
    snapshot: TreeSnapshot,
    scanned: Option<std::time::Instant>,
}

async fn serve(opts: KeeperOptions) -> Result<(), KeeperError> {
    let listener = bind(&opts.socket)?;
    let (timer, mut expired) = BootTimer::start()?;
    let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        .map_err(|e| KeeperError::Setup(format!("SIGCHLD: {e}")))?;
    let (msg_tx, mut msg_rx) = mpsc::unbounded_channel::<(u64, Option<ToKeeper>)>();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(StopOrigin, bool)>();
    // The reaper's fallback (children are reaped on SIGCHLD) and a slow
    // safety net for the timerfd; a fast one only while the timerfd is
    // failing. Every wake-up scans /proc, so an idle keeper wakes rarely.
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fast = tokio::time::interval(Duration::from_millis(50));
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = std::time::Instant::now();

    let cgroup_root = if opts.cgroup {
        CgroupRoot::detect()
    } else {
        None
    };
    let mut st = State {
        me: std::process::id() as i32,
        deadline: Deadline::Disarmed,
        token: None,
        previous: None,
        cgroup_root,
        child: None,
        conn: None,
        ever_connected: false,
        stopping: 0,
        shutdown: false,
        snapshot: TreeSnapshot::default(),
        scanned: None,
        opts,
    };
    klog(
        &st.opts.lock,
        &format!(
            "listening on {} (pid {}, process trees by {})",
            st.opts.socket.display(),
            st.me,
            st.mode()
        ),
    );
    if st.opts.announce {
        println!("ready {}", st.me);
    }
    let mut next_conn = 0u64;

    loop {
        let ev = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => Ev::Accepted(s),
                Err(_) => Ev::Tick,
            },
            Some((c, m)) = msg_rx.recv() => Ev::Msg(c, m),
            Some(()) = expired.recv() => Ev::Timer,
            _ = sigchld.recv() => Ev::Child,
            Some((o, ok)) = done_rx.recv() => Ev::StopDone(o, ok),
            _ = tick.tick() => Ev::Tick,
            _ = fast.tick(), if timer.degraded() => Ev::Tick,
        };
        // Every wake-up checks the deadline first, so a request that arrives
        // after it is judged against a fired keeper.
        st.check_deadline(&done_tx);
        let child_exited = matches!(ev, Ev::Child);
        match ev {
            Ev::Accepted(stream) => {
                next_conn += 1;
                st.accept(next_conn, stream, msg_tx.clone());
            }
            Ev::Msg(c, None) => {
                if st.conn.as_ref().is_some_and(|(id, _, _, _)| *id == c) {
                    st.conn = None;
                    klog(
                        &st.opts.lock,
                        "agent disconnected; the deadline still holds",
                    );
                }
            }
            Ev::Msg(c, Some(m)) => {
                if st.conn.as_ref().is_some_and(|(id, _, _, _)| *id == c) {
                    st.handle(c, m, &timer, &done_tx);
                }
            }
            Ev::Timer | Ev::Tick => {}
            Ev::Child => {}
            Ev::StopDone(origin, ok) => {
                st.stopping -= 1;
                match origin {
                    StopOrigin::Request { conn, id } => {
                        st.send_to(conn, FromKeeper::Stopped { id, ok })
                    }
                    StopOrigin::Fire => {
                        kalarm(
                            &st.opts.lock,
                            &format!(
                                "emergency stop at the deadline finished, proven stopped: {ok}"
                            ),
                        );
                        st.send(FromKeeper::Fired { ok });
                    }
                }
            }
        }
        st.reap();
        st.report_tree(child_exited);
        if st.shutdown || st.idle(started) {
            break;
        }
    }
    klog(&st.opts.lock, "exiting");
    if let Some((_, tx, _, writer)) = st.conn.take() {
        // Let the last reply (to `shutdown`) reach the agent.
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    }
    let _ = std::fs::remove_file(&st.opts.socket);
    if let Some(Child {
        tree: Tree::Cgroup(cg),
        ..
    }) = &st.child
    {
        let _ = cg.remove();
    }
    Ok(())
}

impl State {
    fn mode(&self) -> &'static str {
        if self.cgroup_root.is_some() {
            "cgroup"
        } else {
            "subreaper"
        }
    }

    fn tree_alive(&self) -> bool {
        self.child.as_ref().is_some_and(|c| !c.tree.is_empty())
    }

    /// Nothing to protect and nobody to serve: exit.
    fn idle(&self, started: std::time::Instant) -> bool {
        self.conn.is_none()
            && (self.ever_connected || started.elapsed() > Duration::from_secs(10))
            && self.deadline.armed().is_none()
            && self.stopping == 0
            && !self.tree_alive()
    }

    fn send(&self, m: FromKeeper) {
        if let Some((_, tx, _, _)) = &self.conn {
            let _ = tx.send(m);
        }
    }

    fn send_to(&self, conn: u64, m: FromKeeper) {
        if let Some((c, tx, _, _)) = &self.conn {
            if *c == conn {
                let _ = tx.send(m);
            }
        }
    }

    fn accept(
        &mut self,
        conn: u64,
        stream: UnixStream,
        msg_tx: mpsc::UnboundedSender<(u64, Option<ToKeeper>)>,
    ) {
        let (r, w) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_lines(w, rx));
        let reader = tokio::spawn(async move {
            // Lines as bytes: a line that is not JSON (not even UTF-8) is
            // skipped like any bad request, never taken for a hang-up.
            let mut r = BufReader::new(r);
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                match serde_json::from_slice::<ToKeeper>(&line) {
                    Ok(m) => {
                        let _ = msg_tx.send((conn, Some(m)));
                    }
                    Err(e) => tracing::warn!(error = %e, "bad keeper request"),
                }
            }
            let _ = msg_tx.send((conn, None));
        });
        if let Some((_, _, old_reader, _)) = self.conn.replace((conn, tx, reader, writer)) {
            old_reader.abort();
            klog(
                &self.opts.lock,
                "a new agent connection replaces the old one",
            );
        }
        self.ever_connected = true;
    }

    fn check_deadline(&mut self, done: &mpsc::UnboundedSender<(StopOrigin, bool)>) {
        let now = boot_time_now();
        if self.deadline.poll(now) {
            let late = match self.deadline {
                Deadline::Fired(d) => now.saturating_since(d),
                _ => Duration::ZERO,
            };
            kalarm(
                &self.opts.lock,
                &format!(
                    "licence deadline passed ({} µs ago): emergency stop",
                    late.as_micros()
                ),
            );
            self.start_stop(StopKind::Emergency, StopOrigin::Fire, done);
        }
    }

    fn handle(
        &mut self,
        conn: u64,
        m: ToKeeper,
        timer: &BootTimer,
        done: &mpsc::UnboundedSender<(StopOrigin, bool)>,
    ) {
        let now = boot_time_now();
        let reply = match m {
            ToKeeper::Arm {
                id,
                deadline_ns,
                token,
                previous,
            } => match self.deadline.arm(now, Instant::from_nanos(deadline_ns)) {
                Ok(()) => {
                    self.token = token;
                    self.previous = previous;
                    timer.set(self.deadline.armed());
                    FromKeeper::Ok { id }
                }
                Err(r) => FromKeeper::Refused {
                    id,
                    reason: r.to_string(),
                },
            },
            ToKeeper::Extend { id, deadline_ns } => {
                match self.deadline.extend(now, Instant::from_nanos(deadline_ns)) {
                    Ok(()) => {
                        timer.set(self.deadline.armed());
                        FromKeeper::Ok { id }
                    }
                    Err(r) => {
                        if r == Refusal::Passed {
                            // The deadline passed but the timer was not serviced yet.
                            self.deadline = Deadline::Armed(Instant::ZERO);
                            self.deadline.poll(now);
                            self.start_stop(StopKind::Emergency, StopOrigin::Fire, done);
                        }
                        FromKeeper::Refused {
                            id,
                            reason: r.to_string(),
                        }
                    }
                }
            }
            ToKeeper::Disarm { id } => {
                self.deadline.disarm();
                timer.set(None);
                FromKeeper::Ok { id }
            }
            ToKeeper::SpawnChild { id, argv, env } => self.spawn_child(id, argv, env),
            ToKeeper::Stop { id, kind } => match parse_stop_kind(&kind) {
                Some(k) => {
                    self.start_stop(k, StopOrigin::Request { conn, id }, done);
                    return;
                }
                None => FromKeeper::Error {
                    id,
                    message: format!("unknown stop kind {kind:?}"),
                },
            },
            ToKeeper::Signal { id, signal } => match (Signal::try_from(signal), &self.child) {
                (Ok(sig), Some(c)) => {
                    // The child leads its own process group.
                    if let Err(e) = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(c.pid), sig)
                    {
                        tracing::debug!(error = %e, "killpg");
                    }
                    FromKeeper::Ok { id }
                }
                (Err(_), _) => FromKeeper::Error {
                    id,
                    message: format!("bad signal {signal}"),
                },
                (_, None) => FromKeeper::Refused {
                    id,
                    reason: "no child".into(),
                },
            },
            ToKeeper::Status { id } => FromKeeper::Status {
                id,
                status: self.status(),
            },
            ToKeeper::Shutdown { id } => {
                if self.deadline.armed().is_some() {
                    FromKeeper::Refused {
                        id,
                        reason: "armed".into(),
                    }
                } else if self.tree_alive() {
                    FromKeeper::Refused {
                        id,
                        reason: "the service's tree is alive".into(),
                    }
                } else {
                    self.shutdown = true;
                    FromKeeper::Ok { id }
                }
            }
        };
        self.send_to(conn, reply);
    }

    /// Tells the agent what identifies the tree, when it changed. Looks at
    /// most every 500 ms, and at once when a child exited.
    fn report_tree(&mut self, child_exited: bool) {
        let Some(child) = &self.child else { return };
        let due = child_exited
            || self
                .scanned
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(500));
        if !due {
            return;
        }
        self.scanned = Some(std::time::Instant::now());
        let snapshot = TreeSnapshot::capture(&child.tree);
        if snapshot != self.snapshot {
            self.snapshot = snapshot.clone();
            self.send(FromKeeper::Tree { snapshot });
        }
    }

    fn status(&self) -> KeeperStatus {
        KeeperStatus {
            pid: self.me,
            lock: self.opts.lock.clone(),
            now_ns: boot_time_now().as_nanos(),
            deadline_ns: self.deadline.armed().map(Instant::as_nanos),
            fired: matches!(self.deadline, Deadline::Fired(_)),
            mode: self.mode().into(),
            child: self.child.as_ref().map(|c| ChildStatus {
                pid: c.pid,
                tree: c.info.clone(),
                exit: c.exit,
                tree_alive: !c.tree.is_empty(),
            }),
            stopping: self.stopping > 0,
            snapshot: self.child.as_ref().map(|_| self.snapshot.clone()),
        }
    }

    fn spawn_child(
        &mut self,
        id: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> FromKeeper {
        if self.tree_alive() {
            return FromKeeper::Refused {
                id,
                reason: "a child is running".into(),
            };
        }
        if argv.is_empty() {
            return FromKeeper::Error {
                id,
                message: "empty argv".into(),
            };
        }
        if let Some(Child {
            tree: Tree::Cgroup(cg),
            ..
        }) = &self.child
        {
            let _ = cg.remove();
        }
        let mut argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
        let mut scope = None;
        if let Some(root) = &self.cgroup_root {
            let name = format!("putex-{}-{}", self.opts.lock, self.me);
            match root.create(&name) {
                Ok(cg) => {
                    argv = process::wrap_in_cgroup(&cg, &argv);
                    scope = Some(cg);
                }
                Err(e) => klog(
                    &self.opts.lock,
                    &format!("no cgroup scope ({e}); using the subreaper"),
                ),
            }
        }
        let out = |what: &str| -> Stdio {
            match io::stderr().as_fd().try_clone_to_owned() {
                Ok(fd) => Stdio::from(fd),
                Err(e) => {
                    tracing::warn!(error = %e, "child {what} goes to /dev/null");
                    Stdio::null()
                }
            }
        };
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out("stdout"))
            .stderr(out("stderr"));
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        match cmd.spawn() {
            Ok(child) => {
                // Never waited through `child`: the reaper collects it.
                let pid = child.id() as i32;
                drop(child);
                let tree = match scope {
                    Some(cg) => Tree::Cgroup(cg),
                    None => Tree::Subreaper { reaper: self.me },
                };
                let info = match &tree {
                    Tree::Subreaper { .. } => TreeInfo::ProcessGroup(pid),
                    other => other.info(),
                };
                klog(&self.opts.lock, &format!("child {pid} started ({info:?})"));
                self.child = Some(Child {
                    pid,
                    tree,
                    info: info.clone(),
                    exit: None,
                });
                // The first snapshot goes out right after the reply.
                self.scanned = None;
                FromKeeper::Spawned {
                    id,
                    pid,
                    tree: info,
                }
            }
            Err(e) => {
                if let Some(cg) = scope {
                    let _ = cg.remove();
                }
                FromKeeper::Error {
                    id,
                    message: format!("spawn {:?}: {e}", argv[0]),
                }
            }
        }
    }

    fn start_stop(
        &mut self,
        kind: StopKind,
        origin: StopOrigin,
        done: &mpsc::UnboundedSender<(StopOrigin, bool)>,
    ) {
        self.stopping += 1;
        let done = done.clone();
        let (term_wait, kill_wait) = match kind {
            StopKind::Emergency => (
                self.opts.emergency_timeout / 2,
                self.opts.emergency_timeout / 2,
            ),
            StopKind::Graceful | StopKind::Startup => {
                (self.opts.stop_timeout, self.opts.emergency_timeout)
            }
        };
        if let Some(c) = &self.child {
            let tree = c.tree.clone();
            tokio::spawn(async move {
                let ok = tree.stop(term_wait, kill_wait).await;
                if ok {
                    if let Tree::Cgroup(cg) = &tree {
                        let _ = cg.remove();
                    }
                }
                let _ = done.send((origin, ok));
            });
        } else if let Some(cmd) = &self.opts.deactivate {
            let hook = Hook::new(HookKind::Deactivate, cmd.clone());
            let env = HookEnv {
                lock: self.opts.lock.clone(),
                node: self.opts.node.clone(),
                role: match kind {
                    StopKind::Startup => "starting",
                    StopKind::Graceful => "stepping-down",
                    StopKind::Emergency => "lapsed",
                }
                .into(),
                token: self.token,
                previous: self.previous.clone(),
                stop: Some(kind),
            };
            let timeout = match kind {
                StopKind::Emergency => self.opts.emergency_timeout,
                _ => self.opts.stop_timeout,
            };
            let runner = match self.cgroup_root {
                Some(_) => HookRunner::detect(),
                None => HookRunner::without_cgroup(),
            };
            tokio::spawn(async move {
                let ok = match runner.run(&hook, &env, None, timeout).await {
                    Ok(o) => o.ok(),
                    Err(e) => {
                        tracing::error!(error = %e, "deactivate hook");
                        false
                    }
                };
                let _ = done.send((origin, ok));
            });
        } else {
            let _ = done.send((origin, true));
        }
    }

    fn reap(&mut self) {
        for (pid, status) in process::reap_orphans() {
            let Some(exit) = Exit::from_wait(status) else {
                continue;
            };
            match &mut self.child {
                Some(c) if c.pid == pid && c.exit.is_none() => {
                    c.exit = Some(exit);
                    klog(&self.opts.lock, &format!("child {pid} exited: {exit:?}"));
                    self.send(FromKeeper::ChildExited {
                        code: exit.code,
                        signal: exit.signal,
                    });
                }
                _ => tracing::debug!(pid, ?exit, "reaped an orphan"),
            }
        }
    }
}

async fn write_lines(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<FromKeeper>) {
    while let Some(m) = rx.recv().await {
        let Ok(mut line) = serde_json::to_string(&m) else {
            continue;
        };
        line.push('\n');
        if w.write_all(line.as_bytes()).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// The client.

/// Something the keeper reports on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeeperEvent {
    /// The deadline passed; the keeper made the emergency stop (`ok`: proven).
    Fired {
        /// Whether the stop is proven.
        ok: bool,
    },
    /// The child exited on its own.
    ChildExited(Exit),
    /// What identifies the service's tree changed: persist it, so that the
    /// tree can be found without the keeper ([`TreeSnapshot`]).
    Tree(TreeSnapshot),
    /// The keeper is gone: the socket closed.
    Lost,
}

impl KeeperEvent {
    /// The core input this event is, if any.
    pub fn to_input(&self) -> Option<Input> {
        match self {
            KeeperEvent::Fired { .. } => Some(Input::KeeperFired),
            KeeperEvent::ChildExited(_) => Some(Input::ServiceExited),
            KeeperEvent::Tree(_) => None,
            KeeperEvent::Lost => Some(Input::KeeperLost),
        }
    }
}

/// How to start a keeper when none answers on the socket.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// The putex binary (usually `std::env::current_exe()`).
    pub exe: PathBuf,
    /// The keeper's socket ([`socket_path`]).
    pub socket: PathBuf,
    /// The lock.
    pub lock: String,
    /// The node id.
    pub node: String,
    /// The deactivate hook (hook mode).
    pub deactivate: Option<String>,
    /// `--stop-timeout`.
    pub stop_timeout: Duration,
    /// The emergency-stop timeout.
    pub emergency_timeout: Duration,
    /// `false` forces the subreaper fallback.
    pub cgroup: bool,
    /// Routine keeper messages to the log only ([`KeeperOptions::quiet`]).
    pub quiet: bool,
}

impl KeeperConfig {
    /// The argv that starts this keeper (after the binary).
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "keeper".into(),
            self.lock.clone().into(),
            "--socket".into(),
            self.socket.clone().into(),
            "--node".into(),
            self.node.clone().into(),
            "--stop-timeout-ms".into(),
            self.stop_timeout.as_millis().to_string().into(),
            "--emergency-timeout-ms".into(),
            self.emergency_timeout.as_millis().to_string().into(),
            "--announce".into(),
        ];
        if let Some(d) = &self.deactivate {
            a.push("--deactivate".into());
            a.push(d.clone().into());
        }
        if !self.cgroup {
            a.push("--no-cgroup".into());
        }
        if self.quiet {
            a.push("--quiet".into());
        }
        a
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<FromKeeper>>>>;

/// The agent's side of the keeper: spawn or adopt, arm/extend/disarm, spawn
/// the child, stop, and the keeper's events.
pub struct KeeperClient {
    socket: PathBuf,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    events: mpsc::UnboundedReceiver<KeeperEvent>,
    lost: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
    tree: Arc<Mutex<Tracked>>,
}

/// What the client knows of the service's tree, to stop it without the
/// keeper.
#[derive(Default)]
struct Tracked {
    info: Option<TreeInfo>,
    snapshot: Option<TreeSnapshot>,
}

impl Drop for KeeperClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl KeeperClient {
    /// Connects to a running keeper; `Ok(None)` if none answers on `socket`.
    pub async fn adopt(socket: &Path) -> Result<Option<KeeperClient>, KeeperError> {
        match UnixStream::connect(socket).await {
            Ok(s) => {
                let c = KeeperClient::from_stream(socket, s);
                let st = c.status().await?;
                let mut t = c.tree.lock();
                t.info = st.child.map(|ch| ch.tree);
                t.snapshot = st.snapshot;
                drop(t);
                Ok(Some(c))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(source) => Err(KeeperError::Socket {
                path: socket.to_path_buf(),
                source,
            }),
        }
    }

    /// Adopts the keeper on `config.socket`, or starts one. Returns whether
    /// it was adopted.
    pub async fn spawn_or_adopt(
        config: &KeeperConfig,
    ) -> Result<(KeeperClient, bool), KeeperError> {
        if let Some(c) = KeeperClient::adopt(&config.socket).await? {
            return Ok((c, true));
        }
        let start_err = |message: String| KeeperError::Start {
            exe: config.exe.clone(),
            message,
        };
        let mut child = tokio::process::Command::new(&config.exe)
            .args(config.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| start_err(e.to_string()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| start_err("no stdout".into()))?;
        let mut line = String::new();
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await;
        match read {
            Ok(Ok(n)) if n > 0 && line.starts_with("ready") => {}
            Ok(_) => {
                let status = child.wait().await.ok();
                return Err(start_err(format!(
                    "exited before it was ready ({status:?})"
                )));
            }
            Err(_) => return Err(start_err("not ready within 10 s".into())),
        }
        // The keeper outlives us; tokio reaps it if it exits while we live.
        drop(child);
        match KeeperClient::adopt(&config.socket).await? {
            Some(c) => Ok((c, false)),
            None => Err(start_err("ready, but its socket does not answer".into())),
        }
    }

    fn from_stream(socket: &Path, s: UnixStream) -> KeeperClient {
        let (r, w) = s.into_split();
        let pending: Pending = Arc::default();
        let lost = Arc::new(AtomicBool::new(false));
        let (etx, erx) = mpsc::unbounded_channel();
        let tree: Arc<Mutex<Tracked>> = Arc::default();
        let reader = {
            let pending = pending.clone();
            let lost = lost.clone();
            let tree = tree.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(m) = serde_json::from_str::<FromKeeper>(&line) else {
                        tracing::warn!(line, "bad keeper message");
                        continue;
                    };
                    match (m.id(), &m) {
                        (Some(id), _) => {
                            let tx = pending.lock().remove(&id);
                            if let Some(tx) = tx {
                                let _ = tx.send(m);
                            }
                        }
                        (None, FromKeeper::Fired { ok }) => {
                            let _ = etx.send(KeeperEvent::Fired { ok: *ok });
                        }
                        (None, FromKeeper::ChildExited { code, signal }) => {
                            let _ = etx.send(KeeperEvent::ChildExited(Exit {
                                code: *code,
                                signal: *signal,
                            }));
                        }
                        (None, FromKeeper::Tree { snapshot }) => {
                            tree.lock().snapshot = Some(snapshot.clone());
                            let _ = etx.send(KeeperEvent::Tree(snapshot.clone()));
                        }
                        (None, _) => {}
                    }
                }
                lost.store(true, Ordering::SeqCst);
                pending.lock().clear();
                let _ = etx.send(KeeperEvent::Lost);
            })
        };
        KeeperClient {
            socket: socket.to_path_buf(),
            writer: tokio::sync::Mutex::new(w),
            pending,
            next_id: AtomicU64::new(1),
            events: erx,
            lost,
            reader,
            tree,
        }
    }

    /// The keeper's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether the keeper is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The next event; [`KeeperEvent::Lost`] once the keeper is gone (and
    /// then forever).
    pub async fn next_event(&mut self) -> KeeperEvent {
        self.events.recv().await.unwrap_or(KeeperEvent::Lost)
    }

    /// Takes the keeper's events, so that a task of their own can read them
    /// while the client is shared (`Arc`). The channel ends (`None`) when
    /// the keeper is gone, after a [`KeeperEvent::Lost`]. Afterwards
    /// [`KeeperClient::next_event`] reports `Lost`.
    pub fn take_events(&mut self) -> mpsc::UnboundedReceiver<KeeperEvent> {
        let (_closed, rx) = mpsc::unbounded_channel();
        std::mem::replace(&mut self.events, rx)
    }

    async fn request(&self, make: impl FnOnce(u64) -> ToKeeper) -> Result<FromKeeper, KeeperError> {
        if self.is_lost() {
            return Err(KeeperError::Lost);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        let mut line =
            serde_json::to_string(&make(id)).map_err(|e| KeeperError::Failed(e.to_string()))?;
        line.push('\n');
        if self
            .writer
            .lock()
            .await
            .write_all(line.as_bytes())
            .await
            .is_err()
        {
            self.pending.lock().remove(&id);
            return Err(KeeperError::Lost);
        }
        let reply = rx.await.map_err(|_| KeeperError::Lost)?;
        match reply {
            FromKeeper::Refused { reason, .. } => Err(KeeperError::Refused(reason)),
            FromKeeper::Error { message, .. } => Err(KeeperError::Failed(message)),
            other => Ok(other),
        }
    }

    async fn expect_ok(&self, make: impl FnOnce(u64) -> ToKeeper) -> Result<(), KeeperError> {
        match self.request(make).await? {
            FromKeeper::Ok { .. } => Ok(()),
            other => Err(KeeperError::Unexpected(Box::new(other))),
        }
    }

    /// Starts a tenure ending at `deadline` (boot time).
    pub async fn arm(
        &self,
        deadline: Instant,
        token: Option<Token>,
        previous: Option<String>,
    ) -> Result<(), KeeperError> {
        self.expect_ok(|id| ToKeeper::Arm {
            id,
            deadline_ns: deadline.as_nanos(),
            token,
            previous,
        })
        .await
    }

    /// Moves the deadline; [`KeeperError::Refused`] if it had passed.
    pub async fn extend(&self, deadline: Instant) -> Result<(), KeeperError> {
        self.expect_ok(|id| ToKeeper::Extend {
            id,
            deadline_ns: deadline.as_nanos(),
        })
        .await
    }

    /// Ends the tenure without a stop.
    pub async fn disarm(&self) -> Result<(), KeeperError> {
        self.expect_ok(|id| ToKeeper::Disarm { id }).await
    }

    /// Carries out a core [`KeeperCommand`].
    pub async fn apply(&self, cmd: KeeperCommand) -> Result<(), KeeperError> {
        match cmd {
            KeeperCommand::Arm(d) => self.arm(d, None, None).await,
            KeeperCommand::Extend(d) => self.extend(d).await,
            KeeperCommand::Disarm => self.disarm().await,
        }
    }

    /// Starts the child under the keeper; returns its pid.
    pub async fn spawn_child(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<(i32, TreeInfo), KeeperError> {
        match self
            .request(|id| ToKeeper::SpawnChild { id, argv, env })
            .await?
        {
            FromKeeper::Spawned { pid, tree, .. } => {
                self.tree.lock().info = Some(tree.clone());
                Ok((pid, tree))
            }
            other => Err(KeeperError::Unexpected(Box::new(other))),
        }
    }

    /// Stops the service through the keeper; `Ok(true)` is proof (H6).
    pub async fn stop(&self, kind: StopKind) -> Result<bool, KeeperError> {
        let kind = crate::supervision::hooks::stop_name(kind).to_string();
        match self.request(|id| ToKeeper::Stop { id, kind }).await? {
            FromKeeper::Stopped { ok, .. } => Ok(ok),
            other => Err(KeeperError::Unexpected(Box::new(other))),
        }
    }

    /// Forwards a signal to the child's process group.
    pub async fn signal(&self, sig: Signal) -> Result<(), KeeperError> {
        self.expect_ok(|id| ToKeeper::Signal {
            id,
            signal: sig as i32,
        })
        .await
    }

    /// The keeper's state.
    pub async fn status(&self) -> Result<KeeperStatus, KeeperError> {
        match self.request(|id| ToKeeper::Status { id }).await? {
            FromKeeper::Status { status, .. } => Ok(status),
            other => Err(KeeperError::Unexpected(Box::new(other))),
        }
    }

    /// Asks the keeper to exit (refused while armed or while the tree lives).
    pub async fn shutdown(&self) -> Result<(), KeeperError> {
        self.expect_ok(|id| ToKeeper::Shutdown { id }).await
    }

    /// The last [`TreeSnapshot`] the keeper sent (or reported when
    /// adopted): what identifies the service's tree.
    pub fn snapshot(&self) -> Option<TreeSnapshot> {
        self.tree.lock().snapshot.clone()
    }

    /// The agent's own emergency stop after [`KeeperEvent::Lost`] (child
    /// mode): kill everything the last [`TreeSnapshot`] identifies — the
    /// cgroup scope, the members still the same processes, whatever runs in
    /// their process groups and sessions, and all their descendants — until
    /// none of it lives. Returns whether that is proven within `within`;
    /// `true` when no child was ever started.
    pub async fn stop_tree_without_keeper(&self, within: Duration) -> bool {
        let (info, snapshot) = {
            let t = self.tree.lock();
            (t.info.clone(), t.snapshot.clone())
        };
        let snapshot = match (snapshot, info) {
            (Some(s), _) => s,
            (None, None) => return true,
            // Spawned, but no snapshot arrived: what the spawn reply said.
            (None, Some(TreeInfo::Cgroup(p))) => TreeSnapshot {
                cgroup: Some(p),
                ..TreeSnapshot::default()
            },
            (None, Some(TreeInfo::ProcessGroup(pg))) => TreeSnapshot {
                groups: vec![
                    process::ProcId::of(pg).unwrap_or(process::ProcId { pid: pg, start: 0 })
                ],
                ..TreeSnapshot::default()
            },
        };
        snapshot.kill(within).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn fires_once_at_the_deadline() {
        let mut d = Deadline::default();
        assert!(!d.poll(t(0)));
        d.arm(t(0), t(100)).unwrap();
        assert!(!d.poll(t(99)));
        assert!(d.poll(t(100)));
        assert!(!d.poll(t(101)));
        assert_eq!(d, Deadline::Fired(t(100)));
    }

    #[test]
    fn a_suspend_past_the_deadline_fires_at_once_and_refuses_extensions() {
        let mut d = Deadline::default();
        d.arm(t(1_000), t(11_000)).unwrap();
        d.extend(t(2_000), t(12_000)).unwrap();
        // The host sleeps for an hour: boot time jumps.
        let woke = t(3_602_000);
        assert_eq!(d.extend(woke, t(3_612_000)), Err(Refusal::Passed));
        assert_eq!(d, Deadline::Fired(t(12_000)));
        let mut d2 = Deadline::default();
        d2.arm(t(1_000), t(11_000)).unwrap();
        assert!(d2.poll(woke), "the first poll after the jump fires");
        assert_eq!(d2.extend(woke, t(3_612_000)), Err(Refusal::Fired));
    }

    #[test]
    fn extensions_never_move_backwards_and_need_an_arm() {
        let mut d = Deadline::default();
        assert_eq!(d.extend(t(0), t(10)), Err(Refusal::NotArmed));
        d.arm(t(0), t(100)).unwrap();
        d.extend(t(1), t(50)).unwrap();
        assert_eq!(d.armed(), Some(t(100)));
        assert_eq!(d.arm(t(200), t(300)), Err(Refusal::Passed));
        assert!(matches!(d, Deadline::Fired(_)));
        d.arm(t(200), t(300)).unwrap();
        assert_eq!(d.armed(), Some(t(300)));
        d.disarm();
        assert!(!d.poll(t(10_000)));
        assert_eq!(Deadline::default().arm(t(5), t(5)), Err(Refusal::Passed));
    }

    #[test]
    fn socket_paths_are_stable_and_short() {
        let p = socket_path(Path::new("/run/putex"), "nats://a:4222/putex", "pg");
        assert_eq!(
            p,
            socket_path(Path::new("/run/putex"), "nats://a:4222/putex", "pg")
        );
        assert_ne!(
            p,
            socket_path(Path::new("/run/putex"), "nats://b:4222/putex", "pg")
        );
        assert!(p.to_string_lossy().ends_with("-pg.sock"));
    }

    #[test]
    fn wire_form_is_flat_json() {
        let m = ToKeeper::Extend {
            id: 2,
            deadline_ns: 5,
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"type":"extend","id":2,"deadline_ns":5}"#
        );
        let f: FromKeeper = serde_json::from_str(r#"{"type":"fired","ok":true}"#).unwrap();
        assert_eq!(f, FromKeeper::Fired { ok: true });
    }
}
