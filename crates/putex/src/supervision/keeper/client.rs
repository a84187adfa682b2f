//! The agent's side: spawning or adopting a keeper, its requests and
//! events, and the emergency stop without it.

use super::*;

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
    /// The lock it keeps (`PUTEX_LOCK` for its hooks; first in `ps`).
    pub lock: Name,
    /// This node (`PUTEX_NODE`).
    pub node: NodeId,
    /// The deactivate hook (hook mode).
    pub deactivate: Option<String>,
    /// `PUTEX_KV_SOCKET` for the deactivate hook: where the agent answers
    /// `putex kv` (`docs/locks.md`, "Guarded writes").
    pub kv_socket: Option<PathBuf>,
    /// `--stop-timeout`.
    pub stop_timeout: Duration,
    /// The emergency-stop timeout.
    pub emergency_timeout: Duration,
    /// `false` forces the subreaper fallback.
    pub cgroup: bool,
    /// Routine keeper messages to the log only ([`KeeperOptions::quiet`]).
    pub quiet: bool,
    /// The child's stdout is this process's stdout
    /// ([`KeeperOptions::child_stdout`]): the keeper is started with it as
    /// its own, and says it is ready by answering on its socket instead of
    /// a line on stdout.
    pub child_stdout: bool,
}

impl KeeperConfig {
    /// The error of a keeper that could not be started.
    fn start_error(&self, message: String) -> KeeperError {
        KeeperError::Start {
            exe: self.exe.clone(),
            message,
        }
    }

    /// The argv that starts this keeper (after the binary).
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "keeper".into(),
            self.lock.as_str().into(),
            "--socket".into(),
            self.socket.clone().into(),
            "--node".into(),
            self.node.as_str().into(),
            "--stop-timeout-ms".into(),
            self.stop_timeout.as_millis().to_string().into(),
            "--emergency-timeout-ms".into(),
            self.emergency_timeout.as_millis().to_string().into(),
        ];
        a.push(
            if self.child_stdout {
                "--child-stdout"
            } else {
                "--announce"
            }
            .into(),
        );
        if let Some(d) = &self.deactivate {
            a.push("--deactivate".into());
            a.push(d.clone().into());
        }
        if let Some(k) = &self.kv_socket {
            a.push("--kv-socket".into());
            a.push(k.clone().into());
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
        let start_err = |message: String| config.start_error(message);
        let mut child = tokio::process::Command::new(&config.exe)
            .args(config.args())
            .stdin(Stdio::null())
            .stdout(if config.child_stdout {
                Stdio::inherit()
            } else {
                Stdio::piped()
            })
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| start_err(e.to_string()))?;
        if config.child_stdout {
            return KeeperClient::await_listening(config, child)
                .await
                .map(|c| (c, false));
        }
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

    /// Waits until a keeper started without `--announce` answers on its
    /// socket (polled every millisecond), exits, or 10 s pass.
    async fn await_listening(
        config: &KeeperConfig,
        mut child: tokio::process::Child,
    ) -> Result<KeeperClient, KeeperError> {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = KeeperClient::adopt(&config.socket).await? {
                // The keeper outlives us; tokio reaps it if it exits while
                // we live.
                drop(child);
                return Ok(c);
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(config.start_error(format!("exited before it was ready ({status})")));
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(config.start_error("not ready within 10 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
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

    /// Asks the keeper for its state (a `status` request).
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
