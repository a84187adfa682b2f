//! PostgreSQL high availability end to end: three real PostgreSQL servers
//! (`initdb`, `pg_basebackup -R`), a real nats-server (the switchover and
//! the synchronous crash also on a real etcd), one `putex run` agent
//! per server with the recipe's hooks (`packaging/postgresql/putex-pg`), and
//! a writer inserting sequence numbers through a connection string that
//! finds the primary (`target_session_attrs=read-write`), recording every
//! acknowledged commit (`putex_testkit::postgres`).
//!
//! Both sides of each guarantee: the new primary takes writes (and how soon,
//! as the writer sees it), and no acknowledged commit is lost or acknowledged
//! by two primaries; the old primary stops, and comes back as a replica of
//! the new one without a manual step.

use std::time::{Duration, Instant};

use putex_testkit::postgres::{write_gap, Ack, PgCluster, Writer};

use crate::common::agent::{
    putex, putex_bin, start, timing_slot, wait_for, wall_ns, Agent, TimingSlot,
};
use crate::common::etcd_server::EtcdServer;
use crate::common::nats_server::NatsServer;

mod bootstrap;
mod failsafe;
mod fencing;
mod haproxy;
mod slots;

/// The store a test runs on.
#[derive(Clone, Copy)]
enum Kind {
    Nats,
    Etcd,
}

/// A store server of `kind`, alive as long as the guard.
enum StoreServer {
    Nats(NatsServer),
    Etcd(Box<EtcdServer>),
}

impl StoreServer {
    fn start(kind: Kind) -> StoreServer {
        match kind {
            Kind::Nats => StoreServer::Nats(NatsServer::start()),
            Kind::Etcd => StoreServer::Etcd(Box::new(EtcdServer::start())),
        }
    }

    fn url(&self) -> String {
        match self {
            StoreServer::Nats(s) => s.url.clone(),
            StoreServer::Etcd(s) => format!("etcd://{}", s.endpoint()),
        }
    }

    /// How much later than on NATS a crash failover may come: etcd's store
    /// clock reads in whole seconds (up to 2 s + R more, `docs/stores.md`).
    fn slower_failover(&self) -> Duration {
        match self {
            StoreServer::Nats(_) => Duration::ZERO,
            StoreServer::Etcd(_) => Duration::from_millis(2500),
        }
    }
}

/// The timing of the PostgreSQL tests: every R each node runs `psql` twice
/// (health check and position), so R is 500 ms rather than 100 ms.
const TIMING: [&str; 8] = [
    "--renew",
    "500ms",
    "--failures",
    "3",
    "--confirm",
    "1",
    "--healthcheck-timeout",
    "250ms",
];

/// The agent of node `i` with the recipe's hooks and `extra` flags, run as
/// PostgreSQL's user.
fn agent(url: &str, pg: &PgCluster, i: usize, extra: &[&str]) -> Agent {
    let mut spec = pg.agent_spec(putex_bin(), url, i).args(extra);
    for flag in TIMING.chunks(2) {
        spec = spec.default_flag(flag[0], flag[1]);
    }
    start(spec.default_flag("--stop-timeout", "2s"))
}

/// The turn among timing-sensitive tests for a test whose cluster starts on
/// a lock used before, as a cluster in service has: while the test waits
/// for its turn, `putex lock pg --node n1 -- true` leaves a record n1
/// released ([`use_lock_once`](putex_testkit::agent::use_lock_once)), so
/// that n1 takes the lock at once instead of waiting out a first use
/// (W + G', 2 s at R = 500 ms: most of a minute of turns over the module).
/// n1, not a node of its own: the recipe makes a replication slot for every
/// node it has heard of. The first use of a name is what the bootstrap
/// tests, the demo and S4's own tests exercise.
fn turn_on_a_used_lock(url: &str) -> TimingSlot {
    let url = url.to_owned();
    let used = std::thread::spawn(move || {
        putex_testkit::agent::use_lock_once(
            crate::common::agent::putex_bin(),
            &url,
            "pg",
            "n1",
            putex_testkit::agent::scratch_keeper_dir(),
        )
    });
    let slot = timing_slot();
    if let Err(e) = used.join().expect("the used-lock thread") {
        panic!("{e}");
    }
    slot
}

