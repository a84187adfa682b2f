//! Supervision: who owns the service's processes, and how a stop is proven.
//!
//! | module | what it is for |
//! |---|---|
//! | `keeper` | the dead-man's switch that owns the service and its deadline, in a process of its own |
//! | `keeper_queue` | one ordered queue of requests to a keeper, shared by the agent and `putex lock` |
//! | `process` | process-tree control: cgroup v2 scopes, or a child subreaper |
//! | `hooks` | running hooks (`/bin/sh -c`) with their environment and timeouts |
//! | `systemd` | `Type=notify`: READY, STATUS, a watchdog that pings only while the state machine progresses |
//!
//! "Stopped" means no process of the tree survives, and a stop is reported
//! only when proven (`docs/supervision.md`).

pub mod hooks;
pub mod keeper;
pub(crate) mod keeper_queue;
pub mod process;
pub(crate) mod systemd;
