//! Starting a process directly inside a cgroup scope with
//! `clone3(CLONE_INTO_CGROUP)` (Linux ≥ 5.7).
//!
//! The portable way in ([`wrap_in_cgroup`]) lets the new process write its
//! own pid into the scope's `cgroup.procs`. Moving a running process between
//! cgroups takes the kernel's cgroup-wide thread-group lock for writing,
//! which waits for an RCU grace period: 5–20 ms on a busy host, and it is on
//! the switchover path twice (the old holder's deactivate hook, the new
//! holder's activate hook; session 15 in `docs/performance-history.md`:
//! `#session-15-2026-11-27-hooks-created-in-their-cgroup-scope-postgresql-beside-patroni`).
//! A process *created* in the scope takes that lock only for reading, so
//! nothing waits.
//!
//! [`spawn_into`] forks with `clone3`, giving the scope's directory as the
//! child's cgroup, and `execve`s the command in the child; between the two
//! the child only makes async-signal-safe system calls on memory prepared
//! before the fork (no allocation, no locks): reset the signal mask and
//! `SIGPIPE`, start its own process group, put stdin/stdout/stderr in place.
//! An `exec` failure comes back through a close-on-exec pipe as an errno, as
//! in the standard library's `Command`. The pid is [`claim`]ed before anyone
//! can reap it (when asked), and a pidfd lets the spawner wait for it without
//! a signal handler ([`DirectChild`]).
//!
//! On a kernel without `clone3` or `CLONE_INTO_CGROUP`, [`spawn_into`] says
//! [`SpawnError::Unsupported`] (and remembers it): the caller falls back to
//! [`wrap_in_cgroup`]. Same tree, same pid, only slower.
//!
//! This is the one module of putex with `unsafe` code: no safe crate offers
//! `clone3` with a cgroup (std's `Command` has no such option), and the
//! child's few steps before `execve` are the same ones std's `Command` takes.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::*;

/// `clone3` flag: give the child a pidfd.
const CLONE_PIDFD: u64 = 0x1000;
/// `clone3` flag: start the child in the cgroup whose directory fd is given.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Set once a kernel refused `clone3(CLONE_INTO_CGROUP)` as unknown.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// Why [`spawn_into`] did not start the process.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The kernel has no `clone3` or no `CLONE_INTO_CGROUP`: use
    /// [`wrap_in_cgroup`].
    #[error("clone3(CLONE_INTO_CGROUP) is not available: {0}")]
    Unsupported(io::Error),
    /// The process could not be started (program missing, not executable,
    /// the scope refused it, …).
    #[error("{0}")]
    Failed(io::Error),
}

/// Where one of the child's output streams goes.
#[derive(Debug)]
pub enum Output {
    /// `/dev/null`.
    Null,
    /// A new pipe; the read end comes back in [`Spawned`].
    Pipe,
    /// This descriptor (duplicated onto the stream).
    Fd(OwnedFd),
}

/// A process started by [`spawn_into`].
#[derive(Debug)]
pub struct Spawned {
    /// Its pid; also its process group id.
    pub pid: i32,
    /// A pidfd for it (close-on-exec).
    pub pidfd: OwnedFd,
    /// The read end of its stdout, for [`Output::Pipe`].
    pub stdout: Option<OwnedFd>,
    /// The read end of its stderr, for [`Output::Pipe`].
    pub stderr: Option<OwnedFd>,
}

/// What the child needs, built before the fork so the child never allocates.
struct Prepared {
    program: CString,
    /// Owns what `argv_ptrs` points to.
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    /// Owns what `envp_ptrs` points to.
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
}

impl Prepared {
    fn new(argv: &[OsString], env: &[(OsString, OsString)]) -> io::Result<Prepared> {
        let cstr = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "argument contains a NUL byte")
            })
        };
        let first = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let program = cstr(resolve_program(first, path.as_deref())?.as_os_str())?;
        let argv: Vec<CString> = argv.iter().map(|a| cstr(a)).collect::<io::Result<_>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone().into_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                cstr(OsStr::from_bytes(&kv))
            })
            .collect::<io::Result<_>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Ok(Prepared {
            program,
            argv_ptrs: ptrs(&argv),
            _argv: argv,
            envp_ptrs: ptrs(&envp),
            _envp: envp,
        })
    }
}