/// Starts every node's agent: `n1` first, until it is the primary, then the
/// others, until both stream from it.
fn cluster(url: &str, pg: &PgCluster, extra: &[&str]) -> Vec<Agent> {
    cluster_each(url, pg, |_| extra.iter().map(|s| s.to_string()).collect())
}

/// [`cluster`] with flags of each node's own (`extra(i)`).
fn cluster_each(url: &str, pg: &PgCluster, extra: impl Fn(usize) -> Vec<String>) -> Vec<Agent> {
    let flags = |i: usize| extra(i);
    let start_node = |i: usize| {
        let f = flags(i);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        agent(url, pg, i, &f)
    };
    let mut agents = vec![start_node(0)];
    assert!(
        wait_for(Duration::from_secs(30), || pg.is_primary(0) == Some(true)),
        "n1 did not become the primary:\n{}",
        logs(&agents)
    );
    for i in 1..pg.nodes.len() {
        agents.push(start_node(i));
    }
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(0).len()
            == pg.nodes.len() - 1),
        "the replicas do not stream from n1 ({:?}):\n{}",
        pg.streaming_from(0),
        logs(&agents)
    );
    // A replica streams a moment before its follow hook has seen it and
    // exited: a test that stopped its agent meanwhile would kill the hook's
    // tree, the server its `pg_ctl start` still waits for included.
    assert!(
        wait_for(Duration::from_secs(30), || agents[1..]
            .iter()
            .all(|a| a.log_text().contains("hook=\"follow\" code=Some(0)"))),
        "the replicas' follow hooks did not finish:\n{}",
        logs(&agents)
    );
    agents
}

fn logs(agents: &[Agent]) -> String {
    agents
        .iter()
        .map(|a| format!("--- {}:\n{}", a.node(), a.log_text()))
        .collect()
}

/// Waits until the writer has `n` more acknowledged writes.
fn wait_acks(w: &Writer, n: usize, within: Duration) -> bool {
    let have = w.acks().len();
    wait_for(within, || w.acks().len() >= have + n)
}

/// The acknowledged sequence numbers missing on node `i`.
fn lost(pg: &PgCluster, i: usize, acks: &[Ack]) -> Vec<i64> {
    pg.missing(i, acks).expect("read the writes")
}

