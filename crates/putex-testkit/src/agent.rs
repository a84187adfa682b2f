//! `putex run` agents as processes of a given `putex` binary, for the
//! integration tests, the benchmarks and the chaos suite.
//!
//! An [`Agent`] is one `putex run` child with its keeper directory and its
//! stderr in a log file. [`Agent::start`] waits until the agent has measured
//! the store and starts it again when it refused R for a slow store (one
//! slow sample on a loaded 2-core machine does that with R = 100 ms); every
//! other exit is the caller's to see. Dropped, an agent takes its keeper and
//! every process the keeper runs with it, so a test leaves nothing behind.
//!
//! The hook helpers ([`hooks`], [`events`], [`starts`],
//! [`assert_no_overlap`]) give agents `--activate`/`--deactivate` commands
//! that append `start NODE NS TOKEN` and `stop NODE NS KIND` lines to a
//! file, and read those lines back.
//!
//! The binary is always a parameter: only the caller knows where cargo built
//! it (`env!("CARGO_BIN_EXE_putex")` in integration tests, `--putex PATH` in
//! the benchmarks and the chaos suite).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::supervision::process::pids_matching;

/// What `putex run` prints once it has measured the store and goes on.
const STORE_OK: &str = "store ok";
/// What it prints when it refuses R for the store's latency.
const SLOW_STORE: &str = "ten times the store's p99";
/// How often [`Agent::start`] starts an agent refused for a slow store again.
const SLOW_STORE_RETRIES: u32 = 10;
/// How long [`Agent::start`] waits for the store measurement.
const MEASURE_PATIENCE: Duration = Duration::from_secs(20);

/// Nanoseconds since the Unix epoch (the clock of the hook lines).
pub fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Sends `sig` to `pid`, ignoring a process that is gone.
pub fn signal(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// SIGKILL of `pid`, ignoring a process that is gone.
pub fn sigkill(pid: i32) {
    signal(pid, Signal::SIGKILL);
}

/// Kills a process whatever happens to the test (a stopped one too:
/// SIGKILL needs no SIGCONT).
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        sigkill(self.0);
    }
}

/// When `pid` started, in clock ticks after boot (`/proc/PID/stat` field
/// 22): with the pid, it names one process even after the pid is reused.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command (which may hold spaces), the state is field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Every descendant of `pid` now, found through `/proc/PID/task/*/children`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(c);
                todo.push(c);
            }
        }
    }
    found
}

/// A `Command` for the `putex` binary at `putex`, without the caller's
/// `PUTEX_*`, `NATS_URL` and clock-fault (`FAKETIME*`, `LD_PRELOAD`)
/// variables, logging at `RUST_LOG=info`.
pub fn putex_command(putex: &Path) -> Command {
    let mut cmd = Command::new(putex);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("PUTEX_")
            || k == "NATS_URL"
            || k.starts_with("FAKETIME")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(&*k);
        }
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

/// Uses `lock` once, as a lock in service has been: `putex lock LOCK --node
/// NODE -- true` on `url` (keeper directory `keeper_dir`) leaves a record
/// NODE released, so that the next holder takes it at once instead of
/// waiting out a first use (W + G' on a store that cannot prove the name
/// unused; with failsafe, W over T + the cap). A lease of 1 s and up to
/// three tries: on a loaded machine a section can lose its lock before its
/// command runs (a 300 ms lease did, beside a busy loop), which says nothing
/// about what a test or benchmark measures after it.
pub fn use_lock_once(
    putex: &Path,
    url: &str,
    lock: &str,
    node: &str,
    keeper_dir: &Path,
) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..3 {
        let out = putex_command(putex)
            .args(["lock", lock, "--ttl", "1s", "--node", node, "--store", url])
            .arg("--keeper-dir")
            .arg(keeper_dir)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", putex.display()))?;
        if out.status.success() {
            return Ok(());
        }
        last = output_text(&out);
    }
    Err(format!("putex lock {lock} on {url}, three times: {last}"))
}

/// A keeper directory for the commands a test runs without one of their
/// own (`putex lock` in a set-up, `putex id`), as `PUTEX_KEEPER_DIR`:
/// `$TMPDIR/putex-k-PID`, made on first use (short: a keeper socket's path
/// must fit in 108 bytes). Not the default (`/run/putex` for root), where
/// every test store would leave a host state file behind, hundreds a run.
pub fn scratch_keeper_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("putex-k-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the tests' keeper directory");
        dir
    })
}

