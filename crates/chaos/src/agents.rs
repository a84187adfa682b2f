//! The processes under test: `putex run` agents (the test kit's [`Agent`])
//! and `putex lock` clients of the built binary, each with its own keeper
//! directory and log, and the signals the faults send them.
//!
//! The service is this harness's own binary in `service` mode
//! ([`crate::resource::service`]) under `env -u LD_PRELOAD …`, so a clock
//! fault given to an agent (libfaketime) does not reach its service: the
//! service only reports to the resource, whose clock is the judge.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use putex::supervision::process::pids_matching;
pub use putex_testkit::agent::{putex_command, signal, Agent, AgentSpec};

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

/// How to start one agent or `putex lock` client.
#[derive(Clone, Debug)]
pub struct Spec {
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

impl Spec {
    /// The keeper directory of the agent or client.
    pub fn keeper_dir(&self) -> PathBuf {
        self.dir.join(format!("k-{}", self.node))
    }

    /// The agent this describes: `putex run` with the flags, `--` and the
    /// service; a start refused for a slow store is tried again after a
    /// pause one second longer each time (up to 5 s), so that a slow patch
    /// of the machine can pass. The services are the scenario's: killing
    /// an agent leaves them to the resource, which judges them.
    pub fn agent(&self) -> AgentSpec {
        AgentSpec::new(&self.putex, &self.url, &self.lock, &self.node, &self.dir)
            .keeper_dir(&self.keeper_dir())
            .args(&self.flags)
            .args(&["--"])
            .args(&self.service)
            .env(&self.env)
            .retry_pause(Duration::from_secs(1))
            .leave_services()
    }
}

/// Starts an agent and waits until it has measured the store (see
/// [`Agent::start`]); an agent that exits before it has is an error (one
/// that exits later is the scenario's to see).
pub fn start_agent(spec: AgentSpec) -> Result<Agent, String> {
    let mut a = Agent::start(spec).map_err(|e| format!("cannot start putex run: {e}"))?;
    if !a.alive() && !a.log_text().contains("store ok") {
        return Err(format!("{} exited at start:\n{}", a.node(), a.log_text()));
    }
    Ok(a)
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
    pub fn start(spec: Spec) -> LockClient {
        let keeper = spec.keeper_dir();
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
                let mut cmd = putex_command(&spec.putex);
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
