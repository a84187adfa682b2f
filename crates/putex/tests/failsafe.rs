//! Failsafe, a member's side (`docs/failsafe-design.md`, F1, F5): a
//! `putex run --failsafe` standby answers a holder's signed ask on its
//! `--http` listener from its state machine — a grant for the holder whose
//! record it saw last, a refusal otherwise, both signed — and rejects what
//! its key did not sign. On a real nats-server and a real etcd.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use putex::failsafe::auth::{Ask, FailsafeKey, Holder, Peer, SignedAnswer};

use crate::agent_http::{on_nats_and_etcd, two_agents_with_http_flags};
use crate::common::agent::status_json;

/// `POST path` with a JSON body: (status, body).
fn http_post(port: u16, path: &str, body: &str) -> (u16, String) {
    crate::agent_http::http_post(port, path, body).expect("an answer")
}

/// A key file with `secret`, mode 600.
fn key_file(dir: &std::path::Path, name: &str, secret: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, secret).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

on_nats_and_etcd!(
    failsafe_a_standby_grants_its_holder_and_refuses_what_it_must,
    a_standby_grants_its_holder_and_refuses_what_it_must
);

fn a_standby_grants_its_holder_and_refuses_what_it_must(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = key_file(dir.path(), "key", "0123456789abcdef0123456789abcdef\n");
    let key = FailsafeKey::from_file(&path).unwrap();
    let other = FailsafeKey::from_file(&key_file(
        dir.path(),
        "other",
        "another key of thirty-two bytes or more",
    ))
    .unwrap();
    let flags = ["--failsafe", "--failsafe-key-file", path.to_str().unwrap()];
    let nodes = ["n1", "n2"];
    let (ports, agents, active) = two_agents_with_http_flags(dir.path(), url, "svc", nodes, &flags);
    let standby = 1 - active;
    let machine = putex::identity::machine_id();
    // Each member record says where holders ask it, with which key.
    let published = |st: &serde_json::Value| {
        st["members"].as_array().is_some_and(|ms| {
            ms.len() == 2
                && ms.iter().all(|m| {
                    let i = nodes.iter().position(|n| m["node"] == *n).unwrap();
                    m["machine"] == machine.as_str()
                        && m["failsafe"]["key"] == key.fingerprint().as_str()
                        && m["failsafe"]["url"]
                            == format!("http://127.0.0.1:{}/v1/failsafe/svc", ports[i]).as_str()
                })
        })
    };
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(10), || published(&status_json(
            url, "svc"
        ))),
        "the members' failsafe endpoints are not in status: {}",
        status_json(url, "svc")
    );
    let st = status_json(url, "svc");
    let ask = |holder: &str, instance: &str, member: &str| Ask {
        lock: "svc".into(),
        holder: Holder {
            node: holder.into(),
            machine: machine.clone(),
            instance: instance.into(),
        },
        token: st["token"].as_str().unwrap().into(),
        round: 1,
        member: Peer {
            node: member.into(),
            machine: machine.clone(),
        },
    };
    let instance = st["instance"].as_str().unwrap().to_owned();
    let post = |port: u16, key: &FailsafeKey, ask: &Ask| {
        http_post(
            port,
            "/v1/failsafe/svc",
            &serde_json::to_string(&key.sign_ask(ask)).unwrap(),
        )
    };
    let answer = |body: &str| -> SignedAnswer { serde_json::from_str(body).unwrap() };
    let logs = || {
        format!(
            "--- {} ---\n{}\n--- {} ---\n{}",
            nodes[0],
            agents[0].log_text(),
            nodes[1],
            agents[1].log_text()
        )
    };

    // The holder whose record the standby saw last: granted, signed.
    let theirs = ask(nodes[active], &instance, nodes[standby]);
    let (status, body) = post(ports[standby], &key, &theirs);
    assert_eq!(status, 200, "{body}\n{}", logs());
    let signed = answer(&body);
    let granted = key.verify_answer(&signed).expect("signed with the key");
    assert!(granted.granted, "{body}");
    assert_eq!(granted.ask, theirs);
    assert!(other.verify_answer(&signed).is_err());

    // Another instance of the holder's node: refused, and why.
    let (status, body) = post(
        ports[standby],
        &key,
        &ask(nodes[active], "an-older-instance", nodes[standby]),
    );
    assert_eq!(status, 200, "{body}");
    let refused = answer(&body);
    let refused = key.verify_answer(&refused).unwrap();
    assert!(!refused.granted, "{body}");
    assert!(
        refused
            .why
            .as_deref()
            .unwrap_or("")
            .contains("newest record"),
        "{body}"
    );

    // The holder itself refuses: it holds the lock.
    let (status, body) = post(
        ports[active],
        &key,
        &ask(nodes[standby], "x", nodes[active]),
    );
    assert_eq!(status, 200, "{body}");
    let held = answer(&body);
    assert!(!key.verify_answer(&held).unwrap().granted, "{body}");

    // Not signed with the members' key: 401, nothing asked of the core.
    let (status, body) = post(ports[standby], &other, &theirs);
    assert_eq!(status, 401, "{body}");
    // Addressed to another member, or another lock.
    let (status, body) = post(ports[standby], &key, &ask(nodes[active], &instance, "n9"));
    assert_eq!(status, 409, "{body}");
    let mut elsewhere = theirs.clone();
    elsewhere.lock = "other".into();
    let (status, body) = http_post(
        ports[standby],
        "/v1/failsafe/other",
        &serde_json::to_string(&key.sign_ask(&elsewhere)).unwrap(),
    );
    assert_eq!(status, 404, "{body}");

    // Counted (F6).
    let (_, metrics) = crate::agent_http::http_get(ports[standby], "/metrics").unwrap();
    for (answer, at_least) in [("granted", 1), ("refused", 1), ("rejected", 3)] {
        let line = format!("putex_failsafe_answers_total{{answer=\"{answer}\"}} ");
        let n: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} missing in\n{metrics}"));
        assert!(n >= f64::from(at_least), "{line}{n}");
    }
}

