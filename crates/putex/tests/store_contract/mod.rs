//! The store contract (`docs/stores.md`), one suite run against every backend:
//! memory, SQLite (a temporary file), a single nats-server, and a 3-node
//! NATS cluster with an R3 bucket.
//!
//! The NATS tests start a real `nats-server` (see `putex_testkit::nats_server`);
//! without one they fail and say how to install it.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use putex::core::record::Observed;
use putex::store::nats::first_dated_revision;
use putex::store::{
    AnyStore, MemoryStore, ReadMode, SqliteStore, Store, StoreError, StoreUrl, Token, WatchEvent,
    Write,
};

use crate::common::nats_server::{NatsCluster, NatsServer};

mod etcd;

/// The deadline for ordinary calls in these tests.
const T: Duration = Duration::from_secs(5);

fn json(write: &str) -> Vec<u8> {
    format!(r#"{{"v":1,"write":"{write}"}}"#).into_bytes()
}

// ---------------------------------------------------------------------------
// The suite: generic over any store.

/// Create, update, delete: compare-and-swap semantics and outcome classes.
async fn cas_semantics(s: &AnyStore) {
    let k = "lock.cas";
    assert_eq!(s.get(k, ReadMode::Leader, T).await.unwrap(), None);
    let t1 = s.create(k, b"one", T).await.unwrap();
    assert_eq!(t1.epoch, s.epoch());
    assert!(t1.revision > 0);
    let e = s.create(k, b"again", T).await.unwrap_err();
    assert!(e.is_conflict(), "create over a live record: {e}");

    let got = s
        .get(k, ReadMode::Leader, T)
        .await
        .unwrap()
        .expect("created");
    assert_eq!(got.value, b"one");
    assert_eq!(got.token, t1);
    let any = s.get(k, ReadMode::Any, T).await.unwrap().expect("created");
    assert_eq!(any.token, t1);

    let t2 = s.update(k, b"two", t1, T).await.unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    let e = s.update(k, b"stale", t1, T).await.unwrap_err();
    assert!(e.is_conflict(), "stale revision: {e}");
    // The epoch is part of the expectation: a token of another bucket
    // incarnation never matches, even with the right revision.
    let other_epoch = Token::new(s.epoch().wrapping_add(1), t2.revision);
    let e = s.update(k, b"epoch", other_epoch, T).await.unwrap_err();
    assert!(e.is_conflict(), "other epoch: {e}");
    let e = s.delete(k, other_epoch, T).await.unwrap_err();
    assert!(e.is_conflict(), "delete, other epoch: {e}");
    assert_eq!(
        s.get(k, ReadMode::Leader, T).await.unwrap().unwrap().value,
        b"two"
    );

    let e = s.delete(k, t1, T).await.unwrap_err();
    assert!(e.is_conflict(), "delete with a stale revision: {e}");
    s.delete(k, t2, T).await.unwrap();
    assert_eq!(s.get(k, ReadMode::Leader, T).await.unwrap(), None);
    assert_eq!(s.get(k, ReadMode::Any, T).await.unwrap(), None);
    let e = s.update(k, b"gone", t2, T).await.unwrap_err();
    assert!(e.is_conflict(), "update of a deleted record: {e}");
    let e = s.delete(k, t2, T).await.unwrap_err();
    assert!(e.is_conflict(), "delete of a deleted record: {e}");

    // A deleted record can be created again, with a new, higher revision.
    let t3 = s.create(k, b"three", T).await.unwrap();
    assert!(
        t3.revision > t2.revision + 1,
        "the delete marker took a revision too"
    );

    // Update of a record that never existed.
    let e = s.update("lock.never", b"x", t3, T).await.unwrap_err();
    assert!(e.is_conflict(), "update of an absent record: {e}");

    // Unconditional put (probe records).
    let p1 = s.put("probe.n1.example.com", b"p", T).await.unwrap();
    let p2 = s.put("probe.n1.example.com", b"q", T).await.unwrap();
    assert!(p2 > p1 && p1 > t3);

    // Bad keys are configuration errors, not conflicts or unknowns.
    for bad in ["", "lock..x", "lock.a b", ".lock", "lock.*"] {
        match s.create(bad, b"x", T).await {
            Err(StoreError::Config { reason }) => assert!(reason.contains("lock.pg"), "{reason}"),
            other => panic!("key {bad:?}: {other:?}"),
        }
    }
}

/// Garbage bytes come back as bytes, and never decode as a release.
async fn garbage(s: &AnyStore) {
    let values: [&[u8]; 5] = [
        b"\x00\xff\xfe garbage \x80",
        b"{\"v\":1,\"state\":\"released\"}",
        b"",
        b"{",
        b"{\"v\":99,\"node\":\"a\",\"machine\":\"m\",\"instance\":\"i\",\"state\":\"released\",\"write\":\"w\",\"lease_ms\":1,\"gap_ms\":1}",
    ];
    for (i, v) in values.iter().enumerate() {
        let k = format!("lock.garbage{i}");
        s.create(&k, v, T).await.unwrap();
        let e = s
            .get(&k, ReadMode::Leader, T)
            .await
            .unwrap()
            .expect("written");
        assert_eq!(&e.value[..], *v);
        assert_eq!(Observed::decode(&e.value), Observed::Garbage, "{v:?}");
    }
}

/// Store timestamps: present, in one era, and not decreasing with the
/// revision (one writer, one leader).
async fn timestamps(s: &AnyStore) {
    let mut last: Option<(Token, putex::store::StoreTime)> = None;
    for i in 0..20 {
        let t = s
            .put("probe.clock", format!("{i}").as_bytes(), T)
            .await
            .unwrap();
        let e = s
            .get("probe.clock", ReadMode::Leader, T)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.token, t);
        assert_ne!(e.time.nanos, 0);
        if let Some((pt, ptime)) = last {
            assert!(t > pt);
            assert_eq!(ptime.era, e.time.era);
            assert!(
                e.time.nanos >= ptime.nanos,
                "store time went back: {ptime:?} -> {:?}",
                e.time
            );
        }
        last = Some((t, e.time));
    }
}

/// Next event of a watch, within a deadline.
async fn next_event(w: &mut putex::store::WatchStream) -> Result<WatchEvent, StoreError> {
    match tokio::time::timeout(T, w.next()).await {
        Ok(Some(ev)) => ev,
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within {T:?}"),
    }
}

/// Collects events until one at `revision` or later arrives.
async fn events_until(w: &mut putex::store::WatchStream, revision: u64) -> Vec<WatchEvent> {
    let mut out: Vec<WatchEvent> = Vec::new();
    while out.last().is_none_or(|e| e.revision < revision) {
        out.push(next_event(w).await.expect("watch event"));
    }
    out
}

fn assert_increasing(events: &[WatchEvent]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].revision < pair[1].revision,
            "out of order: {pair:?}"
        );
    }
}

/// The latest state per key that a list of events leaves.
fn latest(events: &[WatchEvent]) -> BTreeMap<String, Option<Vec<u8>>> {
    events
        .iter()
        .map(|e| (e.key.clone(), e.entry.as_ref().map(|x| x.value.clone())))
        .collect()
}

