//! Failsafe (`docs/failsafe-design.md`), on a real nats-server and a real
//! etcd. A member's side (F1, F5): a `putex run --failsafe` standby
//! answers a holder's signed ask on its `--http` listener from its state
//! machine — a grant for the holder whose record it saw last, a refusal
//! otherwise, both signed — and rejects what its key did not sign. A
//! holder's side (F3): the store frozen, the holder's service keeps running
//! on its member's grants and nobody else starts one; a member that cannot
//! grant (frozen, or running without failsafe) ends the licence by T; and
//! without failsafe the holder stops by T; a replayed or forged grant (a
//! middleman on the path to the member) extends nothing.

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

/// A key file made in `dir` by the command `docs/operations.md` gives
/// ("Riding out a store outage"), run as written there but for the path.
fn documented_key_file(dir: &std::path::Path) -> std::path::PathBuf {
    let command = crate::common::doc_block("operations.md", "## Riding out a store outage", "sh");
    let file = dir.join("failsafe.key");
    let command = command.replace("/etc/putex/failsafe.key", file.to_str().unwrap());
    let out = std::process::Command::new("sh")
        .args(["-c", &command])
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "the documented command failed: {command}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
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
    // A short cap: a failsafe lock's first use waits W over T + the cap.
    let flags = [
        "--failsafe",
        "--failsafe-key-file",
        path.to_str().unwrap(),
        "--failsafe-max",
        "1s",
    ];
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
    // A short cap: a failsafe lock's first use waits W over T + the cap.
    let flags = [
        "--failsafe",
        "--failsafe-key-file",
        path.to_str().unwrap(),
        "--failsafe-max",
        "1s",
    ];
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

/// How long the store is down in the outage tests (here and in
/// `postgres::failsafe`): `PUTEX_TEST_OUTAGE` seconds (the 60 s, by
/// hand), 10 s in the suite — 33 times T here.
pub(crate) fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("PUTEX_TEST_OUTAGE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
}

/// Whether, within `within`, `lock` has `n` members and every one's
/// member record names its failsafe endpoint (here and in
/// `postgres::failsafe`).
pub(crate) fn endpoints_published(url: &str, lock: &str, n: usize, within: Duration) -> bool {
    crate::common::agent::wait_for(within, || {
        status_json(url, lock)["members"]
            .as_array()
            .is_some_and(|ms| ms.len() == n && ms.iter().all(|m| m["failsafe"]["url"].is_string()))
    })
}

/// `putex run --failsafe` of `node` on lock `svc` (fast timing, `sleep
/// 1000` as its service), signing with `key`, `--failsafe-max cap`,
/// `--http` on `port`, and `extra` flags.
fn failsafe_agent(
    dir: &std::path::Path,
    url: &str,
    node: &str,
    key: &std::path::Path,
    cap: &str,
    port: u16,
    extra: &[&str],
) -> crate::common::agent::Agent {
    let http = format!("127.0.0.1:{port}");
    let mut args = vec![
        "--failsafe",
        "--failsafe-key-file",
        key.to_str().unwrap(),
        "--failsafe-max",
        cap,
        "--http",
        &http,
    ];
    args.extend(extra);
    args.extend(["--", "sleep", "1000"]);
    crate::common::agent::start(crate::common::agent::fast(dir, url, "svc", node, &args))
}

/// `/primary` of the agent on `port` answers 200.
fn primary(port: u16) -> bool {
    crate::agent_http::http_get(port, "/primary").is_some_and(|(s, _)| s == 200)
}

/// Two agents with failsafe (or without), `--http` each; once the holder
/// knows where to ask the standby: the ports, the agents, the holder.
fn pair(
    dir: &std::path::Path,
    url: &str,
    failsafe: bool,
) -> ([u16; 2], Vec<crate::common::agent::Agent>, usize) {
    let path = documented_key_file(dir);
    // The cap outlasts the outage; a failsafe lock's first use waits W
    // over T + the cap (its record may have been lost under a holder
    // running on grants), so it is no longer than that.
    let cap = format!("{}s", outage().as_secs() + 2);
    let flags: Vec<&str> = if failsafe {
        vec![
            "--failsafe",
            "--failsafe-key-file",
            path.to_str().unwrap(),
            "--failsafe-max",
            &cap,
        ]
    } else {
        Vec::new()
    };
    let (ports, agents, active) = two_agents_with_http_flags(dir, url, "svc", ["n1", "n2"], &flags);
    if failsafe {
        // Both member records name their endpoints, and the holder's
        // record carries its set (a renewal after the members were read).
        assert!(
            endpoints_published(url, "svc", 2, Duration::from_secs(10)),
            "no failsafe endpoints in status: {}\n--- n1 ---\n{}\n--- n2 ---\n{}",
            status_json(url, "svc"),
            agents[0].log_text(),
            agents[1].log_text()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    (ports, agents, active)
}

crate::common::on_stores!(timing_slot; Backend, store_down_with_failsafe_the_service_keeps_running =>
    failsafe_store_down_the_service_keeps_running_on_nats: nats,
    failsafe_store_down_the_service_keeps_running_on_etcd: etcd,
);

use crate::common::store::Backend;

/// F3, the point of it all: the whole store down (SIGSTOP) with failsafe
/// on — the holder's service runs throughout, the standby never starts
/// one, `/health` says whose grants keep it; once the store is back the
/// holder renews through it again and nothing changed hands. Then the
/// other side: the store down again, and the standby frozen too — a
/// member that cannot grant ends the licence by T.
fn store_down_with_failsafe_the_service_keeps_running(store: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = store.url();
    let (ports, agents, active) = pair(dir.path(), &url, true);
    let standby = 1 - active;
    let logs = || {
        format!(
            "--- holder ---\n{}\n--- standby ---\n{}",
            agents[active].log_text(),
            agents[standby].log_text()
        )
    };
    // F6 while the store answers: `putex status` names the set.
    let out = crate::common::agent::putex()
        .args(["status", "svc", "--store", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "failsafe: through a store outage the holder keeps its service while {} grants its asks, for at most",
            ["n1", "n2"][standby]
        )),
        "{text}"
    );
    assert_eq!(
        status_json(&url, "svc")["failsafe"]["set"],
        serde_json::json!([(["n1", "n2"][standby])])
    );
    // F6 during the outage: the holder's web page, which cannot read the
    // store, shows what its own /health says (rendered in Chromium).
    let page = format!("http://127.0.0.1:{}/ui", ports[active]);
    let holder_port = ports[active];
    let rendered = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        let dom = crate::web::render_first(&page);
        let after = crate::agent_http::http_get(holder_port, "/health");
        format!("{dom}\n/health once rendered: {after:?}")
    });
    store.pause();
    let down = Instant::now();
    let mut health = String::new();
    let mut metrics = String::new();
    while down.elapsed() < outage() {
        assert!(
            primary(ports[active]),
            "the holder stopped {:?} into the outage\n{}",
            down.elapsed(),
            logs()
        );
        assert!(!primary(ports[standby]), "two primaries\n{}", logs());
        if down.elapsed() > Duration::from_secs(1) && health.is_empty() {
            health = crate::agent_http::http_get(ports[active], "/health")
                .unwrap()
                .1;
            metrics = crate::agent_http::http_get(ports[active], "/metrics")
                .unwrap()
                .1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    store.resume();
    let dom = rendered.join().unwrap();
    assert!(
        dom.contains(&format!(
            "this holder's service runs on its members' grants, granted by {}",
            ["n1", "n2"][standby]
        )),
        "the web page during the outage does not say so:\n{dom}"
    );
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["failsafe"]["granted"], true, "{health}");
    assert_eq!(
        health["failsafe"]["members"][0]["node"],
        ["n1", "n2"][standby]
    );
    assert_eq!(health["failsafe"]["members"][0]["verdict"], "granted");
    assert!(health["failsafe"]["since"].is_string(), "{health}");
    // F6 in the metrics: the licence runs on grants.
    assert!(metrics.contains("putex_failsafe_granted 1"), "{metrics}");
    assert!(
        metrics.contains("putex_failsafe_rounds_total{result=\"granted\"}"),
        "{metrics}"
    );
    // Back on the store: renewals land, the failsafe ends, same holder.
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(10), || {
            crate::agent_http::http_get(ports[active], "/health")
                .is_some_and(|(_, b)| !b.contains("\"failsafe\""))
        }),
        "still in failsafe after the store came back\n{}",
        logs()
    );
    assert!(
        primary(ports[active]) && !primary(ports[standby]),
        "{}",
        logs()
    );
    let metrics = crate::agent_http::http_get(ports[active], "/metrics")
        .unwrap()
        .1;
    assert!(
        metrics.contains("putex_failsafe_granted 0"),
        "the gauge stayed up after the store came back: {metrics}"
    );
    eprintln!(
        "failsafe: store down {:?}, the holder's service ran throughout",
        outage()
    );
    // F6 in the history: the stretch on grants, once the store is back.
    let noted = crate::common::agent::wait_for(Duration::from_secs(10), || {
        crate::common::agent::putex_json(&["history", "svc", "--store", &url])["transitions"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["reason_code"] == "failsafe"))
    });
    let history = crate::common::agent::putex_json(&["history", "svc", "--store", &url]);
    assert!(noted, "no failsafe record in the history: {history:#}");
    let note = history["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["reason_code"] == "failsafe")
        .unwrap();
    assert_eq!(note["node"], ["n1", "n2"][active], "{note}");
    assert_eq!(note["activation"], false, "{note}");
    assert!(
        note["reason"]
            .as_str()
            .is_some_and(|r| r.contains("every round granted")),
        "{note}"
    );

    // The other side: a member that cannot answer ends the licence.
    store.pause();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    assert!(primary(ports[active]), "stopped on grants\n{}", logs());
    putex_testkit::agent::signal(agents[standby].pid(), nix::sys::signal::Signal::SIGSTOP);
    let frozen = Instant::now();
    let stopped =
        crate::common::agent::wait_for(Duration::from_secs(5), || !primary(ports[active]));
    let after = frozen.elapsed();
    putex_testkit::agent::signal(agents[standby].pid(), nix::sys::signal::Signal::SIGCONT);
    store.resume();
    assert!(
        stopped,
        "the holder kept running without its member's grant\n{}",
        logs()
    );
    // T = 300 ms; a round's asks time out in 40 ms; /primary is polled.
    assert!(
        after < Duration::from_secs(1),
        "the holder stopped {after:?} after its member froze (T = 300 ms)\n{}",
        logs()
    );
    eprintln!(
        "failsafe: member frozen {:?} into an outage; the holder stopped {after:?} later",
        down.elapsed() - after
    );
    // The history says how that stretch ended (written once the store
    // answers: the stopped holder's release).
    let lost = crate::common::agent::wait_for(Duration::from_secs(10), || {
        crate::common::agent::putex_json(&["history", "svc", "--store", &url])["transitions"]
            .as_array()
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["reason_code"] == "failsafe"
                        && t["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("a round lost at"))
                })
            })
    });
    assert!(
        lost,
        "no lost failsafe in the history: {:#}\n{}",
        crate::common::agent::putex_json(&["history", "svc", "--store", &url]),
        logs()
    );
    drop(agents);
}

