//! The store contract on a real etcd: a single member and a 3-member
//! cluster on loopback ports (started by `putex_testkit::etcd_server`;
//! without an etcd binary the tests fail and say how to install one), with
//! password and certificate authentication, TLS, the epoch record (S6), a
//! compacted watch and the store clock that S1 (b) reads.

use super::*;
use putex_testkit::etcd_server::{etcdctl, EtcdCluster, EtcdOptions, EtcdServer, EtcdTls};

fn url_of(endpoints: &[String], extra: &str) -> StoreUrl {
    StoreUrl::parse(&format!("etcd://{}{extra}", endpoints.join(","))).unwrap()
}

async fn etcd_handles(url: &StoreUrl) -> Vec<AnyStore> {
    let mut v = Vec::new();
    for _ in 0..8 {
        v.push(open_retrying(url).await);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract_etcd() {
    let server = EtcdServer::start();
    let url = url_of(&[server.endpoint()], "");
    let handles = etcd_handles(&url).await;
    contract(&handles).await;
    // Another prefix of the same cluster is another store: its own epoch
    // record, none of the first one's keys.
    let other = open_retrying(&url_of(&[server.endpoint()], "?prefix=other/app")).await;
    assert_eq!(
        other.get("lock.cas", ReadMode::Leader, T).await.unwrap(),
        None
    );
    assert_ne!(other.epoch(), handles[0].epoch());
}

/// Three members; every handle names all three, in a different order. The
/// suite passes, and goes on passing with the leader killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract_etcd_cluster() {
    let cluster = EtcdCluster::start(3);
    let mut eps = cluster.endpoints();
    let mut handles = Vec::new();
    for i in 0..8 {
        eps.rotate_left(i % 3);
        handles.push(open_retrying(&url_of(&eps, "")).await);
    }
    contract(&handles).await;

    let leader = cluster.leader().expect("a leader");
    let s = &handles[0];
    let t = s.create("lock.survivor", b"1", T).await.unwrap();
    cluster.kill(leader);
    // Writes go on through the other two once they elect a leader; an
    // answer lost in the election is unknown, never a conflict.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut token = t;
    let mut writes = 0;
    while writes < 5 {
        match s
            .update("lock.survivor", b"n", token, Duration::from_secs(2))
            .await
        {
            Ok(next) => {
                token = next;
                writes += 1;
            }
            Err(e) if e.is_unknown() => {
                // It may have landed: read the record and go on from it.
                if let Ok(Some(e)) = s.get("lock.survivor", ReadMode::Leader, T).await {
                    token = e.token;
                }
            }
            Err(e) => panic!("after the leader died: {e}"),
        }
        assert!(Instant::now() < deadline, "no write after the leader died");
    }
    // Every call now goes to the two that live: none fails for the dead
    // member the client still knows (a call it could not send is tried
    // on another member).
    for i in 0..30 {
        let e = s.get("lock.survivor", ReadMode::Leader, T).await;
        assert_eq!(e.unwrap().unwrap().token, token, "read {i}");
        token = s
            .update("lock.survivor", b"n", token, T)
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
}

/// A frozen member (SIGSTOP): a write is unknown within its deadline and
/// lands once the member wakes up; a read during the stall is unknown too,
/// never "absent".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unknown_etcd_sigstop() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    let server = &server;
    unknown_then(&s, Landing::Cas, Then::Lands, || {
        server.pause();
        move || server.resume()
    })
    .await;
    server.pause();
    let e = s
        .get("lock.unknown", ReadMode::Leader, Duration::from_millis(200))
        .await;
    server.resume();
    assert!(matches!(e, Err(StoreError::Unknown { .. })), "{e:?}");
}

/// A member with authentication on (`root`, password `r00t-pw`) and the
/// user `app` (password `app-pw`) who may read and write `putex/` only,
/// set up beyond that by `more`; and a store handle signed in as `app`.
async fn app_user(more: EtcdOptions) -> (EtcdServer, AnyStore) {
    let server = EtcdServer::start_with(EtcdOptions {
        auth: Some(("root".into(), "r00t-pw".into())),
        limited: Some(("app".into(), "app-pw".into(), "putex/".into())),
        ..more
    });
    let url = url_of(&[server.endpoint()], "?user=app&password=app-pw");
    let s = open_retrying(&url).await;
    (server, s)
}

/// A token that expired while the handle was idle (etcd forgets an unused
/// token after `--auth-token-ttl`, 300 s by default; a member that
/// restarted forgets them all; JWT tokens end at their TTL however busy):
/// the handle signs in again and the call goes on, instead of failing as
/// "refused" (a configuration error that would stop an agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_signs_in_again_when_its_token_expired() {
    let (_server, s) = app_user(EtcdOptions {
        auth_token_ttl: Some(Duration::from_secs(1)),
        ..EtcdOptions::default()
    })
    .await;
    let first = s.create("lock.idle", b"1", T).await.unwrap();
    // Idle well past the token's TTL (etcd checks expiry every second);
    // each call is the first after such a pause (a watch is refused in its
    // own way: etcd cancels it).
    let idle = || tokio::time::sleep(Duration::from_secs(4));
    idle().await;
    let mut changes = s
        .watch("lock.idle", Some(first.revision), T)
        .await
        .expect("a watch after the token expired");
    assert!(changes.next().await.is_some(), "the watch's first change");
    idle().await;
    let read = s.get("lock.idle", ReadMode::Leader, T).await;
    let entry = read
        .expect("a read after the token expired")
        .expect("the record");
    assert_eq!(entry.token, first);
    idle().await;
    let second = s.update("lock.idle", b"2", first, T).await;
    assert!(
        second.is_ok_and(|t| t > first),
        "a write after the token expired"
    );
}

