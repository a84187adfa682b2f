//! Once per period (`--once-per`): the period on the store's clock, the
//! `once.<name>` record, claiming a period before the run (`at-most`) and
//! recording a run before the release (`at-least`).

use super::shared::Shared;
use super::*;

/// The once-per-period record, `once.<name>`: the period last used — a
/// successful run (`done`, `--once-mode at-least`) or a run claimed before
/// it started (`started`, `--once-mode at-most`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnceRecord {
    /// Format version (1).
    pub v: u32,
    /// The period's key: for [`Once::Every`] its start and length on the
    /// store's clock, e.g. `2026-01-01T00:00:00Z/1day`; for [`Once::Key`]
    /// the caller's key.
    pub period: String,
    /// The node id of the host that ran CMD (or claimed the period).
    pub node: String,
    /// The fencing token of the hold CMD ran (or was claimed) under.
    pub token: Token,
    /// When it finished (`done`) or was claimed (`started`), RFC 3339 UTC
    /// on the store's clock.
    pub at: String,
    /// `done` (recorded after a successful run) or `started` (claimed
    /// before the run). Records without it are `done`.
    #[serde(default)]
    pub state: OnceState,
    /// The write's unique id: tells a writer whose outcome was unknown
    /// whether its write landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<String>,
}

/// The state of a [`OnceRecord`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnceState {
    /// CMD ran and exited 0 (`--once-mode at-least`).
    #[default]
    Done,
    /// The period was claimed before CMD started (`--once-mode at-most`).
    Started,
}

impl OnceRecord {
    /// Who used the period, for messages: "node at time (token …)".
    fn by(&self) -> String {
        match self.state {
            OnceState::Done => format!("{} at {} (token {})", self.node, self.at, self.token),
            OnceState::Started => format!(
                "{}, started at {} (token {}, claimed at most once: whether it succeeded is \
                 not recorded)",
                self.node, self.at, self.token
            ),
        }
    }
}

/// The current period's key for `once`, on the store's clock. Unknown
/// outcomes are retried until `give_up` (a busy store is no reason to
/// fail); a store that stays unreachable is an error, never a fall-back to
/// this host's clock (which may be off, and would put the run in another
/// period).
pub async fn period_key(
    store: &AnyStore,
    once: &Once,
    node: &NodeId,
    timeout: Duration,
    give_up: tokio::time::Instant,
) -> Result<String, StoreError> {
    Ok(match once {
        Once::Key(k) => k.clone(),
        Once::Every(every) => {
            let now = store_wall_clock(store, node, timeout, give_up).await?;
            let secs = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            let len = every.as_secs().max(1);
            let start = SystemTime::UNIX_EPOCH + Duration::from_secs(secs - secs % len);
            format!(
                "{}/{}",
                humantime::format_rfc3339_seconds(start),
                humantime::format_duration(*every)
            )
        }
    })
}

/// The store's wall clock: a NATS bucket's timestamps are its stream
/// leader's UTC clock (read back from a probe write, an unconditional put
/// that may simply be repeated); the embedded stores live on this machine,
/// whose clock is theirs.
pub(super) async fn store_wall_clock(
    store: &AnyStore,
    node: &NodeId,
    timeout: Duration,
    give_up: tokio::time::Instant,
) -> Result<SystemTime, StoreError> {
    let AnyStore::Nats(_) = store else {
        return Ok(SystemTime::now());
    };
    let key = keys::probe(node);
    let probe = br#"{"v":1,"node":"once","write":"once"}"#;
    let written = patiently(give_up, timeout, |t| store.put(&key, probe, t)).await?;
    let read = patiently(give_up, timeout, |t| store.get(&key, ReadMode::Leader, t)).await?;
    match read {
        // Our probe, or a later one of ours: its time is the store's.
        Some(e) if e.token >= written => {
            Ok(SystemTime::UNIX_EPOCH + Duration::from_nanos(e.time.nanos))
        }
        _ => Err(StoreError::timed_out(crate::store::Op::Get, &key, timeout)),
    }
}

/// The recorded run of `name` in `period`, if any: "node at time".
pub async fn done_in(
    store: &AnyStore,
    name: &Name,
    period: &str,
    timeout: Duration,
) -> Result<Option<String>, StoreError> {
    let key = keys::once(name);
    Ok(store
        .get(&key, ReadMode::Leader, timeout)
        .await?
        .and_then(|e| serde_json::from_slice::<OnceRecord>(&e.value).ok())
        // A record of another version is not understood: no recorded run,
        // as for one that does not parse.
        .filter(|r| r.v == 1 && r.period == period)
        .map(|r| r.by()))
}

