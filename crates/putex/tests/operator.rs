//! Operator controls end to end (O1–O4): `putex switchover`, `putex pause`
//! and `putex resume`, `--priority`, `--position`/`--max-lag`, `--rejoin`,
//! `--advertise`/`--follow`, with real agents of the built binary on a real
//! nats-server (the fast profile of `common/agent.rs`: R = 100 ms, F = 3,
//! C = 1) and hooks that log every start and stop. Every test but the one
//! that cuts a node off through a TCP proxy also runs on the embedded
//! store and on a real etcd (`all_stores!`), whose failover bound is
//! longer (its store clock reads in whole seconds: `bound_for`).
//!
//! Each guarantee is checked from both sides: the switchover happens (and
//! fast) and a refused one disturbs nothing; a pause holds through a crash
//! and a resume ends it; a node that may not take over does not, and one
//! that may, does.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::agent::{
    assert_no_overlap, bound_for, dump, events, fast, hooks, putex, start, starts, status_json,
    timing_slot, wait_for, wall_ns, Agent, R,
};
use crate::common::store::Backend;
use putex_testkit::agent::output_text as text;

/// A test on a real nats-server, on the embedded store and on a real etcd:
/// a module `$name` with the tests `nats`, `embedded_store` and `etcd`,
/// each calling `$body(url, dir)` with a fresh temporary directory.
macro_rules! all_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn nats() {
                let server = Backend::nats();
                let _slot = timing_slot();
                let dir = tempfile::tempdir().unwrap();
                $body(&server.url(), dir.path());
            }

            #[test]
            fn embedded_store() {
                let _slot = timing_slot();
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("store.db").display());
                $body(&url, dir.path());
            }

            #[test]
            fn etcd() {
                let server = Backend::etcd();
                let _slot = timing_slot();
                let dir = tempfile::tempdir().unwrap();
                $body(&server.url(), dir.path());
            }
        }
    };
}

fn run(args: &[&str]) -> Output {
    putex().args(args).output().expect("run putex")
}

