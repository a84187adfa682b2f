//! Running hooks: the health check, fence, activate and deactivate commands,
//! and the operator hooks of `putex run` (position, rejoin, follow).
//!
//! Shared by the agent (`putex run`), `putex lock` and the keeper (which runs
//! the deactivate hook for the stops it makes). A hook is a shell command line
//! given by the operator, run as
//!
//! ```text
//! /bin/sh -c "$CMD" putex-hook                      # fence, activate, deactivate
//! /bin/sh -c "$CMD \"\$@\"" putex-hook active       # health check (or: standby)
//! ```
//!
//! so `$0` is `putex-hook` and the health check's mode is the command's last
//! argument (`CMD active` / `CMD standby`). The environment is the caller's,
//! minus every inherited `PUTEX_*` variable, plus:
//!
//! | variable | value |
//! |---|---|
//! | `PUTEX_HOOK` | `healthcheck`, `fence`, `activate`, `deactivate`, `position`, `rejoin`, `follow` or `info` |
//! | `PUTEX_LOCK` | the lock name |
//! | `PUTEX_NODE` | this node's id |
//! | `PUTEX_ROLE` | the agent's role (`starting`, `standby`, `confirming`, `active`, `stepping-down`, `lapsed`) |
//! | `PUTEX_TOKEN` | the fencing token `epoch:revision`; set only when the node holds the lock |
//! | `PUTEX_PREVIOUS` | the previous holder's node id; set only when known |
//! | `PUTEX_STOP` | `startup`, `graceful` or `emergency`; deactivate hook only |
//! | `PUTEX_HOLDER` | `putex run`: the active holder as the member records say, when known (the rejoin and follow hooks: the holder they are run for) |
//! | `PUTEX_HOLDER_ADDR` | its `--advertise` address, when it published one |
//! | `PUTEX_KV_SOCKET` | `putex run`: where `putex kv put`/`delete` ask the agent for guarded writes of its tenure (`docs/locks.md`) |
//! | `PUTEX_MEMBERS` | `putex run`: the lock's members whose records the agent has read, this node too once its own came back, as `NODE=SECONDS` by node, space-separated (`db1=0 db2=1 db3=5412`): seconds since each one's record was last written, on the store's clock (a member that exited counts from its last record); unset until the records were read, and in the keeper's deactivate hook |
//!
//! Each run has a timeout; at the timeout (or when its caller stops it) the
//! hook and everything it started (its cgroup scope, or its process group
//! and descendants) are killed — except its daemons: a process it started in
//! a session of its own whose parent has exited (`setsid`, `daemon`, the
//! postmaster of `pg_ctl start`) outlives the hook, as it does when the hook
//! exits; in a cgroup it moves to the scope [`DAEMONS_SCOPE`] beside the
//! hooks' own. A hook's scope is removed once it is empty.
//! stdout and stderr go to the tracing log line by line, tagged with the hook's
//! name; the exit status and duration come back in a [`HookOutcome`].
//! [`Hook::validate`] finds a missing or non-executable hook at start-up.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::store::{Name, NodeId};
use putex_core::agent::{HealthMode, StopKind};
use putex_core::Token;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::unix::pipe;
use tokio::process::Command;

use crate::supervision::process::{
    self, Cgroup, CgroupRoot, DirectChild, Exit, Output, SpawnError, Tree,
};

/// How long output is still read after a hook exited (a background process
/// it started may hold the pipes open forever).
const DRAIN: Duration = Duration::from_millis(100);
/// The scope, beside the hooks' own, that the daemons a hook started move
/// to when it ends ([`HookRunner::release_daemons`]).
pub const DAEMONS_SCOPE: &str = "putex-hook-daemons";
/// How long killing a timed-out hook's tree may take before we give up.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Which hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// `--healthcheck`: called with `active` or `standby` as its last argument.
    Health,
    /// `--fence`: fence the previous holder out.
    Fence,
    /// `--activate`: start the service.
    Activate,
    /// `--deactivate`: stop the service (`PUTEX_STOP` says why).
    Deactivate,
    /// `--position`: print this node's data position.
    Position,
    /// `--rejoin`: resynchronise with the holder after an unclean tenure.
    Rejoin,
    /// `--follow`: follow the new holder.
    Follow,
    /// `--info`: print a small JSON object for the member record.
    Info,
}