/// Watch: initial state, ordering, deletes, filters, and resuming.
async fn watch(s: &AnyStore) {
    let a = s.create("member.w.a", b"a1", T).await.unwrap();
    s.create("member.other.x", b"x", T).await.unwrap();
    let mut w = s.watch("member.w.", None, T).await.unwrap();
    // From no revision: the current state first.
    let first = events_until(&mut w, a.revision).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].key, "member.w.a");
    assert_eq!(first[0].entry.as_ref().unwrap().value, b"a1");
    assert_eq!(first[0].entry.as_ref().unwrap().token, a);

    let b = s
        .create("member.w.b.host.example.com", b"b1", T)
        .await
        .unwrap();
    let a2 = s.update("member.w.a", b"a2", a, T).await.unwrap();
    s.put("member.other.x", b"x2", T).await.unwrap();
    s.delete("member.w.b.host.example.com", b, T).await.unwrap();
    let c = s.create("member.w.c", b"c1", T).await.unwrap();
    let evs = events_until(&mut w, c.revision).await;
    assert_increasing(&evs);
    assert!(
        evs.iter().all(|e| e.key.starts_with("member.w.")),
        "{evs:?}"
    );
    let state = latest(&evs);
    assert_eq!(state["member.w.a"], Some(b"a2".to_vec()));
    assert_eq!(state["member.w.b.host.example.com"], None, "delete event");
    assert_eq!(state["member.w.c"], Some(b"c1".to_vec()));
    let d = evs
        .iter()
        .find(|e| e.key == "member.w.b.host.example.com" && e.entry.is_none());
    assert!(d.expect("a delete event").revision > b.revision);
    for e in &evs {
        assert_ne!(e.time.nanos, 0);
        if let Some(x) = &e.entry {
            assert_eq!(x.token.revision, e.revision);
        }
    }
    drop(w);

    // Resume from a revision: everything from there on, nothing before.
    let mut w = s.watch("member.w.", Some(a2.revision), T).await.unwrap();
    let evs = events_until(&mut w, c.revision).await;
    assert_increasing(&evs);
    assert!(evs[0].revision >= a2.revision);
    let state = latest(&evs);
    assert_eq!(state.get("member.w.c"), Some(&Some(b"c1".to_vec())));
    assert_eq!(state.get("member.w.b.host.example.com"), Some(&None));
    // Changes after resuming keep coming.
    let c2 = s.update("member.w.c", b"c2", c, T).await.unwrap();
    let evs = events_until(&mut w, c2.revision).await;
    assert_eq!(evs.last().unwrap().entry.as_ref().unwrap().value, b"c2");

    // A watch on one key.
    let mut w = s.watch("member.w.c", Some(c2.revision), T).await.unwrap();
    let ev = next_event(&mut w).await.unwrap();
    assert_eq!((ev.key.as_str(), ev.revision), ("member.w.c", c2.revision));

    // A bad filter is a configuration error.
    assert!(matches!(
        s.watch("member..", None, T).await,
        Err(StoreError::Config { .. })
    ));
}

/// A retired key (a waiter's ticket) is deleted like any other: watchers
/// of its prefix see it go, a read finds nothing, a stale token conflicts,
/// and its siblings stay. On NATS and SQLite its trace then goes after
/// `RETIRED_KEPT` (tested per store).
async fn retire(s: &AnyStore) {
    let a = s.create("queue.r.a", b"a1", T).await.unwrap();
    let a2 = s.update("queue.r.a", b"a2", a, T).await.unwrap();
    let b = s.create("queue.r.b", b"b1", T).await.unwrap();
    let mut w = s.watch("queue.r.", None, T).await.unwrap();
    events_until(&mut w, b.revision).await;
    assert!(matches!(
        s.retire("queue.r.a", a, T).await,
        Err(StoreError::Conflict { .. })
    ));
    s.retire("queue.r.a", a2, T).await.unwrap();
    let c = s.create("queue.r.c", b"c1", T).await.unwrap();
    let evs = events_until(&mut w, c.revision).await;
    let state = latest(&evs);
    assert_eq!(
        state.get("queue.r.a"),
        Some(&None),
        "a delete event: {evs:?}"
    );
    assert_eq!(s.get("queue.r.a", ReadMode::Leader, T).await.unwrap(), None);
    let still = s.get("queue.r.b", ReadMode::Leader, T).await.unwrap();
    assert_eq!(still.map(|e| e.token), Some(b));
}

/// Eight writers race a compare-and-swap on one key, round after round:
/// exactly one wins each round, the rest see a conflict.
async fn concurrent_cas(handles: &[AnyStore]) {
    assert_eq!(handles.len(), 8);
    let k = "lock.race";
    let mut token = handles[0].create(k, b"start", T).await.unwrap();
    for round in 0..5 {
        let results = futures::future::join_all(handles.iter().enumerate().map(|(i, h)| {
            let value = format!("round {round} writer {i}");
            async move { h.update(k, value.as_bytes(), token, T).await }
        }))
        .await;
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for r in &results {
            if let Err(e) = r {
                assert!(
                    e.is_conflict(),
                    "round {round}: a loser must see a conflict: {e}"
                );
            }
        }
        token = *winners[0];
        let e = handles[1]
            .get(k, ReadMode::Leader, T)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.token, token);
        assert!(String::from_utf8_lossy(&e.value).starts_with(&format!("round {round} ")));
    }
}

