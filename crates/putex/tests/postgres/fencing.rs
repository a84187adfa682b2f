//! Fencing a deposed primary (`docs/postgresql.md`, "Fencing a deposed
//! primary"): the recipe records each promoted primary's token in
//! `putex.primary_token`, and `putex.fence()` refuses the statements of a
//! session that names a higher token than the server's own. Two ways a
//! deposed primary comes back, both sides each time: the deposed server
//! refuses the fenced write, the current primary takes it.

use std::time::Duration;

use nix::sys::signal::Signal;
use putex_testkit::postgres::{PgCluster, Session};

use super::{cluster, logs, turn_on_a_used_lock, Kind, StoreServer};
use crate::common::agent::{wait_for, Agent};
use putex_testkit::agent::{descendants, signal};

/// The token node `i`'s database recorded at its promotion.
fn token_in(pg: &PgCluster, i: usize) -> Result<String, String> {
    pg.sql(
        i,
        "select epoch || ':' || revision from putex.primary_token",
    )
}

/// The token `node`'s member record names.
fn member_token(url: &str, node: &str) -> Option<String> {
    let st = crate::common::agent::status_json(url, "pg");
    st["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["node"] == node))
        .and_then(|m| m["token"].as_str().map(str::to_owned))
}

/// A two-node cluster whose primary n1 has recorded its token and has a
/// fenced table `orders` that has reached n2; n1's token.
fn fenced_cluster(url: &str, pg: &PgCluster) -> (Vec<Agent>, String) {
    let agents = cluster(url, pg, &[]);
    let t1 = token_in(pg, 0).expect("n1 recorded its token");
    assert_eq!(
        Some(t1.clone()),
        member_token(url, "n1"),
        "{}",
        logs(&agents)
    );
    pg.sql(
        0,
        "create table orders (id int); \
         create trigger fenced before insert or update or delete on orders \
         for each statement execute function putex.fence()",
    )
    .unwrap();
    // Asynchronous replication: n2 has the table a moment later (on a busy
    // machine, not always before the fault that follows).
    assert!(
        wait_for(Duration::from_secs(10), || pg
            .sql(1, "select to_regclass('orders') is not null")
            .is_ok_and(|t| t == "t")),
        "the table did not reach n2"
    );
    (agents, t1)
}

/// Waits until n2 is the primary with a token of its own, higher than
/// `t1`, which its member record names too; that token.
fn n2_promoted(url: &str, pg: &PgCluster, agents: &[Agent], t1: &str) -> String {
    assert!(
        wait_for(Duration::from_secs(30), || pg.is_primary(1) == Some(true)
            && token_in(pg, 1).is_ok_and(|t| t != t1)),
        "n2 was not promoted with a token of its own:\n{}",
        logs(agents)
    );
    let t2 = token_in(pg, 1).unwrap();
    let parse = |t: &str| putex::core::Token::parse(t).unwrap();
    assert!(parse(&t2) > parse(t1), "{t2} after {t1}");
    // n2's member record is written after its transition, on its own
    // schedule: it names the token the database recorded soon after.
    let mut seen = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            seen = member_token(url, "n2");
            seen.as_deref() == Some(t2.as_str())
        }),
        "n2's member record says token {seen:?}, its database {t2}:\n{}",
        logs(agents)
    );
    t2
}

/// A statement of a session that names `token`.
fn fenced_insert(token: &str, id: i32) -> String {
    format!("set putex.token = '{token}'; insert into orders values ({id})")
}

/// n2 takes a fenced write naming its token (a busy machine may have made
/// n2 step down meanwhile on slow health checks: then it takes the lock
/// again, with a higher token, which a session naming t2 still passes).
fn current_primary_takes_it(pg: &PgCluster, agents: &[Agent], t2: &str, id: i32) {
    let mut last = Err(String::new());
    assert!(
        wait_for(Duration::from_secs(30), || {
            last = pg.sql(1, &fenced_insert(t2, id));
            last.is_ok()
        }),
        "the current primary refused a fenced write: {last:?}\n{}",
        logs(agents)
    );
}