impl HookKind {
    /// The hook's name in logs and in `PUTEX_HOOK`.
    pub fn name(self) -> &'static str {
        match self {
            HookKind::Health => "healthcheck",
            HookKind::Fence => "fence",
            HookKind::Activate => "activate",
            HookKind::Deactivate => "deactivate",
            HookKind::Position => "position",
            HookKind::Rejoin => "rejoin",
            HookKind::Follow => "follow",
            HookKind::Info => "info",
        }
    }
}

/// The argument a health check gets for `mode`.
pub fn health_arg(mode: HealthMode) -> &'static str {
    match mode {
        HealthMode::Active => "active",
        HealthMode::Standby => "standby",
    }
}

/// The value of `PUTEX_STOP` for a stop kind.
pub fn stop_name(kind: StopKind) -> &'static str {
    match kind {
        StopKind::Startup => "startup",
        StopKind::Graceful => "graceful",
        StopKind::Emergency => "emergency",
    }
}

/// Errors of hook execution.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The command's first word is a path that does not exist.
    #[error("{hook} hook: {path} does not exist")]
    NotFound { hook: &'static str, path: PathBuf },
    /// The command's first word is a path that is not an executable file.
    #[error("{hook} hook: {path} is not an executable file")]
    NotExecutable { hook: &'static str, path: PathBuf },
    /// The command is empty.
    #[error("{hook} hook: empty command")]
    Empty { hook: &'static str },
    /// `/bin/sh` could not be started.
    #[error("{hook} hook: cannot start /bin/sh: {source}")]
    Spawn {
        hook: &'static str,
        source: std::io::Error,
    },
}

/// A hook: its kind and the operator's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// Which hook.
    pub kind: HookKind,
    /// The command line, run by `/bin/sh -c`.
    pub command: String,
}

impl Hook {
    /// A hook of `kind` running `command`.
    pub fn new(kind: HookKind, command: impl Into<String>) -> Hook {
        Hook {
            kind,
            command: command.into(),
        }
    }

    /// Checks the command at start-up: when its first word is a path (it
    /// contains a `/`), that path must be an executable file. Other first
    /// words (`systemctl`, shell syntax) are left to the shell.
    pub fn validate(&self) -> Result<(), HookError> {
        let hook = self.kind.name();
        let Some(first) = self.command.split_whitespace().next() else {
            return Err(HookError::Empty { hook });
        };
        if !first.contains('/') || first.starts_with(['"', '\'', '$', '(']) {
            return Ok(());
        }
        let path = PathBuf::from(first);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(_) => return Err(HookError::NotFound { hook, path }),
        };
        let executable = meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
            && nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_ok();
        if !executable {
            return Err(HookError::NotExecutable { hook, path });
        }
        Ok(())
    }

    /// The exact argv the hook runs with (see the module docs).
    pub fn argv(&self, arg: Option<&str>) -> Vec<OsString> {
        match arg {
            Some(arg) => vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("{} \"$@\"", self.command).into(),
                "putex-hook".into(),
                arg.into(),
            ],
            None => vec![
                "/bin/sh".into(),
                "-c".into(),
                self.command.clone().into(),
                "putex-hook".into(),
            ],
        }
    }
}

/// What a hook is told about the agent (its `PUTEX_*` environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookEnv {
    /// `PUTEX_LOCK`.
    pub lock: Name,
    /// `PUTEX_NODE`.
    pub node: NodeId,
    /// `PUTEX_ROLE`.
    pub role: String,
    /// `PUTEX_TOKEN`, when the node holds the lock.
    pub token: Option<Token>,
    /// `PUTEX_PREVIOUS`, when known.
    pub previous: Option<String>,
    /// `PUTEX_STOP`, for the deactivate hook.
    pub stop: Option<StopKind>,
    /// `PUTEX_HOLDER`, for the rejoin and follow hooks.
    pub holder: Option<String>,
    /// `PUTEX_HOLDER_ADDR`, for the rejoin and follow hooks.
    pub holder_addr: Option<String>,
    /// `PUTEX_KV_SOCKET`: where `putex kv` asks the agent for guarded writes.
    pub kv_socket: Option<std::path::PathBuf>,
    /// `PUTEX_MEMBERS`: the lock's members whose records the agent has
    /// read (this node too, once its own record came back), each with how
    /// long ago its record was last written, on the store's clock.
    pub members: Vec<(NodeId, Duration)>,
}

impl HookEnv {
    /// The environment of a hook of `lock` on `node` and nothing else (no
    /// role, token or holder).
    pub fn new(lock: Name, node: NodeId) -> HookEnv {
        HookEnv {
            lock,
            node,
            role: String::new(),
            token: None,
            previous: None,
            stop: None,
            holder: None,
            holder_addr: None,
            kv_socket: None,
            members: Vec::new(),
        }
    }

