//! The lock gateway behind `putex serve`: locks for HTTP clients, held in
//! the store like every other putex lock.
//!
//! An HTTP client asks for a lock on a resource with a `lifetime`; it then
//! holds it that long **without renewing** (RDLM's contract). The gateway
//! acquires it by the agent's rules — the core [`Agent`](putex_core::Agent)
//! through the [`driver`](crate::driver), with T = lifetime, so the record
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
//! | `queue.<resource>.<uid>` | a waiting request's ticket (fair order, [`crate::queue`]); an admin cancel overwrites it with a cancel marker |
//! | `grant.<resource>.<uid>` | a granted lock's title, wait, lifetime and times, for `GET` |
//!
//! A lock expires when its lifetime has passed since the gateway's last
//! write of its record, on the store's clock; a taker waits W + G' (S1, S2)
//! after that record, so it never starts before the lifetime is over.
//! Administrative deletes write `revoked` (S7).

use std::time::{Duration, SystemTime};

use putex_core::Token;

use crate::store::{AnyStore, StoreError};

/// A request for a lock.
#[derive(Clone, Debug, PartialEq)]
pub struct AcquireRequest {
    /// The resource: `[A-Za-z0-9_-]{1,64}` (RDLM's `[a-zA-Z0-9]+` is a subset).
    pub resource: String,
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
    /// The resource.
    pub resource: String,
    /// The lock's unique id (32 hex digits).
    pub uid: String,
    /// What it is for.
    pub title: String,
    /// The wait it was asked with.
    pub wait: Duration,
    /// Its lifetime.
    pub lifetime: Duration,
    /// Granted (`true`) or still waiting.
    pub active: bool,
    /// When it was granted (UTC on the store's clock).
    pub active_since: Option<SystemTime>,
    /// When it expires (UTC on the store's clock).
    pub active_expires: Option<SystemTime>,
    /// The fencing token, once granted.
    pub token: Option<Token>,
}

/// Why a lock was not granted.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// The wait ran out (RDLM: 408).
    #[error("not acquired within the wait")]
    Timeout,
    /// An administrator deleted the waiting request (RDLM: 409).
    #[error("the waiting request was deleted by an administrator")]
    Cancelled,
    /// The request is invalid (RDLM: 400).
    #[error("{0}")]
    Invalid(String),
    /// The store failed (503).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// How the gateway acquires and reports locks.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// The gateway's node id (written as the holder's node).
    pub node: String,
    /// ε, the clock-rate bound.
    pub max_drift: putex_core::Drift,
    /// The longest lifetime a client may ask for.
    pub max_lifetime: Duration,
    /// The longest wait a client may ask for.
    pub max_wait: Duration,
}

/// The gateway: cheap to clone, one per `putex serve`.
#[derive(Clone, Debug)]
pub struct Gateway {
    store: AnyStore,
    opts: GatewayOptions,
}

fn not_yet() -> StoreError {
    StoreError::config("the gateway is not implemented yet")
}

impl Gateway {
    /// A gateway on `store`.
    pub fn new(store: AnyStore, opts: GatewayOptions) -> Gateway {
        Gateway { store, opts }
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The options.
    pub fn options(&self) -> &GatewayOptions {
        &self.opts
    }

    /// Waits up to `req.wait` for the lock and grants it for
    /// `req.lifetime`. Cancel-safe: dropping the future (a client that
    /// disconnects) abandons the request, and a lock granted at that moment
    /// is released at once — a disconnected client never holds a lock.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<LockInfo, AcquireError> {
        let _ = req;
        Err(AcquireError::Store(not_yet()))
    }

    /// The lock `uid` on `resource`, if it is granted or waiting and not
    /// expired, released or revoked.
    pub async fn get(&self, resource: &str, uid: &str) -> Result<Option<LockInfo>, StoreError> {
        let _ = (resource, uid);
        Err(not_yet())
    }

    /// Releases the granted lock `uid` (`released`, S3: the next waiter
    /// starts at once). `false` if it is not held (expired, released,
    /// revoked or unknown).
    pub async fn release(&self, resource: &str, uid: &str) -> Result<bool, StoreError> {
        let _ = (resource, uid);
        Err(not_yet())
    }

    /// Extends the granted lock `uid` by a new lifetime from now (its own if
    /// `None`). `None` if it is not held.
    pub async fn renew(
        &self,
        resource: &str,
        uid: &str,
        lifetime: Option<Duration>,
    ) -> Result<Option<LockInfo>, StoreError> {
        let _ = (resource, uid, lifetime);
        Err(not_yet())
    }

    /// The granted and waiting locks of `resource`.
    pub async fn locks(&self, resource: &str) -> Result<Vec<LockInfo>, StoreError> {
        let _ = resource;
        Err(not_yet())
    }

    /// The resources that have a granted or waiting lock.
    pub async fn resources(&self) -> Result<Vec<String>, StoreError> {
        Err(not_yet())
    }

    /// Administrative delete of every lock on `resource`: the granted one is
    /// revoked (S7), waiting requests end with [`AcquireError::Cancelled`].
    /// `false` when it had none.
    pub async fn revoke(&self, resource: &str) -> Result<bool, StoreError> {
        let _ = resource;
        Err(not_yet())
    }

    /// [`Gateway::revoke`] on every resource.
    pub async fn revoke_all(&self) -> Result<(), StoreError> {
        Err(not_yet())
    }
}