crate::common::on_stores!(timing_slot; Backend, store_down_without_failsafe_the_holder_stops =>
    failsafe_off_store_down_the_holder_stops_on_nats: nats,
    failsafe_off_store_down_the_holder_stops_on_etcd: etcd,
);

/// Without failsafe nothing changes: the store down, the holder's service
/// stops by T (300 ms here), as H1 demands.
fn store_down_without_failsafe_the_holder_stops(store: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = store.url();
    let (ports, agents, active) = pair(dir.path(), &url, false);
    store.pause();
    let down = Instant::now();
    let stopped =
        crate::common::agent::wait_for(Duration::from_secs(5), || !primary(ports[active]));
    let after = down.elapsed();
    store.resume();
    assert!(stopped, "{}", agents[active].log_text());
    assert!(
        after < Duration::from_secs(1),
        "stopped {after:?} into the outage"
    );
    eprintln!("no failsafe: the holder stopped {after:?} into the outage");
}

crate::common::on_stores!(timing_slot; Backend, a_member_without_failsafe_keeps_the_holder_on_the_store =>
    failsafe_beside_a_member_without_it_the_holder_stops_on_nats: nats,
);

/// A member that runs without `--failsafe` (or a putex too old to know
/// it, which would not honour the record's set either) cannot grant: while
/// it is a live member the holder asks nobody, says why on `/health`, and
/// stops by T when the store goes down.
fn a_member_without_failsafe_keeps_the_holder_on_the_store(store: &Backend) {
    use crate::common::agent::{fast, start};
    let dir = tempfile::tempdir().unwrap();
    let url = store.url();
    let path = key_file(dir.path(), "key", "0123456789abcdef0123456789abcdef");
    let ports = crate::agent_http::two_free_ports();
    let http = ports.map(|p| format!("127.0.0.1:{p}"));
    let holder = failsafe_agent(dir.path(), &url, "n1", &path, "1s", ports[0], &[]);
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(20), || primary(ports[0])),
        "{}",
        holder.log_text()
    );
    let plain = start(fast(
        dir.path(),
        &url,
        "svc",
        "n2",
        &["--http", &http[1], "--", "sleep", "1000"],
    ));
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(10), || {
            status_json(&url, "svc")["members"]
                .as_array()
                .is_some_and(|ms| ms.len() == 2)
        }),
        "{}",
        plain.log_text()
    );
    std::thread::sleep(Duration::from_secs(1));
    store.pause();
    let down = Instant::now();
    let mut health = String::new();
    let stopped = crate::common::agent::wait_for(Duration::from_secs(5), || {
        if let Some((_, body)) = crate::agent_http::http_get(ports[0], "/health") {
            if body.contains("failsafe") {
                health = body;
            }
        }
        !primary(ports[0])
    });
    let after = down.elapsed();
    store.resume();
    assert!(stopped, "ran on grants beside n2\n{}", holder.log_text());
    assert!(
        after < Duration::from_secs(1),
        "stopped {after:?} into the outage"
    );
    assert!(
        health.contains("runs without --failsafe"),
        "/health did not say why: {health}"
    );
    eprintln!("failsafe beside a member without it: the holder stopped {after:?} into the outage");
}

