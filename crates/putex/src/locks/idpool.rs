//! Identity pools (`putex id`): unique small numbers from a range — a
//! snowflake worker id 1..254 per machine, a shard number — claimed
//! atomically and never duplicated.
//!
//! # Guarantees
//!
//! - **Unique.** At any time an id of a pool is held by at most one claim,
//!   also under concurrent claims from many hosts and processes, on every
//!   backend. This rests only on the store's create and compare-and-swap:
//!   an id record becomes a claim by a create (of an id never used) or a
//!   compare-and-swap on the revision of its `released` record, so two
//!   claimers can never both succeed. No decision depends on timing.
//! - **One id per name, idempotent.** A claim is made for a *name* (default:
//!   the hostname) and persists until it is released. Claiming again with
//!   the same name returns the same id; concurrent claims with one name end
//!   with one id, which every caller gets.
//! - **No silent sharing.** A claim records the machine id. A claim with the
//!   same name from another machine (a cloned VM with the same hostname) is
//!   refused, never handed the same id.
//! - **Nothing deleted behind a holder's back.** Release writes `released`
//!   (by the owner) or `revoked` (`--force`, `docs/safety.md` S7) into the id record;
//!   id records are never deleted. `revoked` ids are not handed out again
//!   (their holder may still use them). Unreadable records are treated as
//!   taken and reported by [`check`].
//! - **Crash-safe.** A claim is a sequence of single-record writes (name
//!   record `pending`, id record taken, name record `bound`). A crash between
//!   them leaves records that the next claim with the same name resumes, and
//!   that [`check`] explains.
//!
//! # Records
//!
//! Under the prefix `id.<pool>.` (see [`keys`]):
//!
//! | key | value |
//! |---|---|
//! | `id.<pool>.meta` | the pool's range, fixed by its first claim: `{"v":1,"kind":"meta","pool":…,"first":1,"last":254}` |
//! | `id.<pool>.<n>` | id `n`: a [`LockRecord`] (node = the claim name, machine, instance, state, write id, lease, gap) with the extra fields `pool`, `id` and `kind: "claim"` |
//! | `id.<pool>.name.<name>` | the name's index record ([`NameRecord`]): `pending` while a claim runs, then `bound` to its id |
//! | `id.<pool>.scan` | a marker written by every read of the whole pool (see [`crate::store::snapshot_synced`]) |
//!
//! An id record is an ordinary lock record so that an id can also be held
//! for the duration of a command by the lock state machine on the same key:
//! a persistent claim is `active` with a lease of [`CLAIM_LEASE`] (ten
//! years), so the state machine sees it as held and never stale; a
//! `released` id is free for either kind of claimer.
//!
//! # The claim, step by step
//!
//! 1. Read the name record. Bound to id `n` whose record names us back (same
//!    name, same machine, `active`): that is the answer. Another machine:
//!    refused. Pending: another process is claiming this name; wait for it
//!    (a pending record unchanged for [`Options::pending_takeover`] is taken
//!    over by compare-and-swap).
//! 2. Create the name record `pending` (exclusive), or compare-and-swap it to
//!    `pending` over a broken binding or a stalled pending record.
//! 3. Read the whole pool and take an id: first an id record of ours left by
//!    an interrupted claim, then never-used ids in ascending order, then
//!    `released` ids, oldest first ([`free_candidates`]). Create or
//!    compare-and-swap; on a conflict try the next one, re-reading the pool
//!    after a few conflicts. None left: [`IdError::Exhausted`].
//! 4. Compare-and-swap the name record to `bound` to the id. If someone
//!    changed it meanwhile, give the id back (compare-and-swap to `released`
//!    on our own revision, so an id somebody else took over is never
//!    touched) and start again.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use putex_core::record::{ceil_millis, LockRecord, LockState, Observed, RECORD_VERSION};
use putex_core::store::{Entry, StoreGap, StoreTime, Token};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::identity::instance_id;
use crate::store::{keys, snapshot_synced, ReadMode, Store, StoreError};

/// The lease a persistent claim advertises: ten years. The lock state
/// machine, should it run on the same key, treats the claim as held and
/// never stale.
pub const CLAIM_LEASE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The most ids a pool may hold.
pub const MAX_POOL_SIZE: u64 = 65_536;

/// The `kind` field of a persistent claim's id record.
pub const CLAIM_KIND: &str = "claim";

/// Conflicting writes after which a claimer reads the pool again.
const RESNAPSHOT_AFTER: usize = 4;

/// How often a claimer waiting for a pending claim of its name looks again.
const PENDING_POLL: Duration = Duration::from_millis(50);

/// Attempts of a release that keeps meeting concurrent writes.
const RELEASE_ATTEMPTS: usize = 10;

/// A range of ids, `first..=last`, at most [`MAX_POOL_SIZE`] of them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct IdRange {
    first: u64,
    last: u64,
}

impl IdRange {
    /// The range `first..=last`.
    pub fn new(first: u64, last: u64) -> Result<IdRange, IdError> {
        if first > last {
            return Err(IdError::Range(format!(
                "{first}-{last} is backwards: the first id must not be above the last (for example {last}-{first})"
            )));
        }
        if last - first >= MAX_POOL_SIZE {
            return Err(IdError::Range(format!(
                "{first}-{last} has {} ids; a pool holds at most {MAX_POOL_SIZE}",
                u128::from(last - first) + 1
            )));
        }
        Ok(IdRange { first, last })
    }

    /// The first id.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The last id.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// How many ids the range holds.
    pub fn size(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Whether `n` is in the range.
    pub fn contains(&self, n: u64) -> bool {
        (self.first..=self.last).contains(&n)
    }
}

impl fmt::Display for IdRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for IdRange {
    type Err = IdError;

