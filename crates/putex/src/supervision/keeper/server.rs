//! The keeper process: its socket, its deadline timer on `CLOCK_BOOTTIME`,
//! the child it owns, and the emergency stop it makes alone.

use super::sys::{
    bind, ignore_stop_signals, kalarm, klog, log_hooks_to_stderr, spawn_child, BootTimer, QUIET,
};
use super::*;

/// How a keeper runs (the flags of `putex keeper`).
#[derive(Clone, Debug)]
pub struct KeeperOptions {
    /// The lock name (shown in `ps` and given to hooks).
    pub lock: Name,
    /// The node id, for hooks.
    pub node: NodeId,
    /// The socket to listen on.
    pub socket: PathBuf,
    /// The deactivate hook (hook mode), run for stops when no child exists.
    pub deactivate: Option<String>,
    /// `PUTEX_KV_SOCKET` for the deactivate hook.
    pub kv_socket: Option<PathBuf>,
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
    /// The child's stdout is the keeper's own stdout (`putex lock`, which
    /// starts its keeper with its own stdout, so that CMD's output goes
    /// where the caller sent `putex lock`'s); otherwise it goes to stderr
    /// with the keeper's messages (`putex run`: a service logs there).
    pub child_stdout: bool,
}

/// Runs a keeper until it is shut down or idle. Blocks; builds its own
/// single-threaded runtime.
pub fn run_keeper(opts: KeeperOptions) -> Result<(), KeeperError> {
    QUIET.store(opts.quiet, Ordering::Relaxed);
    log_hooks_to_stderr();
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
    if let Some(root) = &cgroup_root {
        root.remove_orphan_scopes();
    }
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
        let answer = tx.clone();
        let reader = tokio::spawn(async move {
            // Lines as bytes: a line that is not JSON (not even UTF-8) is
            // skipped like any bad request, never taken for a hang-up. A bad
            // request that names its id (a stop of an unknown kind, say) is
            // answered with the reason, so that its sender does not wait.
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
                    Err(e) => {
                        tracing::warn!(error = %e, "bad keeper request");
                        if let Some(id) = request_id(&line) {
                            let message = format!("bad request: {e}");
                            let _ = answer.send(FromKeeper::Error { id, message });
                        }
                    }
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
            ToKeeper::Stop { id, kind } => {
                self.start_stop(kind, StopOrigin::Request { conn, id }, done);
                return;
            }
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
            lock: self.opts.lock.to_string(),
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
        let argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
        let scope = self.cgroup_root.as_ref().and_then(|root| {
            let name = format!("putex-{}-{}", self.opts.lock, self.me);
            root.create(&name)
                .map_err(|e| {
                    klog(
                        &self.opts.lock,
                        &format!("no cgroup scope ({e}); using the subreaper"),
                    )
                })
                .ok()
        });
        match spawn_child(scope.as_ref(), argv.clone(), env, self.opts.child_stdout) {
            Ok(pid) => {
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
                holder: None,
                holder_addr: None,
                kv_socket: self.opts.kv_socket.clone(),
                members: Vec::new(),
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

/// The `id` of a request line the keeper could not read, if it has one.
pub(super) fn request_id(line: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(line)
        .ok()?
        .get("id")?
        .as_u64()
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
