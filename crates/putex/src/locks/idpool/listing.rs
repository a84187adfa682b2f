//! Listing a pool and checking it for inconsistencies.

use super::*;

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
    /// The claimer's machine id ([`crate::identity::machine_id`]) as the
    /// record holds it; `None` when the record cannot be read.
    pub machine: Option<String>,
    /// The store revision of the row's record (the id record, or the
    /// pending name record).
    pub revision: u64,
    /// Store time since the record was written, in ms (`None`: unknown).
    pub age_ms: Option<u64>,
}

/// Every id record of a pool, and the names whose claim is pending.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Listing {
    /// The pool's name, as passed to [`list`].
    pub pool: String,
    /// Its range (`None` if it has no readable meta record).
    pub range: Option<String>,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// The rows, ids ascending, then pending names.
    pub ids: Vec<ListEntry>,
}

/// Lists a pool: every id record, then the names whose claim is pending,
/// from one consistent read of the pool's records.
pub async fn list<S: Store>(store: &S, pool: &Name, opts: &Options) -> Result<Listing, IdError> {
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
        pool: pool.to_string(),
        range: view.range.map(|r| r.to_string()),
        claimed: view.claimed(),
        ids,
    })
}

/// What [`check`] found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CheckReport {
    /// The pool's name, as passed to [`check`].
    pub pool: String,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// Whether the pool has any record at all.
    pub exists: bool,
    /// Every inconsistency found; empty when the pool is consistent. In
    /// JSON each one is its description.
    pub problems: Vec<PoolProblem>,
}

/// Checks a pool: every name record points at an id record that names it
/// back, every claimed id has a name record pointing at it, no two names
/// share an id, no name holds two ids, no record is unreadable, every id is
/// within the pool's range, and no claim has been pending for longer than
/// [`Options::pending_takeover`].
pub async fn check<S: Store>(
    store: &S,
    pool: &Name,
    opts: &Options,
) -> Result<CheckReport, IdError> {
    let view = PoolView::read(store, pool, opts.timeout).await?;
    Ok(CheckReport {
        pool: pool.to_string(),
        claimed: view.claimed(),
        exists: view.range.is_some()
            || view.meta_unreadable
            || !view.ids.is_empty()
            || !view.names.is_empty(),
        problems: view.problems(opts.pending_takeover),
    })
}