/// What the [`Middleman`] in front of a member does with a holder's ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meddle {
    /// Passes it to the member and its answer back, keeping the last grant.
    Pass,
    /// Answers with the last grant it passed (an old round's), the member
    /// never asked.
    Replay,
    /// Answers with a grant of this very ask, signed with another key.
    Forge,
}

/// An HTTP middleman on the path from the holder to one member (the
/// member's `--failsafe-advertise`): one ask per connection, as the holder
/// sends them (`Connection: close`).
struct Middleman {
    port: u16,
    mode: std::sync::Arc<std::sync::Mutex<Meddle>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Middleman {
    /// In front of the member whose `--http` is on `member`; forged grants
    /// are signed with `other`.
    fn start(member: u16, other: FailsafeKey) -> Middleman {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(Meddle::Pass));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (m, s) = (mode.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut last_grant: Option<Vec<u8>> = None;
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
                // The request: headers, then Content-Length bytes of body.
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                let body_at = loop {
                    match conn.read(&mut buf) {
                        Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                        _ => break None,
                    }
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(i + 4);
                    }
                };
                let Some(body_at) = body_at else { continue };
                let head = String::from_utf8_lossy(&req[..body_at]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while req.len() < body_at + length {
                    match conn.read(&mut buf) {
                        Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                let mode = *m.lock().unwrap();
                let answer = match mode {
                    Meddle::Pass => {
                        let mut up = std::net::TcpStream::connect(("127.0.0.1", member)).unwrap();
                        up.write_all(&req).unwrap();
                        let mut answer = Vec::new();
                        let _ = up.read_to_end(&mut answer);
                        if String::from_utf8_lossy(&answer).contains("\"granted\":true") {
                            last_grant = Some(answer.clone());
                        }
                        answer
                    }
                    Meddle::Replay => last_grant.clone().unwrap_or_default(),
                    Meddle::Forge => {
                        let signed: putex::failsafe::auth::SignedAsk =
                            serde_json::from_slice(&req[body_at..]).unwrap();
                        let body = serde_json::to_string(&other.sign_answer(
                            &putex::failsafe::auth::Answer {
                                ask: signed.ask,
                                granted: true,
                                why: None,
                            },
                        ))
                        .unwrap();
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .into_bytes()
                    }
                };
                let _ = conn.write_all(&answer);
            }
        });
        Middleman {
            port,
            mode,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, mode: Meddle) {
        *self.mode.lock().unwrap() = mode;
    }
}

impl Drop for Middleman {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

crate::common::on_stores!(timing_slot; Backend, forged_and_replayed_grants_extend_nothing =>
    failsafe_forged_and_replayed_grants_extend_nothing_on_nats: nats,
);

/// F5 on real processes, both sides: a middleman on the path from the
/// holder to its member. Passing the asks through, the store frozen, the
/// holder runs on the member's grants; answering with the last grant it
/// passed (a replay of an old round's) or with a grant of the very ask
/// signed with another key, the holder stops by T, says why on `/health`,
/// and the member — never asked — takes over once the store is back.
fn forged_and_replayed_grants_extend_nothing(store: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = store.url();
    let path = key_file(dir.path(), "key", "0123456789abcdef0123456789abcdef");
    let other = FailsafeKey::from_file(&key_file(
        dir.path(),
        "other",
        "another key of thirty-two bytes or more",
    ))
    .unwrap();
    let ports = crate::agent_http::two_free_ports();
    let middleman = Middleman::start(ports[1], other);
    let http = ports.map(|p| format!("127.0.0.1:{p}"));
    let advertise = [http[0].clone(), format!("127.0.0.1:{}", middleman.port)];
    // The cap outlasts the 2 s outage on honest grants; a failsafe lock's
    // first use waits W over T + the cap.
    let agent = |i: usize, node: &str| {
        let advertise = ["--failsafe-advertise", &advertise[i]];
        failsafe_agent(dir.path(), &url, node, &path, "4s", ports[i], &advertise)
    };
    // n1 first: it holds, n2 (behind the middleman) stands by.
    let holder = agent(0, "n1");
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(60), || primary(ports[0])),
        "{}",
        holder.log_text()
    );
    let member = agent(1, "n2");
    let logs = || {
        format!(
            "--- n1 ---\n{}\n--- n2 ---\n{}",
            holder.log_text(),
            member.log_text()
        )
    };
    assert!(
        endpoints_published(&url, "svc", 2, Duration::from_secs(10)),
        "{}",
        logs()
    );
    std::thread::sleep(Duration::from_secs(1));

