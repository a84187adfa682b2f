//! The operator's standing requests for a lock (`ctl.<lock>`): a pause
//! (O2) and a switchover (O1), written by `putex pause`, `putex resume` and
//! `putex switchover` from any host with store access, and read by every
//! agent of the lock.
//!
//! A request is only a request: the pause takes effect through the holder's
//! own record, the switchover through the holder's graceful stop and a
//! release naming the target (`docs/safety.md`, O1 and O2). The record:
//!
//! ```json
//! {"v":1,
//!  "pause":{"by":"ops@db3","reason":"kernel update","at":"2026-11-27T10:00:00Z"},
//!  "switchover":{"id":"…","to":"db2","allow_lag":false,"holder":"db1",
//!                "holder_instance":"…","by":"ops@db3","at":"…","delay_ms":0}}
//! ```
//!
//! A switchover names the holder instance it was asked of: only that agent
//! acts on it (once), so a request left behind by a killed `putex
//! switchover` never moves a later holder. A refusal is written back into
//! the request (`refused`) for the command to report.

use std::collections::HashSet;
use std::time::Duration;

use crate::driver;
use futures::StreamExt;
use putex_core::{Input, Pause, Role, Token};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use super::state::AgentHost;
use crate::store::{keys, AnyStore, Entry, Name, ReadMode, Store, StoreError};

/// The control record's format version.
pub const CONTROL_VERSION: u32 = 1;

/// `ctl.<lock>`: the standing requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRecord {
    /// Format version ([`CONTROL_VERSION`]).
    pub v: u32,
    /// Failover is to be paused (O2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseRequest>,
    /// A switchover is asked for (O1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover: Option<SwitchoverRequest>,
}

/// `putex pause`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRequest {
    /// Who asked: `user@host`.
    pub by: String,
    /// `--reason`.
    #[serde(default)]
    pub reason: String,
    /// When, on the asking host's wall clock (RFC 3339), for people.
    #[serde(default)]
    pub at: String,
}

