//! The integration tests of the putex crate: one binary, shared helpers.

mod agent_e2e;
mod agent_faults;
mod common;
mod id_pool;
mod lease;
mod lock;
mod store_auth;
mod store_contract;
mod supervision;
