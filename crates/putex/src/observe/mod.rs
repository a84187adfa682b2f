//! What operators see: metrics, history, status and the web page.
//!
//! | module | what it is for |
//! |---|---|
//! | [`metrics`] | `putex_`-prefixed metrics in OpenMetrics format |
//! | [`history`] | transition records: who held a lock when and why it moved (`putex history`, `putex watch`) |
//! | [`json`] | fencing tokens in the JSON putex emits: decimal strings, exact above 2^53; readers take numbers too |
//! | [`status`] | status queries: holders, members, waiters, semaphores, pools (`putex status`, `/v1/status`, the web page) |
//! | `web` | the web status page: locks, holders, members, health, fencing tokens, a failover timeline (hidden: served by `putex serve` and the agent's `--http`, not an API; public only for the fuzz tests of its data) |

pub mod history;
pub mod json;
pub mod metrics;
pub mod status;
#[doc(hidden)]
pub mod web;
