//! HAProxy in front of the recipe, for real (Debian's `haproxy`,
//! `scripts/install-haproxy`), configured with the block of
//! `docs/operations.md` as it is written there (addresses aside): a writer
//! through its `primary` listener and readers through its `replicas`
//! listener (`GET /replica?lag=16MB`) across a lagging replica, a
//! switchover and a crash of the primary's host, beside a writer with the
//! direct libpq string.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use putex_testkit::postgres::{free_port, Ack, Answer, PgCluster, Reader, Writer};

use super::{
    cluster_each, logs, ms, one_primary_at_a_time, turn_on_a_used_lock, wait_acks, Kind,
    StoreServer,
};
use crate::common::agent::{putex, wait_for, wall_ns};

/// The `haproxy` binary: `PUTEX_HAPROXY`, else `/usr/sbin/haproxy` or
/// `haproxy` on `PATH`.
fn haproxy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("PUTEX_HAPROXY") {
        return p.into();
    }
    for p in ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v haproxy"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !p.is_empty() {
            return p.into();
        }
    }
    panic!(
        "no haproxy: run scripts/install-haproxy (Debian's haproxy package), \
         or set PUTEX_HAPROXY to an haproxy binary"
    )
}

/// The ```haproxy block of `docs/operations.md`'s "HTTP endpoints" section.
fn documented_config() -> String {
    crate::common::doc_block("operations.md", "## HTTP endpoints and metrics", "haproxy")
}

