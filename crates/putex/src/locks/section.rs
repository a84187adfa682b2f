//! Critical sections: a command that runs only while a lock is held, and is
//! stopped — with everything it started — before the lock can pass on.
//!
//! This is `putex lock NAME -- CMD` as a library. [`run`] holds the lock by
//! the agent's own rules (the core [`Agent`] through the [`driver`], H1–H6
//! and S1–S7), so a critical section is exactly as safe as a failover
//! service:
//!
//! - CMD is spawned by a **keeper** ([`crate::supervision::keeper`]) armed with the
//!   licence deadline: if this process stalls (SIGSTOP) or dies (SIGKILL),
//!   the keeper kills CMD's whole tree (cgroup scope or subreaper) at the
//!   deadline, before a taker's staleness wait W can end;
//! - when the lock is lost (another holder, revocation, licence ended) CMD's
//!   tree is stopped at once (emergency stop) and [`Outcome::Lost`] is
//!   returned;
//! - when CMD exits, what is left of its tree is stopped too (a graceful
//!   stop), and only then is `released` written (H6): the next waiter starts
//!   within a few store round trips (S3);
//! - `max_duration` stops a CMD that runs too long, so a hung job cannot
//!   hold the lock forever by being renewed.
//!
//! **Semaphores** (`limit` N > 1) are N ordinary locks, the slots
//! `sem.<name>.0` … `sem.<name>.<N−1>`. Every name's limit (1 for a plain
//! lock) is recorded in `sem.<name>` by its first client's create, so that
//! of clients disagreeing on N the first definition wins and the others
//! are refused ([`targets`]). One agent
//! runs per slot; the first to arm the keeper wins, and CMD runs under that
//! slot alone. A slot that another agent of ours took at the same moment is
//! released at once.
//!
//! **Waiting** is watch-driven: a release reaches the waiters as a watch
//! event, and the first waiter in the fair queue ([`crate::locks::queue`]) takes
//! it within milliseconds. A semaphore of N slots admits the first N
//! waiters of its queue at once, so N run at the same time.
//!
//! **Once per period** (`once`): before waiting, and again once the lock is
//! held, the `once.<name>` record is read; if it records a run in the
//! current period (UTC on the store's clock, or an explicit key) CMD is not
//! run ([`Outcome::AlreadyDone`]). With [`OnceMode::AtLeast`] a successful
//! run is recorded while the lock is still held, just before the release,
//! so the next holder sees it — unless the lock is lost in between, when it
//! runs CMD again. With [`OnceMode::AtMost`] the period is claimed by a
//! compare-and-swap before CMD starts, so CMD never starts twice in a
//! period.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::{self, BoxFuture, FutureExt};
use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;
use putex_core::{
    Agent, AgentConfig, Event, HealthMode, Identity, Input, Instant, KeeperCommand, LockState,
    Observed, Reason, Role, StopKind, Timing, Token,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Notify};

use crate::clock;
use crate::driver::{self, Host, Keys};
use crate::locks::queue::{Ticket, Waiter};
use crate::observe::history::{HistoryWriter, TransitionRecord, WriterConfig};
use crate::store::{keys, AnyStore, ReadMode, Store, StoreError};
use crate::supervision::keeper::{KeeperClient, KeeperConfig, KeeperEvent};
use crate::supervision::keeper_queue::KeeperQueue;
use crate::supervision::process::Exit;

/// How long to wait for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until it is acquired.
    Forever,
    /// At most this long; an acquisition already under way (the fencing gap
    /// of a takeover) is finished.
    For(Duration),
    /// Only if it is free now: held by another, or others queue for it, is
    /// [`Outcome::NotAcquired`] at once.
    No,
}

/// Run once per period across all hosts ([`OnceMode`] says what "once" means).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Once {
    /// Periods of this length aligned to the Unix epoch in UTC on the
    /// store's clock: `24h` is once per UTC day.
    Every(Duration),
    /// An explicit period key (e.g. a date the caller computed).
    Key(String),
}

/// When a run is recorded, and so what `once` guarantees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnceMode {
    /// Record after CMD exits 0, while the lock is still held (the
    /// default): a period is never left without a successful run while
    /// hosts keep trying, but the lock lost between the run and its record
    /// (or CMD stopped half-way because the lock was lost) lets another host
    /// run CMD again in the same period.
    #[default]
    AtLeast,
    /// Claim the period before CMD starts, with a compare-and-swap on the
    /// record, and start CMD only once the claim is known to have landed:
    /// CMD is never started twice in a period, but a run that fails, is
    /// killed or loses the lock uses up the period.
    AtMost,
}

impl OnceMode {
    /// The flag's value (`at-least`, `at-most`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnceMode::AtLeast => "at-least",
            OnceMode::AtMost => "at-most",
        }
    }
}

