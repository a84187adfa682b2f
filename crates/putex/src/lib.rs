//! # putex: the IO shell around [`putex_core`]
//!
//! `putex-core` decides; this crate acts. It holds:
//!
//! | module | what it is for |
//! |---|---|
//! | [`agent_http`] | the agent's `/primary`, `/replica`, `/health`, `/liveness`, `/readiness` and `/metrics` |
//! | [`store`] | the store contract and its backends: NATS JetStream KV, embedded SQLite, memory |
//! | [`clock`] | reading `CLOCK_BOOTTIME`, the clock every licence runs on |
//! | [`process`] | process-tree control: cgroup v2 scopes, or a child subreaper |
//! | [`hooks`] | running hooks (`/bin/sh -c`) with their environment and timeouts |
//! | [`keeper`] | the dead-man's switch that owns the service and its deadline |
//! | [`driver`] | runs any core machine against a store, the clock and a [`driver::Host`] |
//! | [`lease`] | named leases for Rust programs: [`lease::Lease`] (one tenure) and [`lease::Lock`] (taken and given back again and again, one CAS each) |
//! | [`metrics`] | `putex_`-prefixed metrics in OpenMetrics format, one set per process |
//! | [`queue`] | fair queues: waiters take their turn in arrival order; dead waiters expire |
//! | [`section`] | critical sections (`putex lock`): a command run under a lock or semaphore slot, stopped before the lock passes on |
//! | [`history`] | transition records: who held a lock when and why it moved (`putex history`, `putex watch`) |
//! | [`gateway`] | the lock gateway behind `putex serve`: locks for HTTP clients, held in the store |
//! | [`http`] | the HTTP server of `putex serve`: the RDLM-compatible API, the `/v1/` JSON API, OpenAPI, auth, TLS |
//! | [`idpool`] | identity pools (`putex id`): unique ids from a range, claimed atomically, never duplicated |
//! | [`systemd`] | `Type=notify`: READY, STATUS, a watchdog that pings only while the state machine progresses |
//! | [`web`] | the web status page: locks, holders, members, health, fencing tokens, a failover timeline |
//! | [`cli`] | the command line: flags → validated settings → `run`, `check`, `status`, `demo`, `serve` |

pub use putex_core as core;

/// The README's Rust examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub mod agent_http;
pub mod cli;
pub mod clock;
pub mod driver;
pub mod gateway;
pub mod history;
pub mod hooks;
pub mod http;
pub mod idpool;
pub mod keeper;
pub mod lease;
pub mod metrics;
pub mod process;
pub mod queue;
pub mod section;
pub mod store;
pub mod systemd;
pub mod web;
