//! `putex run`, `check` and `status` end to end: real agent processes of the
//! built binary against a real nats-server (single node, fast timing R =
//! 100 ms, F = 3, C = 1), with hooks that append `start`/`stop` lines to a
//! file so that the tests can check who ran the service when.
//!
//! Each test holds a `timing_slot`: their bounds are tens of milliseconds,
//! so only a few run at once (more on a small machine would measure each
//! other). Every agent, keeper and service is killed on drop. The
//! helpers are in `common/agent.rs`; the fault tests in `agent_faults.rs`.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::agent::{
    assert_no_overlap, bound_for, dump, events, fast, hooks, putex, sigkill, sleeps, start, starts,
    status_json, timing_slot, wait_for, Agent, R,
};
use crate::common::nats_server::NatsServer;
use crate::common::on_stores;
use crate::common::store::Backend;

on_stores!(timing_slot; Backend, three_nodes_failover_and_handover =>
    agent_three_nodes_one_active_crash_failover_and_graceful_handover: nats,
    agent_three_nodes_one_active_crash_failover_and_graceful_handover_on_etcd: etcd,
);

/// On etcd, whose store clock reads in whole seconds, the bound is B + up
/// to 2 s + R (`docs/stores.md`: [`bound_for`]).
fn three_nodes_failover_and_handover(server: &Backend) {
    let url = &server.url();
    let bound = bound_for(url);
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("events");
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agents: Vec<Agent> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| start(fast(dir.path(), url, "svc", n, &flags)))
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

    // `putex status -o json` sees the holder and three members (an agent
    // refused for a slow store at start-up is started again: on a loaded
    // machine its record can come late).
    let mut st = status_json(url, "svc");
    wait_for(Duration::from_secs(10), || {
        st = status_json(url, "svc");
        st["members"].as_array().is_some_and(|m| m.len() == 3)
    });
    assert_eq!(st["holder"], first.as_str(), "{st}");
    assert_eq!(st["state"], "active", "{st}");
    // On etcd a one-shot status has seen every record only just now: no
    // age to show (`docs/stores.md`).
    if !url.starts_with("etcd:") {
        assert!(st["renewed_ago_ms"].as_u64().unwrap() < 1000, "{st}");
    }
    assert_eq!(st["members"].as_array().unwrap().len(), 3, "{st}");
    let table = putex()
        .args(["status", "--lock", "svc", "--store", url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("HOLDER") && table.contains(&first),
        "{table}"
    );

    // Host crash of the active: agent and keeper SIGKILLed at once.
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    let crashed = agents[i].crash();
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
    let latest = bound + Duration::from_millis(100);
    eprintln!("crash failover: {took:?} (earliest {earliest:?}, bound B + 100 ms = {latest:?})");
    // A holder that stopped itself before the crash (its renewals lapsed:
    // a machine too busy to run it for T) left nothing to time from the
    // crash; no overlap is still checked below.
    let lapsed_before = events(&ev)
        .into_iter()
        .find(|l| l.what == "stop" && l.node == first && l.extra != "startup" && l.ns < crashed);
    if let Some(stop) = &lapsed_before {
        eprintln!(
            "the holder stopped ({}) before the crash: no crash failover to time",
            stop.extra
        );
    } else {
        assert!(
            second.ns >= crashed + earliest.as_nanos(),
            "activated {took:?} after the crash, before T + G − R\n{}",
            dump(&agents.iter().collect::<Vec<_>>(), &ev)
        );
    }
    assert!(
        took <= latest,
        "failover took {took:?} > B + 100 ms = {latest:?}"
    );

    // SIGTERM of the new active: graceful stop, release, fast handover.
    let j = agents.iter().position(|a| a.node() == second.node).unwrap();
    agents[j].stop_cleanly();
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
    let k = agents.iter().position(|a| a.node() == third.node).unwrap();
    agents[k].stop_cleanly();
}

/// Issue 44, "never wait in silence", for `putex run`: an agent whose lock
/// is new on a NATS store (which cannot prove it vacant) says in its log,
/// before it activates, what it waits for, how long and why (S4).
#[test]
fn agent_a_first_use_says_what_it_waits_for_before_activating() {
    let server = Backend::nats();
    let _slot = timing_slot();
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("1000.{}{}", std::process::id(), server.tag());
    let script = format!("sleep {tag} & wait");
    let mut a = start_child(dir.path(), &server.url(), "fresh", "f1", &script, &tag);
    let log = a.log_text();
    assert!(
        log.contains("lock \"fresh\" taken; waiting ")
            && log.contains(" s before activating: ")
            && log.contains("cannot prove that no holder's record was lost")
            && log.contains("docs/safety.md, S4"),
        "{log}"
    );
    a.stop_cleanly();
}

