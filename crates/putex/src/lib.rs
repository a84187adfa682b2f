//! # putex: the IO shell around [`putex_core`]
//!
//! `putex-core` decides; this crate acts. Its folders name the concepts
//! (see `docs/architecture.md` for the picture):
//!
//! | module | what it is for |
//! |---|---|
//! | [`agent`] | the failover agent (`putex run`) as a library: [`agent::run`] |
//! | [`store`] | the store contract and its backends: NATS JetStream KV, embedded SQLite, memory |
//! | [`driver`] | runs any core machine against a store, the clock and a [`driver::Host`] |
//! | [`failsafe`] | failsafe (`docs/failsafe-design.md`, not wired in yet): the shared key and signed asks and grants between agents (F5) |
//! | [`locks`] | locks for programs and scripts: leases and [`Lock`], critical sections, fair queues, identity pools, the HTTP lock gateway |
//! | `supervision` | the keeper (the dead-man's switch that owns the service), process trees, hooks, systemd: internal, public only for the binary (the keeper) and the integration tests |
//! | [`observe`] | metrics, transition history, the JSON spelling of tokens and record states |
//! | [`report`] | what operators read: status queries (holders, members, waiters, semaphores, pools), member records, the web status page |
//! | [`http`] | HTTP servers: `putex serve` (RDLM, `/v1/`, auth, TLS, OpenAPI) and the agent's endpoints |
//! | `host_state` | what a host remembers of a lock between processes (S5, S6): one file per record, shared by agents and sections |
//! | [`identity`] | who and where this process is: host name, machine, boot and instance ids |
//! | [`shutdown`] | a graceful request, then an abort: signals as cancellation tokens |
//! | [`clock`] | reading `CLOCK_BOOTTIME`, the clock every licence runs on |
//! | `cli` | the command line: flags → validated settings → `run`, `lock`, `id`, `serve`, `status`, …: the binary's, not a library API |

pub use putex_core as core;

/// The README's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub mod agent;
/// The `putex` binary's command line: public for the binary and the
/// integration tests, not a library API.
#[doc(hidden)]
pub mod cli;
pub mod clock;
pub mod driver;
pub mod failsafe;
mod host_state;
pub mod http;
pub mod identity;
pub mod locks;
pub mod observe;
pub mod report;
pub mod shutdown;
pub mod store;
/// The keeper, process trees, hooks and systemd: the machinery behind
/// [`agent::run`] and critical sections, public for the putex binary (which
/// runs the keeper) and the integration tests, not a library API.
#[doc(hidden)]
pub mod supervision;

pub use locks::lease::{Lease, LeaseOptions, Lock};