/// The whole suite on one store (`handles[0]`), with 8 handles for the race.
/// Guarded writes: applied only while the guard record is at the given
/// revision, refused (and nothing written) once it moved — while an
/// unguarded write of the same key lands; a batch all or none where the
/// store takes one.
async fn guarded(s: &AnyStore) {
    let lock = "lock.guarded";
    let put = |key: &str, v: &str| Write::Put {
        key: key.to_owned(),
        value: v.as_bytes().to_vec(),
    };
    let value = |key: &'static str| async move {
        s.get(key, ReadMode::Leader, T)
            .await
            .unwrap()
            .map(|e| e.value)
    };
    let first = s.create(lock, &json("a"), T).await.unwrap();
    s.guarded(lock, first, &[put("kv.g.one", "1")], T)
        .await
        .unwrap();
    assert_eq!(value("kv.g.one").await, Some(b"1".to_vec()));
    // The holder renews: the old revision no longer guards anything.
    let renewed = s.update(lock, &json("b"), first, T).await.unwrap();
    let stale = s.guarded(lock, first, &[put("kv.g.one", "stale")], T).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(
        value("kv.g.one").await,
        Some(b"1".to_vec()),
        "nothing written"
    );
    s.guarded(lock, renewed, &[put("kv.g.one", "2")], T)
        .await
        .unwrap();
    // Another holder takes over: the stale holder's write is refused by the
    // store, where a plain write would have landed.
    let taken = s.update(lock, &json("c"), renewed, T).await.unwrap();
    let late = s
        .guarded(lock, renewed, &[put("kv.g.one", "late")], T)
        .await;
    assert!(matches!(late, Err(StoreError::Conflict { .. })), "{late:?}");
    assert_eq!(value("kv.g.one").await, Some(b"2".to_vec()));
    s.put("kv.g.one", b"plain", T).await.unwrap();
    assert_eq!(value("kv.g.one").await, Some(b"plain".to_vec()));
    // A delete, guarded the same way; deleting an absent key is no error.
    let deleted = Write::Delete {
        key: "kv.g.one".into(),
    };
    let refused = s
        .guarded(lock, renewed, std::slice::from_ref(&deleted), T)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict { .. })),
        "{refused:?}"
    );
    assert!(value("kv.g.one").await.is_some());
    s.guarded(lock, taken, std::slice::from_ref(&deleted), T)
        .await
        .unwrap();
    assert_eq!(value("kv.g.one").await, None);
    s.guarded(lock, taken, &[deleted], T).await.unwrap();
    // A guard that was never written, or is gone, guards nothing.
    let never = s
        .guarded("lock.never", first, &[put("kv.g.two", "x")], T)
        .await;
    assert!(
        matches!(never, Err(StoreError::Conflict { .. })),
        "{never:?}"
    );
    // Bad batches are refused before the store sees them.
    for bad in [
        vec![],
        vec![put(lock, "x")],
        vec![put("kv.g.a", "1"), put("kv.g.a", "2")],
        vec![put("kv g", "1")],
    ] {
        let r = s.guarded(lock, taken, &bad, T).await;
        assert!(
            matches!(r, Err(StoreError::Config { .. })),
            "{bad:?}: {r:?}"
        );
    }
    // Several keys at once: all or none (on NATS an atomic batch, 2.12+).
    let batch = [put("kv.g.a", "1"), put("kv.g.b", "2")];
    let stale = s.guarded(lock, renewed, &batch, T).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(value("kv.g.a").await, None, "nothing of a stale batch");
    assert_eq!(value("kv.g.b").await, None, "nothing of a stale batch");
    let applied = s.guarded(lock, taken, &batch, T).await.unwrap();
    assert_eq!(value("kv.g.a").await, Some(b"1".to_vec()));
    assert_eq!(value("kv.g.b").await, Some(b"2".to_vec()));
    // A put and a delete at once; the batch's token is past each write.
    let mixed = [
        put("kv.g.a", "3"),
        Write::Delete {
            key: "kv.g.b".into(),
        },
    ];
    let after = s.guarded(lock, taken, &mixed, T).await.unwrap();
    assert!(after > applied, "{after:?} after {applied:?}");
    assert_eq!(value("kv.g.a").await, Some(b"3".to_vec()));
    assert_eq!(value("kv.g.b").await, None);
    let moved = s.update(lock, &json("d"), taken, T).await.unwrap();
    let late = s.guarded(lock, taken, &mixed, T).await;
    assert!(matches!(late, Err(StoreError::Conflict { .. })), "{late:?}");
    s.guarded(lock, moved, &batch, T).await.unwrap();
    assert_eq!(value("kv.g.b").await, Some(b"2".to_vec()));
}

async fn contract(handles: &[AnyStore]) {
    let s = &handles[0];
    cas_semantics(s).await;
    garbage(s).await;
    timestamps(s).await;
    watch(s).await;
    retire(s).await;
    concurrent_cas(handles).await;
    guarded(s).await;
}

/// Which write [`unknown_then`] leaves unanswered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Landing {
    /// A compare-and-swap: the renewal H4 is about.
    Cas,
    /// An unconditional put, for NATS: a compare-and-swap there first reads
    /// the bucket's epoch from the stream leader, so a server that stalls
    /// before that answer is never sent the write at all (see
    /// [`store_unknown_nats_sigstop`]).
    Put,
}

/// What becomes of a write reported Unknown, by store.
#[derive(PartialEq, Eq)]
enum Then {
    /// It was sent before the stall was noticed: it lands, and a leader
    /// read finds it by its write id.
    Lands,
    /// The store drops a write whose caller gave up before it could be
    /// applied (SQLite: before the write lock was won,
    /// `r54_a_write_given_up_while_waiting_for_the_lock_never_lands_and_the_next_joins`).
    NeverLands,
}

/// A write times out as Unknown within its deadline; then, as `then` says,
/// a leader read finds it by its write id, or finds that it never landed.
/// `stall` makes the store unresponsive and returns a closure that makes
/// it responsive again.
async fn unknown_then<F: FnOnce()>(
    s: &AnyStore,
    landing: Landing,
    then: Then,
    stall: impl FnOnce() -> F,
) {
    let k = "lock.unknown";
    let t = s.create(k, &json("w-0"), T).await.unwrap();
    let unstall = stall();
    let started = Instant::now();
    let short = Duration::from_millis(300);
    let e = match landing {
        Landing::Cas => s.update(k, &json("w-unknown-1"), t, short).await,
        Landing::Put => s.put(k, &json("w-unknown-1"), short).await,
    }
    .unwrap_err();
    assert!(
        e.is_unknown(),
        "a timeout must be unknown, never a conflict: {e}"
    );
    assert!(
        started.elapsed() < short + Duration::from_millis(700),
        "deadline kept: {:?}",
        started.elapsed()
    );
    unstall();
    if then == Then::NeverLands {
        // Given up before it could be applied: it is never applied later.
        // (A write that would land does so within milliseconds of the
        // store's answering again.)
        tokio::time::sleep(Duration::from_millis(500)).await;
        let e = s.get(k, ReadMode::Leader, T).await.unwrap().unwrap();
        assert_eq!(e.value, json("w-0"), "the given-up write landed late");
        assert_eq!(e.token, t);
        // The old token is still current: a compare-and-swap on it wins.
        s.update(k, &json("w-2"), t, T).await.unwrap();
        return;
    }
    // The write was sent before the stall was noticed: it lands.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(e)) = s.get(k, ReadMode::Leader, T).await {
            if e.value == json("w-unknown-1") {
                assert!(e.token > t);
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the unknown write never showed up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // After which a CAS on the old token is a conflict.
    assert!(s
        .update(k, &json("w-2"), t, T)
        .await
        .unwrap_err()
        .is_conflict());
}

// ---------------------------------------------------------------------------
// Backends.

fn memory_handles() -> Vec<AnyStore> {
    let m = MemoryStore::new();
    (0..8).map(|_| AnyStore::from(m.clone())).collect()
}

async fn sqlite_handles(path: &std::path::Path) -> Vec<AnyStore> {
    // Separate handles have separate connections: like separate processes.
    let mut v = Vec::new();
    for _ in 0..8 {
        v.push(AnyStore::from(
            SqliteStore::open(path.to_owned()).await.unwrap(),
        ));
    }
    v
}

async fn nats_handles(url: &str) -> Vec<AnyStore> {
    let url = StoreUrl::parse(url).unwrap();
    let mut v = Vec::new();
    for _ in 0..8 {
        v.push(open_retrying(&url).await);
    }
    v
}

/// Opens a store, retrying while a fresh cluster elects its leaders.
pub(crate) async fn open_retrying(url: &StoreUrl) -> AnyStore {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match AnyStore::open(url).await {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline && !matches!(e, StoreError::Config { .. }) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot open {url}: {e}"),
        }
    }
}

#[tokio::test]
async fn store_contract_memory() {
    contract(&memory_handles()).await;
}

#[tokio::test]
async fn store_contract_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let handles = sqlite_handles(&dir.path().join("sub/dir/store.db")).await;
    contract(&handles).await;
    // Reopening keeps the epoch; a new file gets a later one.
    let again = SqliteStore::open(dir.path().join("sub/dir/store.db"))
        .await
        .unwrap();
    assert_eq!(again.epoch(), handles[0].epoch());
    let other = SqliteStore::open(dir.path().join("other.db"))
        .await
        .unwrap();
    assert!(other.epoch() > again.epoch());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract_nats() {
    let server = NatsServer::start();
    let handles = nats_handles(&server.url).await;
    contract(&handles).await;
}