/// No write was acknowledged by a server after a later-acknowledged write of
/// another: the writes of each primary form one run (never two primaries
/// acknowledging in turn).
fn one_primary_at_a_time(acks: &[Ack]) -> Vec<u16> {
    let mut runs: Vec<u16> = Vec::new();
    for a in acks {
        if runs.last() != Some(&a.port) {
            assert!(
                !runs.contains(&a.port),
                "server {} acknowledged writes again after another primary did: {runs:?} then {}",
                a.port,
                a.port
            );
            runs.push(a.port);
        }
    }
    runs
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The recipe checks every program it runs once, at start: a PGBIN that
/// lacks some (a lone `pg_ctl` link) is refused naming them, never met
/// later as empty output; a lone `pg_ctl` on PATH is passed over for a
/// directory that has them all. Needs no server.
#[test]
fn postgres_recipe_names_a_program_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("bin");
    std::fs::create_dir(&lone).unwrap();
    let real = putex_testkit::postgres::pg_bin();
    std::os::unix::fs::symlink(real.join("pg_ctl"), lone.join("pg_ctl")).unwrap();
    let run = |envs: &[(&str, &std::ffi::OsStr)]| {
        let mut c = std::process::Command::new("sh");
        c.arg(putex_testkit::postgres::putex_pg_script())
            .args(["health", "active"])
            .env("PGDATA", dir.path().join("data"))
            .env_remove("PGBIN");
        for (k, v) in envs {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[("PGBIN", lone.as_os_str())]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("lacks psql pg_controldata pg_rewind pg_basebackup postgres")
            && err.contains("set PGBIN"),
        "{err}"
    );
    // The lone link first on PATH: PGBIN comes from PATH only with every
    // program beside it. Then PGBIN is Debian's directory (or none).
    let path = format!("{}:{}", lone.display(), std::env::var("PATH").unwrap());
    let (_, err) = run(&[("PATH", std::ffi::OsStr::new(&path))]);
    assert!(!err.contains(&format!("PGBIN={}", lone.display())), "{err}");
    assert!(!err.contains("arithmetic"), "{err}");
}

#[test]
fn postgres_switchover_under_load_and_the_old_primary_follows_the_new_one() {
    switchover_case(Kind::Nats, false, false);
}

/// Synchronous mode, `--max-lag 0`: under load the target is always some
/// bytes behind the position the primary published last, and the
/// switchover still needs no `--allow-lag` — the target takes the lock once
/// it replayed what the old primary's fast shutdown sent it; nothing
/// acknowledged is lost.
#[test]
fn postgres_synchronous_switchover_under_load_needs_no_allow_lag() {
    switchover_case(Kind::Nats, false, true);
}

/// The same on etcd (the other PostgreSQL version runs of
/// `scripts/test-postgres-versions` skip it: the store does not change
/// with PostgreSQL's version).
#[test]
fn postgres_switchover_under_load_and_the_old_primary_follows_the_new_one_on_etcd() {
    switchover_case(Kind::Etcd, false, false);
}

/// The same with every server run as a systemd unit (the recipe's
/// `SERVICE`, through a `systemctl` stand-in): the recipe starts and stops
/// them with `systemctl`, never behind the unit's back.
#[test]
fn postgres_switchover_with_postgresql_run_as_a_systemd_unit() {
    switchover_case(Kind::Nats, true, false);
}

fn switchover_case(kind: Kind, service: bool, sync: bool) {
    let server = StoreServer::start(kind);
    let url = server.url();
    let mut pg = PgCluster::create(3, sync);
    if service {
        pg.use_systemctl_stand_in();
    }
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&url);
    let extra: &[&str] = if sync { &["--max-lag", "0"] } else { &[] };
    let agents = cluster(&url, &pg, extra);
    let writer = Writer::start(pg.primary_conninfo());
    assert!(
        wait_acks(&writer, 100, Duration::from_secs(20)),
        "no writes"
    );

    let asked = Instant::now();
    let out = putex()
        .args(["switchover", "pg", "--to", "n2", "--store", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "switchover: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        logs(&agents)
    );
    let took = asked.elapsed();
    let n2 = pg.nodes[1].port;
    assert!(
        wait_for(Duration::from_secs(10), || writer
            .acks()
            .iter()
            .any(|a| a.port == n2)),
        "no write reached n2:\n{}",
        logs(&agents)
    );
    // The old primary follows the new one, with no manual step.
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(1)
            == ["n1", "n3"]),
        "n1 and n3 do not stream from n2 ({:?}):\n{}",
        pg.streaming_from(1),
        logs(&agents)
    );
    assert_eq!(pg.is_primary(0), Some(false), "n1 is not a replica");
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));
    let acks = writer.stop();
    let runs = one_primary_at_a_time(&acks);
    assert_eq!(runs, [pg.nodes[0].port, n2], "the writes' primaries");
    let gap = write_gap(&acks).unwrap();
    eprintln!(
        "{}switchover n1 → n2: command {:.0} ms; writes unavailable {:.0} ms (last ack on n1 → first on n2); {} writes acknowledged",
        if sync { "synchronous " } else { "" },
        ms(took),
        ms(gap),
        acks.len()
    );
    assert_eq!(
        lost(&pg, 1, &acks),
        Vec::<i64>::new(),
        "acknowledged writes lost"
    );
    // The acknowledged writes reached the old primary too, as a replica.
    let last = acks.last().unwrap().seq;
    assert!(
        wait_for(Duration::from_secs(10), || pg
            .sql(
                0,
                &format!("select count(*) from putex_writes where seq = {last}")
            )
            .is_ok_and(|c| c == "1")),
        "n1 does not replay n2's writes"
    );
    if sync {
        switch_back(&url, &pg, &agents);
    }
    if service {
        // n1 started as the primary, the replicas to follow it; n1 stopped
        // for the switchover and started again as n2's replica.
        let calls = pg.systemctl_calls();
        let count = |call: &str| calls.iter().filter(|c| *c == call).count();
        assert!(
            count("start putex-pg@n1") >= 2
                && count("stop putex-pg@n1") >= 1
                && count("start putex-pg@n2") >= 1
                && count("start putex-pg@n3") >= 1,
            "systemctl calls: {calls:?}"
        );
    }
}

