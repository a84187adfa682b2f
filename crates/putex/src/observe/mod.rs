//! What operators see: metrics, history, status and the web page.
//!
//! | module | what it is for |
//! |---|---|
//! | [`metrics`] | `putex_`-prefixed metrics in OpenMetrics format |
//! | [`history`] | transition records: who held a lock when and why it moved (`putex history`, `putex watch`) |
//! | [`web`] | the web status page: locks, holders, members, health, fencing tokens, a failover timeline |

pub mod history;
pub mod metrics;
pub mod web;
