//! The lock gateway behind `putex serve`: locks for HTTP clients, held in
//! the store like every other putex lock.
//!
//! An HTTP client asks for a lock on a resource with a `lifetime`; it then
//! holds it that long **without renewing** (RDLM's contract). The gateway
//! acquires it by the agent's rules — the core [`Agent`]
//! through the [`driver`], with T = lifetime, so the record
//! advertises the client's lifetime to every taker — and, once the lock is
//! granted, writes nothing more: a gateway that dies does not shorten
//! anyone's lock, and no gateway needs to survive for the lock to expire.
//!
//! Everything lives in the store, so several gateways on one store act as
//! one service:
//!
//! | key | what |
//! |---|---|
//! | `lock.<resource>` | the lock record: `node` = the gateway's node id, `instance` = the lock's uid |
//! | `queue.<resource>.<uid>` | a waiting request's ticket (fair order, [`crate::locks::queue`]) |
//! | `cancel.<resource>` | an admin cancel: every ticket that arrived before it is cancelled (its waiter ends, and it is no longer listed) |
//! | `grant.<resource>.<uid>` | a granted lock's title, wait, lifetime and times, for `GET`; removed when the lock ends ([`Gateway::forget_ended_grants`] for a lifetime that ran out) |
//!
//! The client can only count its lifetime from the moment the `201`
//! reaches it, after the grant's write and the HTTP hop. So the grant's write advertises `lifetime + D` (D =
//! [`GatewayOptions::grant_deadline`]): a taker waits W + G' (S1, S2) for
//! that, never less than `lifetime + D` after the write. The gateway hands
//! the answer over within D/2 of sending that write, or gives the lock back
//! ([`Grant`]); the other half of D is for the answer's way to the client.
//! The answer says how much is left ([`LockInfo::lifetime_left`]).
//! Administrative calls end a holder: [`Gateway::revoke`] writes
//! `revoked` (S7); [`Gateway::force`] frees an HTTP grant at once by
//! writing `released` over it (its client cannot be told, and no process
//! watches its record); [`Gateway::delete`], RDLM's, frees HTTP grants and
//! revokes `putex lock` and agent holders.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{self, BoxFuture, FutureExt};
use futures::StreamExt;
use putex_core::record::ceil_millis;
use putex_core::{
    AbsentWhy, Agent, AgentConfig, Event, HealthMode, Identity, Input, Instant, KeeperCommand,
    LockRecord, LockState, Observed, Role, StopKind, StoreTime, Timing, TimingConfig, Token,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::locks::queue::{Ticket, TicketRecord, Waiter};
use crate::store::{keys, AnyStore, Entry, Name, NodeId, ReadMode, Store, StoreError};

mod acquire;
mod admin;
mod read;
mod release;
#[cfg(test)]
mod tests;
mod tidy;
mod writes;

pub use admin::{AdminAction, Ended};
pub use tidy::TIDY_EVERY;

/// A request for a lock, as [`Gateway::acquire`] takes it (RDLM's `POST
/// /locks/{resource}` and `/v1/`'s lock request, parsed).
#[derive(Clone, Debug, PartialEq)]
pub struct AcquireRequest {
    /// The resource: `[A-Za-z0-9_-]{1,64}` (RDLM's `[a-zA-Z0-9]+` is a subset).
    pub resource: Name,
    /// What the lock is for.
    pub title: String,
    /// How long to wait for it.
    pub wait: Duration,
    /// How long the client holds it once granted.
    pub lifetime: Duration,
}

/// A lock, granted or waiting, as the API shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct LockInfo {
    /// The resource's name (the `<resource>` of its keys).
    pub resource: String,
    /// The lock's unique id (32 hex digits).
    pub uid: String,
    /// What it is for.
    pub title: String,
    /// The wait its client asked for; zero for a holder or waiter that is
    /// no HTTP client (`putex lock`, an agent).
    pub wait: Duration,
    /// The lifetime its client asked for; for a holder that is no HTTP
    /// client, the lease its record advertises (zero for such a waiter).
    pub lifetime: Duration,
    /// Granted (`true`) or still waiting.
    pub active: bool,
    /// When it was granted (UTC on the store's clock).
    pub active_since: Option<SystemTime>,
    /// When it expires (UTC on the store's clock).
    pub active_expires: Option<SystemTime>,
    /// The fencing token, once granted.
    pub token: Option<Token>,
    /// How much of the lock's licence is left, once granted: in a grant's
    /// answer, `lifetime + D` minus the time since the grant's write, as
    /// the gateway hands the answer over ([`Grant::hand_over`]); in a
    /// listing, the record's advertised lease minus its age on the store's
    /// clock. Count it from an instant no later than the answer left the
    /// gateway (e.g. when the request was sent).
    pub lifetime_left: Option<Duration>,
}

