//! Bootstrap (`docs/postgresql.md`, "Bootstrap"): three nodes with empty
//! data directories and the recipe's configuration as the guide writes it
//! (`packaging/postgresql/bootstrap/postgresql.conf` and `pg_hba.conf`,
//! passwords in `~/.pgpass`, initdb's default options: peer and
//! scram-sha-256). Both sides: one node initialises the cluster and the
//! others are cloned from it and stream; a replica whose data directory was
//! deleted is cloned again; and once the cluster was initialised, empty
//! data directories are never initialised again, and say why.

use std::time::{Duration, Instant};

use putex_testkit::postgres::{PgCluster, Writer};

use super::{agent, logs, lost, wait_acks};
use crate::common::agent::{putex, timing_slot, wait_for, Agent};
use crate::common::nats_server::NatsServer;

/// Whether node `i` has a data directory (initialised or cloned).
fn has_data(pg: &PgCluster, i: usize) -> bool {
    pg.nodes[i].data.join("PG_VERSION").exists()
}

/// Which node is the primary, once one is.
fn primary(pg: &PgCluster) -> Option<usize> {
    (0..pg.nodes.len()).find(|&i| pg.is_primary(i) == Some(true))
}

/// Stops node `i`'s server if it runs (an agent's clean stop stops a
/// primary's, not a replica's).
fn stop_if_running(pg: &PgCluster, i: usize) {
    if pg.postmaster(i).is_some() {
        pg.stop_server(i);
    }
}

#[test]
fn postgres_bootstrap_from_empty_data_directories() {
    let server = NatsServer::start();
    let _slot = timing_slot();
    let url = server.url.clone();
    let pg = PgCluster::as_the_guide_says(3, false, crate::common::agent::putex_bin());
    let started = Instant::now();
    let mut agents: Vec<Option<Agent>> = (0..3).map(|i| Some(agent(&url, &pg, i, &[]))).collect();
    let all_logs = |agents: &[Option<Agent>]| {
        agents
            .iter()
            .flatten()
            .map(|a| a.log_text())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // One primary, two replicas streaming from it.
    assert!(
        wait_for(Duration::from_secs(90), || primary(&pg)
            .is_some_and(|p| pg.streaming_from(p).len() == 2)),
        "no primary with two streaming replicas:\n{}",
        all_logs(&agents)
    );
    let ready = started.elapsed();
    let p = primary(&pg).unwrap();
    let sysid = pg
        .sql(p, "select system_identifier from pg_control_system()")
        .unwrap();
    let mark = putex()
        .args(["kv", "get", "putex-pg.pg.system", "--store", &url])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&mark.stdout).trim(),
        sysid,
        "the store names the cluster"
    );
    for i in 0..3 {
        // A replica streams a moment before it accepts connections.
        let of = || pg.sql(i, "select system_identifier from pg_control_system()");
        assert!(
            wait_for(Duration::from_secs(10), || of().as_ref() == Ok(&sysid)),
            "node {i} is not a copy of the initialised cluster {sysid}: {:?}",
            of()
        );
    }
    // The writer reaches it with the password the bootstrap set.
    let conninfo = pg.guide_conninfo();
    let writer = Writer::start(conninfo);
    assert!(wait_acks(&writer, 50, Duration::from_secs(20)), "no writes");
    // A replica whose data directory is deleted is cloned again.
    let r = (0..3).find(|&i| i != p).unwrap();
    if let Some(mut a) = agents[r].take() {
        a.stop_cleanly();
    }
    stop_if_running(&pg, r);
    std::fs::remove_dir_all(&pg.nodes[r].data).unwrap();
    let again = Instant::now();
    agents[r] = Some(agent(&url, &pg, r, &[]));
    let name = pg.nodes[r].name.clone();
    assert!(
        wait_for(Duration::from_secs(60), || pg
            .streaming_from(p)
            .contains(&name)),
        "{name}, deleted, was not cloned again:\n{}",
        all_logs(&agents)
    );
    let recloned = again.elapsed();
    // The follow hook that cloned it returns a moment after the replica
    // streams; stopping the agent before would cancel it, and a cancelled
    // hook's tree is killed — a server whose `pg_ctl start` has not
    // returned yet included (only a daemon whose starter exited outlives
    // it).
    assert!(
        wait_for(Duration::from_secs(30), || agents[r].as_ref().is_some_and(
            |a| a.log_text().contains(r#"hook finished hook="follow""#)
        )),
        "{name}'s follow hook did not finish:\n{}",
        all_logs(&agents)
    );
    let acks = writer.stop();
    assert!(
        wait_for(Duration::from_secs(10), || lost(&pg, r, &acks).is_empty()),
        "the recloned replica lacks acknowledged writes"
    );
    println!(
        "bootstrap: primary {} with two streaming replicas {:.1} s after three agents started on empty data directories; \
         {name} deleted and streaming again {:.1} s after its agent started; 0 of {} writes missing",
        pg.nodes[p].name,
        ready.as_secs_f64(),
        recloned.as_secs_f64(),
        acks.len()
    );
    // Every data directory gone: nobody initialises again, and says why.
    // The replicas' agents first: the primary's would hand over.
    for i in (0..3).filter(|&i| i != p).chain([p]) {
        if let Some(mut a) = agents[i].take() {
            a.stop_cleanly();
        }
    }
    for i in 0..3 {
        stop_if_running(&pg, i);
        std::fs::remove_dir_all(&pg.nodes[i].data).unwrap();
    }
    let agents: Vec<Agent> = (0..3).map(|i| agent(&url, &pg, i, &[])).collect();
    assert!(
        wait_for(Duration::from_secs(20), || agents
            .iter()
            .all(|a| a.log_text().contains("never initialised again"))),
        "the agents did not say why they wait:\n{}",
        logs(&agents)
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        (0..3).all(|i| !has_data(&pg, i)),
        "an empty data directory was initialised again:\n{}",
        logs(&agents)
    );
}

/// The same start in synchronous mode (`SYNC=on`, `--max-lag 0`): the
/// settings the recipe gives the new cluster (a synchronous primary's
/// `synchronous_standby_names`) do not hold up its own making, and the
/// first commits are acknowledged once a replica streams.
#[test]
fn postgres_bootstrap_in_synchronous_mode() {
    let server = NatsServer::start();
    let _slot = timing_slot();
    let url = server.url.clone();
    let pg = PgCluster::as_the_guide_says(3, true, crate::common::agent::putex_bin());
    let started = Instant::now();
    let agents: Vec<Agent> = (0..3)
        .map(|i| agent(&url, &pg, i, &["--max-lag", "0"]))
        .collect();
    assert!(
        wait_for(Duration::from_secs(90), || primary(&pg)
            .is_some_and(|p| pg.streaming_from(p).len() == 2)),
        "no primary with two streaming replicas:\n{}",
        logs(&agents)
    );
    let ready = started.elapsed();
    let p = primary(&pg).unwrap();
    assert_eq!(
        pg.sql(p, "show synchronous_standby_names").as_deref(),
        Ok("ANY 1 (*)"),
        "the primary is not synchronous"
    );
    let writer = Writer::start(pg.guide_conninfo());
    assert!(
        wait_acks(&writer, 50, Duration::from_secs(20)),
        "no writes:\n{}",
        logs(&agents)
    );
    let acks = writer.stop();
    println!(
        "synchronous bootstrap: primary {} with two streaming replicas {:.1} s after three agents started on empty data directories; {} writes acknowledged",
        pg.nodes[p].name,
        ready.as_secs_f64(),
        acks.len()
    );
}