/// A finished command's exit status, stdout and stderr, for a failure
/// message.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// How to start one `putex run`.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The `putex` binary.
    pub putex: PathBuf,
    /// `--store`.
    pub url: String,
    /// `--lock`.
    pub lock: String,
    /// `--node`.
    pub node: String,
    /// Everything after the lock, store, node and keeper directory: flags,
    /// then `--` and the service (or hook flags and no service).
    pub args: Vec<String>,
    /// Added to the agent's environment (libfaketime, `PUTEX_*`).
    pub env: Vec<(String, String)>,
    /// `--keeper-dir`.
    pub keeper_dir: PathBuf,
    /// Where the agent's log (`<node>-<ns>.log`) goes.
    pub log_dir: PathBuf,
    /// The pause before the n-th new start after a slow-store refusal:
    /// n × this, at most 5 × this.
    pub retry_pause: Duration,
    /// Whether dropping the agent also kills what its keeper runs (the
    /// default) or leaves the service to the caller (the chaos suite, whose
    /// judge must see a service that outlives its keeper).
    pub reap_services: bool,
    /// The user (uid, gid) the agent runs as; `None`: this process's.
    pub user: Option<(u32, u32)>,
}

impl AgentSpec {
    /// An agent of `lock` as `node` with its keeper directory
    /// (`keeper-<node>`) and log in `dir`, and no further flags.
    pub fn new(putex: &Path, url: &str, lock: &str, node: &str, dir: &Path) -> AgentSpec {
        AgentSpec {
            putex: putex.to_path_buf(),
            url: url.to_owned(),
            lock: lock.to_owned(),
            node: node.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            keeper_dir: dir.join(format!("keeper-{node}")),
            log_dir: dir.to_path_buf(),
            retry_pause: Duration::ZERO,
            reap_services: true,
            user: None,
        }
    }

    /// Appends `args` (flags, `--`, the service).
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> AgentSpec {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Adds `flag value` unless the flags (the arguments before a `--`)
    /// already give `flag`.
    pub fn default_flag(mut self, flag: &str, value: &str) -> AgentSpec {
        let given = self
            .args
            .iter()
            .take_while(|a| *a != "--")
            .any(|a| a == flag);
        if !given {
            self.args.insert(0, value.to_owned());
            self.args.insert(0, flag.to_owned());
        }
        self
    }

    /// Adds `vars` to the agent's environment.
    pub fn env<K: AsRef<str>, V: AsRef<str>>(mut self, vars: &[(K, V)]) -> AgentSpec {
        self.env.extend(
            vars.iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())),
        );
        self
    }

    /// Uses `dir` as the keeper directory.
    pub fn keeper_dir(mut self, dir: &Path) -> AgentSpec {
        self.keeper_dir = dir.to_path_buf();
        self
    }

    /// Leaves the services to the caller when the agent is dropped or
    /// crashed: only the agent and its keepers are killed.
    pub fn leave_services(mut self) -> AgentSpec {
        self.reap_services = false;
        self
    }

    /// Runs the agent (and so its keeper and hooks) as `user` (uid, gid),
    /// e.g. PostgreSQL's; `None` changes nothing.
    pub fn run_as(mut self, user: Option<(u32, u32)>) -> AgentSpec {
        self.user = user;
        self
    }

    /// Pauses `pause` × n (at most 5 × `pause`) before the n-th new start
    /// after a slow-store refusal, so that a slow patch of the machine can
    /// pass.
    pub fn retry_pause(mut self, pause: Duration) -> AgentSpec {
        self.retry_pause = pause;
        self
    }
}

/// One `putex run` process, its keeper directory and its log.
pub struct Agent {
    /// How it was started (a restart uses the same).
    pub spec: AgentSpec,
    /// The `putex run` process.
    pub child: Child,
    /// Its stderr.
    pub log: PathBuf,
    /// The services a [`Agent::crash`] left running (as a dead putex
    /// would), with their start times, killed when the agent is dropped
    /// (if still the same processes).
    left: Vec<(i32, u64)>,
}

/// How long [`spawn_past_busy_text`] tries again.
const BUSY_TEXT_PATIENCE: Duration = Duration::from_secs(2);

