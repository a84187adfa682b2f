//! The integration tests of the putex crate: one binary, shared helpers.

mod store_contract;
mod supervision;