/// A second switchover, n2 → n1, under load: n3, which followed n1's
/// timeline and then n2's, is re-pointed at n1 without being stopped — its
/// control file may still name n1's first timeline, but its WAL receiver
/// streams n2's (the WAL it received goes past where n1's first timeline
/// forked off, which is no divergence) — and nothing acknowledged is lost.
fn switch_back(url: &str, pg: &PgCluster, agents: &[Agent]) {
    let writer = Writer::start(pg.primary_conninfo());
    assert!(
        wait_acks(&writer, 100, Duration::from_secs(20)),
        "no writes"
    );
    let out = putex()
        .args(["switchover", "pg", "--to", "n1", "--store", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "switchover back: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs(agents)
    );
    let n1 = pg.nodes[0].port;
    assert!(
        wait_for(Duration::from_secs(10), || writer
            .acks()
            .iter()
            .any(|a| a.port == n1)),
        "no write reached n1 again:\n{}",
        logs(agents)
    );
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(0)
            == ["n2", "n3"]),
        "n2 and n3 do not stream from n1 ({:?}):\n{}",
        pg.streaming_from(0),
        logs(agents)
    );
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));
    let acks = writer.stop();
    let gap = write_gap(&acks).unwrap();
    eprintln!(
        "synchronous switchover n2 → n1: writes unavailable {:.0} ms; {} writes acknowledged",
        ms(gap),
        acks.len()
    );
    assert_eq!(
        lost(pg, 0, &acks),
        Vec::<i64>::new(),
        "acknowledged writes lost"
    );
    let n3 = agents[2].log_text();
    assert!(
        !n3.contains("to be rewound"),
        "n3 was stopped for a rewind it did not need:\n{n3}"
    );
}

