//! Helpers for the end-to-end tests of `putex run` (`agent_e2e`,
//! `agent_faults`): agent processes of the built binary, hooks that append
//! `start`/`stop` lines to a file, and checks over those lines.
//!
//! The tests that use them run one at a time ([`serial`]): their bounds are
//! tens of milliseconds, and two of them at once on a small machine would
//! measure each other. Every agent, keeper and service is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::core::TimingConfig;
pub use putex::supervision::process::pids_matching;
use putex::supervision::process::proc_table;

pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub const R: Duration = Duration::from_millis(100);

/// The failover bound B for the fast profile, with a generous store round
/// trip (loopback NATS answers in well under a millisecond).
pub fn bound() -> Duration {
    TimingConfig {
        renew: R,
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap()
    .timeline(Duration::from_millis(2))
    .crash_failover
}

pub fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

pub fn putex() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_putex"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PUTEX_") || k == "NATS_URL" {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "info");
    c
}

/// `putex status LOCK -o json` against `url`; the command must succeed.
pub fn status_json(url: &str, lock: &str) -> serde_json::Value {
    let out = putex()
        .args(["status", lock, "--store", url, "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Pids of live `sleep ARG` processes.
pub fn sleeps(arg: &str) -> Vec<i32> {
    proc_table()
        .into_iter()
        .filter(|e| !e.is_dead())
        .filter(|e| {
            let Ok(cmd) = std::fs::read(format!("/proc/{}/cmdline", e.pid)) else {
                return false;
            };
            let parts: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            parts.len() >= 2 && parts[0].ends_with(b"sleep") && parts[1] == arg.as_bytes()
        })
        .map(|e| e.pid)
        .collect()
}

pub fn sigkill(pid: i32) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

/// Kills a process the test started, whatever happens to the test (a
/// stopped one too: SIGKILL needs no SIGCONT).
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        sigkill(self.0);
    }
}

/// One `putex run` process, its keeper directory and its log.
pub struct Agent {
    pub node: String,
    pub child: Child,
    pub keeper_dir: PathBuf,
    pub log: PathBuf,
    /// The services a [`Agent::crash`] left running (as a dead putex
    /// would), killed when the agent is dropped.
    left: Vec<i32>,
}

impl Agent {
    pub fn start(dir: &Path, url: &str, lock: &str, node: &str, service: &[&str]) -> Agent {
        let keeper_dir = dir.join(format!("keeper-{node}"));
        Agent::start_in(dir, url, lock, node, service, &keeper_dir)
    }

    pub fn start_in(
        dir: &Path,
        url: &str,
        lock: &str,
        node: &str,
        service: &[&str],
        keeper_dir: &Path,
    ) -> Agent {
        Agent::start_with(dir, url, lock, node, service, keeper_dir, &[])
    }

    /// Starts `putex run` with the fast profile (R = 100 ms, F = 3, C = 1),
    /// `--healthcheck true` and `--stop-timeout 2s`, each unless `service`
    /// gives its own (before a `--`), and `env` added to its environment.
    pub fn start_with(
        dir: &Path,
        url: &str,
        lock: &str,
        node: &str,
        service: &[&str],
        keeper_dir: &Path,
        env: &[(&str, &str)],
    ) -> Agent {
        let flags = service
            .iter()
            .position(|a| *a == "--")
            .map_or(service, |i| &service[..i]);
        let mut tries = 0;
        loop {
            let log = dir.join(format!("{node}-{}.log", wall_ns()));
            let mut cmd = putex();
            cmd.args(["run", "--lock", lock, "--store", url, "--node", node]);
            for (flag, value) in [
                ("--renew", "100ms"),
                ("--confirm", "1"),
                ("--failures", "3"),
                ("--healthcheck", "true"),
                ("--stop-timeout", "2s"),
            ] {
                if !flags.contains(&flag) {
                    cmd.args([flag, value]);
                }
            }
            let child = cmd
                .arg("--keeper-dir")
                .arg(keeper_dir)
                .args(service)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start putex run");
            let mut agent = Agent {
                node: node.into(),
                child,
                keeper_dir: keeper_dir.to_path_buf(),
                log,
                left: Vec::new(),
            };
            // `putex run` refuses R below ten times the p99 of its start-up
            // compare-and-swaps; on a loaded machine one slow sample does
            // that with R = 100 ms. Such a refusal is tried again (up to 10
            // times); anything else is the test's to see.
            if agent.refused_for_a_slow_store() && tries < 10 {
                tries += 1;
                continue;
            }
            return agent;
        }
    }

    /// Waits (up to 20 s) until the agent has measured the store: true
    /// when it exited refusing R for the store's latency.
    fn refused_for_a_slow_store(&mut self) -> bool {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            let log = self.log_text();
            if log.contains("store ok") {
                return false;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.log_text().contains("ten times the store's p99");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn keepers(&self) -> Vec<i32> {
        pids_matching(&format!("keeper {}", self.keeper_dir.display()))
            .into_iter()
            .chain(pids_matching(&self.keeper_dir.display().to_string()))
            .filter(|p| *p != self.pid())
            .collect()
    }

    /// SIGKILL of the agent and its keeper (the service lives on, as after
    /// putex itself died; it is killed when the agent is dropped).
    pub fn crash(&mut self) {
        let keepers = self.keepers();
        self.left
            .extend(keepers.iter().flat_map(|k| descendants(*k)));
        sigkill(self.pid());
        for k in keepers {
            sigkill(k);
        }
        let _ = self.child.wait();
    }

    /// SIGTERM, then the agent must exit 0 within 5 s (graceful stop and
    /// release, H6).
    pub fn stop_cleanly(&mut self) {
        self.sigterm();
        assert_eq!(
            self.wait_exit(Duration::from_secs(5)),
            Some(0),
            "{}",
            self.log_text()
        );
    }

    pub fn sigterm(&self) {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    /// Kills the agent, its keepers and everything they run: a test leaves
    /// no service behind (killed, a keeper's children would go to init).
    fn drop(&mut self) {
        let keepers = self.keepers();
        let services: Vec<i32> = keepers.iter().flat_map(|k| descendants(*k)).collect();
        sigkill(self.pid());
        let _ = self.child.wait();
        for pid in keepers
            .into_iter()
            .chain(services)
            .chain(self.left.drain(..))
        {
            sigkill(pid);
        }
    }
}

/// Every descendant of `pid` now (children first found through
/// `/proc/PID/task/*/children`).
fn descendants(pid: i32) -> Vec<i32> {
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

/// Hook-mode flags that append `start NODE NS TOKEN` and
/// `stop NODE NS KIND` lines to `events`.
pub fn hooks(events: &Path) -> Vec<String> {
    let e = events.display();
    vec![
        "--activate".into(),
        format!("echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"),
        "--deactivate".into(),
        format!("echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
    ]
}

#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub what: String,
    pub node: String,
    pub ns: u128,
    pub extra: String,
}

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

/// Service starts, and stops other than the start-up ones.
pub fn starts(path: &Path) -> Vec<Line> {
    events(path)
        .into_iter()
        .filter(|l| l.what == "start")
        .collect()
}

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

pub fn dump(agents: &[&Agent], events_file: &Path) -> String {
    let mut s = format!(
        "events:\n{}\n",
        std::fs::read_to_string(events_file).unwrap_or_default()
    );
    for a in agents {
        s.push_str(&format!("--- {} log:\n{}\n", a.node, a.log_text()));
    }
    s
}

/// Checks that no two services ran at once: every start comes after the
/// previous holder's stop (or crash).
pub fn assert_no_overlap(lines: &[Line], crashes: &[(String, u128)], ctx: &str) {
    let mut running: Option<(String, u128)> = None;
    let mut timeline: Vec<Line> = lines.to_vec();
    for (node, ns) in crashes {
        timeline.push(Line {
            what: "crash".into(),
            node: node.clone(),
            ns: *ns,
            extra: String::new(),
        });
    }
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
