//! The integration tests of the putex crate: one binary, shared helpers.

mod lease;
mod store_contract;
mod supervision;
