//! Reading transition records back and deriving the history rows: each
//! handover, and how long the lock had no active holder.

use super::*;

/// A transition record with what the store says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The record's store key, `history.<lock>.<node>-<instance8>-<seq>`.
    pub key: String,
    /// Its store revision: the order of records.
    pub revision: u64,
    /// When the store applied it, on the store's clock.
    pub time: StoreTime,
    /// The record, decoded ([`parse`] skips values that do not decode or
    /// are of another format version).
    pub record: TransitionRecord,
}

/// The transition records among `entries` (from a watch or a snapshot of
/// `history.<lock>.`), in store-revision order. Markers, unreadable values
/// and records of a newer format version are skipped.
pub fn parse(entries: impl IntoIterator<Item = (String, Entry)>) -> Vec<Stored> {
    let mut out: Vec<Stored> = entries
        .into_iter()
        .filter_map(|(key, e)| {
            let record: TransitionRecord = serde_json::from_slice(&e.value).ok()?;
            (record.v == RECORD_VERSION).then_some(Stored {
                key,
                revision: e.token.revision,
                time: e.time,
                record,
            })
        })
        .collect();
    out.sort_by_key(|s| s.revision);
    out
}

/// Every kept transition record of `lock`, in store-revision order: a
/// consistent read ([`snapshot_synced`] with the `history.<lock>.=scan`
/// marker), so every record written before the call is in it.
pub async fn read(
    store: &impl Store,
    lock: &Name,
    timeout: Duration,
) -> Result<Vec<Stored>, StoreError> {
    let filter = keys::history_of(lock);
    let marker = keys::history_scan(lock);
    let (entries, _) = snapshot_synced(store, &filter, &marker, timeout).await?;
    let mut records = parse(entries);
    if store.times_are_first_seen() {
        writers_clocks(&mut records);
    }
    Ok(records)
}

/// The clock domain of times taken from the writers' `at`.
const WRITERS_WALL_ERA: u64 = 3;

/// On a store whose times say when this process first saw a record (etcd),
/// a history read at once would measure every duration as zero: its
/// durations are measured on the writers' own clocks (`at`) instead —
/// wall clocks of possibly several hosts, for people to read, never for a
/// decision.
fn writers_clocks(records: &mut [Stored]) {
    for s in records {
        if let Ok(t) = humantime::parse_rfc3339(&s.record.at) {
            if let Ok(d) = t.duration_since(std::time::UNIX_EPOCH) {
                s.time = StoreTime {
                    era: WRITERS_WALL_ERA,
                    nanos: u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
                };
            }
        }
    }
}

/// How [`HistoryRow::no_holder_ms`] was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoHolderBasis {
    /// From the previous holder's record of leaving `active` to this
    /// activation's record: both on the store's clock.
    Left,
    /// The previous holder left no record (it crashed, or its agent was
    /// cut off): from its last renewal — the stale record's store age at
    /// the takeover (S1 b), or the taker's own observation when the
    /// store's clocks were not comparable — to this activation.
    LastRenewal,
}

/// A transition record with what can be derived from the ones before it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HistoryRow {
    /// The record's store revision (the order).
    pub revision: u64,
    /// When the store applied the record, on the store's clock: the
    /// rows' durations are measured on it.
    pub store_time: StoreTime,
    /// The transition record; in JSON its fields sit beside the row's
    /// own (flattened), its tokens with decimal strings
    /// ([`crate::observe::json`]), unlike the stored record's numbers.
    #[serde(flatten, serialize_with = "record_json")]
    pub record: TransitionRecord,
    /// The node holding the lock as `active` after this transition, as
    /// far as the records tell (`None`: nobody).
    pub holder: Option<String>,
    /// Whether this transition made its node the holder (into `active`).
    pub activation: bool,
    /// On an activation: the holder before, if any record names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_holder: Option<String>,
    /// On an activation: how long the lock had no active holder before
    /// it, in ms of store time ([`NoHolderBasis`]); absent when unknown
    /// (the first activation, or clocks that cannot be compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_holder_ms: Option<u64>,
    /// How `no_holder_ms` was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_holder_basis: Option<NoHolderBasis>,
    /// On an activation: why its node took the lock (the reason code of
    /// its `confirming` transition: `acquired-stale`, `acquired-released`,
    /// …), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired: Option<String>,
}

/// A [`TransitionRecord`] as the JSON output shows it: the stored fields,
/// tokens with decimal strings.
#[derive(Serialize)]
struct RecordJson<'a> {
    v: u32,
    lock: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    node: &'a str,
    instance: &'a str,
    seq: u64,
    source: &'a str,
    from: &'a str,
    to: &'a str,
    reason: &'a str,
    reason_code: &'a str,
    #[serde(
        with = "crate::observe::json::option_token",
        skip_serializing_if = "Option::is_none"
    )]
    token: Option<Token>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stale: Option<StaleJson>,
    at: &'a str,
}

