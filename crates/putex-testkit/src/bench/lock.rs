//! What the lock benchmarks (`crates/putex/examples/lock_cost.rs`,
//! `lock_process.rs` and `lock_contention.rs`) share: the stores they
//! measure (a fresh single-node nats-server, the embedded SQLite store in
//! a temporary file), the lock names and their first use, untimed, before
//! anything is measured, the fast timing profile, bounded acquisitions,
//! and the start and end of their reports.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use putex::core::{TimingConfig, Token};
use putex::locks::lease::{Lease, LeaseOptions, Lock};
use putex::store::{AnyStore, SqliteStore, Store, StoreUrl};

use super::{Machine, Table};
use crate::nats_server::{nats_server_binary, NatsServer};
use crate::procfs::load_average;
use crate::watch_failures::WatchFailures;

/// The deadline of the raw store calls.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// How long one acquisition may take before the bench gives up.
pub const ACQUIRE_LIMIT: Duration = Duration::from_secs(60);
/// The lock the one-shot lease measurements (and the contention) use.
pub const LOCK: &str = "bench";
/// The lock the standing [`Lock`] measurements use with the fast profile.
pub const LOCK_FAST: &str = "bench-lock-fast";
/// The lock the standing [`Lock`] measurements use with the default timing.
pub const LOCK_DEFAULT: &str = "bench-lock-default";

/// The fast profile: R = 100 ms, F = 3, C = 1.
pub fn fast() -> TimingConfig {
    TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
}

/// Reads the machine and prints it, with the nats-server binary the bench
/// starts (`servers` says how: "a fresh single-node server", …).
pub fn preamble(servers: &str) -> Machine {
    let nats_bin = nats_server_binary();
    let machine = Machine::read(&nats_bin);
    println!("{}", machine.describe());
    println!(
        "nats-server: {} ({}), {servers}",
        nats_bin.display(),
        machine.nats_version
    );
    machine
}

/// Prints the summary line and the table of a bench that started at
/// `started`.
pub fn print_summary(machine: &Machine, started: Instant, table: &Table) {
    println!(
        "== summary ({}, {} at the end; nats-server {}, single node, default fsync; total bench time {:.0} s) ==",
        machine.describe(),
        load_average(),
        machine.nats_version,
        started.elapsed().as_secs_f64()
    );
    table.print();
}

/// The store on `server`; exits with status 1 when it cannot be opened.
pub async fn open_nats(server: &NatsServer) -> AnyStore {
    AnyStore::open(&StoreUrl::parse(&server.url).expect("nats url"))
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot open the NATS store at {}: {e}", server.url);
            std::process::exit(1)
        })
}

/// The embedded SQLite store in the file `path`.
pub async fn open_sqlite(path: PathBuf) -> AnyStore {
    SqliteStore::open(path).await.expect("sqlite store").into()
}

/// Uses the lock names once, untimed: the first use of a name waits W + G
/// (S4).
pub async fn first_use(label: &str, store: &AnyStore) {
    let t = Instant::now();
    for name in [LOCK, LOCK_FAST, LOCK_DEFAULT] {
        let lease = acquire(store, name, "bench-node", fast()).await;
        assert!(lease.release().await.expect("release"), "released");
    }
    println!(
        "{label}: first use of locks {LOCK:?}, {LOCK_FAST:?}, {LOCK_DEFAULT:?} (the S4 waits, \
         excluded from the figures): {:.2} s",
        t.elapsed().as_secs_f64()
    );
}

/// A one-shot [`Lease`] on `name`; panics when it is not held within
/// [`ACQUIRE_LIMIT`].
pub async fn acquire(store: &AnyStore, name: &str, node: &str, timing: TimingConfig) -> Lease {
    match tokio::time::timeout(
        ACQUIRE_LIMIT,
        Lease::acquire(
            store.clone(),
            LeaseOptions::new(name, node, timing).unwrap(),
        ),
    )
    .await
    {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => panic!("acquire {name}: {e}"),
        Err(_) => panic!("acquire {name}: not held within {ACQUIRE_LIMIT:?}"),
    }
}

/// Takes a standing [`Lock`]; panics when it is not held within
/// [`ACQUIRE_LIMIT`].
pub async fn lock_acquire(lock: &mut Lock) -> Token {
    match tokio::time::timeout(ACQUIRE_LIMIT, lock.acquire()).await {
        Ok(Ok(token)) => token,
        Ok(Err(e)) => panic!("lock acquire: {e}"),
        Err(_) => panic!("lock acquire: not held within {ACQUIRE_LIMIT:?}"),
    }
}

/// Prints the watches that failed since `since` and, on NATS, the consumers
/// left on the bucket's stream.
pub async fn report_watches(store: &AnyStore, failures: &WatchFailures, since: usize) {
    let failed = failures.count() - since;
    let consumers = consumers(store).await;
    if failed > 0 || consumers.is_some() {
        println!(
            "watches that failed to start: {failed}{}",
            consumers
                .map(|n| format!(
                    "; consumers on the bucket's stream now: {n} (each watch is one, deleted \
                     when it ends; the server allows 1000 per stream)"
                ))
                .unwrap_or_default()
        );
    }
}

/// The store's current revision: a `put` of a scratch key.
pub async fn revision(store: &AnyStore) -> u64 {
    store
        .put("bench.mark", b"{\"v\":1}", DEADLINE)
        .await
        .expect("put")
        .revision
}

/// NATS only: how many consumers the bucket's stream has (each live watch
/// is one).
pub async fn consumers(store: &AnyStore) -> Option<u64> {
    let AnyStore::Nats(s) = store else {
        return None;
    };
    let subject = format!("$JS.API.STREAM.INFO.KV_{}", s.bucket_name());
    let reply = s.client().request(subject, "".into()).await.ok()?;
    serde_json::from_slice::<serde_json::Value>(&reply.payload)
        .ok()?
        .pointer("/state/consumer_count")?
        .as_u64()
}
