//! Helpers shared by the integration tests.

pub mod nats_server;
