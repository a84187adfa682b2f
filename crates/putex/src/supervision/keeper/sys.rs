//! What the keeper process asks of the operating system before and while
//! it serves: signal dispositions that survive no `exec`, its log lines,
//! the service's child in a process group (and scope) of its own, the
//! timer on `CLOCK_BOOTTIME` that fires across a suspend, and its socket,
//! readable by its owner only.

use super::*;

/// Catches SIGTERM, SIGINT and SIGHUP and only logs them. Handlers (unlike
/// a blocked mask or `SIG_IGN`) are not inherited across `exec`, so the child
/// still gets default dispositions.
pub(super) fn ignore_stop_signals(lock: &str) -> Result<(), KeeperError> {
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

/// The deactivate hooks the keeper runs itself (the stop at the licence's
/// deadline, above all) log their output and fate through `tracing`, as in
/// the agent: here those events — and only those; the keeper's own
/// messages are [`klog`]'s — go to stderr, the agent's journal, in the
/// agent's text format. Without it the emergency stop's every step would
/// be lost.
pub(super) fn log_hooks_to_stderr() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "off,putex::supervision::hooks=info",
        ))
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

/// Set by `--quiet`: routine messages ([`klog`]) go to the log only;
/// alarms ([`kalarm`]) still reach stderr.
pub(super) static QUIET: AtomicBool = AtomicBool::new(false);

/// A routine keeper message: stderr (the agent's journal) and the log.
pub(super) fn klog(lock: &str, msg: &str) {
    tracing::info!(lock, "{msg}");
    if !QUIET.load(Ordering::Relaxed) {
        eprintln!("putex keeper[{lock}]: {msg}");
    }
}

/// A keeper message that must be seen even when quiet: the deadline passed.
pub(super) fn kalarm(lock: &str, msg: &str) {
    tracing::warn!(lock, "{msg}");
    eprintln!("putex keeper[{lock}]: {msg}");
}

/// Starts the service's `argv` with this process's environment plus `env`,
/// stdin from `/dev/null`, stdout to the keeper's stdout (`child_stdout`)
/// or its stderr, stderr to the keeper's stderr, in a process group of its
/// own, in `scope` if given. Never waited for through a handle: the reaper
/// collects it. Returns its pid.
pub(super) fn spawn_child(
    scope: Option<&process::Cgroup>,
    mut argv: Vec<OsString>,
    env: Vec<(String, String)>,
    child_stdout: bool,
) -> io::Result<i32> {
    // A copy of the keeper's stdout (`to_stdout`) or stderr.
    let copy = |to_stdout: bool| {
        if to_stdout {
            io::stdout().as_fd().try_clone_to_owned()
        } else {
            io::stderr().as_fd().try_clone_to_owned()
        }
    };
    let environment = process::child_environment(|_| false, env);
    if let Some(cg) = scope {
        let output = |what: &str, fd: io::Result<std::os::fd::OwnedFd>| match fd {
            Ok(fd) => process::Output::Fd(fd),
            Err(e) => {
                tracing::warn!(error = %e, "child {what} goes to /dev/null");
                process::Output::Null
            }
        };
        match process::spawn_into(
            cg,
            &argv,
            &environment,
            output("stdout", copy(child_stdout)),
            output("stderr", copy(false)),
            false,
        ) {
            Ok(child) => return Ok(child.pid),
            Err(process::SpawnError::Failed(e)) => return Err(e),
            Err(process::SpawnError::Unsupported(_)) => argv = process::wrap_in_cgroup(cg, &argv),
        }
    }
    let out = |what: &str, fd: io::Result<std::os::fd::OwnedFd>| -> Stdio {
        match fd {
            Ok(fd) => Stdio::from(fd),
            Err(e) => {
                tracing::warn!(error = %e, "child {what} goes to /dev/null");
                Stdio::null()
            }
        }
    };
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(environment)
        .stdin(Stdio::null())
        .stdout(out("stdout", copy(child_stdout)))
        .stderr(out("stderr", copy(false)));
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    // Never waited through the handle: the reaper collects it.
    Ok(cmd.spawn()?.id() as i32)
}

/// A `timerfd` on `CLOCK_BOOTTIME` with an absolute expiry. A thread of its
/// own blocks reading it and reports each expiry on a channel; setting the
/// timer from the event loop changes what that read waits for.
pub(super) struct BootTimer(Arc<TimerFd>, Arc<std::sync::atomic::AtomicBool>);

impl BootTimer {
    pub(super) fn start() -> Result<(BootTimer, mpsc::UnboundedReceiver<()>), KeeperError> {
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

    pub(super) fn set(&self, at: Option<Instant>) {
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
    pub(super) fn degraded(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub(super) fn bind(socket: &Path) -> Result<UnixListener, KeeperError> {
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
