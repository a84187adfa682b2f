//! What the shell records for operators: metrics, transition history, and
//! how tokens and record states are spelled in JSON. (The status queries
//! and the web page, which read records of every layer, are in
//! [`crate::report`].)
//!
//! | module | what it is for |
//! |---|---|
//! | [`metrics`] | `putex_`-prefixed metrics in OpenMetrics format |
//! | [`history`] | transition records: who held a lock when and why it moved (`putex history`, `putex watch`) |
//! | [`json`] | fencing tokens in the JSON putex emits: decimal strings, exact above 2^53; readers take numbers too; record states by name |

pub mod history;
pub mod json;
pub mod metrics;
