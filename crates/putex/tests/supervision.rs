//! Supervision with real processes: the keeper's deadline, process-tree
//! stops (cgroup scope and subreaper fallback), adoption, and hooks.
//!
//! Every test runs in bounded time (deadlines of a few hundred ms) and
//! cleans up its keeper and processes even when it fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::clock::boot_time_now;
use putex::core::agent::StopKind;
use putex::core::{Instant, Token};
use putex::store::{Name, NodeId};
use putex::supervision::hooks::{Hook, HookEnv, HookKind, HookRunner, HookStatus};
use putex::supervision::keeper::{
    socket_path, KeeperClient, KeeperConfig, KeeperError, KeeperEvent,
};
use putex::supervision::process::{proc_table, CgroupRoot, TreeInfo};
use putex_testkit::timing::timing_slot;

use crate::common::agent::sleeps;

/// A hook's environment where it does not matter.
fn hook_env() -> HookEnv {
    HookEnv::new(Name::new("pg").unwrap(), NodeId::new("n1").unwrap())
}

fn config(dir: &Path, lock: &str, cgroup: bool) -> KeeperConfig {
    KeeperConfig {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_putex")),
        socket: socket_path(dir, "test-store", lock),
        lock: Name::new(lock).unwrap(),
        node: NodeId::new("n1").unwrap(),
        deactivate: None,
        kv_socket: None,
        stop_timeout: Duration::from_millis(300),
        emergency_timeout: Duration::from_millis(200),
        cgroup,
        quiet: false,
        child_stdout: false,
    }
}

/// A shell that starts a plain, a `setsid` and a double-forked sleep, each
/// ignoring SIGTERM when `stubborn`, and waits.
fn tree_script(tag: &str, stubborn: bool) -> (Vec<String>, [String; 3]) {
    let args = [
        format!("1000.{tag}1"),
        format!("1000.{tag}2"),
        format!("1000.{tag}3"),
    ];
    let trap = if stubborn { "trap '' TERM; " } else { "" };
    let script = format!(
        "{trap}sleep {} & setsid sleep {} & (sleep {} &) ; wait",
        args[0], args[1], args[2]
    );
    (vec!["/bin/sh".into(), "-c".into(), script], args)
}