/// Crash of the primary's host (postmaster, agent and keeper SIGKILLed
/// together) while n3 lags (it stopped receiving): the most advanced
/// replica, n2, is promoted and takes writes within the bound, and n3
/// follows it;
/// then the old primary's agent restarts, rewinds it and follows the new
/// primary — never a second primary.
fn crash_case(kind: Kind, sync: bool) {
    let server = StoreServer::start(kind);
    let url = server.url();
    let pg = PgCluster::create(3, sync);
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&url);
    let extra: &[&str] = if sync { &["--max-lag", "0"] } else { &[] };
    let mut agents = cluster(&url, &pg, extra);
    let writer = Writer::start(pg.primary_conninfo());
    assert!(
        wait_acks(&writer, 200, Duration::from_secs(20)),
        "no writes"
    );
    // n3 stops receiving (its primary_conninfo points nowhere): n2 is the
    // most advanced replica when n1 crashes, and must be the one promoted.
    pg.stop_receiving(2);
    assert!(
        wait_for(Duration::from_secs(10), || pg.streaming_from(0) == ["n2"]),
        "n3 still streams"
    );
    assert!(wait_acks(&writer, 200, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(1200)); // positions published

    let crashed = wall_ns();
    agents[0].crash();
    pg.kill_server(0);
    let new_primary = |acks: &[Ack]| acks.iter().find(|a| a.port != pg.nodes[0].port).copied();
    assert!(
        wait_for(Duration::from_secs(30), || new_primary(&writer.acks())
            .is_some()),
        "no replica took writes after the crash:\n{}",
        logs(&agents)
    );
    let first = new_primary(&writer.acks()).unwrap();
    let failover = Duration::from_nanos((first.ns - crashed) as u64);
    let promoted = pg.nodes.iter().position(|n| n.port == first.port).unwrap();
    assert_eq!(
        pg.nodes[promoted].name,
        "n2",
        "not the most advanced replica was promoted:\n{}",
        logs(&agents)
    );
    // n3 follows the new primary (its follow hook re-points it).
    assert!(
        wait_for(Duration::from_secs(20), || pg
            .streaming_from(promoted)
            .contains(&"n3".to_owned())),
        "n3 does not follow n2:\n{}",
        logs(&agents)
    );
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));
    // As soon as n2 is active, not once n1's last record (which says
    // `active` too) has gone stale 10 R later.
    let logged = |i: usize, needle: &str| {
        let log = agents[i].log_text();
        let line = log.lines().find(|l| l.contains(needle))?.to_owned();
        humantime::parse_rfc3339(line.split_whitespace().next()?).ok()
    };
    let active = logged(promoted, "-> active").expect("n2 logged its activation");
    let followed = logged(2, "following the new holder holder=Some(\"n2\")")
        .expect("n3 logged its follow of n2");
    let late = followed.duration_since(active).unwrap_or_default();
    eprintln!("n3 followed n2 {:.0} ms after n2's activation", ms(late));
    assert!(
        late < Duration::from_secs(2),
        "n3 followed n2 {late:?} after its activation:\n{}",
        logs(&agents)
    );

    // The old primary comes back as a replica of the new one: rewound first.
    // (The crashed agent's handle goes first: dropping it kills whatever
    // runs with its keeper directory, a new agent included.)
    drop(agents.remove(0));
    agents.insert(0, agent(&url, &pg, 0, extra));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut following = false;
    while Instant::now() < deadline {
        assert_ne!(
            pg.is_primary(0),
            Some(true),
            "the old primary runs as a primary again:\n{}",
            logs(&agents)
        );
        // From whichever replica is primary by then: on a loaded machine
        // the lock may have moved once more (CI: a second failover while
        // n1 rewound, and n1 rightly followed the new primary).
        let primary_now = (1..pg.nodes.len())
            .find(|&i| pg.is_primary(i) == Some(true))
            .unwrap_or(promoted);
        if pg.streaming_from(primary_now).contains(&"n1".to_owned()) {
            following = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        following,
        "the old primary does not follow {}:\n{}",
        pg.nodes[promoted].name,
        logs(&agents)
    );
    assert!(
        agents[0].log_text().contains("pg_rewind"),
        "the old primary was not rewound:\n{}",
        agents[0].log_text()
    );
    let acks = writer.stop();
    one_primary_at_a_time(&acks);
    let lost = lost(&pg, promoted, &acks);
    eprintln!(
        "crash of n1 ({} mode): {} promoted; first write on it {:.0} ms after the crash; \
         {} of {} acknowledged writes lost",
        if sync { "synchronous" } else { "asynchronous" },
        pg.nodes[promoted].name,
        ms(failover),
        lost.len(),
        acks.len()
    );
    if std::env::var_os("PUTEX_PG_LOGS").is_some() {
        eprintln!("{}", logs(&agents));
    }
    if sync {
        assert_eq!(
            lost,
            Vec::<i64>::new(),
            "synchronous mode lost acknowledged commits"
        );
    }
    // W + G' (about 2.4 s at R = 500 ms, F = 3) plus the promotion; in
    // synchronous mode a commit also waits for a replica to attach to the
    // new primary (n3 re-pointed by its follow, or n1 rejoined).
    let limit = Duration::from_secs(if sync { 10 } else { 6 }) + server.slower_failover();
    assert!(
        failover < limit,
        "failover took {failover:?}:\n{}",
        logs(&agents)
    );
}

#[test]
fn postgres_crash_of_the_primary_host_synchronous_loses_no_acknowledged_commit() {
    crash_case(Kind::Nats, true);
}

/// The same on etcd (skipped by the other PostgreSQL versions' runs, like
/// the switchover on etcd).
#[test]
fn postgres_crash_of_the_primary_host_synchronous_loses_no_acknowledged_commit_on_etcd() {
    crash_case(Kind::Etcd, true);
}

#[test]
fn postgres_crash_of_the_primary_host_asynchronous() {
    crash_case(Kind::Nats, false);
}