on_nats_and_etcd!(
    failsafe_grants_hold_a_standbys_takeover_back_until_they_stop,
    grants_hold_a_standbys_takeover_back_until_they_stop
);

/// F1 (a, b), both sides: the holder dies; while it keeps being granted
/// (asks sent every 50 ms, as a holder cut off from the store would) the
/// standby does not take over — each grant is an observation of the
/// holder; once the grants stop, it takes over.
fn grants_hold_a_standbys_takeover_back_until_they_stop(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = key_file(dir.path(), "key", "0123456789abcdef0123456789abcdef");
    let key = FailsafeKey::from_file(&path).unwrap();
    let flags = ["--failsafe", "--failsafe-key-file", path.to_str().unwrap()];
    let nodes = ["n1", "n2"];
    let (ports, mut agents, active) =
        two_agents_with_http_flags(dir.path(), url, "svc", nodes, &flags);
    let standby = 1 - active;
    let st = status_json(url, "svc");
    let machine = putex::identity::machine_id();
    let ask = Ask {
        lock: "svc".into(),
        holder: Holder {
            node: nodes[active].into(),
            machine: machine.clone(),
            instance: st["instance"].as_str().unwrap().into(),
        },
        token: st["token"].as_str().unwrap().into(),
        round: 1,
        member: Peer {
            node: nodes[standby].into(),
            machine,
        },
    };
    let body = serde_json::to_string(&key.sign_ask(&ask)).unwrap();
    agents[active].crash();
    let crashed = Instant::now();
    let primary =
        || crate::agent_http::http_get(ports[standby], "/primary").is_some_and(|(s, _)| s == 200);
    while crashed.elapsed() < Duration::from_secs(3) {
        let (status, answer) = http_post(ports[standby], "/v1/failsafe/svc", &body);
        assert_eq!(status, 200, "{answer}");
        assert!(
            key.verify_answer(&serde_json::from_str(&answer).unwrap())
                .unwrap()
                .granted
        );
        assert!(
            !primary(),
            "took over {:?} after the crash while granting\n{}",
            crashed.elapsed(),
            agents[standby].log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = Instant::now();
    while !primary() {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "no takeover after the grants stopped\n{}",
            agents[standby].log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "failsafe: granted for 3 s after the crash; took over {:?} after the last grant",
        stopped.elapsed()
    );
}

/// `putex run --failsafe … --http HTTP --lock svc` with `extra` flags: its
/// exit code and standard error (it must not start).
fn refused_run(http: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = crate::common::agent::putex()
        .args(["run", "--store", "sqlite:///nonexistent/x.db", "--failsafe"])
        .args(extra)
        .args(["--http", http, "--lock", "svc"])
        .args(["--healthcheck", "true", "--", "true"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--failsafe` without its key file, with one others may read, or on an
/// `--http` of every interface without `--failsafe-advertise`, does not
/// start, and says why.
#[test]
fn failsafe_is_refused_without_a_private_key() {
    let (code, err) = refused_run("127.0.0.1:0", &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--failsafe-key-file"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("key");
    std::fs::write(&open, "0123456789abcdef0123456789abcdef").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let flags = ["--failsafe-key-file", open.to_str().unwrap()];
    let (code, err) = refused_run("127.0.0.1:0", &flags);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, err) = refused_run("0.0.0.0:0", &flags);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--failsafe-advertise"), "{err}");
}
