//! Member records (`member.<lock>.<node>`): what each agent tells the
//! others and `putex status` about itself, written every 3 R and at each
//! transition.

use putex_core::Role;
use serde::{Deserialize, Serialize};

use super::host::AgentHost;
use crate::store::{AnyStore, Store};
// ---------------------------------------------------------------------------
// Member records.

/// A node's member record for a lock (`member.<lock>.<node>`), written by
/// the agent every few R and at each transition; read by `putex status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Format version (1).
    pub v: u32,
    /// The writer's node id, also the last part of the key.
    pub node: String,
    /// The agent's instance id.
    pub instance: String,
    /// The agent's role (`standby`, `active`, …).
    pub role: String,
    /// Whether the last health check passed (`None` before the first).
    pub healthy: Option<bool>,
    /// The last health check: `active ok`, `standby failed`, ….
    pub last_health: Option<String>,
    /// The fencing token while holding the lock.
    pub token: Option<String>,
    /// The agent's R, in milliseconds (status judges staleness by it).
    pub renew_ms: u64,
    /// The agent's pid.
    pub pid: u32,
    /// Something an operator must look at, e.g. `stop unproven`: a stop
    /// could not prove the service stopped, and it may still run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
}

/// Writes the member record every 3 R and whenever something changed.
pub(super) async fn member_writer(host: AgentHost, store: AnyStore, key: String) {
    let every = host.inner.settings.timing.renew() * 3;
    let timeout = host.inner.settings.timing.store_timeout();
    loop {
        let rec = host.member_record();
        // The last record (`exited`) is run_agent's to write, or not to
        // write: a refused duplicate leaves the holder's record alone.
        if host.set(|st| st.role == Some(Role::Exited)) {
            return;
        }
        let bytes = serde_json::to_vec(&rec).expect("member record serialises");
        if let Err(e) = store.put(&key, &bytes, timeout).await {
            tracing::debug!(error = %e, "member record not written");
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = host.inner.member_dirty.notified() => {}
        }
    }
}