/// An asynchronous replica ahead of the one promoted: n3 (`--priority 0`, a
/// reporting replica that never takes over) received WAL that n2 never had
/// when n1 crashed. It cannot stream from n2's new timeline as it is; its
/// follow sees the fork, stops it, rewinds it against n2 and starts it as
/// n2's replica — with n2's data, not the writes only it had received.
/// `stopped`: n3's server is stopped before the crash (its follow starts it,
/// and it replays the WAL n2 never had before it is found out).
fn ahead_case(stopped: bool) {
    let server = NatsServer::start();
    let pg = PgCluster::create(3, false);
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&server.url);
    let mut agents = vec![agent(&server.url, &pg, 0, &[])];
    assert!(
        wait_for(Duration::from_secs(30), || pg.is_primary(0) == Some(true)),
        "n1 did not become the primary:\n{}",
        logs(&agents)
    );
    agents.push(agent(&server.url, &pg, 1, &[]));
    agents.push(agent(&server.url, &pg, 2, &["--priority", "0"]));
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(0).len() == 2),
        "the replicas do not stream from n1:\n{}",
        logs(&agents)
    );
    let writer = Writer::start(pg.primary_conninfo());
    assert!(
        wait_acks(&writer, 100, Duration::from_secs(20)),
        "no writes"
    );
    // n2 stops receiving; n3 goes on receiving what n2 will never have.
    pg.stop_receiving(1);
    assert!(
        wait_for(Duration::from_secs(10), || pg.streaming_from(0) == ["n3"]),
        "n2 still streams"
    );
    assert!(wait_acks(&writer, 200, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(1200)); // positions published
    if stopped {
        pg.stop_server(2);
    }
    agents[0].crash();
    pg.kill_server(0);
    assert!(
        wait_for(Duration::from_secs(30), || pg.is_primary(1) == Some(true)),
        "n2 was not promoted:\n{}",
        logs(&agents)
    );
    // (n2 lists n3 as streaming for a moment even while it cannot follow:
    // it sends the old timeline's WAL up to the fork. The follow hook's own
    // word is that it streams n2's timeline.)
    assert!(
        wait_for(Duration::from_secs(40), || agents[2]
            .log_text()
            .contains("streaming its timeline 2")),
        "n3 does not follow n2:\n{}",
        logs(&agents)
    );
    let n3 = agents[2].log_text();
    assert!(
        n3.contains("never had") && n3.contains("pg_rewind: "),
        "n3 was not rewound:\n{n3}"
    );
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));
    let acks = writer.stop();
    one_primary_at_a_time(&acks);
    // n3 has exactly n2's rows once it replayed n2's last write.
    let on_n2: Vec<Ack> = acks
        .iter()
        .filter(|a| a.port == pg.nodes[1].port)
        .copied()
        .collect();
    assert!(
        wait_for(Duration::from_secs(10), || lost(&pg, 2, &on_n2).is_empty()),
        "n3 lacks writes of n2"
    );
    let rows = |i: usize| {
        pg.sql(i, "select seq from putex_writes order by seq")
            .unwrap()
    };
    assert_eq!(rows(2), rows(1), "n3's data is not n2's");
    eprintln!(
        "n3 ({}) ahead of n2 by {} acknowledged writes, rewound and following",
        if stopped { "stopped" } else { "running" },
        lost(&pg, 1, &acks).len()
    );
}

#[test]
fn postgres_a_running_replica_ahead_of_the_promoted_one_is_rewound_and_follows() {
    ahead_case(false);
}

#[test]
fn postgres_a_stopped_replica_ahead_of_the_promoted_one_is_rewound_and_follows() {
    ahead_case(true);
}

/// O2 with PostgreSQL: paused, the primary's server is restarted by hand
/// (its health checks fail meanwhile) and nobody takes over; resumed, the
/// same primary goes on, and failover works again.
#[test]
fn postgres_pause_restart_the_primary_resume_and_no_failover() {
    let server = NatsServer::start();
    let pg = PgCluster::create(3, false);
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&server.url);
    let agents = cluster(&server.url, &pg, &[]);
    let writer = Writer::start(pg.primary_conninfo());
    assert!(wait_acks(&writer, 50, Duration::from_secs(20)), "no writes");
    let ctl = |args: &[&str]| {
        let out = putex()
            .args(args)
            .args(["--store", &server.url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "putex {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs(&agents)
        );
    };
    ctl(&["pause", "pg", "--reason", "restart PostgreSQL"]);
    let n1 = &pg.nodes[0];
    let restarted = pg
        .pg("pg_ctl")
        .args([
            "restart",
            "-m",
            "fast",
            "-w",
            "-o",
            &format!("-p {}", n1.port),
            "-D",
        ])
        .arg(&n1.data)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(restarted.success());
    // Well past the crash failover bound (2.03 s) and K failed checks.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(pg.is_primary(0), Some(true), "n1 is no longer the primary");
    for i in 1..3 {
        assert_eq!(
            pg.is_primary(i),
            Some(false),
            "{} was promoted",
            pg.nodes[i].name
        );
    }
    ctl(&["resume", "pg"]);
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));
    let acks = writer.stop();
    assert_eq!(
        one_primary_at_a_time(&acks),
        [n1.port],
        "writes went elsewhere:\n{}",
        logs(&agents)
    );
    assert!(
        !logs(&agents).contains("putex-pg deactivate: pg_ctl stop"),
        "putex stopped PostgreSQL while paused:\n{}",
        logs(&agents)
    );
}