/// `program` itself if it names a path, otherwise the first executable file
/// called `program` in `path` (the child's `PATH`, else `/bin:/usr/bin`).
fn resolve_program(program: &OsStr, path: Option<&OsStr>) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    for dir in std::env::split_paths(path) {
        let candidate = dir.join(program);
        if let Ok(meta) = fs::metadata(&candidate) {
            use std::os::unix::fs::PermissionsExt;
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found in PATH", program.to_string_lossy()),
    ))
}

/// The environment a child gets: this process's, without the variables
/// `drop` selects, with `set` added (later entries win).
pub fn child_environment<K, V>(
    drop: impl Fn(&OsStr) -> bool,
    set: impl IntoIterator<Item = (K, V)>,
) -> Vec<(OsString, OsString)>
where
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut env: Vec<(OsString, OsString)> =
        std::env::vars_os().filter(|(k, _)| !drop(k)).collect();
    for (k, v) in set {
        let k = k.into();
        env.retain(|(old, _)| *old != k);
        env.push((k, v.into()));
    }
    env
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

/// `fd`, or a close-on-exec copy of it numbered 3 or above (what
/// `try_clone` gives): the child's `dup2`s onto 0, 1 and 2 must not
/// overwrite a descriptor still to be moved.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    fd.try_clone()
}

/// The child's side of one output stream and the parent's read end.
fn output(o: Output) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
    let (child, parent) = match o {
        Output::Null => (fs::File::create("/dev/null")?.into(), None),
        Output::Pipe => {
            let (r, w) = pipe()?;
            (w, Some(r))
        }
        Output::Fd(fd) => (fd, None),
    };
    Ok((above_stdio(child)?, parent))
}

/// Starts `argv` with exactly the environment `env`, stdin from `/dev/null`,
/// in a process group of its own, inside `cgroup` from its first instruction.
///
/// With `claim`, the pid is [`claim`]ed before any [`reap_orphans`] can see
/// it; the caller collects its status ([`DirectChild::wait`]) and unclaims it.
pub fn spawn_into(
    cgroup: &Cgroup,
    argv: &[OsString],
    env: &[(OsString, OsString)],
    stdout: Output,
    stderr: Output,
    claim: bool,
) -> Result<Spawned, SpawnError> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return Err(SpawnError::Unsupported(io::Error::from_raw_os_error(
            libc::ENOSYS,
        )));
    }
    let failed = SpawnError::Failed;
    let prepared = Prepared::new(argv, env).map_err(failed)?;
    let scope = fs::File::open(cgroup.path()).map_err(failed)?;
    let stdin = fs::File::open("/dev/null")
        .and_then(|f| above_stdio(f.into()))
        .map_err(failed)?;
    let (out_child, out_parent) = output(stdout).map_err(failed)?;
    let (err_child, err_parent) = output(stderr).map_err(failed)?;
    let (report_r, report_w) = pipe().map_err(failed)?;
    let report_w = above_stdio(report_w).map_err(failed)?;

    let no_signals = nix::sys::signal::SigSet::empty();
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: scope.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    let fds = [
        stdin.as_raw_fd(),
        out_child.as_raw_fd(),
        err_child.as_raw_fd(),
    ];
    let report = report_w.as_raw_fd();

    // Held across the fork so that no reaper sees the child unclaimed.
    let mut claimed = claim.then(|| CLAIMED.lock());
    // SAFETY: clone3 without CLONE_VM or a stack behaves like fork: the child
    // gets a copy of this thread's memory. It runs `exec_child`, which only
    // makes async-signal-safe calls on data prepared above and never returns.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: we are the child; see exec_child.
        unsafe { exec_child(&prepared, no_signals.as_ref(), fds, report) }
    }
    if pid < 0 {
        drop(claimed);
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            // No clone3 (< 5.3), a struct too large (5.3–5.6), or an
            // unknown flag: this kernel cannot do it, now or later.
            Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL) => {
                UNSUPPORTED.store(true, Ordering::Relaxed);
                SpawnError::Unsupported(e)
            }
            _ => SpawnError::Failed(e),
        });
    }
    let pid = pid as i32;
    if let Some(set) = claimed.as_mut() {
        set.insert(pid);
    }
    drop(claimed);
    // SAFETY: clone3 succeeded with CLONE_PIDFD, so the kernel stored a new
    // descriptor that we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdin, out_child, err_child, report_w, scope));

    // Until the exec (EOF: the pipe was close-on-exec) or its failure.
    let mut errno = [0u8; 4];
    let mut report_r = fs::File::from(report_r);
    match report_r.read_exact(&mut errno) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Spawned {
            pid,
            pidfd,
            stdout: out_parent,
            stderr: err_parent,
        }),
        Ok(()) => {
            let _ = waitpid(Pid::from_raw(pid), None);
            if claim {
                unclaim(pid);
            }
            Err(SpawnError::Failed(io::Error::from_raw_os_error(
                i32::from_ne_bytes(errno),
            )))
        }
        Err(e) => {
            // The child runs; we cannot tell whether its exec worked.
            Err(SpawnError::Failed(e))
        }
    }
}

