//! The processes under test: `putex run` agents and `putex lock` clients of
//! the built binary, each with its own keeper directory and log, and the
//! signals the faults send them.
//!
//! The service is this harness's own binary in `service` mode
//! ([`crate::resource::service`]) under `env -u LD_PRELOAD …`, so a clock
//! fault given to an agent (libfaketime) does not reach its service: the
//! service only reports to the resource, whose clock is the judge.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::supervision::process::pids_matching;

/// Sends `sig` to `pid`, ignoring a process that is gone.
pub fn signal(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// The service command line: the harness binary in `service` mode, out of
/// reach of the agent's clock faults.
pub fn service_argv(me: &Path, resource: &str, run_for: Option<Duration>) -> Vec<String> {
    let mut v: Vec<String> = [
        "/usr/bin/env",
        "-u",
        "LD_PRELOAD",
        "-u",
        "FAKETIME",
        "-u",
        "FAKETIME_TIMESTAMP_FILE",
        "-u",
        "FAKETIME_NO_CACHE",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.push(me.display().to_string());
    v.extend([
        "service".into(),
        resource.into(),
        "--every".into(),
        "50ms".into(),
    ]);
    if let Some(d) = run_for {
        v.extend(["--for".into(), format!("{}ms", d.as_millis())]);
    }
    v
}

fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("PUTEX_")
            || k == "NATS_URL"
            || k.starts_with("FAKETIME")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(k);
        }
    }
}

/// How to start one agent.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The `putex` binary.
    pub putex: PathBuf,
    /// `--node`.
    pub node: String,
    /// `--lock`.
    pub lock: String,
    /// `--store`.
    pub url: String,
    /// Timing and other flags.
    pub flags: Vec<String>,
    /// Extra environment (libfaketime).
    pub env: Vec<(String, String)>,
    /// The child command.
    pub service: Vec<String>,
    /// Where its keeper directory and logs go.
    pub dir: PathBuf,
}

/// One `putex run` process.
pub struct Agent {
    /// How it was started (a restart uses the same).
    pub spec: AgentSpec,
    child: Child,
    /// Its stderr.
    pub log: PathBuf,
}