/// What to run and how.
#[derive(Clone, Debug)]
pub struct SectionOptions {
    /// The lock (or semaphore) name.
    pub name: String,
    /// This node's id.
    pub node: String,
    /// A stable id of the store (URL without secrets), for host-local files.
    pub store_id: String,
    /// Validated timing (R, F, C, ε, timeouts).
    pub timing: Timing,
    /// 1 for a plain lock, N > 1 for a semaphore of N slots.
    pub limit: u32,
    /// How long to wait.
    pub wait: Wait,
    /// Once per period.
    pub once: Option<Once>,
    /// When a run counts for `once`.
    pub once_mode: OnceMode,
    /// Stop CMD when it runs longer than this.
    pub max_duration: Option<Duration>,
    /// What the lock is held for, shown to operators and given to CMD as
    /// `PUTEX_TITLE`.
    pub title: Option<String>,
    /// CMD and its arguments (executed directly, not through a shell).
    pub argv: Vec<String>,
    /// More environment for CMD.
    pub env: Vec<(String, String)>,
    /// Where keeper sockets and the highest-token files live.
    pub keeper_dir: PathBuf,
    /// Use a cgroup scope for CMD when possible.
    pub cgroup: bool,
    /// Wait in the fair queue of `name` ([`crate::locks::queue`]).
    pub queue: bool,
    /// Explicit lock keys to compete for, instead of `lock.<name>` or the
    /// semaphore's slots (leased ids: `id.<pool>.<n>`).
    pub slots: Option<Slots>,
}

/// Explicit lock keys for [`SectionOptions::slots`]: CMD runs under one of
/// them and gets `var` = that slot's value.
#[derive(Clone, Debug)]
pub struct Slots {
    /// The lock keys.
    pub keys: Vec<String>,
    /// The environment variable naming the slot (e.g. `PUTEX_ID`).
    pub var: String,
    /// Its value for each key.
    pub values: Vec<String>,
}

/// How a critical section ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// CMD ran and exited; the lock was released if `released`.
    Finished {
        /// CMD's exit status.
        exit: Exit,
        /// The fencing token CMD ran under.
        token: Token,
        /// Whether a `released` record was written.
        released: bool,
    },
    /// The lock was not acquired (`Wait::No`, or the wait ran out).
    NotAcquired {
        /// Who held it, if known.
        holder: Option<String>,
    },
    /// CMD already ran successfully in this period.
    AlreadyDone {
        /// The period key.
        period: String,
        /// Who ran it, and when.
        by: String,
    },
    /// The lock was lost while CMD ran; CMD and its tree were stopped.
    Lost {
        /// Why.
        reason: String,
    },
    /// CMD ran longer than `max_duration` and was stopped.
    TimedOut {
        /// The limit.
        after: Duration,
        /// Whether a `released` record was written.
        released: bool,
    },
    /// A signal ended the wait before the lock was acquired.
    Interrupted {
        /// The signal number.
        signal: i32,
    },
    /// A stop could not be proven: CMD's tree may still run.
    StopUnproven,
}

/// Why a critical section could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SectionError {
    /// A name or limit is wrong.
    #[error("{0}")]
    Usage(String),
    /// The store failed in a way retrying will not fix, or did not answer.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The keeper could not be started.
    #[error("keeper: {0}")]
    Keeper(String),
}

/// The semaphore limit record, `sem.<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreRecord {
    /// Format version (1).
    pub v: u32,
    /// N: how many may hold the semaphore at once.
    pub limit: u32,
}

/// The once-per-period record, `once.<name>`: the period last used — a
/// successful run (`done`, `--once-mode at-least`) or a run claimed before
/// it started (`started`, `--once-mode at-most`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnceRecord {
    /// Format version (1).
    pub v: u32,
    /// The period it ran in.
    pub period: String,
    /// The node that ran it.
    pub node: String,
    /// The fencing token it ran under.
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
                "{}, started at {} (token {}, --once-mode at-most: whether it succeeded is \
                 not recorded)",
                self.node, self.at, self.token
            ),
        }
    }
}

/// How long `Wait::No` may take to acquire a lock it saw free.
const NO_WAIT_GRACE: Duration = Duration::from_secs(5);

/// How long a section that waits for the lock forever keeps retrying the
/// store calls before its wait (the limit record, the once-per record) while
/// their outcome is unknown: longer than a NATS stream-leader election
/// (4–9 s). `--wait DUR` retries for DUR, `--no-wait` for `NO_WAIT_GRACE`.
const SETUP_PATIENCE: Duration = Duration::from_secs(30);

/// The largest `--limit`: each slot is watched and polled by its own agent.
pub const MAX_LIMIT: u32 = 64;