/// Why a lock was not granted.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The wait ran out (RDLM: 408).
    #[error("not acquired within the wait")]
    Timeout,
    /// The wait ran out while the lock, taken, waited before it could be
    /// granted (RDLM: 408): its record was absent or the store went back
    /// (S4, S6). Says how long that wait was and why.
    #[error("not acquired within the wait: the lock was taken, but must wait {wait_s:.1} s before it is granted, because {why}")]
    TimeoutInAbsentWait {
        /// The whole absent-record wait, in seconds.
        wait_s: f64,
        /// Why, for people ([`putex_core::AbsentWhy::explain`]).
        why: &'static str,
    },
    /// An administrator deleted the waiting request (RDLM: 409).
    #[error("the waiting request was deleted by an administrator")]
    Cancelled,
    /// The request is invalid (RDLM: 400).
    #[error("{0}")]
    Invalid(String),
    /// The store failed (503).
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The lock was granted (or renewed), but the answer could not be
    /// handed over within half the grant deadline of the grant's write
    /// (503): a new grant was given back; a renewal stays.
    #[error("granted {0:?} before the answer was ready, past half the grant deadline")]
    Late(Duration),
}

/// A lock just granted or renewed, on its way to its client.
///
/// Its licence runs from the send of the write that granted it, and that
/// write advertises `lifetime + D` (D = [`GatewayOptions::grant_deadline`]),
/// which every taker waits out. A client can only start counting when the
/// answer reaches it, so the answer must leave early enough:
/// [`Grant::hand_over`] is called at the last moment before it is sent and
/// refuses past D/2. A new grant that is never handed over — too late, or
/// dropped because its client left — is given back (its record becomes
/// `released`: nobody received it, which is the proof H6 asks for). A
/// renewal that is too late stays: its client still counts from the
/// previous answer, which ends earlier.
#[derive(Debug)]
#[must_use = "a grant that is not handed over is given back"]
pub struct Grant {
    info: LockInfo,
    resource: Name,
    uid: Name,
    /// When the granting write was sent (this host's boot-time clock).
    sent: Instant,
    deadline: Duration,
    /// Gives the lock back on drop, until handed over; `None` for a renewal.
    give_back: Option<Gateway>,
}

impl Grant {
    /// The lock, as granted ([`LockInfo::lifetime_left`] is set by
    /// [`Grant::hand_over`]).
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// Hands the lock over to its client: its description with what is
    /// left of its licence, `lifetime + D` minus the time since the grant's
    /// write. Past D/2 of that write the answer is too late
    /// ([`AcquireError::Late`]): a new grant is given back.
    pub fn hand_over(mut self) -> Result<LockInfo, AcquireError> {
        let elapsed = clock::boot_time_now().saturating_since(self.sent);
        if elapsed > self.deadline / 2 {
            if self.give_back.is_some() {
                tracing::warn!(resource = %self.info.resource, uid = %self.info.uid, ?elapsed,
                    "granted too long before the answer could leave (past half --grant-deadline): giving the lock back");
            }
            return Err(AcquireError::Late(elapsed));
        }
        self.give_back = None;
        let mut info = self.info.clone();
        info.lifetime_left = Some(info.lifetime + self.deadline - elapsed);
        Ok(info)
    }
}

impl Drop for Grant {
    /// A grant dropped before it was handed over (its client left, or the
    /// answer was too late) is given back in the background.
    fn drop(&mut self) {
        let Some(gateway) = self.give_back.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left: the lock expires after its licence
        };
        let (resource, uid) = (self.resource.clone(), self.uid.clone());
        tracing::info!(%resource, %uid, "a grant that was not handed over: giving the lock back");
        runtime.spawn(release_grant(gateway, resource, uid));
    }
}

/// Releases a grant that was not handed over. A failure is logged: the lock
/// then expires after its licence.
async fn release_grant(gateway: Gateway, resource: Name, uid: Name) {
    if let Err(e) = gateway.release(&resource, &uid).await {
        tracing::warn!(%resource, %uid, "giving the lock back failed (it expires after its licence): {e}");
    }
}