/// Starts `nodes` with the hooks and `extra` flags; waits for one active.
fn cluster(
    dir: &Path,
    url: &str,
    nodes: &[&str],
    extra: &dyn Fn(&str) -> Vec<String>,
) -> Vec<Agent> {
    let ev = dir.join("events");
    let agents: Vec<Agent> = nodes
        .iter()
        .map(|n| {
            let mut flags = hooks(&ev);
            flags.extend(extra(n));
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            start(fast(dir, url, "svc", n, &flags))
        })
        .collect();
    assert!(
        wait_for(Duration::from_secs(10), || !starts(&ev).is_empty()),
        "nobody activated\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    // Every member is up (on etcd each measures the store for about a
    // second first), has written its record and read the others'.
    let up = || {
        let st = status_json(url, "svc");
        st["members"].as_array().is_some_and(|m| {
            m.iter()
                .filter(|m| m["role"] == "standby" || m["role"] == "active")
                .count()
                == nodes.len()
        })
    };
    assert!(
        wait_for(Duration::from_secs(10), up),
        "not every member came up\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    std::thread::sleep(R * 8);
    begin_from_the_holder(&ev, &agents);
    agents
}

/// The tests count starts from one settled holder. On a loaded host the
/// first holder can lapse while the others start (a renewal late by more
/// than T; its keeper stops the service, H1) and another takes over: the
/// guarantees hold, but "one start so far" does not. Then the story so far
/// is checked (never two at once), kept as `events.startup`, and the
/// events file begins again from the current holder's start.
fn begin_from_the_holder(ev: &Path, agents: &[Agent]) {
    let lines = events(ev);
    assert_no_overlap(&lines, &[], &dump(&agents.iter().collect::<Vec<_>>(), ev));
    let last = lines.iter().rposition(|l| l.what == "start").unwrap();
    let running = !lines[last..]
        .iter()
        .any(|l| l.what == "stop" && l.node == lines[last].node && l.extra != "startup");
    assert!(
        running,
        "nobody holds after start-up\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), ev)
    );
    if starts(ev).len() == 1 {
        return;
    }
    eprintln!(
        "the first holder lapsed during start-up; the test begins from {}'s start",
        lines[last].node
    );
    let startup = ev.with_extension("startup");
    std::fs::copy(ev, &startup).unwrap();
    let text = std::fs::read_to_string(&startup).unwrap();
    let start = text.lines().rfind(|l| l.starts_with("start ")).unwrap();
    std::fs::write(ev, format!("{start}\n")).unwrap();
}

/// Waits (up to 10 s) until `node`'s member record says its last health
/// check passed (`ok`) or failed, then R × 5 more for every agent to have
/// read it.
fn await_health(url: &str, node: &str, ok: bool) {
    let says = || {
        status_json(url, "svc")["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["node"] == node))
            .and_then(|m| m["healthy"].as_bool())
            == Some(ok)
    };
    assert!(
        wait_for(Duration::from_secs(10), says),
        "{node}'s record never said healthy: {ok}: {}",
        status_json(url, "svc")
    );
    std::thread::sleep(R * 5);
}

/// Waits (up to 10 s) until the member records publish these positions,
/// then R × 5 more for every agent to have read them.
fn await_positions(url: &str, want: &[(&str, u64)]) {
    let published = || {
        let st = status_json(url, "svc");
        want.iter().all(|(node, pos)| {
            st["members"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["node"] == *node && m["position"].as_u64() == Some(*pos))
            })
        })
    };
    assert!(
        wait_for(Duration::from_secs(10), published),
        "positions {want:?} never published: {}",
        status_json(url, "svc")
    );
    std::thread::sleep(R * 5);
}

fn holder(ev: &Path) -> String {
    starts(ev).last().expect("a start").node.clone()
}

/// How long a negative side watches for a takeover that must not happen
/// ("nobody takes over while paused"): one would come by the bound B, and
/// half of B again leaves a loaded machine room. (Three B, as before, cost
/// the suite half a minute on etcd, whose B is seconds.)
fn unmoved_for(url: &str) -> Duration {
    bound_for(url) * 3 / 2
}

fn no_flags(_: &str) -> Vec<String> {
    Vec::new()
}

all_stores!(
    operator_switchover_to_a_named_node_and_refusals_that_change_nothing,
    switchover_and_refusals
);

fn switchover_and_refusals(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let sick = dir.join("sick");
    let check = format!("test ! -e {}-$PUTEX_NODE #", sick.display());
    let mut agents = cluster(dir, url, &["n1", "n2", "n3"], &|_| {
        vec!["--healthcheck".into(), check.clone()]
    });
    let ctx = || dump(&agents.iter().collect::<Vec<_>>(), &ev);
    let first = holder(&ev);
    let target = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| *n != first)
        .unwrap()
        .to_string();

    // Refused: unknown target, a target failing its checks, the holder
    // itself. The holder stays; nothing starts or stops.
    std::fs::write(format!("{}-{target}", sick.display()), "").unwrap();
    // Its record says so (on a loaded host, later than a few R), and the
    // holder has read it.
    await_health(url, &target, false);
    let before = events(&ev).len();
    for (to, why) in [
        ("nosuch", "not a member"),
        (target.as_str(), "not ready"),
        (first.as_str(), "already holds"),
    ] {
        let o = run(&["switchover", "svc", "--to", to, "--store", url]);
        assert_eq!(o.status.code(), Some(1), "{to}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(why),
            "{to}: {}",
            text(&o)
        );
    }
    assert_eq!(
        events(&ev).len(),
        before,
        "a refusal disturbed the holder\n{}",
        ctx()
    );
    assert_eq!(status_json(url, "svc")["holder"], first.as_str());

    // To a named, healthy node: its service starts after the holder's
    // graceful stop, at once.
    std::fs::remove_file(format!("{}-{target}", sick.display())).unwrap();
    await_health(url, &target, true);
    let asked = wall_ns();
    let o = run(&["switchover", "svc", "--to", &target, "--store", url]);
    assert!(o.status.success(), "{}\n{}", text(&o), ctx());
    // The command returns once the record says active; the hook's line
    // may come a moment later.
    assert!(wait_for(Duration::from_secs(2), || starts(&ev).len() >= 2));
    let s = starts(&ev);
    let started = s.last().unwrap();
    assert_eq!(started.node, target, "{}", ctx());
    let stop = events(&ev)
        .into_iter()
        .find(|l| l.what == "stop" && l.node == first && l.extra == "graceful")
        .expect("the holder's graceful stop");
    let took = Duration::from_nanos((started.ns - asked) as u64);
    let gap = Duration::from_nanos(started.ns.saturating_sub(stop.ns) as u64);
    eprintln!("switchover: command to target's activate hook {took:?}, stop to start {gap:?}");
    assert!(started.ns >= stop.ns, "started before the stop\n{}", ctx());
    assert!(
        gap < Duration::from_millis(200),
        "handover gap {gap:?}\n{}",
        ctx()
    );
    assert!(
        took < Duration::from_secs(2),
        "switchover took {took:?}\n{}",
        ctx()
    );
    let st = status_json(url, "svc");
    assert_eq!(st["holder"], target.as_str(), "{st}");

    // Without --to: the best candidate, someone other than the holder.
    let o = run(&["switchover", "svc", "--store", url]);
    assert!(o.status.success(), "{}\n{}", text(&o), ctx());
    assert!(wait_for(Duration::from_secs(2), || starts(&ev).len() >= 3));
    assert_ne!(holder(&ev), target, "{}", ctx());
    let h = putex()
        .args(["history", "svc", "--store", url])
        .output()
        .unwrap();
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(h.contains("switchover to"), "{h}");
    assert_no_overlap(&events(&ev), &[], &ctx());
    agents.clear();
}

all_stores!(
    operator_a_pause_holds_through_a_crash_until_resume_and_health_does_not_count,
    pause_through_a_crash
);