    /// Parses `FIRST-LAST`, e.g. `1-254`.
    fn from_str(s: &str) -> Result<IdRange, IdError> {
        let s = s.trim();
        let bad = |why: String| {
            IdError::Range(format!(
                "{why}; write it as FIRST-LAST with whole numbers, for example 1-254"
            ))
        };
        if s.is_empty() {
            return Err(bad("it is empty".into()));
        }
        let Some((a, b)) = s.split_once('-') else {
            return Err(bad(format!("{s:?} has no '-'")));
        };
        let num = |t: &str| {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad(format!("{t:?} in {s:?} is not a whole number")));
            }
            t.parse::<u64>()
                .map_err(|_| bad(format!("{t:?} in {s:?} is too large")))
        };
        IdRange::new(num(a)?, num(b)?)
    }
}

/// Why an identity-pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    /// The pool name is not a valid name.
    #[error("pool name: {0}")]
    Pool(keys::NameError),
    /// The claim name is not a valid node id.
    #[error("--name: {0}")]
    Name(keys::NameError),
    /// A malformed or oversized range.
    #[error("--range {0}")]
    Range(String),
    /// The claim asked for another range than the pool has.
    #[error(
        "pool {pool} has the range {stored}, this claim asks for {asked}: use --range {stored} \
         (a pool's range is fixed by its first claim; for another range use another pool)"
    )]
    RangeMismatch {
        /// The pool.
        pool: String,
        /// The range in the pool's meta record.
        stored: IdRange,
        /// The range asked for.
        asked: IdRange,
    },
    /// The pool does not exist yet and no range was given.
    #[error(
        "pool {pool} does not exist yet: its first claim needs --range (for example --range 1-254)"
    )]
    NoRange {
        /// The pool.
        pool: String,
    },
    /// Every id of the range is taken.
    #[error("pool {pool}: all {size} ids are claimed{detail}")]
    Exhausted {
        /// The pool.
        pool: String,
        /// The size of its range.
        size: u64,
        /// What else holds ids (revoked, unreadable), if anything.
        detail: String,
    },
    /// The name is held (or being claimed) by another machine.
    #[error(
        "name {name} {what} in pool {pool}, claimed by machine {holder}; this machine is {this}: \
         a cloned machine? give it its own --name, or release the old claim with --force \
         (putex id release {pool} --name {name} --force)",
        what = held_what(*id),
        holder = short(holder),
        this = short(this)
    )]
    OtherMachine {
        /// The pool.
        pool: String,
        /// The claim name.
        name: String,
        /// The id it holds, if bound.
        id: Option<u64>,
        /// The machine id in the records.
        holder: String,
        /// This machine's id.
        this: String,
    },
    /// A release of another machine's claim without `--force`.
    #[error(
        "name {name} {what} in pool {pool}, claimed by machine {holder}; this machine is {this}: \
         release it on that machine, or add --force to revoke it (the holder is not told: make \
         sure it no longer uses the id)",
        what = held_what(*id),
        holder = short(holder),
        this = short(this)
    )]
    NotOwner {
        /// The pool.
        pool: String,
        /// The claim name.
        name: String,
        /// The id it holds, if known.
        id: Option<u64>,
        /// The machine id in the records.
        holder: String,
        /// This machine's id.
        this: String,
    },
    /// Concurrent writers kept changing the records until the deadline.
    #[error(
        "pool {pool}: the claim or release of name {name} did not finish within {waited:?} \
         (another process keeps changing its records); try again"
    )]
    Busy {
        /// The pool.
        pool: String,
        /// The claim name.
        name: String,
        /// How long it tried.
        waited: Duration,
    },
    /// A record in the way cannot be read.
    #[error("{key}: the record cannot be read (garbage, or written by another putex version); see `putex id check {pool}`{hint}")]
    Unreadable {
        /// The pool.
        pool: String,
        /// The record's key.
        key: String,
        /// How to get past it.
        hint: String,
    },
    /// The store failed (unreachable, timed out, refused).
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

fn held_what(id: Option<u64>) -> String {
    match id {
        Some(n) => format!("holds id {n}"),
        None => "is being claimed".into(),
    }
}

/// A machine id shortened for messages and tables: 12 characters and `…`.
pub fn short(machine: &str) -> String {
    if machine.chars().count() > 12 {
        let s: String = machine.chars().take(12).collect();
        format!("{s}…")
    } else {
        machine.to_owned()
    }
}

impl From<keys::NameError> for IdError {
    fn from(e: keys::NameError) -> Self {
        IdError::Pool(e)
    }
}

/// Who claims: the claim name and the machine it runs on.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claimant {
    /// The claim name (default: the hostname); validated like a node id.
    pub name: String,
    /// The machine id ([`crate::identity::machine_id`]).
    pub machine: String,
}

/// Timeouts of the pool operations.
#[derive(Clone, Debug)]
pub struct Options {
    /// The deadline of every store call.
    pub timeout: Duration,
    /// How long a `pending` name record may stay unchanged (on this host's
    /// clock) before a claim with the same name takes it over.
    pub pending_takeover: Duration,
    /// How long a claim or release may keep retrying against concurrent
    /// writers before it gives up with [`IdError::Busy`].
    pub deadline: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(5),
            pending_takeover: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
        }
    }
}

/// The state of a name's index record.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NameState {
    /// A claim with this name is under way (or was interrupted).
    Pending,
    /// The name holds the id in the record.
    Bound,
}

/// A name's index record, `id.<pool>.name.<name>`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct NameRecord {
    /// Format version; [`RECORD_VERSION`].
    pub v: u32,
    /// Always `"name"`.
    pub kind: String,
    /// The pool.
    pub pool: String,
    /// The claim name.
    pub name: String,
    /// The claimer's machine id.
    pub machine: String,
    /// Pending or bound.
    pub state: NameState,
    /// The id, when bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Unique id of the write that produced this record.
    pub write: String,
}

impl NameRecord {
    /// Parses a name record of `pool`/`name`; `None` for anything else.
    pub fn decode(bytes: &[u8], pool: &str, name: &str) -> Option<NameRecord> {
        let r: NameRecord = serde_json::from_slice(bytes).ok()?;
        let ok = r.v == RECORD_VERSION
            && r.kind == "name"
            && r.pool == pool
            && r.name == name
            && !r.write.is_empty()
            && (r.state == NameState::Pending || r.id.is_some());
        ok.then_some(r)
    }