/// O3 with PostgreSQL: a replica whose replay is paused lags by more than
/// `--max-lag` and is not promoted when the primary crashes, however long
/// the lock stays unheld; once its replay resumes and catches up, it is.
#[test]
fn postgres_a_lagging_replica_is_not_promoted_until_it_catches_up() {
    let server = NatsServer::start();
    let pg = PgCluster::create(2, false);
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&server.url);
    let mut agents = cluster(&server.url, &pg, &["--max-lag", "65536"]);
    pg.sql(1, "select pg_wal_replay_pause()").unwrap();
    let writer = Writer::start(pg.primary_conninfo());
    // Well over --max-lag of WAL that n2 receives but does not replay.
    pg.sql(
        0,
        "create table putex_ballast as select g, repeat('x', 200) as pad from generate_series(1, 20000) g",
    )
    .unwrap();
    assert!(wait_acks(&writer, 50, Duration::from_secs(20)), "no writes");
    std::thread::sleep(Duration::from_secs(1)); // positions published
    let acked = writer.stop();
    agents[0].crash();
    pg.kill_server(0);
    std::thread::sleep(Duration::from_secs(6)); // three times B
    assert_eq!(
        pg.is_primary(1),
        Some(false),
        "the lagging replica was promoted:\n{}",
        logs(&agents)
    );
    let status = crate::common::agent::status_json(&server.url, "pg").to_string();
    assert!(
        status.contains("lagging"),
        "status does not say why: {status}"
    );
    pg.sql(1, "select pg_wal_replay_resume()").unwrap();
    assert!(
        wait_for(Duration::from_secs(15), || pg.is_primary(1) == Some(true)),
        "the caught-up replica was not promoted:\n{}",
        logs(&agents)
    );
    assert_eq!(
        lost(&pg, 1, &acked),
        Vec::<i64>::new(),
        "acknowledged writes lost"
    );
}

/// The primary cut off from the store (its agent's connection blackholed
/// by a TCP proxy): its keeper stops PostgreSQL at the licence's end, before
/// the replica is promoted — checked from writers pinned to each server:
/// the last write n1 acknowledged comes before the first n2 acknowledged.
#[test]
fn postgres_the_primary_cut_off_from_the_store_stops_before_a_replica_is_promoted() {
    cut_off_case(false);
}

/// The same with a wedged primary: its postmaster is SIGSTOPped as it is
/// cut off, so neither a fast nor an immediate shutdown can stop it, while
/// the writer's backend goes on committing. The recipe's emergency stop
/// escalates to SIGKILL of the postmaster and its children, within G
/// (`--confirm 8`: 4 s; `--emergency-timeout 3s` covers 1 s fast, 1 s
/// immediate, the kill) — the backend's last commit still comes before the
/// replica's first. The servers run as systemd units (the `systemctl`
/// stand-in), so the fast step is a `systemctl stop` that never returns.
#[test]
fn postgres_a_wedged_primary_cut_off_is_killed_before_a_replica_is_promoted() {
    cut_off_case(true);
}