/// Retries `call` while its outcome is unknown (a timeout or a lost
/// connection: the store may be busy or electing a leader), with back-off,
/// until `deadline`; each attempt's deadline is at most `timeout` and never
/// past `deadline`. A conflict, a configuration error or the last unknown
/// outcome is returned. Only for calls that may simply be repeated (reads);
/// a write must first find out by reading whether it landed.
async fn patiently<T, F, Fut>(
    deadline: tokio::time::Instant,
    timeout: Duration,
    mut call: F,
) -> Result<T, StoreError>
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut pause = Duration::from_millis(50);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match call(timeout.min(left).max(Duration::from_millis(100))).await {
            Err(e @ StoreError::Unknown { .. })
                if tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %e, "outcome unknown; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// The message refusing a client whose `--limit` is not the name's.
fn limit_mismatch(name: &str, key: &str, defined: u32, ours: u32) -> SectionError {
    let is = if defined == 1 {
        format!("a plain lock (--limit 1, record {key})")
    } else {
        format!("a semaphore with --limit {defined} (record {key})")
    };
    SectionError::Usage(format!(
        "{name:?} is {is}, but this client has --limit {ours}: every client of a name must \
         use the same --limit (or another name)"
    ))
}

/// The lock keys a section competes for: `lock.<name>`, or the semaphore's
/// slots, once the name's limit is known to be `limit`.
///
/// The limit of every name `putex lock` uses — 1 for a plain lock — is
/// recorded in `sem.<name>` by the first client, with a create: of clients
/// that disagree, exactly one create lands, and every other client finds
/// that definition and is refused. Nothing is checked and then acted on:
/// the record is written only by a create and never changed or deleted by
/// putex, so what a client finds is what every other client finds. A name
/// used as a plain lock before its limit was recorded (by an older putex, or
/// by `putex run --lock`) keeps being one: a semaphore is refused on it.
///
/// Unknown outcomes are resolved by reading, and retried with back-off
/// until `deadline`.
pub async fn targets(
    store: &AnyStore,
    name: &str,
    limit: u32,
    timeout: Duration,
    deadline: tokio::time::Instant,
) -> Result<Vec<String>, SectionError> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(SectionError::Usage(format!(
            "--limit must be between 1 and {MAX_LIMIT} (got {limit})"
        )));
    }
    let bad = |e: keys::NameError| SectionError::Usage(e.to_string());
    let sem_key = keys::semaphore(name).map_err(bad)?;
    let lock_key = keys::lock(name).map_err(bad)?;
    if limit > 1 {
        let entry = patiently(deadline, timeout, |t| {
            store.get(&lock_key, ReadMode::Any, t)
        })
        .await?;
        if let Some(entry) = entry {
            let holder = match Observed::decode(&entry.value) {
                Observed::Record(r) => format!(", last holder {}", r.node),
                Observed::Garbage => String::new(),
            };
            return Err(SectionError::Usage(format!(
                "{name:?} is a plain lock (--limit 1, record {lock_key}{holder}), but this \
                 client has --limit {limit}: every client of a name must use the same --limit \
                 (or another name)"
            )));
        }
    }
    let defined = define_limit(store, &sem_key, limit, timeout, deadline).await?;
    if defined != limit {
        return Err(limit_mismatch(name, &sem_key, defined, limit));
    }
    if limit == 1 {
        return Ok(vec![lock_key]);
    }
    (0..limit)
        .map(|i| keys::slot(name, i).map_err(bad))
        .collect()
}