/// A retired key leaves nothing behind on NATS: its delete is a purge
/// marker that replaces the key's earlier messages and carries a TTL of
/// `RETIRED_KEPT`, after which the server removes it — on a bucket putex
/// creates and on one created before without per-message TTLs, which putex
/// lets take them. Before, every ticket left a delete marker for good, and
/// each cost every later waiter of its lock a delivery: after 40,000 runs a
/// `putex lock` took 438 ms, 327 of them the server's CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_a_retired_key_leaves_nothing_behind() {
    let server = NatsServer::start();
    let js = undated_bucket(&server).await;
    let stream = || async {
        js.get_stream("KV_putex")
            .await
            .unwrap()
            .get_info()
            .await
            .unwrap()
    };
    assert!(!stream().await.config.allow_message_ttl);
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    // Allowed beside the open, not in its way.
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let asked = Instant::now();
    while !n.retires_leave_nothing() {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "TTLs never allowed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        stream().await.config.allow_message_ttl,
        "putex lets the bucket take TTLs"
    );
    let a = s.create("queue.n.a", b"a1", T).await.unwrap();
    let a2 = s.update("queue.n.a", b"a2", a, T).await.unwrap();
    s.retire("queue.n.a", a2, T).await.unwrap();
    let st = js.get_stream("KV_putex").await.unwrap();
    let last = st
        .get_last_raw_message_by_subject("$KV.putex.queue.n.a")
        .await
        .unwrap();
    let headers = last.headers;
    assert_eq!(
        headers.get("KV-Operation").map(|v| v.as_str()),
        Some("PURGE")
    );
    assert_eq!(
        headers.get("Nats-TTL").map(|v| v.as_str()),
        Some(format!("{}s", putex::store::RETIRED_KEPT.as_secs()).as_str())
    );
    // The purge replaced the key's two values: one message is left.
    let info = st
        .info_with_subjects("$KV.putex.queue.n.a")
        .await
        .unwrap()
        .next()
        .await
        .map(|r| r.unwrap());
    assert_eq!(info.map(|(_, n)| n), Some(1));
    // A plain delete keeps its marker (a lock record's stays readable).
    let b = s.create("lock.n", b"b", T).await.unwrap();
    s.delete("lock.n", b, T).await.unwrap();
    let marker = st
        .get_last_raw_message_by_subject("$KV.putex.lock.n")
        .await
        .unwrap();
    assert!(marker.headers.get("Nats-TTL").is_none());
}

/// A cluster that has just started answers no JetStream request until it
/// has elected its meta leader (seen: 1-15 s), and drops what it gets
/// meanwhile unanswered. One `open` (no retry here) still succeeds: it asks
/// again, with growing patience, until its deadline. Before, the first
/// dropped request held the whole open until its 15 s deadline and failed
/// (`putex run` then exited at start: a CI failure in `blackhole-r3`).
/// Once the cluster runs, an open takes a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_a_fresh_cluster_is_opened_once_it_has_a_meta_leader() {
    for round in 0..2 {
        let cluster = NatsCluster::start();
        let url = StoreUrl::parse(&format!("{}?bucket=fresh&replicas=3", cluster.url())).unwrap();
        let started = Instant::now();
        let opened = AnyStore::open(&url).await;
        let took = started.elapsed();
        assert!(
            opened.is_ok(),
            "round {round}: {:?} after {took:?}",
            opened.err()
        );
        eprintln!("round {round}: a fresh cluster opened in {took:?}");
        let started = Instant::now();
        AnyStore::open(&url).await.unwrap();
        let again = started.elapsed();
        assert!(
            again < Duration::from_secs(2),
            "round {round}: a running cluster took {again:?}"
        );
    }
}

/// R3 bucket on a 3-node cluster: the same contract; a CAS conflict (which
/// a replicated stream reports as 10164) is classified as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_contract_nats_cluster_r3() {
    let cluster = NatsCluster::start();
    let url = format!("{}?bucket=putex_r3&replicas=3", cluster.url());
    let handles = nats_handles(&url).await;
    let AnyStore::Nats(n) = &handles[0] else {
        unreachable!()
    };
    let info = async_nats::jetstream::new(n.client().clone())
        .get_stream("KV_putex_r3")
        .await
        .unwrap()
        .cached_info()
        .clone();
    assert_eq!(info.config.num_replicas, 3);
    contract(&handles).await;

    // What the server answers to a failed CAS on the R3 bucket, raw: the
    // code that async-nats reports as `Other` must still be a conflict here.
    let s = &handles[0];
    let t = s.create("lock.r3", b"a", T).await.unwrap();
    s.update("lock.r3", b"b", t, T).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        async_nats::HeaderValue::from(t.revision),
    );
    let js = async_nats::jetstream::new(n.client().clone());
    let err = js
        .publish_with_headers("$KV.putex_r3.lock.r3", headers, "raw".into())
        .await
        .unwrap()
        .await
        .unwrap_err();
    let code = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<async_nats::jetstream::Error>())
        .map(|e| e.error_code().0);
    eprintln!(
        "R3 CAS conflict: kind {:?}, JetStream code {code:?}",
        err.kind()
    );
    assert!(matches!(code, Some(10071 | 10164)), "{err:?}");

    // Racing CAS writers on a replicated stream: the leader rejects those
    // that find a proposal for the subject in flight with 10164. Tally the
    // codes the raw client sees; the store's own race above already showed
    // every loser classified as a conflict.
    let mut codes = BTreeMap::<u64, usize>::new();
    let mut rev = s
        .get("lock.r3", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap()
        .token
        .revision;
    for round in 0.. {
        if round >= 5 && codes.contains_key(&10164) || round == 50 {
            break;
        }
        let results = futures::future::join_all((0..8).map(|i| {
            let js = js.clone();
            async move {
                let mut h = async_nats::HeaderMap::new();
                h.insert(
                    "Nats-Expected-Last-Subject-Sequence",
                    async_nats::HeaderValue::from(rev),
                );
                js.publish_with_headers("$KV.putex_r3.lock.r3", h, format!("{i}").into())
                    .await
                    .unwrap()
                    .await
            }
        }))
        .await;
        let mut won = 0;
        for r in results {
            match r {
                Ok(ack) => {
                    won += 1;
                    rev = ack.sequence;
                }
                Err(e) => {
                    let code = std::error::Error::source(&e)
                        .and_then(|e| e.downcast_ref::<async_nats::jetstream::Error>())
                        .map_or(0, |e| e.error_code().0);
                    *codes.entry(code).or_default() += 1;
                }
            }
        }
        assert_eq!(won, 1);
    }
    eprintln!("R3 racing CAS losers by JetStream code: {codes:?}");
    assert!(
        codes.keys().all(|c| *c == 10071 || *c == 10164),
        "{codes:?}"
    );
    let e = s.update("lock.r3", b"c", t, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
}

#[tokio::test]
async fn store_unknown_memory_fault() {
    let m = MemoryStore::new();
    let s = AnyStore::from(m.clone());
    unknown_then(&s, Landing::Cas, Then::Lands, || {
        m.inject(putex::store::memory::Fault::ApplyThenStall);
        || {}
    })
    .await;
    // A stalled, not applied write is unknown too, and leaves no trace.
    let t = s.create("lock.stall", b"x", T).await.unwrap();
    m.inject(putex::store::memory::Fault::Stall);
    let e = s
        .update("lock.stall", b"y", t, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(e.is_unknown(), "{e}");
    assert_eq!(
        s.get("lock.stall", ReadMode::Leader, T)
            .await
            .unwrap()
            .unwrap()
            .token,
        t
    );
}

/// Another process holds SQLite's write lock past our deadline: unknown;
/// once it lets go, the write is not applied (its caller gave up before
/// the lock was won), and the old token is still current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unknown_sqlite_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let s = AnyStore::from(SqliteStore::open(path.clone()).await.unwrap());
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut c = rusqlite::Connection::open(path).unwrap();
        go_rx.recv().unwrap();
        let t = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        t.rollback().unwrap();
    });
    unknown_then(&s, Landing::Cas, Then::NeverLands, || {
        go_tx.send(()).unwrap();
        locked_rx.recv().unwrap();
        move || {
            release_tx.send(()).unwrap();
            holder.join().unwrap();
        }
    })
    .await;
}