/// A deposed primary started by hand (its host crashed, n2 was promoted,
/// then someone ran `pg_ctl start` on n1's data directory: two primaries)
/// refuses the writes of a session that names the current primary's token,
/// which the current primary accepts.
#[test]
fn postgres_a_deposed_primary_started_by_hand_refuses_fenced_writes() {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(2, false);
    let _slot = turn_on_a_used_lock(&url);
    let (mut agents, t1) = fenced_cluster(&url, &pg);

    // n1's host crashes; n2 is promoted and records its own, higher token.
    agents[0].crash();
    pg.kill_server(0);
    let t2 = n2_promoted(&url, &pg, &agents, &t1);

    // n1's server started by hand: a second primary, with n1's token.
    drop(agents.remove(0));
    pg.start_server(0);
    assert_eq!(pg.is_primary(0), Some(true));
    assert_eq!(token_in(&pg, 0), Ok(t1.clone()));
    let refused = pg
        .sql(0, &fenced_insert(&t2, 1))
        .expect_err("the deposed primary took a fenced write");
    assert!(refused.contains("not the current primary"), "{refused}");
    current_primary_takes_it(&pg, &agents, &t2, 2);
    // Sessions that name no token are not checked: the fence is theirs to ask for.
    pg.sql(0, "insert into orders values (3)").unwrap();
    assert_eq!(
        pg.sql(0, "select string_agg(id::text, ',') from orders"),
        Ok("3".into())
    );
    assert_eq!(
        pg.sql(1, "select string_agg(id::text, ',') from orders"),
        Ok("2".into())
    );
    pg.stop_server(0);
}

/// A deposed primary frozen past its licence and resumed: n1's whole host
/// (agent, keeper, hooks, postmaster and backends) is frozen (SIGSTOP, a
/// paused VM), n2 is promoted, then n1's server is resumed a moment before
/// its agent and keeper are — the window a resumed VM gives a stale primary
/// before putex runs again. A session opened on n1 before the freeze that
/// names n2's token has its write refused by n1 itself; the same write
/// without a token lands there (what the fence is for); n2 takes the fenced
/// write. Once the agent and keeper run again, n1's server is stopped.
#[test]
fn postgres_a_deposed_primary_frozen_past_its_licence_refuses_fenced_writes() {
    let server = StoreServer::start(Kind::Nats);
    let url = server.url();
    let pg = PgCluster::create(2, false);
    let _slot = turn_on_a_used_lock(&url);
    let (agents, t1) = fenced_cluster(&url, &pg);
    let n1 = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        pg.nodes[0].port
    );
    let session = Session::connect(&n1).expect("a session on n1");
    session
        .run(&fenced_insert(&t1, 1), Duration::from_secs(5))
        .expect("n1 takes a write naming its own token");
    assert!(
        wait_for(Duration::from_secs(10), || pg
            .sql(1, "select count(*) from orders")
            .is_ok_and(|n| n == "1")),
        "n1's write did not reach n2"
    );

    // Freeze n1's host: its agent and keeper with whatever they run, and
    // its server. Twice, for a process forked while the first pass ran.
    let postmaster = pg.postmaster(0).expect("n1's postmaster");
    let putex_side = || {
        let mut p = vec![agents[0].pid()];
        p.extend(agents[0].keepers());
        let below: Vec<i32> = p.iter().flat_map(|&p| descendants(p)).collect();
        p.extend(below);
        p.retain(|&p| p != postmaster && !descendants(postmaster).contains(&p));
        p
    };
    let server_side = || {
        let mut p = vec![postmaster];
        p.extend(descendants(postmaster));
        p
    };
    let mut frozen_putex = Vec::new();
    let mut frozen_server = Vec::new();
    for _ in 0..2 {
        for p in putex_side() {
            signal(p, Signal::SIGSTOP);
            frozen_putex.push(p);
        }
        for p in server_side() {
            signal(p, Signal::SIGSTOP);
            frozen_server.push(p);
        }
    }
    let t2 = n2_promoted(&url, &pg, &agents, &t1);

    // The server runs again; putex on n1 does not yet: two primaries.
    for &p in &frozen_server {
        signal(p, Signal::SIGCONT);
    }
    let refused = session
        .run(&fenced_insert(&t2, 2), Duration::from_secs(5))
        .expect_err("the deposed primary took a fenced write");
    assert!(
        refused.starts_with("25006") && refused.contains("not the current primary"),
        "{refused}"
    );
    session
        .run("insert into orders values (3)", Duration::from_secs(5))
        .expect("a write that names no token is not checked: it lands on n1");
    assert_eq!(
        pg.sql(
            0,
            "select string_agg(id::text, ',' order by id) from orders"
        ),
        Ok("1,3".into()),
        "n1 has its own write and the unfenced one, not the refused one"
    );
    current_primary_takes_it(&pg, &agents, &t2, 4);

    // putex on n1 runs again: past its licence, it stops the server.
    for &p in &frozen_putex {
        signal(p, Signal::SIGCONT);
    }
    assert!(
        wait_for(Duration::from_secs(15), || pg.is_primary(0) != Some(true)),
        "n1's server still runs as a primary after its agent resumed:\n{}",
        logs(&agents)
    );
    assert_eq!(
        pg.sql(
            1,
            "select string_agg(id::text, ',' order by id) from orders"
        ),
        Ok("1,4".into()),
        "n2 has n1's write from before the freeze and the fenced one"
    );
}