async fn wait_for(mut cond: impl FnMut() -> bool, within: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

fn all_gone(args: &[String]) -> bool {
    args.iter().all(|a| sleeps(a).is_empty())
}

fn all_running(args: &[String]) -> bool {
    args.iter().all(|a| sleeps(a).len() == 1)
}

/// Kills what a test left behind: the keeper, the sleeps, the scope.
struct Cleanup {
    keeper: Option<i32>,
    sleeps: Vec<String>,
    scope: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(pid) = self.keeper {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for a in &self.sleeps {
            for pid in sleeps(a) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if let Some(s) = &self.scope {
            std::thread::sleep(Duration::from_millis(20));
            let _ = std::fs::remove_dir(s);
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn start(
    dir: &Path,
    lock: &str,
    cgroup: bool,
    tag: &str,
    stubborn: bool,
) -> (KeeperClient, Cleanup, [String; 3]) {
    let (client, adopted) = KeeperClient::spawn_or_adopt(&config(dir, lock, cgroup))
        .await
        .unwrap();
    assert!(!adopted);
    let st = client.status().await.unwrap();
    let (argv, args) = tree_script(tag, stubborn);
    let mut cleanup = Cleanup {
        keeper: Some(st.pid),
        sleeps: args.to_vec(),
        scope: None,
    };
    let (_pid, tree) = client.spawn_child(argv, vec![]).await.unwrap();
    if let TreeInfo::Cgroup(p) = &tree {
        cleanup.scope = Some(p.clone());
    }
    if !cgroup {
        assert!(
            matches!(tree, TreeInfo::ProcessGroup(_)),
            "subreaper forced: {tree:?}"
        );
    } else if CgroupRoot::detect().is_some() {
        assert!(
            matches!(tree, TreeInfo::Cgroup(_)),
            "cgroup available but not used: {tree:?}"
        );
    } else {
        eprintln!("no usable cgroup2 here: testing the subreaper fallback instead");
    }
    assert!(
        wait_for(|| all_running(&args), Duration::from_secs(5)).await,
        "tree did not start"
    );
    (client, cleanup, args)
}

/// The keeper's next event other than a tree snapshot.
async fn next_event(c: &mut KeeperClient) -> KeeperEvent {
    loop {
        match c.next_event().await {
            KeeperEvent::Tree(_) => continue,
            ev => return ev,
        }
    }
}

/// How many times a bound of tens of milliseconds is measured before it
/// counts as missed: every attempt must stop the whole tree, in time by the
/// rules (never before the deadline, never before SIGTERM's half of the
/// timeout), and one of them within the bound. A machine busy with other
/// tests delays a keeper by hundreds of milliseconds now and then (seen:
/// 472 ms and 834 ms on 2 cores, and 907, 794 and 254 ms in a row while a
/// build ran beside the suite); a keeper that waits too long delays it
/// every time.
const ATTEMPTS: u32 = 5;

/// The pause between attempts: a burst of load beside the test passes.
const BETWEEN_ATTEMPTS: Duration = Duration::from_millis(500);

/// Runs `attempt` (which checks everything but the bound, and returns the
/// time it measured) until one comes in under `bound`, at most
/// [`ATTEMPTS`] times; panics with every measurement if none did.
async fn one_within<F: std::future::Future<Output = Duration>>(
    bound: Duration,
    what: &str,
    mut attempt: impl FnMut() -> F,
) {
    let mut measured = Vec::new();
    for _ in 0..ATTEMPTS {
        let took = attempt().await;
        if took < bound {
            return;
        }
        measured.push(took);
        tokio::time::sleep(BETWEEN_ATTEMPTS).await;
    }
    panic!("{what} over {bound:?} in every attempt: {measured:?}");
}

async fn fires_at_deadline(cgroup: bool, tag: &str, drop_agent: bool) {
    // Bounds of tens of milliseconds: a turn among the timing-sensitive tests.
    let _slot = timing_slot();
    // The tree ignores SIGTERM: the kill comes after emergency_timeout/2 = 100 ms.
    one_within(
        Duration::from_millis(100 + 150),
        "emergency stop after the deadline",
        || fire_once(cgroup, tag, drop_agent),
    )
    .await;
}

/// One keeper firing at its deadline over a TERM-ignoring tree: how long
/// after the deadline the tree was gone.
async fn fire_once(cgroup: bool, tag: &str, drop_agent: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (mut client, _cleanup, args) =
        start(dir.path(), &format!("fire{tag}"), cgroup, tag, true).await;
    let deadline = boot_time_now() + Duration::from_millis(300);
    client
        .arm(deadline, Some(Token::new(1, 2)), None)
        .await
        .unwrap();
    let mut client = if drop_agent {
        drop(client); // the agent is killed: its connection closes
        None
    } else {
        // The agent is frozen: its connection stays open, nothing is sent.
        Some(&mut client)
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(all_running(&args), "stopped before the deadline");
    assert!(
        wait_for(|| all_gone(&args), Duration::from_secs(3)).await,
        "tree survived the deadline"
    );
    let late = boot_time_now().saturating_since(deadline);
    eprintln!(
        "cgroup={cgroup} drop_agent={drop_agent}: tree gone {:.1} ms after the deadline",
        ms(late)
    );
    if let Some(c) = client.as_mut() {
        let ev = tokio::time::timeout(Duration::from_secs(2), next_event(c))
            .await
            .unwrap();
        assert!(
            matches!(
                ev,
                KeeperEvent::Fired { ok: true } | KeeperEvent::ChildExited(_)
            ),
            "{ev:?}"
        );
        let st = c.status().await.unwrap();
        assert!(st.fired);
        assert_eq!(
            c.extend(boot_time_now() + Duration::from_secs(1))
                .await
                .unwrap_err()
                .to_string(),
            "keeper refused: fired"
        );
    }
    late
}

#[tokio::test]
async fn supervision_keeper_fires_at_deadline_after_agent_killed_cgroup() {
    fires_at_deadline(true, "11", true).await;
}

#[tokio::test]
async fn supervision_keeper_fires_at_deadline_while_agent_frozen_cgroup() {
    fires_at_deadline(true, "12", false).await;
}

#[tokio::test]
async fn supervision_keeper_fires_at_deadline_after_agent_killed_subreaper() {
    fires_at_deadline(false, "13", true).await;
}

/// Not a test on its own: the stand-in agent process of
/// `supervision_keeper_fires_while_agent_process_sigstopped`, which runs this
/// test binary again with `PUTEX_TEST_AGENT_SOCKET` set.
#[tokio::test]
async fn supervision_agent_stand_in() {
    let Ok(socket) = std::env::var("PUTEX_TEST_AGENT_SOCKET") else {
        return;
    };
    let deadline: u64 = std::env::var("PUTEX_TEST_AGENT_DEADLINE")
        .unwrap()
        .parse()
        .unwrap();
    let client = KeeperClient::adopt(Path::new(&socket))
        .await
        .unwrap()
        .unwrap();
    client
        .arm(Instant::from_nanos(deadline), None, None)
        .await
        .unwrap();
    println!("armed");
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A real agent process, frozen with SIGSTOP while it holds the keeper's
/// connection: the keeper fires at the deadline regardless.
#[tokio::test]
async fn supervision_keeper_fires_while_agent_process_sigstopped() {
    use tokio::io::AsyncBufReadExt;
    // Bounds of tens of milliseconds: a turn among the timing-sensitive tests.
    let _slot = timing_slot();
    let dir = tempfile::tempdir().unwrap();
    let (client, _cleanup, args) = start(dir.path(), "sigstop", true, "14", false).await;
    drop(client);
    let deadline = boot_time_now() + Duration::from_millis(400);
    let mut agent = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "supervision::supervision_agent_stand_in",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "PUTEX_TEST_AGENT_SOCKET",
            config(dir.path(), "sigstop", true).socket,
        )
        .env("PUTEX_TEST_AGENT_DEADLINE", deadline.as_nanos().to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(agent.stdout.take().unwrap()).lines();
    let armed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.trim().ends_with("armed") {
                return true;
            }
        }
        false
    });
    assert!(
        armed.await.unwrap(),
        "the stand-in agent did not arm the keeper"
    );
    let agent_pid = Pid::from_raw(agent.id().unwrap() as i32);
    kill(agent_pid, Signal::SIGSTOP).unwrap();
    assert!(all_running(&args));
    assert!(
        wait_for(|| all_gone(&args), Duration::from_secs(3)).await,
        "tree survived the deadline"
    );
    let late = boot_time_now().saturating_since(deadline);
    eprintln!(
        "agent SIGSTOPped: tree (TERM-able) gone {:.1} ms after the deadline",
        ms(late)
    );
    assert!(late < Duration::from_millis(100), "{late:?}");
    let _ = kill(agent_pid, Signal::SIGKILL);
    let _ = agent.wait().await;
}

#[tokio::test]
async fn supervision_late_extension_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _adopted) = KeeperClient::spawn_or_adopt(&config(dir.path(), "late", true))
        .await
        .unwrap();
    let _cleanup = Cleanup {
        keeper: Some(client.status().await.unwrap().pid),
        sleeps: vec![],
        scope: None,
    };
    assert!(
        matches!(client.extend(boot_time_now()).await, Err(KeeperError::Refused(r)) if r == "not armed")
    );
    let d = boot_time_now() + Duration::from_millis(50);
    client.arm(d, None, None).await.unwrap();
    client.extend(d + Duration::from_millis(20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let r = client
        .extend(boot_time_now() + Duration::from_secs(10))
        .await;
    assert!(matches!(r, Err(KeeperError::Refused(_))), "{r:?}");
    // A new tenure needs a new arm.
    client
        .arm(boot_time_now() + Duration::from_secs(5), None, None)
        .await
        .unwrap();
    client.disarm().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn supervision_keeper_killed_is_noticed_at_once() {
    // Bounds of tens of milliseconds: a turn among the timing-sensitive tests.
    let _slot = timing_slot();
    let dir = tempfile::tempdir().unwrap();
    let (mut client, _cleanup, args) = start(dir.path(), "lost", true, "21", false).await;
    let pid = client.status().await.unwrap().pid;
    client
        .arm(boot_time_now() + Duration::from_secs(30), None, None)
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(1), next_event(&mut client))
        .await
        .unwrap();
    let noticed = t0.elapsed();
    eprintln!("keeper death noticed after {:.2} ms", ms(noticed));
    assert_eq!(ev, KeeperEvent::Lost);
    assert!(noticed < Duration::from_millis(100));
    assert!(matches!(
        client.extend(boot_time_now()).await,
        Err(KeeperError::Lost)
    ));
    // The agent's own emergency stop.
    assert!(all_running(&args));
    assert!(
        client
            .stop_tree_without_keeper(Duration::from_millis(500))
            .await
    );
    assert!(all_gone(&args));
}

/// The subreaper fallback (no cgroup) loses its view of the tree with the
/// keeper: orphans re-parent to init. The agent finds the tree with the
/// keeper's last snapshot: a daemon that left its session and process group
/// and was re-parented (`(setsid sleep &)`), a plain child, and a process
/// started after the snapshot inside the child's group.
#[tokio::test]
async fn supervision_keeper_killed_without_cgroup_the_agent_still_kills_the_whole_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _adopted) = KeeperClient::spawn_or_adopt(&config(dir.path(), "orphans", false))
        .await
        .unwrap();
    let mut client = client;
    let keeper = client.status().await.unwrap().pid;
    let args = [
        "1000.311".to_string(),
        "1000.312".to_string(),
        "1000.313".to_string(),
    ];
    let script = format!(
        "sleep {} & (setsid sleep {} &) ; sleep 1; sleep {} & wait",
        args[0], args[1], args[2]
    );
    let _cleanup = Cleanup {
        keeper: Some(keeper),
        sleeps: args.to_vec(),
        scope: None,
    };
    let (child, tree) = client
        .spawn_child(vec!["/bin/sh".into(), "-c".into(), script], vec![])
        .await
        .unwrap();
    assert_eq!(tree, TreeInfo::ProcessGroup(child), "the child's own group");
    client
        .arm(boot_time_now() + Duration::from_secs(30), None, None)
        .await
        .unwrap();
    // The daemon is in the snapshot once the keeper has looked (≤ 500 ms).
    let daemon = {
        let mut pid = None;
        for _ in 0..300 {
            pid = sleeps(&args[1]).first().copied();
            if pid.is_some_and(|p| {
                client
                    .snapshot()
                    .is_some_and(|s| s.members.iter().any(|m| m.pid == p))
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pid.expect("the daemon runs")
    };
    let daemon_entry = proc_table().into_iter().find(|e| e.pid == daemon).unwrap();
    assert_eq!(daemon_entry.session, daemon, "it left the keeper's session");
    // Killed: the OOM killer's way.
    kill(Pid::from_raw(keeper), Signal::SIGKILL).unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(1), next_event(&mut client))
        .await
        .unwrap();
    assert_eq!(ev, KeeperEvent::Lost);
    // The third sleep starts after the snapshot (the script sleeps 1 s
    // first), inside the child's process group: still found.
    assert!(
        wait_for(|| all_running(&args), Duration::from_secs(3)).await,
        "the tree lives on without its keeper"
    );
    // The socket closes before the kernel re-parents the keeper's children
    // (files are closed before exit_notify), so wait for the re-parenting.
    assert!(
        wait_for(
            || proc_table()
                .into_iter()
                .find(|e| e.pid == daemon)
                .is_some_and(|e| e.ppid != keeper),
            Duration::from_secs(3)
        )
        .await,
        "re-parented away from the dead keeper"
    );
    assert!(
        client
            .stop_tree_without_keeper(Duration::from_millis(2000))
            .await,
        "the stop is proven"
    );
    assert!(all_gone(&args), "no descendant survives");
}

async fn stop_case(cgroup: bool, kind: StopKind, tag: &str) {
    // Bounds of tens of milliseconds: a turn among the timing-sensitive tests.
    let _slot = timing_slot();
    let bound = match kind {
        // TERM is ignored: SIGKILL after --stop-timeout (300 ms).
        StopKind::Graceful => Duration::from_secs(2),
        // TERM, then KILL after half the emergency timeout (200 ms).
        _ => Duration::from_millis(250),
    };
    let what = format!("{kind:?} stop");
    one_within(bound, &what, || stop_once(cgroup, kind, tag)).await;
}

/// One stop of a TERM-ignoring tree: how long it took, never less than the
/// rules' escalation allows.
async fn stop_once(cgroup: bool, kind: StopKind, tag: &str) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (client, _cleanup, args) =
        start(dir.path(), &format!("stop{tag}"), cgroup, tag, true).await;
    client
        .arm(boot_time_now() + Duration::from_secs(30), None, None)
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let ok = client.stop(kind).await.unwrap();
    let took = t0.elapsed();
    eprintln!(
        "cgroup={cgroup} {kind:?} stop of a TERM-ignoring tree took {:.1} ms",
        ms(took)
    );
    // A machine busy enough to delay the keeper past its budget makes the
    // stop unproven in time (seen: 1.1 s beside a busy loop): the tree must
    // still go, and the attempt counts as missed.
    assert!(
        ok || wait_for(|| all_gone(&args), Duration::from_secs(5)).await,
        "stop not proven and the tree survived"
    );
    assert!(
        all_gone(&args),
        "a descendant survived: {:?}",
        args.iter().map(|a| sleeps(a)).collect::<Vec<_>>()
    );
    let earliest = match kind {
        StopKind::Graceful => Duration::from_millis(300),
        _ => Duration::from_millis(100),
    };
    assert!(
        took >= earliest,
        "{kind:?} stop killed before {earliest:?}: {took:?}"
    );
    client.disarm().await.unwrap();
    // After a stop it could not prove in time the keeper may still count
    // the tree alive until it next looks (every 500 ms; seen beside a busy
    // loop): its shutdown is refused until then.
    let asked = std::time::Instant::now();
    while let Err(e) = client.shutdown().await {
        assert!(
            !ok && asked.elapsed() < Duration::from_secs(5),
            "keeper shutdown after the stop: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if ok {
        took
    } else {
        Duration::MAX
    }
}

#[tokio::test]
async fn supervision_graceful_stop_kills_whole_tree_cgroup() {
    stop_case(true, StopKind::Graceful, "31").await;
}

#[tokio::test]
async fn supervision_emergency_stop_kills_whole_tree_cgroup() {
    stop_case(true, StopKind::Emergency, "32").await;
}

#[tokio::test]
async fn supervision_graceful_stop_kills_whole_tree_subreaper() {
    stop_case(false, StopKind::Graceful, "33").await;
}

#[tokio::test]
async fn supervision_emergency_stop_kills_whole_tree_subreaper() {
    stop_case(false, StopKind::Emergency, "34").await;
}

#[tokio::test]
async fn supervision_restarted_agent_adopts_keeper() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _cleanup, args) = start(dir.path(), "adopt", true, "41", false).await;
    // Room for the adoption below on a loaded host (CI runs the suite on
    // two cores): 300 ms was seen to pass before the first extension.
    let old_deadline = boot_time_now() + Duration::from_millis(1_500);
    client.arm(old_deadline, None, None).await.unwrap();
    drop(client); // the agent dies
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (client, adopted) = KeeperClient::spawn_or_adopt(&config(dir.path(), "adopt", true))
        .await
        .unwrap();
    assert!(adopted, "a new keeper was started instead of adopting");
    let st = client.status().await.unwrap();
    assert_eq!(st.deadline_ns, Some(old_deadline.as_nanos()));
    assert!(st.child.as_ref().is_some_and(|c| c.tree_alive));
    while boot_time_now() < old_deadline + Duration::from_millis(500) {
        client
            .extend(boot_time_now() + Duration::from_millis(200))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        all_running(&args),
        "the service did not survive past the old deadline"
    );
    assert!(!client.status().await.unwrap().fired);
    assert!(client.stop(StopKind::Graceful).await.unwrap());
    assert!(all_gone(&args));
    client.disarm().await.unwrap();
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn supervision_keeper_ignores_signals_and_is_recognisable() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _) = KeeperClient::spawn_or_adopt(&config(dir.path(), "sigs", true))
        .await
        .unwrap();
    let pid = client.status().await.unwrap().pid;
    let _cleanup = Cleanup {
        keeper: Some(pid),
        sleeps: vec![],
        scope: None,
    };
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        kill(Pid::from_raw(pid), s).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(client.status().await.unwrap().pid, pid);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        cmdline.windows(12).any(|w| w == b"keeper\0sigs\0"),
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "putex-keeper");
    // Lowering oom_score_adj needs CAP_SYS_RESOURCE; containers often lack it.
    let may_lower = std::process::Command::new("/bin/sh")
        .args(["-c", "echo -1000 > /proc/self/oom_score_adj"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if may_lower {
        let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
        assert_eq!(adj.trim(), "-1000");
    }
    client.shutdown().await.unwrap();
}

#[tokio::test]
async fn supervision_keeper_runs_deactivate_hook_when_it_fires() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deactivated");
    let mut cfg = config(dir.path(), "hookfire", true);
    cfg.deactivate = Some(format!(
        "echo \"$PUTEX_STOP $PUTEX_TOKEN $PUTEX_ROLE\" > {}",
        out.display()
    ));
    let (mut client, _) = KeeperClient::spawn_or_adopt(&cfg).await.unwrap();
    let _cleanup = Cleanup {
        keeper: Some(client.status().await.unwrap().pid),
        sleeps: vec![],
        scope: None,
    };
    let deadline: Instant = boot_time_now() + Duration::from_millis(200);
    client
        .arm(deadline, Some(Token::new(3, 9)), None)
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(3), next_event(&mut client))
        .await
        .unwrap();
    let late = boot_time_now().saturating_since(deadline);
    eprintln!("deactivate hook done {:.1} ms after the deadline", ms(late));
    assert_eq!(ev, KeeperEvent::Fired { ok: true });
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "emergency 3:9 lapsed\n"
    );
    client.shutdown().await.unwrap();
}

