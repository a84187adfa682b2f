//! The records of a pool as written and as read: name records, id records
//! (lock records with the pool's fields beside) and the range record.

use super::*;

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
    /// The pool's name, as in the record's key; [`NameRecord::decode`]
    /// refuses a record whose key says otherwise.
    pub pool: String,
    /// The claim name (a node id, by default the claimer's hostname), as
    /// in the record's key.
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
    pub fn decode(bytes: &[u8], pool: &Name, name: &str) -> Option<NameRecord> {
        let r: NameRecord = serde_json::from_slice(bytes).ok()?;
        let ok = r.v == RECORD_VERSION
            && r.kind == "name"
            && r.pool == pool.as_str()
            && r.name == name
            && !r.write.is_empty()
            && (r.state == NameState::Pending || r.id.is_some());
        ok.then_some(r)
    }

    pub(super) fn new(
        pool: &Name,
        who: &Claimant,
        state: NameState,
        id: Option<u64>,
    ) -> NameRecord {
        NameRecord {
            v: RECORD_VERSION,
            kind: "name".into(),
            pool: pool.to_string(),
            name: who.name.to_string(),
            machine: who.machine.clone(),
            state,
            id,
            write: instance_id(),
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
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

pub(super) fn encode_id(pool: &Name, n: u64, rec: &LockRecord) -> Vec<u8> {
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

pub(super) fn claim_record(who: &Claimant, instance: &str) -> LockRecord {
    LockRecord {
        v: RECORD_VERSION,
        node: who.name.to_string(),
        machine: who.machine.clone(),
        instance: instance.to_owned(),
        state: LockState::Active,
        write: instance_id(),
        lease_ms: ceil_millis(CLAIM_LEASE),
        gap_ms: default_gap_ms(),
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct MetaRecord {
    pub(super) v: u32,
    pub(super) kind: String,
    pub(super) pool: String,
    pub(super) first: u64,
    pub(super) last: u64,
}

impl MetaRecord {
    pub(super) fn decode(bytes: &[u8], pool: &Name) -> Option<IdRange> {
        let m: MetaRecord = serde_json::from_slice(bytes).ok()?;
        if m.v != RECORD_VERSION || m.kind != "meta" || m.pool != pool.as_str() {
            return None;
        }
        IdRange::new(m.first, m.last).ok()
    }
}

/// The `write` field of any record, if it has one.
pub(super) fn write_of(bytes: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    v.get("write")?.as_str().map(str::to_owned)
}

/// One id record as read.
#[derive(Clone, Debug)]
pub(crate) struct IdSlot {
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
    pub(super) fn from_entry(e: Entry) -> IdSlot {
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
    pub(super) fn held_by_name(&self, name: &str) -> Option<&LockRecord> {
        self.record
            .as_ref()
            .filter(|r| self.claim && r.node == name && r.state == LockState::Active)
    }
}

/// One name record as read.
#[derive(Clone, Debug)]
pub(crate) struct NameSlot {
    pub token: Token,
    /// When it was written, on the store's clock.
    pub time: StoreTime,
    /// The record; `None` when it cannot be read (garbage).
    pub record: Option<NameRecord>,
}
