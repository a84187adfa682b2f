//! Helpers shared by the integration tests: the agent and hook-log helpers
//! (they run the `putex` binary cargo built for these tests), the store of
//! a test that runs on several ([`store::Backend`]), the nats-server and
//! etcd fixtures and the fault proxy from `putex-testkit`.

use std::time::{Duration, Instant};

use putex::locks::gateway::{AcquireError, AcquireRequest, Gateway};

pub mod agent;
pub mod store;
pub use putex_testkit::{etcd_server, nats_server, proxy};

/// The first ```` ```lang ```` block after the heading `section` of
/// `docs/<doc>`, as written there: what a test runs when it follows a
/// guide's steps.
pub fn doc_block(doc: &str, section: &str, lang: &str) -> String {
    let path = format!("{}/../../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let after = text
        .split(section)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/{doc} has no section {section:?}"));
    after
        .split(&format!("```{lang}\n"))
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("docs/{doc}, {section:?}: no {lang} block"))
        .to_owned()
}

/// One test per store for a check of a store fixture ([`store::Backend`],
/// or a test file's own fixture with the same constructors): each
/// `test: store` makes a test `test` that runs `check(&Fixture::store())`
/// on a server (or SQLite file) of its own. After `timing_slot;` each test
/// first waits for its turn among the timing-sensitive tests
/// ([`timing_slot`](agent::timing_slot)); after `async`, each is a
/// `#[tokio::test]` (two workers) of an async check.
///
/// ```ignore
/// on_stores!(timing_slot; Env, waiters_take_turns =>
///     waiters_take_turns_on_nats: nats,
///     waiters_take_turns_on_etcd: etcd,
/// );
/// ```
macro_rules! on_stores {
    (async $fixture:ident, $check:expr => $($test:ident: $store:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                ($check)(&$fixture::$store()).await;
            }
        )+
    };
    (timing_slot; $fixture:ident, $check:expr => $($test:ident: $store:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                // The store's server starts before the turn: starting
                // one measures nothing.
                let store = $fixture::$store();
                let _slot = $crate::common::agent::timing_slot();
                ($check)(&store);
            }
        )+
    };
    ($fixture:ident, $check:expr => $($test:ident: $store:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                ($check)(&$fixture::$store());
            }
        )+
    };
}
pub(crate) use on_stores;

/// `s` as a checked name (a lock, a resource, a uid); panics if it is none.
pub fn n(s: &str) -> putex::store::Name {
    s.parse().expect("a name")
}

/// A runtime (two workers) for a test or fuzz target that is not async.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A gateway request for `resource` (titled `test`).
pub fn acquire_request(resource: &str, wait_ms: u64, lifetime_ms: u64) -> AcquireRequest {
    AcquireRequest {
        resource: resource.parse().unwrap(),
        title: "test".into(),
        wait: Duration::from_millis(wait_ms),
        lifetime: Duration::from_millis(lifetime_ms),
    }
}

/// Takes the first use of `resource` out of the way: it waits W + G (S4),
/// also when the request gives up (the gateway finishes the takeover in
/// the background), so this asks again until a short lock is granted, and
/// releases it.
pub async fn warm(g: &Gateway, resource: &str) {
    let req = || acquire_request(resource, 100, 500);
    if let Ok(l) = g.acquire(req()).await {
        assert!(g.release(&n(resource), &n(&l.uid)).await.unwrap());
        return;
    }
    let started = Instant::now();
    loop {
        match g.acquire(req()).await {
            Ok(l) => {
                assert!(g.release(&n(resource), &n(&l.uid)).await.unwrap());
                return;
            }
            Err(AcquireError::Timeout) if started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}