    // Passed through: grants, and the holder runs on them.
    store.pause();
    std::thread::sleep(Duration::from_secs(2));
    let on_grants = primary(ports[0]);
    store.resume();
    assert!(on_grants, "the holder stopped on honest grants\n{}", logs());
    assert!(
        crate::common::agent::wait_for(Duration::from_secs(10), || {
            crate::agent_http::http_get(ports[0], "/health")
                .is_some_and(|(_, b)| !b.contains("\"failsafe\""))
        }),
        "still in failsafe after the store came back\n{}",
        logs()
    );
    std::thread::sleep(Duration::from_secs(1));

    for (mode, said) in [
        (Meddle::Replay, "an answer to another ask"),
        (Meddle::Forge, "not signed with this failsafe key"),
    ] {
        assert!(primary(ports[0]) && !primary(ports[1]), "{}", logs());
        middleman.set(mode);
        store.pause();
        let down = Instant::now();
        let mut health = String::new();
        let stopped = crate::common::agent::wait_for(Duration::from_secs(5), || {
            if let Some((_, body)) = crate::agent_http::http_get(ports[0], "/health") {
                if body.contains("no valid answer") {
                    health = body;
                }
            }
            !primary(ports[0])
        });
        let after = down.elapsed();
        store.resume();
        assert!(stopped, "{mode:?}: the holder ran on\n{}", logs());
        assert!(
            after < Duration::from_secs(1),
            "{mode:?}: stopped {after:?} into the outage (T = 300 ms)\n{}",
            logs()
        );
        assert!(
            health.contains(said),
            "{mode:?}: /health did not say why ({said}): {health}\n{}",
            logs()
        );
        eprintln!("failsafe, {mode:?} grants: the holder stopped {after:?} into the outage");
        // Back on the store, one of them holds again; n1 for the next
        // round (n2 steps aside by a switchover when it took over).
        middleman.set(Meddle::Pass);
        assert!(
            crate::common::agent::wait_for(Duration::from_secs(20), || {
                primary(ports[0]) != primary(ports[1])
            }),
            "{mode:?}: nobody holds after the store came back\n{}",
            logs()
        );
        if primary(ports[1]) {
            let out = crate::common::agent::putex()
                .args(["switchover", "svc", "--to", "n1", "--store", &url])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                crate::common::agent::wait_for(Duration::from_secs(20), || primary(ports[0])),
                "the switchover to n1 did not happen\n{}",
                logs()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

crate::common::on_stores!(timing_slot; Backend, a_member_with_another_key_is_refused_at_start =>
    failsafe_a_member_with_another_key_is_refused_at_start_on_nats: nats,
);

/// Every member of a failsafe lock needs the same key: an agent whose key
/// a live member does not share is refused at start (exit 2), naming that
/// member and both keys, instead of failing in the outage it is for; with
/// the same key it starts.
fn a_member_with_another_key_is_refused_at_start(store: &Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = store.url();
    let ours = key_file(dir.path(), "key", "0123456789abcdef0123456789abcdef");
    let theirs = key_file(
        dir.path(),
        "other",
        "another key of thirty-two bytes or more",
    );
    let ports = crate::agent_http::two_free_ports();
    let agent = |node: &str, port: u16, key: &std::path::Path| {
        failsafe_agent(dir.path(), &url, node, key, "1s", port, &[])
    };
    let n1 = agent("n1", ports[0], &ours);
    assert!(
        endpoints_published(&url, "svc", 1, Duration::from_secs(20)),
        "{}",
        n1.log_text()
    );
    let mut other = agent("n2", ports[1], &theirs);
    let code = other.wait_exit(Duration::from_secs(10));
    let said = other.refusal();
    assert_eq!(code, Some(2), "{}", other.log_text());
    eprintln!("refused: {said}");
    assert!(
        said.contains("member n1 of lock \"svc\" signs with key")
            && said.contains("every member needs the same key file"),
        "{said}"
    );
    drop(other);
    let mut same = agent("n2", ports[1], &ours);
    assert!(same.alive(), "{}", same.log_text());
    assert!(
        endpoints_published(&url, "svc", 2, Duration::from_secs(10)),
        "{}",
        same.log_text()
    );
}
