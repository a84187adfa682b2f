//! Replication slots (`docs/postgresql.md`, "Replication slots"): the
//! primary keeps the WAL of a replica that is away, through the slot the
//! replica was made with (`pg_basebackup -C -S putex_n3`, as the guide
//! says); the slot of a member gone longer than `SLOT_KEEP` is dropped, and
//! that member, back, is rebuilt from the primary since its WAL is gone.
//!
//! The primary recycles WAL eagerly here (`max_wal_size` 32 MB, a
//! checkpoint and a segment switch every few seconds, no `wal_keep_size`),
//! so that a replica could not come back without its slot.

use std::time::{Duration, Instant};

use putex_testkit::postgres::{PgCluster, Writer};

use super::{agent, cluster, logs, lost, turn_on_a_used_lock, wait_acks, Kind, StoreServer};
use crate::common::agent::{wait_for, Agent};

/// The primary (node 0) recycles WAL as soon as it may.
fn recycle_eagerly(pg: &PgCluster) {
    for sql in [
        "alter system set max_wal_size = '32MB'",
        "alter system set min_wal_size = '32MB'",
        "select pg_reload_conf()",
    ] {
        pg.sql(0, sql).expect("set the primary's WAL sizes");
    }
}

/// Writes WAL on the primary: the writer's rows, a segment switch and a
/// checkpoint (which removes or recycles every segment nothing holds). A
/// failure (node `i` no longer the primary: CI once saw n1 read-only here)
/// shows the agents' logs.
fn churn(pg: &PgCluster, i: usize, agents: &[Agent]) {
    let run = |what: &str, sql: &str| {
        if let Err(e) = pg.sql(i, sql) {
            panic!("{what} on node {i}: {e}\n{}", logs(agents));
        }
    };
    run(
        "write rows",
        "create table if not exists churn (v text);
         insert into churn select repeat('x', 500) from generate_series(1, 2000)",
    );
    run("switch WAL", "select pg_switch_wal()");
    run("checkpoint", "checkpoint");
}

/// The slots on node `i`, as `name=active` lines sorted by name.
fn slots_on(pg: &PgCluster, i: usize) -> Vec<String> {
    pg.sql(
        i,
        "select slot_name || case when active then '=t' else '=f' end
         from pg_replication_slots order by 1",
    )
    .map(|s| s.lines().map(str::to_owned).collect())
    .unwrap_or_default()
}

/// Bytes of WAL between the slot's restart point and the primary's
/// position, and whether the segment at its restart point is still in
/// `pg_wal`.
fn held_back(pg: &PgCluster, slot: &str) -> (u64, bool) {
    let row = pg
        .sql(
            0,
            &format!(
                "select pg_current_wal_lsn() - restart_lsn,
                        exists (select from pg_ls_waldir() where name = pg_walfile_name(restart_lsn))
                 from pg_replication_slots where slot_name = '{slot}'"
            ),
        )
        .expect("read the slot");
    let (bytes, kept) = row
        .split_once('|')
        .unwrap_or_else(|| panic!("no slot {slot}: {row:?}"));
    (bytes.parse().expect("a byte count"), kept == "t")
}

/// Node n3 leaves: its agent stops, then its server.
fn leave(pg: &PgCluster, agents: &mut Vec<Agent>) {
    agents[2].stop_cleanly();
    // Dropped now: dropping it later would kill its successor's keeper
    // (the same keeper directory).
    drop(agents.remove(2));
    pg.stop_server(2);
}

/// n3 [`leave`]s and stays away until n1 dropped its slot (`SLOT_KEEP`)
/// and kept n2's, then until n1 no longer has the WAL segment n3 will ask
/// for: how long the slot took to go.
fn away_until_its_slot_is_dropped(pg: &PgCluster, agents: &mut Vec<Agent>) -> Duration {
    leave(pg, agents);
    let gone = Instant::now();
    // n3 received nothing beyond n1's position once n3's server stopped:
    // the segment it will ask for is this one or an earlier one.
    let stopped_at = pg
        .sql(0, "select pg_current_wal_lsn()")
        .expect("n1's position");
    assert!(
        wait_for(Duration::from_secs(40), || slots_on(pg, 0)
            == ["putex_n2=t"]),
        "n1's slots {:?}:\n{}",
        slots_on(pg, 0),
        logs(agents)
    );
    let dropped = gone.elapsed();
    // Segments recycled for later use carry later names; none at or before
    // n3's is left once n1 removed what n3 needs.
    let kept = || {
        pg.sql(
            0,
            &format!(
                "select count(*) from pg_ls_waldir() where name ~ '^[0-9A-F]{{24}}$' \
                 and name <= pg_walfile_name('{stopped_at}')"
            ),
        )
        .expect("list n1's WAL")
            != "0"
    };
    for _ in 0..30 {
        if !kept() {
            break;
        }
        churn(pg, 0, agents);
    }
    assert!(
        !kept(),
        "n1 still has WAL n3 may ask for (at or before {stopped_at})"
    );
    dropped
}