impl Agent {
    /// Starts `putex run` and waits until it has measured the store. An
    /// agent refuses to start when R is under ten times the p99 of its 100
    /// start-up compare-and-swaps; on a loaded 2-core machine one slow
    /// sample does that, so such a refusal is retried (up to 10 times),
    /// each after a pause one second longer than the last (up to 5 s), so
    /// that a slow patch of the machine can pass.
    pub fn start(spec: AgentSpec) -> Result<Agent, String> {
        let mut tries = 0;
        loop {
            let mut a = Agent::spawn(spec.clone())?;
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let log = a.log_text();
                if log.contains("store ok") {
                    return Ok(a);
                }
                if !a.alive() {
                    if log.contains("ten times the store's p99") && tries < 10 {
                        tries += 1;
                        std::thread::sleep(Duration::from_secs(tries.min(5)));
                        break;
                    }
                    return Err(format!("{} exited at start:\n{log}", spec.node));
                }
                if Instant::now() > until {
                    return Ok(a);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn spawn(spec: AgentSpec) -> Result<Agent, String> {
        let log = spec.dir.join(format!(
            "{}-{}.log",
            spec.node,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let mut cmd = Command::new(&spec.putex);
        clean_env(&mut cmd);
        cmd.args([
            "run", "--lock", &spec.lock, "--store", &spec.url, "--node", &spec.node,
        ])
        .args(&spec.flags)
        .arg("--keeper-dir")
        .arg(keeper_dir(&spec))
        .env("RUST_LOG", "info")
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .arg("--")
        .args(&spec.service)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", spec.putex.display()))?;
        Ok(Agent { spec, child, log })
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.spec.node
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }

    /// Its keeper processes (normally one).
    pub fn keepers(&self) -> Vec<i32> {
        let me = self.pid();
        pids_matching(&keeper_dir(&self.spec).display().to_string())
            .into_iter()
            .filter(|p| *p != me)
            .collect()
    }

    /// Whether the agent process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL of the agent alone; waits for it.
    pub fn kill_agent(&mut self) {
        signal(self.pid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGKILL of the agent and its keeper (the service is the caller's).
    pub fn kill_all(&mut self) {
        let keepers = self.keepers();
        self.kill_agent();
        for k in keepers {
            signal(k, Signal::SIGKILL);
        }
    }

    /// SIGTERM, then SIGKILL of whatever is left after `grace`.
    pub fn shutdown(&mut self, grace: Duration) {
        signal(self.pid(), Signal::SIGCONT);
        signal(self.pid(), Signal::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if !self.alive() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill_all();
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
}

impl Drop for Agent {
    fn drop(&mut self) {
        signal(self.pid(), Signal::SIGCONT);
        self.kill_all();
    }
}

/// The keeper directory of an agent or client.
pub fn keeper_dir(spec: &AgentSpec) -> PathBuf {
    spec.dir.join(format!("k-{}", spec.node))
}

/// A `putex lock` client: a thread that runs critical sections one after
/// another until stopped, each `putex lock NAME … -- SERVICE --for D`.
pub struct LockClient {
    /// The client's node id.
    pub node: String,
    /// Its keeper directory.
    pub keeper_dir: PathBuf,
    pid: Arc<AtomicI32>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<i32>>>,
}

impl LockClient {
    /// Starts the loop; `spec.flags` are `putex lock`'s flags and
    /// `spec.service` the command of every section.
    pub fn start(spec: AgentSpec) -> LockClient {
        let keeper = keeper_dir(&spec);
        let pid = Arc::new(AtomicI32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, k) = (pid.clone(), stop.clone(), keeper.clone());
        let node = spec.node.clone();
        let thread = std::thread::spawn(move || {
            let mut codes = Vec::new();
            let mut n = 0u32;
            while !s.load(Ordering::SeqCst) {
                n += 1;
                let log = spec.dir.join(format!("{}-{n}.log", spec.node));
                let Ok(err) = std::fs::File::create(&log) else {
                    break;
                };
                let mut cmd = Command::new(&spec.putex);
                clean_env(&mut cmd);
                cmd.args([
                    "lock", &spec.lock, "--store", &spec.url, "--node", &spec.node,
                ])
                .args(&spec.flags)
                .arg("--keeper-dir")
                .arg(&k)
                .env("RUST_LOG", "warn")
                .arg("--")
                .args(&spec.service)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(err);
                let Ok(mut child) = cmd.spawn() else {
                    break;
                };
                p.store(i32::try_from(child.id()).unwrap_or(0), Ordering::SeqCst);
                let code = child.wait().ok().and_then(|st| st.code()).unwrap_or(-1);
                p.store(0, Ordering::SeqCst);
                codes.push(code);
                std::thread::sleep(Duration::from_millis(20 + u64::from(n % 5) * 10));
            }
            codes
        });
        LockClient {
            node,
            keeper_dir: keeper,
            pid,
            stop,
            thread: Some(thread),
        }
    }

    /// The running `putex lock` process, if any.
    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Its keeper processes.
    pub fn keepers(&self) -> Vec<i32> {
        let me = self.pid();
        pids_matching(&self.keeper_dir.display().to_string())
            .into_iter()
            .filter(|p| *p != me)
            .collect()
    }

    /// Stops the loop (the running section is killed) and returns the exit
    /// codes of the sections.
    pub fn stop(&mut self) -> Vec<i32> {
        self.stop.store(true, Ordering::SeqCst);
        let keepers = self.keepers();
        let p = self.pid();
        signal(p, Signal::SIGCONT);
        signal(p, Signal::SIGKILL);
        for k in keepers {
            signal(k, Signal::SIGCONT);
            signal(k, Signal::SIGKILL);
        }
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for LockClient {
    fn drop(&mut self) {
        self.stop();
    }
}
