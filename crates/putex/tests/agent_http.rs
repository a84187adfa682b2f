//! `putex run --http`: the health endpoints flip on a failover, and the
//! metrics are there and move; systemd's notify protocol and watchdog. Each
//! runs on a real nats-server and on a real single-member etcd.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::agent::{fast, start, Agent};

/// A test on a real nats-server and on a real single-member etcd: a module
/// `$name` with the tests `nats` and `etcd`, each calling `$body(url)`.
macro_rules! on_nats_and_etcd {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn nats() {
                let server = $crate::common::nats_server::NatsServer::start();
                let _slot = $crate::common::agent::timing_slot();
                $body(&server.url);
            }

            #[test]
            fn etcd() {
                let server = $crate::common::etcd_server::EtcdServer::start();
                let _slot = $crate::common::agent::timing_slot();
                $body(&format!("etcd://{}", server.endpoint()));
            }
        }
    };
}
pub(crate) use on_nats_and_etcd;

/// `GET path` with HTTP/1.1 and `Connection: close`: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    )
}

/// `POST path` with a JSON `body`, as [`http_get`].
pub fn http_post(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    exchange(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Sends `request` and reads the answer to its end: (status, body).
fn exchange(port: u16, request: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Two different ports that were free a moment ago (both bound at once, so
/// they cannot be the same one twice).
pub fn two_free_ports() -> [u16; 2] {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    [
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    ]
}

fn wait_status(port: u16, path: &str, want: u16, within: Duration) -> String {
    let until = Instant::now() + within;
    loop {
        if let Some((status, body)) = http_get(port, path) {
            if status == want {
                return body;
            }
        }
        assert!(
            Instant::now() < until,
            "{path} on :{port} never answered {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
}

/// Two `putex run` agents of `lock` in child mode, each with `--http` on a
/// port of its own; waits until exactly one answers `/primary` with 200.
/// Returns the ports, the agents and the index of the primary.
pub fn two_agents_with_http(
    dir: &std::path::Path,
    url: &str,
    lock: &str,
    nodes: [&str; 2],
) -> ([u16; 2], Vec<Agent>, usize) {
    two_agents_with_http_flags(dir, url, lock, nodes, &[])
}

/// [`two_agents_with_http`] with `flags` before the service (e.g. another
/// `--renew`).
pub fn two_agents_with_http_flags(
    dir: &std::path::Path,
    url: &str,
    lock: &str,
    nodes: [&str; 2],
    flags: &[&str],
) -> ([u16; 2], Vec<Agent>, usize) {
    let ports = two_free_ports();
    let agents: Vec<Agent> = nodes
        .iter()
        .zip(ports)
        .map(|(node, port)| {
            let addr = format!("127.0.0.1:{port}");
            let mut args: Vec<&str> = flags.to_vec();
            args.extend(["--http", &addr, "--", "sleep", "1000"]);
            start(fast(dir, url, lock, node, &args))
        })
        .collect();
    // A ceiling: a failsafe lock's first use waits W over T + its cap.
    let until = Instant::now() + Duration::from_secs(90);
    let active = loop {
        let answers: Vec<_> = ports.iter().map(|p| http_get(*p, "/primary")).collect();
        let up: Vec<usize> = (0..2)
            .filter(|i| answers[*i].as_ref().is_some_and(|(s, _)| *s == 200))
            .collect();
        if up.len() == 1 {
            break up[0];
        }
        assert!(
            up.len() < 2,
            "two primaries: {answers:?}\n--- {} ---\n{}\n--- {} ---\n{}",
            nodes[0],
            agents[0].log_text(),
            nodes[1],
            agents[1].log_text()
        );
        assert!(
            Instant::now() < until,
            "no primary: {}",
            agents[0].log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (ports, agents, active)
}

on_nats_and_etcd!(
    health_endpoints_flip_on_failover_and_metrics_move,
    endpoints_flip_and_metrics_move
);

fn endpoints_flip_and_metrics_move(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (ports, mut agents, active) = two_agents_with_http(dir.path(), url, "web", ["a", "b"]);
    let standby = 1 - active;
    let body = wait_status(ports[standby], "/replica", 200, Duration::from_secs(5));
    assert!(body.contains("\"role\":\"standby\""), "{body}");
    // Without --failsafe no holder's ask is answered.
    let (status, body) = http_post(ports[standby], "/v1/failsafe/web", "{}").unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("failsafe is off"), "{body}");
    assert_eq!(http_get(ports[standby], "/primary").unwrap().0, 503);
    assert_eq!(http_get(ports[active], "/replica").unwrap().0, 503);
    for path in ["/health", "/liveness", "/readiness"] {
        assert_eq!(http_get(ports[active], path).unwrap().0, 200, "{path}");
    }
    let before = wait_status(ports[standby], "/metrics", 200, Duration::from_secs(5));
    assert!(
        before.contains("putex_role{role=\"standby\"} 1"),
        "{before}"
    );
    assert!(before.contains("putex_build_info{version="), "{before}");
    assert!(
        before.contains("putex_store_call_duration_seconds_bucket"),
        "{before}"
    );
    let active_metrics = http_get(ports[active], "/metrics").unwrap().1;
    assert_eq!(metric(&active_metrics, "putex_held"), 1.0);
    assert!(metric(&active_metrics, "putex_licence_left_seconds") > 0.0);
    let transitions = metric(&before, "putex_transitions_total{to=\"active\"}");

    // Crash the primary: the replica becomes primary, its metrics move.
    agents[active].crash();
    wait_status(ports[standby], "/primary", 200, Duration::from_secs(10));
    let after = http_get(ports[standby], "/metrics").unwrap().1;
    assert_eq!(
        metric(&after, "putex_transitions_total{to=\"active\"}"),
        transitions + 1.0,
        "{after}"
    );
    assert!(after.contains("putex_role{role=\"active\"} 1"), "{after}");
    assert!(metric(&after, "putex_revision") > 0.0);
    agents[standby].stop_cleanly();
}

/// Datagrams received on a fake `$NOTIFY_SOCKET` within `window`.
fn notifications(sock: &std::os::unix::net::UnixDatagram, window: Duration) -> Vec<String> {
    let until = Instant::now() + window;
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while Instant::now() < until {
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    out
}

/// Notifications until `done` says the list is complete, or `within` passed.
fn notifications_until(
    sock: &std::os::unix::net::UnixDatagram,
    within: Duration,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let until = Instant::now() + within;
    let mut out = Vec::new();
    while Instant::now() < until && !done(&out) {
        out.extend(notifications(sock, Duration::from_millis(100)));
    }
    out
}

on_nats_and_etcd!(
    systemd_notify_ready_status_and_a_watchdog_that_stops_when_wedged,
    systemd_notify_and_watchdog
);

fn systemd_notify_and_watchdog(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let notify = path.display().to_string();
    let mut agent = start(
        fast(dir.path(), url, "sd", "a", &["--", "sleep", "1000"])
            .keeper_dir(&dir.path().join("keeper"))
            .env(&[
                ("NOTIFY_SOCKET", notify.as_str()),
                ("WATCHDOG_USEC", "400000"),
                ("PUTEX_TEST_WEDGE_AFTER", "3s"),
            ]),
    );
    // Until ready, active and pinging (a loaded machine starts slowly).
    let first = notifications_until(&sock, Duration::from_secs(15), |m| {
        m.iter().any(|m| m.starts_with("STATUS=active"))
            && m.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3
    });
    assert_eq!(
        first.iter().filter(|m| *m == "READY=1").count(),
        1,
        "{first:?}\n{}",
        agent.log_text()
    );
    let ready = first.iter().position(|m| m == "READY=1").unwrap();
    assert!(
        first[..ready]
            .iter()
            .all(|m| !m.starts_with("STATUS=active")),
        "{first:?}"
    );
    assert!(
        first.iter().any(|m| m.starts_with("STATUS=active")),
        "{first:?}"
    );
    assert!(
        first.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3,
        "{first:?}"
    );
    // Wedged 3 s after its start: the pings stop (within 3 R + 1 s) and
    // stay stopped.
    let quiet_by = Instant::now() + Duration::from_secs(15);
    while notifications(&sock, Duration::from_secs(1))
        .iter()
        .any(|m| m == "WATCHDOG=1")
    {
        assert!(
            Instant::now() < quiet_by,
            "a wedged agent still pinged the watchdog\n{}",
            agent.log_text()
        );
    }
    let late = notifications(&sock, Duration::from_secs(1));
    assert!(
        late.iter().all(|m| m != "WATCHDOG=1"),
        "a wedged agent pinged the watchdog again: {late:?}\n{}",
        agent.log_text()
    );
    agent.crash();

    // STOPPING=1 on a graceful stop.
    let mut agent = start(
        fast(dir.path(), url, "sd2", "b", &["--", "sleep", "1000"])
            .keeper_dir(&dir.path().join("keeper2"))
            .env(&[("NOTIFY_SOCKET", notify.as_str())]),
    );
    let up = notifications_until(&sock, Duration::from_secs(15), |m| {
        m.iter().any(|m| m.starts_with("STATUS=active"))
    });
    assert!(
        up.iter().any(|m| m.starts_with("STATUS=active")),
        "{up:?}\n{}",
        agent.log_text()
    );
    agent.stop_cleanly();
    let down = notifications(&sock, Duration::from_millis(300));
    assert!(down.iter().any(|m| m == "STOPPING=1"), "{down:?}");
}