/// `putex switchover`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverRequest {
    /// Unique per request.
    pub id: String,
    /// `--to`: the target; `None`: the best eligible candidate.
    #[serde(default)]
    pub to: Option<String>,
    /// `--allow-lag`.
    #[serde(default)]
    pub allow_lag: bool,
    /// The holder asked to hand over (its node id).
    pub holder: String,
    /// Its agent instance: only that agent acts on the request.
    pub holder_instance: String,
    /// Who asked: `user@host`.
    pub by: String,
    /// When, on the asking host's wall clock (RFC 3339), for people.
    #[serde(default)]
    pub at: String,
    /// `--at`: how long after the holder sees the request it acts.
    #[serde(default)]
    pub delay_ms: u64,
    /// The holder would not: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl PauseRequest {
    /// The pause as the holder writes it into its record.
    pub fn pause(&self) -> Pause {
        Pause {
            by: self.by.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// Why a control record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The record holds something putex cannot read; it is left as it is.
    #[error("the control record {key} is unreadable ({why}); delete it to start afresh")]
    Unreadable {
        /// The record's key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// Others kept changing it.
    #[error("the control record kept changing under us; try again")]
    Busy,
}

/// Parses a control record's bytes.
pub fn decode(bytes: &[u8]) -> Result<ControlRecord, String> {
    let rec: ControlRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if rec.v != CONTROL_VERSION {
        return Err(format!(
            "format version {} (this putex reads {CONTROL_VERSION})",
            rec.v
        ));
    }
    Ok(rec)
}

/// Reads lock `lock`'s control record (an absent one is empty).
pub async fn read(
    store: &AnyStore,
    lock: &Name,
    timeout: Duration,
) -> Result<(Option<Token>, ControlRecord), ControlError> {
    let key = keys::control(lock);
    match store.get(&key, ReadMode::Leader, timeout).await? {
        None => Ok((None, ControlRecord::default())),
        Some(e) => decode(&e.value)
            .map(|r| (Some(e.token), r))
            .map_err(|why| ControlError::Unreadable { key, why }),
    }
}

/// Changes lock `lock`'s control record with `change` (compare-and-swap,
/// retried on conflicts); returns what was written.
pub async fn modify(
    store: &AnyStore,
    lock: &Name,
    timeout: Duration,
    change: impl FnMut(&mut ControlRecord),
) -> Result<ControlRecord, ControlError> {
    modify_from(store, lock, timeout, None, change).await
}

/// [`modify`], starting from `first`, a read the caller made already.
pub async fn modify_from(
    store: &AnyStore,
    lock: &Name,
    timeout: Duration,
    mut first: Option<(Option<Token>, ControlRecord)>,
    mut change: impl FnMut(&mut ControlRecord),
) -> Result<ControlRecord, ControlError> {
    let key = keys::control(lock);
    for _ in 0..20 {
        let (token, mut rec) = match first.take() {
            Some(read) => read,
            None => read(store, lock, timeout).await?,
        };
        rec.v = CONTROL_VERSION;
        change(&mut rec);
        let bytes = serde_json::to_vec(&rec).expect("a control record serialises");
        let written = match token {
            Some(t) => store.update(&key, &bytes, t, timeout).await,
            None => store.create(&key, &bytes, timeout).await,
        };
        match written {
            Ok(_) => return Ok(rec),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ControlError::Busy)
}

/// Who is asking: `$USER@hostname`.
pub fn requester() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", crate::identity::hostname())
}

/// Feeds the agent the operator's requests: on every change of `ctl.<lock>`
/// (a watch) and, so that an agent cut off when it changed learns of it,
/// again every 3 R (the standing pause).
pub(super) async fn control_feed(
    host: AgentHost,
    store: AnyStore,
    lock: Name,
    inject: driver::InputSender,
) {
    let key = keys::control(&lock);
    let every = host.inner.settings.timing.renew() * 3;
    let timeout = host.feed_timeout();
    let mut handled: HashSet<String> = HashSet::new();
    let mut from: Option<u64> = None;
    let mut current: Option<ControlRecord> = None;
    loop {
        match store.watch(&key, from, timeout).await {
            Ok(mut stream) => loop {
                tokio::select! {
                    event = stream.next() => {
                        let Some(Ok(event)) = event else { break };
                        from = Some(event.revision + 1);
                        match event.entry.as_ref().map(|e: &Entry| decode(&e.value)) {
                            None => current = Some(ControlRecord::default()),
                            Some(Ok(r)) => current = Some(r),
                            Some(Err(why)) => {
                                tracing::warn!(key, why, "unreadable control record ignored");
                                continue;
                            }
                        }
                    }
                    () = tokio::time::sleep(every) => {}
                }
                if let Some(rec) = &current {
                    if !feed(&host, &store, &lock, rec, &inject, &mut handled, timeout).await {
                        return;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "control watch failed; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Passes one state of the control record to the agent; `false` once the
/// agent is gone.
async fn feed(
    host: &AgentHost,
    store: &AnyStore,
    lock: &Name,
    rec: &ControlRecord,
    inject: &driver::InputSender,
    handled: &mut HashSet<String>,
    timeout: Duration,
) -> bool {
    let input = match &rec.pause {
        Some(p) => Input::Pause(p.pause()),
        None => Input::Resume,
    };
    if inject.unbounded_send(input).is_err() {
        return false;
    }
    let Some(req) = &rec.switchover else {
        return true;
    };
    // No holder: an override of --max-lag for the node it names.
    let waiver = req.holder_instance.is_empty()
        && req.allow_lag
        && req.to.as_deref() == Some(host.inner.node.as_str());
    if waiver && !handled.contains(&req.id) {
        handled.insert(req.id.clone());
        tracing::warn!(by = %req.by, "taking over beyond --max-lag, as an operator asked");
        return inject
            .unbounded_send(Input::Switchover {
                to: req.to.clone(),
                allow_lag: true,
            })
            .is_ok();
    }
    let ours = req.holder_instance == host.inner.instance && req.refused.is_none();
    if !ours || handled.contains(&req.id) {
        return true;
    }
    handled.insert(req.id.clone());
    let active = host.set(|st| st.role == Some(Role::Active));
    if !active {
        refuse(
            store,
            lock,
            &req.id,
            "this node no longer holds the lock",
            timeout,
        )
        .await;
        return true;
    }
    if req.delay_ms == 0 {
        return start_switchover(host, req, inject);
    }
    // Scheduled: wait beside the feed (a pause meanwhile still gets
    // through), then act only if the request is still there.
    tracing::info!(to = ?req.to, delay_ms = req.delay_ms, "switchover scheduled");
    let (host, store, lock, req, inject) = (
        host.clone(),
        store.clone(),
        lock.clone(),
        req.clone(),
        inject.clone(),
    );
    tokio::spawn(
        async move {
            tokio::time::sleep(Duration::from_millis(req.delay_ms)).await;
            let still = match read(&store, &lock, timeout).await {
                Ok((_, rec)) => rec.switchover.is_some_and(|r| r.id == req.id),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot re-read the scheduled switchover; not acting");
                    false
                }
            };
            if still {
                start_switchover(&host, &req, &inject);
            } else {
                tracing::info!("the scheduled switchover was withdrawn");
            }
        }
        .in_current_span(),
    );
    true
}

/// Hands request `req` to the core; `false` once the agent is gone.
fn start_switchover(
    host: &AgentHost,
    req: &SwitchoverRequest,
    inject: &driver::InputSender,
) -> bool {
    host.set(|st| st.switchover = Some(req.id.clone()));
    tracing::info!(to = ?req.to, by = %req.by, "switchover requested");
    inject
        .unbounded_send(Input::Switchover {
            to: req.to.clone(),
            allow_lag: req.allow_lag,
        })
        .is_ok()
}

/// Writes a refusal into switchover request `id`, if it is still there.
pub(super) async fn refuse(store: &AnyStore, lock: &Name, id: &str, why: &str, timeout: Duration) {
    let result = modify(store, lock, timeout, |rec| {
        if let Some(req) = rec.switchover.as_mut().filter(|r| r.id == id) {
            req.refused = Some(why.to_owned());
        }
    })
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not report the switchover refusal");
    }
}
