//! Helpers shared by the integration tests: the agent and hook-log helpers
//! here (they run the `putex` binary cargo built for these tests), the
//! nats-server and etcd fixtures and the fault proxy from `putex-testkit`.

pub mod agent;
pub use putex_testkit::{etcd_server, nats_server, proxy};

/// `s` as a checked name (a lock, a resource, a uid); panics if it is none.
pub fn n(s: &str) -> putex::store::Name {
    s.parse().expect("a name")
}