/// A frozen nats-server (SIGSTOP): a write is unknown within its deadline;
/// after SIGCONT the leader read finds it by its write id. A
/// compare-and-swap frozen in flight is unknown too, and may land once the
/// server wakes up: the leader read tells which, and nothing else changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unknown_nats_sigstop() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    let server = &server;
    unknown_then(&s, Landing::Put, Then::Lands, || {
        server.pause();
        move || server.resume()
    })
    .await;
    let k = "lock.unknown";
    let before = s.get(k, ReadMode::Leader, T).await.unwrap().unwrap();
    server.pause();
    let e = s
        .update(
            k,
            &json("w-maybe"),
            before.token,
            Duration::from_millis(300),
        )
        .await;
    server.resume();
    assert!(matches!(e, Err(StoreError::Unknown { .. })), "{e:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = s.get(k, ReadMode::Leader, T).await.unwrap().unwrap();
    if after != before {
        assert_eq!(after.value, json("w-maybe"), "landed, or nothing");
        assert_eq!(after.token.revision, before.token.revision + 1);
    }
    // A read during a stall is unknown too, never "absent".
    server.pause();
    let e = s
        .get("lock.unknown", ReadMode::Leader, Duration::from_millis(200))
        .await;
    server.resume();
    assert!(matches!(e, Err(StoreError::Unknown { .. })), "{e:?}");
}

/// One handle has at most `CALLS_UNDER_WAY` calls under way: with the
/// server frozen, that many are in flight and the rest wait their turn — a
/// call whose deadline passes while it waits is unknown in time, like any
/// other — and once the server wakes up every call that was still within
/// its deadline lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_calls_beyond_the_admission_wait_their_turn_and_all_land() {
    use putex::store::nats::CALLS_UNDER_WAY;
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let total = CALLS_UNDER_WAY + 100;
    server.pause();
    let calls: Vec<_> = (0..total)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.put(&format!("lock.turn{i}"), b"x", Duration::from_secs(20))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while n.calls_under_way() < CALLS_UNDER_WAY && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(n.calls_under_way(), CALLS_UNDER_WAY, "the rest wait");
    let started = Instant::now();
    let late = s
        .put("lock.turn-late", b"x", Duration::from_millis(200))
        .await;
    assert!(matches!(late, Err(StoreError::Unknown { .. })), "{late:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    server.resume();
    for (i, call) in calls.into_iter().enumerate() {
        call.await
            .unwrap()
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
    }
    assert_eq!(n.calls_under_way(), 0);
    for i in [0, CALLS_UNDER_WAY, total - 1] {
        let key = format!("lock.turn{i}");
        assert!(
            s.get(&key, ReadMode::Leader, T).await.unwrap().is_some(),
            "{key}"
        );
    }
}

/// Every write of a handle is answered on one subscription: a write whose
/// caller gave up (the server frozen past its deadline) is unknown in time
/// and leaves nothing waiting; its answer, when the server wakes up, is
/// dropped, and the writes after it get their own answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_writes_whose_caller_gave_up_leave_nothing_waiting() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let t = s.create("lock.gave-up", &json("w0"), T).await.unwrap();
    server.pause();
    let writes: Vec<_> = (0..50)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.put(
                    &format!("lock.gave-up{i}"),
                    b"x",
                    Duration::from_millis(300),
                )
                .await
            })
        })
        .collect();
    let cas = s
        .update("lock.gave-up", &json("w1"), t, Duration::from_millis(300))
        .await;
    assert!(matches!(cas, Err(StoreError::Unknown { .. })), "{cas:?}");
    for w in writes {
        let e = w.await.unwrap();
        assert!(matches!(e, Err(StoreError::Unknown { .. })), "{e:?}");
    }
    assert_eq!(
        n.writes_waiting(),
        0,
        "the writes that gave up wait no more"
    );
    server.resume();
    // The late answers come and find nobody. A write answered now was
    // stored after everything sent before it on this connection: the
    // compare-and-swap has landed or not by then (the leader read tells),
    // and the next one is answered for itself.
    s.put("lock.gave-up-after", b"x", T).await.unwrap();
    let landed = s
        .get("lock.gave-up", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert!(
        landed.value == json("w1") || landed.token == t,
        "landed, or nothing: {landed:?}"
    );
    let next = s
        .update("lock.gave-up", &json("w2"), landed.token, T)
        .await
        .unwrap();
    assert!(next > landed.token);
    let stale = s.update("lock.gave-up", &json("w3"), landed.token, T).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(n.writes_waiting(), 0);
}

/// A write that no stream takes (the bucket deleted under the handle) is
/// unknown at once — the server says "no responders" — not a conflict, and
/// not left to its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_a_write_nobody_takes_is_unknown_at_once() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let t = s.create("lock.gone", &json("w0"), T).await.unwrap();
    async_nats::jetstream::new(n.client().clone())
        .delete_key_value("putex")
        .await
        .unwrap();
    let started = Instant::now();
    let e = s
        .update("lock.gone", &json("w1"), t, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(e.is_unknown(), "{e}");
    // The handle re-reads its bucket's epoch every 5 s: on a machine slow
    // enough for that to come first, the epoch read is what finds no
    // stream (unknown too, as soon).
    let said = e.to_string();
    assert!(
        said.contains("no responders") || said.contains("epoch"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(n.writes_waiting(), 0);
}

/// A bucket putex creates dates its revisions: they start at its epoch
/// (its creation time in nanoseconds), so a re-created bucket's revisions
/// all lie above the old one's, its tokens compare higher, and an old
/// token conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_recreated_bucket_has_a_later_epoch() {
    let server = NatsServer::start();
    let url = StoreUrl::parse(&server.url).unwrap();
    let s = open_retrying(&url).await;
    let t = s.create("lock.e", b"x", T).await.unwrap();
    assert_eq!(
        t.revision,
        first_dated_revision(s.epoch()),
        "a new bucket counts from its creation time in microseconds"
    );
    let t = s.update("lock.e", b"x", t, T).await.unwrap();
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    async_nats::jetstream::new(n.client().clone())
        .delete_key_value("putex")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let s2 = open_retrying(&url).await;
    assert!(s2.epoch() > s.epoch());
    let t2 = s2.create("lock.e", b"y", T).await.unwrap();
    assert_eq!(t2.revision, first_dated_revision(s2.epoch()));
    assert!(t2.revision > t.revision, "dated revisions never repeat");
    assert!(t2 > t, "and tokens compare higher");
    let e = s2.update("lock.e", b"z", t, T).await.unwrap_err();
    assert!(e.is_conflict(), "{e}");
}

/// A bucket that was written before putex opened it (created by `nats kv
/// add`, or by a putex that did not date buckets) keeps its numbering from
/// 1; putex works on it, reading the epoch before each compare-and-swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_undated_bucket_keeps_its_numbering() {
    let server = NatsServer::start();
    let url = StoreUrl::parse(&server.url).unwrap();
    let js = undated_bucket(&server).await;
    let s = open_retrying(&url).await;
    let t = s.create("lock.u", b"x", T).await.unwrap();
    assert_eq!(t.revision, 2, "after the one write before");
    let t = s.update("lock.u", b"y", t, T).await.unwrap();
    let e = s.update("lock.u", b"z", Token::new(t.epoch, 2), T).await;
    assert!(e.unwrap_err().is_conflict());
    s.delete("lock.u", t, T).await.unwrap();
    drop(js);
}