/// The limit recorded in `sem_key`, recording `limit` there first if the
/// record is absent: an exclusive create, so the first definition wins.
/// Every client writes the same bytes for the same limit, so a create whose
/// outcome is unknown is resolved by reading the record back: whoever wrote
/// what is found, it is the definition.
async fn define_limit(
    store: &AnyStore,
    sem_key: &str,
    limit: u32,
    timeout: Duration,
    deadline: tokio::time::Instant,
) -> Result<u32, SectionError> {
    let parse = |e: crate::store::Entry| match serde_json::from_slice::<SemaphoreRecord>(&e.value) {
        Ok(r) if r.v == 1 && (1..=MAX_LIMIT).contains(&r.limit) => Ok(r.limit),
        _ => Err(SectionError::Usage(format!(
            "the limit record {sem_key} holds something putex does not understand \
             ({} bytes); fix or remove it",
            e.value.len()
        ))),
    };
    let record = serde_json::to_vec(&SemaphoreRecord { v: 1, limit }).expect("serialises");
    let mut pause = Duration::from_millis(50);
    loop {
        // Read first: after the first use of a name, no write at all.
        let read = |t| store.get(sem_key, ReadMode::Leader, t);
        if let Some(e) = patiently(deadline, timeout, read).await? {
            return parse(e);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match store
            .create(
                sem_key,
                &record,
                timeout.min(left).max(Duration::from_millis(100)),
            )
            .await
        {
            Ok(_) => return Ok(limit),
            // Someone else's definition (or ours, landed unheard): read it.
            Err(StoreError::Conflict { .. }) => {}
            Err(e @ StoreError::Unknown { .. }) => {
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(e.into());
                }
                tracing::debug!(error = %e, "recording the limit: outcome unknown; reading it back");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e.into()),
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
    node: &str,
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
async fn store_wall_clock(
    store: &AnyStore,
    node: &str,
    timeout: Duration,
    give_up: tokio::time::Instant,
) -> Result<SystemTime, StoreError> {
    let AnyStore::Nats(_) = store else {
        return Ok(SystemTime::now());
    };
    let key = keys::probe(node)?;
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
    name: &str,
    period: &str,
    timeout: Duration,
) -> Result<Option<String>, StoreError> {
    let key = keys::once(name)?;
    Ok(store
        .get(&key, ReadMode::Leader, timeout)
        .await?
        .and_then(|e| serde_json::from_slice::<OnceRecord>(&e.value).ok())
        // A record of another version is not understood: no recorded run,
        // as for one that does not parse.
        .filter(|r| r.v == 1 && r.period == period)
        .map(|r| r.by()))
}

/// A file beside the keeper sockets holding the highest fencing token this
/// host has seen for one key (S6), shared by every `putex lock` process on
/// the host: raised under `flock`, never lowered.
#[derive(Clone, Debug)]
pub struct HighestFile {
    path: PathBuf,
}

impl HighestFile {
    /// The file for `key` of store `store_id` in `dir`.
    pub fn new(dir: &Path, store_id: &str, key: &str) -> HighestFile {
        let sock = crate::supervision::keeper::socket_path(dir, store_id, key);
        HighestFile {
            path: sock.with_extension("highest"),
        }
    }

    /// The highest token recorded, if any.
    pub fn load(&self) -> Option<Token> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Records `token` if it is higher than what the file holds.
    pub fn raise(&self, token: Token) -> std::io::Result<()> {
        use std::io::{Read, Seek, Write};
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)?;
        let mut f = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e)?;
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let current: Option<Token> = serde_json::from_str(&text).ok();
        if current.is_some_and(|c| c >= token) {
            return Ok(());
        }
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(&serde_json::to_vec(&token).expect("a token serialises"))?;
        f.sync_data()
    }
}

// ---------------------------------------------------------------------------
// The host: one per slot agent, sharing one keeper and one CMD.

/// What the slot agents share.
#[derive(Default)]
struct State {
    /// The slot whose agent armed the keeper first: CMD runs under it.
    winner: Option<usize>,
    /// The winner's activation began: CMD may be running from then on, so
    /// the winner is never handed to another slot.
    activating: bool,
    /// The winner's token once CMD was spawned.
    spawned: Option<Token>,
    /// When CMD was spawned (for `max_duration`).
    spawned_at: Option<tokio::time::Instant>,
    /// CMD's exit.
    exit: Option<Exit>,
    /// The winner's tenure ended without our asking.
    lost: Option<String>,
    /// The winner's release was written.
    released: bool,
    /// CMD was not run: it already ran in this period.
    already_done: Option<(String, String)>,
    /// The once-per period CMD runs in (read at activation: a run that
    /// crosses into the next period is recorded for the one it started in).
    period: Option<String>,
    /// The once-per record could not be read or claimed in time: CMD was
    /// not run.
    once_failed: Option<StoreError>,
    /// A spawn failed.
    spawn_failed: Option<String>,
    /// Slots whose agent must stop (lost the race for CMD).
    losers: Vec<usize>,
}

struct Shared {
    opts: SectionOptions,
    store: AnyStore,
    keeper: Arc<KeeperClient>,
    ops: KeeperQueue,
    state: Mutex<State>,
    changed: Notify,
    /// The winner's transition records (`putex history`).
    history: HistoryWriter,
}

impl Shared {
    /// Changes the state and wakes the section's loop.
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.notify_one();
        r
    }

    /// The state, for the section's loop (no wake-up).
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    fn is_winner(&self, slot: usize) -> bool {
        self.lock().winner == Some(slot)
    }
}

struct SlotHost {
    slot: usize,
    shared: Arc<Shared>,
    highest: HighestFile,
    /// The slot's lock key for its transition records, when it is not
    /// `lock.<name>` (a semaphore slot).
    record_key: Option<String>,
    /// Transition records made before any slot won: written if this slot
    /// wins (arms the keeper first), dropped otherwise.
    pending: Mutex<Vec<TransitionRecord>>,
}

impl SlotHost {
    /// Writes the winner's transition records; keeps them while no slot
    /// has won yet.
    fn record(&self, from: Role, to: Role, reason: &Reason, token: Option<Token>) {
        let Some(rec) =
            self.shared
                .history
                .record(from, to, reason, token, self.record_key.as_deref())
        else {
            return;
        };
        let winner = self.shared.lock().winner;
        let mut pending = self.pending.lock();
        match winner {
            Some(w) if w == self.slot => self.shared.history.send(rec),
            Some(_) => pending.clear(),
            // Back to standby before winning: nothing ran under this slot.
            None if to == Role::Standby => pending.clear(),
            None => pending.push(rec),
        }
    }
}

