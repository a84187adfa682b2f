//! cgroup v2: finding the unified hierarchy, creating a scope for a
//! service's tree, and killing everything in it.

use super::*;

fn cg_err(path: &Path) -> impl FnOnce(io::Error) -> ProcessError + '_ {
    move |source| ProcessError::Cgroup {
        path: path.to_path_buf(),
        source,
    }
}

/// The cgroup2 mount point in a `/proc/self/mountinfo` text, if any.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = pre.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The unified-hierarchy path (`0::/path`) in a `/proc/<pid>/cgroup` text.
pub fn unified_cgroup_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// Where this process may create cgroup scopes: the cgroup2 directory of the
/// cgroup it runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRoot {
    dir: PathBuf,
}

impl CgroupRoot {
    /// Finds the cgroup2 mount and this process's cgroup in it. `None` when
    /// there is no cgroup2 mount, the process's cgroup cannot be read, or its
    /// directory is not writable (creating a scope is then impossible).
    pub fn detect() -> Option<CgroupRoot> {
        let mount = cgroup2_mount(&fs::read_to_string("/proc/self/mountinfo").ok()?)?;
        let own = unified_cgroup_path(&fs::read_to_string("/proc/self/cgroup").ok()?)?;
        let dir = mount.join(own.trim_start_matches('/'));
        if !dir.join("cgroup.procs").exists() {
            return None;
        }
        nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).ok()?;
        Some(CgroupRoot { dir })
    }

    /// The directory scopes are created in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the scope `name` (a fresh, empty child cgroup). A leftover
    /// empty scope of the same name is removed first.
    pub fn create(&self, name: &str) -> Result<Cgroup, ProcessError> {
        let path = self.dir.join(name);
        if path.exists() {
            // A stale, empty scope from an earlier run; a populated one is an error.
            fs::remove_dir(&path).map_err(cg_err(&path))?;
        }
        fs::create_dir(&path).map_err(cg_err(&path))?;
        Ok(Cgroup { path })
    }
}

impl CgroupRoot {
    /// Removes the scopes putex made here whose maker died before it could
    /// (an agent killed while a hook ran, a keeper killed with `kill -9`):
    /// `putex-hook-KIND-PID-N` of a hook runner and `putex-LOCK-PID` of a
    /// keeper, when process PID is gone **and** the scope is empty. A
    /// populated scope is left alone (a service a dead keeper left is the
    /// next agent's to stop, `docs/supervision.md`), and so is a scope whose
    /// PID runs (its maker, or a process that took its number: kept).
    pub fn remove_orphan_scopes(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(maker_pid) else {
                continue;
            };
            let scope = Cgroup::open(entry.path());
            if Path::new(&format!("/proc/{pid}")).exists() || scope.populated().unwrap_or(true) {
                continue;
            }
            let _ = scope.remove();
        }
    }

    /// The scope `name`, made if it does not exist yet, kept as it is if it
    /// does (populated or not): a scope shared by several owners.
    pub fn open_or_create(&self, name: &str) -> Result<Cgroup, ProcessError> {
        let path = self.dir.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(cg_err(&path)(e)),
        }
        Ok(Cgroup { path })
    }
}

/// The pid of the process that made a putex scope, from its name:
/// `putex-hook-KIND-PID-N` (a hook runner's) or `putex-LOCK-PID` (a
/// keeper's; the lock name may hold dashes, the pid is the last field).
/// `None` for any other name (`putex-hook-daemons`, someone else's scope).
fn maker_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("putex-")?;
    let field = match rest.strip_prefix("hook-") {
        Some(hook) => hook.rsplit('-').nth(1)?,
        None => rest.rsplit('-').next()?,
    };
    field.parse().ok()
}

