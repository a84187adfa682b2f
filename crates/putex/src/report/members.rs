//! Member records (`member.<lock>.<node>`): what each agent of a lock
//! tells the others and `putex status` about itself. Written by the agent
//! ([`crate::agent`]) every 3 R and at each transition; read by the agents,
//! the status queries and `putex switchover`.

use serde::{Deserialize, Serialize};

/// A node's member record for a lock (`member.<lock>.<node>`), written by
/// the agent every few R and at each transition; read by `putex status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// `--priority` (O3); records of older agents have none: 1.
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// The last `--position` (O3), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// It could take over now: standby checks pass, rejoined, not backing
    /// off (O3). Older agents do not say: `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Why it would not take over now, e.g. `priority 0`, `lagging 1200`,
    /// `rejoining`, `deferring to db2` ("why not").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<String>,
    /// `--advertise`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Failover is paused by its record: who paused, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// What `--info` last printed ([`crate::report::info`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub info: std::collections::BTreeMap<String, String>,
    /// The agent's machine id: failsafe's set names members by node and
    /// machine (two hosts given one node id by mistake are two members).
    /// Older agents do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// `--failsafe`: where holders ask this member for grants, and which
    /// key it signs with. Agents without failsafe, and agents too old to
    /// know it, say nothing — which is how a holder tells them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<MemberFailsafe>,
}

/// A failsafe member's endpoint and key, as its member record publishes
/// them (`docs/failsafe-design.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberFailsafe {
    /// Its `POST /v1/failsafe/{lock}`, e.g.
    /// `http://10.0.0.2:8008/v1/failsafe/pg`.
    pub url: String,
    /// The fingerprint of its `--failsafe-key-file`
    /// ([`crate::failsafe::auth::FailsafeKey::fingerprint`]): members whose
    /// fingerprints differ cannot verify each other.
    pub key: String,
}

fn default_priority() -> u32 {
    1
}

impl Default for MemberRecord {
    fn default() -> Self {
        MemberRecord {
            v: 1,
            node: String::new(),
            instance: String::new(),
            role: String::new(),
            healthy: None,
            last_health: None,
            token: None,
            renew_ms: 0,
            pid: 0,
            alarm: None,
            priority: default_priority(),
            position: None,
            ready: None,
            blocker: None,
            addr: None,
            paused: None,
            info: std::collections::BTreeMap::new(),
            machine: None,
            failsafe: None,
        }
    }
}