impl Host for SlotHost {
    fn health_check(&self, _: HealthMode, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(
        &self,
        token: Token,
        previous: Option<String>,
        deadline: Instant,
    ) -> BoxFuture<'static, bool> {
        if !self.shared.is_winner(self.slot) {
            // Another slot of ours runs CMD: fail the activation, which
            // releases this slot (step-down, H6), and stop this agent.
            self.shared.with(|s| s.losers.push(self.slot));
            return future::ready(false).boxed();
        }
        self.shared.with(|s| s.activating = true);
        let shared = self.shared.clone();
        let slot = self.slot;
        async move {
            let o = &shared.opts;
            let timeout = o.timing.store_timeout();
            if let Some(once) = &o.once {
                // Store calls whose outcome is unknown are retried until
                // then, leaving time to start CMD.
                let left = clock::until(deadline);
                let until = tokio::time::Instant::now() + left - (left / 4).min(Duration::from_secs(5));
                let period = match period_key(&shared.store, once, &o.node, timeout, until).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the store's clock for --once-per; not running");
                        shared.with(|s| s.spawn_failed = Some(format!("once-per period: {e}")));
                        return false;
                    }
                };
                let checked = match o.once_mode {
                    OnceMode::AtLeast => {
                        patiently(until, timeout, |t| done_in(&shared.store, &o.name, &period, t))
                            .await
                    }
                    OnceMode::AtMost => claim_period(&shared, &period, token, until).await,
                };
                match checked {
                    Ok(Some(by)) => {
                        shared.with(|s| s.already_done = Some((period, by)));
                        return false;
                    }
                    Ok(None) => shared.with(|s| s.period = Some(period)),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read or claim the once-per record; not running");
                        shared.with(|s| s.once_failed = Some(e));
                        return false;
                    }
                }
            }
            let mut env = vec![
                ("PUTEX_LOCK".to_string(), o.name.clone()),
                ("PUTEX_NODE".to_string(), o.node.clone()),
                ("PUTEX_TOKEN".to_string(), token.to_string()),
                ("PUTEX_REVISION".to_string(), token.revision.to_string()),
                ("PUTEX_EPOCH".to_string(), token.epoch.to_string()),
            ];
            if let Some(slots) = &o.slots {
                env.push((slots.var.clone(), slots.values[slot].clone()));
            } else if o.limit > 1 {
                env.push(("PUTEX_SLOT".into(), slot.to_string()));
            }
            if let Some(p) = previous {
                env.push(("PUTEX_PREVIOUS".into(), p));
            }
            if let Some(t) = &o.title {
                env.push(("PUTEX_TITLE".into(), t.clone()));
            }
            env.extend(o.env.iter().cloned());
            let spawned = shared
                .ops
                .spawn_child(o.argv.clone(), env, Box::new(|| true));
            let result = tokio::time::timeout(clock::until(deadline), spawned).await;
            match result {
                Ok(Ok((pid, tree))) => {
                    tracing::debug!(pid, ?tree, "command started");
                    shared.with(|s| {
                        s.spawned = Some(token);
                        s.spawned_at = Some(tokio::time::Instant::now());
                    });
                    true
                }
                Ok(Err(e)) => {
                    shared.with(|s| s.spawn_failed = Some(e));
                    false
                }
                _ => {
                    shared.with(|s| s.spawn_failed = Some("the keeper did not answer".into()));
                    false
                }
            }
        }
        .boxed()
    }

    fn stop(&self, kind: StopKind, deadline: Instant) -> BoxFuture<'static, bool> {
        // Start-up stops: the keeper is new, nothing runs. A slot that did
        // not win never ran anything.
        if kind == StopKind::Startup || !self.shared.is_winner(self.slot) {
            return future::ready(true).boxed();
        }
        let shared = self.shared.clone();
        async move {
            let work = async {
                shared.ops.barrier().await;
                match shared.keeper.stop(kind).await {
                    Ok(ok) => ok,
                    // The keeper died (OOM): stop CMD's tree without it,
                    // from the keeper's last snapshot, and prove it gone.
                    // The lock is kept (renewed) until then.
                    Err(crate::supervision::keeper::KeeperError::Lost) => {
                        tracing::error!("the keeper is gone: stopping the command without it");
                        shared
                            .keeper
                            .stop_tree_without_keeper(clock::until(deadline))
                            .await
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the keeper could not stop the command");
                        false
                    }
                }
            };
            let limit = clock::until(deadline) + Duration::from_millis(100);
            let ok = tokio::time::timeout(limit, work).await.unwrap_or(false);
            if ok && kind == StopKind::Graceful {
                record_once(&shared, deadline).await;
            }
            ok
        }
        .boxed()
    }

    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool> {
        let forward = self.shared.with(|s| match (command, s.winner) {
            (KeeperCommand::Arm(_), None) => {
                s.winner = Some(self.slot);
                true
            }
            (_, Some(w)) => w == self.slot,
            (_, None) => false,
        });
        let answer = if forward {
            self.shared.ops.command(command, None, None).boxed()
        } else {
            // Another slot of ours won: this one's activation fails and
            // releases the slot (see `activate`); its keeper is the
            // winner's.
            future::ready(true).boxed()
        };
        if matches!(command, KeeperCommand::Arm(_)) && self.shared.is_winner(self.slot) {
            let won = std::mem::take(&mut *self.pending.lock());
            for rec in won {
                self.shared.history.send(rec);
            }
        }
        answer
    }

    fn persist_highest(&self, token: Token) {
        let file = self.highest.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = file.raise(token) {
                tracing::warn!(path = %file.path.display(), error = %e, "cannot record the highest token");
            }
        });
    }

    fn event(&self, event: &Event) {
        match event {
            Event::Transition {
                from,
                to,
                reason,
                token,
            } => {
                tracing::debug!(slot = self.slot, %from, %to, %reason, "transition");
                self.record(*from, *to, reason, *token);
                let winner = self.shared.is_winner(self.slot);
                if !winner {
                    return;
                }
                match (from, to) {
                    (Role::Active | Role::Confirming, Role::Lapsed | Role::Standby) => {
                        let ours = matches!(
                            reason,
                            Reason::Released | Reason::ReleaseFailed | Reason::ActivationFailed
                        ) || matches!(reason, Reason::Shutdown);
                        self.shared.with(|s| {
                            if !s.activating && !ours {
                                // Lost before activating (the fencing gap):
                                // nothing ran; let any slot try again.
                                tracing::info!(%reason, "lost the lock before running; waiting again");
                                s.winner = None;
                            } else if !ours && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| reason.to_string());
                            }
                        });
                    }
                    (Role::SteppingDown, Role::Standby | Role::Lapsed) => {
                        self.shared.with(|s| {
                            if matches!(reason, Reason::Released) {
                                s.released = true;
                            } else if !matches!(reason, Reason::ReleaseFailed) && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| reason.to_string());
                            }
                        });
                    }
                    _ => {}
                }
            }
            Event::StoreRegressed { highest, now } => tracing::error!(
                %highest,
                %now,
                "STORE REGRESSED: the lock record's revision went backwards; treating the lock \
                 as absent (S6)"
            ),
            Event::AdvertisedTimingAboveMax(msg) => tracing::warn!("{msg}"),
            Event::StopUnproven {
                kind,
                attempts,
                holding,
            } => {
                crate::observe::metrics::global().stop_unproven(true);
                tracing::error!(
                    slot = self.slot,
                    kind = crate::supervision::hooks::stop_name(*kind),
                    attempts,
                    holding,
                    "STOP UNPROVEN: the command's processes may still run; retrying the kill{}",
                    if *holding {
                        " and keeping the lock"
                    } else {
                        ""
                    }
                )
            }
            Event::StopProven { after } => {
                crate::observe::metrics::global().stop_unproven(false);
                tracing::warn!(
                    slot = self.slot,
                    after,
                    "the command is proven stopped after all"
                );
            }
        }
    }
}

