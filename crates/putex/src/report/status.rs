//! Status queries: who holds a lock, since when, with which token, how its
//! members are doing, who waits; semaphores and identity pools. Used by
//! `putex status`, `/v1/status` and the web page.
//!
//! Ages come from store timestamps only: the store's "now" is read by a
//! probe write (`probe._status`) and compared with the records' store
//! times, so no host's wall clock is compared with another's. A record
//! from another clock domain (the embedded store after a reboot) has no
//! age (`null`).

use std::time::Duration;

use putex_core::{Observed, StoreGap, StoreTime};
use serde::Serialize;

use super::members::MemberRecord;
use crate::observe::json::RecordState;
use crate::store::keys;
use crate::store::{AnyStore, ReadMode, Store, StoreError};
use crate::store::{Name, NodeId};

/// Why a status query failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A store call failed: unreachable, timed out or refused.
    #[error("store: {0}")]
    Store(StoreError),
    /// An identity pool could not be listed.
    #[error("pool {pool}: {error}")]
    Pool {
        /// The name of the pool whose listing failed.
        pool: String,
        /// The listing's error ([`IdError`](crate::locks::idpool::IdError)),
        /// as text.
        error: String,
    },
}

/// One lock as `status` reports it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LockStatus {
    /// The lock's name; for a slot of a semaphore, `NAME.SLOT`.
    pub lock: String,
    /// The holder's node id (also for `released` and `revoked` records:
    /// the last holder).
    pub holder: Option<String>,
    /// What the record shows.
    pub state: RecordState,
    /// The fencing token `epoch:revision`.
    pub token: Option<String>,
    /// The lock record's store revision (`None`: no record).
    pub revision: Option<u64>,
    /// Store time since the record was last written (renewed), in ms.
    pub renewed_ago_ms: Option<u64>,
    /// The lease T the holder advertises, in ms.
    pub lease_ms: Option<u64>,
    /// The emergency-stop gap the holder advertises, in ms.
    pub gap_ms: Option<u64>,
    /// The holder's instance id: one per start of an agent or `putex
    /// lock`, an HTTP lock's uid.
    pub instance: Option<String>,
    /// Whether the record is older than its advertised lease (the holder
    /// stopped renewing: a takeover is due).
    pub stale: bool,
    /// The lock's member records (`member.<lock>.<node>`) that can be
    /// read; empty for a slot of a semaphore.
    pub members: Vec<MemberStatus>,
    /// What the holder holds it for (`putex lock --title`), from its
    /// place in the line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `putex lock` clients waiting in line, first first.
    pub waiting: Vec<WaiterStatus>,
    /// Failover is paused by the holder's record (O2): by whom and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// A `released` record handed to this node by a switchover (O1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handed_to: Option<String>,
    /// The holder's failsafe set (F2), when its record carries one: the
    /// members that must all grant for it to keep its service through a
    /// store outage, and for how long at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<FailsafeStatus>,
}

/// A held record's failsafe set and cap (`docs/failsafe-design.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FailsafeStatus {
    /// The members' nodes, each of which must grant.
    pub set: Vec<String>,
    /// `--failsafe-max`: the longest the holder runs on grants after its
    /// last renewal that landed, in ms.
    pub max_ms: u64,
}

impl FailsafeStatus {
    /// The set and cap of `record`, if it is held and carries them.
    pub fn of(record: &putex_core::LockRecord) -> Option<FailsafeStatus> {
        let held = RecordState::from(record.state).is_held();
        record
            .failsafe
            .as_ref()
            .filter(|_| held)
            .map(|f| FailsafeStatus {
                set: f.members.iter().map(|m| m.node.clone()).collect(),
                max_ms: f.max_ms,
            })
    }
}

/// One `putex lock` client waiting in line (its queue ticket).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WaiterStatus {
    /// The waiter's node id.
    pub node: String,
    /// Its process id, on that node.
    pub pid: u32,
    /// What it wants the lock for (`--title`).
    pub title: Option<String>,
    /// Its place in line: the revision that created its ticket.
    pub arrival: u64,
    /// Store time since it last refreshed its ticket, in ms.
    pub refreshed_ago_ms: Option<u64>,
    /// Whether its ticket outlived its refreshes (the waiter died): others
    /// skip it, and it will be removed.
    pub expired: bool,
}

