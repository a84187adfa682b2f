//! The lease library against real store backends (memory and SQLite): the
//! core's rules driven by the driver, end to end, with fast timing. `Lease`
//! is one tenure; `Lock` takes and gives back the same lock again and again.

use std::time::{Duration, Instant};

use putex::core::{LockRecord, LockState, Observed, TimingConfig};
use putex::locks::guard::{self, GuardError};
use putex::locks::lease::{Lease, LeaseError, LeaseOptions, Lock, LossSignal, Lost};
use putex::store::{keys, AnyStore, MemoryStore, ReadMode, SqliteStore, Store};

/// R = 100 ms, T = 300 ms, G = 100 ms, ε = 1 %: W ≈ 306 ms.
fn fast() -> TimingConfig {
    TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
}

async fn handover(store: AnyStore) {
    let started = Instant::now();
    let a = Lease::acquire(
        store.clone(),
        LeaseOptions::new("handover", "node-a", fast()).unwrap(),
    )
    .await
    .expect("first use acquires");
    // S4: first use of a name waits W + G ≈ 0.41 s.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let first = a.token();
    assert!(a.is_held());

    // A second node waits while the first renews...
    let b = tokio::spawn(Lease::acquire(
        store.clone(),
        LeaseOptions::new("handover", "node-b", fast()).unwrap(),
    ));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !b.is_finished(),
        "node-b acquired a lease that node-a renews"
    );
    assert!(a.is_held());

    // ...and takes over within round trips once it is released (S3).
    let released_at = Instant::now();
    assert!(
        a.release().await.unwrap(),
        "a graceful release writes a released record"
    );
    let mut b = b.await.unwrap().expect("node-b acquires after the release");
    assert!(
        released_at.elapsed() < Duration::from_millis(300),
        "{:?}",
        released_at.elapsed()
    );
    assert!(
        b.token() > first,
        "fencing tokens increase: {} then {}",
        first,
        b.token()
    );

    // Revocation (S7): the holder learns it lost the lease.
    revoke(&store, "handover").await;
    let lost = tokio::time::timeout(Duration::from_secs(2), b.lost())
        .await
        .expect("the revocation is noticed within a renewal or two");
    assert!(matches!(lost, Lost::TakenOver(_)), "{lost:?}");
    assert!(!b.is_held());
}

#[tokio::test]
async fn lease_handover_on_the_memory_store() {
    handover(AnyStore::from(MemoryStore::new())).await;
}

#[tokio::test]
async fn lease_handover_on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"))
        .await
        .unwrap();
    handover(AnyStore::from(store)).await;
}