/// A fresh once-per record of ours for `period`, and its write id.
async fn once_record(
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
        node: o.node.clone(),
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
async fn claim_period(
    shared: &Shared,
    period: &str,
    token: Token,
    until: tokio::time::Instant,
) -> Result<Option<String>, StoreError> {
    let o = &shared.opts;
    let store = &shared.store;
    let timeout = o.timing.store_timeout();
    let key = keys::once(&o.name)?;
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
async fn record_once(shared: &Shared, deadline: Instant) {
    let o = &shared.opts;
    if o.once.is_none() || o.once_mode != OnceMode::AtLeast {
        return;
    }
    let (exit, token, period) = shared.with(|s| (s.exit, s.spawned, s.period.clone()));
    let (Some(exit), Some(token), Some(period)) = (exit, token, period) else {
        return;
    };
    if exit.code != Some(0) {
        return;
    }
    let timeout = o.timing.store_timeout();
    let (value, write) = once_record(shared, &period, token, OnceState::Done, timeout).await;
    let Ok(key) = keys::once(&o.name) else { return };
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

// ---------------------------------------------------------------------------
// The section.

/// What a running section needs from its caller besides the options: the
/// signals to forward or to end the wait with.
pub type Signals = mpsc::UnboundedReceiver<i32>;

/// Runs `opts.argv` while holding the lock; see the [module docs](self).
pub async fn run(
    store: AnyStore,
    opts: SectionOptions,
    mut signals: Signals,
) -> Result<Outcome, SectionError> {
    let timing = opts.timing.clone();
    let timeout = timing.store_timeout().max(Duration::from_secs(1));
    // Store calls before waiting whose outcome is unknown are retried until
    // then: a busy store or a leader election does not fail the command.
    let setup_deadline = tokio::time::Instant::now()
        + match opts.wait {
            Wait::For(d) => d,
            Wait::No => NO_WAIT_GRACE,
            Wait::Forever => SETUP_PATIENCE,
        }
        .max(timeout);
    keys::validate_name(&opts.name).map_err(|e| SectionError::Usage(e.to_string()))?;
    let keys = match &opts.slots {
        Some(slots) if slots.keys.is_empty() => {
            return Err(SectionError::Usage("nothing to compete for".into()))
        }
        Some(slots) => slots.keys.clone(),
        None => targets(&store, &opts.name, opts.limit, timeout, setup_deadline).await?,
    };

    // Already done in this period: no need to wait at all.
    if let Some(once) = &opts.once {
        let period = period_key(&store, once, &opts.node, timeout, setup_deadline).await?;
        let done = patiently(setup_deadline, timeout, |t| {
            done_in(&store, &opts.name, &period, t)
        });
        if let Some(by) = done.await? {
            return Ok(Outcome::AlreadyDone { period, by });
        }
    }
    if opts.wait == Wait::No {
        let busy = patiently(setup_deadline, timeout, |t| busy(&store, &keys, t));
        if let Some(holder) = busy.await? {
            return Ok(Outcome::NotAcquired {
                holder: Some(holder),
            });
        }
    }

    // The keeper: one per section, on a socket of its own.
    std::fs::create_dir_all(&opts.keeper_dir).map_err(|e| {
        SectionError::Usage(format!("--keeper-dir {}: {e}", opts.keeper_dir.display()))
    })?;
    let instance = crate::identity::instance_id();
    let short = &instance[..instance.len().min(12)];
    let exe = std::env::current_exe()
        .map_err(|e| SectionError::Keeper(format!("cannot find the putex binary: {e}")))?;
    let (mut keeper, _) = KeeperClient::spawn_or_adopt(&KeeperConfig {
        exe,
        socket: crate::supervision::keeper::socket_path(
            &opts.keeper_dir,
            &opts.store_id,
            &format!("{}-{short}", opts.name),
        ),
        lock: opts.name.clone(),
        node: opts.node.clone(),
        deactivate: None,
        stop_timeout: timing.stop_timeout(),
        emergency_timeout: timing.emergency_timeout(),
        cgroup: opts.cgroup,
        quiet: true,
    })
    .await
    .map_err(|e| SectionError::Keeper(e.to_string()))?;
    let mut keeper_events = keeper.take_events();
    // Set once the keeper is gone: its event channel is read no more.
    let mut keeper_gone = false;
    let keeper = Arc::new(keeper);
    let ops = KeeperQueue::start(keeper.clone());

    let shared = Arc::new(Shared {
        opts: opts.clone(),
        store: store.clone(),
        keeper: keeper.clone(),
        ops,
        state: Mutex::new(State::default()),
        changed: Notify::new(),
        history: HistoryWriter::spawn(
            store.clone(),
            WriterConfig::new(&opts.name, &opts.node, &instance, "lock", timeout),
        ),
    });

    // The fair queue (not for --no-wait, which never waits behind anyone).
    let ticket = if opts.wait == Wait::No || !opts.queue {
        None
    } else {
        let waiter = Waiter {
            name: opts.name.clone(),
            node: opts.node.clone(),
            instance: instance.clone(),
            renew: timing.renew(),
            store_timeout: timing.store_timeout(),
            title: opts.title.clone(),
            asked: None,
            patience: setup_deadline.saturating_duration_since(tokio::time::Instant::now()),
        };
        // One waiter per slot may try at once: with N slots free and N
        // waiters, N run.
        Some(Ticket::join_admitting(store.clone(), waiter, keys.len()).await?)
    };
    let mut queue_turn = ticket.as_ref().map(Ticket::turn);

    // One agent per slot.
    let mut inputs = Vec::new();
    let mut drivers = tokio::task::JoinSet::new();
    for (slot, key) in keys.iter().enumerate() {
        let highest = HighestFile::new(&opts.keeper_dir, &opts.store_id, key);
        let mut agent = Agent::new(
            AgentConfig {
                highest_token: highest.load(),
                supervised_stops: true,
                ..AgentConfig::new(
                    Identity {
                        node: opts.node.clone(),
                        machine: crate::identity::machine_id(),
                        instance: instance.clone(),
                    },
                    timing.clone(),
                )
            },
            clock::boot_time_now(),
        );
        if ticket.is_some() {
            agent.handle(clock::boot_time_now(), Input::Turn(false));
        }
        let host = Arc::new(SlotHost {
            slot,
            shared: shared.clone(),
            highest,
            record_key: keys::lock(&opts.name)
                .map_or(true, |k| k != *key)
                .then(|| key.clone()),
            pending: Mutex::default(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        inputs.push(tx);
        let store = store.clone();
        let probe = keys::probe(&opts.node).map_err(|e| SectionError::Usage(e.to_string()))?;
        let keys = Keys {
            lock: key.clone(),
            probe,
        };
        drivers.spawn(async move {
            let exit =
                driver::run_with_inputs(agent, store, keys, host, future::pending(), rx).await;
            (slot, exit)
        });
    }

    let wait_until = match opts.wait {
        Wait::Forever => None,
        Wait::For(d) => Some(tokio::time::Instant::now() + d),
        // Free a moment ago: a few round trips take it. The limit only
        // matters when another waiter took it in between; it is generous
        // so that a loaded machine still gets the lock it saw free.
        Wait::No => {
            Some(tokio::time::Instant::now() + timing.renew() * 2 + timeout.max(NO_WAIT_GRACE))
        }
    };
    let mut turns_sent: Vec<Option<bool>> = vec![None; keys.len()];
    let mut shutting_down = false;
    let mut interrupted = None;
    let mut not_acquired = false;
    let mut timed_out = false;
    let mut unproven = false;
    let mut stopped: Vec<bool> = vec![false; keys.len()];
    loop {
        // Turns: the queue's, and only the winner's slot once one armed.
        let (winner, losers) = {
            let mut s = shared.lock();
            (s.winner, std::mem::take(&mut s.losers))
        };
        let queue_ok = queue_turn.as_ref().is_none_or(|t| *t.borrow());
        for (slot, tx) in inputs.iter().enumerate() {
            let turn = queue_ok && winner.is_none_or(|w| w == slot) && !shutting_down;
            if turns_sent[slot] != Some(turn) {
                turns_sent[slot] = Some(turn);
                let _ = tx.send(Input::Turn(turn));
            }
        }
        for slot in losers {
            if !stopped[slot] {
                stopped[slot] = true;
                let _ = inputs[slot].send(Input::Shutdown);
            }
        }
        // Finished?
        let (done, spawned_at) = {
            let s = shared.lock();
            (
                s.exit.is_some()
                    || s.lost.is_some()
                    || s.already_done.is_some()
                    || s.once_failed.is_some()
                    || s.spawn_failed.is_some(),
                s.spawned_at,
            )
        };
        let acquiring = winner.is_some();
        if (done || not_acquired || interrupted.is_some() || timed_out) && !shutting_down {
            shutting_down = true;
            for (slot, tx) in inputs.iter().enumerate() {
                stopped[slot] = true;
                let _ = tx.send(Input::Shutdown);
            }
        }
        let max_at = opts.max_duration.zip(spawned_at).map(|(d, at)| at + d);
        tokio::select! {
            () = shared.changed.notified() => {}
            changed = async { queue_turn.as_mut().expect("checked").changed().await }, if queue_turn.is_some() => {
                if changed.is_err() {
                    queue_turn = None;
                }
            }
            ev = keeper_events.recv(), if !keeper_gone => match ev.unwrap_or(KeeperEvent::Lost) {
                KeeperEvent::ChildExited(exit) => {
                    tracing::debug!(?exit, "command exited");
                    shared.with(|s| s.exit = Some(exit));
                }
                KeeperEvent::Tree(_) => {}
                other => {
                    if other == KeeperEvent::Lost {
                        tracing::error!("the keeper is gone: CMD is stopped without it");
                        // CMD ran under a keeper that died: it is stopped
                        // (from the keeper's last tree snapshot) before the
                        // lock is given back, and the section ends as lost.
                        shared.with(|s| {
                            if s.spawned.is_some() && s.exit.is_none() {
                                s.lost.get_or_insert_with(|| Reason::KeeperLost.to_string());
                            }
                        });
                    } else {
                        tracing::error!("the keeper's deadline passed: it stopped the command");
                        // The licence ended with CMD running: whatever exit
                        // the keeper's stop gave CMD (which may have been
                        // read first), the lock was lost (exit 76).
                        shared.with(|s| {
                            s.lost.get_or_insert_with(|| Reason::KeeperFired.to_string());
                        });
                    }
                    if let (Some(w), Some(input)) = (winner, other.to_input()) {
                        let _ = inputs[w].send(input);
                    }
                    if other == KeeperEvent::Lost {
                        // No more events; keep waiting for the drivers.
                        keeper_gone = true;
                    }
                }
            },
            sig = signals.recv() => match sig {
                Some(sig) if spawned_at.is_some() && !shutting_down => {
                    tracing::info!(signal = sig, "forwarding the signal to the command");
                    if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                        let _ = keeper.signal(s).await;
                    }
                }
                Some(sig) => {
                    if interrupted.is_none() && !acquiring {
                        interrupted = Some(sig);
                    } else if !shutting_down {
                        // Taking the lock (the fencing gap): stop trying.
                        interrupted = Some(sig);
                    }
                }
                None => {
                    signals = mpsc::unbounded_channel().1;
                }
            },
            () = sleep_until(wait_until), if !acquiring && !shutting_down => {
                not_acquired = true;
            }
            () = sleep_until(max_at), if max_at.is_some() && !timed_out && !shutting_down => {
                tracing::warn!(after = ?opts.max_duration, "the command ran past --max-duration; stopping it");
                timed_out = true;
            }
            joined = drivers.join_next() => match joined {
                Some(Ok((slot, exit))) => {
                    tracing::debug!(slot, ?exit, "slot agent exited");
                    if !stopped[slot] {
                        // An agent ended on its own (a failed start-up):
                        // end the section.
                        not_acquired = true;
                    }
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "slot agent failed");
                    unproven = true;
                }
                None => break,
            },
        }
    }
    if let Some(t) = ticket {
        t.leave().await;
    }
    let st = std::mem::take(&mut *shared.lock());
    if keeper.shutdown().await.is_err() {
        tracing::debug!("the keeper stays until its tree is gone");
    }
    shared.history.flush(Duration::from_secs(2)).await;
    Ok(if unproven {
        Outcome::StopUnproven
    } else if let Some((period, by)) = st.already_done {
        Outcome::AlreadyDone { period, by }
    } else if let Some(reason) = st.lost {
        Outcome::Lost { reason }
    } else if timed_out && st.spawned.is_some() {
        Outcome::TimedOut {
            after: opts.max_duration.unwrap_or_default(),
            released: st.released,
        }
    } else if let (Some(exit), Some(token)) = (st.exit, st.spawned) {
        Outcome::Finished {
            exit,
            token,
            released: st.released,
        }
    } else if let Some(e) = st.once_failed {
        return Err(SectionError::Store(e));
    } else if let Some(e) = st.spawn_failed {
        return Err(SectionError::Keeper(format!(
            "cannot start the command: {e}"
        )));
    } else if let Some(signal) = interrupted {
        Outcome::Interrupted { signal }
    } else {
        let holder = busy(&store, &keys, timeout).await.ok().flatten();
        Outcome::NotAcquired { holder }
    })
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => future::pending().await,
    }
}

/// For `Wait::No`: who holds the lock (every slot) or queues for it, if
/// anyone; `None` when a slot looks free now.
async fn busy(
    store: &AnyStore,
    keys: &[String],
    timeout: Duration,
) -> Result<Option<String>, StoreError> {
    let mut holder = None;
    for key in keys {
        match store.get(key, ReadMode::Leader, timeout).await? {
            None => return Ok(None),
            Some(e) => match Observed::decode(&e.value) {
                Observed::Record(r) if r.state == LockState::Released => return Ok(None),
                Observed::Record(r) => holder = Some(format!("{} ({:?})", r.node, r.state)),
                Observed::Garbage => holder = Some("an unreadable record".into()),
            },
        }
    }
    Ok(holder)
}
