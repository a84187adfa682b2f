//! The JSON bodies of the API: requests, locks, listings, status and
//! members, as the OpenAPI document describes them.

use super::*;

/// A fencing token: compare `epoch` first, then `revision`, each as an
/// integer. Both are decimal strings: an epoch is far above 2^53, where
/// JavaScript numbers stop being exact ([`crate::observe::json`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct FencingToken {
    /// The store bucket's incarnation, a decimal string.
    #[serde(with = "crate::observe::json::decimal")]
    #[schema(value_type = String, example = "1795315256799302554", pattern = "^[0-9]+$")]
    pub epoch: u64,
    /// The store's revision of the lock record's write, a decimal string.
    #[serde(with = "crate::observe::json::decimal")]
    #[schema(value_type = String, example = "37", pattern = "^[0-9]+$")]
    pub revision: u64,
}

impl From<Token> for FencingToken {
    fn from(t: Token) -> Self {
        FencingToken {
            epoch: t.epoch,
            revision: t.revision,
        }
    }
}

/// A lock request.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AcquireBody {
    /// What the lock is for (shown to operators).
    #[serde(default)]
    pub title: String,
    /// How long to wait for the lock, in seconds (0: do not wait).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub wait: f64,
    /// How long to hold it once granted, in seconds. There are no
    /// renewals unless you renew: the lock ends after this.
    #[schema(minimum = 0)]
    pub lifetime: f64,
}

/// A renewal.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct RenewBody {
    /// The new lifetime from now, in seconds; the lock's own when omitted.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub lifetime: Option<f64>,
}

/// A lock, granted or waiting.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockView {
    /// The resource.
    pub resource: String,
    /// The lock's unique id.
    pub uid: String,
    /// What it is for.
    pub title: String,
    /// The wait it was asked with, in seconds.
    pub wait: f64,
    /// Its lifetime, in seconds.
    pub lifetime: f64,
    /// Granted (`true`) or still waiting.
    pub active: bool,
    /// When it was granted (RFC 3339, UTC, the store's clock).
    pub active_since: Option<String>,
    /// When it expires (RFC 3339, UTC, the store's clock).
    pub active_expires: Option<String>,
    /// The fencing token, once granted: pass it to what the lock protects,
    /// which rejects anything older than the newest it has seen.
    pub token: Option<FencingToken>,
    /// The fencing token as `EPOCH:REVISION`.
    pub fencing_token: Option<String>,
    /// The store revision of the lock record (the token's revision), a
    /// number: revisions stay below 2^53 (`docs/http.md`).
    pub revision: Option<u64>,
    /// Seconds left of the lock's licence, once granted: in the answer to
    /// a grant or renewal, `lifetime` plus the grant deadline minus the
    /// time since the granting write, as the answer left the gateway (also
    /// in `X-Putex-Lifetime-Left`); in a listing, as of the read.
    pub lifetime_left: Option<f64>,
    /// This lock's URL path.
    pub href: String,
}

impl LockView {
    pub(super) fn new(info: &LockInfo) -> LockView {
        LockView {
            resource: info.resource.clone(),
            uid: info.uid.clone(),
            title: info.title.clone(),
            wait: info.wait.as_secs_f64(),
            lifetime: info.lifetime.as_secs_f64(),
            active: info.active,
            active_since: info.active_since.map(rfc3339),
            active_expires: info.active_expires.map(rfc3339),
            token: info.token.map(FencingToken::from),
            fencing_token: info.token.map(|t| t.to_string()),
            revision: info.token.map(|t| t.revision),
            lifetime_left: info.lifetime_left.map(seconds_floor_ms),
            href: format!("/v1/locks/{}/{}", info.resource, info.uid),
        }
    }
}

/// A resource and its granted and waiting locks.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceLocks {
    /// The resource.
    pub resource: String,
    /// Its locks: the granted one first, then the waiting ones in order.
    pub locks: Vec<LockView>,
}

/// Every resource with a granted or waiting lock.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockList {
    /// The resources.
    pub resources: Vec<ResourceLocks>,
}

