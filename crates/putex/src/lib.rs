//! # putex: the IO shell around [`putex_core`]
//!
//! `putex-core` decides; this crate acts. It holds:
//!
//! | module | what it is for |
//! |---|---|
//! | [`store`] | the store contract and its backends: NATS JetStream KV, embedded SQLite, memory |
//! | [`clock`] | reading `CLOCK_BOOTTIME`, the clock every licence runs on |
//! | [`process`] | process-tree control: cgroup v2 scopes, or a child subreaper |
//! | [`hooks`] | running hooks (`/bin/sh -c`) with their environment and timeouts |
//! | [`keeper`] | the dead-man's switch that owns the service and its deadline |
//! | [`driver`] | runs any core machine against a store, the clock and a [`driver::Host`] |
//! | [`lease`] | a named lease for Rust programs: acquire, hold (renewed), learn it was lost, release |
//! | [`cli`] | the command line: flags → validated settings → `run`, `check`, `status`, `demo` |
//!
//! The HTTP server follows.

pub use putex_core as core;

/// The README's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub mod cli;
pub mod clock;
pub mod driver;
pub mod hooks;
pub mod keeper;
pub mod lease;
pub mod process;
pub mod store;
