//! Helpers shared by the integration tests: the agent and hook-log helpers
//! here (they run the `putex` binary cargo built for these tests), the
//! nats-server fixtures and the fault proxy from `putex-testkit`.

pub mod agent;
pub use putex_testkit::{nats_server, proxy};