/// One member as `status` reports it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemberStatus {
    /// The member's node id, as its record `member.<lock>.<node>` says.
    pub node: String,
    /// The agent's role as it last wrote it: `starting`, `standby`,
    /// `confirming`, `active`, `stepping-down`, `lapsed` or `exited`.
    pub role: String,
    /// Whether its last health check passed (`None` before the first).
    pub healthy: Option<bool>,
    /// Its last health check: the mode and the result, e.g. `active ok`,
    /// `standby failed`.
    pub last_health: Option<String>,
    /// Its fencing token while holding.
    pub token: Option<String>,
    /// Store time since its member record was written, in ms.
    pub last_seen_ms: Option<u64>,
    /// Whether it has not written its record for more than 10 of its R.
    pub silent: bool,
    /// Something an operator must look at (`stop unproven …`: the service
    /// may still run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
    /// Its `--priority` (0: never takes over).
    pub priority: u32,
    /// Its last `--position`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// How far its position is behind the highest any member published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Its `--advertise` address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Why it would not take over now ("why not"): `priority 0`,
    /// `unhealthy`, `lagging N`, `rejoining`, `paused`, `deferring to db2`,
    /// `waiting for W: 4.2 s left`, …; `None` when nothing holds it back
    /// (or it holds the lock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// What its `--info` printed ([`crate::report::info`]), fields checked
    /// again as read.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub info: std::collections::BTreeMap<String, String>,
    /// Its machine id, if its agent says (failsafe names members by node
    /// and machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// With `--failsafe`: where holders ask it for grants and its key's
    /// fingerprint (members with different fingerprints cannot verify each
    /// other).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<crate::report::members::MemberFailsafe>,
}

fn age(now: Option<StoreTime>, then: StoreTime) -> Option<u64> {
    match now?.gap_since(then) {
        StoreGap::Forward(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        StoreGap::Backwards => Some(0),
        StoreGap::Unbounded => None,
    }
}

/// The store's current time, by a probe write and read (`None` when the
/// store cannot be written or read).
pub(crate) async fn store_now(store: &AnyStore, timeout: Duration) -> Option<StoreTime> {
    let key = keys::probe(&NodeId::new("_status").ok()?);
    store
        .put(
            &key,
            br#"{"v":1,"node":"_status","write":"status"}"#,
            timeout,
        )
        .await
        .ok()?;
    Some(store.get(&key, ReadMode::Leader, timeout).await.ok()??.time)
}

/// Every record under `filter` as of now ([`crate::store::read_prefix`]:
/// no waiting for a watch to go quiet, which busy members never do).
async fn snapshot(
    store: &AnyStore,
    filter: &str,
    timeout: Duration,
) -> Result<Vec<(String, crate::store::Entry)>, StatusError> {
    crate::store::read_prefix(store, filter, timeout)
        .await
        .map_err(StatusError::Store)
}

/// Reads one lock's status: its record, members and waiters, with ages on
/// the store's clock.
pub async fn lock_status(store: &AnyStore, lock: &Name) -> Result<LockStatus, StatusError> {
    let timeout = Duration::from_secs(2);
    let key = keys::lock(lock);
    let now = store_now(store, timeout).await;
    let mut st = record_status(store, lock, &key, now, timeout).await?;
    let filter = keys::members_of(lock);
    for (_, e) in snapshot(store, &filter, timeout).await? {
        let Ok(m) = serde_json::from_slice::<MemberRecord>(&e.value) else {
            continue;
        };
        let last_seen_ms = age(now, e.time);
        st.members.push(MemberStatus {
            silent: last_seen_ms.is_none_or(|a| a > m.renew_ms.max(1).saturating_mul(10)),
            node: m.node,
            role: m.role,
            healthy: m.healthy,
            last_health: m.last_health,
            token: m.token,
            last_seen_ms,
            alarm: m.alarm,
            priority: m.priority,
            position: m.position,
            lag: None,
            addr: m.addr,
            why_not: m
                .blocker
                .or_else(|| (m.priority == 0).then(|| "priority 0".into())),
            info: crate::report::info::sanitize(m.info),
            machine: m.machine,
            failsafe: m.failsafe,
        });
    }
    let highest = st.members.iter().filter_map(|m| m.position).max();
    for m in &mut st.members {
        m.lag = m.position.zip(highest).map(|(p, h)| h.saturating_sub(p));
    }
    let line = keys::queue_of(lock);
    let mut waiting = Vec::new();
    for (_, e) in snapshot(store, &line, timeout).await? {
        let Some(t) = crate::locks::queue::TicketRecord::from_entry(&e) else {
            continue;
        };
        let refreshed_ago_ms = age(now, e.time);
        let expiry = crate::locks::queue::expiry(Duration::from_millis(t.renew_ms));
        let expired = refreshed_ago_ms.is_none_or(|a| u128::from(a) > expiry.as_millis());
        if st.instance.as_deref() == Some(t.instance.as_str()) && st.state.is_held() {
            // The holder keeps its place until it leaves: its title.
            st.title = t.title;
            continue;
        }
        waiting.push(WaiterStatus {
            node: t.node,
            pid: t.pid,
            title: t.title,
            arrival: t.arrival,
            refreshed_ago_ms,
            expired,
        });
    }
    waiting.sort_by_key(|w| w.arrival);
    st.waiting = waiting;
    Ok(st)
}

/// One semaphore as `status` reports it (`putex lock --limit N`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SemaphoreStatus {
    /// The semaphore's name, the `<name>` of its limit record `sem.<name>`.
    pub name: String,
    /// Its limit N.
    pub limit: u32,
    /// Its slots, each an ordinary lock record (`lock` is `NAME.SLOT`).
    pub slots: Vec<LockStatus>,
}

