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
//! | `grant.<resource>.<uid>` | a granted lock's title, wait, lifetime and times, for `GET` |
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
    Agent, AgentConfig, Event, HealthMode, Identity, Input, Instant, KeeperCommand, LockRecord,
    LockState, Observed, Role, StopKind, StoreTime, Timing, TimingConfig, Token,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::locks::queue::{Ticket, TicketRecord, Waiter};
use crate::store::{keys, AnyStore, Entry, ReadMode, Store, StoreError};

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

impl From<keys::NameError> for AcquireError {
    fn from(e: keys::NameError) -> Self {
        AcquireError::Invalid(e.to_string())
    }
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

    /// Gives a grant that will not be handed over back now, and returns
    /// once the release is written: whoever hears of the refusal after
    /// this finds the lock free. (A failed release is logged; the lock
    /// then expires after its licence.)
    async fn give_back(mut self) {
        let Some(gateway) = self.give_back.take() else {
            return;
        };
        let (resource, uid) = (&self.info.resource, &self.info.uid);
        if let Err(e) = gateway.release(resource, uid).await {
            tracing::warn!(%resource, %uid, "giving the lock back failed (it expires after its licence): {e}");
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let Some(gateway) = self.give_back.take() else {
            return;
        };
        let (resource, uid) = (self.info.resource.clone(), self.info.uid.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left: the lock expires after its licence
        };
        tracing::info!(%resource, %uid, "a grant that was not handed over: giving the lock back");
        runtime.spawn(async move {
            if let Err(e) = gateway.release(&resource, &uid).await {
                tracing::warn!(%resource, %uid, "giving the lock back failed (it expires after its licence): {e}");
            }
        });
    }
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
/// never-used resource waits about 2.4 s.
pub const DEFAULT_ACQUIRE_LEASE: Duration = Duration::from_secs(2);

/// The gateway: cheap to clone, one per `putex serve`.
#[derive(Clone, Debug)]
pub struct Gateway {
    store: AnyStore,
    opts: GatewayOptions,
    /// The highest fencing token this gateway has seen per resource (S6),
    /// shared by all its requests: a store that goes back below it is never
    /// trusted. Kept in memory, for the life of the process.
    highest: Arc<parking_lot::Mutex<HashMap<String, Token>>>,
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
/// (at most 1 s), C = 2.
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
        ..TimingConfig::default()
    }
    .validate()
    .map_err(|e| e.to_string())
}

impl Gateway {
    /// The highest fencing token this gateway has seen for `resource` (S6):
    /// each acquisition starts from it, so a store that lost writes is
    /// never trusted below what an earlier request saw.
    pub fn highest(&self, resource: &str) -> Option<Token> {
        self.highest.lock().get(resource).copied()
    }

    fn raise_highest(&self, resource: &str, token: Token) {
        raise(&self.highest, resource, token);
    }

    /// A gateway on `store`.
    pub fn new(store: AnyStore, opts: GatewayOptions) -> Gateway {
        Gateway {
            store,
            opts,
            highest: Arc::default(),
        }
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The options.
    pub fn options(&self) -> &GatewayOptions {
        &self.opts
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// Waits up to `req.wait` for the lock, grants it for `req.lifetime`
    /// and hands it over at once ([`Gateway::acquire_grant`], then
    /// [`Grant::hand_over`]).
    pub async fn acquire(&self, req: AcquireRequest) -> Result<LockInfo, AcquireError> {
        self.acquire_grant(req).await?.hand_over()
    }

    /// Waits up to `req.wait` for the lock and grants it for
    /// `req.lifetime`: the [`Grant`] must then be handed over within half
    /// the grant deadline ([`Grant::hand_over`]), at the last moment before
    /// the answer leaves; one that is not is given back. Cancel-safe:
    /// dropping the future (a client that disconnects) abandons the
    /// request, and a lock granted at that moment is released at once — a
    /// disconnected client never holds a lock.
    pub async fn acquire_grant(&self, req: AcquireRequest) -> Result<Grant, AcquireError> {
        keys::validate_name(&req.resource).map_err(|e| AcquireError::Invalid(e.to_string()))?;
        if req.lifetime < MIN_LIFETIME || req.lifetime > self.opts.max_lifetime {
            return Err(AcquireError::Invalid(format!(
                "lifetime must be between {:?} and {:?}",
                MIN_LIFETIME, self.opts.max_lifetime
            )));
        }
        if req.wait > self.opts.max_wait {
            return Err(AcquireError::Invalid(format!(
                "wait must be at most {:?}",
                self.opts.max_wait
            )));
        }
        // Acquired with a short lease (the waits of S1/S4 use it against
        // records that advertise less), granted with the lifetime: the
        // grant's write advertises it to every taker.
        let timing = timing_for(
            req.lifetime.min(self.opts.acquire_lease),
            self.opts.max_drift,
        )
        .map_err(AcquireError::Invalid)?;
        // The work runs in a task of its own; this future only waits for
        // it. Dropping this future drops `reply`'s receiver: the task then
        // stops waiting, or drops the grant it could not deliver, which
        // gives the lock back.
        let (reply, result) = oneshot::channel();
        let (cancel, cancelled) = oneshot::channel::<()>();
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = this.acquire_task(req, timing, cancelled).await;
            let _ = reply.send(outcome);
        });
        let _cancel_on_drop = cancel;
        result.await.unwrap_or_else(|_| {
            Err(AcquireError::Store(StoreError::config(
                "gateway task failed",
            )))
        })
    }