/// Creates the bucket `putex` as `nats kv add` would and writes one key,
/// so that putex finds it written and leaves its numbering alone.
async fn undated_bucket(server: &NatsServer) -> async_nats::jetstream::Context {
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let kv = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "putex".into(),
            history: 8,
            ..Default::default()
        })
        .await
        .unwrap();
    kv.put("scratch", "written before putex".into())
        .await
        .unwrap();
    js
}

/// The bucket re-created under a connected handle, and the key written in
/// the new bucket up to the very revision an old token names (undated
/// buckets, which count from 1): a compare-and-swap with the old token
/// conflicts at once — the handle does not wait for its periodic epoch
/// check (every 5 s) to learn of the new bucket — and the new bucket's
/// record is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_recreated_bucket_old_token_conflicts_at_once() {
    recreated_bucket_old_token_conflicts_at_once(false).await;
}

/// The same on dated buckets, where a compare-and-swap reads no epoch: the
/// old handle's token names a revision no later incarnation has, so its
/// compare-and-swap on the re-created bucket conflicts at once however
/// many writes the new bucket took, and the new record is untouched; the
/// conflict makes the old handle re-read the epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_recreated_dated_bucket_old_token_conflicts_at_once() {
    recreated_bucket_old_token_conflicts_at_once(true).await;
}