/// The child between `clone3` and `execve`.
///
/// # Safety
/// Only in the child of a fork-like `clone3`. Makes async-signal-safe calls
/// only, on memory prepared before the fork; never returns.
unsafe fn exec_child(
    p: &Prepared,
    no_signals: &libc::sigset_t,
    fds: [RawFd; 3],
    report: RawFd,
) -> ! {
    let fail = |report: RawFd| -> ! {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let bytes = errno.to_ne_bytes();
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    };
    if libc::sigprocmask(libc::SIG_SETMASK, no_signals, std::ptr::null_mut()) != 0 {
        fail(report);
    }
    // Rust ignores SIGPIPE; an ignored signal stays ignored across exec.
    if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
        fail(report);
    }
    if libc::setpgid(0, 0) != 0 {
        fail(report);
    }
    for (target, fd) in fds.into_iter().enumerate() {
        // dup2 onto another number clears close-on-exec on the copy.
        if libc::dup2(fd, target as RawFd) < 0 {
            fail(report);
        }
    }
    libc::execve(
        p.program.as_ptr(),
        p.argv_ptrs.as_ptr(),
        p.envp_ptrs.as_ptr(),
    );
    fail(report)
}

/// A child started by [`spawn_into`] with `claim`, waited for through its
/// pidfd. Dropped before it was waited for, it is SIGKILLed and reaped in the
/// background (like `kill_on_drop`).
#[derive(Debug)]
pub struct DirectChild {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl DirectChild {
    /// Takes over a claimed child. Needs a tokio runtime.
    pub fn new(pid: i32, pidfd: OwnedFd) -> io::Result<DirectChild> {
        Ok(DirectChild {
            pid,
            // SAFETY: the OwnedFd is a valid descriptor, closed only when
            // the AsyncFd is dropped.
            pidfd: Some(unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE)? }),
        })
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for it to end and collects its status (then unclaims it).
    pub async fn wait(&mut self) -> io::Result<Exit> {
        let Some(fd) = &self.pidfd else {
            return Err(io::Error::other("already waited for"));
        };
        let exit = reap_when_readable(self.pid, fd).await;
        self.pidfd = None;
        exit
    }
}

async fn reap_when_readable(pid: i32, fd: &AsyncFd<OwnedFd>) -> io::Result<Exit> {
    loop {
        let mut guard = fd.readable().await?;
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => guard.clear_ready(),
            Ok(status) => {
                if let Some(exit) = Exit::from_wait(status) {
                    unclaim(pid);
                    return Ok(exit);
                }
                guard.clear_ready();
            }
            Err(e) => {
                unclaim(pid);
                return Err(e.into());
            }
        }
    }
}

