//! # putex: the IO shell around [`putex_core`]
//!
//! This crate will hold the store backends, the driver that runs a core
//! machine against a store and a clock, the keeper, hook execution, the CLI
//! and the HTTP server. For now it re-exports the core so that the binary and
//! users have one crate to depend on.

pub use putex_core as core;
