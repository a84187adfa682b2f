//! # putex-core: the sans-IO heart of putex
//!
//! putex makes a piece of work run in exactly one place at a time and moves
//! it safely when that place dies. Everything that decides *whether* a node
//! may run the service lives in this crate, and nothing in it does IO:
//!
//! - it never reads a clock: time arrives as an [`Instant`] argument (a
//!   reading of the host's boot-time clock, taken by the driver);
//! - it never talks to the store: it emits [`StoreRequest`]s and receives
//!   [`StoreOutcome`]s;
//! - it never runs a process: health checks, hooks, stops and keeper commands
//!   are [`Output`]s, their results are [`Input`]s.
//!
//! A crate-local `clippy.toml` forbids `Instant::now`, `SystemTime::now`,
//! threads, files and processes here, and the crate depends on nothing
//! asynchronous.
//!
//! ## Map
//!
//! | module | what it holds |
//! |---|---|
//! | [`time`] | [`Instant`] (boot-time readings) and [`Drift`] (ε, the clock-rate bound) |
//! | [`timing`] | R, F, C, K, S, ε and timeouts: validation whose errors name the option, and the timeline |
//! | [`store`] | the store as a message partner: requests, the four outcome classes, fencing [`Token`]s |
//! | [`record`] | the versioned JSON lock record and its tolerant decoding |
//! | [`agent`] | the lease state machine: rules H1–H6 and S1–S7 |
//!
//! ## Driving a machine
//!
//! The driver loop is the same for every machine (quinn-proto's shape):
//! feed an input with `handle(now, input)`, drain `poll_output()` until it
//! returns `None`, then sleep until `poll_timeout()` and call
//! `handle_timeout(now)`. Spurious wake-ups are harmless.
//!
//! ```
//! use putex_core::{Agent, AgentConfig, Identity, Instant, Output, TimingConfig};
//!
//! let timing = TimingConfig::default().validate().expect("defaults are valid");
//! let identity = Identity {
//!     node: "db1".into(),
//!     machine: "4c4c4544".into(),
//!     instance: "a1b2".into(),
//! };
//! let config = AgentConfig {
//!     supervised_stops: true,
//!     ..AgentConfig::new(identity, timing)
//! };
//! let mut agent = Agent::new(config, Instant::from_nanos(1_000_000_000));
//! // First it makes sure the service is not running (S5).
//! match agent.poll_output() {
//!     Some(Output::Stop { kind, .. }) => assert_eq!(kind, putex_core::StopKind::Startup),
//!     other => panic!("unexpected {other:?}"),
//! }
//! assert!(agent.poll_timeout().is_some());
//! ```
//!
//! ## The rules
//!
//! The safety argument is in `docs/safety.md`; each rule's name (H1…H6,
//! S1…S7) appears in the code that implements it, in the simulation check
//! that tests it, and in that document.

pub mod agent;
#[doc(hidden)]
pub mod mutation;
pub mod record;
pub mod store;
pub mod time;
pub mod timing;

pub use agent::{
    AbsentWhy, Agent, AgentConfig, Blocker, Candidate, CheckId, Event, ExitReason, FailsafeAnswer,
    FailsafeRefusal, FailsafeRequest, HealthMode, Hook, Identity, Input, KeeperCommand, LossCause,
    Output, PreviousInstance, Reason, Role, StopId, StopKind,
};
pub use record::{FailsafeMember, FailsafeSet, LockRecord, LockState, Observed, Pause};
pub use store::{
    Entry, Key, OpId, StoreGap, StoreOp, StoreOutcome, StoreRequest, StoreTime, Token,
};
pub use time::{Drift, Instant};
pub use timing::{StoreFacts, Timeline, Timing, TimingConfig, TimingError};
