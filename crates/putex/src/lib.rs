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
//! | [`queue`] | fair queues: waiters take their turn in arrival order; dead waiters expire |
//! | [`section`] | critical sections (`putex lock`): a command run under a lock or semaphore slot, stopped before the lock passes on |
//! | [`gateway`] | the lock gateway behind `putex serve`: locks for HTTP clients, held in the store |
//! | [`idpool`] | identity pools (`putex id`): unique ids from a range, claimed atomically, never duplicated |
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
pub mod gateway;
pub mod hooks;
pub mod idpool;
pub mod keeper;
pub mod lease;
pub mod process;
pub mod queue;
pub mod section;
pub mod store;