/// How the gateway acquires and reports locks.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// The gateway's node id (written as the holder's node).
    pub node: NodeId,
    /// ε: every clock involved is assumed to run within `[1−ε, 1+ε]` of
    /// real time (`putex serve --max-drift`, default 1 %).
    pub max_drift: putex_core::Drift,
    /// The longest lifetime a client may ask for.
    pub max_lifetime: Duration,
    /// The longest wait a client may ask for.
    pub max_wait: Duration,
    /// The lease T the gateway acquires with, before it grants the lock and
    /// advertises the client's lifetime ([`DEFAULT_ACQUIRE_LEASE`]): it
    /// bounds the first use of a name (S4: W + G') and, as `--max-lease`
    /// does for agents, what S4 protects after a store lost a record.
    pub acquire_lease: Duration,
    /// D, the grant deadline ([`DEFAULT_GRANT_DEADLINE`]): a granted or
    /// renewed record advertises `lifetime + D`, so takers wait that out;
    /// the gateway hands the answer over within D/2 of the write or gives
    /// the lock back, which leaves at least D/2 for the answer to reach
    /// its client.
    pub grant_deadline: Duration,
}

/// The default [`GatewayOptions::grant_deadline`]: the answer leaves within
/// 0.5 s of the grant and has another 0.5 s to reach its client; takers
/// wait 1 s more than the lifetime.
pub const DEFAULT_GRANT_DEADLINE: Duration = Duration::from_secs(1);

/// The default [`GatewayOptions::acquire_lease`]: the first request for a
/// never-used resource waits about 2.4 s where the store cannot prove it
/// unused (S4).
pub const DEFAULT_ACQUIRE_LEASE: Duration = Duration::from_secs(2);

/// The gateway: cheap to clone, one per `putex serve`.
#[derive(Clone, Debug)]
pub struct Gateway {
    store: AnyStore,
    opts: GatewayOptions,
    /// The highest fencing token this gateway has seen per resource (S6),
    /// shared by all its requests: a store that goes back below it is never
    /// trusted. Kept in memory, for the life of the process.
    highest: Arc<parking_lot::Mutex<HashMap<Name, Token>>>,
}

/// The shortest lifetime a client may ask for: the lease must span a few
/// renewals while it is being acquired.
pub const MIN_LIFETIME: Duration = Duration::from_millis(100);

/// Requests that wait less than this are answered at once when the lock is
/// held, and otherwise get this long to take a free lock.
pub const MIN_WAIT: Duration = Duration::from_secs(1);

/// A granted HTTP lock's description, `grant.<resource>.<uid>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// Format version (1).
    pub v: u32,
    /// What it is for.
    pub title: String,
    /// The wait it was asked with, in milliseconds.
    pub wait_ms: u64,
    /// Its lifetime, in milliseconds.
    pub lifetime_ms: u64,
    /// The grant deadline D it was granted with, in milliseconds: its
    /// record advertises `lifetime + D` (0 in records of older gateways).
    #[serde(default)]
    pub deadline_ms: u64,
    /// When it was granted, nanoseconds since the Unix epoch (the
    /// granting gateway's clock; listings use the lock record's store
    /// time).
    pub since_ns: u64,
    /// The fencing token (written before the granting write: listings use
    /// the lock record's).
    pub token: Token,
}

/// The timing an HTTP lock is acquired with: T = `lifetime`, R = T / 10
/// (at most 1 s), C = 2; a store call may take three quarters of R, not two
/// fifths: the gateway's health check answers at once, and a first use's
/// proof of vacancy on etcd waits for a watch that etcd serves on its
/// 100 ms sync (`docs/stores.md`, First use), which 80 ms (R = 200 ms at
/// the default `--acquire-lease 2s`) would cut short half the time.
pub fn timing_for(lifetime: Duration, max_drift: putex_core::Drift) -> Result<Timing, String> {
    let renew = (lifetime / 10).min(Duration::from_secs(1));
    let failures = u32::try_from(lifetime.as_nanos().div_ceil(renew.as_nanos().max(1)))
        .map_err(|_| "lifetime too long".to_string())?
        .max(2);
    TimingConfig {
        renew,
        failures,
        confirm: 2,
        max_drift,
        allow_short_lease: true,
        healthcheck_timeout: Some(renew / 10),
        store_timeout: Some(renew * 3 / 4),
        ..TimingConfig::default()
    }
    .validate()
    .map_err(|e| e.to_string())
}

impl Gateway {
    /// The highest fencing token this gateway has seen for `resource` (S6):
    /// each acquisition starts from it, so a store that lost writes is
    /// never trusted below what an earlier request saw.
    pub fn highest(&self, resource: &Name) -> Option<Token> {
        self.highest.lock().get(resource).copied()
    }