    fn new(pool: &str, who: &Claimant, state: NameState, id: Option<u64>) -> NameRecord {
        NameRecord {
            v: RECORD_VERSION,
            kind: "name".into(),
            pool: pool.to_owned(),
            name: who.name.clone(),
            machine: who.machine.clone(),
            state,
            id,
            write: instance_id(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a name record always serialises")
    }
}

/// An id record as written: a lock record with the pool's fields beside.
#[derive(Serialize)]
struct IdRecordOut<'a> {
    #[serde(flatten)]
    lock: &'a LockRecord,
    pool: &'a str,
    id: u64,
    kind: &'static str,
}

fn encode_id(pool: &str, n: u64, rec: &LockRecord) -> Vec<u8> {
    serde_json::to_vec(&IdRecordOut {
        lock: rec,
        pool,
        id: n,
        kind: CLAIM_KIND,
    })
    .expect("an id record always serialises")
}

/// The default emergency-stop gap G (C·R), advertised by claims.
fn default_gap_ms() -> u64 {
    use putex_core::timing::{DEFAULT_CONFIRM, DEFAULT_RENEW};
    ceil_millis(DEFAULT_RENEW * DEFAULT_CONFIRM)
}

fn claim_record(who: &Claimant, instance: &str) -> LockRecord {
    LockRecord {
        v: RECORD_VERSION,
        node: who.name.clone(),
        machine: who.machine.clone(),
        instance: instance.to_owned(),
        state: LockState::Active,
        write: instance_id(),
        lease_ms: ceil_millis(CLAIM_LEASE),
        gap_ms: default_gap_ms(),
    }
}

#[derive(Serialize, Deserialize)]
struct MetaRecord {
    v: u32,
    kind: String,
    pool: String,
    first: u64,
    last: u64,
}

impl MetaRecord {
    fn decode(bytes: &[u8], pool: &str) -> Option<IdRange> {
        let m: MetaRecord = serde_json::from_slice(bytes).ok()?;
        if m.v != RECORD_VERSION || m.kind != "meta" || m.pool != pool {
            return None;
        }
        IdRange::new(m.first, m.last).ok()
    }
}

/// The `write` field of any record, if it has one.
fn write_of(bytes: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    v.get("write")?.as_str().map(str::to_owned)
}

/// One id record as read.
#[derive(Clone, Debug)]
pub struct IdSlot {
    /// The record's token.
    pub token: Token,
    /// When it was written, on the store's clock.
    pub time: StoreTime,
    /// The record; `None` when it cannot be read (garbage).
    pub record: Option<LockRecord>,
    /// Whether it is a persistent claim's record (`kind: "claim"`), rather
    /// than one the lock state machine wrote for a leased id.
    pub claim: bool,
}

impl IdSlot {
    fn from_entry(e: Entry) -> IdSlot {
        let record = Observed::decode(&e.value).record().cloned();
        let claim = serde_json::from_slice::<serde_json::Value>(&e.value)
            .ok()
            .and_then(|v| v.get("kind")?.as_str().map(|k| k == CLAIM_KIND))
            .unwrap_or(false);
        IdSlot {
            token: e.token,
            time: e.time,
            record,
            claim,
        }
    }

    /// `active`, `confirming`, `released`, `revoked` or `garbage`.
    pub fn state_label(&self) -> &'static str {
        match self.record.as_ref().map(|r| r.state) {
            Some(LockState::Active) => "active",
            Some(LockState::Confirming) => "confirming",
            Some(LockState::Released) => "released",
            Some(LockState::Revoked) => "revoked",
            None => "garbage",
        }
    }

    /// Whether the id is held: `active` or `confirming`.
    pub fn is_held(&self) -> bool {
        matches!(
            self.record.as_ref().map(|r| r.state),
            Some(LockState::Active | LockState::Confirming)
        )
    }

    /// An `active` persistent claim by this name (of any machine).
    fn held_by_name(&self, name: &str) -> Option<&LockRecord> {
        self.record
            .as_ref()
            .filter(|r| self.claim && r.node == name && r.state == LockState::Active)
    }
}

/// One name record as read.
#[derive(Clone, Debug)]
pub struct NameSlot {
    /// The record's token.
    pub token: Token,
    /// When it was written, on the store's clock.
    pub time: StoreTime,
    /// The record; `None` when it cannot be read (garbage).
    pub record: Option<NameRecord>,
}

/// A consistent read of every record of a pool.
#[derive(Clone, Debug)]
pub struct PoolView {
    /// The pool.
    pub pool: String,
    /// The range from the meta record (`None`: absent or unreadable).
    pub range: Option<IdRange>,
    /// Whether a meta record exists but cannot be read.
    pub meta_unreadable: bool,
    /// The id records, by id.
    pub ids: BTreeMap<u64, IdSlot>,
    /// The name records, by name.
    pub names: BTreeMap<String, NameSlot>,
    /// Keys under the pool's prefix that are none of the above.
    pub strays: Vec<String>,
    /// The store's clock at the time of the read.
    pub now: StoreTime,
}

impl PoolView {
    /// Reads every record of `pool` (one marker write, one watch).
    pub async fn read<S: Store>(
        store: &S,
        pool: &str,
        timeout: Duration,
    ) -> Result<PoolView, IdError> {
        let prefix = keys::id_pool(pool)?;
        let marker = keys::id_scan(pool)?;
        let (entries, now) = snapshot_synced(store, &prefix, &marker, timeout).await?;
        let mut view = PoolView {
            pool: pool.to_owned(),
            range: None,
            meta_unreadable: false,
            ids: BTreeMap::new(),
            names: BTreeMap::new(),
            strays: Vec::new(),
            now,
        };
        for (key, e) in entries {
            let rest = &key[prefix.len()..];
            if rest == "meta" {
                view.range = MetaRecord::decode(&e.value, pool);
                view.meta_unreadable = view.range.is_none();
            } else if let Some(name) = rest.strip_prefix("name.") {
                view.names.insert(
                    name.to_owned(),
                    NameSlot {
                        token: e.token,
                        time: e.time,
                        record: NameRecord::decode(&e.value, pool, name),
                    },
                );
            } else if let Some(n) = rest.parse::<u64>().ok().filter(|n| n.to_string() == rest) {
                view.ids.insert(n, IdSlot::from_entry(e));
            } else {
                view.strays.push(key);
            }
        }
        Ok(view)
    }