fn pause_through_a_crash(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let sick = dir.join("sick");
    let check = format!("test ! -e {} #", sick.display());
    let mut agents = cluster(dir, url, &["n1", "n2", "n3"], &|_| {
        vec!["--healthcheck".into(), check.clone()]
    });
    let ctx = |agents: &[Agent]| dump(&agents.iter().collect::<Vec<_>>(), &ev);
    let first = holder(&ev);
    let o = run(&["pause", "svc", "--reason", "kernel update", "--store", url]);
    assert!(o.status.success(), "{}", text(&o));
    let st = status_json(url, "svc");
    assert!(
        st["paused"]
            .as_str()
            .unwrap_or("")
            .contains("kernel update"),
        "{st}"
    );
    assert_eq!(st["stale"], false, "{st}");

    // Failing checks for many rounds: no step-down, nothing stopped.
    std::fs::write(&sick, "").unwrap();
    std::thread::sleep(R * 15);
    let stops = |ev: &Path| {
        events(ev)
            .into_iter()
            .filter(|l| l.what == "stop" && l.extra != "startup")
            .count()
    };
    assert_eq!(stops(&ev), 0, "a paused holder stopped\n{}", ctx(&agents));
    std::fs::remove_file(&sick).unwrap();

    // The holder's host crashes: nobody takes over while paused.
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    let crashed = agents[i].crash();
    std::thread::sleep(unmoved_for(url));
    assert_eq!(
        starts(&ev).len(),
        1,
        "took over a paused lock\n{}",
        ctx(&agents)
    );
    let st = status_json(url, "svc");
    assert_eq!(st["holder"], first.as_str(), "{st}");
    for m in st["members"].as_array().unwrap() {
        if m["role"] == "standby" {
            assert_eq!(m["why_not"], "paused", "{st}");
        }
    }

    // A resume the dead holder cannot carry out times out (exit 5) and
    // leaves the pause; --force ends it, and a standby takes over W + G'
    // later — not before, and within the bound.
    let o = run(&["resume", "svc", "--wait", "500ms", "--store", url]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert_eq!(starts(&ev).len(), 1);
    let o = run(&[
        "resume", "svc", "--wait", "300ms", "--force", "--store", url,
    ]);
    // The revocation landed just before the command returned.
    let forced = wall_ns();
    assert!(o.status.success(), "{}", text(&o));
    // The crashed holder's member record is older than 3 T: forced at once,
    // and said so (etcd's times cannot tell: it waits --wait).
    if !url.starts_with("etcd") {
        assert!(
            text(&o).contains("resumed by force at once"),
            "{}",
            text(&o)
        );
    }
    assert!(
        wait_for(bound_for(url) * 2, || starts(&ev).len() >= 2),
        "no takeover after the forced resume\n{}",
        ctx(&agents)
    );
    let second = starts(&ev)[1].clone();
    let after = Duration::from_nanos(second.ns.saturating_sub(forced) as u64);
    eprintln!(
        "takeover {after:?} after the forced resume (bound {:?})",
        bound_for(url)
    );
    assert!(
        after >= R * 3 - Duration::from_millis(30),
        "took over {after:?} after the resume, before W"
    );
    // With members reported the bound grows by D = 2 R (`putex check`).
    assert!(
        after <= bound_for(url) + R * 2 + Duration::from_millis(500),
        "took {after:?}"
    );
    assert_no_overlap(&events(&ev), &[(first, crashed)], &ctx(&agents));
    agents.clear();
}

// O2 through a restart of putex itself (an upgrade, a crash, a reboot of
// the primary during maintenance): the restarted agent of a paused holder
// takes its record back and stops nothing; after a resume it holds on with
// no failover. The other side: unpaused, the same restart makes the
// start-up stop (S5).
all_stores!(
    operator_a_paused_holder_restarted_stops_nothing,
    restart_while_paused
);

fn restart_while_paused(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let mut agents = cluster(dir, url, &["n1", "n2"], &no_flags);
    let ctx = |agents: &[Agent]| dump(&agents.iter().collect::<Vec<_>>(), &ev);
    let first = holder(&ev);
    let o = run(&[
        "pause", "svc", "--reason", "upgrade", "--wait", "5s", "--store", url,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stops_of = |node: &str| {
        events(&ev)
            .into_iter()
            .filter(|l| l.what == "stop" && l.node == node)
            .count()
    };
    let stops_before = stops_of(&first);

    // putex dies on the holder (agent and keeper) and starts again.
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    let spec = agents[i].spec.clone();
    // A crashed agent is dropped (its leftovers reaped) before the new one
    // starts under the same keeper directory.
    let restart = |agents: &mut Vec<Agent>| {
        let mut old = agents.remove(i);
        old.crash();
        drop(old);
        agents.insert(i, start(spec.clone()));
    };
    restart(&mut agents);
    assert!(
        wait_for(Duration::from_secs(5), || agents[i]
            .log_text()
            .contains("took back this node's paused record")),
        "the restarted holder did not take its paused record back\n{}",
        ctx(&agents)
    );
    std::thread::sleep(R * 10);
    assert_eq!(
        stops_of(&first),
        stops_before,
        "the restart stopped the paused service\n{}",
        ctx(&agents)
    );
    let st = status_json(url, "svc");
    assert_eq!(st["holder"], first.as_str(), "{st}");
    assert!(
        st["paused"].as_str().unwrap_or("").contains("upgrade"),
        "{st}"
    );

    // Resumed: the same node holds on, nothing failed over or stopped.
    let o = run(&["resume", "svc", "--wait", "5s", "--store", url]);
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(unmoved_for(url));
    assert_eq!(
        starts(&ev).len(),
        1,
        "a failover after the resume\n{}",
        ctx(&agents)
    );
    assert_eq!(stops_of(&first), stops_before, "{}", ctx(&agents));
    let st = status_json(url, "svc");
    assert_eq!(st["holder"], first.as_str(), "{st}");
    assert!(st["paused"].is_null(), "{st}");

    // The other side: unpaused, the same restart stops the service first.
    restart(&mut agents);
    assert!(
        wait_for(Duration::from_secs(5), || stops_of(&first) > stops_before),
        "an unpaused restart made no start-up stop\n{}",
        ctx(&agents)
    );
    agents.clear();
}

all_stores!(
    operator_a_resumed_holder_stops_on_failed_checks_again,
    a_resumed_holder_stops_on_failed_checks_again
);

fn a_resumed_holder_stops_on_failed_checks_again(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let sick = dir.join("sick");
    let check = format!("test ! -e {} #", sick.display());
    let mut agents = cluster(dir, url, &["n1", "n2"], &|_| {
        vec![
            "--healthcheck".into(),
            check.clone(),
            "--unhealthy".into(),
            "2".into(),
        ]
    });
    let o = run(&["pause", "svc", "--store", url]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(&sick, "").unwrap();
    std::thread::sleep(R * 10);
    let o = run(&["resume", "svc", "--store", url]);
    assert!(o.status.success(), "{}", text(&o));
    // Resumed: every rule holds again. Within its start grace the failed
    // checks skip renewals (H2) and the licence ends (H1); afterwards K of
    // them would step it down. Either way its service stops.
    assert!(
        wait_for(Duration::from_secs(5), || events(&ev)
            .iter()
            .any(|l| l.what == "stop" && l.extra != "startup")),
        "a resumed holder ignored failing checks\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    agents.clear();
}

all_stores!(
    operator_priority_zero_never_takes_over,
    priority_zero_never_takes_over
);

fn priority_zero_never_takes_over(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let mut agents = cluster(dir, url, &["n1"], &no_flags);
    let mut flags = hooks(&ev);
    flags.extend(["--priority".into(), "0".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    agents.push(start(fast(dir, url, "svc", "n2", &flags)));
    std::thread::sleep(R * 8);
    let st = status_json(url, "svc");
    let n2 = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node"] == "n2")
        .cloned()
        .unwrap();
    assert_eq!(n2["priority"], 0, "{st}");
    let crashed = agents[0].crash();
    std::thread::sleep(unmoved_for(url));
    // (n1 itself may have restarted its service before the crash: a lapse
    // on a loaded host; only n2 matters here.)
    let by = |node: &str| starts(&ev).iter().filter(|s| s.node == node).count();
    assert_eq!(
        by("n2"),
        0,
        "a priority-0 node took over\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    // The other side: a node with priority 1 does take over.
    let mut flags = hooks(&ev);
    flags.extend(["--priority".into(), "1".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    agents.push(start(fast(dir, url, "svc", "n3", &flags)));
    assert!(
        wait_for(bound_for(url) * 4, || by("n3") >= 1),
        "nobody took over\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert_eq!(by("n2"), 0);
    assert_no_overlap(&events(&ev), &[("n1".into(), crashed)], "");
    agents.clear();
}

/// `--position` reads `pos-NODE` in `dir`.
fn position_flags(dir: &Path, max_lag: Option<u64>) -> impl Fn(&str) -> Vec<String> + '_ {
    move |n: &str| {
        let mut f = vec![
            "--position".into(),
            format!("cat {}/pos-{n}", dir.display()),
        ];
        if let Some(l) = max_lag {
            f.extend(["--max-lag".into(), l.to_string()]);
        }
        f
    }
}

all_stores!(
    operator_the_most_advanced_standby_takes_over,
    the_most_advanced_standby_takes_over
);

fn the_most_advanced_standby_takes_over(url: &str, dir: &Path) {
    let ev = dir.join("events");
    for n in ["n1", "n2", "n3"] {
        std::fs::write(dir.join(format!("pos-{n}")), "100").unwrap();
    }
    let flags = position_flags(dir, None);
    let mut agents = cluster(dir, url, &["n1", "n2", "n3"], &flags);
    let first = holder(&ev);
    let others: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != first)
        .collect();
    // The lower node id is the more advanced: not the tie-break's pick.
    std::fs::write(dir.join(format!("pos-{}", others[0])), "90").unwrap();
    std::fs::write(dir.join(format!("pos-{}", others[1])), "50").unwrap();
    await_positions(url, &[(others[0], 90), (others[1], 50)]);
    let crashed = {
        let i = agents.iter().position(|a| a.node() == first).unwrap();
        agents[i].crash()
    };
    assert!(
        wait_for(bound_for(url) * 3, || starts(&ev).len() >= 2),
        "no takeover\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert_eq!(
        starts(&ev)[1].node,
        others[0],
        "not the most advanced\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert_no_overlap(&events(&ev), &[(first, crashed)], "");
    agents.clear();
}

all_stores!(
    operator_beyond_max_lag_nobody_takes_over_and_status_says_why,
    beyond_max_lag_nobody_takes_over_and_status_says_why
);

fn beyond_max_lag_nobody_takes_over_and_status_says_why(url: &str, dir: &Path) {
    let ev = dir.join("events");
    for n in ["n1", "n2", "n3"] {
        std::fs::write(dir.join(format!("pos-{n}")), "100").unwrap();
    }
    let flags = position_flags(dir, Some(5));
    let mut agents = cluster(dir, url, &["n1", "n2", "n3"], &flags);
    let first = holder(&ev);
    let others: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != first)
        .collect();
    for n in &others {
        std::fs::write(dir.join(format!("pos-{n}")), "80").unwrap();
    }
    await_positions(url, &[(others[0], 80), (others[1], 80)]);
    // Both standbys' records say how far behind they are and why they
    // would not take over. Waited for, not read once: `--position` runs
    // under half of R (50 ms here), and a sample that misses it beside the
    // rest of the suite publishes "position unknown" until the next one.
    let says_why = |st: &serde_json::Value| {
        st["members"].as_array().is_some_and(|ms| {
            let standbys: Vec<_> = ms.iter().filter(|m| m["role"] == "standby").collect();
            standbys.len() == 2
                && standbys.iter().all(|m| {
                    m["lag"] == 20 && m["why_not"].as_str().unwrap_or("").contains("lagging 20")
                })
        })
    };
    assert!(
        wait_for(Duration::from_secs(10), || says_why(&status_json(
            url, "svc"
        ))),
        "the standbys' lag is not in status: {}",
        status_json(url, "svc")
    );
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    agents[i].crash();
    // Well past the point where the dead holder's record went silent.
    std::thread::sleep(unmoved_for(url) + R * 10);
    assert_eq!(
        starts(&ev).len(),
        1,
        "a lagging standby took over\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    // Caught up: taken over.
    for n in ["n1", "n2", "n3"].into_iter().filter(|n| *n != first) {
        std::fs::write(dir.join(format!("pos-{n}")), "100").unwrap();
    }
    assert!(
        wait_for(bound_for(url) * 4, || starts(&ev).len() >= 2),
        "nobody took over once caught up\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    agents.clear();
}

all_stores!(
    operator_a_crashed_holder_rejoins_before_it_may_take_over,
    a_crashed_holder_rejoins_before_it_may_take_over
);

fn a_crashed_holder_rejoins_before_it_may_take_over(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let rejoins = dir.join("rejoins");
    let rejoin = |ok: bool| -> Vec<String> {
        vec![
            "--rejoin".into(),
            format!(
                "echo $PUTEX_NODE $PUTEX_HOLDER >> {}; {}",
                rejoins.display(),
                if ok { "true" } else { "false" }
            ),
        ]
    };
    let mut a = cluster(dir, url, &["n1"], &|_| rejoin(false));
    let mut flags = hooks(&ev);
    flags.extend(rejoin(true));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    a.push(start(fast(dir, url, "svc", "n2", &flags)));
    std::thread::sleep(R * 5);
    // n1 holds; its host crashes; n2 takes over.
    let crashed = a[0].crash();
    assert!(
        wait_for(bound_for(url) * 3, || starts(&ev).len() >= 2),
        "no takeover"
    );
    // n1 restarts with a rejoin hook that fails: never eligible.
    let mut flags = hooks(&ev);
    flags.extend(rejoin(false));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // The old agent's drop kills what runs under its keeper directory:
    // gone before the new one starts there.
    drop(a.remove(0));
    a.insert(0, start(fast(dir, url, "svc", "n1", &flags)));
    std::thread::sleep(R * 10);
    let crashed2 = a[1].crash();
    std::thread::sleep(unmoved_for(url));
    assert_eq!(
        starts(&ev).len(),
        2,
        "a node that has not rejoined took over\n{}",
        dump(&a.iter().collect::<Vec<_>>(), &ev)
    );
    let ran = std::fs::read_to_string(&rejoins).unwrap_or_default();
    assert!(
        ran.contains("n1 n2"),
        "rejoin hook not run against n2: {ran}"
    );
    let st = status_json(url, "svc");
    let n1 = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node"] == "n1")
        .cloned()
        .unwrap();
    assert_eq!(n1["why_not"], "rejoining", "{st}");
    // Restarted with a rejoin hook that succeeds: eligible, takes over.
    a[0].crash();
    let mut flags = hooks(&ev);
    flags.extend(rejoin(true));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // The old agent's drop kills what runs under its keeper directory:
    // gone before the new one starts there.
    drop(a.remove(0));
    a.insert(0, start(fast(dir, url, "svc", "n1", &flags)));
    assert!(
        wait_for(bound_for(url) * 4, || starts(&ev).len() >= 3),
        "a rejoined node did not take over\n{}",
        dump(&a.iter().collect::<Vec<_>>(), &ev)
    );
    assert_no_overlap(
        &events(&ev),
        &[("n1".into(), crashed), ("n2".into(), crashed2)],
        "",
    );
    a.clear();
}

all_stores!(
    operator_follow_runs_on_each_standby_with_the_new_holders_address,
    follow_runs_on_each_standby_with_the_new_holders_address
);

fn follow_runs_on_each_standby_with_the_new_holders_address(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let follows = dir.join("follows");
    let f = follows.display().to_string();
    let mut agents = cluster(dir, url, &["n1", "n2", "n3"], &|n| {
        vec![
            "--advertise".into(),
            format!("{n}.example:5432"),
            "--follow".into(),
            format!("echo $PUTEX_NODE $PUTEX_HOLDER $PUTEX_HOLDER_ADDR >> {f}"),
        ]
    });
    let first = holder(&ev);
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    agents[i].crash();
    assert!(
        wait_for(bound_for(url) * 3, || starts(&ev).len() >= 2),
        "no takeover"
    );
    let second = holder(&ev);
    let line = |n: &str| format!("{n} {second} {second}.example:5432");
    let standby = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| *n != first && *n != second)
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(3), || std::fs::read_to_string(&follows)
            .unwrap_or_default()
            .contains(&line(standby))),
        "no follow of {second} on {standby}: {}",
        std::fs::read_to_string(&follows).unwrap_or_default()
    );
    agents.clear();
}

/// A standby whose follow hook keeps failing says so, with the hook's
/// last stderr line, in `putex status` (its `why_not`, after what keeps
/// it from taking over), and stops saying it once a follow succeeds. One store: nothing here depends on it.
#[test]
fn operator_a_failing_follow_says_why_in_status() {
    let _slot = timing_slot();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let url = format!("sqlite://{}", dir.join("store.db").display());
    let ok = dir.join("follow-ok");
    let mut agents = cluster(dir, &url, &["n1", "n2"], &|_| {
        vec![
            "--follow".into(),
            format!(
                "[ -e {} ] && exit 0; echo 'FATAL:  requested WAL segment 3 has already been removed' >&2; exit 3",
                ok.display()
            ),
        ]
    });
    let first = holder(&dir.join("events"));
    let standby = if first == "n1" { "n2" } else { "n1" };
    let why_not = || {
        let st = status_json(&url, "svc");
        st["members"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["node"] == standby).cloned())
            .and_then(|m| m["why_not"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let failing =
        "follow failing: exit 3: FATAL:  requested WAL segment 3 has already been removed";
    assert!(
        wait_for(Duration::from_secs(10), || why_not()
            == format!("held by {first}; {failing}")),
        "the standby's status never said its follow fails: {}",
        why_not()
    );
    std::fs::write(&ok, "").unwrap();
    // The follow is tried again every T.
    assert!(
        wait_for(bound_for(&url) * 2, || why_not()
            == format!("held by {first}")),
        "the standby still says its follow fails after one succeeded: {}",
        why_not()
    );
    agents.clear();
}

all_stores!(
    operator_a_joining_standby_follows_only_after_its_start_up_stop,
    follows_only_after_the_start_up_stop
);

/// A standby that joins while a holder runs follows it only once its own
/// start-up stop has finished: a follow that started the service (a
/// replica) beside that stop would have it stopped under it. (Found by the
/// PostgreSQL pause test in CI: a joining replica's start-up `pg_ctl stop`
/// stopped the server its follow had just started.) The start-up stop here
/// takes 0.5 s; the follow must come after it, and come.
fn follows_only_after_the_start_up_stop(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let mut agents = cluster(dir, url, &["n1"], &no_flags);
    let e = ev.display();
    let flags = [
        "--activate".to_owned(),
        format!("echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"),
        "--deactivate".into(),
        format!("sleep 0.5; echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
        "--follow".into(),
        format!("echo follow $PUTEX_NODE $(date +%s%N) $PUTEX_HOLDER >> {e}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    agents.push(start(fast(dir, url, "svc", "n2", &flags)));
    let line = |what: &str| {
        events(&ev)
            .into_iter()
            .find(|l| l.what == what && l.node == "n2")
    };
    assert!(
        wait_for(Duration::from_secs(10), || line("follow").is_some()
            && line("stop").is_some()),
        "n2 never followed n1 after a start-up stop\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let (follow, stop) = (line("follow").unwrap(), line("stop").unwrap());
    assert_eq!(stop.extra, "startup");
    assert!(
        follow.ns >= stop.ns,
        "n2 followed {:?} before its start-up stop ended\n{}",
        Duration::from_nanos(u64::try_from(stop.ns - follow.ns).unwrap_or(u64::MAX)),
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert_eq!(follow.extra, "n1");
    agents.clear();
}

all_stores!(
    operator_a_follow_still_running_at_a_takeover_is_over_before_the_service_starts,
    a_follow_still_running_at_a_takeover_is_over_before_the_service_starts
);

/// A standby whose follow hook still runs when the holder dies takes over,
/// and its follow's whole tree is killed, and gone, before anything of the
/// new tenure starts: a follow that went on would stop or rewind the
/// service this node now runs. (Found by the PostgreSQL fencing test: a
/// replica promoted while its follow was still at work was stopped by that
/// follow, to be rewound, a second after its promotion.) Both sides: the
/// standby does take over, and its activate hook finds no follow running.
fn a_follow_still_running_at_a_takeover_is_over_before_the_service_starts(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let mut agents = cluster(dir, url, &["n1"], &no_flags);
    // The activate hook notes the follow's `sleep` if it is alive (a
    // zombie not reaped yet has ended).
    let (e, pid) = (ev.display(), dir.join("follow.pid"));
    let p = pid.display();
    let flags = [
        "--activate".to_owned(),
        format!(
            "s=$(cut -d' ' -f3 /proc/$(cat {p})/stat 2>/dev/null); \
             [ -n \"$s\" ] && [ \"$s\" != Z ] && echo beside-follow $PUTEX_NODE $(date +%s%N) $s >> {e}; \
             echo start $PUTEX_NODE $(date +%s%N) $PUTEX_TOKEN >> {e}"
        ),
        "--deactivate".into(),
        format!("echo stop $PUTEX_NODE $(date +%s%N) $PUTEX_STOP >> {e}"),
        "--follow".into(),
        format!(
            "echo follow $PUTEX_NODE $(date +%s%N) $PUTEX_HOLDER >> {e}; \
             sleep 3600 & echo $! > {p}; wait"
        ),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    agents.push(start(fast(dir, url, "svc", "n2", &flags)));
    let follow_pid = || {
        std::fs::read_to_string(&pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .filter(|p| crate::common::agent::sleeps("3600").contains(p))
    };
    assert!(
        wait_for(Duration::from_secs(10), || follow_pid().is_some()),
        "n2 never began to follow n1\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let follow_pid = follow_pid().unwrap();
    agents[0].crash();
    assert!(
        wait_for(bound_for(url) * 3, || starts(&ev)
            .iter()
            .any(|s| s.node == "n2")),
        "n2 did not take over from a crashed n1 while following it\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let beside: Vec<_> = events(&ev)
        .into_iter()
        .filter(|l| l.what == "beside-follow")
        .collect();
    assert!(
        beside.is_empty(),
        "n2's service started while its follow hook still ran: {beside:?}\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert!(
        !crate::common::agent::sleeps("3600").contains(&follow_pid),
        "the follow hook's child outlived the takeover"
    );
    agents.clear();
}

all_stores!(
    operator_a_scheduled_switchover_waits_and_a_cancelled_one_never_happens,
    a_scheduled_switchover_waits_and_a_cancelled_one_never_happens
);

fn a_scheduled_switchover_waits_and_a_cancelled_one_never_happens(url: &str, dir: &Path) {
    let ev = dir.join("events");
    // R = 500 ms: at 100 ms a loaded machine (CI) delayed a renewal past
    // T, and at 250 ms on etcd beside a busy loop; the failover that
    // follows is no scheduled switchover.
    let mut agents = cluster(dir, url, &["n1", "n2"], &|_| {
        vec!["--renew".into(), "500ms".into()]
    });
    let first = holder(&ev);
    let other = if first == "n1" { "n2" } else { "n1" };
    // Scheduled 3 s out and withdrawn after 0.5 s: nothing moves. (The
    // withdrawal is a process of its own, slow to start on a loaded
    // machine: 3 s leaves it time.)
    let url_s = url.to_owned();
    let other_s = other.to_string();
    let pending = std::thread::spawn(move || {
        run(&[
            "switchover",
            "svc",
            "--to",
            &other_s,
            "--at",
            "3s",
            "--wait",
            "4s",
            "--store",
            &url_s,
        ])
    });
    std::thread::sleep(Duration::from_millis(500));
    let o = run(&["switchover", "svc", "--cancel", "--store", url]);
    assert!(o.status.success(), "{}", text(&o));
    let o = pending.join().unwrap();
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert_eq!(
        starts(&ev).len(),
        1,
        "a cancelled switchover happened\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    // Scheduled 1 s out: not before, and then it happens.
    let asked = wall_ns();
    let o = run(&[
        "switchover",
        "svc",
        "--to",
        other,
        "--at",
        "1s",
        "--store",
        url,
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        text(&o),
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert!(wait_for(Duration::from_secs(2), || starts(&ev).len() >= 2));
    let s = starts(&ev);
    assert_eq!(s.len(), 2);
    let after = Duration::from_nanos((s[1].ns - asked) as u64);
    assert!(
        after >= Duration::from_secs(1),
        "switched {after:?} after asking\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    assert!(
        after < Duration::from_secs(3),
        "switched {after:?} after asking\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    println!("scheduled 1 s out: switched {after:?} after asking");
    agents.clear();
}

all_stores!(
    operator_a_lagging_target_catches_up_or_does_not_take_the_lock,
    a_lagging_target_catches_up_or_does_not_take_the_lock
);

/// O1 with `--max-lag`, both sides. A target behind is handed the lock and
/// takes it once its position caught up with what the stopped holder wrote
/// last (here: its position is 100 once a graceful stop is in the events,
/// as a replica's is once the old primary's last WAL arrived); a target
/// that does not catch up within 2 R takes nothing, the command says so and
/// the old holder takes the lock back; `--allow-lag` hands over at once.
fn a_lagging_target_catches_up_or_does_not_take_the_lock(url: &str, dir: &Path) {
    let ev = dir.join("events");
    let caught_up = dir.join("caught-up");
    for n in ["n1", "n2"] {
        std::fs::write(dir.join(format!("pos-{n}")), "100").unwrap();
    }
    let position = |n: &str| {
        vec![
            "--position".into(),
            format!(
                "if [ -e {c} ] && grep -q '^stop .* graceful$' {e}; then echo 100; \
                 else cat {d}/pos-{n}; fi",
                c = caught_up.display(),
                e = ev.display(),
                d = dir.display()
            ),
            "--max-lag".into(),
            "5".into(),
        ]
    };
    let mut agents = cluster(dir, url, &["n1", "n2"], &position);
    let ctx = |agents: &[Agent]| dump(&agents.iter().collect::<Vec<_>>(), &ev);
    let first = holder(&ev);
    let first = first.as_str();
    let other = if first == "n1" { "n2" } else { "n1" };

    // Caught up after the holder's stop: taken.
    std::fs::write(dir.join(format!("pos-{other}")), "50").unwrap();
    std::fs::write(&caught_up, "").unwrap();
    await_positions(url, &[(other, 50)]);
    let asked = Instant::now();
    let o = run(&["switchover", "svc", "--to", other, "--store", url]);
    assert!(o.status.success(), "{}\n{}", text(&o), ctx(&agents));
    eprintln!(
        "switched over to a target 50 behind in {:?}",
        asked.elapsed()
    );
    assert_eq!(holder(&ev), other, "{}", ctx(&agents));
    assert_eq!(starts(&ev).len(), 2);

    // Never caught up: not taken; the old holder takes the lock back.
    std::fs::remove_file(&caught_up).unwrap();
    std::fs::write(dir.join(format!("pos-{other}")), "100").unwrap();
    std::fs::write(dir.join(format!("pos-{first}")), "50").unwrap();
    await_positions(url, &[(first, 50), (other, 100)]);
    let o = run(&["switchover", "svc", "--to", first, "--store", url]);
    assert_eq!(o.status.code(), Some(1), "{}\n{}", text(&o), ctx(&agents));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        err.contains(&format!("handed it to {first}, which did not take it")),
        "{}",
        text(&o)
    );
    assert!(
        wait_for(Duration::from_secs(5), || starts(&ev).len() >= 3),
        "nobody took the lock back\n{}",
        ctx(&agents)
    );
    std::thread::sleep(R * 5);
    let s = starts(&ev);
    assert_eq!(s.len(), 3, "{}", ctx(&agents));
    assert_eq!(
        s[2].node,
        other,
        "the target 50 behind took it\n{}",
        ctx(&agents)
    );

    // --allow-lag: at once, whatever the lag.
    let o = run(&[
        "switchover",
        "svc",
        "--to",
        first,
        "--allow-lag",
        "--store",
        url,
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), ctx(&agents));
    assert!(wait_for(Duration::from_secs(2), || starts(&ev).len() >= 4));
    assert_eq!(holder(&ev), first);
    agents.clear();
}

all_stores!(
    operator_failback_after_the_hold_down_and_not_before,
    failback_after_the_hold_down_and_not_before
);

fn failback_after_the_hold_down_and_not_before(url: &str, dir: &Path) {
    let ev = dir.join("events");
    // n2 (priority 1) holds; n1 (priority 2) joins later.
    let mut agents = cluster(dir, url, &["n2"], &|_| {
        vec!["--failback-after".into(), "1500ms".into()]
    });
    let mut flags = hooks(&ev);
    flags.extend(["--priority".into(), "2".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let joined = wall_ns();
    agents.push(start(fast(dir, url, "svc", "n1", &flags)));
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(starts(&ev).len(), 1, "failed back before the hold-down");
    assert!(
        wait_for(Duration::from_secs(4), || starts(&ev).len() >= 2),
        "no failback\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let back = starts(&ev)[1].clone();
    assert_eq!(back.node, "n1");
    let after = Duration::from_nanos((back.ns - joined) as u64);
    eprintln!("failback {after:?} after the preferred node started");
    assert!(after >= Duration::from_millis(1500), "{after:?}");
    // The handover's history entry is written beside the start, not
    // before it (CI, etcd: not yet there when read at once).
    let history = || {
        let h = putex()
            .args(["history", "svc", "--store", url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&h.stdout).into_owned()
    };
    assert!(
        wait_for(Duration::from_secs(5), || history()
            .contains("failback to n1")),
        "{}",
        history()
    );
    assert_no_overlap(&events(&ev), &[], "");
    agents.clear();
}

mod operator_a_switchover_to_a_target_cut_off_from_the_store_ends_with_one_holder {
    use super::*;

    #[test]
    fn nats() {
        let server = Backend::nats();
        let _slot = timing_slot();
        let dir = tempfile::tempdir().unwrap();
        switchover_to_a_cut_off_target(&server, dir.path());
    }

    #[test]
    fn etcd() {
        let server = Backend::etcd();
        let _slot = timing_slot();
        let dir = tempfile::tempdir().unwrap();
        switchover_to_a_cut_off_target(&server, dir.path());
    }
}

/// The store of `server`, with n3 reaching it through a fault proxy that is
/// cut just before the operator asks to switch to n3.
fn switchover_to_a_cut_off_target(server: &Backend, dir: &Path) {
    use crate::common::proxy::{Mode, Proxy};
    let url = &server.url();
    let ev = dir.join("events");
    let proxy = Proxy::start_blocking(server.addr()).unwrap();
    let via = server.url_via(proxy.addr());
    // n1 and n2 direct; n3 through the proxy. n3 must not be the holder.
    let mut agents = cluster(dir, url, &["n1", "n2"], &no_flags);
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    agents.push(start(fast(dir, &via, "svc", "n3", &flags)));
    std::thread::sleep(R * 8);
    let first = holder(&ev);
    assert_ne!(first, "n3");
    // The target is cut off just before the request: its member record
    // still looks fresh, so the holder hands over to it. It never sees the
    // release; after the hold D the others take it as an ordinary one.
    proxy.set(Mode::Blackhole);
    let o = run(&[
        "switchover",
        "svc",
        "--to",
        "n3",
        "--wait",
        "2s",
        "--store",
        url,
    ]);
    assert!(matches!(o.status.code(), Some(1) | Some(5)), "{}", text(&o));
    // Whether the holder handed over (the release sat unclaimed for D) or
    // refused, one node holds the lock again within the bound.
    std::thread::sleep(bound_for(url) * 3);
    let s = starts(&ev);
    let last = s.last().unwrap();
    assert_ne!(
        last.node,
        "n3",
        "the cut-off target started\n{}",
        dump(&agents.iter().collect::<Vec<_>>(), &ev)
    );
    let st = status_json(url, "svc");
    assert_eq!(st["state"], "active", "{st}");
    assert_no_overlap(
        &events(&ev),
        &[],
        &dump(&agents.iter().collect::<Vec<_>>(), &ev),
    );
    proxy.set(Mode::Pass);
    agents.clear();
}
