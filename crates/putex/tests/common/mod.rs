//! Helpers shared by the integration tests.

pub mod agent;
pub mod nats_server;
pub mod proxy;