/// A member of a lock (a `putex run` agent), from its member record.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemberView {
    /// The node id.
    pub node: String,
    /// Its role (`active`, `standby`, …).
    pub role: String,
    /// Whether its last health check passed.
    pub healthy: Option<bool>,
    /// Its last health check.
    pub last_health: Option<String>,
    /// Its fencing token while holding, `EPOCH:REVISION`.
    pub token: Option<String>,
    /// Store time since its record was written, in ms.
    pub last_seen_ms: Option<u64>,
    /// Whether it has not written its record for more than ten renewals.
    pub silent: bool,
    /// Something an operator must look at, e.g. `stop unproven (3 attempts;
    /// holding the lock until a stop is proven)`: the service may still run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
    /// Its last `--position`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// How far its position is behind the highest any member published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Why it would not take over now, e.g. `lagging 1200`, `priority 0`,
    /// `follow failing: exit 1: …`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// What its `putex run --info` printed: field names and values as text
    /// (at most 16 fields).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub info: std::collections::BTreeMap<String, String>,
}

impl From<MemberStatus> for MemberView {
    fn from(m: MemberStatus) -> Self {
        MemberView {
            node: m.node,
            role: m.role,
            healthy: m.healthy,
            last_health: m.last_health,
            token: m.token,
            last_seen_ms: m.last_seen_ms,
            silent: m.silent,
            alarm: m.alarm,
            position: m.position,
            lag: m.lag,
            why_not: m.why_not,
            info: m.info,
        }
    }
}

/// A lock record, as `putex status` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusView {
    /// The lock name.
    pub lock: String,
    /// The holder's node id (for `released` and `revoked`: the last
    /// holder). Gateway locks name the gateway's node.
    pub holder: Option<String>,
    /// What the record shows.
    pub state: RecordState,
    /// The record's fencing token.
    pub token: Option<FencingToken>,
    /// The fencing token as `EPOCH:REVISION`.
    pub fencing_token: Option<String>,
    /// The record's revision.
    pub revision: Option<u64>,
    /// Store time since the record was last written, in ms.
    pub renewed_ago_ms: Option<u64>,
    /// The lease T the holder advertises, in ms (a gateway lock's lifetime).
    pub lease_ms: Option<u64>,
    /// The emergency-stop gap the holder advertises, in ms.
    pub gap_ms: Option<u64>,
    /// The holder's instance id (a gateway lock's uid).
    pub instance: Option<String>,
    /// Whether the record is older than its advertised lease.
    pub stale: bool,
    /// The members' records (absent in the `/v1/status` listing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<MemberView>>,
    /// A held record's failsafe set and cap (`putex run --failsafe`): the
    /// members that must all grant for the holder to keep its service
    /// through a store outage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<crate::report::status::FailsafeStatus>,
}

pub(super) fn parse_token(s: &str) -> Option<FencingToken> {
    let t = putex_core::Token::parse(s)?;
    Some(FencingToken {
        epoch: t.epoch,
        revision: t.revision,
    })
}

impl From<LockStatus> for StatusView {
    fn from(s: LockStatus) -> Self {
        StatusView {
            token: s.token.as_deref().and_then(parse_token),
            fencing_token: s.token,
            lock: s.lock,
            holder: s.holder,
            state: s.state,
            revision: s.revision,
            renewed_ago_ms: s.renewed_ago_ms,
            lease_ms: s.lease_ms,
            gap_ms: s.gap_ms,
            instance: s.instance,
            stale: s.stale,
            members: Some(s.members.into_iter().map(MemberView::from).collect()),
            failsafe: s.failsafe,
        }
    }
}

/// The status of several locks.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusList {
    /// One entry per lock record in the store.
    pub locks: Vec<StatusView>,
}

/// A lock's members.
#[derive(Debug, Serialize, ToSchema)]
pub struct MembersView {
    /// The lock name.
    pub lock: String,
    /// Its members' records.
    pub members: Vec<MemberView>,
}

/// `/health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthView {
    /// Always `ok`: the server answers.
    pub status: String,
}