    /// The free ids of `range` in the order a claimer tries them, with the
    /// token to compare-and-swap on (`None`: create). Never-used ids first,
    /// ascending; then `released` ones, oldest (lowest revision) first.
    /// Held, `revoked` and unreadable ids are never candidates.
    pub fn candidates(&self, range: IdRange) -> Vec<(u64, Option<Token>)> {
        let mut out: Vec<(u64, Option<Token>)> = (range.first..=range.last)
            .filter(|n| !self.ids.contains_key(n))
            .map(|n| (n, None))
            .collect();
        let mut released: Vec<(u64, Token)> = self
            .ids
            .iter()
            .filter(|(n, s)| {
                range.contains(**n)
                    && s.record.as_ref().map(|r| r.state) == Some(LockState::Released)
            })
            .map(|(n, s)| (*n, s.token))
            .collect();
        released.sort_by_key(|(n, t)| (t.revision, *n));
        out.extend(released.into_iter().map(|(n, t)| (n, Some(t))));
        out
    }

    /// How long ago (store time) a record was written; `None` if unknown
    /// (another clock domain).
    pub fn age(&self, then: StoreTime) -> Option<Duration> {
        match self.now.gap_since(then) {
            StoreGap::Forward(d) => Some(d),
            StoreGap::Backwards => Some(Duration::ZERO),
            StoreGap::Unbounded => None,
        }
    }

    /// The number of ids held by persistent claims.
    pub fn claimed(&self) -> usize {
        self.ids.values().filter(|s| s.claim && s.is_held()).count()
    }

    /// Every inconsistency, in words; empty when the pool is consistent.
    /// A `pending` name record younger than `pending_grace` is a claim in
    /// progress, not a problem.
    pub fn problems(&self, pending_grace: Duration) -> Vec<String> {
        let p = &self.pool;
        let mut out = Vec::new();
        if self.meta_unreadable {
            out.push(format!(
                "id.{p}.meta: the pool's range record cannot be read"
            ));
        } else if self.range.is_none() && (!self.ids.is_empty() || !self.names.is_empty()) {
            out.push(format!(
                "id.{p}.meta is missing: the pool's range is unknown (records exist without it)"
            ));
        }
        for k in &self.strays {
            out.push(format!("{k}: not a record of an identity pool"));
        }
        // Which names point at which id.
        let mut pointing: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for (name, slot) in &self.names {
            let key = format!("id.{p}.name.{name}");
            let Some(rec) = &slot.record else {
                out.push(format!("{key}: the name record cannot be read (garbage)"));
                continue;
            };
            match (rec.state, rec.id) {
                (NameState::Bound, Some(n)) => {
                    pointing.entry(n).or_default().push(name);
                    let problem = match self.ids.get(&n) {
                        None => Some(format!("id {n} has no record")),
                        Some(s) => match &s.record {
                            None => Some(format!("id {n}'s record cannot be read")),
                            Some(r) if r.node != *name => {
                                Some(format!("id {n} is {} by {}", s.state_label(), r.node))
                            }
                            Some(r) if r.state != LockState::Active => {
                                Some(format!("id {n} is {}", s.state_label()))
                            }
                            Some(r) if r.machine != rec.machine => Some(format!(
                                "id {n} names machine {}, the name record machine {}",
                                short(&r.machine),
                                short(&rec.machine)
                            )),
                            Some(_) => None,
                        },
                    };
                    if let Some(problem) = problem {
                        out.push(format!(
                            "name {name} points at id {n}, but {problem} \
                             (claiming again with --name {name} repairs it)"
                        ));
                    }
                    if let Some(r) = self.range.filter(|r| !r.contains(n)) {
                        out.push(format!(
                            "name {name} points at id {n}, outside the range {r}"
                        ));
                    }
                }
                _ => {
                    let age = self.age(slot.time);
                    if age.is_none_or(|a| a >= pending_grace) {
                        out.push(format!(
                            "name {name} has a claim pending for {}: an interrupted claim \
                             (claiming again with --name {name} on machine {} resumes it; \
                             releasing it clears it)",
                            age.map_or("long".into(), |a| format!("{}s", a.as_secs())),
                            short(&rec.machine)
                        ));
                    }
                }
            }
        }
        for (n, names) in &pointing {
            if names.len() > 1 {
                out.push(format!(
                    "id {n} is pointed at by several names: {}",
                    names.join(", ")
                ));
            }
        }
        let mut held_by: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (n, slot) in &self.ids {
            let key = format!("id.{p}.{n}");
            let Some(r) = &slot.record else {
                out.push(format!(
                    "{key}: the id record cannot be read (garbage); claims skip id {n}"
                ));
                continue;
            };
            if let Some(range) = self.range.filter(|range| !range.contains(*n)) {
                out.push(format!("{key}: id {n} is outside the pool's range {range}"));
            }
            if !(slot.claim && r.state == LockState::Active) {
                continue;
            }
            held_by.entry(&r.node).or_default().push(*n);
            let named_back = self.names.get(&r.node).and_then(|s| s.record.as_ref());
            let bound_here =
                named_back.is_some_and(|nr| nr.state == NameState::Bound && nr.id == Some(*n));
            let pending = named_back.is_some_and(|nr| nr.state == NameState::Pending);
            if !bound_here && !pending {
                out.push(format!(
                    "id {n} is claimed by {} (machine {}) but no name record points at it: \
                     an interrupted claim (`putex id claim {p} --name {}` on that machine \
                     completes it, `putex id release {p} --name {}` frees it)",
                    r.node,
                    short(&r.machine),
                    r.node,
                    r.node
                ));
            }
        }
        for (name, ids) in held_by {
            if ids.len() > 1 {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                out.push(format!(
                    "name {name} holds several ids: {} (`putex id release {p} --name {name}` frees them all)",
                    ids.join(", ")
                ));
            }
        }
        out
    }
}