/// An agent in child mode running `sh -c SCRIPT`, once the child's
/// `sleep TAG` runs.
fn start_child(
    dir: &std::path::Path,
    url: &str,
    lock: &str,
    node: &str,
    script: &str,
    tag: &str,
) -> Agent {
    let a = start(fast(dir, url, lock, node, &["--", "/bin/sh", "-c", script]));
    assert!(
        wait_for(Duration::from_secs(10), || !sleeps(tag).is_empty()),
        "the child did not start\n{}",
        a.log_text()
    );
    a
}

// The tests' sleeps carry a tag of each store's ([`Backend::tag`]): a
// leftover of one variant is never taken for the other's.
on_stores!(timing_slot; Backend, child_mode_leaves_no_process_behind =>
    agent_child_mode_leaves_no_process_behind: nats,
    agent_child_mode_leaves_no_process_behind_on_etcd: etcd,
);

fn child_mode_leaves_no_process_behind(server: &Backend) {
    let url = &server.url();
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("1000.{}{}", std::process::id(), server.tag());
    let script = format!("sleep {tag} & wait");
    let mut a = start_child(dir.path(), url, "child", "c1", &script, &tag);
    a.stop_cleanly();
    assert!(
        wait_for(Duration::from_secs(1), || sleeps(&tag).is_empty()),
        "the child's sleep survived the stop\n{}",
        a.log_text()
    );
    assert!(a.log_text().contains("released=true"), "{}", a.log_text());
}

on_stores!(timing_slot; Backend, second_on_the_same_host_is_refused =>
    agent_second_on_the_same_host_is_refused_by_the_lock_file: nats,
    agent_second_on_the_same_host_is_refused_by_the_lock_file_on_etcd: etcd,
);

fn second_on_the_same_host_is_refused(server: &Backend) {
    let url = &server.url();
    let dir = tempfile::tempdir().unwrap();
    let keeper_dir = dir.path().join("keepers");
    let ev = dir.path().join("events");
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut a = start(fast(dir.path(), url, "dup", "h1", &flags).keeper_dir(&keeper_dir));
    assert!(
        wait_for(Duration::from_secs(5), || a
            .log_text()
            .contains("agent starting")),
        "{}",
        a.log_text()
    );
    let mut b = start(fast(dir.path(), url, "dup", "h1", &flags).keeper_dir(&keeper_dir));
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
    a.stop_cleanly();
}

fn check(args: &[&str]) -> Output {
    putex().arg("check").args(args).output().unwrap()
}

/// On a replicated bucket a lease shorter than a stream-leader election
/// (T < 10 s) is refused unless `--allow-short-lease`.
#[test]
fn agent_check_refuses_a_short_lease_on_a_replicated_bucket() {
    let cluster = crate::common::nats_server::NatsCluster::start();
    let _slot = timing_slot();
    check_refuses_a_short_lease(&format!("{}?bucket=putex_short&replicas=3", cluster.url()));
}

/// The same on a 3-member etcd cluster (a partitioned leader steps down
/// only after an election timeout).
#[test]
fn agent_check_refuses_a_short_lease_on_a_3_member_etcd() {
    let cluster = crate::common::etcd_server::EtcdCluster::start(3);
    let _slot = timing_slot();
    check_refuses_a_short_lease(&format!("etcd://{}", cluster.endpoints().join(",")));
}