    pub(super) fn raise_highest(&self, resource: &Name, token: Token) {
        raise(&self.highest, resource, token);
    }

    /// A gateway on `store`, with no fencing token seen yet
    /// ([`Gateway::highest`]).
    pub fn new(store: AnyStore, opts: GatewayOptions) -> Gateway {
        Gateway {
            store,
            opts,
            highest: Arc::default(),
        }
    }

    pub(crate) fn store(&self) -> &AnyStore {
        &self.store
    }

    pub(crate) fn options(&self) -> &GatewayOptions {
        &self.opts
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_secs(2)
    }
}

/// Raises the highest token seen for `resource` to `token` (never lowers it).
fn raise(highest: &parking_lot::Mutex<HashMap<Name, Token>>, resource: &Name, token: Token) {
    let mut highest = highest.lock();
    let h = highest.entry(resource.clone()).or_insert(token);
    *h = (*h).max(token);
}

/// The next cancel record's revision from a watch; `None` when the watch
/// ended (it is not re-established: cancellations then reach this waiter
/// only through its wait running out).
async fn next_cancel(w: &mut Option<crate::store::WatchStream>) -> Option<u64> {
    match w {
        Some(stream) => match stream.next().await {
            Some(Ok(ev)) => Some(ev.entry.map_or(0, |e| e.token.revision)),
            _ => None,
        },
        None => future::pending().await,
    }
}

/// Whether the record is an HTTP grant: `active`, written by a gateway's
/// grant or renewal — write id `<uid>-grant` or `<uid>-renew-<revision>`,
/// uid being the record's instance. The core's write ids are
/// `<instance>-<number>`, so a `putex lock` or agent holder (which watches
/// its record and must be stopped through it) never matches; nor does a
/// gateway's own acquisition before the grant.
pub fn is_http_grant(rec: &LockRecord) -> bool {
    let suffix = rec
        .write
        .strip_prefix(rec.instance.as_str())
        .and_then(|w| w.strip_prefix('-'));
    rec.state == LockState::Active
        && suffix.is_some_and(|w| {
            w == "grant"
                || w.strip_prefix("renew-")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The record's holder, if it holds the lock (`confirming` or `active`).
fn holder_of(entry: &Entry) -> Option<LockRecord> {
    match Observed::decode(&entry.value) {
        Observed::Record(r) if matches!(r.state, LockState::Active | LockState::Confirming) => {
            Some(r)
        }
        _ => None,
    }
}

/// What is left of the record's advertised lease (a gateway lock's
/// `lifetime + D`) since it was written, on the store's clock; `None` once
/// it has passed. Records of another clock domain (another boot of an
/// embedded store) have expired; a store clock that ran backwards leaves
/// the whole lease.
fn lease_left(entry: &Entry, rec: &LockRecord, now: StoreTime) -> Option<Duration> {
    match now.gap_since(entry.time) {
        putex_core::StoreGap::Forward(age) => {
            rec.lease().checked_sub(age).filter(|left| !left.is_zero())
        }
        putex_core::StoreGap::Backwards => Some(rec.lease()),
        putex_core::StoreGap::Unbounded => None,
    }
}

/// Whether the record's advertised lease has passed ([`lease_left`]).
fn expired(entry: &Entry, rec: &LockRecord, now: StoreTime) -> bool {
    lease_left(entry, rec, now).is_none()
}

fn nanos_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn info_of(resource: &str, uid: &str, g: &GrantRecord) -> LockInfo {
    let since = SystemTime::UNIX_EPOCH + Duration::from_nanos(g.since_ns);
    let lifetime = Duration::from_millis(g.lifetime_ms);
    let deadline = Duration::from_millis(g.deadline_ms);
    LockInfo {
        resource: resource.to_owned(),
        uid: uid.to_owned(),
        title: g.title.clone(),
        wait: Duration::from_millis(g.wait_ms),
        lifetime,
        active: true,
        active_since: Some(since),
        active_expires: Some(since + lifetime + deadline),
        token: Some(g.token),
        lifetime_left: None,
    }
}

fn waiting_info(resource: &str, r: &TicketRecord) -> LockInfo {
    LockInfo {
        resource: resource.to_owned(),
        uid: r.instance.clone(),
        title: r.title.clone().unwrap_or_default(),
        wait: Duration::from_millis(r.wait_ms.unwrap_or(0)),
        lifetime: Duration::from_millis(r.lifetime_ms.unwrap_or(0)),
        active: false,
        active_since: None,
        active_expires: None,
        token: None,
        lifetime_left: None,
    }
}
