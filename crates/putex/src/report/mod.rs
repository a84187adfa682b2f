//! What operators read: who holds a lock, since when, with which token,
//! who else is a member and why it would not take over, who waits, the
//! semaphores and identity pools, and the web page that shows it all.
//!
//! It sits above the lock library ([`crate::locks`]), whose queue,
//! semaphore and pool records it reads, and below the agent
//! ([`crate::agent`]), which writes the member records defined here and
//! serves the web page: the one module that reads records of every kind.
//!
//! | module | what it is for |
//! |---|---|
//! | [`status`] | status queries: holders, members, waiters, semaphores, pools (`putex status`, `/v1/status`, the web page) |
//! | [`members`] | member records (`member.<lock>.<node>`): what each agent tells the others and `putex status` |
//! | [`info`] | a member record's `info`: what `putex run --info` printed, checked as untrusted input |
//! | `web` | the web status page: locks, holders, members, health, fencing tokens, a failover timeline (hidden: served by `putex serve` and the agent's `--http`, not an API; public only for the fuzz tests of its data) |

pub mod info;
pub mod members;
pub mod status;
#[doc(hidden)]
pub mod web;