fn check_refuses_a_short_lease(url: &str) {
    let fast = ["--renew", "100ms", "--failures", "3", "--confirm", "1"];
    // The cluster may still be electing its leader: retry a little.
    let mut out = check(&[&["--store", url], &fast[..]].concat());
    for _ in 0..40 {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("--allow-short-lease") {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        out = check(&[&["--store", url], &fast[..]].concat());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--allow-short-lease"), "{err}");
    let out = check(&[&["--store", url, "--allow-short-lease"], &fast[..]].concat());
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn agent_check_rejects_bad_options_by_name_and_prints_the_timeline() {
    let server = NatsServer::start();
    let _slot = timing_slot();
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
    // The benchmarks read B from this line: W + G' + three round trips.
    let bound = putex_testkit::check::worst_case_bound(&text).expect("B reads");
    assert!(
        bound > Duration::from_millis(400) && bound < Duration::from_millis(500),
        "{bound:?}: {text}"
    );
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

/// `putex check` prints an etcd store's bound with the store-clock
/// witness's delay (two clock steps + R, `docs/safety.md`) from the URL
/// alone: a store it cannot reach now gets its kind's bound, not NATS's.
#[test]
fn agent_check_prints_the_etcd_bound_without_reaching_the_store() {
    let timing = ["--renew", "100ms", "--failures", "3", "--confirm", "1"];
    let bound = |url: &str| {
        let out = check(&[&["--store", url][..], &timing[..]].concat());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && text.contains("warning:"),
            "{url}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let b = putex_testkit::check::worst_case_bound(&text).expect("B reads");
        (b, text)
    };
    let (nats, text) = bound("nats://127.0.0.1:1");
    assert!(!text.contains("whole seconds"), "{text}");
    let (etcd, text) = bound("etcd://127.0.0.1:1");
    assert!(
        text.contains("the store's clock reads in whole seconds (etcd)"),
        "{text}"
    );
    // Printed to three figures (2.63 s).
    let delay = putex::store::etcd::CLOCK_STEP * 2 + Duration::from_millis(100);
    assert!(
        etcd.checked_sub(nats)
            .is_some_and(|d| d.abs_diff(delay) <= Duration::from_millis(10)),
        "etcd {etcd:?}, nats {nats:?}: {text}"
    );
}

on_stores!(timing_slot; Backend, restarted_after_sigkill_adopts_its_keeper =>
    agent_restarted_after_sigkill_adopts_its_keeper_and_the_service_keeps_running: nats,
    agent_restarted_after_sigkill_adopts_its_keeper_and_the_service_keeps_running_on_etcd: etcd,
);

fn restarted_after_sigkill_adopts_its_keeper(server: &Backend) {
    let url = &server.url();
    let dir = tempfile::tempdir().unwrap();
    let keeper_dir = dir.path().join("keepers");
    let tag = format!("1000.{}1{}", std::process::id(), server.tag());
    let script = format!("sleep {tag} & wait");
    // T = 3 s here: the restart must renew within the keeper's deadline,
    // and on a loaded machine its start-up (which measures the store, again
    // when the compare-and-swaps were slow) has taken over 1 s.
    let service = ["--failures", "30", "--", "/bin/sh", "-c", &script];
    let mut a = start(fast(dir.path(), url, "adopt", "r1", &service).keeper_dir(&keeper_dir));
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
    let mut b = start(fast(dir.path(), url, "adopt", "r1", &service).keeper_dir(&keeper_dir));
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
    b.stop_cleanly();
    assert!(
        wait_for(Duration::from_secs(1), || sleeps(&tag).is_empty()),
        "the service survived the stop"
    );
}

on_stores!(timing_slot; Backend, second_signal_makes_an_emergency_stop =>
    agent_second_signal_makes_an_emergency_stop_and_exits: nats,
    agent_second_signal_makes_an_emergency_stop_and_exits_on_etcd: etcd,
);

fn second_signal_makes_an_emergency_stop(server: &Backend) {
    let url = &server.url();
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("1000.{}2{}", std::process::id(), server.tag());
    // The service ignores SIGTERM, so the graceful stop would take the whole
    // --stop-timeout (2 s); the second signal cuts it short.
    let script = format!("trap '' TERM; sleep {tag} & wait; wait");
    let mut a = start_child(dir.path(), url, "twice", "s1", &script, &tag);
    a.sigterm();
    // Two signals sent close together can merge into one pending signal
    // before the agent's handler runs (a loaded machine): send the second
    // only once the first has started the graceful stop.
    assert!(
        wait_for(Duration::from_secs(5), || a
            .log_text()
            .contains("stepping-down")),
        "the first signal did not start a graceful stop\n{}",
        a.log_text()
    );
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

/// The SQLite store's files deleted under a holder (docs/stores.md): the
/// holder's next store call fails as unknown, naming the file, so it stops
/// when its licence ends (H1); an agent started afterwards creates a new
/// file, takes the absent record (S4, W + G') and activates only after the
/// old holder's service stopped.
#[test]
fn agent_sqlite_store_deleted_under_the_holder_never_two_active() {
    let _slot = timing_slot();
    // On tmpfs where there is one, and R = 200 ms: R must be ten times the
    // store's p99 compare-and-swap, and a loaded disk's fsync can take
    // longer than 10 ms.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let db = dir.path().join("store.db");
    let url = format!("sqlite://{}", db.display());
    let ev = dir.path().join("events");
    let mut flags = hooks(&ev);
    flags.extend(["--renew".to_string(), "200ms".to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let a = start(fast(dir.path(), &url, "svc", "a", &flags));
    assert!(
        wait_for(Duration::from_secs(10), || !starts(&ev).is_empty()),
        "a did not activate\n{}",
        dump(&[&a], &ev)
    );
    // A few renewals in, delete the database with its -wal and -shm.
    std::thread::sleep(10 * R);
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(format!("{}{suffix}", db.display())).unwrap();
    }
    let b = start(fast(dir.path(), &url, "svc", "b", &flags));
    assert!(
        wait_for(Duration::from_secs(10), || starts(&ev)
            .iter()
            .any(|l| l.node == "b")),
        "b did not activate on the new file\n{}",
        dump(&[&a, &b], &ev)
    );
    // A while longer: a must not come back either.
    std::thread::sleep(20 * R);
    let lines = events(&ev);
    assert_no_overlap(&lines, &[], &dump(&[&a, &b], &ev));
    assert!(
        lines
            .iter()
            .any(|l| l.what == "stop" && l.node == "a" && l.extra == "emergency"),
        "a never stopped\n{}",
        dump(&[&a, &b], &ev)
    );
    assert!(
        a.log_text().contains("deleted or replaced"),
        "{}",
        a.log_text()
    );
}

/// The hooks of `putex run` make guarded writes (`putex kv`, through
/// `PUTEX_KV_SOCKET`): the active node's land — its activate hook's, its
/// health checks', and its deactivate hook's during a graceful stop, which
/// the keeper runs while the lock is still held — and a standby's are
/// refused with exit 76, nothing written.
#[test]
fn agent_hooks_make_guarded_writes_while_holding() {
    let _slot = timing_slot();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let p = crate::common::agent::putex_bin().display().to_string();
    let d = dir.path().display().to_string();
    let activate = format!(r#"{p} kv put svc.owner "$PUTEX_NODE""#);
    // The deactivate hook also runs at start-up, holding nothing: it
    // writes on a graceful stop only.
    let deactivate = format!(
        r#"if [ "$PUTEX_STOP" = graceful ]; then {p} kv put svc.stopped-by "$PUTEX_NODE"; fi"#
    );
    let health = format!(
        r#"{p} kv put "health.$PUTEX_NODE" "$PUTEX_ROLE" 2>/dev/null; echo "$PUTEX_ROLE $?" >> "{d}/rc.$PUTEX_NODE"; true"#
    );
    let flags = [
        "--activate",
        &activate,
        "--deactivate",
        &deactivate,
        "--healthcheck",
        &health,
    ];
    let get = |key: &str| {
        let out = putex()
            .args(["kv", "get", key, "--store", &url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let rc = |node: &str| {
        std::fs::read_to_string(dir.path().join(format!("rc.{node}"))).unwrap_or_default()
    };
    let mut n1 = start(fast(dir.path(), &url, "svc", "n1", &flags));
    assert!(
        wait_for(Duration::from_secs(10), || get("svc.owner") == "n1"),
        "n1's activate hook wrote nothing:\n{}",
        n1.log_text()
    );
    let mut n2 = start(fast(dir.path(), &url, "svc", "n2", &flags));
    assert!(
        wait_for(Duration::from_secs(10), || rc("n1").contains("active 0")
            && rc("n2").contains("standby 76")),
        "n1: {:?}, n2: {:?}\n{}\n{}",
        rc("n1"),
        rc("n2"),
        n1.log_text(),
        n2.log_text()
    );
    assert!(
        !rc("n2").contains(" 0"),
        "a standby's write landed: {:?}",
        rc("n2")
    );
    assert_eq!(get("health.n1"), "active");
    assert_eq!(get("health.n2"), "");

    // A graceful stop: the deactivate hook writes before the release.
    n1.stop_cleanly();
    assert_eq!(get("svc.stopped-by"), "n1", "{}", n1.log_text());
    assert!(
        wait_for(Duration::from_secs(10), || get("svc.owner") == "n2"),
        "n2 did not take over and write:\n{}",
        n2.log_text()
    );
    n2.stop_cleanly();
    assert_eq!(get("svc.stopped-by"), "n2");
}