/// A fresh once-per record of ours for `period`, and its write id.
pub(super) async fn once_record(
    shared: &Shared,
    period: &str,
    token: Token,
    state: OnceState,
    timeout: Duration,
) -> (Vec<u8>, String) {
    let o = &shared.opts;
    // When it ran, for people: the store's clock if it answers at once,
    // else this host's (the period itself never falls back).
    let give_up = tokio::time::Instant::now() + timeout;
    let when = store_wall_clock(&shared.store, &o.node, timeout, give_up)
        .await
        .unwrap_or_else(|_| SystemTime::now());
    let at = humantime::format_rfc3339_seconds(when).to_string();
    let write = crate::identity::instance_id();
    let record = OnceRecord {
        v: 1,
        period: period.to_owned(),
        node: o.node.to_string(),
        token,
        at,
        state,
        write: Some(write.clone()),
    };
    (serde_json::to_vec(&record).expect("serialises"), write)
}

/// `--once-mode at-most`: claims `period` in the once-per record before CMD
/// starts. `Ok(None)` when the claim is ours and known to have landed (CMD
/// may start), `Ok(Some(by))` when the period is used already.
///
/// The claim is a compare-and-swap on the record's revision as read (a
/// create when absent), so of any number of claimers of a period — even a
/// former holder whose write arrives late — exactly one succeeds. A write
/// whose outcome is unknown is resolved by reading the record back: our
/// write id means it landed; the revision we expected means it did not, and
/// it is tried again with back-off; anything else is someone else's. After
/// `until` the error is returned and CMD is not started.
pub(super) async fn claim_period(
    shared: &Shared,
    period: &str,
    token: Token,
    until: tokio::time::Instant,
) -> Result<Option<String>, StoreError> {
    let o = &shared.opts;
    let store = &shared.store;
    let timeout = o.timing.store_timeout();
    let key = keys::once(&o.name);
    let (value, write) = once_record(shared, period, token, OnceState::Started, timeout).await;
    let mut pause = Duration::from_millis(50);
    loop {
        let current = patiently(until, timeout, |t| store.get(&key, ReadMode::Leader, t)).await?;
        let expected = match current {
            Some(e) => match serde_json::from_slice::<OnceRecord>(&e.value) {
                Ok(r) if r.write.as_deref() == Some(write.as_str()) => return Ok(None),
                Ok(r) if r.period == period => return Ok(Some(r.by())),
                // Another period's record, or one putex cannot read: ours
                // replaces it.
                _ => Some(e.token),
            },
            None => None,
        };
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let t = timeout.min(left).max(Duration::from_millis(100));
        let written = match expected {
            Some(rev) => store.update(&key, &value, rev, t).await,
            None => store.create(&key, &value, t).await,
        };
        match written {
            Ok(_) => return Ok(None),
            // Someone else's write came first (or ours, unheard): read.
            Err(StoreError::Conflict { .. }) => {}
            Err(e @ StoreError::Unknown { .. }) => {
                if tokio::time::Instant::now() + pause >= until {
                    return Err(e);
                }
                tracing::warn!(error = %e, "claiming the period: outcome unknown; reading it back");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// `--once-mode at-least`: records a successful run in the once-per record,
/// while the lock is still held (the graceful stop comes before the
/// release), for the period the run started in. A write whose outcome is
/// unknown is resolved by reading the record back (our write id means it
/// landed) and retried with back-off while the stop's deadline allows.
pub(super) async fn record_once(shared: &Shared, deadline: Instant) {
    let o = &shared.opts;
    if o.once.is_none() || o.once_mode != OnceMode::AtLeast {
        return;
    }
    // The token CMD was spawned with: `spawning` too, since on a busy
    // machine CMD can exit (and this stop run) before the activation
    // hears that the spawn succeeded.
    let (exit, token, period) =
        shared.with(|s| (s.exit, s.spawned.or(s.spawning), s.period.clone()));
    let (Some(exit), Some(token), Some(period)) = (exit, token, period.clone()) else {
        tracing::debug!(?exit, ?token, ?period, "no run to record");
        return;
    };
    if exit.code != Some(0) {
        tracing::debug!(?exit, "the run failed: not recorded");
        return;
    }
    tracing::debug!(%period, %token, "recording the run");
    let timeout = o.timing.store_timeout();
    let (value, write) = once_record(shared, &period, token, OnceState::Done, timeout).await;
    let key = keys::once(&o.name);
    let mut pause = Duration::from_millis(50);
    loop {
        let e = match shared.store.put(&key, &value, timeout).await {
            Ok(_) => return,
            Err(e) => e,
        };
        if let Ok(Some(entry)) = shared.store.get(&key, ReadMode::Leader, timeout).await {
            let landed = serde_json::from_slice::<OnceRecord>(&entry.value)
                .is_ok_and(|r| r.write.as_deref() == Some(write.as_str()));
            if landed {
                return;
            }
        }
        if matches!(e, StoreError::Config { .. }) || clock::until(deadline) <= timeout + pause {
            tracing::error!(
                error = %e,
                "could not record the successful run: another host may run it again this \
                 period"
            );
            return;
        }
        tracing::warn!(error = %e, "recording the run failed; retrying");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