/// How many times an unknown write outcome is looked into (a leader read,
/// and the same write sent again) before it is reported as unknown.
const SETTLE_ATTEMPTS: u32 = 12;

/// Creates (`expected: None`) or compare-and-swaps a record whose `write`
/// field is `write`. `Some(token)` when it was written, `None` when it
/// definitely was not (a conflict).
///
/// An unknown outcome (H4) is settled, never guessed: a write that timed
/// out may still land later. A leader read that shows our write id says it
/// landed. One that shows the record moved on without it says it never
/// will (its condition is gone). One that shows the record still where our
/// write expected it says nothing yet: the same write (same write id) is
/// sent again, and its definite answer — written, or a conflict that the
/// next read explains — settles both. Only a store that stays unreachable
/// through [`SETTLE_ATTEMPTS`] looks (with back-off) is an error, and the
/// error says the outcome is unknown: a claim is never reported as not
/// made while it might still land (an orphan).
async fn write_checked<S: Store>(
    store: &S,
    key: &str,
    value: &[u8],
    write: &str,
    expected: Option<Token>,
    timeout: Duration,
) -> Result<Option<Token>, IdError> {
    let send = || async {
        match expected {
            None => store.create(key, value, timeout).await,
            Some(t) => store.update(key, value, t, timeout).await,
        }
    };
    let mut last = match send().await {
        Ok(t) => return Ok(Some(t)),
        Err(e) if e.is_conflict() => return Ok(None),
        Err(e) if e.is_unknown() => e,
        Err(e) => return Err(e.into()),
    };
    let mut pause = Duration::from_millis(10);
    for _ in 0..SETTLE_ATTEMPTS {
        tracing::debug!(key, error = %last, "write outcome unknown; reading it back");
        match store.get(key, ReadMode::Leader, timeout).await {
            Ok(Some(b)) if write_of(&b.value).as_deref() == Some(write) => {
                return Ok(Some(b.token));
            }
            Ok(back) => {
                let unchanged = match (expected, &back) {
                    (None, None) => true,
                    (Some(t), Some(b)) => b.token == t,
                    _ => false,
                };
                if !unchanged {
                    // Moved on without our write: its condition is gone.
                    return Ok(None);
                }
                match send().await {
                    Ok(t) => return Ok(Some(t)),
                    // Ours landed meanwhile, or someone else's: read again.
                    Err(e) if e.is_conflict() => continue,
                    Err(e) if e.is_unknown() => last = e,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.is_unknown() => last = e,
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Err(last.into())
}

/// Reads the pool's range from its meta record, creating it with `asked`
/// on first use; refuses a different `asked` range.
pub async fn pool_range<S: Store>(
    store: &S,
    pool: &str,
    asked: Option<IdRange>,
    timeout: Duration,
) -> Result<IdRange, IdError> {
    let key = keys::id_meta(pool)?;
    loop {
        let stored = match store.get(&key, ReadMode::Leader, timeout).await? {
            Some(e) => MetaRecord::decode(&e.value, pool).ok_or_else(|| IdError::Unreadable {
                pool: pool.to_owned(),
                key: key.clone(),
                hint: String::new(),
            })?,
            None => {
                let Some(range) = asked else {
                    return Err(IdError::NoRange {
                        pool: pool.to_owned(),
                    });
                };
                let meta = MetaRecord {
                    v: RECORD_VERSION,
                    kind: "meta".into(),
                    pool: pool.to_owned(),
                    first: range.first,
                    last: range.last,
                };
                let bytes = serde_json::to_vec(&meta).expect("meta serialises");
                match store.create(&key, &bytes, timeout).await {
                    Ok(_) => return Ok(range),
                    // Created concurrently, or our create landed: read it.
                    Err(e) if e.is_conflict() || e.is_unknown() => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        return match asked {
            Some(asked) if asked != stored => Err(IdError::RangeMismatch {
                pool: pool.to_owned(),
                stored,
                asked,
            }),
            _ => Ok(stored),
        };
    }
}

/// The outcome of a [`claim`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Claimed {
    /// The id.
    pub id: u64,
    /// Whether the name already held it (an idempotent re-claim, or a
    /// concurrent claim with the same name that finished first).
    pub existing: bool,
}

/// Claims an id of `pool` for `who`, or returns the one it already holds.
///
/// `range` is the pool's range: required for the first claim of a pool
/// (it is stored), optional after it, refused if different. Fails with
/// [`IdError::Exhausted`] when no id is free, [`IdError::OtherMachine`]
/// when the name is held from another machine.
pub async fn claim<S: Store>(
    store: &S,
    pool: &str,
    range: Option<IdRange>,
    who: &Claimant,
    opts: &Options,
) -> Result<Claimed, IdError> {
    keys::validate_name(pool).map_err(IdError::Pool)?;
    keys::validate_node(&who.name).map_err(IdError::Name)?;
    let t = opts.timeout;
    let range = pool_range(store, pool, range, t).await?;
    let name_key = keys::id_name(pool, &who.name).map_err(IdError::Name)?;
    let instance = instance_id();
    let started = Instant::now();
    let give_up = started + opts.deadline;
    let busy = || IdError::Busy {
        pool: pool.to_owned(),
        name: who.name.clone(),
        waited: started.elapsed(),
    };
    // The pending record of another claim of this name we are waiting out,
    // and since when it has not changed.
    let mut waiting: Option<(Token, Instant)> = None;
    loop {
        if Instant::now() >= give_up {
            return Err(busy());
        }
        let pending = NameRecord::new(pool, who, NameState::Pending, None);
        let over = match store.get(&name_key, ReadMode::Leader, t).await? {
            None => None,
            Some(entry) => {
                let Some(rec) = NameRecord::decode(&entry.value, pool, &who.name) else {
                    return Err(IdError::Unreadable {
                        pool: pool.to_owned(),
                        key: name_key.clone(),
                        hint: format!(
                            "; `putex id release {pool} --name {} --force` removes it",
                            who.name
                        ),
                    });
                };
                if rec.machine != who.machine {
                    return Err(IdError::OtherMachine {
                        pool: pool.to_owned(),
                        name: who.name.clone(),
                        id: rec.id,
                        holder: rec.machine,
                        this: who.machine.clone(),
                    });
                }
                match (rec.state, rec.id) {
                    (NameState::Bound, Some(n)) => {
                        if confirm(store, pool, n, who, t).await? {
                            return Ok(Claimed {
                                id: n,
                                existing: true,
                            });
                        }
                        // The id record does not name us back (an
                        // interrupted release, a hand edit): claim anew.
                        tracing::debug!(pool, name = %who.name, id = n, "broken binding; claiming anew");
                        Some(entry.token)
                    }
                    _ => {
                        // Another claim of this name is under way: wait for
                        // it, or take over a record that stopped changing.
                        let now = Instant::now();
                        match waiting {
                            Some((tok, since)) if tok == entry.token => {
                                if now.duration_since(since) < opts.pending_takeover {
                                    tokio::time::sleep(PENDING_POLL).await;
                                    continue;
                                }
                                tracing::debug!(pool, name = %who.name, "taking over a stalled pending claim");
                                Some(entry.token)
                            }
                            _ => {
                                waiting = Some((entry.token, now));
                                tokio::time::sleep(PENDING_POLL).await;
                                continue;
                            }
                        }
                    }
                }
            }
        };
        let Some(ours) =
            write_checked(store, &name_key, &pending.encode(), &pending.write, over, t).await?
        else {
            continue; // someone else wrote the name record first: look again
        };
        waiting = None;
        let (n, id_token) = match take_id(store, pool, range, who, &instance, opts, give_up).await {
            Ok(x) => x,
            Err(e) => {
                // Leave no pending record behind (best effort).
                let _ = store.delete(&name_key, ours, t).await;
                return Err(e);
            }
        };
        let bound = NameRecord::new(pool, who, NameState::Bound, Some(n));
        if write_checked(
            store,
            &name_key,
            &bound.encode(),
            &bound.write,
            Some(ours),
            t,
        )
        .await?
        .is_some()
        {
            return Ok(Claimed {
                id: n,
                existing: false,
            });
        }
        // Our pending record was changed: a takeover (which may have bound
        // this very id to the name), or a release. Give the id back unless
        // it is bound; the compare-and-swap is on our own write, so an id
        // record someone else has written since is never touched.
        let now_bound = store
            .get(&name_key, ReadMode::Leader, t)
            .await?
            .and_then(|e| NameRecord::decode(&e.value, pool, &who.name))
            .is_some_and(|r| r.state == NameState::Bound && r.id == Some(n));
        if !now_bound {
            give_back(store, pool, n, who, &instance, id_token, t).await?;
        }
    }
}

/// Whether id record `n` is an active claim of `who`. An active claim of
/// this name from another machine is refused.
async fn confirm<S: Store>(
    store: &S,
    pool: &str,
    n: u64,
    who: &Claimant,
    timeout: Duration,
) -> Result<bool, IdError> {
    let key = keys::id_record(pool, n)?;
    let Some(e) = store.get(&key, ReadMode::Leader, timeout).await? else {
        return Ok(false);
    };
    match Observed::decode(&e.value) {
        Observed::Record(r) if r.node == who.name && r.state == LockState::Active => {
            if r.machine != who.machine {
                return Err(IdError::OtherMachine {
                    pool: pool.to_owned(),
                    name: who.name.clone(),
                    id: Some(n),
                    holder: r.machine,
                    this: who.machine.clone(),
                });
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Writes `released` over an id record we took (on its token); a conflict
/// means someone else has written it since, and it is left alone.
async fn give_back<S: Store>(
    store: &S,
    pool: &str,
    n: u64,
    who: &Claimant,
    instance: &str,
    token: Token,
    timeout: Duration,
) -> Result<(), IdError> {
    let key = keys::id_record(pool, n)?;
    let mut rec = claim_record(who, instance);
    rec.state = LockState::Released;
    write_checked(
        store,
        &key,
        &encode_id(pool, n, &rec),
        &rec.write,
        Some(token),
        timeout,
    )
    .await?;
    Ok(())
}

/// Step 3 of a claim: takes an id record for `who`.
async fn take_id<S: Store>(
    store: &S,
    pool: &str,
    range: IdRange,
    who: &Claimant,
    instance: &str,
    opts: &Options,
    give_up: Instant,
) -> Result<(u64, Token), IdError> {
    let started = Instant::now();
    loop {
        if Instant::now() >= give_up {
            return Err(IdError::Busy {
                pool: pool.to_owned(),
                name: who.name.clone(),
                waited: started.elapsed(),
            });
        }
        let view = PoolView::read(store, pool, opts.timeout).await?;
        // An id of ours left by an interrupted claim comes first: resume it.
        let mut order: Vec<(u64, Option<Token>)> = view
            .ids
            .iter()
            .filter(|(n, s)| {
                range.contains(**n)
                    && s.held_by_name(&who.name)
                        .is_some_and(|r| r.machine == who.machine)
            })
            .map(|(n, s)| (*n, Some(s.token)))
            .collect();
        order.extend(view.candidates(range));
        if order.is_empty() {
            let count = |label: &str| {
                view.ids
                    .iter()
                    .filter(|(n, s)| range.contains(**n) && s.state_label() == label)
                    .count()
            };
            let (revoked, garbage) = (count("revoked"), count("garbage"));
            let detail = if revoked + garbage > 0 {
                format!(
                    " ({revoked} of them revoked, {garbage} unreadable: see `putex id list {pool}`)"
                )
            } else {
                String::new()
            };
            return Err(IdError::Exhausted {
                pool: pool.to_owned(),
                size: range.size(),
                detail,
            });
        }
        let mut conflicts = 0;
        for (n, expected) in order {
            let key = keys::id_record(pool, n)?;
            let rec = claim_record(who, instance);
            let bytes = encode_id(pool, n, &rec);
            match write_checked(store, &key, &bytes, &rec.write, expected, opts.timeout).await? {
                Some(token) => return Ok((n, token)),
                None => {
                    conflicts += 1;
                    if conflicts >= RESNAPSHOT_AFTER {
                        break;
                    }
                }
            }
        }
    }
}

/// The free ids of `pool` within `range`, in the order a claimer tries
/// them: never-used ids ascending, then `released` ids, oldest first. Held
/// (`active`/`confirming`), `revoked` and unreadable ids are left out.
///
/// For claimers that hold an id only for a while (the lock state machine
/// on `id.<pool>.<n>`): each candidate may be gone by the time it is
/// tried, so the claim itself must still be a create or compare-and-swap.
pub async fn free_candidates<S: Store>(
    store: &S,
    pool: &str,
    range: IdRange,
) -> Result<Vec<u64>, IdError> {
    keys::validate_name(pool).map_err(IdError::Pool)?;
    let view = PoolView::read(store, pool, Options::default().timeout).await?;
    Ok(view.candidates(range).into_iter().map(|(n, _)| n).collect())
}

/// The outcome of a [`release`].
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Released {
    /// The ids written, with the state written: `released` for the owner's
    /// own claims, `revoked` for another machine's (`force`).
    pub ids: Vec<(u64, LockState)>,
    /// Whether a name record was removed.
    pub name_record: bool,
}

impl Released {
    /// Whether there was nothing to release.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && !self.name_record
    }
}

/// Releases what `who`'s name holds in `pool`: its id record becomes
/// `released` (or `revoked` when it belongs to another machine and `force`
/// is set), its name record is removed. Without `force`, another machine's
/// claim is refused with [`IdError::NotOwner`]. Nothing to release is not
/// an error (an empty [`Released`]).
pub async fn release<S: Store>(
    store: &S,
    pool: &str,
    who: &Claimant,
    force: bool,
    opts: &Options,
) -> Result<Released, IdError> {
    keys::validate_name(pool).map_err(IdError::Pool)?;
    keys::validate_node(&who.name).map_err(IdError::Name)?;
    let t = opts.timeout;
    let name_key = keys::id_name(pool, &who.name).map_err(IdError::Name)?;
    let started = Instant::now();
    let mut done = Released::default();
    for _ in 0..RELEASE_ATTEMPTS {
        let name_entry = store.get(&name_key, ReadMode::Leader, t).await?;
        if let Some(e) = &name_entry {
            match NameRecord::decode(&e.value, pool, &who.name) {
                Some(rec) if rec.machine != who.machine && !force => {
                    return Err(IdError::NotOwner {
                        pool: pool.to_owned(),
                        name: who.name.clone(),
                        id: rec.id,
                        holder: rec.machine,
                        this: who.machine.clone(),
                    })
                }
                None if !force => {
                    return Err(IdError::Unreadable {
                        pool: pool.to_owned(),
                        key: name_key.clone(),
                        hint: "; --force removes it".into(),
                    })
                }
                _ => {}
            }
        }
        let view = PoolView::read(store, pool, t).await?;
        let held: Vec<(u64, Token, LockRecord)> = view
            .ids
            .iter()
            .filter_map(|(n, s)| s.held_by_name(&who.name).map(|r| (*n, s.token, r.clone())))
            .collect();
        if !force {
            if let Some((n, _, r)) = held.iter().find(|(_, _, r)| r.machine != who.machine) {
                return Err(IdError::NotOwner {
                    pool: pool.to_owned(),
                    name: who.name.clone(),
                    id: Some(*n),
                    holder: r.machine.clone(),
                    this: who.machine.clone(),
                });
            }
        }
        let mut conflict = false;
        for (n, token, mut rec) in held {
            let key = keys::id_record(pool, n)?;
            if rec.machine == who.machine {
                rec.state = LockState::Released;
                rec.instance = instance_id();
            } else {
                // S7: a revocation keeps the holder's identity and timing.
                rec.state = LockState::Revoked;
            }
            rec.write = instance_id();
            let bytes = encode_id(pool, n, &rec);
            if write_checked(store, &key, &bytes, &rec.write, Some(token), t)
                .await?
                .is_some()
            {
                done.ids.push((n, rec.state));
            } else {
                conflict = true;
                break;
            }
        }
        if conflict {
            continue;
        }
        if let Some(e) = name_entry {
            match store.delete(&name_key, e.token, t).await {
                Ok(()) => done.name_record = true,
                Err(err) if err.is_conflict() => continue,
                Err(err) if err.is_unknown() => {
                    if store.get(&name_key, ReadMode::Leader, t).await?.is_some() {
                        continue;
                    }
                    done.name_record = true;
                }
                Err(err) => return Err(err.into()),
            }
        }
        return Ok(done);
    }
    Err(IdError::Busy {
        pool: pool.to_owned(),
        name: who.name.clone(),
        waited: started.elapsed(),
    })
}

/// One row of [`list`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ListEntry {
    /// The id; `None` for a name whose claim is pending.
    pub id: Option<u64>,
    /// The claim name (the record's node id).
    pub name: Option<String>,
    /// `active`, `confirming`, `released`, `revoked`, `garbage`, or
    /// `pending` for a name record without an id yet.
    pub state: String,
    /// `claim` (persistent) or `lease` (held while a command runs).
    pub kind: String,
    /// The machine id.
    pub machine: Option<String>,
    /// The record's revision.
    pub revision: u64,
    /// Store time since the record was written, in ms (`None`: unknown).
    pub age_ms: Option<u64>,
}

/// Every id record of a pool, and the names whose claim is pending.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Listing {
    /// The pool.
    pub pool: String,
    /// Its range (`None` if it has no readable meta record).
    pub range: Option<String>,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// The rows, ids ascending, then pending names.
    pub ids: Vec<ListEntry>,
}

/// Lists a pool.
pub async fn list<S: Store>(store: &S, pool: &str, opts: &Options) -> Result<Listing, IdError> {
    keys::validate_name(pool).map_err(IdError::Pool)?;
    let view = PoolView::read(store, pool, opts.timeout).await?;
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut ids: Vec<ListEntry> = view
        .ids
        .iter()
        .map(|(n, s)| ListEntry {
            id: Some(*n),
            name: s.record.as_ref().map(|r| r.node.clone()),
            state: s.state_label().into(),
            kind: if s.record.is_none() {
                "-".into()
            } else if s.claim {
                "claim".into()
            } else {
                "lease".into()
            },
            machine: s.record.as_ref().map(|r| r.machine.clone()),
            revision: s.token.revision,
            age_ms: ms(view.age(s.time)),
        })
        .collect();
    for (name, s) in &view.names {
        let pending = s
            .record
            .as_ref()
            .is_none_or(|r| r.state == NameState::Pending);
        if pending {
            ids.push(ListEntry {
                id: None,
                name: Some(name.clone()),
                state: if s.record.is_some() {
                    "pending"
                } else {
                    "garbage"
                }
                .into(),
                kind: "claim".into(),
                machine: s.record.as_ref().map(|r| r.machine.clone()),
                revision: s.token.revision,
                age_ms: ms(view.age(s.time)),
            });
        }
    }
    Ok(Listing {
        pool: pool.to_owned(),
        range: view.range.map(|r| r.to_string()),
        claimed: view.claimed(),
        ids,
    })
}

/// What [`check`] found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CheckReport {
    /// The pool.
    pub pool: String,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// Whether the pool has any record at all.
    pub exists: bool,
    /// Every inconsistency, in words.
    pub problems: Vec<String>,
}

/// Checks a pool: every name record points at an id record that names it
/// back, every claimed id has a name record pointing at it, no two names
/// share an id, no name holds two ids, no record is unreadable, every id is
/// within the pool's range, and no claim has been pending for longer than
/// [`Options::pending_takeover`].
pub async fn check<S: Store>(
    store: &S,
    pool: &str,
    opts: &Options,
) -> Result<CheckReport, IdError> {
    keys::validate_name(pool).map_err(IdError::Pool)?;
    let view = PoolView::read(store, pool, opts.timeout).await?;
    Ok(CheckReport {
        pool: pool.to_owned(),
        claimed: view.claimed(),
        exists: view.range.is_some()
            || view.meta_unreadable
            || !view.ids.is_empty()
            || !view.names.is_empty(),
        problems: view.problems(opts.pending_takeover),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AnyStore, MemoryStore};

    fn who(name: &str, machine: &str) -> Claimant {
        Claimant {
            name: name.into(),
            machine: machine.into(),
        }
    }

    #[test]
    fn ranges_parse_and_refuse_nonsense() {
        let r: IdRange = "1-254".parse().unwrap();
        assert_eq!((r.first(), r.last(), r.size()), (1, 254, 254));
        assert_eq!(r.to_string(), "1-254");
        assert_eq!(" 0 - 0 ".parse::<IdRange>().unwrap().size(), 1);
        assert_eq!("0-65535".parse::<IdRange>().unwrap().size(), MAX_POOL_SIZE);
        for (bad, says) in [
            ("5-1", "backwards"),
            ("a-b", "not a whole number"),
            ("", "empty"),
            ("7", "no '-'"),
            ("-5", "not a whole number"),
            ("1-2-3", "not a whole number"),
            ("0-65536", "at most 65536"),
            ("1-99999999999999999999", "too large"),
            ("0-18446744073709551615", "at most"),
        ] {
            let e = bad.parse::<IdRange>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.starts_with("--range"), "{e}");
        }
    }

    #[test]
    fn id_records_are_lock_records_with_extra_fields() {
        let rec = claim_record(&who("web1", "m1"), "i1");
        let bytes = encode_id("web", 7, &rec);
        let text = String::from_utf8(bytes.clone()).unwrap();
        for f in [
            r#""kind":"claim""#,
            r#""pool":"web""#,
            r#""id":7"#,
            r#""state":"active""#,
        ] {
            assert!(text.contains(f), "{text}");
        }
        assert_eq!(Observed::decode(&bytes), Observed::Record(rec.clone()));
        assert_eq!(rec.lease(), CLAIM_LEASE);
        assert_eq!(rec.gap_ms, 2_000);
        let slot = IdSlot::from_entry(Entry {
            value: bytes,
            token: Token::new(1, 1),
            time: StoreTime { era: 1, nanos: 0 },
        });
        assert!(slot.claim && slot.is_held());
    }

    #[tokio::test]
    async fn claim_release_and_reclaim_on_the_memory_store() {
        let store = AnyStore::from(MemoryStore::new());
        let o = Options::default();
        let range = Some("1-2".parse().unwrap());
        let a = claim(&store, "p", range, &who("a", "m"), &o).await.unwrap();
        assert_eq!(
            a,
            Claimed {
                id: 1,
                existing: false
            }
        );
        // Idempotent; the range may be left out once the pool exists.
        let again = claim(&store, "p", None, &who("a", "m"), &o).await.unwrap();
        assert_eq!(
            again,
            Claimed {
                id: 1,
                existing: true
            }
        );
        assert_eq!(
            claim(&store, "p", range, &who("b", "m"), &o)
                .await
                .unwrap()
                .id,
            2
        );
        let e = claim(&store, "p", range, &who("c", "m"), &o)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "pool p: all 2 ids are claimed");
        let r = release(&store, "p", &who("a", "m"), false, &o)
            .await
            .unwrap();
        assert_eq!(r.ids, vec![(1, LockState::Released)]);
        assert!(release(&store, "p", &who("a", "m"), false, &o)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            claim(&store, "p", range, &who("c", "m"), &o)
                .await
                .unwrap()
                .id,
            1
        );
        let e = claim(
            &store,
            "p",
            Some("1-3".parse().unwrap()),
            &who("d", "m"),
            &o,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, IdError::RangeMismatch { .. }), "{e}");
        let e = claim(&store, "q", None, &who("d", "m"), &o)
            .await
            .unwrap_err();
        assert!(matches!(e, IdError::NoRange { .. }), "{e}");
        let report = check(&store, "p", &o).await.unwrap();
        assert_eq!(report.problems, Vec::<String>::new());
        assert_eq!(report.claimed, 2);
    }
}