/// The agents' timing where the primary churns WAL: a renewal every second
/// and twice the suite's 250 ms for a health check. Under a churn (a
/// checkpoint each time) on a loaded machine a query took longer than
/// 250 ms, and a holder renews only after a check that passed (H2): CI once
/// saw n1 lapse after three slow checks in a row. (R = 2 s cost 9 s of
/// first-use wait per test.) What these tests prove is about slots, not
/// about how fast a failure is noticed.
const UNDER_CHURN: [&str; 4] = ["--renew", "1s", "--healthcheck-timeout", "500ms"];

/// How long n3 stays away at least, even when its slot held enough WAL
/// back sooner: longer than the primary's slot upkeep cadence (10 s), so
/// that an upkeep round runs while n3 is gone and keeps its slot.
const AWAY_AT_LEAST: Duration = Duration::from_secs(15);

/// Node n3 is stopped (its agent and its server) while the primary takes
/// writes and recycles WAL, until its slot holds back more than four times
/// `max_wal_size` (with the segment it needs still there) and at least
/// [`AWAY_AT_LEAST`]; back, n3 streams again with no rebuild and holds
/// every acknowledged write. The other replica streams through its slot
/// throughout.
#[test]
fn postgres_a_replica_away_under_load_streams_again_through_its_slot() {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(3, false);
    let _slot = turn_on_a_used_lock(&url);
    let mut agents = cluster(&url, &pg, &UNDER_CHURN);
    recycle_eagerly(&pg);
    assert_eq!(
        slots_on(&pg, 0),
        ["putex_n2=t", "putex_n3=t"],
        "n1's slots:\n{}",
        logs(&agents)
    );

    leave(&pg, &mut agents);
    let writer = Writer::start(pg.primary_conninfo());
    let away = Instant::now();
    // A segment switch and a checkpoint every second: WAL moves on by a
    // segment (16 MB) and the checkpoint recycles what nothing holds.
    let enough = |(bytes, kept): (u64, bool)| bytes > 4 * 32 * 1024 * 1024 && kept;
    while away.elapsed() < AWAY_AT_LEAST || !enough(held_back(&pg, "putex_n3")) {
        assert!(
            away.elapsed() < Duration::from_secs(60),
            "n3's slot after {:?} away: {:?} (bytes held back, its segment kept)",
            away.elapsed(),
            held_back(&pg, "putex_n3")
        );
        churn(&pg, 0, &agents);
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(wait_acks(&writer, 100, Duration::from_secs(10)));
    let (bytes, kept) = held_back(&pg, "putex_n3");
    assert!(
        enough((bytes, kept)),
        "n3's slot holds back {bytes} bytes, its segment kept: {kept}"
    );
    assert_eq!(slots_on(&pg, 0), ["putex_n2=t", "putex_n3=f"]);

    let away_for = away.elapsed();
    let back = Instant::now();
    agents.push(agent(&url, &pg, 2, &UNDER_CHURN));
    assert!(
        wait_for(Duration::from_secs(30), || pg.streaming_from(0)
            == ["n2", "n3"]),
        "n3 does not stream from n1 again ({:?}):\n{}",
        pg.streaming_from(0),
        logs(&agents)
    );
    let acks = writer.stop();
    assert!(
        wait_for(Duration::from_secs(10), || lost(&pg, 2, &acks).is_empty()),
        "n3 lacks acknowledged writes: {:?}",
        lost(&pg, 2, &acks)
    );
    let streaming = back.elapsed();
    let n3 = agents[2].log_text();
    assert!(
        n3.contains("through the slot putex_n3") && !n3.contains("rebuil"),
        "n3 did not simply stream through its slot:\n{n3}"
    );
    println!(
        "n3 away {:.0} s: its slot held back {} MB (max_wal_size 32 MB), its segment kept; \
         back, streaming {} ms after its agent started; 0 of {} acknowledged writes missing",
        away_for.as_secs_f64(),
        bytes >> 20,
        streaming.as_millis(),
        acks.len()
    );
}

/// A member whose record is older than `SLOT_KEEP` (5 s here) loses its
/// slot, while the other replica keeps its own; once WAL moved on, the
/// member, back, is told by its server that the WAL is gone, is rebuilt
/// from the primary (`REBUILD`, the old data kept aside) and streams.
#[test]
fn postgres_a_long_gone_members_slot_is_dropped_and_it_comes_back_rebuilt() {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(3, false);
    for i in 0..3 {
        pg.configure(i, "SLOT_KEEP=5");
    }
    let _slot = turn_on_a_used_lock(&url);
    let mut agents = cluster(&url, &pg, &UNDER_CHURN);
    recycle_eagerly(&pg);

    let dropped_after = away_until_its_slot_is_dropped(&pg, &mut agents);
    assert!(
        dropped_after >= Duration::from_secs(5),
        "n3's slot dropped {dropped_after:?} after it left, before SLOT_KEEP"
    );
    assert!(agents[0]
        .log_text()
        .contains("replication slot putex_n3 dropped: its member was last heard from"));
    let writer = Writer::start(pg.primary_conninfo());
    assert!(wait_acks(&writer, 50, Duration::from_secs(10)));

    let back = Instant::now();
    agents.push(agent(&url, &pg, 2, &UNDER_CHURN));
    assert!(
        wait_for(Duration::from_secs(60), || pg.streaming_from(0)
            == ["n2", "n3"]),
        "n3 does not stream from n1 again ({:?}):\n{}",
        pg.streaming_from(0),
        logs(&agents)
    );
    let streaming = back.elapsed();
    let n3 = agents[2].log_text();
    assert!(
        n3.contains("no longer has the WAL this replica needs") && n3.contains("rebuilt"),
        "n3 was not rebuilt:\n{n3}"
    );
    let old = pg.nodes[2].data.with_extension("putex-old");
    assert!(
        old.join("PG_VERSION").exists(),
        "n3's old data is not kept in {old:?}"
    );
    let acks = writer.stop();
    assert!(
        wait_for(Duration::from_secs(10), || lost(&pg, 2, &acks).is_empty()),
        "n3 lacks acknowledged writes: {:?}",
        lost(&pg, 2, &acks)
    );
    assert_eq!(slots_on(&pg, 0), ["putex_n2=t", "putex_n3=t"]);
    println!(
        "n3's slot dropped {} ms after it left (SLOT_KEEP 5 s; n2's kept); back, rebuilt and \
         streaming {} ms after its agent started; 0 of {} acknowledged writes missing",
        dropped_after.as_millis(),
        streaming.as_millis(),
        acks.len()
    );
}

/// A follow that keeps failing says why where operators look: with
/// `REBUILD=off`, n3 comes back after its slot was dropped and its WAL
/// removed; its follow fails every T, and `putex status` shows its
/// `why_not` as `follow failing: exit 1: …` ending with the server's own
/// complaint (`requested WAL segment … has already been removed`).
#[test]
fn postgres_a_failing_follow_says_why_in_status() {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(3, false);
    for i in 0..3 {
        pg.configure(i, "SLOT_KEEP=5");
    }
    pg.configure(2, "REBUILD=off\nFOLLOW_TIMEOUT=5");
    let _slot = turn_on_a_used_lock(&url);
    let mut agents = cluster(&url, &pg, &[]);
    recycle_eagerly(&pg);

    // --info: each member's own account, a column per field (run every
    // 3 R: the first may still have found the server stopped).
    let info = |node: &str| {
        crate::common::agent::status_json(&url, "pg")["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["node"] == node)
            .map(|m| m["info"].clone())
            .unwrap_or_default()
    };
    assert!(
        wait_for(Duration::from_secs(10), || {
            let (n1, n2) = (info("n1"), info("n2"));
            n1["server"] == "primary"
                && n1["timeline"] == "1"
                && n2["server"] == "replica"
                && n2["receiver"] == "streaming"
        }),
        "n1's info {}, n2's {}",
        info("n1"),
        info("n2")
    );

    away_until_its_slot_is_dropped(&pg, &mut agents);
    agents.push(agent(&url, &pg, 2, &[]));
    let why_not = || {
        crate::common::agent::status_json(&url, "pg")["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["node"] == "n3")
            .and_then(|m| m["why_not"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    assert!(
        wait_for(Duration::from_secs(40), || {
            let w = why_not();
            w.contains("follow failing: exit 1: ")
                && w.contains("requested WAL segment")
                && w.contains("has already been removed")
        }),
        "n3's why_not: {:?}\n{}",
        why_not(),
        logs(&agents)
    );
    let table = crate::common::agent::putex()
        .args(["status", "pg", "--store", &url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("RECEIVER")
            && table.contains("TIMELINE")
            && table.contains("follow failing"),
        "{table}"
    );
    println!("{table}");
}
