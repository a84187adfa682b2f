//! The lease library against real store backends (memory and SQLite): the
//! core's rules driven by the driver, end to end, with fast timing.

use std::time::{Duration, Instant};

use putex::core::{LockRecord, LockState, Observed, TimingConfig};
use putex::lease::{Lease, LeaseOptions, Lost};
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
        LeaseOptions::new("handover", "node-a", fast()),
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
        LeaseOptions::new("handover", "node-b", fast()),
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
    let key = keys::lock("handover").unwrap();
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
        .unwrap();
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

#[tokio::test]
async fn a_lease_survives_a_renewal_whose_outcome_was_unknown() {
    let memory = MemoryStore::new();
    let store = AnyStore::from(memory.clone());
    let mut lease = Lease::acquire(store, LeaseOptions::new("flaky", "node-a", fast()))
        .await
        .unwrap();
    // A renewal lands but its reply is lost (H4): adopted, not a loss.
    memory.inject(putex::store::memory::Fault::ApplyThenStall);
    let lost = tokio::time::timeout(Duration::from_millis(1500), lease.lost()).await;
    assert!(lost.is_err(), "the lease was lost: {lost:?}");
    assert!(lease.is_held());
}