/// Password authentication: a wrong password and a user without
/// permission on the prefix are configuration errors that say so (and
/// never show the password); a user with readwrite on the prefix works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_password_and_permissions() {
    let (server, s) = app_user(EtcdOptions::default()).await;
    let ep = server.endpoint();
    contract(&[
        s.clone(),
        s.clone(),
        s.clone(),
        s.clone(),
        s.clone(),
        s.clone(),
        s.clone(),
        s,
    ])
    .await;
    let root = open_retrying(&StoreUrl::parse(&format!("etcd://root:r00t-pw@{ep}")).unwrap()).await;
    root.create("lock.root", b"x", T).await.unwrap();

    match AnyStore::open(&url_of(
        std::slice::from_ref(&ep),
        "?user=app&password=hunter2",
    ))
    .await
    {
        Err(StoreError::Config { reason }) => {
            assert!(!reason.contains("hunter2"), "{reason}");
            assert!(
                reason.contains("password") || reason.contains("authentication"),
                "{reason}"
            );
        }
        other => panic!("a wrong password: {other:?}"),
    }
    match AnyStore::open(&url_of(
        std::slice::from_ref(&ep),
        "?user=app&password=app-pw&prefix=elsewhere",
    ))
    .await
    {
        Err(StoreError::Config { reason }) => {
            assert!(reason.contains("permission"), "{reason}")
        }
        other => panic!("no permission on the prefix: {other:?}"),
    }
    match AnyStore::open(&url_of(&[ep], "")).await {
        Err(StoreError::Config { reason }) => {
            assert!(
                reason.contains("user name is empty") || reason.contains("refused"),
                "{reason}"
            )
        }
        other => panic!("no credentials: {other:?}"),
    }
}