/// A program holding two locks passes each its own series, labelled by
/// lock, in the registry it serves: the store calls of one are not counted
/// for the other.
#[tokio::test]
async fn two_locks_record_their_store_calls_in_series_of_their_own() {
    use putex::observe::metrics::{encode, Metrics, Registry};
    let store = AnyStore::from(MemoryStore::new());
    let mut registry = Registry::with_prefix("putex");
    let mut options = |name: &str| {
        let metrics = Metrics::register(
            registry.sub_registry_with_label(("lock".into(), name.to_owned().into())),
        );
        LeaseOptions::new(name, "node-a", fast())
            .unwrap()
            .with_metrics(metrics)
    };
    let (a, b) = (options("a"), options("b"));
    let a = Lease::acquire(store.clone(), a).await.unwrap();
    let mut b = Lock::new(store.clone(), b).unwrap();
    let text = encode(&registry);
    let count = |lock: &str, op: &str| {
        let series = format!(
            "putex_store_call_duration_seconds_count{{lock=\"{lock}\",op=\"{op}\",outcome=\"ok\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    assert!(count("a", "create") == 1, "{text}");
    assert_eq!(count("b", "create"), 0, "{text}");
    assert!(text.contains("putex_held{lock=\"a\"} 1"), "{text}");
    b.acquire().await.unwrap();
    let text = encode(&registry);
    assert!(text.contains("putex_held{lock=\"b\"} 1"), "{text}");
    a.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_survives_a_renewal_whose_outcome_was_unknown() {
    let memory = MemoryStore::new();
    let store = AnyStore::from(memory.clone());
    let mut lease = Lease::acquire(store, LeaseOptions::new("flaky", "node-a", fast()).unwrap())
        .await
        .unwrap();
    // A renewal lands but its reply is lost (H4): adopted, not a loss.
    memory.inject(putex::store::memory::Fault::ApplyThenStall);
    let lost = tokio::time::timeout(Duration::from_millis(1500), lease.lost()).await;
    assert!(lost.is_err(), "the lease was lost: {lost:?}");
    assert!(lease.is_held());
}

/// The record of lock `name` as the store has it now.
async fn record(store: &AnyStore, name: &str) -> LockRecord {
    let entry = store
        .get(
            &keys::lock(&name.parse().unwrap()),
            ReadMode::Leader,
            Duration::from_secs(1),
        )
        .await
        .unwrap()
        .expect("the record exists");
    match Observed::decode(&entry.value) {
        Observed::Record(r) => r,
        Observed::Garbage => panic!("not a putex record"),
    }
}

/// An administrator's revocation of lock `name` (S7): `revoked`, keeping
/// the holder's identity and timing. Returns the revoked record's token.
async fn revoke(store: &AnyStore, name: &str) -> putex::core::Token {
    let key = keys::lock(&name.parse().unwrap());
    let entry = store
        .get(&key, ReadMode::Leader, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the record exists");
    let Observed::Record(record) = Observed::decode(&entry.value) else {
        panic!("a putex record")
    };
    let revoked = LockRecord {
        state: LockState::Revoked,
        write: "admin-1".into(),
        ..record
    };
    store
        .update(&key, &revoked.encode(), entry.token, Duration::from_secs(1))
        .await
        .unwrap()
}

async fn lock_taken_again_and_again(store: AnyStore) {
    let mut a = Lock::new(
        store.clone(),
        LeaseOptions::new("again", "node-a", fast()).unwrap(),
    )
    .unwrap();
    let mut b = Lock::new(
        store.clone(),
        LeaseOptions::new("again", "node-b", fast()).unwrap(),
    )
    .unwrap();
    assert!(!a.is_held());
    assert!(!a.release().await.unwrap(), "nothing to release yet");
    let mut last = a.acquire().await.expect("first use");
    assert_eq!(
        a.acquire().await.unwrap(),
        last,
        "acquire while held is a no-op"
    );
    assert!(a.release().await.unwrap());
    assert!(!a.is_held());
    assert_eq!(a.lost().await, Lost::Released);

    // Over its own release a lock is taken again at once, many times.
    let started = Instant::now();
    for _ in 0..20 {
        let token = a.acquire().await.unwrap();
        assert!(token > last, "tokens increase: {last} then {token}");
        last = token;
        assert!(a.release().await.unwrap());
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "20 tenures took {:?}",
        started.elapsed()
    );

    // Between tenures a lock stands by: the other node gets the lock...
    let token = b.acquire().await.unwrap();
    assert!(token > last);
    last = token;
    // ...and a waits while b holds it, then takes it over b's release.
    let waiting = tokio::spawn(async move {
        let token = a.acquire().await.unwrap();
        (a, token)
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "node-a took a lock node-b holds");
    assert!(b.release().await.unwrap());
    let (a, token) = tokio::time::timeout(Duration::from_millis(500), waiting)
        .await
        .expect("taken within round trips of the release")
        .unwrap();
    assert!(token > last);
    assert!(a.close().await.unwrap(), "close releases a held lock");
    assert_eq!(record(&store, "again").await.state, LockState::Released);
    assert!(!b.close().await.unwrap(), "nothing to release");
}

#[tokio::test]
async fn lock_taken_again_and_again_on_the_memory_store() {
    lock_taken_again_and_again(AnyStore::from(MemoryStore::new())).await;
}

#[tokio::test]
async fn lock_taken_again_and_again_on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"))
        .await
        .unwrap();
    lock_taken_again_and_again(AnyStore::from(store)).await;
}

#[tokio::test]
async fn a_lost_lock_is_not_taken_again_behind_the_programs_back() {
    let store = AnyStore::from(MemoryStore::new());
    let mut a = Lock::new(
        store.clone(),
        LeaseOptions::new("revoked", "node-a", fast()).unwrap(),
    )
    .unwrap();
    a.acquire().await.unwrap();
    // An administrator revokes it (S7).
    let revoked_at = revoke(&store, "revoked").await;
    let lost = tokio::time::timeout(Duration::from_secs(2), a.lost())
        .await
        .expect("noticed within a renewal or two");
    assert!(matches!(lost, Lost::TakenOver(_)), "{lost:?}");
    // Well past W: the revoked record went stale, but nobody asked for it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!a.is_held());
    assert_eq!(record(&store, "revoked").await.state, LockState::Revoked);
    // Asked again, it is taken (after W: a revoked record is stale to takers).
    let token = tokio::time::timeout(Duration::from_secs(3), a.acquire())
        .await
        .expect("acquired")
        .unwrap();
    assert!(token > revoked_at);
}

#[tokio::test]
async fn a_cancelled_acquisition_leaves_nothing_held() {
    let store = AnyStore::from(MemoryStore::new());
    let mut a = Lock::new(
        store.clone(),
        LeaseOptions::new("cancel", "node-a", fast()).unwrap(),
    )
    .unwrap();
    let mut b = Lock::new(
        store.clone(),
        LeaseOptions::new("cancel", "node-b", fast()).unwrap(),
    )
    .unwrap();
    a.acquire().await.unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), b.acquire()).await;
    assert!(gave_up.is_err(), "node-b acquired a held lock");
    assert!(a.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_held());
    let r = record(&store, "cancel").await;
    assert_eq!((r.state, r.node.as_str()), (LockState::Released, "node-a"));
    // A cancelled acquisition that got as far as holding gives it back.
    {
        let mut acquiring = Box::pin(b.acquire());
        assert!(futures::poll!(&mut acquiring).is_pending());
        let deadline = Instant::now() + Duration::from_secs(2);
        while record(&store, "cancel").await.node != "node-b" {
            assert!(Instant::now() < deadline, "node-b never took the lock");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_held());
    let r = record(&store, "cancel").await;
    assert_eq!((r.state, r.node.as_str()), (LockState::Released, "node-b"));
    assert!(a.acquire().await.is_ok());
}

#[tokio::test]
async fn a_dropped_lease_is_given_back_in_the_background() {
    let store = AnyStore::from(MemoryStore::new());
    let lease = Lease::acquire(
        store.clone(),
        LeaseOptions::new("dropped", "node-a", fast()).unwrap(),
    )
    .await
    .unwrap();
    let token = lease.token();
    drop(lease);
    // Released within round trips, not gone stale after W (≈ 0.3 s).
    let started = Instant::now();
    loop {
        let r = record(&store, "dropped").await;
        if r.state == LockState::Released {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "still {:?} after {:?}",
            r.state,
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next = Lease::acquire(
        store,
        LeaseOptions::new("dropped", "node-b", fast()).unwrap(),
    )
    .await
    .unwrap();
    assert!(next.token() > token);
}

#[tokio::test]
async fn a_lock_whose_node_id_runs_elsewhere_says_so_instead_of_waiting() {
    // S5: a record with our node id from another machine, renewed, means
    // two hosts share the node id: the agent exits, and acquire says why.
    let store = AnyStore::from(MemoryStore::new());
    let key = keys::lock(&"dup".parse().unwrap());
    let other = |write: &str| LockRecord {
        v: 1,
        node: "node-a".into(),
        machine: "another-machine".into(),
        instance: "elsewhere".into(),
        state: LockState::Active,
        write: write.into(),
        lease_ms: 300,
        gap_ms: 100,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    };
    let mut at = store
        .put(&key, &other("w1").encode(), Duration::from_secs(1))
        .await
        .unwrap();
    let mut lock = Lock::new(
        store.clone(),
        LeaseOptions::new("dup", "node-a", fast()).unwrap(),
    )
    .unwrap();
    let acquiring = tokio::spawn(async move { lock.acquire().await });
    for w in ["w2", "w3", "w4"] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        at = store
            .update(&key, &other(w).encode(), at, Duration::from_secs(1))
            .await
            .unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(2), acquiring)
        .await
        .expect("acquire returns instead of waiting forever")
        .unwrap();
    assert!(
        matches!(
            got,
            Err(putex::locks::lease::LeaseError::Exited(
                putex::core::ExitReason::DuplicateNode { .. }
            ))
        ),
        "{got:?}"
    );
}

/// H1 seen from the program: `is_held()` and `token()` compare the licence
/// end with the clock at the call. On a current-thread runtime that is
/// busy (here: blocked outright) the agent task cannot renew, nor mark the
/// lock lost; the answer must not be "held" past the licence all the same.
#[test]
fn r14_a_busy_runtime_never_reports_a_lock_held_past_its_licence() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = AnyStore::from(MemoryStore::new());
        let mut lock =
            Lock::new(store, LeaseOptions::new("busy", "node-a", fast()).unwrap()).unwrap();
        let token = lock.acquire().await.unwrap();
        assert_eq!(lock.token(), Some(token));
        assert!(lock.is_held());
        // The program hogs the only thread for longer than T (300 ms).
        std::thread::sleep(Duration::from_millis(400));
        assert!(!lock.is_held(), "held past the licence on a busy runtime");
        assert_eq!(lock.token(), None);
        // And `lost()` says so at once, before the agent has caught up.
        let lost = tokio::time::timeout(Duration::from_millis(5), lock.lost())
            .await
            .expect("lost() completes at once once the licence has ended");
        assert_eq!(lost, Lost::LicenceEnded);
    });
}

// ---------------------------------------------------------------------------
// Guarded writes (`docs/locks.md`, "Guarded writes").

/// While held, every guarded write lands — renewals racing them are unseen
/// by the caller; once the record moved (a revocation here, a takeover
/// alike) the store refuses it and the caller hears `NotHeld`; a new
/// tenure of the same node does not revive an old tenure's guard.
async fn guarded_writes(store: AnyStore) {
    let lease = Lease::acquire(
        store.clone(),
        LeaseOptions::new("guarded", "node-a", fast()).unwrap(),
    )
    .await
    .unwrap();
    let writes = lease.guard();
    assert_eq!(writes.token(), lease.token());
    // About ten renewals land among these writes.
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_secs(1) {
        writes
            .put("guarded.counter", n.to_string().as_bytes())
            .await
            .expect("held: every guarded write lands");
        n += 1;
        // The memory store answers without yielding: let the renewals run.
        tokio::task::yield_now().await;
    }
    let counter = || async { guard::get(&store, "guarded.counter").await.unwrap() };
    assert_eq!(counter().await, Some((n - 1).to_string().into_bytes()));
    writes
        .delete("guarded.gone")
        .await
        .expect("an absent key deletes");

    // The record moves on: the same writes are refused, nothing is written.
    revoke(&store, "guarded").await;
    let late = writes.put("guarded.counter", b"late").await;
    assert!(matches!(late, Err(GuardError::NotHeld)), "{late:?}");
    assert_eq!(counter().await, Some((n - 1).to_string().into_bytes()));
    drop(lease);

    // A lock released and taken again by the same node: a new tenure.
    let mut lock = Lock::new(
        store.clone(),
        LeaseOptions::new("guarded-again", "node-a", fast()).unwrap(),
    )
    .unwrap();
    assert!(lock.guard().is_none(), "not held: no guard");
    lock.acquire().await.unwrap();
    let old = lock.guard().unwrap();
    old.put("again", b"1").await.unwrap();
    assert!(lock.release().await.unwrap());
    let after_release = old.put("again", b"released").await;
    assert!(
        matches!(after_release, Err(GuardError::NotHeld)),
        "{after_release:?}"
    );
    lock.acquire().await.unwrap();
    let stale = old.put("again", b"old tenure").await;
    assert!(matches!(stale, Err(GuardError::NotHeld)), "{stale:?}");
    lock.guard().unwrap().put("again", b"2").await.unwrap();
    assert_eq!(
        guard::get(&store, "again").await.unwrap(),
        Some(b"2".to_vec())
    );
    // A key the store cannot take is refused by name.
    let bad = lock.guard().unwrap().put("no spaces", b"x").await;
    assert!(
        matches!(&bad, Err(GuardError::Invalid(e)) if e.to_string().contains("kv.no spaces")),
        "{bad:?}"
    );
    assert!(lock.close().await.unwrap());
}

#[tokio::test]
async fn guarded_writes_on_the_memory_store() {
    guarded_writes(AnyStore::from(MemoryStore::new())).await;
}

#[tokio::test]
async fn guarded_writes_on_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"))
        .await
        .unwrap();
    guarded_writes(AnyStore::from(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_on_nats() {
    let server = crate::common::nats_server::NatsServer::start();
    let url = putex::store::StoreUrl::parse(&server.url).unwrap();
    guarded_writes(AnyStore::open(&url).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_on_etcd() {
    let server = crate::common::etcd_server::EtcdServer::start();
    let url = putex::store::StoreUrl::parse(&format!("etcd://{}", server.endpoint())).unwrap();
    guarded_writes(AnyStore::open(&url).await.unwrap()).await;
}

/// The holder's store traffic is held back in the network (a fault proxy in
/// `Hold`), as for a holder frozen or cut off mid-write: its guarded write
/// and a plain write are sent while it holds the lock, its renewals stall
/// behind them, another holder takes over and writes — and when the held
/// traffic finally arrives, the store refuses the guarded write while the
/// plain one lands over the new holder's value.
async fn a_held_back_guarded_write_is_refused_by_the_store(direct: &str, target: &str) {
    use crate::common::proxy::{Mode, Proxy};
    let proxy = Proxy::start(target.parse().unwrap()).await.unwrap();
    let (scheme, _) = direct.split_once("://").unwrap();
    let via = putex::store::StoreUrl::parse(&format!("{scheme}://{}", proxy.addr())).unwrap();
    let direct = AnyStore::open(&putex::store::StoreUrl::parse(direct).unwrap())
        .await
        .unwrap();
    let held_back = AnyStore::open(&via).await.unwrap();
    let a = Lease::acquire(
        held_back.clone(),
        LeaseOptions::new("held-back", "node-a", fast()).unwrap(),
    )
    .await
    .unwrap();
    let writes = a.guard();
    writes.put("held-back", b"a").await.unwrap();

    proxy.set(Mode::Hold);
    let guarded = tokio::spawn(async move { writes.put("held-back", b"a, late").await });
    let plain = {
        let store = held_back.clone();
        tokio::spawn(async move {
            store
                .put("kv.held-back-plain", b"a, late", Duration::from_secs(30))
                .await
        })
    };
    // Node b takes over once a's record is stale, and writes.
    let b = tokio::time::timeout(
        Duration::from_secs(10),
        Lease::acquire(
            direct.clone(),
            LeaseOptions::new("held-back", "node-b", fast()).unwrap(),
        ),
    )
    .await
    .expect("b takes over a holder that stopped renewing")
    .unwrap();
    b.guard().put("held-back", b"b").await.unwrap();
    direct
        .put("kv.held-back-plain", b"b", Duration::from_secs(5))
        .await
        .unwrap();

    // The held traffic arrives, after b's writes.
    proxy.set(Mode::Pass);
    let refused = guarded.await.unwrap();
    assert!(
        matches!(refused, Err(GuardError::NotHeld | GuardError::Unknown(_))),
        "{refused:?}"
    );
    plain.await.unwrap().expect("the plain write lands late");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        guard::get(&direct, "held-back").await.unwrap(),
        Some(b"b".to_vec()),
        "the store refused the guarded write of the deposed holder"
    );
    assert_eq!(
        guard::get(&direct, "held-back-plain").await.unwrap(),
        Some(b"a, late".to_vec()),
        "the plain write of the deposed holder landed over b's"
    );
    let writes = b.guard();
    writes.put("held-back", b"b again").await.unwrap();
    drop(a);
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_guarded_write_is_refused_by_the_store_on_nats() {
    let server = crate::common::nats_server::NatsServer::start();
    let target = server.url.trim_start_matches("nats://").to_owned();
    a_held_back_guarded_write_is_refused_by_the_store(&server.url, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_guarded_write_is_refused_by_the_store_on_etcd() {
    let server = crate::common::etcd_server::EtcdServer::start();
    let direct = format!("etcd://{}", server.endpoint());
    a_held_back_guarded_write_is_refused_by_the_store(&direct, &server.endpoint()).await;
}

/// Every public guard type is `Send + Sync + Unpin` (checked at compile
/// time) and says what it is in `Debug`.
#[tokio::test]
async fn guards_are_send_sync_unpin_and_say_what_they_are() {
    fn assert_bounds<T: Send + Sync + Unpin + std::fmt::Debug>() {}
    assert_bounds::<Lease>();
    assert_bounds::<Lock>();
    assert_bounds::<LossSignal>();
    assert_bounds::<LeaseError>();
    fn assert_send_sync<T: Send + Sync + Unpin>() {}
    assert_send_sync::<putex::locks::guard::Guard>();

    let store = AnyStore::from(MemoryStore::new());
    let lease = Lease::acquire(store, LeaseOptions::new("shown", "node-a", fast()).unwrap())
        .await
        .unwrap();
    let shown = format!("{lease:?}");
    assert!(
        shown.contains("\"shown\"")
            && shown.contains(&lease.token().to_string())
            && shown.contains("held: true"),
        "{shown}"
    );
    let signal = format!("{:?}", lease.loss_signal());
    assert!(signal.contains("lost: false"), "{signal}");
    lease.release().await.unwrap();
}

/// The loss reaches every task that holds a clone of the signal (and its
/// cancellation token) — and not before: while the lease is held nothing
/// completes. A signal stays with its tenure: the lock taken again does
/// not revive it.
#[tokio::test]
async fn a_loss_signal_reaches_every_task_and_stays_with_its_tenure() {
    let store = AnyStore::from(MemoryStore::new());
    let mut lock = Lock::new(
        store.clone(),
        LeaseOptions::new("signalled", "node-a", fast()).unwrap(),
    )
    .unwrap();
    assert!(
        lock.loss_signal().is_none(),
        "nothing held, nothing to lose"
    );
    lock.acquire().await.unwrap();
    let signal = lock.loss_signal().expect("held");
    let cancel = signal.cancellation();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let s = signal.clone();
            tokio::spawn(async move { s.lost().await })
        })
        .collect();
    // Held, and renewed past several licences: nothing completes.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(tasks.iter().all(|t| !t.is_finished()));
    assert!(!cancel.is_cancelled() && !signal.is_lost());

    revoke(&store, "signalled").await;
    for t in tasks {
        let lost = tokio::time::timeout(Duration::from_secs(2), t)
            .await
            .expect("every task hears of the loss")
            .unwrap();
        assert!(matches!(lost, Lost::TakenOver(_)), "{lost:?}");
    }
    tokio::time::timeout(Duration::from_secs(1), cancel.cancelled())
        .await
        .expect("the cancellation token is cancelled");
    assert!(signal.is_lost());

    // Taken again (after W: a revoked record is stale to takers): a new
    // tenure with a signal of its own; the old one stays lost.
    let token = tokio::time::timeout(Duration::from_secs(3), lock.acquire())
        .await
        .expect("acquired")
        .unwrap();
    assert!(token > signal.token());
    assert!(signal.is_lost());
    assert!(matches!(signal.lost().await, Lost::TakenOver(_)));
    assert!(!lock.loss_signal().unwrap().is_lost());
    lock.close().await.unwrap();
}

/// `try_acquire` returns at once naming the holder while one holds the
/// lock, and takes a free lock within round trips; `acquire_timeout`
/// gives up after its wait holding nothing; `check` says when a lease is
/// lost, and how.
#[tokio::test]
async fn try_acquire_timeouts_and_checks_are_errors_to_match() {
    let store = AnyStore::from(MemoryStore::new());
    let opts = |node: &str| LeaseOptions::new("contended", node, fast()).unwrap();
    let a = Lease::acquire(store.clone(), opts("node-a")).await.unwrap();

    let asked = Instant::now();
    match Lease::try_acquire(store.clone(), opts("node-b")).await {
        Err(LeaseError::Held {
            holder,
            state,
            token,
            ..
        }) => {
            assert_eq!(holder, "node-a");
            // The record a holder writes as it takes the lock says
            // `confirming`; its renewals after the activation say `active`.
            assert!(
                matches!(state, Some(LockState::Active | LockState::Confirming)),
                "{state:?}"
            );
            assert!(token >= a.token());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );

    let asked = Instant::now();
    let e = Lease::acquire_timeout(store.clone(), opts("node-b"), Duration::from_millis(400))
        .await
        .unwrap_err();
    assert!(
        matches!(e, LeaseError::TimedOut { waited, .. } if waited == Duration::from_millis(400)),
        "{e:?}"
    );
    assert!(e.to_string().contains("not acquired within 400 ms"), "{e}");
    assert!(asked.elapsed() < Duration::from_secs(1));
    assert!(a.is_held());
    assert_eq!(record(&store, "contended").await.node, "node-a");
    assert_eq!(a.check().unwrap(), a.token());

    // Released: try_acquire takes it at once (S3: one CAS over `released`).
    let a_token = a.token();
    assert!(a.release().await.unwrap());
    let asked = Instant::now();
    let b = Lease::try_acquire(store.clone(), opts("node-b"))
        .await
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert!(b.token() > a_token);

    // Revoked: check says lost, and how.
    revoke(&store, "contended").await;
    let lost = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            if let Err(e) = b.check() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert!(
        matches!(lost, LeaseError::Lost(Lost::TakenOver(_))),
        "{lost:?}"
    );
}

/// A store that stopped answering: `try_acquire` says so, typed, within
/// its store call's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_store_gone_silent_is_unavailable() {
    let mut server = crate::common::nats_server::NatsServer::start();
    let url = putex::store::StoreUrl::parse(&server.url).unwrap();
    let store = AnyStore::open(&url).await.unwrap();
    server.kill();
    let asked = Instant::now();
    let e = Lease::try_acquire(store, LeaseOptions::new("away", "node-a", fast()).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, LeaseError::Unavailable(_)), "{e:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
}