    async fn acquire_task(
        &self,
        req: AcquireRequest,
        timing: Timing,
        mut cancelled: oneshot::Receiver<()>,
    ) -> Result<Grant, AcquireError> {
        // A short wait is "only if free now": a live holder answers at
        // once; a free lock still gets the round trips it takes.
        if req.wait < MIN_WAIT {
            let key =
                keys::lock(&req.resource).map_err(|e| AcquireError::Invalid(e.to_string()))?;
            if let Some(entry) = self
                .store
                .get(&key, ReadMode::Leader, self.timeout())
                .await?
            {
                if let Some(rec) = holder_of(&entry) {
                    if !expired(&entry, &rec, self.store_now().await?) {
                        return Err(AcquireError::Timeout);
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + req.wait.max(MIN_WAIT);
        let uid = crate::identity::instance_id();
        let ticket = Ticket::join(
            self.store.clone(),
            Waiter {
                name: req.resource.clone(),
                node: self.opts.node.clone(),
                instance: uid.clone(),
                renew: timing.renew(),
                store_timeout: timing.store_timeout(),
                title: Some(req.title.clone()),
                asked: Some((req.wait, req.lifetime)),
                patience: req.wait.max(MIN_WAIT),
            },
        )
        .await?;
        let mut turn = ticket.turn();
        let arrival = ticket.arrival();
        let cancel_key =
            keys::cancel(&req.resource).map_err(|e| AcquireError::Invalid(e.to_string()))?;
        let mut cancel_watch = self
            .store
            .watch(&cancel_key, None, self.timeout())
            .await
            .ok();

        let mut agent = Agent::new(
            AgentConfig {
                highest_token: self.highest(&req.resource),
                ..AgentConfig::new(
                    Identity {
                        node: self.opts.node.clone(),
                        machine: crate::identity::machine_id(),
                        instance: uid.clone(),
                    },
                    timing.clone(),
                )
            },
            clock::boot_time_now(),
        );
        agent.handle(clock::boot_time_now(), Input::Turn(false));
        let (granted_tx, mut granted) = mpsc::unbounded_channel();
        let (role_tx, role) = tokio::sync::watch::channel(Role::Starting);
        let host = Arc::new(GatewayHost {
            resource: req.resource.clone(),
            highest: self.highest.clone(),
            granted: granted_tx,
            role: role_tx,
            history: crate::observe::history::HistoryWriter::spawn(
                self.store.clone(),
                crate::observe::history::WriterConfig::new(
                    &req.resource,
                    &self.opts.node,
                    &uid,
                    "serve",
                    self.timeout(),
                ),
            ),
        });
        let (inputs, rx) = mpsc::unbounded_channel();
        let lock_key =
            keys::lock(&req.resource).map_err(|e| AcquireError::Invalid(e.to_string()))?;
        let probe =
            keys::probe(&self.opts.node).map_err(|e| AcquireError::Invalid(e.to_string()))?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let mut driver = tokio::spawn(driver::run_with_inputs(
            agent,
            self.store.clone(),
            Keys {
                lock: lock_key,
                probe,
            },
            host,
            async move {
                let _ = stop_rx.await;
            },
            rx,
        ));
        let _ = inputs.send(Input::Turn(*turn.borrow()));
        let outcome = loop {
            tokio::select! {
                changed = turn.changed() => {
                    if changed.is_ok() {
                        let _ = inputs.send(Input::Turn(*turn.borrow_and_update()));
                    }
                }
                token = granted.recv() => {
                    let Some(token) = token else { break Err(AcquireError::Timeout) };
                    // Granted: the client holds it from here without
                    // renewals; the agent stops writing.
                    driver.abort();
                    break Ok(token);
                }
                ev = next_cancel(&mut cancel_watch) => {
                    match ev {
                        Some(revision) if revision > arrival => break Err(AcquireError::Cancelled),
                        Some(_) => {}
                        None => cancel_watch = None,
                    }
                }
                () = tokio::time::sleep_until(deadline) => break Err(AcquireError::Timeout),
                _ = &mut cancelled => break Err(AcquireError::Timeout),
                _ = &mut driver => break Err(AcquireError::Timeout),
            }
        };
        match outcome {
            Ok(_) => {
                ticket.leave().await;
                // An admin delete cancels the waiters before it frees the
                // holder: a lock taken since was freed by that delete, and
                // this request was cancelled by it. Grant, and give back.
                // (A failed read cancels nothing: the grant reports it.)
                let cancelled = self.cancelled_up_to(&req.resource).await.unwrap_or(0) > arrival;
                let grant = self.grant(&req, &uid).await?;
                if cancelled {
                    grant.give_back().await;
                    return Err(AcquireError::Cancelled);
                }
                Ok(grant)
            }
            Err(e) => {
                // Out of line at once: a request cancelled by an admin
                // delete must not take the lock the same delete frees
                // next (the agent only acquires on its turn).
                let _ = inputs.send(Input::Turn(false));
                ticket.leave().await;
                if *role.borrow() == Role::Confirming {
                    // Taking the lock over (its fencing gap): leaving now
                    // would leave a `confirming` record that every taker
                    // must wait out (H6 allows no release from it). Finish
                    // in the background instead — activate, grant nothing,
                    // release — so that the lock is free for the next
                    // request.
                    tokio::spawn(async move {
                        let _ = granted.recv().await;
                        let _ = stop_tx.send(());
                        let _ = driver.await;
                    });
                } else {
                    let _ = stop_tx.send(());
                    if tokio::time::timeout(timing.lease(), &mut driver)
                        .await
                        .is_err()
                    {
                        driver.abort();
                    }
                }
                Err(e)
            }
        }
    }

    /// Grants the lock: its description (the grant record), then one more
    /// write of its record — `active`, advertising `lifetime + D`, so the
    /// licence runs that long from it. Nothing follows that write: the
    /// [`Grant`] counts from its send and is ready when its reply arrives.
    async fn grant(&self, req: &AcquireRequest, uid: &str) -> Result<Grant, AcquireError> {
        let t = self.timeout();
        let key = keys::lock(&req.resource)?;
        let grant_key = keys::grant(&req.resource, uid)?;
        let deadline = self.opts.grant_deadline;
        let mut grant = GrantRecord {
            v: 1,
            title: req.title.clone(),
            wait_ms: ceil_millis(req.wait),
            lifetime_ms: ceil_millis(req.lifetime),
            deadline_ms: ceil_millis(deadline),
            since_ns: 0,
            token: Token::new(0, 0),
        };
        let mut described = false;
        let mut written = None;
        // The agent's last renewal may still land: retry on our own record.
        for _ in 0..3 {
            let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
                break;
            };
            let Some(rec) = holder_of(&entry).filter(|r| r.instance == uid) else {
                break;
            };
            if !described {
                grant.token = entry.token;
                grant.since_ns = nanos_since_epoch(SystemTime::now());
                self.store
                    .put(
                        &grant_key,
                        &serde_json::to_vec(&grant).expect("serialises"),
                        t,
                    )
                    .await?;
                described = true;
            }
            let granted = LockRecord {
                state: LockState::Active,
                write: format!("{uid}-grant"),
                lease_ms: ceil_millis(req.lifetime + deadline).max(rec.lease_ms),
                ..rec
            };
            let (sent, wall) = (clock::boot_time_now(), SystemTime::now());
            match self
                .store
                .update(&key, &granted.encode(), entry.token, t)
                .await
            {
                Ok(token) => {
                    written = Some((token, sent, wall));
                    break;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // Lost between activation and grant: nothing was granted.
        let Some((token, sent, wall)) = written else {
            if described {
                self.forget_grant(&req.resource, uid).await;
            }
            return Err(AcquireError::Timeout);
        };
        self.raise_highest(&req.resource, token);
        grant.token = token;
        grant.since_ns = nanos_since_epoch(wall);
        Ok(Grant {
            info: info_of(&req.resource, uid, &grant),
            sent,
            deadline,
            give_back: Some(self.clone()),
        })
    }

    /// Deletes the grant record of `uid` on `resource`, if any (best effort:
    /// a stale one describes no lock, since the lock record decides).
    async fn forget_grant(&self, resource: &str, uid: &str) {
        let t = self.timeout();
        if let Ok(key) = keys::grant(resource, uid) {
            if let Ok(Some(g)) = self.store.get(&key, ReadMode::Any, t).await {
                let _ = self.store.delete(&key, g.token, t).await;
            }
        }
    }

    async fn read_prefix(&self, prefix: &str) -> Result<Vec<(String, Entry)>, StoreError> {
        crate::store::read_prefix(&self.store, prefix, self.timeout()).await
    }

    /// The store's current time, by a probe write.
    async fn store_now(&self) -> Result<StoreTime, StoreError> {
        let t = self.timeout();
        let key = keys::probe(&self.opts.node)?;
        self.store
            .put(&key, br#"{"v":1,"node":"gateway","write":"now"}"#, t)
            .await?;
        match self.store.get(&key, ReadMode::Leader, t).await? {
            Some(e) => Ok(e.time),
            None => Err(StoreError::unknown(
                crate::store::Op::Get,
                &key,
                "probe vanished",
            )),
        }
    }

    /// A store time as UTC: NATS times are the stream leader's clock; the
    /// embedded stores' are this boot's clock.
    async fn wall(&self, t: StoreTime) -> SystemTime {
        match &self.store {
            AnyStore::Nats(_) => SystemTime::UNIX_EPOCH + Duration::from_nanos(t.nanos),
            _ => {
                let now = clock::boot_time_now().as_nanos();
                SystemTime::now() - Duration::from_nanos(now.saturating_sub(t.nanos))
            }
        }
    }

    /// The lock record of `resource` if `uid` holds it and its advertised
    /// lease (`lifetime + D`) has not passed, with its entry and what is
    /// left of the lease.
    async fn held(
        &self,
        resource: &str,
        uid: &str,
    ) -> Result<Option<(Entry, LockRecord, Duration)>, StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource)?;
        let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
            return Ok(None);
        };
        let Some(rec) = holder_of(&entry).filter(|r| r.instance == uid) else {
            return Ok(None);
        };
        let now = self.store_now().await?;
        Ok(lease_left(&entry, &rec, now).map(|left| (entry, rec, left)))
    }

    /// The lock `uid` on `resource`, if it is granted or waiting and not
    /// expired, released or revoked.
    pub async fn get(&self, resource: &str, uid: &str) -> Result<Option<LockInfo>, StoreError> {
        if keys::validate_name(resource).is_err() || keys::validate_name(uid).is_err() {
            return Ok(None);
        }
        let t = self.timeout();
        if let Some((entry, rec, left)) = self.held(resource, uid).await? {
            return Ok(Some(
                self.granted_info(resource, uid, &entry, &rec, left).await?,
            ));
        }
        let ticket = self
            .store
            .get(&keys::ticket(resource, uid)?, ReadMode::Any, t)
            .await?
            .and_then(|e| serde_json::from_slice::<TicketRecord>(&e.value).ok());
        let Some(ticket) = ticket else {
            return Ok(None);
        };
        if ticket.arrival < self.cancelled_up_to(resource).await? {
            return Ok(None);
        }
        Ok(Some(waiting_info(resource, &ticket)))
    }

    /// The revision of the newest admin cancel of `resource`'s waiters
    /// (0 if none): a ticket that arrived before it is cancelled, also
    /// while its waiter has not yet left the line.
    async fn cancelled_up_to(&self, resource: &str) -> Result<u64, StoreError> {
        Ok(self
            .store
            .get(&keys::cancel(resource)?, ReadMode::Leader, self.timeout())
            .await?
            .map_or(0, |e| e.token.revision))
    }

    /// A held lock's description: its grant record's, with the token and
    /// the time of the lock record's last write (the grant or renewal).
    async fn granted_info(
        &self,
        resource: &str,
        uid: &str,
        entry: &Entry,
        rec: &LockRecord,
        left: Duration,
    ) -> Result<LockInfo, StoreError> {
        // A holder whose instance id is no name is no gateway lock: it has
        // no grant record (and must not fail the listing it is in).
        let grant = match keys::grant(resource, uid) {
            Ok(key) => self
                .store
                .get(&key, ReadMode::Any, self.timeout())
                .await?
                .and_then(|e| serde_json::from_slice::<GrantRecord>(&e.value).ok()),
            Err(_) => None,
        };
        let mut info = match grant {
            Some(mut g) if is_http_grant(rec) => {
                g.token = entry.token;
                g.since_ns = nanos_since_epoch(self.wall(entry.time).await);
                info_of(resource, uid, &g)
            }
            // Held by another kind of holder (`putex lock`, an agent), or a
            // gateway still acquiring it.
            _ => LockInfo {
                resource: resource.to_owned(),
                uid: uid.to_owned(),
                title: format!("held by {} (putex)", rec.node),
                wait: Duration::ZERO,
                lifetime: rec.lease(),
                active: true,
                active_since: None,
                active_expires: None,
                token: None,
                lifetime_left: None,
            },
        };
        info.lifetime_left = Some(left);
        Ok(info)
    }

    /// Releases the granted lock `uid` (`released`, S3: the next waiter
    /// starts at once). `false` if it is not held (expired, released,
    /// revoked or unknown) or not an HTTP grant: a `putex lock` or agent
    /// holder, listed with its instance as the uid, is never released by
    /// its uid ([`is_http_grant`]).
    pub async fn release(&self, resource: &str, uid: &str) -> Result<bool, StoreError> {
        if keys::validate_name(resource).is_err() || keys::validate_name(uid).is_err() {
            return Ok(false);
        }
        let t = self.timeout();
        let key = keys::lock(resource)?;
        let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
            return Ok(false);
        };
        let Some(rec) = holder_of(&entry).filter(|r| r.instance == uid && is_http_grant(r)) else {
            return Ok(false);
        };
        let live = !expired(&entry, &rec, self.store_now().await?);
        // The client says it is done: that is the proof a release needs
        // (H6), also after the lifetime passed — the next waiter need not
        // wait out the staleness.
        let released = LockRecord {
            state: LockState::Released,
            write: format!("{uid}-release"),
            ..rec
        };
        let written = self
            .store
            .update(&key, &released.encode(), entry.token, t)
            .await;
        self.forget_grant(resource, uid).await;
        Ok(live && written.is_ok())
    }

    /// Extends the granted lock `uid` by a new lifetime from now (its own if
    /// `None`): its record is rewritten, advertising `lifetime + D` like a
    /// grant. `None` if it is not held. The [`Grant`] must be handed over
    /// like a new one; a renewal that is too late stays (its client counts
    /// from its previous answer, which ends earlier).
    pub async fn renew(
        &self,
        resource: &str,
        uid: &str,
        lifetime: Option<Duration>,
    ) -> Result<Option<Grant>, StoreError> {
        if keys::validate_name(resource).is_err() || keys::validate_name(uid).is_err() {
            return Ok(None);
        }
        if let Some(l) = lifetime {
            if l < MIN_LIFETIME || l > self.opts.max_lifetime {
                return Err(StoreError::config(format!(
                    "lifetime must be between {:?} and {:?}",
                    MIN_LIFETIME, self.opts.max_lifetime
                )));
            }
        }
        let t = self.timeout();
        let Some((entry, rec, _)) = self.held(resource, uid).await? else {
            return Ok(None);
        };
        if !is_http_grant(&rec) {
            return Ok(None); // a `putex lock` or agent holder renews itself
        }
        let grant_key = keys::grant(resource, uid)?;
        let mut grant = self
            .store
            .get(&grant_key, ReadMode::Any, t)
            .await?
            .and_then(|e| serde_json::from_slice::<GrantRecord>(&e.value).ok())
            .unwrap_or(GrantRecord {
                v: 1,
                title: String::new(),
                wait_ms: 0,
                lifetime_ms: rec.lease_ms,
                deadline_ms: 0,
                since_ns: 0,
                token: entry.token,
            });
        let lifetime = lifetime.unwrap_or(Duration::from_millis(grant.lifetime_ms));
        let deadline = self.opts.grant_deadline;
        // The description first: nothing follows the renewing write.
        grant.lifetime_ms = ceil_millis(lifetime);
        grant.deadline_ms = ceil_millis(deadline);
        self.store
            .put(
                &grant_key,
                &serde_json::to_vec(&grant).expect("serialises"),
                t,
            )
            .await?;
        let renewed = LockRecord {
            state: LockState::Active,
            write: format!("{uid}-renew-{}", entry.token.revision),
            lease_ms: ceil_millis(lifetime + deadline),
            ..rec
        };
        let key = keys::lock(resource)?;
        let (sent, wall) = (clock::boot_time_now(), SystemTime::now());
        let token = match self
            .store
            .update(&key, &renewed.encode(), entry.token, t)
            .await
        {
            Ok(token) => token,
            Err(StoreError::Conflict { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.raise_highest(resource, token);
        grant.since_ns = nanos_since_epoch(wall);
        grant.token = token;
        Ok(Some(Grant {
            info: info_of(resource, uid, &grant),
            sent,
            deadline,
            give_back: None,
        }))
    }

    /// The granted and waiting locks of `resource`.
    pub async fn locks(&self, resource: &str) -> Result<Vec<LockInfo>, StoreError> {
        keys::validate_name(resource)?;
        let t = self.timeout();
        let mut out = Vec::new();
        if let Some(entry) = self
            .store
            .get(&keys::lock(resource)?, ReadMode::Leader, t)
            .await?
        {
            if let Some(rec) = holder_of(&entry) {
                if let Some(left) = lease_left(&entry, &rec, self.store_now().await?) {
                    let uid = rec.instance.clone();
                    out.push(
                        self.granted_info(resource, &uid, &entry, &rec, left)
                            .await?,
                    );
                }
            }
        }
        let cancelled = self.cancelled_up_to(resource).await?;
        let mut waiting: Vec<TicketRecord> = self
            .read_prefix(&keys::queue_of(resource)?)
            .await?
            .into_iter()
            .filter_map(|(_, e)| serde_json::from_slice::<TicketRecord>(&e.value).ok())
            .filter(|r| r.lifetime_ms.is_some() && r.arrival > cancelled)
            .collect();
        waiting.sort_by_key(|r| r.arrival);
        out.extend(waiting.iter().map(|r| waiting_info(resource, r)));
        Ok(out)
    }

    /// The resources that have a granted or waiting lock.
    pub async fn resources(&self) -> Result<Vec<String>, StoreError> {
        let now = self.store_now().await?;
        let mut names = std::collections::BTreeSet::new();
        for (key, entry) in self.read_prefix(keys::LOCK_PREFIX).await? {
            if let Some(rec) = holder_of(&entry) {
                if !expired(&entry, &rec, now) {
                    names.insert(key[keys::LOCK_PREFIX.len()..].to_owned());
                }
            }
        }
        let mut cancelled = HashMap::new();
        for (key, entry) in self.read_prefix(keys::QUEUE_PREFIX).await? {
            let Ok(ticket) = serde_json::from_slice::<TicketRecord>(&entry.value) else {
                continue;
            };
            let Some((name, _)) = key[keys::QUEUE_PREFIX.len()..].split_once('.') else {
                continue;
            };
            if ticket.lifetime_ms.is_none() || names.contains(name) {
                continue;
            }
            let up_to = match cancelled.get(name) {
                Some(r) => *r,
                None => {
                    let r = self.cancelled_up_to(name).await?;
                    cancelled.insert(name.to_owned(), r);
                    r
                }
            };
            if ticket.arrival > up_to {
                names.insert(name.to_owned());
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Admin: revokes `resource`'s holder, whatever it is (S7): its record
    /// becomes `revoked`, keeping its identity and advertised timing. A
    /// `putex lock` or agent holder sees it and stops at once; takers wait
    /// W + G' of what the record advertises (for an HTTP grant, whose
    /// client cannot be told: `lifetime + D`). Waiting requests keep their
    /// place. `None` when nothing holds it.
    pub async fn revoke(&self, resource: &str) -> Result<Option<Ended>, StoreError> {
        self.end_holder(resource, Admin::Revoke).await
    }

    /// Admin: frees `resource` at once if an HTTP grant holds it: its
    /// record becomes `released`, so the next acquirer starts at once
    /// (S3), with a higher fencing token. The HTTP client is not told: its
    /// fencing token is what protects the resource from it. A `putex lock`
    /// or agent holder, which may still be running, is left alone
    /// ([`AdminAction::Refused`]: revoke it). Waiting requests keep their
    /// place. `None` when nothing holds it.
    pub async fn force(&self, resource: &str) -> Result<Option<Ended>, StoreError> {
        self.end_holder(resource, Admin::Force).await
    }

    /// Admin, RDLM's delete of every lock on `resource`: waiting requests
    /// end with [`AcquireError::Cancelled`], then an HTTP grant is freed at
    /// once ([`Gateway::force`]) and any other holder is revoked
    /// ([`Gateway::revoke`]). `false` when it had neither.
    pub async fn delete(&self, resource: &str) -> Result<bool, StoreError> {
        keys::validate_name(resource)?;
        let mut had = false;
        // Cancel first: a waiter must not take a freed lock that the same
        // delete is about to cancel its request for.
        let waiting = self.read_prefix(&keys::queue_of(resource)?).await?;
        if !waiting.is_empty() {
            let marker = br#"{"v":1,"cancelled":"admin"}"#;
            self.store
                .put(&keys::cancel(resource)?, marker, self.timeout())
                .await?;
            had = true;
        }
        Ok(self.end_holder(resource, Admin::Delete).await?.is_some() || had)
    }

    /// [`Gateway::delete`] on every resource.
    pub async fn delete_all(&self) -> Result<(), StoreError> {
        for r in self.resources().await? {
            self.delete(&r).await?;
        }
        Ok(())
    }

    /// Ends `resource`'s live holder as `how` says: a compare-and-swap on
    /// the revision it judged, so a holder that changed meanwhile (a
    /// renewal, a takeover) is judged again.
    async fn end_holder(&self, resource: &str, how: Admin) -> Result<Option<Ended>, StoreError> {
        keys::validate_name(resource)?;
        let t = self.timeout();
        let key = keys::lock(resource)?;
        for _ in 0..5 {
            let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
                return Ok(None);
            };
            let Some(rec) = holder_of(&entry) else {
                return Ok(None);
            };
            if expired(&entry, &rec, self.store_now().await?) {
                return Ok(None);
            }
            let http = is_http_grant(&rec);
            let (action, state, write) = match (how, http) {
                (Admin::Force | Admin::Delete, true) => {
                    (AdminAction::Freed, LockState::Released, "forced")
                }
                (Admin::Force, false) => {
                    return Ok(Some(Ended::of(AdminAction::Refused, &rec, entry.token)))
                }
                (Admin::Revoke | Admin::Delete, _) => {
                    (AdminAction::Revoked, LockState::Revoked, "revoked")
                }
            };
            // S7 (and a freed grant too): keep the holder's identity and
            // advertised timing.
            let ended = Ended::of(action, &rec, entry.token);
            let written = LockRecord {
                state,
                write: format!("{}-{write}", crate::identity::instance_id()),
                ..rec
            };
            match self
                .store
                .update(&key, &written.encode(), entry.token, t)
                .await
            {
                Ok(token) => {
                    self.raise_highest(resource, token);
                    tracing::warn!(%resource, holder = %ended.node, instance = %ended.instance,
                        token = %ended.token, action = ?ended.action, "admin: the lock's holder was ended");
                    if action == AdminAction::Freed {
                        self.forget_grant(resource, &ended.instance).await;
                    }
                    return Ok(Some(ended));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::conflict(crate::store::Op::Update, &key))
    }
}

/// Which administrative call ends a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admin {
    /// [`Gateway::revoke`].
    Revoke,
    /// [`Gateway::force`].
    Force,
    /// [`Gateway::delete`] (RDLM's): force an HTTP grant, revoke the rest.
    Delete,
}

/// What an administrative call did to a resource's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAction {
    /// An HTTP grant, freed at once: its record is `released` (S3).
    Freed,
    /// Revoked (S7): its record is `revoked`; takers wait W + G'.
    Revoked,
    /// Not done: `force` on a `putex lock` or agent holder, which watches
    /// its record and may still be running (revoke it instead).
    Refused,
}

/// The holder an administrative call ended (or refused to end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// What was done.
    pub action: AdminAction,
    /// The holder's node id (the gateway's `--node` for an HTTP grant).
    pub node: String,
    /// Its instance id (an HTTP lock's uid).
    pub instance: String,
    /// Its fencing token: from now on the protected resource should refuse
    /// it (every later holder's token is higher).
    pub token: Token,
}

impl Ended {
    fn of(action: AdminAction, rec: &LockRecord, token: Token) -> Ended {
        Ended {
            action,
            node: rec.node.clone(),
            instance: rec.instance.clone(),
            token,
        }
    }
}

/// Raises the highest token seen for `resource` to `token` (never lowers it).
fn raise(highest: &parking_lot::Mutex<HashMap<String, Token>>, resource: &str, token: Token) {
    let mut highest = highest.lock();
    let h = highest.entry(resource.to_owned()).or_insert(token);
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

/// The agent's host while a request waits: nothing runs, activation is
/// the grant.
struct GatewayHost {
    resource: String,
    /// The gateway's highest tokens per resource, raised here (S6).
    highest: Arc<parking_lot::Mutex<HashMap<String, Token>>>,
    granted: mpsc::UnboundedSender<Token>,
    role: tokio::sync::watch::Sender<Role>,
    /// Transition records for `putex history` (the acquisition; the
    /// client's release is no transition of this agent).
    history: crate::observe::history::HistoryWriter,
}

impl Host for GatewayHost {
    fn health_check(&self, _: HealthMode, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(&self, token: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        let _ = self.granted.send(token);
        future::ready(true).boxed()
    }

    fn stop(&self, _: StopKind, _: Instant) -> BoxFuture<'static, bool> {
        // The HTTP client is the service; nothing runs here.
        future::ready(true).boxed()
    }

    fn keeper(&self, _: KeeperCommand) -> BoxFuture<'static, bool> {
        // No keeper: the HTTP client is the service.
        future::ready(true).boxed()
    }

    fn persist_highest(&self, token: Token) {
        raise(&self.highest, &self.resource, token);
    }

    fn event(&self, event: &Event) {
        if let Event::Transition {
            from,
            to,
            reason,
            token,
        } = event
        {
            tracing::debug!(%from, %to, %reason, "gateway lock transition");
            self.history.transition(*from, *to, reason, *token);
            self.role.send_replace(*to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: LockState, instance: &str, write: &str) -> LockRecord {
        LockRecord {
            v: 1,
            node: "gw1".into(),
            machine: "m".into(),
            instance: instance.into(),
            state,
            write: write.into(),
            lease_ms: 1000,
            gap_ms: 200,
        }
    }

    #[test]
    fn only_grant_and_renewal_writes_are_http_grants() {
        let yes = |w: &str| is_http_grant(&record(LockState::Active, "abc", w));
        assert!(yes("abc-grant"));
        assert!(yes("abc-renew-42"));
        // The core's writes (acquisition, renewals of `putex lock` and
        // agents), another instance's grant, and malformed ids.
        for w in [
            "abc-0",
            "abc-17",
            "xyz-grant",
            "abc-renew-",
            "abc-renew-x",
            "abcgrant",
        ] {
            assert!(!yes(w), "{w}");
        }
        // A pid-based fallback instance id holds a dash.
        assert!(is_http_grant(&record(
            LockState::Active,
            "12-3",
            "12-3-grant"
        )));
        assert!(!is_http_grant(&record(LockState::Active, "12-3", "12-3-4")));
        for state in [
            LockState::Confirming,
            LockState::Released,
            LockState::Revoked,
        ] {
            assert!(!is_http_grant(&record(state, "abc", "abc-grant")));
        }
    }
}