/// TLS with a private CA and client certificates (etcd's
/// `--client-cert-auth`): the contract holds over TLS; without the CA or
/// without a client certificate opening fails, as a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_tls_and_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = putex_testkit::pki::Pki::new(dir.path(), "root");
    let server = EtcdServer::start_with(EtcdOptions {
        tls: Some(EtcdTls {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca: Some(pki.ca.clone()),
        }),
        ..EtcdOptions::default()
    });
    let ep = server.endpoint();
    let good = format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    let handles = etcd_handles(&url_of(std::slice::from_ref(&ep), &good)).await;
    contract(&handles).await;

    let no_client_cert = format!("?tls_ca={}", pki.ca.display());
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        AnyStore::open(&url_of(std::slice::from_ref(&ep), &no_client_cert)),
    )
    .await
    .expect("opening gives up within its deadline");
    assert!(r.is_err(), "no client certificate: {r:?}");
    let missing = url_of(&[ep], "?tls_ca=/nonexistent/ca.pem");
    match AnyStore::open(&missing).await {
        Err(StoreError::Config { reason }) => assert!(reason.contains("tls_ca"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// The epoch (S6): kept across handles and reopening; the epoch record
/// deleted (a cluster re-created empty) gives a later epoch at the next
/// open, under which an old token conflicts at once — also through a
/// handle that was open before; a record written by another cluster (a
/// snapshot restored as a new cluster) gives a later epoch too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_epoch_record() {
    let server = EtcdServer::start();
    let url = url_of(&[server.endpoint()], "");
    let old = open_retrying(&url).await;
    let again = open_retrying(&url).await;
    assert_eq!(again.epoch(), old.epoch());
    let t = old.create("lock.e", b"old holder", T).await.unwrap();

    let o = etcdctl(&[server.endpoint()], &["del", "putex/=epoch"]);
    assert!(o.status.success(), "{o:?}");
    let fresh = open_retrying(&url).await;
    assert!(fresh.epoch() > old.epoch());
    // The old handle's compare-and-swap conflicts (its epoch bytes no
    // longer match) and it adopts the new epoch.
    let e = old.update("lock.e", b"stale", t, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
    assert_eq!(old.epoch(), fresh.epoch());
    let seen = fresh
        .get("lock.e", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert!(seen.token > t, "same revision space, later epoch");

    // Another cluster's record: a later epoch.
    let foreign = format!(r#"{{"v":1,"epoch":{},"cluster":12345}}"#, fresh.epoch());
    let o = etcdctl(&[server.endpoint()], &["put", "putex/=epoch", &foreign]);
    assert!(o.status.success(), "{o:?}");
    let restored = open_retrying(&url).await;
    assert!(restored.epoch() > fresh.epoch());

    // Something else's record there: a configuration error naming it.
    let o = etcdctl(&[server.endpoint()], &["put", "app/=epoch", "not json"]);
    assert!(o.status.success(), "{o:?}");
    match AnyStore::open(&url_of(&[server.endpoint()], "?prefix=app")).await {
        Err(StoreError::Config { reason }) => assert!(reason.contains("app/=epoch"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// A watch resumed from a compacted revision still delivers the latest
/// state of every key (etcd no longer has the changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_watch_from_a_compacted_revision() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    let a = s.create("member.c.a", b"a1", T).await.unwrap();
    let a2 = s.update("member.c.a", b"a2", a, T).await.unwrap();
    let b = s.create("member.c.b", b"b1", T).await.unwrap();
    let o = etcdctl(&[server.endpoint()], &["compact", &b.revision.to_string()]);
    assert!(o.status.success(), "{o:?}");
    let mut w = s.watch("member.c.", Some(a.revision), T).await.unwrap();
    let evs = events_until(&mut w, b.revision).await;
    assert_increasing(&evs);
    let state = latest(&evs);
    assert_eq!(state["member.c.a"], Some(b"a2".to_vec()));
    assert_eq!(state["member.c.b"], Some(b"b1".to_vec()));
    assert!(evs
        .iter()
        .all(|e| e.revision >= a2.revision.min(a.revision)));
    // And it goes on.
    let c = s.create("member.c.c", b"c1", T).await.unwrap();
    let evs = events_until(&mut w, c.revision).await;
    assert_eq!(evs.last().unwrap().key, "member.c.c");
}

/// A cluster that keeps its whole history is warned about (every renewal
/// is a revision, and etcd compacts only when told to); one that has
/// compacted, or is still young, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_warns_about_a_history_never_compacted() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    let AnyStore::Etcd(etcd) = &s else {
        panic!("an etcd store");
    };
    let mut last = s.create("member.h.a", b"1", T).await.unwrap();
    for i in 0..20 {
        last = s
            .update("member.h.a", format!("{i}").as_bytes(), last, T)
            .await
            .unwrap();
    }
    let warning = etcd.history_warning_from(10).await;
    let text = warning.expect("revision 1 readable at revision 20 and more");
    assert!(text.contains("--auto-compaction-retention"), "{text}");
    assert_eq!(etcd.history_warning_from(last.revision + 1000).await, None);
    assert!(s.warnings().await.is_empty(), "younger than the threshold");
    let o = etcdctl(
        &[server.endpoint()],
        &["compact", &last.revision.to_string()],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(etcd.history_warning_from(10).await, None, "compacted");
}

/// The store clock that S1 (b) reads (`docs/safety.md` §4.2): a record's
/// stamp does not move while its revision stays; the gap between a record
/// and a later probe is never more than the time that really passed (the
/// safe side), and no more than about two seconds less (the live side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_clock_gap_is_never_more_than_real_time() {
    let server = EtcdServer::start();
    let url = url_of(&[server.endpoint()], "");
    let writer = open_retrying(&url).await;
    let standby = open_retrying(&url).await;
    // The shared clock lease is granted by the first reading: take one,
    // then let half a second pass, so that the record's reading falls
    // mid-second (at a whole second, no rounding could show).
    writer.put("lock.warm", b"w", T).await.unwrap();
    writer.get("lock.warm", ReadMode::Leader, T).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = writer.put("lock.clock", b"held", T).await.unwrap();
    let written = Instant::now();
    let first = standby
        .get("lock.clock", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.token, t);
    // Every 100 ms for 3.5 s: the readings' whole seconds fall at every
    // phase against the record's, so a stamp rounded the wrong way shows.
    for wait in (3..38u64).map(|i| i * 100) {
        tokio::time::sleep_until((written + Duration::from_millis(wait)).into()).await;
        let again = standby
            .get("lock.clock", ReadMode::Leader, T)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            again.time, first.time,
            "a record's stamp stays with its revision"
        );
        let p = standby.put("probe.standby", b"p", T).await.unwrap();
        let probe = standby
            .get("probe.standby", ReadMode::Leader, T)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(probe.token, p);
        let real = written.elapsed();
        let gap = match probe.time.gap_since(first.time) {
            putex::core::StoreGap::Forward(g) => g,
            _ => Duration::ZERO,
        };
        assert!(
            gap <= real,
            "after {wait} ms: store gap {gap:?} > real {real:?}"
        );
        assert!(
            gap + Duration::from_millis(2_200) >= real,
            "after {wait} ms: store gap {gap:?} lags real {real:?} by more than two steps"
        );
    }
    // Another handle's stamps are another clock domain: never compared.
    let w = writer
        .get("lock.clock", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(w.time.era, first.time.era);
}

/// How long a create of `key` through a handle of its own (as a new `putex
/// lock` process would make it) proves the key was vacant.
async fn vacancy_of(url: &StoreUrl, key: &str) -> Duration {
    let s = open_retrying(url).await;
    s.create_vacant(key, b"v", T).await.unwrap().vacant_for
}

/// S4 refined on etcd (`docs/stores.md`, "First use"): a create says how
/// long its key was provably vacant — measured from the anchor the first
/// create wrote, never more than the real time since and no more than
/// about two seconds less; nothing over a key changed since the anchor, a
/// compacted anchor, or a restarted member (a new raft term), each of which
/// writes a new anchor that proves again from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_a_create_says_how_long_the_key_was_vacant() {
    let server = EtcdServer::start();
    let url = url_of(&[server.endpoint()], "");
    let ctl = |args: &[&str]| {
        let o = etcdctl(&[server.endpoint()], args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    };
    // Deleted before the anchor: its history is older than the proof's.
    ctl(&["put", "putex/lock.old", "x"]);
    ctl(&["del", "putex/lock.old"]);
    let before_anchor = Instant::now();
    assert_eq!(
        vacancy_of(&url, "lock.a").await,
        Duration::ZERO,
        "no anchor yet"
    );
    let anchored = Instant::now();
    // Changed after the anchor: written and deleted by hand.
    ctl(&["put", "putex/lock.changed", "x"]);
    ctl(&["del", "putex/lock.changed"]);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    // Each from a handle of its own, as a new `putex lock` process would.
    for key in ["lock.b", "lock.old"] {
        let c = vacancy_of(&url, key).await;
        let (real_max, real_min) = (before_anchor.elapsed(), anchored.elapsed());
        assert!(c <= real_max, "{key}: {c:?} > {real_max:?}");
        assert!(
            c + Duration::from_millis(2_200) >= real_min,
            "{key}: {c:?} lags {real_min:?} by more than two steps"
        );
    }
    let changed = vacancy_of(&url, "lock.changed").await;
    assert_eq!(changed, Duration::ZERO, "deleted since the anchor");
    let again = open_retrying(&url).await;
    let again = again.create_vacant("lock.a", b"again", T).await;
    assert!(
        matches!(again, Err(StoreError::Conflict { .. })),
        "{again:?}"
    );

    // Compacted past the anchor: no proof, and a new anchor.
    let s = open_retrying(&url).await;
    let last = s.create("member.v", b"x", T).await.unwrap();
    ctl(&["compact", &last.revision.to_string()]);
    let compacted = s.create_vacant("lock.d", b"d", T).await.unwrap();
    assert_eq!(compacted.vacant_for, Duration::ZERO, "compacted");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let after = vacancy_of(&url, "lock.e").await;
    assert!(after >= Duration::from_secs(1), "{after:?}");

    // A restarted member: a new raft term, its leases refreshed.
    server.restart();
    assert_eq!(
        vacancy_of(&url, "lock.f").await,
        Duration::ZERO,
        "a new term"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = vacancy_of(&url, "lock.g").await;
    assert!(later >= Duration::from_secs(1), "{later:?}");
}

/// A handle whose watch feed ran since the anchor proves from what its feed
/// delivered, without etcd's history: after a compaction past the anchor it
/// still proves a key vacant (a fresh handle, which must ask the history,
/// cannot), and not one the feed saw written and deleted by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_a_long_running_handle_proves_vacancy_from_its_feed() {
    let server = EtcdServer::start();
    let url = url_of(&[server.endpoint()], "");
    let long = open_retrying(&url).await;
    let _feed = long.watch("member.", None, T).await.unwrap();
    let first = long.create_vacant("lock.a", b"a", T).await.unwrap();
    assert_eq!(
        first.vacant_for,
        Duration::ZERO,
        "the anchor is written now"
    );
    let anchored = Instant::now();
    for args in [["put", "putex/lock.y", "x"], ["del", "putex/lock.y", ""]] {
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let o = etcdctl(&[server.endpoint()], &args);
        assert!(o.status.success(), "{o:?}");
    }
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let y = long.create_vacant("lock.y", b"y", T).await.unwrap();
    assert_eq!(y.vacant_for, Duration::ZERO, "the feed saw it deleted");
    let last = long.create("member.v", b"x", T).await.unwrap();
    let o = etcdctl(
        &[server.endpoint()],
        &["compact", &last.revision.to_string()],
    );
    assert!(o.status.success(), "{o:?}");
    let x = long.create_vacant("lock.x", b"x", T).await.unwrap();
    assert!(x.vacant_for >= Duration::from_secs(1), "{x:?}");
    assert!(x.vacant_for <= anchored.elapsed(), "{x:?}");
    let fresh = open_retrying(&url).await;
    let z = fresh.create_vacant("lock.z", b"z", T).await.unwrap();
    assert_eq!(z.vacant_for, Duration::ZERO, "the history was compacted");
}

/// 10,000 watches on one handle share its one etcd watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_ten_thousand_watches_share_one_feed() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    ten_thousand_watches(&s, "e").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_snapshots_miss_no_busy_key() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    snapshots_miss_no_busy_key(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_etcd_prefix_watch_starts_with_the_key_written_before_it() {
    let server = EtcdServer::start();
    let s = open_retrying(&url_of(&[server.endpoint()], "")).await;
    a_prefix_watch_starts_with_the_key_written_before_it(&s).await;
}

/// Nothing listening: opening is unknown (retrying may help), within its
/// deadline.
#[tokio::test]
async fn store_etcd_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    match AnyStore::open(&url_of(&[format!("127.0.0.1:{port}")], "")).await {
        Err(StoreError::Unknown { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(16));
}
