//! What operators see: metrics, history, status and the web page.
//!
//! | module | what it is for |
//! |---|---|
//! | [`metrics`] | `putex_`-prefixed metrics in OpenMetrics format |
//! | [`history`] | transition records: who held a lock when and why it moved (`putex history`, `putex watch`) |
//! | [`status`] | status queries: holders, members, waiters, semaphores, pools (`putex status`, `/v1/status`, the web page) |
//! | [`web`] | the web status page: locks, holders, members, health, fencing tokens, a failover timeline |

pub mod history;
pub mod metrics;
pub mod status;
pub mod web;