    /// The variables for `kind`, in a fixed order.
    pub fn vars(&self, kind: HookKind) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("PUTEX_HOOK", kind.name().to_string()),
            ("PUTEX_LOCK", self.lock.to_string()),
            ("PUTEX_NODE", self.node.to_string()),
            ("PUTEX_ROLE", self.role.clone()),
        ];
        if let Some(t) = self.token {
            v.push(("PUTEX_TOKEN", t.to_string()));
        }
        if let Some(p) = &self.previous {
            v.push(("PUTEX_PREVIOUS", p.clone()));
        }
        if let (HookKind::Deactivate, Some(s)) = (kind, self.stop) {
            v.push(("PUTEX_STOP", stop_name(s).to_string()));
        }
        if let Some(h) = &self.holder {
            v.push(("PUTEX_HOLDER", h.clone()));
        }
        if let Some(a) = &self.holder_addr {
            v.push(("PUTEX_HOLDER_ADDR", a.clone()));
        }
        if let Some(socket) = &self.kv_socket {
            v.push(("PUTEX_KV_SOCKET", socket.display().to_string()));
        }
        if !self.members.is_empty() {
            v.push(("PUTEX_MEMBERS", members_var(&self.members)));
        }
        v
    }
}

/// `PUTEX_MEMBERS`: `NODE=SECONDS` pairs, by node, separated by spaces
/// (`db1=0 db2=1 db3=5412`): whole seconds since each member's record was
/// last written. Node ids hold no space or `=`.
fn members_var(members: &[(NodeId, Duration)]) -> String {
    let mut sorted: Vec<_> = members.iter().collect();
    sorted.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    sorted
        .iter()
        .map(|(node, age)| format!("{node}={}", age.as_secs()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a hook run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookStatus {
    /// It exited, or a signal ended it.
    Exited(Exit),
    /// It ran past its timeout; it and its descendants were killed.
    TimedOut,
    /// It was stopped before it ended ([`HookRunner::run_until`]); it and
    /// its descendants were killed.
    Cancelled,
}

/// The result of one hook run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookOutcome {
    pub name: &'static str,
    /// How it ended.
    pub status: HookStatus,
    /// How long it ran.
    pub duration: Duration,
    /// Whether a timed-out hook's whole tree is proven gone (always true for
    /// a hook that exited on its own; its leftovers are not killed).
    pub tree_gone: bool,
    /// The last line the hook wrote to stderr (at most
    /// [`LAST_LINE_MAX`] characters), to say why it failed.
    pub last_stderr: Option<String>,
}

/// How much of a hook's last stderr line [`HookOutcome`] keeps.
pub const LAST_LINE_MAX: usize = 200;

impl HookOutcome {
    /// Exited 0 within its timeout.
    pub fn ok(&self) -> bool {
        matches!(self.status, HookStatus::Exited(e) if e.success())
    }

    /// Why it failed, for people: how it ended and its last stderr line
    /// (`exit 1: requested WAL segment … has already been removed`);
    /// `None` when it succeeded.
    pub fn failure(&self) -> Option<String> {
        if self.ok() {
            return None;
        }
        let how = match self.status {
            HookStatus::Exited(Exit {
                code: Some(code), ..
            }) => format!("exit {code}"),
            HookStatus::Exited(Exit {
                signal: Some(signal),
                ..
            }) => format!("killed by signal {signal}"),
            HookStatus::Exited(_) => "ended".into(),
            HookStatus::TimedOut => {
                format!("timed out after {}", putex_core::time::Human(self.duration))
            }
            HookStatus::Cancelled => "stopped".into(),
        };
        Some(match &self.last_stderr {
            Some(line) => format!("{how}: {line}"),
            None => how,
        })
    }
}

/// Runs hooks, each in a cgroup scope of its own when one can be created.
#[derive(Clone, Debug)]
pub struct HookRunner {
    cgroup: Option<CgroupRoot>,
}

static SCOPE_SEQ: AtomicU64 = AtomicU64::new(0);

impl HookRunner {
    /// Uses cgroup scopes if this process can create them. Removes the
    /// empty scopes of hook runners and keepers that died before they could
    /// ([`CgroupRoot::remove_orphan_scopes`]).
    pub fn detect() -> HookRunner {
        let cgroup = CgroupRoot::detect();
        if let Some(root) = &cgroup {
            root.remove_orphan_scopes();
        }
        HookRunner { cgroup }
    }

    /// Never uses cgroups: a timed-out hook's process group and living
    /// descendants are killed.
    pub fn without_cgroup() -> HookRunner {
        HookRunner { cgroup: None }
    }

    /// Whether hooks run in cgroup scopes.
    pub fn uses_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }

    /// Runs `hook` with `env`, `arg` as its last argument (health checks),
    /// killing its whole tree at `timeout`.
    pub async fn run(
        &self,
        hook: &Hook,
        env: &HookEnv,
        arg: Option<&str>,
        timeout: Duration,
    ) -> Result<HookOutcome, HookError> {
        self.run_until(hook, env, arg, timeout, std::future::pending())
            .await
    }

    /// [`run`](Self::run), also killing its whole tree when `stop`
    /// completes first ([`HookStatus::Cancelled`]). It returns only once
    /// the hook's process has ended and its tree was killed and waited for
    /// (`tree_gone` says whether it emptied), so that what the hook was
    /// doing is over when the caller goes on: dropping the future instead
    /// would kill the hook's shell and leave its children running.
    pub async fn run_until(
        &self,
        hook: &Hook,
        env: &HookEnv,
        arg: Option<&str>,
        timeout: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<HookOutcome, HookError> {
        let name = hook.kind.name();
        let argv = hook.argv(arg);
        let scope = self.cgroup.as_ref().and_then(|root| {
            let n = SCOPE_SEQ.fetch_add(1, Ordering::Relaxed);
            let scope_name = format!("putex-hook-{name}-{}-{n}", std::process::id());
            root.create(&scope_name)
                .map_err(|e| tracing::warn!(hook = name, error = %e, "no cgroup scope for hook"))
                .ok()
        });
        let vars = env.vars(hook.kind);
        let started = std::time::Instant::now();
        let (mut child, streams) = match spawn(scope.as_ref(), argv, &vars) {
            Ok(running) => running,
            Err(source) => {
                if let Some(cg) = &scope {
                    let _ = cg.remove();
                }
                return Err(HookError::Spawn { hook: name, source });
            }
        };
        let tree = match &scope {
            Some(cg) => Tree::Cgroup(cg.clone()),
            None => Tree::Pids { root: child.pid() },
        };
        let readers: Vec<_> = streams
            .into_iter()
            .map(|(stream, r)| (stream, tokio::spawn(log_lines(name, stream, r))))
            .collect();

        let ended_early = tokio::select! {
            exit = child.wait() => Err(exit),
            () = tokio::time::sleep(timeout) => Ok(HookStatus::TimedOut),
            () = stop => Ok(HookStatus::Cancelled),
        };
        let (status, tree_gone) = match ended_early {
            Err(exit) => (HookStatus::Exited(exit), true),
            Ok(status) => {
                if let Some(cg) = &scope {
                    self.release_daemons(name, cg);
                }
                tree.kill();
                child.wait().await;
                (status, tree.wait_empty(KILL_WAIT, true).await)
            }
        };
        let duration = started.elapsed();
        let mut last_stderr = None;
        for (stream, task) in readers {
            // A leftover background process may hold the pipe: stop
            // reading after DRAIN.
            if let Ok(Some(Some(line))) =
                tokio::time::timeout(DRAIN, async { task.await.ok() }).await
            {
                if stream == "stderr" {
                    last_stderr = Some(line);
                }
            }
        }
        if let Some(cg) = &scope {
            if !tree.is_empty() {
                self.release_daemons(name, cg);
            }
            if tree.is_empty() {
                let _ = cg.remove();
            } else {
                tracing::warn!(hook = name, scope = %cg.path().display(),
                    "hook left processes running in its scope");
            }
        }
        match status {
            // A passing health check runs once per R: not worth an info line.
            HookStatus::Exited(e) if hook.kind == HookKind::Health && e.success() => {
                tracing::debug!(hook = name, code = ?e.code, signal = ?e.signal,
                duration_ms = duration.as_millis() as u64, "hook finished")
            }
            HookStatus::Exited(e) => {
                tracing::info!(hook = name, code = ?e.code, signal = ?e.signal,
                duration_ms = duration.as_millis() as u64, "hook finished")
            }
            HookStatus::TimedOut => tracing::warn!(
                hook = name,
                timeout_ms = timeout.as_millis() as u64,
                tree_gone,
                "hook timed out and was killed"
            ),
            HookStatus::Cancelled => tracing::info!(
                hook = name,
                duration_ms = duration.as_millis() as u64,
                tree_gone,
                "hook stopped before it ended: killed"
            ),
        }
        Ok(HookOutcome {
            name,
            status,
            duration,
            tree_gone,
            last_stderr,
        })
    }
}

impl HookRunner {
    /// Moves the daemons a hook started out of its scope, into
    /// [`DAEMONS_SCOPE`], before the scope is killed (timeout, cancel) or
    /// removed (exit): they outlive the hook, as they do without a cgroup.
    /// A daemon is a process in a session other than the hook's whose parent
    /// is not in the scope any more — started with `setsid` or `daemon` by a
    /// process that has exited, as `pg_ctl start` starts the postmaster —
    /// with every process of its session (the postmaster's backends). What
    /// the hook itself still runs stays and is killed: its shell, its
    /// background jobs, a `setsid` child whose parent is still there. The
    /// scope is frozen meanwhile, so nothing forks unseen.
    fn release_daemons(&self, hook: &'static str, scope: &Cgroup) {
        let Some(root) = &self.cgroup else {
            return;
        };
        let Ok(pids) = scope.procs() else {
            return;
        };
        if pids.is_empty() {
            return;
        }
        let own_session = nix::unistd::getsid(None).map_or(0, |s| s.as_raw());
        let frozen = scope.freeze();
        let members: Vec<_> = scope
            .procs()
            .unwrap_or(pids)
            .into_iter()
            .filter_map(process::proc_entry)
            .collect();
        let in_scope: std::collections::HashSet<i32> = members.iter().map(|e| e.pid).collect();
        let sessions: std::collections::HashSet<i32> = members
            .iter()
            .filter(|e| e.session != own_session && !in_scope.contains(&e.ppid))
            .map(|e| e.session)
            .collect();
        let daemons: Vec<i32> = members
            .iter()
            .filter(|e| sessions.contains(&e.session))
            .map(|e| e.pid)
            .collect();
        if !daemons.is_empty() {
            match root.open_or_create(DAEMONS_SCOPE) {
                Ok(to) => {
                    let moved = daemons.iter().filter(|&&pid| to.adopt(pid).is_ok()).count();
                    tracing::info!(
                        hook,
                        daemons = moved,
                        scope = %to.path().display(),
                        "the daemons the hook started outlive it"
                    );
                }
                Err(e) => {
                    tracing::warn!(hook, error = %e, "the hook's daemons cannot leave its scope")
                }
            }
        }
        if frozen {
            scope.thaw();
        }
    }
}

/// A hook's output stream, read line by line into the log.
type Stream = Box<dyn AsyncRead + Unpin + Send>;

/// A started hook: created in its scope, or started by tokio (no scope, or a
/// kernel without `clone3(CLONE_INTO_CGROUP)`: the wrapper moves it in).
enum Running {
    Direct(DirectChild),
    Tokio(tokio::process::Child, i32),
}

impl Running {
    fn pid(&self) -> i32 {
        match self {
            Running::Direct(c) => c.pid(),
            Running::Tokio(_, pid) => *pid,
        }
    }

    /// Waits for the hook's own process (not its tree) to end.
    async fn wait(&mut self) -> Exit {
        let unknown = Exit {
            code: None,
            signal: None,
        };
        match self {
            Running::Direct(c) => c.wait().await.unwrap_or(unknown),
            Running::Tokio(c, pid) => {
                let exit = c.wait().await.map(Exit::from_std).unwrap_or(unknown);
                process::unclaim(*pid);
                exit
            }
        }
    }
}

/// Starts `argv` with this process's environment minus every `PUTEX_*`
/// variable plus `vars`, in a process group of its own, in `scope` if given;
/// its pid is claimed (see [`process::claim`]).
fn spawn(
    scope: Option<&Cgroup>,
    mut argv: Vec<OsString>,
    vars: &[(&'static str, String)],
) -> std::io::Result<(Running, Vec<(&'static str, Stream)>)> {
    let env = process::child_environment(
        |k| k.as_encoded_bytes().starts_with(b"PUTEX_"),
        vars.iter().cloned(),
    );
    if let Some(cg) = scope {
        match process::spawn_into(cg, &argv, &env, Output::Pipe, Output::Pipe, true) {
            Ok(child) => {
                let mut streams: Vec<(&'static str, Stream)> = Vec::new();
                for (name, fd) in [("stdout", child.stdout), ("stderr", child.stderr)] {
                    if let Some(fd) = fd {
                        streams.push((name, Box::new(pipe::Receiver::from_owned_fd(fd)?)));
                    }
                }
                return Ok((
                    Running::Direct(DirectChild::new(child.pid, child.pidfd)?),
                    streams,
                ));
            }
            Err(SpawnError::Failed(e)) => return Err(e),
            Err(SpawnError::Unsupported(_)) => argv = process::wrap_in_cgroup(cg, &argv),
        }
    }
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .env_clear()
        .envs(env);
    let mut child = cmd.spawn()?;
    let pid = child.id().map_or(0, |p| p as i32);
    process::claim(pid);
    let mut streams: Vec<(&'static str, Stream)> = Vec::new();
    if let Some(s) = child.stdout.take() {
        streams.push(("stdout", Box::new(s)));
    }
    if let Some(s) = child.stderr.take() {
        streams.push(("stderr", Box::new(s)));
    }
    Ok((Running::Tokio(child, pid), streams))
}

/// Logs `r` line by line; returns its last line that is not blank, cut to
/// [`LAST_LINE_MAX`] characters.
async fn log_lines(hook: &'static str, stream: &'static str, r: Stream) -> Option<String> {
    let mut lines = BufReader::new(r).lines();
    let mut last = None;
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(hook, stream, "{line}");
        let kept = line.trim();
        if !kept.is_empty() {
            last = Some(kept.chars().take(LAST_LINE_MAX).collect());
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_exactly_as_documented() {
        let h = Hook::new(HookKind::Health, "/usr/bin/check --fast");
        assert_eq!(
            h.argv(Some("active")),
            [
                "/bin/sh",
                "-c",
                "/usr/bin/check --fast \"$@\"",
                "putex-hook",
                "active"
            ]
            .map(OsString::from)
        );
        let d = Hook::new(HookKind::Deactivate, "systemctl stop pg");
        assert_eq!(
            d.argv(None),
            ["/bin/sh", "-c", "systemctl stop pg", "putex-hook"].map(OsString::from)
        );
    }

    #[test]
    fn validation_checks_paths_only() {
        assert!(Hook::new(HookKind::Activate, "systemctl start pg")
            .validate()
            .is_ok());
        assert!(Hook::new(HookKind::Activate, "/bin/true x")
            .validate()
            .is_ok());
        assert!(matches!(
            Hook::new(HookKind::Activate, "/nonexistent/hook").validate(),
            Err(HookError::NotFound { .. })
        ));
        assert!(matches!(
            Hook::new(HookKind::Activate, "/proc/self/status --x").validate(),
            Err(HookError::NotExecutable { .. })
        ));
        assert!(matches!(
            Hook::new(HookKind::Fence, "  ").validate(),
            Err(HookError::Empty { .. })
        ));
    }

    #[test]
    fn env_sets_stop_only_for_deactivate() {
        let env = HookEnv {
            lock: Name::new("pg").unwrap(),
            node: NodeId::new("n1").unwrap(),
            role: "lapsed".into(),
            token: Some(Token::new(7, 42)),
            previous: None,
            stop: Some(StopKind::Emergency),
            holder: None,
            holder_addr: None,
            kv_socket: None,
            members: Vec::new(),
        };
        let d = env.vars(HookKind::Deactivate);
        assert!(d.contains(&("PUTEX_STOP", "emergency".into())));
        assert!(d.contains(&("PUTEX_TOKEN", "7:42".into())));
        assert!(!env
            .vars(HookKind::Health)
            .iter()
            .any(|(k, _)| *k == "PUTEX_STOP"));
    }

    #[test]
    fn members_are_node_equals_seconds_by_node() {
        let node = |n: &str| NodeId::new(n).unwrap();
        let mut env = HookEnv::new(Name::new("pg").unwrap(), node("db1"));
        assert!(!env
            .vars(HookKind::Health)
            .iter()
            .any(|(k, _)| *k == "PUTEX_MEMBERS"));
        env.members = vec![
            (node("db3"), Duration::from_millis(5_412_900)),
            (node("db1"), Duration::ZERO),
            (node("db2.example.com"), Duration::from_millis(1_500)),
        ];
        let vars = env.vars(HookKind::Health);
        let members = vars.iter().find(|(k, _)| *k == "PUTEX_MEMBERS").unwrap();
        assert_eq!(members.1, "db1=0 db2.example.com=1 db3=5412");
    }
}