async fn recreated_bucket_old_token_conflicts_at_once(dated: bool) {
    let server = NatsServer::start();
    let url = StoreUrl::parse(&server.url).unwrap();
    if !dated {
        undated_bucket(&server).await;
    }
    let old = open_retrying(&url).await;
    let AnyStore::Nats(n) = &old else {
        unreachable!()
    };
    let t = old.create("lock.e", b"old holder", T).await.unwrap();
    let t = old.update("lock.e", b"old holder", t, T).await.unwrap();
    let js = async_nats::jetstream::new(n.client().clone());
    js.delete_key_value("putex").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Another host re-creates the bucket and writes the key: undated, up
    // to the revision of the old token; dated, a few times (its revisions
    // are all above the old token's).
    if !dated {
        undated_bucket(&server).await;
    }
    let new = open_retrying(&url).await;
    assert!(new.epoch() > old.epoch());
    let mut t2 = new.create("lock.e", b"new holder", T).await.unwrap();
    if dated {
        for _ in 0..3 {
            t2 = new.update("lock.e", b"new holder", t2, T).await.unwrap();
        }
        assert!(t2.revision > t.revision);
    } else {
        while t2.revision < t.revision {
            t2 = new.update("lock.e", b"new holder", t2, T).await.unwrap();
        }
        assert_eq!(
            t2.revision, t.revision,
            "the same revision in the new bucket"
        );
    }

    let started = Instant::now();
    let e = old.update("lock.e", b"stale", t, T).await.unwrap_err();
    assert!(e.is_conflict(), "update with the old bucket's token: {e}");
    let e = old.delete("lock.e", t, T).await.unwrap_err();
    assert!(e.is_conflict(), "delete with the old bucket's token: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not at once: {:?}",
        started.elapsed()
    );
    let e = new
        .get("lock.e", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((e.value.as_slice(), e.token), (&b"new holder"[..], t2));
    // The old handle knows the new bucket now (undated: from the epoch
    // read; dated: the conflict had it re-read): its reads carry the new
    // epoch, and a compare-and-swap on what it reads succeeds.
    let seen = old
        .get("lock.e", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.token, t2);
    assert_eq!(old.epoch(), new.epoch());
    old.update("lock.e", b"taken over", seen.token, T)
        .await
        .unwrap();
}

/// Keys names on the wire: the layout `docs/stores.md` describes.
#[tokio::test]
async fn store_key_layout() {
    use putex::store::keys;
    let s = AnyStore::from(MemoryStore::new());
    let lock = keys::lock(&"pg".parse().unwrap());
    let member = keys::member(&"pg".parse().unwrap(), &"db1.example.com".parse().unwrap());
    let probe = keys::probe(&"db1.example.com".parse().unwrap());
    for k in [&lock, &member, &probe] {
        s.put(k, b"x", T).await.unwrap();
    }
    let mut w = s
        .watch(&keys::members_of(&"pg".parse().unwrap()), None, T)
        .await
        .unwrap();
    let ev = next_event(&mut w).await.unwrap();
    assert_eq!(ev.key, "member.pg.db1.example.com");
    let names: HashSet<_> = [lock, member, probe].into_iter().collect();
    assert_eq!(names.len(), 3);
    assert!("bad.name"
        .parse::<putex::store::Name>()
        .unwrap_err()
        .to_string()
        .contains("nightly-report"));
}

/// A bucket whose records expire is refused; one without history is
/// accepted (with a warning); one the server cannot create as asked (three
/// replicas on a lone server) is a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_refuses_unfit_buckets() {
    let server = NatsServer::start();
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: "ttl".into(),
        history: 5,
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = StoreUrl::parse(&format!("{}?bucket=ttl", server.url)).unwrap();
    match AnyStore::open(&url).await {
        Err(StoreError::Config { reason }) => assert!(reason.contains("never expire"), "{reason}"),
        other => panic!("{other:?}"),
    }
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: "nohistory".into(),
        history: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let url = StoreUrl::parse(&format!("{}?bucket=nohistory", server.url)).unwrap();
    let s = AnyStore::open(&url).await.unwrap();
    s.create("lock.x", b"x", T).await.unwrap();

    // Three replicas on a lone server: the server refuses, and that is a
    // configuration error, not something to retry.
    let url = StoreUrl::parse(&format!("{}?bucket=r3&replicas=3", server.url)).unwrap();
    match AnyStore::open(&url).await {
        Err(StoreError::Config { reason }) => assert!(reason.contains("replica"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// No server at the address: opening is unknown (retrying may help), not a
/// configuration error, and comes back within its deadline.
#[tokio::test]
async fn store_nats_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = StoreUrl::parse(&format!("nats://127.0.0.1:{port}")).unwrap();
    let started = Instant::now();
    match AnyStore::open(&url).await {
        Err(StoreError::Unknown { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(16));
}

/// Set in a child process of [`store_sqlite_many_processes`].
const SQLITE_CHILD_ENV: &str = "PUTEX_TEST_SQLITE_CHILD";
const INCREMENTS: u64 = 50;

/// Increments a counter by compare-and-swap, retrying on conflict.
async fn increment(s: &AnyStore, key: &str) {
    loop {
        let e = s.get(key, ReadMode::Leader, T).await.unwrap().unwrap();
        let n: u64 = String::from_utf8(e.value).unwrap().parse().unwrap();
        match s
            .update(key, (n + 1).to_string().as_bytes(), e.token, T)
            .await
        {
            Ok(_) => return,
            Err(e) if e.is_conflict() => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The child half of [`store_sqlite_many_processes`]; a no-op otherwise.
#[tokio::test]
async fn store_sqlite_child_writer() {
    let Some(path) = std::env::var_os(SQLITE_CHILD_ENV) else {
        return;
    };
    let s = AnyStore::from(SqliteStore::open(path.into()).await.unwrap());
    for _ in 0..INCREMENTS {
        increment(&s, "lock.counter").await;
    }
}

/// Several agents started together all open one fresh SQLite file: none
/// fails while another sets it up (the WAL switch is retried in the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_fresh_file_opened_by_many_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let opens: Vec<_> = (0..8)
        .map(|_| tokio::spawn(putex::store::SqliteStore::open(path.clone())))
        .collect();
    for open in opens {
        open.await
            .unwrap()
            .expect("a concurrent first open succeeds");
    }
}

/// Four processes increment one counter by compare-and-swap on one SQLite
/// file: no increment is lost, none applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_many_processes() {
    const PROCS: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let s = AnyStore::from(SqliteStore::open(path.clone()).await.unwrap());
    s.create("lock.counter", b"0", T).await.unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCS)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "store_contract::store_sqlite_child_writer",
                    "--quiet",
                ])
                .env(SQLITE_CHILD_ENV, &path)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let e = s
        .get("lock.counter", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8(e.value).unwrap(),
        (PROCS * INCREMENTS).to_string()
    );
}

/// `r` failed as unknown (the holder stops by H1), saying that `file` was
/// deleted or replaced.
fn assert_replaced<V: std::fmt::Debug>(
    r: Result<V, StoreError>,
    file: &std::path::Path,
    ctx: &str,
) {
    match r {
        Err(e @ StoreError::Unknown { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("deleted or replaced") && msg.contains(&file.display().to_string()),
                "{ctx}: {msg}"
            );
        }
        other => panic!(
            "{ctx}: expected an unknown outcome naming {}, got {other:?}",
            file.display()
        ),
    }
}

fn sidecar(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

/// The SQLite file deleted (with its -wal and -shm) under an open handle,
/// then a new file created at the same path: every call of the old handle,
/// and its watch, fails as unknown naming the file — it never goes on
/// renewing a lock in a file nobody else sees — and nothing it does
/// reaches the new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_file_deleted_under_a_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let old = AnyStore::from(SqliteStore::open(path.clone()).await.unwrap());
    let t = old.create("lock.pg", b"old holder", T).await.unwrap();
    let mut w = old.watch("lock.", None, T).await.unwrap();
    assert_eq!(next_event(&mut w).await.unwrap().revision, t.revision);
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(sidecar(&path, suffix)).unwrap();
    }
    // No file at the path.
    assert_replaced(
        old.update("lock.pg", b"renewal", t, T).await,
        &path,
        "update, no file",
    );
    assert_replaced(
        old.get("lock.pg", ReadMode::Leader, T).await,
        &path,
        "get, no file",
    );

    // A new file at the path is a new store: a later epoch, and revisions
    // that start again (the old token's revision is handed out again).
    let new = AnyStore::from(SqliteStore::open(path.clone()).await.unwrap());
    assert!(new.epoch() > old.epoch());
    let t2 = new.create("lock.pg", b"new holder", T).await.unwrap();
    assert_eq!(t2.revision, t.revision);

    // The old handle reaches neither file.
    assert_replaced(
        old.update("lock.pg", b"renewal", t, T).await,
        &path,
        "update",
    );
    assert_replaced(old.get("lock.pg", ReadMode::Any, T).await, &path, "get");
    assert_replaced(old.create("lock.other", b"x", T).await, &path, "create");
    assert_replaced(old.put("probe.x", b"x", T).await, &path, "put");
    assert_replaced(old.delete("lock.pg", t, T).await, &path, "delete");
    assert_replaced(
        old.watch("lock.", None, T).await.map(drop),
        &path,
        "new watch",
    );
    // Its running watch ends with the same error instead of following
    // either file.
    match tokio::time::timeout(T, w.next()).await {
        Ok(Some(r)) => assert_replaced(r, &path, "running watch"),
        other => panic!("the old handle's watch went on: {other:?}"),
    }
    let e = new
        .get("lock.pg", ReadMode::Leader, T)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((e.value.as_slice(), e.token), (&b"new holder"[..], t2));
}

/// Only the SQLite database file deleted, its -wal and -shm left behind:
/// the open handle fails as unknown, and a new handle refuses to open — a
/// new database next to them would share the deleted database's
/// write-ahead log and shared-memory index with its open handles, which can
/// corrupt both. Once they are removed, a fresh store opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_database_deleted_but_its_wal_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let old = AnyStore::from(SqliteStore::open(path.clone()).await.unwrap());
    let t = old.create("lock.pg", b"old holder", T).await.unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_replaced(old.get("lock.pg", ReadMode::Leader, T).await, &path, "get");
    assert_replaced(
        old.update("lock.pg", b"renewal", t, T).await,
        &path,
        "update",
    );
    let refused = |r: Result<SqliteStore, StoreError>, ctx: &str| match r {
        Err(StoreError::Config { reason }) => assert!(
            reason.contains(&sidecar(&path, "-wal").display().to_string())
                && reason.contains("remove"),
            "{ctx}: {reason}"
        ),
        other => panic!("{ctx}: a new database next to the old -wal: {other:?}"),
    };
    refused(SqliteStore::open(path.clone()).await, "open");
    // Closing the old handle leaves them: SQLite neither checkpoints nor
    // removes the log of a database that was unlinked.
    drop(old);
    refused(SqliteStore::open(path.clone()).await, "open after close");
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(sidecar(&path, suffix)).unwrap();
    }
    let fresh = SqliteStore::open(path.clone()).await.unwrap();
    assert!(fresh.epoch() > t.epoch);
    fresh.create("lock.pg", b"new holder", T).await.unwrap();
}