/// A hook whose whole tree (a child, and a grandchild in a session of its
/// own) must be killed, and gone, when the run returns: at its timeout
/// (`run`), or stopped from outside first (`run_until`, as a standby's
/// follow hook is when the node takes the lock). The hook says when both
/// are started (a file), and the kill comes after that: on a loaded
/// machine a kill before the `setsid` child was even forked would test
/// the machine, not the kill. (Without a cgroup, a grandchild whose parent
/// dies before the scan that would find it escapes: `Tree::Pids`.)
async fn hook_kill_case(runner: HookRunner, tag: &str, stopped: bool) {
    let args = [format!("1000.{tag}1"), format!("1000.{tag}2")];
    let _cleanup = Cleanup {
        keeper: None,
        sleeps: args.to_vec(),
        scope: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let hook = Hook::new(
        HookKind::Follow,
        format!(
            "sleep {} & setsid sleep {} & touch {}; wait",
            args[0],
            args[1],
            ready.display()
        ),
    );
    let started = {
        let ready = ready.clone();
        async move {
            while !ready.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let t0 = std::time::Instant::now();
    let out = if stopped {
        let stop = async {
            started.await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        runner
            .run_until(&hook, &hook_env(), None, Duration::from_secs(60), stop)
            .await
    } else {
        runner
            .run(&hook, &hook_env(), None, Duration::from_secs(2))
            .await
    }
    .unwrap();
    assert!(ready.exists(), "the hook never started its children");
    let expected = if stopped {
        HookStatus::Cancelled
    } else {
        HookStatus::TimedOut
    };
    eprintln!(
        "hook (cgroup={}) {expected:?}, tree killed after {:.1} ms",
        runner.uses_cgroup(),
        ms(t0.elapsed())
    );
    assert_eq!(out.status, expected);
    assert!(out.tree_gone);
    assert!(!out.ok());
    assert!(all_gone(&args), "a hook descendant survived");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // One that ends first is left to end: the stop never comes into it.
    let quick = Hook::new(HookKind::Follow, "sleep 0.1");
    let out = runner
        .run_until(
            &quick,
            &hook_env(),
            None,
            Duration::from_secs(10),
            tokio::time::sleep(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    assert!(out.ok(), "{out:?}");
}

#[tokio::test]
async fn supervision_hook_timeout_kills_whole_tree_cgroup() {
    hook_kill_case(HookRunner::detect(), "51", false).await;
}

#[tokio::test]
async fn supervision_hook_timeout_kills_whole_tree_without_cgroup() {
    hook_kill_case(HookRunner::without_cgroup(), "52", false).await;
}

#[tokio::test]
async fn supervision_hook_stopped_from_outside_kills_whole_tree_cgroup() {
    hook_kill_case(HookRunner::detect(), "53", true).await;
}

#[tokio::test]
async fn supervision_hook_stopped_from_outside_kills_whole_tree_without_cgroup() {
    hook_kill_case(HookRunner::without_cgroup(), "54", true).await;
}

/// Both sides of a hook's daemons (`docs/supervision.md`, "Hooks"): a
/// daemon the hook started — in a session of its own, its starter gone, as
/// `pg_ctl start` leaves the postmaster — outlives the hook when it is
/// stopped from outside (a standby's follow hook when its node takes the
/// lock, or its agent stops), when it times out and when it exits, while
/// the hook's own children (a background job, a `setsid` child it still
/// waits for) are killed; and the hook's scope is removed every time (it
/// was left behind, empty, before).
async fn hook_daemon_case(runner: HookRunner, tag: &str, how: &str) {
    let own = [format!("1000.{tag}1"), format!("1000.{tag}2")];
    let daemon = [format!("1000.{tag}3")];
    let _cleanup = Cleanup {
        keeper: None,
        sleeps: own.iter().chain(&daemon).cloned().collect(),
        scope: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    // A hook that exits has no children of its own left: those would keep
    // its scope (and are left running, as ever).
    let children = if how == "exit" {
        String::new()
    } else {
        format!("sleep {} & setsid sleep {} & ", own[0], own[1])
    };
    let last = if how == "exit" { "true" } else { "wait" };
    let own_cgroup = dir.path().join("cgroup");
    let hook = Hook::new(
        HookKind::Follow,
        format!(
            "cat /proc/self/cgroup > {}; (setsid sleep {} &); {children}sleep 0.2; touch {}; {last}",
            own_cgroup.display(),
            daemon[0],
            ready.display()
        ),
    );
    let out = match how {
        "stop" => {
            let ready = ready.clone();
            let stop = async move {
                while !ready.exists() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            runner
                .run_until(&hook, &hook_env(), None, Duration::from_secs(60), stop)
                .await
        }
        "timeout" => {
            runner
                .run(&hook, &hook_env(), None, Duration::from_secs(2))
                .await
        }
        _ => {
            runner
                .run(&hook, &hook_env(), None, Duration::from_secs(60))
                .await
        }
    }
    .unwrap();
    assert!(ready.exists(), "the hook never started its children");
    assert!(
        all_running(&daemon),
        "the daemon did not outlive the hook ({how}, {out:?})"
    );
    assert!(
        all_gone(&own),
        "a child of the hook itself survived ({how})"
    );
    if runner.uses_cgroup() {
        let pid = sleeps(&daemon[0])[0];
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(
            cgroup.contains(putex::supervision::hooks::DAEMONS_SCOPE),
            "the daemon is not in the daemons' scope: {cgroup}"
        );
        let root = putex::supervision::process::CgroupRoot::detect().unwrap();
        let scope = std::fs::read_to_string(&own_cgroup).unwrap();
        let scope = putex::supervision::process::unified_cgroup_path(&scope).unwrap();
        let scope = root.dir().join(scope.rsplit('/').next().unwrap());
        assert!(
            !scope.exists(),
            "the hook's scope was left behind: {}",
            scope.display()
        );
    }
    eprintln!(
        "hook (cgroup={}, {how}): its daemon outlives it, its own children are gone",
        runner.uses_cgroup()
    );
}

/// The empty scope of a hook runner that died before it could remove it
/// (an agent killed while a hook ran), or of a keeper killed with
/// `kill -9`, is removed when the next runner (or keeper) starts; a scope
/// whose maker lives, or that still holds a process, is not.
#[test]
fn supervision_a_dead_runners_empty_hook_scope_is_removed() {
    let Some(root) = putex::supervision::process::CgroupRoot::detect() else {
        eprintln!("no usable cgroup2 here: nothing to remove");
        return;
    };
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let orphan = root.dir().join(format!("putex-hook-healthcheck-{dead}-7"));
    let mine = root.dir().join(format!(
        "putex-hook-healthcheck-{}-99999",
        std::process::id()
    ));
    // A keeper's scope (`putex-LOCK-PID`, the lock name with dashes).
    let keeper_orphan = root.dir().join(format!("putex-night-ly-{dead}"));
    let keeper_mine = root
        .dir()
        .join(format!("putex-night-ly-{}", std::process::id()));
    let scopes = [&orphan, &mine, &keeper_orphan, &keeper_mine];
    for scope in scopes {
        std::fs::create_dir(scope).unwrap();
    }
    let _runner = HookRunner::detect();
    let left: Vec<bool> = scopes.iter().map(|s| s.exists()).collect();
    for scope in scopes {
        let _ = std::fs::remove_dir(scope);
    }
    assert!(!left[0], "the dead runner's empty scope was left");
    assert!(left[1], "a living runner's scope was removed");
    assert!(!left[2], "the dead keeper's empty scope was left");
    assert!(left[3], "a living keeper's scope was removed");
}

#[tokio::test]
async fn supervision_hook_daemons_outlive_a_stopped_hook_cgroup() {
    hook_daemon_case(HookRunner::detect(), "55", "stop").await;
}

#[tokio::test]
async fn supervision_hook_daemons_outlive_a_stopped_hook_without_cgroup() {
    hook_daemon_case(HookRunner::without_cgroup(), "56", "stop").await;
}

#[tokio::test]
async fn supervision_hook_daemons_outlive_a_timed_out_hook_cgroup() {
    hook_daemon_case(HookRunner::detect(), "57", "timeout").await;
}

#[tokio::test]
async fn supervision_hook_daemons_outlive_a_hook_that_exits_cgroup() {
    hook_daemon_case(HookRunner::detect(), "58", "exit").await;
}

#[tokio::test]
async fn supervision_hook_environment_and_arguments_are_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = format!(
        "{{ printf '%s\\n' \"$0\" \"$#\"; env | grep '^PUTEX_' | sort; }} > {} ; printf 'args:'",
        out.display()
    );
    let env = HookEnv {
        lock: Name::new("pg").unwrap(),
        node: NodeId::new("n1").unwrap(),
        role: "active".into(),
        token: Some(Token::new(5, 77)),
        previous: Some("n2".into()),
        stop: Some(StopKind::Graceful),
        holder: None,
        holder_addr: None,
        kv_socket: None,
        members: vec![
            (NodeId::new("n2").unwrap(), Duration::from_secs(3601)),
            (NodeId::new("n1").unwrap(), Duration::ZERO),
        ],
    };
    let runner = HookRunner::detect();
    let health = Hook::new(HookKind::Health, script.clone());
    let r = runner
        .run(&health, &env, Some("active"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "putex-hook\n1\nPUTEX_HOOK=healthcheck\nPUTEX_LOCK=pg\nPUTEX_MEMBERS=n1=0 n2=3601\nPUTEX_NODE=n1\nPUTEX_PREVIOUS=n2\nPUTEX_ROLE=active\nPUTEX_TOKEN=5:77\n"
    );
    // The mode is the last argument.
    let last = dir.path().join("last");
    let h = Hook::new(
        HookKind::Health,
        format!(
            "f() {{ eval \"echo \\${{$#}}\" > {}; }}; f x",
            last.display()
        ),
    );
    assert!(runner
        .run(&h, &env, Some("standby"), Duration::from_secs(5))
        .await
        .unwrap()
        .ok());
    assert_eq!(std::fs::read_to_string(&last).unwrap(), "standby\n");
    let deact = Hook::new(HookKind::Deactivate, script);
    let r = runner
        .run(&deact, &env, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(r.ok());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "putex-hook\n0\nPUTEX_HOOK=deactivate\nPUTEX_LOCK=pg\nPUTEX_MEMBERS=n1=0 n2=3601\nPUTEX_NODE=n1\nPUTEX_PREVIOUS=n2\nPUTEX_ROLE=active\nPUTEX_STOP=graceful\nPUTEX_TOKEN=5:77\n"
    );
    let failing = Hook::new(HookKind::Fence, "exit 3");
    let r = runner
        .run(&failing, &env, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(r.status, HookStatus::Exited(e) if e.code == Some(3)));
}

/// SIGINT/SIGTERM for the supervised command reach it through its keeper
/// (how `putex lock` forwards the signals it receives to CMD), and the
/// signal forwarder hands this process's signals to a callback.
#[tokio::test]
async fn supervision_signals_reach_the_child_through_the_keeper() {
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let (client, _adopted) = KeeperClient::spawn_or_adopt(&config(dir.path(), "sig", true))
        .await
        .unwrap();
    let st = client.status().await.unwrap();
    let tag = format!("1000.{}7", std::process::id());
    let mut cleanup = Cleanup {
        keeper: Some(st.pid),
        sleeps: vec![tag.clone()],
        scope: None,
    };
    // The child records which signal it got, then exits.
    let script = format!(
        "trap 'echo INT > {g}; exit 0' INT; trap 'echo TERM > {g}; exit 0' TERM; \
         sleep {tag} & wait",
        g = got.display()
    );
    let argv = vec!["/bin/sh".into(), "-c".into(), script];
    let (_pid, tree) = client.spawn_child(argv, vec![]).await.unwrap();
    if let TreeInfo::Cgroup(p) = &tree {
        cleanup.scope = Some(p.clone());
    }
    assert!(wait_for(|| !sleeps(&tag).is_empty(), Duration::from_secs(5)).await);
    client.signal(Signal::SIGINT).await.unwrap();
    // `echo … > got` creates the file before it writes: wait for the text.
    let read = || std::fs::read_to_string(&got).unwrap_or_default();
    assert!(
        wait_for(|| !read().trim().is_empty(), Duration::from_secs(5)).await,
        "the child never saw the forwarded SIGINT"
    );
    assert_eq!(read().trim(), "INT");
    client.stop(StopKind::Graceful).await.unwrap();
    client.shutdown().await.unwrap();

    // The forwarder: a SIGHUP to this process reaches the callback.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = putex::supervision::process::forward_signals(move |s| {
        let _ = tx.send(s);
    })
    .unwrap();
    kill(Pid::this(), Signal::SIGHUP).unwrap();
    let forwarded = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the forwarder saw no signal");
    assert_eq!(forwarded, Some(Signal::SIGHUP));
    task.abort();
}

#[tokio::test]
async fn supervision_a_failed_hook_says_how_it_ended_and_its_last_stderr_line() {
    let runner = HookRunner::detect();
    let run = |script: &str, timeout_ms: u64| {
        let hook = Hook::new(HookKind::Follow, script);
        let runner = runner.clone();
        async move {
            runner
                .run(&hook, &hook_env(), None, Duration::from_millis(timeout_ms))
                .await
                .unwrap()
        }
    };
    let failed = run(
        "echo first >&2; echo out; echo '  FATAL:  WAL segment 3 removed  ' >&2; echo >&2; exit 3",
        5_000,
    )
    .await;
    assert_eq!(
        failed.failure().as_deref(),
        Some("exit 3: FATAL:  WAL segment 3 removed"),
        "{failed:?}"
    );
    let quiet = run("exit 1", 5_000).await;
    assert_eq!(quiet.failure().as_deref(), Some("exit 1"));
    let slow = run("echo waiting >&2; sleep 5", 200).await;
    let why = slow.failure().unwrap();
    assert!(
        why.starts_with("timed out after ") && why.ends_with(" ms: waiting"),
        "{why}"
    );
    let long = run(&format!("echo {} >&2; exit 2", "x".repeat(500)), 5_000).await;
    assert_eq!(
        long.failure().unwrap(),
        format!("exit 2: {}", "x".repeat(200))
    );
    let fine = run("echo all good >&2", 5_000).await;
    assert_eq!(fine.failure(), None);
}