impl Drop for DirectChild {
    fn drop(&mut self) {
        let Some(fd) = self.pidfd.take() else { return };
        signal_pid(self.pid, Signal::SIGKILL);
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = reap_when_readable(pid, &fd).await;
                });
            }
            // No runtime to wait on: leave it to the reaper.
            Err(_) => unclaim(pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh scope under this process's cgroup, removed on drop; `None`
    /// (and a note) where no cgroup2 is writable.
    struct Scope(Cgroup);

    impl Scope {
        fn new(tag: &str) -> Option<Scope> {
            let Some(root) = CgroupRoot::detect() else {
                eprintln!("no writable cgroup2 here: nothing to spawn into");
                return None;
            };
            let name = format!("putex-spawn-test-{tag}-{}", std::process::id());
            Some(Scope(root.create(&name).unwrap()))
        }
    }

    impl Drop for Scope {
        fn drop(&mut self) {
            self.0.kill().ok();
            for _ in 0..100 {
                if self.0.remove().is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn argv(script: &str) -> Vec<OsString> {
        ["/bin/sh", "-c", script].map(OsString::from).to_vec()
    }

    async fn read_all(fd: OwnedFd) -> String {
        use tokio::io::AsyncReadExt;
        let mut r = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).unwrap();
        let mut s = String::new();
        r.read_to_string(&mut s).await.unwrap();
        s
    }

    fn unified_path(cg: &Cgroup) -> String {
        let mount = cgroup2_mount(&fs::read_to_string("/proc/self/mountinfo").unwrap()).unwrap();
        let rel = cg.path().strip_prefix(&mount).unwrap();
        format!("/{}", rel.display())
    }

    #[tokio::test]
    async fn a_spawned_process_runs_in_its_scope_with_exactly_the_given_environment() {
        let Some(scope) = Scope::new("env") else {
            return;
        };
        let env = child_environment(|k| k == "HOME", [("PUTEX_SPAWN_TEST", "yes")]);
        let script = "cat /proc/self/cgroup | grep '^0::'; \
                      echo \"var=$PUTEX_SPAWN_TEST home=${HOME-unset}\"; \
                      echo \"pgid=$(cut -d' ' -f5 /proc/$$/stat) pid=$$\"; \
                      echo \"stdin=$(cat)\"; echo oops >&2; exit 3";
        let child = spawn_into(
            &scope.0,
            &argv(script),
            &env,
            Output::Pipe,
            Output::Pipe,
            true,
        )
        .unwrap();
        let pid = child.pid;
        assert!(CLAIMED.lock().contains(&pid), "claimed before the return");
        let mut direct = DirectChild::new(child.pid, child.pidfd).unwrap();
        let (out, err, exit) = tokio::join!(
            read_all(child.stdout.unwrap()),
            read_all(child.stderr.unwrap()),
            direct.wait()
        );
        assert_eq!(
            exit.unwrap(),
            Exit {
                code: Some(3),
                signal: None
            }
        );
        assert!(!CLAIMED.lock().contains(&pid), "unclaimed once reaped");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("0::{}", unified_path(&scope.0)));
        assert_eq!(lines[1], "var=yes home=unset");
        assert_eq!(lines[2], format!("pgid={pid} pid={pid}"));
        assert_eq!(lines[3], "stdin=");
        assert_eq!(err, "oops\n");
    }

    #[tokio::test]
    async fn a_program_found_in_path_runs_and_a_missing_one_is_an_error() {
        let Some(scope) = Scope::new("path") else {
            return;
        };
        let env = child_environment(|_| false, [("PATH", "/usr/bin:/bin")]);
        let true_ = ["true"].map(OsString::from);
        let child = spawn_into(&scope.0, &true_, &env, Output::Null, Output::Null, true).unwrap();
        let exit = DirectChild::new(child.pid, child.pidfd)
            .unwrap()
            .wait()
            .await
            .unwrap();
        assert_eq!(exit.code, Some(0));

        let missing = ["putex-no-such-program"].map(OsString::from);
        match spawn_into(&scope.0, &missing, &env, Output::Null, Output::Null, true) {
            Err(SpawnError::Failed(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable");
        fs::write(&plain, "#!/bin/sh\n").unwrap();
        let plain = [plain.into_os_string()];
        match spawn_into(&scope.0, &plain, &env, Output::Null, Output::Null, true) {
            Err(SpawnError::Failed(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            scope.0.procs().unwrap().is_empty(),
            "a failed exec left a process"
        );
    }

    /// The fallback for kernels without `CLONE_INTO_CGROUP`: the process moves
    /// itself in before it `exec`s the command, under the same pid.
    #[tokio::test]
    async fn the_wrapper_moves_the_process_into_its_scope_before_the_command() {
        let Some(scope) = Scope::new("wrap") else {
            return;
        };
        let wrapped = wrap_in_cgroup(&scope.0, &argv("grep '^0::' /proc/self/cgroup; echo $$"));
        let mut cmd = tokio::process::Command::new(&wrapped[0]);
        let out = cmd
            .args(&wrapped[1..])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = out.id().unwrap();
        let out = out.wait_with_output().await.unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("0::{}\n{pid}\n", unified_path(&scope.0))
        );
    }
}
