//! The lock gateway's library API (`putex::locks::gateway`) on the embedded store:
//! grant, expiry, release, waiting in turn, cancellation, revocation, and a
//! caller that goes away mid-wait. The HTTP layer on top is tested in
//! `serve`.

use std::time::{Duration, Instant};

use putex::core::Drift;
use putex::locks::gateway::{AcquireError, Gateway, GatewayOptions};
use putex::store::{AnyStore, SqliteStore};

use crate::common::{acquire_request as req, n, warm};

/// The grant deadline D: a lock's record advertises its lifetime + D.
const DEADLINE: Duration = putex::locks::gateway::DEFAULT_GRANT_DEADLINE;

async fn gateway(dir: &tempfile::TempDir, node: &str) -> Gateway {
    let store = AnyStore::from(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
    Gateway::new(
        store,
        GatewayOptions {
            node: node.parse().unwrap(),
            max_drift: Drift::from_percent(1.0),
            max_lifetime: Duration::from_secs(3600),
            max_wait: Duration::from_secs(3600),
            acquire_lease: putex::locks::gateway::DEFAULT_ACQUIRE_LEASE,
            grant_deadline: DEADLINE,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_expire_release_and_wait_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(&dir, "gw1").await;
    warm(&g, "res").await;

    let a = g.acquire(req("res", 1000, 3000)).await.unwrap();
    assert!(a.active && a.token.is_some());
    assert_eq!(
        g.get(&n("res"), &n(&a.uid)).await.unwrap().unwrap().uid,
        a.uid
    );
    assert_eq!(g.resources().await.unwrap(), ["res"]);
    // Held: a short wait times out at about the wait.
    let started = Instant::now();
    assert!(matches!(
        g.acquire(req("res", 1200, 1000)).await,
        Err(AcquireError::Timeout)
    ));
    assert!(
        started.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        started.elapsed()
    );
    // Released: gone for GET and DELETE; the next one gets it at once.
    assert!(g.release(&n("res"), &n(&a.uid)).await.unwrap());
    assert!(g.get(&n("res"), &n(&a.uid)).await.unwrap().is_none());
    assert!(!g.release(&n("res"), &n(&a.uid)).await.unwrap());
    let started = Instant::now();
    let b = g.acquire(req("res", 1000, 500)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(b.token > a.token);
    // S6: the gateway remembers the highest token it saw, across requests;
    // every acquisition starts from it.
    let highest = g.highest(&n("res")).expect("a token was seen");
    assert!(Some(highest) >= b.token, "{highest:?} below {:?}", b.token);
    // Expired after its lifetime and the grant deadline.
    tokio::time::sleep(Duration::from_millis(600) + DEADLINE).await;
    assert!(g.get(&n("res"), &n(&b.uid)).await.unwrap().is_none());

    // Three waiters get it in arrival order.
    let c = g.acquire(req("res", 5000, 2000)).await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let g = g.clone();
        waiters.push(tokio::spawn(async move {
            let l = g.acquire(req("res", 10_000, 2000)).await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(g.release(&n("res"), &n(&l.uid)).await.unwrap());
            (i, at)
        }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let listed = g.locks(&n("res")).await.unwrap();
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert!(listed[0].active && !listed[1].active);
    assert!(g.release(&n("res"), &n(&c.uid)).await.unwrap());
    let mut order = Vec::new();
    for w in waiters {
        order.push(w.await.unwrap());
    }
    order.sort_by_key(|(_, at)| *at);
    assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
}

/// Waits until a request is queued on `resource` (a loaded machine may
/// take longer than a fixed pause to get it there).
async fn waiting(g: &Gateway, resource: &str) {
    let started = Instant::now();
    while !g
        .locks(&n(resource))
        .await
        .unwrap()
        .iter()
        .any(|l| !l.active)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no waiter queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_revoke_cancels_waiters_and_a_gone_client_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let g1 = gateway(&dir, "gw1").await;
    let g2 = gateway(&dir, "gw2").await;
    warm(&g1, "adm").await;
    let held = g1.acquire(req("adm", 1000, 5000)).await.unwrap();
    // A waiter on the other gateway is cancelled by an admin delete here.
    let waiter = {
        let g2 = g2.clone();
        tokio::spawn(async move { g2.acquire(req("adm", 10_000, 1000)).await })
    };
    waiting(&g1, "adm").await;
    assert!(g1.delete(&n("adm")).await.unwrap());
    assert!(matches!(
        waiter.await.unwrap(),
        Err(AcquireError::Cancelled)
    ));
    assert!(
        g1.get(&n("adm"), &n(&held.uid)).await.unwrap().is_none(),
        "freed"
    );
    assert!(!g1.delete(&n("nothing")).await.unwrap());

    // A client that disconnects while waiting never ends up holding it.
    warm(&g1, "gone").await;
    let holder = g1.acquire(req("gone", 1000, 5000)).await.unwrap();
    let dropped = {
        let g2 = g2.clone();
        tokio::spawn(async move { g2.acquire(req("gone", 10_000, 5000)).await })
    };
    waiting(&g1, "gone").await;
    dropped.abort();
    let _ = dropped.await;
    assert!(g1.release(&n("gone"), &n(&holder.uid)).await.unwrap());
    let started = Instant::now();
    let next = g1.acquire(req("gone", 3000, 1000)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(g1.release(&n("gone"), &n(&next.uid)).await.unwrap());
}

/// RDLM's delete, both sides, in rounds (the waiter's take of the freed
/// lock races the delete's cancel): from the moment the delete answers,
/// no listing shows the freed lock, the cancelled request or a lock that
/// request took meanwhile; the request ends `Cancelled`; and the resource
/// is free for the next request at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_admin_delete_nothing_is_listed_and_the_lock_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(&dir, "gw1").await;
    warm(&g, "del").await;
    for round in 0..8 {
        let held = g.acquire(req("del", 1000, 10_000)).await.unwrap();
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.acquire(req("del", 20_000, 1000)).await })
        };
        waiting(&g, "del").await;
        assert!(g.delete(&n("del")).await.unwrap());
        while !waiter.is_finished() {
            let listed = g.locks(&n("del")).await.unwrap();
            assert!(listed.is_empty(), "round {round}: {listed:?}");
        }
        assert!(
            matches!(waiter.await.unwrap(), Err(AcquireError::Cancelled)),
            "round {round}"
        );
        let listed = g.locks(&n("del")).await.unwrap();
        assert!(listed.is_empty(), "round {round}: {listed:?}");
        assert!(g.get(&n("del"), &n(&held.uid)).await.unwrap().is_none());
        let started = Instant::now();
        let next = g.acquire(req("del", 3000, 1000)).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "round {round}: {:?}",
            started.elapsed()
        );
        assert!(g.release(&n("del"), &n(&next.uid)).await.unwrap());
    }
}

/// A grant counts from its write: handed over in time, it says how much of
/// its licence is left; handed over too late, or never (its client left),
/// it is given back and the next waiter gets the lock at once rather than
/// after the lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_not_handed_over_in_time_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(&dir, "gw1").await;
    warm(&g, "late").await;

    // In time: lifetime + D, less the time it took.
    let lifetime = Duration::from_secs(5);
    let grant = g.acquire_grant(req("late", 1000, 5000)).await.unwrap();
    let info = grant.hand_over().unwrap();
    let left = info.lifetime_left.unwrap();
    assert!(
        left > lifetime + DEADLINE / 2 && left <= lifetime + DEADLINE,
        "{left:?}"
    );
    assert!(g.release(&n("late"), &n(&info.uid)).await.unwrap());

    // Too late: given back; the waiter gets it at once.
    let grant = g.acquire_grant(req("late", 1000, 30_000)).await.unwrap();
    let uid = grant.info().uid.clone();
    let token = grant.info().token;
    let waiter = {
        let g = g.clone();
        tokio::spawn(async move { g.acquire(req("late", 10_000, 1000)).await })
    };
    waiting(&g, "late").await;
    tokio::time::sleep(DEADLINE / 2 + Duration::from_millis(50)).await;
    let late = Instant::now();
    assert!(matches!(grant.hand_over(), Err(AcquireError::Late(_))));
    let next = waiter.await.unwrap().unwrap();
    assert!(
        late.elapsed() < Duration::from_millis(1500),
        "the waiter got the lock {:?} after the grant was given back",
        late.elapsed()
    );
    assert!(next.token > token);
    assert!(g.get(&n("late"), &n(&uid)).await.unwrap().is_none());
    assert!(g.release(&n("late"), &n(&next.uid)).await.unwrap());

    // Never handed over (dropped): given back too.
    let grant = g.acquire_grant(req("late", 1000, 30_000)).await.unwrap();
    drop(grant);
    let started = Instant::now();
    let again = g.acquire(req("late", 3000, 1000)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(g.release(&n("late"), &n(&again.uid)).await.unwrap());
}

/// The grant records in the store, as `(resource, uid)`.
async fn grant_records(dir: &tempfile::TempDir) -> Vec<(String, String)> {
    let store = SqliteStore::open(dir.path().join("s.db")).await.unwrap();
    let mut out: Vec<(String, String)> =
        putex::store::read_prefix(&store, "grant.", Duration::from_secs(2))
            .await
            .unwrap()
            .into_iter()
            .filter_map(|(key, _)| {
                let (r, u) = key.strip_prefix("grant.")?.split_once('.')?;
                Some((r.to_owned(), u.to_owned()))
            })
            .collect();
    out.sort();
    out
}

/// A client that lets its lifetime run out releases nothing: the tidy-up
/// `putex serve` runs removes the grant records of every ended lock (run
/// out, taken over, released) and keeps those of live grants, which `GET`
/// still describes in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_records_of_ended_locks_are_forgotten_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(&dir, "gw1").await;
    for r in ["ran-out", "taken", "live"] {
        warm(&g, r).await;
    }
    assert_eq!(g.forget_ended_grants().await.unwrap(), 0);
    let ran_out = g.acquire(req("ran-out", 1000, 300)).await.unwrap();
    let taken = g.acquire(req("taken", 1000, 300)).await.unwrap();
    let mut live = req("live", 1000, 60_000);
    live.title = "kept".into();
    let live = g.acquire(live).await.unwrap();
    // Nothing has ended yet: nothing is forgotten.
    assert_eq!(g.forget_ended_grants().await.unwrap(), 0);
    assert_eq!(grant_records(&dir).await.len(), 3);

    // "taken" runs out and is taken over; "ran-out" just runs out.
    tokio::time::sleep(Duration::from_millis(300) + DEADLINE).await;
    let started = Instant::now();
    let next = loop {
        match g.acquire(req("taken", 5000, 60_000)).await {
            Ok(l) => break l,
            Err(AcquireError::Timeout) if started.elapsed() < Duration::from_secs(10) => {}
            Err(e) => panic!("{e}"),
        }
    };
    assert!(next.token > taken.token);
    assert_eq!(grant_records(&dir).await.len(), 4);

    assert_eq!(g.forget_ended_grants().await.unwrap(), 2);
    let left = grant_records(&dir).await;
    let expect = |l: &putex::locks::gateway::LockInfo, r: &str| (r.to_owned(), l.uid.clone());
    assert_eq!(left, {
        let mut v = vec![expect(&live, "live"), expect(&next, "taken")];
        v.sort();
        v
    });
    assert!(!left.contains(&expect(&ran_out, "ran-out")));
    let described = g.get(&n("live"), &n(&live.uid)).await.unwrap().unwrap();
    assert_eq!(described.title, "kept");
    // Released ones go at once, and a second tidy-up finds nothing more.
    assert!(g.release(&n("live"), &n(&live.uid)).await.unwrap());
    assert_eq!(grant_records(&dir).await, [expect(&next, "taken")]);
    assert_eq!(g.forget_ended_grants().await.unwrap(), 0);
}

/// F2 (S7): an administrator's revoke of a failsafe holder keeps the
/// record's failsafe set: a node outside it still waits for the cap, while
/// the holder may still run on its members' grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_keeps_a_failsafe_set() {
    use putex::core::record::{FailsafeMember, FailsafeSet, LockRecord, LockState};
    use putex::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(&dir, "gw1").await;
    let store = AnyStore::from(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
    let set = FailsafeSet {
        members: vec![FailsafeMember {
            node: "db2".into(),
            machine: "m2".into(),
        }],
        max_ms: 120_000,
    };
    let held = LockRecord {
        v: 1,
        node: "db1".into(),
        machine: "m1".into(),
        instance: "db1i1".into(),
        state: LockState::Active,
        write: "db1i1-7".into(),
        lease_ms: 60_000,
        gap_ms: 200,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: Some(set.clone()),
    };
    let key = putex::store::keys::lock(&n("pg"));
    let t = Duration::from_secs(5);
    store.put(&key, &held.encode(), t).await.unwrap();
    let ended = g
        .revoke(&n("pg"))
        .await
        .unwrap()
        .expect("a holder to revoke");
    assert_eq!(ended.node, "db1");
    let entry = store
        .get(&key, putex::store::ReadMode::Leader, t)
        .await
        .unwrap()
        .unwrap();
    let revoked: LockRecord = serde_json::from_slice(&entry.value).unwrap();
    assert_eq!(revoked.state, LockState::Revoked);
    assert_eq!(revoked.failsafe, Some(set));
}