/// 10,000 watches on one handle, one key each, all served by the handle's
/// one feed: every watch sees its key's initial state, then its own change
/// and no other key's; deleting re-delivers to the right watch. (Threads,
/// open files and CPU per lease count are `scale_bench`'s: other tests share
/// this process.)
async fn ten_thousand_watches(s: &AnyStore, tag: &str) {
    const N: usize = 10_000;
    let key = |i: usize| format!("lock.w{tag}{i}");
    // Half the keys exist before their watch starts.
    let mut tokens = Vec::new();
    for i in 0..N / 2 {
        tokens.push(s.create(&key(i), b"before", T).await.unwrap());
    }
    let mut watches = Vec::with_capacity(N);
    for i in 0..N {
        watches.push(s.watch(&key(i), None, T).await.unwrap());
    }
    assert_eq!(s.watches(), N, "the handle's feed serves every watch");
    // The initial state of the keys that existed.
    for (i, w) in watches.iter_mut().enumerate().take(N / 2) {
        let e = next_event(w).await.unwrap();
        assert_eq!(
            (e.key.as_str(), e.revision),
            (key(i).as_str(), tokens[i].revision)
        );
    }
    // A change to every key, then a delete of every tenth.
    let mut written = Vec::new();
    for i in 0..N {
        let t = match tokens.get(i) {
            Some(&before) => s.update(&key(i), b"after", before, T).await.unwrap(),
            None => s.create(&key(i), b"after", T).await.unwrap(),
        };
        written.push(t);
    }
    for i in (0..N).step_by(10) {
        s.delete(&key(i), written[i], T).await.unwrap();
    }
    for (i, w) in watches.iter_mut().enumerate() {
        let e = next_event(w).await.unwrap();
        assert_eq!(e.key, key(i), "watch {i} got another key's event");
        assert_eq!(e.revision, written[i].revision);
        assert_eq!(e.entry.unwrap().value, b"after");
        if i % 10 == 0 {
            let d = next_event(w).await.unwrap();
            assert!(d.entry.is_none() && d.revision > written[i].revision);
        }
    }
    drop(watches);
    assert_eq!(s.watches(), 0, "dropped watches leave the feed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_ten_thousand_watches_share_one_feed() {
    let dir = tempfile::tempdir().unwrap();
    let s = AnyStore::from(
        SqliteStore::open(dir.path().join("store.db"))
            .await
            .unwrap(),
    );
    ten_thousand_watches(&s, "s").await;
}

/// On NATS the 10,000 watches also cost the bucket's stream no consumer
/// each: one for the handle's feed (nats-server allows 1,000 per stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_ten_thousand_watches_share_one_consumer() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    let AnyStore::Nats(n) = &s else {
        unreachable!()
    };
    let js = async_nats::jetstream::new(n.client().clone());
    let consumers = || async {
        js.get_stream("KV_putex")
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .consumer_count
    };
    ten_thousand_watches(&s, "n").await;
    assert!(
        consumers().await <= 1,
        "consumers on the bucket's stream: {}",
        consumers().await
    );
    let keys: Vec<String> = (0..2_000).map(|i| format!("lock.more{i}")).collect();
    let _w: Vec<_> = futures::future::join_all(keys.iter().map(|k| s.watch(k, None, T))).await;
    assert!(consumers().await <= 1, "more watches, more consumers");
}

/// A snapshot of a prefix misses no key, even one written again and again
/// while the snapshot is taken (a member renewing: its state before the
/// snapshot's marker is coalesced into one after it). Here every 10 ms.
async fn snapshots_miss_no_busy_key(s: &AnyStore) {
    s.put("member.snap.quiet", b"q", T).await.unwrap();
    // Written once before the first snapshot: on a loaded host the task
    // below may first run after it.
    s.put("member.snap.busy", b"b", T).await.unwrap();
    let busy = {
        let s = s.clone();
        tokio::spawn(async move {
            // Far more often than any member renews (once per R).
            loop {
                s.put("member.snap.busy", b"b", T).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for _ in 0..30 {
        // A generous deadline: the whole suite runs beside it.
        let got = putex::store::read_prefix(s, "member.snap.", T * 6)
            .await
            .unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            keys.contains(&"member.snap.busy") && keys.contains(&"member.snap.quiet"),
            "{keys:?}"
        );
    }
    busy.abort();
}

/// A prefix watch's first delivery holds the key written just before it,
/// while other keys under the prefix are written without pause: 100
/// times, each within the event deadline. (On NATS the catch-up once
/// ended when a message said "0 pending" with the last key still to
/// come: that key was lost to the watch.)
async fn a_prefix_watch_starts_with_the_key_written_before_it(s: &AnyStore) {
    s.put("member.first.busy", b"b", T).await.unwrap();
    let busy = {
        let s = s.clone();
        tokio::spawn(async move {
            loop {
                s.put("member.first.busy", b"b", T).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for i in 0..100 {
        let key = format!("member.first.k{i}");
        let written = s.put(&key, b"k", T).await.unwrap();
        let mut w = s.watch("member.first.", None, T).await.unwrap();
        let got = events_until(&mut w, written.revision).await;
        assert!(
            got.iter()
                .any(|e| e.key == key && e.revision == written.revision),
            "watch {i} began without {key} at {}: {:?}",
            written.revision,
            got.iter().map(|e| (&e.key, e.revision)).collect::<Vec<_>>()
        );
    }
    busy.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_prefix_watch_starts_with_the_key_written_before_it() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    a_prefix_watch_starts_with_the_key_written_before_it(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_prefix_watch_starts_with_the_key_written_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = AnyStore::from(
        SqliteStore::open(dir.path().join("store.db"))
            .await
            .unwrap(),
    );
    a_prefix_watch_starts_with_the_key_written_before_it(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_sqlite_snapshots_miss_no_busy_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = AnyStore::from(
        SqliteStore::open(dir.path().join("store.db"))
            .await
            .unwrap(),
    );
    snapshots_miss_no_busy_key(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_nats_snapshots_miss_no_busy_key() {
    let server = NatsServer::start();
    let s = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    snapshots_miss_no_busy_key(&s).await;
}

/// Pruning transition records in one request: every key under the prefix
/// but the newest `keep` goes, with nothing left of it (no marker, no
/// tombstone), and nothing outside the prefix is touched. On NATS the
/// server counts the scan marker's messages among those kept; SQLite
/// spares the marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_purge_prefix_keeping_keeps_the_newest() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = AnyStore::from(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
    let nats = open_retrying(&StoreUrl::parse(&server.url).unwrap()).await;
    for s in [&nats, &sqlite] {
        for i in 0..20 {
            s.put(&format!("history.p.n-{i:02}"), b"{}", T)
                .await
                .unwrap();
        }
        s.put("history.p.=scan", b"{}", T).await.unwrap();
        s.put("history.p.n-03", b"{}", T).await.unwrap(); // written again: among the newest
        s.put("history.q.n-00", b"{}", T).await.unwrap();
        let (purged, kept) = match s {
            AnyStore::Nats(n) => (n.purge_prefix_keeping("history.p.", 5, T).await.unwrap(), 4),
            AnyStore::Sqlite(q) => (
                q.purge_prefix_keeping("history.p.", 5, "history.p.=scan", T)
                    .await
                    .unwrap(),
                5,
            ),
            _ => unreachable!(),
        };
        let mut w = s.watch("history.", None, T).await.unwrap();
        let marker = s.put("history.zz", b"{}", T).await.unwrap();
        let state = latest(&events_until(&mut w, marker.revision).await);
        let mut left: Vec<&str> = state
            .keys()
            .map(String::as_str)
            .filter(|k| k.starts_with("history.p.n-"))
            .collect();
        left.sort_unstable();
        let mut want = vec![
            "history.p.n-03",
            "history.p.n-19",
            "history.p.n-18",
            "history.p.n-17",
            "history.p.n-16",
        ];
        want.truncate(kept);
        want.sort_unstable();
        assert_eq!(left, want, "{s:?}");
        assert!(state.contains_key("history.p.=scan"), "{s:?}");
        assert!(state.contains_key("history.q.n-00"), "{s:?}");
        assert!(purged >= 15, "{s:?}: {purged}");
    }
}