fn cut_off_case(wedged: bool) {
    use crate::common::proxy::{Mode, Proxy};
    let server = NatsServer::start();
    let proxy =
        Proxy::start_blocking(format!("127.0.0.1:{}", server.port()).parse().unwrap()).unwrap();
    let mut pg = PgCluster::create(2, false);
    // The turn among timing-sensitive tests starts once the servers are
    // made (initdb, base backups: seconds of work that measures nothing).
    let _slot = turn_on_a_used_lock(&server.url);
    if wedged {
        // Its fast step goes through `timeout 1 systemctl stop`.
        pg.use_systemctl_stand_in();
    }
    let extra: &[&str] = if wedged {
        &["--confirm", "8", "--emergency-timeout", "3s"]
    } else {
        &[]
    };
    let mut agents = vec![agent(&proxy.url(), &pg, 0, extra)];
    assert!(
        wait_for(Duration::from_secs(30), || pg.is_primary(0) == Some(true)),
        "n1 did not become the primary:\n{}",
        logs(&agents)
    );
    agents.push(agent(&server.url, &pg, 1, extra));
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(0) == ["n2"]),
        "n2 does not stream from n1:\n{}",
        logs(&agents)
    );
    let pinned = |i: usize| {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres \
             target_session_attrs=read-write connect_timeout=1",
            pg.nodes[i].port
        )
    };
    let on_n1 = Writer::start(pinned(0));
    let on_n2 = Writer::start_after(pinned(1), 1_000_000_000);
    assert!(
        wait_acks(&on_n1, 50, Duration::from_secs(20)),
        "no writes on n1"
    );
    let cut = wall_ns();
    proxy.set(Mode::Blackhole);
    let postmaster = pg.postmaster(0).expect("n1's postmaster");
    if wedged {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(postmaster),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(20), || !on_n2.acks().is_empty()),
        "n2 never took writes:\n{}",
        logs(&agents)
    );
    assert!(wait_acks(&on_n2, 20, Duration::from_secs(10)));
    let (n1_acks, n2_acks) = (on_n1.stop(), on_n2.stop());
    let last_n1 = n1_acks.last().unwrap().ns;
    let first_n2 = n2_acks.first().unwrap().ns;
    eprintln!(
        "cut off at 0: n1's last write acknowledged at {:.0} ms, n2's first at {:.0} ms",
        ms(Duration::from_nanos((last_n1 - cut) as u64)),
        ms(Duration::from_nanos((first_n2 - cut) as u64))
    );
    if std::env::var_os("PUTEX_PG_LOGS").is_some() {
        eprintln!("{}", logs(&agents));
    }
    assert!(
        last_n1 < first_n2,
        "two primaries acknowledged writes: n1 until {last_n1}, n2 from {first_n2}:\n{}",
        logs(&agents)
    );
    assert_eq!(pg.is_primary(0), None, "n1's server still runs");
    if wedged {
        let n1 = agents[0].log_text();
        assert!(
            n1.contains("SIGKILL to the postmaster"),
            "the emergency stop did not escalate to SIGKILL:\n{n1}"
        );
        // Gone, or a zombie nobody reaped yet (killed all the same).
        let stat = std::fs::read_to_string(format!("/proc/{postmaster}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "n1's postmaster survived: {stat}"
        );
    }
    proxy.set(Mode::Pass);
}

/// `packaging/postgresql/demo`, as a newcomer runs it, with this build.
#[test]
fn postgres_the_demo_runs_and_shows_the_failover_and_the_rejoin() {
    let _slot = timing_slot();
    let demo = putex_testkit::postgres::putex_pg_script().with_file_name("demo");
    let out = std::process::Command::new(demo)
        .env("PUTEX", crate::common::agent::putex_bin())
        .env("PGBIN", putex_testkit::postgres::pg_bin())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "promoted; first write acknowledged on it",
        "streams from",
        "pg_rewind",
        "of them missing on the new primary",
    ] {
        assert!(
            text.contains(line),
            "the demo did not say {line:?}:\n{text}"
        );
    }
    // The demo replicates asynchronously: a host crash may lose the last
    // acknowledged writes (one every 20 ms), not more than the replication
    // lag of loopback. (CI s19c, PostgreSQL 16: 1 of 113.)
    let missing: u32 = text
        .lines()
        .find_map(|l| {
            l.split_once(" of them missing")?
                .0
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .expect("the count of missing writes");
    assert!(missing <= 5, "{missing} acknowledged writes lost:\n{text}");
}