/// [`StaleEvidence`] as the JSON output shows it.
#[derive(Serialize)]
struct StaleJson {
    #[serde(with = "crate::observe::json::token")]
    revision: Token,
    unchanged_for_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_age_ms: Option<u64>,
}

fn record_json<S: serde::Serializer>(r: &TransitionRecord, s: S) -> Result<S::Ok, S::Error> {
    // Every field named: a field added to the record fails to compile
    // here until the output shows it too.
    let TransitionRecord {
        v,
        lock,
        key,
        node,
        instance,
        seq,
        source,
        from,
        to,
        reason,
        reason_code,
        token,
        stale,
        at,
    } = r;
    let stale = stale.map(|e| {
        let StaleEvidence {
            revision,
            unchanged_for_ms,
            store_age_ms,
        } = e;
        StaleJson {
            revision,
            unchanged_for_ms,
            store_age_ms,
        }
    });
    RecordJson {
        v: *v,
        lock,
        key: key.as_deref(),
        node,
        instance,
        seq: *seq,
        source,
        from,
        to,
        reason,
        reason_code,
        token: *token,
        stale,
        at,
    }
    .serialize(s)
}

#[derive(Default)]
struct KeyState {
    /// The active holder: node and instance.
    holder: Option<(String, String)>,
    /// The last node that was active.
    last: Option<String>,
    /// When the last holder's leaving `active` was recorded (store time),
    /// while nobody is active since.
    left: Option<StoreTime>,
    /// The latest `confirming` transition of each instance.
    acquired: HashMap<String, Stored>,
}

fn gap_ms(later: StoreTime, earlier: StoreTime) -> Option<u64> {
    match later.gap_since(earlier) {
        StoreGap::Forward(d) => Some(millis(d)),
        StoreGap::Backwards => Some(0),
        StoreGap::Unbounded => None,
    }
}

/// Derives holders, handovers and the time without a holder from records
/// in store-revision order ([`read`], [`parse`]). Each lock record key (a
/// semaphore has one per slot) is followed on its own.
pub fn derive(records: &[Stored]) -> Vec<HistoryRow> {
    let mut states: HashMap<String, KeyState> = HashMap::new();
    let mut rows = Vec::with_capacity(records.len());
    for s in records {
        let r = &s.record;
        let key = r.key.clone().unwrap_or_default();
        let st = states.entry(key).or_default();
        let mut row = HistoryRow {
            revision: s.revision,
            store_time: s.time,
            record: r.clone(),
            holder: None,
            activation: false,
            previous_holder: None,
            no_holder_ms: None,
            no_holder_basis: None,
            acquired: None,
        };
        let is_holder = st
            .holder
            .as_ref()
            .is_some_and(|(n, i)| *n == r.node && *i == r.instance);
        if r.from == r.to {
            // A note that changes no role (an operator's pause, a stretch
            // on failsafe grants): written late, or after its tenure's
            // records were lost or pruned, it must not read as an
            // activation.
        } else if r.to == "confirming" {
            st.acquired.insert(r.instance.clone(), s.clone());
        } else if r.to == "active" && !is_holder {
            row.activation = true;
            let acq = st.acquired.remove(&r.instance);
            row.acquired = acq.as_ref().map(|a| a.record.reason_code.clone());
            row.previous_holder = st
                .holder
                .as_ref()
                .map(|(n, _)| n.clone())
                .or_else(|| st.last.clone());
            // The previous holder recorded leaving: measure from there.
            // Otherwise estimate its last renewal from the takeover's
            // evidence (S1): the stale record's age when it was taken.
            let measured = match (st.holder.is_none(), st.left) {
                (true, Some(left)) => gap_ms(s.time, left).map(|g| (g, NoHolderBasis::Left)),
                _ => acq.as_ref().and_then(|a| {
                    let ev = a.record.stale?;
                    let age = ev.store_age_ms.unwrap_or(ev.unchanged_for_ms);
                    let since = gap_ms(s.time, a.time)?;
                    Some((since.saturating_add(age), NoHolderBasis::LastRenewal))
                }),
            };
            if let Some((ms, basis)) = measured {
                row.no_holder_ms = Some(ms);
                row.no_holder_basis = Some(basis);
            }
            st.holder = Some((r.node.clone(), r.instance.clone()));
            st.last = Some(r.node.clone());
            st.left = None;
        } else if r.from == "active" && r.to != "active" && is_holder {
            st.holder = None;
            st.left = Some(s.time);
        }
        row.holder = st.holder.as_ref().map(|(n, _)| n.clone());
        rows.push(row);
    }
    rows
}