/// `cmd.spawn()`, made again while the program is "Text file busy"
/// (`ETXTBSY`). A program copied moments ago (`PgCluster::runnable`: the
/// built `putex` where the cluster's user can run it) may still be open
/// for writing in a child that another test thread forked while the copy
/// was written: the descriptor closes only at that child's `exec`,
/// microseconds later, but an `exec` of the copy meanwhile fails.
fn spawn_past_busy_text(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let until = Instant::now() + BUSY_TEXT_PATIENCE;
    loop {
        match cmd.spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy && Instant::now() < until =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

impl Agent {
    /// Starts `putex run` and does not wait.
    pub fn spawn(spec: AgentSpec) -> std::io::Result<Agent> {
        let log = spec
            .log_dir
            .join(format!("{}-{}.log", spec.node, wall_ns()));
        let mut cmd = putex_command(&spec.putex);
        if let Some((uid, gid)) = spec.user {
            use std::os::unix::process::CommandExt;
            // From its log directory: this process's may be one that user
            // cannot enter (a checkout in a 0700 home).
            cmd.uid(uid).gid(gid).current_dir(&spec.log_dir);
        }
        cmd.args(["run", "--lock", &spec.lock, "--store", &spec.url])
            .args(["--node", &spec.node])
            .arg("--keeper-dir")
            .arg(&spec.keeper_dir)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let child = spawn_past_busy_text(&mut cmd)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", spec.putex.display())))?;
        Ok(Agent {
            spec,
            child,
            log,
            left: Vec::new(),
        })
    }

    /// Starts `putex run` and waits (up to 20 s) until it has measured the
    /// store. `putex run` refuses R below ten times the p99 of its start-up
    /// compare-and-swaps; on a loaded machine one slow sample does that with
    /// R = 100 ms, so such a refusal is started again, up to 10 times, after
    /// [`AgentSpec::retry_pause`]. Any other exit is returned for the caller
    /// to see ([`Agent::alive`], [`Agent::log_text`]).
    pub fn start(spec: AgentSpec) -> std::io::Result<Agent> {
        let mut tries = 0;
        loop {
            let mut agent = Agent::spawn(spec.clone())?;
            if agent.refused_for_a_slow_store() && tries < SLOW_STORE_RETRIES {
                tries += 1;
                std::thread::sleep(spec.retry_pause * tries.min(5));
                continue;
            }
            return Ok(agent);
        }
    }

    /// Waits (up to 20 s) until the agent has measured the store: true when
    /// it exited refusing R for the store's latency.
    fn refused_for_a_slow_store(&mut self) -> bool {
        let until = Instant::now() + MEASURE_PATIENCE;
        while Instant::now() < until {
            if self.log_text().contains(STORE_OK) {
                return false;
            }
            if !self.alive() {
                return self.log_text().contains(SLOW_STORE);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.spec.node
    }

    /// The keeper directory.
    pub fn keeper_dir(&self) -> &Path {
        &self.spec.keeper_dir
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }

    /// Its keeper processes (normally one): those whose command line names
    /// its keeper directory.
    pub fn keepers(&self) -> Vec<i32> {
        let me = self.pid();
        pids_matching(&self.spec.keeper_dir.display().to_string())
            .into_iter()
            .filter(|p| *p != me)
            .collect()
    }

    /// Whether the agent process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL of the agent alone (its keeper lives on); waits for it.
    pub fn kill_agent(&mut self) {
        sigkill(self.pid());
        let _ = self.child.wait();
    }

    /// SIGKILL of the agent and its keepers, as a host crash does; returns
    /// the time of the first kill ([`wall_ns`]). The service lives on, as
    /// after putex itself died; it is killed when the agent is dropped
    /// (unless the spec leaves services to the caller).
    pub fn crash(&mut self) -> u128 {
        let keepers = self.keepers();
        if self.spec.reap_services {
            self.left.extend(
                keepers
                    .iter()
                    .flat_map(|k| descendants(*k))
                    .filter_map(|p| Some((p, start_time(p)?))),
            );
        }
        let at = wall_ns();
        sigkill(self.pid());
        for k in keepers {
            sigkill(k);
        }
        let _ = self.child.wait();
        at
    }

    /// SIGTERM.
    pub fn sigterm(&self) {
        signal(self.pid(), Signal::SIGTERM);
    }

    /// SIGTERM, then the agent must exit 0 within 5 s (a graceful stop and
    /// release, H6); panics with its log if it does not.
    pub fn stop_cleanly(&mut self) {
        self.sigterm();
        let code = self.wait_exit(Duration::from_secs(5));
        assert_eq!(code, Some(0), "{}", self.log_text());
    }

    /// Waits up to `within` for the agent to exit: its exit code, or `None`
    /// if it still runs (or died of a signal).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGCONT and SIGTERM, then [`Agent::crash`] whatever is left after
    /// `grace`.
    pub fn shutdown(&mut self, grace: Duration) {
        signal(self.pid(), Signal::SIGCONT);
        self.sigterm();
        self.wait_exit(grace);
        self.crash();
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the agent has come up (its first role after starting).
    pub fn up(&self) -> bool {
        let l = self.log_text();
        l.contains("-> standby") || l.contains("-> active") || l.contains("-> confirming")
    }

    /// Why an agent that exited did: its `putex: …` error line, else the
    /// end of its log.
    pub fn refusal(&self) -> String {
        let log = self.log_text();
        log.lines()
            .find(|l| l.starts_with("putex:"))
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                tail.join(" / ")
            })
    }
}

impl Drop for Agent {
    /// Kills the agent, its keepers and everything they run: nothing is
    /// left behind (killed, a keeper's children would go to init). With
    /// [`AgentSpec::leave_services`], only the agent and its keepers.
    fn drop(&mut self) {
        signal(self.pid(), Signal::SIGCONT);
        let keepers = self.keepers();
        let services: Vec<i32> = if self.spec.reap_services {
            keepers.iter().flat_map(|k| descendants(*k)).collect()
        } else {
            Vec::new()
        };
        self.kill_agent();
        for pid in keepers.into_iter().chain(services) {
            sigkill(pid);
        }
        // A pid noted at a crash may have been reused since: kill only the
        // process that was there.
        for (pid, started) in self.left.drain(..) {
            if start_time(pid) == Some(started) {
                sigkill(pid);
            }
        }
    }
}

/// Hook-mode flags that append `start NODE NS TOKEN` and `stop NODE NS KIND`
/// lines to `events`.
pub fn hooks(events: &Path) -> Vec<String> {
    let e = events.display();
    vec![
        "--activate".into(),
        format!("echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"),
        "--deactivate".into(),
        format!("echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
    ]
}

/// One line the [`hooks`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// `start` or `stop`.
    pub what: String,
    /// The agent's node id.
    pub node: String,
    /// When, in nanoseconds since the epoch.
    pub ns: u128,
    /// The token of a start, the kind of a stop (`startup` for a start-up
    /// stop).
    pub extra: String,
}

/// The lines in `path` (none if it does not exist yet).
pub fn events(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some(Line {
                what: it.next()?.into(),
                node: it.next()?.into(),
                ns: it.next()?.parse().ok()?,
                extra: it.next().unwrap_or("").into(),
            })
        })
        .collect()
}

/// The service starts in `path`.
pub fn starts(path: &Path) -> Vec<Line> {
    events(path)
        .into_iter()
        .filter(|l| l.what == "start")
        .collect()
}

/// Polls `f` every 2 ms until it holds or `within` has passed; its last
/// answer.
pub fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

/// Checks that no two services ran at once: every start comes after the
/// previous holder's stop (other than a start-up stop) or crash (`crashes`:
/// node and time).
pub fn assert_no_overlap(lines: &[Line], crashes: &[(String, u128)], ctx: &str) {
    let mut running: Option<(String, u128)> = None;
    let mut timeline: Vec<Line> = lines.to_vec();
    timeline.extend(crashes.iter().map(|(node, ns)| Line {
        what: "crash".into(),
        node: node.clone(),
        ns: *ns,
        extra: String::new(),
    }));
    timeline.sort_by_key(|l| l.ns);
    for l in &timeline {
        match l.what.as_str() {
            "start" => {
                assert!(
                    running.is_none(),
                    "{} started while {:?} ran\n{ctx}",
                    l.node,
                    running
                );
                running = Some((l.node.clone(), l.ns));
            }
            "stop" | "crash"
                if l.extra != "startup" && running.as_ref().is_some_and(|(n, _)| *n == l.node) =>
            {
                running = None;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_time_names_one_process() {
        let me = i32::try_from(std::process::id()).unwrap();
        let t = start_time(me).expect("this process has a start time");
        assert_eq!(start_time(me), Some(t));
        let mut child = Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let _ = child.wait();
        assert_eq!(start_time(pid), None, "a reaped child has no start time");
    }
}