/// A cgroup v2 scope that holds one process tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// A handle on an existing scope (e.g. one a dead keeper created).
    pub fn open(path: impl Into<PathBuf>) -> Cgroup {
        Cgroup { path: path.into() }
    }

    /// The scope's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The pids in the scope.
    pub fn procs(&self) -> Result<Vec<i32>, ProcessError> {
        let p = self.file("cgroup.procs");
        let text = fs::read_to_string(&p).map_err(cg_err(&p))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Whether any live process is in the scope (`cgroup.events`). A scope
    /// that no longer exists is empty.
    pub fn populated(&self) -> Result<bool, ProcessError> {
        let p = self.file("cgroup.events");
        match fs::read_to_string(&p) {
            Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 1")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(cg_err(&p)(e)),
        }
    }

    /// Whether the kernel offers `cgroup.kill` (Linux ≥ 5.14).
    pub fn has_kill(&self) -> bool {
        self.file("cgroup.kill").exists()
    }

    /// Sends `sig` to every process in the scope.
    pub fn signal(&self, sig: Signal) -> Result<(), ProcessError> {
        for pid in self.procs()? {
            signal_pid(pid, sig);
        }
        Ok(())
    }

    /// SIGKILLs every process in the scope, including ones forking right now:
    /// `cgroup.kill` where the kernel has it, otherwise freeze, kill each
    /// member, thaw.
    pub fn kill(&self) -> Result<(), ProcessError> {
        if !self.populated()? {
            return Ok(());
        }
        if self.has_kill() {
            let p = self.file("cgroup.kill");
            return fs::write(&p, "1").map_err(cg_err(&p));
        }
        // Killing works on frozen tasks.
        let frozen = self.freeze();
        let result = self.signal(Signal::SIGKILL);
        if frozen {
            self.thaw();
        }
        result
    }

    /// Freezes the scope (`cgroup.freeze`), so that nothing in it runs —
    /// nor forks — until [`thaw`](Self::thaw); waits up to 50 ms for the
    /// kernel to confirm (freezing is asynchronous). Whether it froze.
    pub fn freeze(&self) -> bool {
        if fs::write(self.file("cgroup.freeze"), "1").is_err() {
            return false;
        }
        for _ in 0..50 {
            let events = fs::read_to_string(self.file("cgroup.events")).unwrap_or_default();
            if events.lines().any(|l| l.trim() == "frozen 1") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Ends a [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        let _ = fs::write(self.file("cgroup.freeze"), "0");
    }

    /// Moves process `pid` into this scope (a frozen process moved out of a
    /// frozen scope runs again).
    pub fn adopt(&self, pid: i32) -> Result<(), ProcessError> {
        let p = self.file("cgroup.procs");
        fs::write(&p, pid.to_string()).map_err(cg_err(&p))
    }

    /// Removes the scope if it is empty. Removing a scope that is gone
    /// already is fine. The kernel refuses (`EBUSY`) for a moment after the
    /// last process was reaped: it tries again for up to 100 ms.
    pub fn remove(&self) -> Result<(), ProcessError> {
        let mut tries = 0;
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if e.raw_os_error() == Some(Errno::EBUSY as i32) && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(cg_err(&self.path)(e)),
            }
        }
    }
}

/// Prefixes `argv` so that the process moves itself into `cgroup` before it
/// `exec`s the real command (same pid). Exits [`CGROUP_ENTER_FAILED`] if the
/// move fails.
pub fn wrap_in_cgroup(cgroup: &Cgroup, argv: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("echo $$ >\"$0\" || exit {CGROUP_ENTER_FAILED}; exec \"$@\"").into(),
        cgroup.file("cgroup.procs").into_os_string(),
    ];
    out.extend(argv.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::maker_pid;

    #[test]
    fn a_scopes_maker_is_read_from_its_name() {
        assert_eq!(maker_pid("putex-hook-healthcheck-4242-7"), Some(4242));
        assert_eq!(maker_pid("putex-hook-follow-up-4242-7"), Some(4242));
        assert_eq!(maker_pid("putex-nightly-77"), Some(77));
        assert_eq!(maker_pid("putex-night-ly-77"), Some(77));
        assert_eq!(maker_pid("putex-hook-daemons"), None);
        assert_eq!(maker_pid("putex-nightly"), None);
        assert_eq!(maker_pid("user.slice"), None);
    }
}
