//! `putex run`, `check` and `status` end to end: real agent processes of the
//! built binary against a real nats-server (single node, fast timing R =
//! 100 ms, F = 3, C = 1), with hooks that append `start`/`stop` lines to a
//! file so that the tests can check who ran the service when.
//!
//! The tests run one at a time (a static mutex): their bounds are tens of
//! milliseconds, and two of them at once on a small machine would measure
//! each other. Every agent, keeper and service is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::core::TimingConfig;
use putex::process::proc_table;

use crate::common::nats_server::NatsServer;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const R: Duration = Duration::from_millis(100);

/// The failover bound B for the fast profile, with a generous store round
/// trip (loopback NATS answers in well under a millisecond).
fn bound() -> Duration {
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

fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn putex() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_putex"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PUTEX_") || k == "NATS_URL" {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "info");
    c
}

/// Pids of live processes whose command line contains `needle`.
fn pids_matching(needle: &str) -> Vec<i32> {
    proc_table()
        .into_iter()
        .filter(|e| !e.is_dead() && e.pid != std::process::id() as i32)
        .filter(|e| {
            std::fs::read(format!("/proc/{}/cmdline", e.pid))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .map(|e| e.pid)
        .collect()
}

/// Pids of live `sleep ARG` processes.
fn sleeps(arg: &str) -> Vec<i32> {
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

fn sigkill(pid: i32) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

/// One `putex run` process, its keeper directory and its log.
struct Agent {
    node: String,
    child: Child,
    keeper_dir: PathBuf,
    log: PathBuf,
}

impl Agent {
    fn start(dir: &Path, url: &str, lock: &str, node: &str, service: &[&str]) -> Agent {
        let keeper_dir = dir.join(format!("keeper-{node}"));
        Agent::start_in(dir, url, lock, node, service, &keeper_dir)
    }

    fn start_in(
        dir: &Path,
        url: &str,
        lock: &str,
        node: &str,
        service: &[&str],
        keeper_dir: &Path,
    ) -> Agent {
        let log = dir.join(format!("{node}-{}.log", wall_ns()));
        let child = putex()
            .args(["run", "--lock", lock, "--store", url, "--node", node])
            .args(["--renew", "100ms", "--confirm", "1"])
            // F = 3 unless the test gives its own.
            .args(if service.contains(&"--failures") {
                &[][..]
            } else {
                &["--failures", "3"][..]
            })
            .args(["--healthcheck", "true", "--stop-timeout", "2s"])
            .arg("--keeper-dir")
            .arg(keeper_dir)
            .args(service)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start putex run");
        Agent {
            node: node.into(),
            child,
            keeper_dir: keeper_dir.to_path_buf(),
            log,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn keepers(&self) -> Vec<i32> {
        pids_matching(&format!("keeper {}", self.keeper_dir.display()))
            .into_iter()
            .chain(pids_matching(&self.keeper_dir.display().to_string()))
            .filter(|p| *p != self.pid())
            .collect()
    }

    /// SIGKILL of the agent and its keeper: a host crash.
    fn crash(&mut self) {
        let keepers = self.keepers();
        sigkill(self.pid());
        for k in keepers {
            sigkill(k);
        }
        let _ = self.child.wait();
    }

    fn sigterm(&self) {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
    }

    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let keepers = self.keepers();
        sigkill(self.pid());
        let _ = self.child.wait();
        for k in keepers {
            sigkill(k);
        }
    }
}

/// Hook-mode flags that append `start NODE NS TOKEN` and
/// `stop NODE NS KIND` lines to `events`.
fn hooks(events: &Path) -> Vec<String> {
    let e = events.display();
    vec![
        "--activate".into(),
        format!("echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"),
        "--deactivate".into(),
        format!("echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct Line {
    what: String,
    node: String,
    ns: u128,
    extra: String,
}

fn events(path: &Path) -> Vec<Line> {
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
fn starts(path: &Path) -> Vec<Line> {
    events(path)
        .into_iter()
        .filter(|l| l.what == "start")
        .collect()
}

fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

fn dump(agents: &[&Agent], events_file: &Path) -> String {
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
fn assert_no_overlap(lines: &[Line], crashes: &[(String, u128)], ctx: &str) {
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

#[test]
fn agent_three_nodes_one_active_crash_failover_and_graceful_handover() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("events");
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agents: Vec<Agent> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| Agent::start(dir.path(), &server.url, "svc", n, &flags))
        .collect();

    // Steady state: exactly one active.
    assert!(
        wait_for(Duration::from_secs(10), || !starts(&ev).is_empty()),
        "nobody activated\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    std::thread::sleep(Duration::from_secs(1));
    let s = starts(&ev);
    assert_eq!(
        s.len(),
        1,
        "{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let first = s[0].node.clone();

    // `putex status -o json` sees the holder and three members.
    let out = putex()
        .args(["status", "svc", "--store", &server.url, "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["holder"], first.as_str(), "{st}");
    assert_eq!(st["state"], "active", "{st}");
    assert!(st["renewed_ago_ms"].as_u64().unwrap() < 1000, "{st}");
    assert_eq!(st["members"].as_array().unwrap().len(), 3, "{st}");
    let table = putex()
        .args(["status", "--lock", "svc", "--store", &server.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("HOLDER") && table.contains(&first),
        "{table}"
    );

    // Host crash of the active: agent and keeper SIGKILLed at once.
    let i = agents.iter().position(|a| a.node == first).unwrap();
    agents[i].crash();
    let crashed = wall_ns();
    assert!(
        wait_for(Duration::from_secs(5), || starts(&ev).len() >= 2),
        "no takeover\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let s = starts(&ev);
    let second = s[1].clone();
    assert_ne!(second.node, first);
    let took = Duration::from_nanos((second.ns - crashed.min(second.ns)) as u64);
    let earliest = R * 3 + R - R; // T + G − R
    let latest = bound() + Duration::from_millis(100);
    eprintln!("crash failover: {took:?} (earliest {earliest:?}, bound B + 100 ms = {latest:?})");
    assert!(
        second.ns >= crashed + earliest.as_nanos(),
        "activated {took:?} after the crash, before T + G − R\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert!(
        took <= latest,
        "failover took {took:?} > B + 100 ms = {latest:?}"
    );

    // SIGTERM of the new active: graceful stop, release, fast handover.
    let j = agents.iter().position(|a| a.node == second.node).unwrap();
    agents[j].sigterm();
    assert_eq!(
        agents[j].wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        agents[j].log_text()
    );
    assert!(
        wait_for(Duration::from_secs(3), || starts(&ev).len() >= 3),
        "no handover\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let all = events(&ev);
    let stop = all
        .iter()
        .find(|l| l.what == "stop" && l.node == second.node && l.extra == "graceful")
        .expect("a graceful stop line")
        .clone();
    let third = starts(&ev)[2].clone();
    assert!(third.node != second.node && third.node != first);
    let gap = Duration::from_nanos((third.ns.saturating_sub(stop.ns)) as u64);
    eprintln!("graceful handover gap: {gap:?}");
    if std::env::var_os("PUTEX_E2E_DUMP").is_some() {
        eprintln!("{}", dump(&agents.iter().collect::<Vec<_>>(), &ev));
    }
    assert!(
        third.ns >= stop.ns,
        "started before the graceful stop returned"
    );
    // S3: the next activation starts within 100 ms of the graceful stop.
    let limit = Duration::from_millis(100);
    assert!(gap <= limit, "handover took {gap:?} > {limit:?}");
    assert_no_overlap(
        &all,
        &[(first.clone(), crashed)],
        &dump(&agents.iter().collect::<Vec<_>>(), &ev),
    );

    // The transitions are logged with their reason and token.
    let log = agents[j].log_text();
    assert!(log.contains("transition confirming -> active"), "{log}");
    assert!(
        log.contains("reason=Activated") && log.contains("revision="),
        "{log}"
    );

    // The last agent stops cleanly too.
    let k = agents.iter().position(|a| a.node == third.node).unwrap();
    agents[k].sigterm();
    assert_eq!(
        agents[k].wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        agents[k].log_text()
    );
}

#[test]
fn agent_child_mode_leaves_no_process_behind() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("1000.{}", std::process::id());
    let script = format!("sleep {tag} & wait");
    let mut a = Agent::start(
        dir.path(),
        &server.url,
        "child",
        "c1",
        &["--", "/bin/sh", "-c", &script],
    );
    assert!(
        wait_for(Duration::from_secs(10), || !sleeps(&tag).is_empty()),
        "the child did not start\n{}",
        a.log_text()
    );
    a.sigterm();
    assert_eq!(
        a.wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        a.log_text()
    );
    assert!(
        wait_for(Duration::from_secs(1), || sleeps(&tag).is_empty()),
        "the child's sleep survived the stop\n{}",
        a.log_text()
    );
    assert!(a.log_text().contains("released=true"), "{}", a.log_text());
}

#[test]
fn agent_second_on_the_same_host_is_refused_by_the_lock_file() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keeper_dir = dir.path().join("keepers");
    let ev = dir.path().join("events");
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut a = Agent::start_in(dir.path(), &server.url, "dup", "h1", &flags, &keeper_dir);
    assert!(
        wait_for(Duration::from_secs(5), || a
            .log_text()
            .contains("agent starting")),
        "{}",
        a.log_text()
    );
    let mut b = Agent::start_in(dir.path(), &server.url, "dup", "h1", &flags, &keeper_dir);
    assert_eq!(
        b.wait_exit(Duration::from_secs(5)),
        Some(4),
        "{}",
        b.log_text()
    );
    assert!(
        b.log_text().contains("already runs lock \"dup\""),
        "{}",
        b.log_text()
    );
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "the first agent was disturbed"
    );
    a.sigterm();
    assert_eq!(
        a.wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        a.log_text()
    );
}

fn check(args: &[&str]) -> Output {
    putex().arg("check").args(args).output().unwrap()
}

#[test]
fn agent_check_rejects_bad_options_by_name_and_prints_the_timeline() {
    let _serial = serial();
    let server = NatsServer::start();
    let url = server.url.as_str();
    let cases: [(&[&str], &str); 3] = [
        (&["--failures", "1"], "--failures must be at least 2"),
        (
            &[
                "--renew",
                "100ms",
                "--failures",
                "3",
                "--confirm",
                "1",
                "--emergency-timeout",
                "100ms",
            ],
            "--emergency-timeout",
        ),
        (
            &["--renew", "100ms", "--healthcheck-timeout", "100ms"],
            "--healthcheck-timeout",
        ),
    ];
    for (args, expect) in cases {
        let out = check(&[&["--store", url], args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    let out = check(&[
        "--store",
        url,
        "--renew",
        "100ms",
        "--failures",
        "3",
        "--confirm",
        "1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("worst-case crash failover"), "{text}");
    assert!(text.contains("p99"), "{text}");
    // A store that does not answer: run refuses with exit code 3.
    let out = putex()
        .args([
            "run",
            "--lock",
            "x",
            "--store",
            "nats://127.0.0.1:1",
            "--healthcheck",
            "true",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn agent_restarted_after_sigkill_adopts_its_keeper_and_the_service_keeps_running() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keeper_dir = dir.path().join("keepers");
    let tag = format!("1000.{}1", std::process::id());
    let script = format!("sleep {tag} & wait");
    // T = 1 s here: the restart must renew within the keeper's deadline.
    let service = ["--failures", "10", "--", "/bin/sh", "-c", &script];
    let mut a = Agent::start_in(
        dir.path(),
        &server.url,
        "adopt",
        "r1",
        &service,
        &keeper_dir,
    );
    assert!(
        wait_for(Duration::from_secs(15), || !sleeps(&tag).is_empty()),
        "the child did not start\n{}",
        a.log_text()
    );
    // Let a renewal write the record as `active` (a `confirming` record is
    // never resumed: it still owes its gap, S5).
    std::thread::sleep(Duration::from_millis(500));
    let before = sleeps(&tag);
    // Kill the agent alone; its keeper and the service stay.
    sigkill(a.pid());
    let _ = a.child.wait();
    let mut b = Agent::start_in(
        dir.path(),
        &server.url,
        "adopt",
        "r1",
        &service,
        &keeper_dir,
    );
    assert!(
        wait_for(Duration::from_secs(5), || b
            .log_text()
            .contains("reason=Resumed")),
        "the restarted agent did not resume\n{}",
        b.log_text()
    );
    assert!(
        b.log_text().contains("adopted the running keeper"),
        "{}",
        b.log_text()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        sleeps(&tag),
        before,
        "the service was restarted\n{}",
        b.log_text()
    );
    b.sigterm();
    assert_eq!(
        b.wait_exit(Duration::from_secs(5)),
        Some(0),
        "{}",
        b.log_text()
    );
    assert!(
        wait_for(Duration::from_secs(1), || sleeps(&tag).is_empty()),
        "the service survived the stop"
    );
}

#[test]
fn agent_second_signal_makes_an_emergency_stop_and_exits() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("1000.{}2", std::process::id());
    // The service ignores SIGTERM, so the graceful stop would take the whole
    // --stop-timeout (2 s); the second signal cuts it short.
    let script = format!("trap '' TERM; sleep {tag} & wait; wait");
    let mut a = Agent::start(
        dir.path(),
        &server.url,
        "twice",
        "s1",
        &["--", "/bin/sh", "-c", &script],
    );
    assert!(
        wait_for(Duration::from_secs(10), || !sleeps(&tag).is_empty()),
        "the child did not start\n{}",
        a.log_text()
    );
    a.sigterm();
    std::thread::sleep(Duration::from_millis(100));
    let second = Instant::now();
    a.sigterm();
    assert_eq!(
        a.wait_exit(Duration::from_secs(2)),
        Some(1),
        "{}",
        a.log_text()
    );
    assert!(
        second.elapsed() < Duration::from_millis(1000),
        "{:?}",
        second.elapsed()
    );
    assert!(
        wait_for(Duration::from_secs(1), || sleeps(&tag).is_empty()),
        "the service survived the emergency stop\n{}",
        a.log_text()
    );
    assert!(a.log_text().contains("second signal"), "{}", a.log_text());
}