/// An HAProxy process with the documented configuration, pointed at the
/// cluster: `primary` on `ports.0`, `replicas` on `ports.1`.
struct Haproxy {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(pg: &PgCluster, http: &[u16], ports: (u16, u16)) -> Haproxy {
        let mut config = documented_config();
        let mut swap = |from: String, to: String| {
            assert!(
                config.contains(&from),
                "the documented block lacks {from:?}"
            );
            config = config.replace(&from, &to);
        };
        swap("bind *:5000".into(), format!("bind 127.0.0.1:{}", ports.0));
        swap("bind *:5001".into(), format!("bind 127.0.0.1:{}", ports.1));
        for (i, node) in pg.nodes.iter().enumerate() {
            swap(
                format!("server db{n} 10.0.0.{n}:5432 check port 8008", n = i + 1),
                format!(
                    "server {} 127.0.0.1:{} check port {}",
                    node.name, node.port, http[i]
                ),
            );
        }
        let dir = tempfile::tempdir().expect("a directory for haproxy.cfg");
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, &config).expect("write haproxy.cfg");
        let bin = haproxy_bin();
        let check = Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .output()
            .expect("run haproxy -c");
        assert!(
            check.status.success(),
            "haproxy refuses the documented configuration:\n{config}\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(&bin)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy");
        Haproxy { child, _dir: dir }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of `GET path` on 127.0.0.1:`port` (0 when it does not
/// answer).
fn http_status(port: u16, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The servers that answered `reads`, each once, sorted.
fn servers(reads: &[Answer]) -> Vec<u16> {
    let mut s: Vec<u16> = reads.iter().filter_map(|r| r.server.map(|s| s.0)).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// The writes acknowledged from `ns` on.
fn acks_since(acks: &[Ack], ns: u128) -> Vec<Ack> {
    acks.iter().filter(|a| a.ns >= ns).copied().collect()
}

/// How long writes were unavailable around an event at `ns`: from the last
/// acknowledgement before it to the first after it by another server.
fn gap_around(acks: &[Ack], ns: u128) -> Duration {
    let last = acks
        .iter()
        .rfind(|a| a.ns < ns)
        .expect("writes before the event");
    let first = acks
        .iter()
        .find(|a| a.ns >= ns && a.port != last.port)
        .expect("writes on another server after the event");
    Duration::from_nanos((first.ns - last.ns) as u64)
}

/// The primaries that acknowledged `acks` before the crash of `crashed` at
/// `crash_ns`, checked to hand over once each (one run per server), and
/// checked after it: at most the crashed server's last writes (acknowledged
/// between its agent's crash and its postmaster's), then one run of the
/// server that took over. Either replica may take over, n1 (which follows
/// n2 since the switchover) as well as n3: whichever is more advanced, or
/// ranks first when they are level.
fn primaries_around(acks: &[Ack], crash_ns: u128, crashed: u16) -> Vec<u16> {
    let (before, after): (Vec<Ack>, Vec<Ack>) = acks.iter().partition(|a| a.ns < crash_ns);
    let after = one_primary_at_a_time(&after);
    let successor = after.last().copied();
    assert!(
        successor.is_some_and(|s| s != crashed) && after[..after.len() - 1].iter().all(|&s| s == crashed),
        "after the crash of {crashed}, the writes' primaries were {after:?}: one other server expected"
    );
    one_primary_at_a_time(&before)
}

#[test]
fn postgres_haproxy_as_documented_routes_writers_to_the_primary_and_readers_to_replicas_that_keep_up(
) {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(3, false);
    let http: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let ports = (free_port(), free_port());
    let _slot = turn_on_a_used_lock(&url);
    let mut agents = cluster_each(&url, &pg, |i| {
        vec!["--http".into(), format!("127.0.0.1:{}", http[i])]
    });
    let _haproxy = Haproxy::start(&pg, &http, ports);
    let port = |i: usize| pg.nodes[i].port;

    // Steady: readers reach both replicas, never the primary.
    // (HAProxy starts with every server up, until its checks say
    // otherwise: the first second's reads may reach the primary.)
    let reader = Reader::start(ports.1);
    let mut replicas = vec![port(1), port(2)];
    replicas.sort_unstable();
    let last_2s = |r: &Reader| {
        let reads = r.since(wall_ns() - 2_000_000_000);
        (reads.len() >= 10).then(|| servers(&reads))
    };
    assert!(
        wait_for(Duration::from_secs(15), || last_2s(&reader)
            == Some(replicas.clone())),
        "reads through HAProxy reached {:?}, not n2 and n3:\n{}",
        last_2s(&reader),
        logs(&agents)
    );
    let steady_ns = wall_ns() - 2_000_000_000;

    // A replica that falls 16 MB behind leaves the readers' pool, and
    // comes back once it caught up.
    pg.stop_receiving(2);
    pg.sql(
        0,
        "create table bulk (v text); \
         insert into bulk select repeat('x', 200) from generate_series(1, 150000)",
    )
    .expect("write 40 MB of WAL");
    assert!(
        wait_for(Duration::from_secs(15), || http_status(
            http[2],
            "/replica?lag=16MB"
        ) == 503),
        "n3, behind, still passes /replica?lag=16MB:\n{}",
        logs(&agents)
    );
    assert_eq!(
        http_status(http[2], "/replica"),
        200,
        "n3 is still a replica"
    );
    assert_eq!(http_status(http[2], "/replica?lag=16mb"), 400);
    assert_eq!(http_status(http[2], "/read-only"), 200);
    assert_eq!(
        http_status(http[0], "/read-only?lag=0"),
        200,
        "the primary reads"
    );
    std::thread::sleep(Duration::from_secs(2)); // HAProxy's fall: 2 × 500 ms
    let t1 = wall_ns();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        servers(&reader.since(t1)),
        [port(1)],
        "reads still reach n3, 16 MB behind"
    );
    pg.sql(
        2,
        &format!(
            "alter system set primary_conninfo = \
             'host=127.0.0.1 port={} user=replicator application_name=n3'",
            port(0)
        ),
    )
    .and_then(|_| pg.sql(2, "select pg_reload_conf()"))
    .expect("n3 receives again");
    let t2 = wall_ns();
    assert!(
        wait_for(Duration::from_secs(20), || servers(&reader.since(t2))
            .contains(&port(2))),
        "n3, caught up, gets no reads again:\n{}",
        logs(&agents)
    );

    // Switchover n1 → n2 under two writers: through HAProxy, and direct.
    let haproxy_conninfo = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=1",
        ports.0
    );
    let through = Writer::start(haproxy_conninfo);
    let direct = Writer::start_after(pg.primary_conninfo(), 1_000_000_000);
    assert!(
        wait_acks(&through, 100, Duration::from_secs(20)),
        "no writes through HAProxy"
    );
    assert!(
        wait_acks(&direct, 100, Duration::from_secs(20)),
        "no direct writes"
    );
    let switch_ns = wall_ns();
    let out = putex()
        .args(["switchover", "pg", "--to", "n2", "--store", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "switchover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let on_n2 = |w: &Writer| w.acks().iter().filter(|a| a.port == port(1)).count() >= 50;
    assert!(
        wait_for(Duration::from_secs(20), || on_n2(&through)
            && on_n2(&direct)),
        "the writers did not move to n2:\n{}",
        logs(&agents)
    );
    let switched = (
        gap_around(&through.acks(), switch_ns),
        gap_around(&direct.acks(), switch_ns),
    );

    // n2's host crashes: agent, keeper and postmaster at once.
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(1).len() == 2),
        "n1 and n3 do not stream from n2 ({:?})",
        pg.streaming_from(1)
    );
    let crash_ns = agents[1].crash();
    pg.kill_server(1);
    let moved = |w: &Writer| {
        acks_since(&w.acks(), crash_ns)
            .iter()
            .filter(|a| a.port != port(1))
            .count()
            >= 50
    };
    assert!(
        wait_for(Duration::from_secs(30), || moved(&through)
            && moved(&direct)),
        "the writers did not move on from n2:\n{}",
        logs(&agents)
    );
    let crashed = (
        gap_around(&through.acks(), crash_ns),
        gap_around(&direct.acks(), crash_ns),
    );
    let (through, direct) = (through.stop(), direct.stop());
    let reads = reader.stop();

    // HAProxy never let two primaries take writes in turn: n1's writes,
    // then n2's, then those of whichever replica took over from the crash.
    let (n1, n2) = (port(0), port(1));
    for (name, acks) in [("through HAProxy", &through), ("direct", &direct)] {
        assert_eq!(
            primaries_around(acks, crash_ns, n2),
            [n1, n2],
            "the writes' primaries {name}"
        );
    }
    // A read reaches a primary only while HAProxy's checks catch up with an
    // event (fall 2 × inter 500 ms, plus a check under way): never later.
    let settle = Duration::from_millis(2500).as_nanos();
    let events = [switch_ns, crash_ns];
    let reads: Vec<Answer> = reads.into_iter().filter(|r| r.ns >= steady_ns).collect();
    let on_primary: Vec<&Answer> = reads
        .iter()
        .filter(|r| matches!(r.server, Some((_, false))))
        .collect();
    for r in &on_primary {
        assert!(
            events.iter().any(|e| r.ns >= *e && r.ns - e < settle),
            "a read reached a primary {:?} outside any event's settling time",
            r.server
        );
    }
    let failed = reads.iter().filter(|r| r.server.is_none()).count();
    let successor = through.last().map(|a| a.port);
    let successor = pg.nodes.iter().find(|n| Some(n.port) == successor);
    println!(
        "HAProxy: switchover writes unavailable {:.0} ms through HAProxy, {:.0} ms direct; \
         crash {:.0} ms through HAProxy, {:.0} ms direct ({} took over); {} reads: {} by a replica, \
         {} by a primary while the checks caught up, {} failed",
        ms(switched.0),
        ms(switched.1),
        ms(crashed.0),
        ms(crashed.1),
        successor.map_or("?", |n| n.name.as_str()),
        reads.len(),
        reads.len() - on_primary.len() - failed,
        on_primary.len(),
        failed
    );
}