/// One identity pool as `status` reports it (`putex id`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PoolStatus {
    /// The pool's name (the `<pool>` of its `id.<pool>.…` keys).
    pub pool: String,
    /// Its range, if recorded.
    pub range: Option<String>,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// Id records in all (claimed, leased, released, revoked, unreadable).
    pub records: usize,
}

/// Reads a semaphore's slots; `None` when `name` has no limit record or is
/// a plain lock (limit 1).
pub async fn semaphore_status(
    store: &AnyStore,
    name: &Name,
) -> Result<Option<SemaphoreStatus>, StatusError> {
    let timeout = Duration::from_secs(2);
    let key = keys::semaphore(name);
    let Some(e) = store
        .get(&key, ReadMode::Any, timeout)
        .await
        .map_err(StatusError::Store)?
    else {
        return Ok(None);
    };
    let limit = serde_json::from_slice::<crate::locks::section::SemaphoreRecord>(&e.value)
        .ok()
        .filter(|r| r.v == 1)
        .map_or(0, |r| r.limit);
    if limit == 1 {
        // A plain lock's recorded limit (`putex lock` without --limit).
        return Ok(None);
    }
    let now = store_now(store, timeout).await;
    let mut slots = Vec::new();
    // A record from elsewhere may claim any limit; no semaphore has more
    // slots than `--limit` allows.
    for i in 0..limit.min(crate::locks::section::MAX_LIMIT) {
        let slot = keys::slot(name, i);
        slots.push(record_status(store, &format!("{name}.{i}"), &slot, now, timeout).await?);
    }
    Ok(Some(SemaphoreStatus {
        name: name.to_string(),
        limit,
        slots,
    }))
}

/// Every semaphore and identity pool in the store.
pub async fn semaphores_and_pools(
    store: &AnyStore,
) -> Result<(Vec<SemaphoreStatus>, Vec<PoolStatus>), StatusError> {
    let timeout = Duration::from_secs(2);
    let mut sems = Vec::new();
    for (k, _) in crate::store::read_prefix(store, keys::SEM_PREFIX, timeout)
        .await
        .map_err(StatusError::Store)?
    {
        if let Ok(name) = Name::new(&k[keys::SEM_PREFIX.len()..]) {
            if let Some(s) = semaphore_status(store, &name).await? {
                sems.push(s);
            }
        }
    }
    let mut pools = std::collections::BTreeSet::new();
    for (k, _) in crate::store::read_prefix(store, keys::ID_PREFIX, timeout)
        .await
        .map_err(StatusError::Store)?
    {
        if let Some((pool, _)) = k[keys::ID_PREFIX.len()..].split_once('.') {
            if let Ok(pool) = Name::new(pool) {
                pools.insert(pool);
            }
        }
    }
    let mut out = Vec::new();
    for pool in pools {
        let l = crate::locks::idpool::list(store, &pool, &crate::locks::idpool::Options::default())
            .await
            .map_err(|e| StatusError::Pool {
                pool: pool.to_string(),
                error: e.to_string(),
            })?;
        out.push(PoolStatus {
            pool: pool.to_string(),
            range: l.range,
            claimed: l.claimed,
            records: l.ids.iter().filter(|e| e.id.is_some()).count(),
        });
    }
    Ok((sems, out))
}

/// The lock record at `key`, reported as lock `name` (no members).
async fn record_status(
    store: &AnyStore,
    name: &str,
    key: &str,
    now: Option<StoreTime>,
    timeout: Duration,
) -> Result<LockStatus, StatusError> {
    let lock = name;
    let entry = store
        .get(key, ReadMode::Any, timeout)
        .await
        .map_err(StatusError::Store)?;
    let mut st = LockStatus {
        lock: lock.to_owned(),
        holder: None,
        state: RecordState::Absent,
        token: None,
        revision: None,
        renewed_ago_ms: None,
        lease_ms: None,
        gap_ms: None,
        instance: None,
        stale: false,
        members: Vec::new(),
        title: None,
        waiting: Vec::new(),
        paused: None,
        handed_to: None,
        failsafe: None,
    };
    if let Some(e) = entry {
        st.token = Some(e.token.to_string());
        st.revision = Some(e.token.revision);
        st.renewed_ago_ms = age(now, e.time);
        match Observed::decode(&e.value) {
            Observed::Record(r) => {
                st.holder = Some(r.node.clone());
                st.state = r.state.into();
                st.lease_ms = Some(r.lease_ms);
                st.gap_ms = Some(r.gap_ms);
                st.instance = Some(r.instance.clone());
                let live = st.state.is_held();
                st.paused = r.paused.as_ref().filter(|_| live).map(ToString::to_string);
                st.handed_to = r.to.clone().filter(|_| st.state == RecordState::Released);
                st.failsafe = FailsafeStatus::of(&r);
                // A paused record is never taken over (O2): not stale.
                st.stale =
                    live && st.paused.is_none() && st.renewed_ago_ms.is_none_or(|a| a > r.lease_ms);
            }
            Observed::Garbage => st.state = RecordState::Unreadable,
        }
    }
    Ok(st)
}
