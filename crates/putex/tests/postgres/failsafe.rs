//! A store outage under a writing PostgreSQL cluster (failsafe, issue 46):
//! the nats-server frozen while the writer inserts. With `--failsafe` on
//! every node the primary keeps its role on its replicas' grants: the
//! writer sees no failed write and the primary never changes. Without it
//! the primary stops at T, writes fail from about T into the outage, and
//! come back once the store does.
//!
//! The outage lasts `PUTEX_TEST_OUTAGE` seconds (the 60, by hand),
//! 10 in the suite.

use std::time::Duration;

use putex_testkit::postgres::{write_outages, PgCluster, Writer};

use super::{cluster_each, logs, lost, one_primary_at_a_time, turn_on_a_used_lock, wait_acks};
use crate::common::agent::{status_json, wait_for, wall_ns};
use crate::common::nats_server::NatsServer;
use crate::failsafe::outage;

/// T of the PostgreSQL tests' timing (R = 500 ms, F = 3).
const T: Duration = Duration::from_millis(1500);

#[test]
fn postgres_failsafe_a_store_outage_fails_no_write() {
    outage_case(true);
}

#[test]
fn postgres_without_failsafe_a_store_outage_stops_writes_at_t() {
    outage_case(false);
}

fn outage_case(failsafe: bool) {
    let server = NatsServer::start();
    let url = server.url.clone();
    let pg = PgCluster::create(3, false);
    let key = pg.put_file(
        "failsafe.key",
        "the cluster's failsafe key: 32 bytes or more\n",
        0o600,
    );
    let ports: Vec<u16> = (0..3).map(|_| putex_testkit::ports::free_port()).collect();
    let _slot = turn_on_a_used_lock(&url);
    let cap = format!("{}s", outage().as_secs() + 20);
    let agents = cluster_each(&url, &pg, |i| {
        let mut f = vec!["--http".to_owned(), format!("127.0.0.1:{}", ports[i])];
        if failsafe {
            f.extend([
                "--failsafe".to_owned(),
                "--failsafe-key-file".into(),
                key.display().to_string(),
                "--failsafe-max".into(),
                cap.clone(),
            ]);
        }
        f
    });
    if failsafe {
        // The holder's record carries the set once every member published
        // its endpoint and a renewal passed.
        assert!(
            crate::failsafe::endpoints_published(&url, "pg", 3, Duration::from_secs(20)),
            "no failsafe endpoints in status: {}\n{}",
            status_json(&url, "pg"),
            logs(&agents)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let writer = Writer::start(pg.primary_conninfo());
    assert!(
        wait_acks(&writer, 200, Duration::from_secs(20)),
        "no writes:\n{}",
        logs(&agents)
    );

    let down = wall_ns();
    server.pause();
    let mut others_primary = Vec::new();
    let until = std::time::Instant::now() + outage();
    while std::time::Instant::now() < until {
        for i in 1..3 {
            if pg.is_primary(i) == Some(true) {
                others_primary.push(pg.nodes[i].name.clone());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let up = wall_ns();
    server.resume();
    // Back to normal: writes on a primary, whichever it is.
    assert!(
        wait_for(Duration::from_secs(30), || writer
            .acks()
            .last()
            .is_some_and(|a| a.ns > up)),
        "no write acknowledged after the store came back:\n{}",
        logs(&agents)
    );
    let back = writer.acks().into_iter().find(|a| a.ns > up).unwrap();
    assert!(wait_acks(&writer, 100, Duration::from_secs(20)));
    let acks = writer.stop();
    one_primary_at_a_time(&acks);
    let primary = pg
        .nodes
        .iter()
        .position(|n| n.port == acks.last().unwrap().port)
        .unwrap();
    let lost = lost(&pg, primary, &acks);
    let gaps: Vec<(Duration, Duration)> = write_outages(&acks, Duration::from_millis(500))
        .into_iter()
        .filter(|(from, to)| *to > down && *from < up)
        .map(|(from, to)| {
            (
                Duration::from_nanos(from.saturating_sub(down) as u64),
                Duration::from_nanos((to - from) as u64),
            )
        })
        .collect();
    let written = acks.iter().filter(|a| a.ns > down && a.ns < up).count();
    eprintln!(
        "store frozen {:?} ({}): {written} writes acknowledged during it; writes failed for \
         {gaps:?} (start into the outage, length); first write {:.0} ms after the store came \
         back, on {}; {} of {} acknowledged writes lost",
        outage(),
        if failsafe { "failsafe" } else { "no failsafe" },
        (back.ns.saturating_sub(up)) as f64 / 1e6,
        pg.nodes[primary].name,
        lost.len(),
        acks.len()
    );
    assert_eq!(lost, Vec::<i64>::new(), "acknowledged writes lost");
    if failsafe {
        assert!(
            gaps.is_empty(),
            "writes failed during the outage: {gaps:?}\n{}",
            logs(&agents)
        );
        assert!(others_primary.is_empty(), "{others_primary:?} primary too");
        assert_eq!(primary, 0, "the primary changed:\n{}", logs(&agents));
    } else {
        // The primary stops at T; the writer's next attempt fails.
        let first = gaps.first().copied();
        assert!(
            first.is_some_and(|(at, _)| at <= T + Duration::from_millis(500)),
            "writes did not stop by T: {gaps:?}\n{}",
            logs(&agents)
        );
        assert!(
            acks.iter()
                .all(|a| a.ns < down + (T * 2).as_nanos() || a.ns > up),
            "writes acknowledged well past T into the outage:\n{}",
            logs(&agents)
        );
    }
    drop(agents);
}
