//! What [`check`](super::check) finds wrong with a pool, as values: the
//! CLI renders them and adds how `putex id` mends each one.

use super::records::*;
use super::*;

/// One inconsistency of a pool. [`fmt::Display`] describes it in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolProblem {
    /// `id.<pool>.meta` exists but cannot be read.
    MetaUnreadable {
        /// The pool's name, the `<pool>` of the key.
        pool: String,
    },
    /// There is no `id.<pool>.meta`, though other records of the pool exist.
    MetaMissing {
        /// The pool's name, the `<pool>` of the missing key.
        pool: String,
    },
    /// A key under the pool's prefix that is no record of a pool.
    Stray {
        /// The whole store key, `id.<pool>.` and what follows.
        key: String,
    },
    /// A name record that cannot be read.
    NameUnreadable {
        /// The pool's name, from the record's key `id.<pool>.name.<name>`.
        pool: String,
        /// The claim name, from the record's key (the record itself says
        /// nothing readable).
        name: String,
    },
    /// A bound name record whose id record does not name it back.
    BrokenBinding {
        /// The claim name of the bound name record.
        name: String,
        /// The id it points at.
        id: u64,
        /// What is wrong with the id's record.
        why: BrokenBinding,
    },
    /// A bound name record pointing outside the pool's range.
    NameOutOfRange {
        /// The claim name of the bound name record.
        name: String,
        /// The id it points at.
        id: u64,
        /// The range in the pool's meta record.
        range: IdRange,
    },
    /// A `pending` name record older than the grace: an interrupted claim.
    PendingClaim {
        /// The claim name whose claim was interrupted; claiming with this
        /// name again resumes it.
        name: String,
        /// How long it has been pending (`None`: unknown, another clock).
        age: Option<Duration>,
        /// The claimer's machine id.
        machine: String,
    },
    /// Several names point at one id.
    SharedId {
        /// The id that more than one bound name record points at.
        id: u64,
        /// The names pointing at it.
        names: Vec<String>,
    },
    /// An id record that cannot be read; claims skip the id.
    IdUnreadable {
        /// The pool's name, from the record's key `id.<pool>.<id>`.
        pool: String,
        /// The id, from the record's key.
        id: u64,
    },
    /// An id record outside the pool's range.
    IdOutOfRange {
        /// The pool's name, from the record's key `id.<pool>.<id>`.
        pool: String,
        /// The id, from the record's key.
        id: u64,
        /// The range in the pool's meta record.
        range: IdRange,
    },
    /// A claimed id that no name record points at: an interrupted claim.
    Unnamed {
        /// The id whose `active` claim record names the claim `name`.
        id: u64,
        /// The claim name in the id record.
        name: String,
        /// The claimer's machine id.
        machine: String,
    },
    /// One name holds several ids.
    SeveralIds {
        /// The claim name that the `active` claim records of all of `ids`
        /// name.
        name: String,
        /// The ids it holds.
        ids: Vec<u64>,
    },
}

/// Why a name's id record does not name the name back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrokenBinding {
    /// The id has no record.
    NoRecord,
    /// The id's record cannot be read.
    Unreadable,
    /// The id's record names another claim.
    HeldByOther {
        /// The id record's state: `active`, `confirming`, `released` or
        /// `revoked`.
        state: &'static str,
        /// The other claim's name.
        by: String,
    },
    /// The id's record is not `active`.
    NotActive {
        /// The id record's state: `confirming`, `released` or `revoked`.
        state: &'static str,
    },
    /// The id's record names another machine than the name record.
    OtherMachine {
        /// The machine id the id record names (in full; the description
        /// shortens it).
        id_machine: String,
        /// The machine id the name record names (in full).
        name_machine: String,
    },
}

impl fmt::Display for PoolProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolProblem::MetaUnreadable { pool } => {
                write!(f, "id.{pool}.meta: the pool's range record cannot be read")
            }
            PoolProblem::MetaMissing { pool } => write!(
                f,
                "id.{pool}.meta is missing: the pool's range is unknown (records exist without it)"
            ),
            PoolProblem::Stray { key } => write!(f, "{key}: not a record of an identity pool"),
            PoolProblem::NameUnreadable { pool, name } => write!(
                f,
                "id.{pool}.name.{name}: the name record cannot be read (garbage)"
            ),
            PoolProblem::BrokenBinding { name, id, why } => {
                write!(f, "name {name} points at id {id}, but ")?;
                match why {
                    BrokenBinding::NoRecord => write!(f, "id {id} has no record"),
                    BrokenBinding::Unreadable => write!(f, "id {id}'s record cannot be read"),
                    BrokenBinding::HeldByOther { state, by } => {
                        write!(f, "id {id} is {state} by {by}")
                    }
                    BrokenBinding::NotActive { state } => write!(f, "id {id} is {state}"),
                    BrokenBinding::OtherMachine {
                        id_machine,
                        name_machine,
                    } => write!(
                        f,
                        "id {id} names machine {}, the name record machine {}",
                        short(id_machine),
                        short(name_machine)
                    ),
                }
            }
            PoolProblem::NameOutOfRange { name, id, range } => {
                write!(
                    f,
                    "name {name} points at id {id}, outside the range {range}"
                )
            }
            PoolProblem::PendingClaim { name, age, machine } => write!(
                f,
                "name {name} has a claim pending for {} on machine {}: an interrupted claim",
                age.map_or("long".into(), |a| format!("{}s", a.as_secs())),
                short(machine)
            ),
            PoolProblem::SharedId { id, names } => write!(
                f,
                "id {id} is pointed at by several names: {}",
                names.join(", ")
            ),
            PoolProblem::IdUnreadable { pool, id } => write!(
                f,
                "id.{pool}.{id}: the id record cannot be read (garbage); claims skip id {id}"
            ),
            PoolProblem::IdOutOfRange { pool, id, range } => {
                write!(
                    f,
                    "id.{pool}.{id}: id {id} is outside the pool's range {range}"
                )
            }
            PoolProblem::Unnamed { id, name, machine } => write!(
                f,
                "id {id} is claimed by {name} (machine {}) but no name record points at it: \
                 an interrupted claim",
                short(machine)
            ),
            PoolProblem::SeveralIds { name, ids } => {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                write!(f, "name {name} holds several ids: {}", ids.join(", "))
            }
        }
    }
}

/// In JSON, a problem is its description.
impl Serialize for PoolProblem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl PoolView {
    /// Every inconsistency; empty when the pool is consistent. A `pending`
    /// name record younger than `pending_grace` is a claim in progress, not
    /// a problem.
    pub fn problems(&self, pending_grace: Duration) -> Vec<PoolProblem> {
        let pool = || self.pool.clone();
        let mut out = Vec::new();
        if self.meta_unreadable {
            out.push(PoolProblem::MetaUnreadable { pool: pool() });
        } else if self.range.is_none() && (!self.ids.is_empty() || !self.names.is_empty()) {
            out.push(PoolProblem::MetaMissing { pool: pool() });
        }
        for key in &self.strays {
            out.push(PoolProblem::Stray { key: key.clone() });
        }
        // Which names point at which id.
        let mut pointing: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for (name, slot) in &self.names {
            let Some(rec) = &slot.record else {
                out.push(PoolProblem::NameUnreadable {
                    pool: pool(),
                    name: name.clone(),
                });
                continue;
            };
            match (rec.state, rec.id) {
                (NameState::Bound, Some(id)) => {
                    pointing.entry(id).or_default().push(name);
                    if let Some(why) = self.broken_binding(name, rec, id) {
                        out.push(PoolProblem::BrokenBinding {
                            name: name.clone(),
                            id,
                            why,
                        });
                    }
                    if let Some(range) = self.range.filter(|r| !r.contains(id)) {
                        out.push(PoolProblem::NameOutOfRange {
                            name: name.clone(),
                            id,
                            range,
                        });
                    }
                }
                _ => {
                    let age = self.age(slot.time);
                    if age.is_none_or(|a| a >= pending_grace) {
                        out.push(PoolProblem::PendingClaim {
                            name: name.clone(),
                            age,
                            machine: rec.machine.clone(),
                        });
                    }
                }
            }
        }
        for (id, names) in pointing {
            if names.len() > 1 {
                out.push(PoolProblem::SharedId {
                    id,
                    names: names.into_iter().map(str::to_owned).collect(),
                });
            }
        }
        let mut held_by: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (&id, slot) in &self.ids {
            let Some(r) = &slot.record else {
                out.push(PoolProblem::IdUnreadable { pool: pool(), id });
                continue;
            };
            if let Some(range) = self.range.filter(|range| !range.contains(id)) {
                out.push(PoolProblem::IdOutOfRange {
                    pool: pool(),
                    id,
                    range,
                });
            }
            if !(slot.claim && r.state == LockState::Active) {
                continue;
            }
            held_by.entry(&r.node).or_default().push(id);
            let named_back = self.names.get(&r.node).and_then(|s| s.record.as_ref());
            let bound_here =
                named_back.is_some_and(|nr| nr.state == NameState::Bound && nr.id == Some(id));
            let pending = named_back.is_some_and(|nr| nr.state == NameState::Pending);
            if !bound_here && !pending {
                out.push(PoolProblem::Unnamed {
                    id,
                    name: r.node.clone(),
                    machine: r.machine.clone(),
                });
            }
        }
        for (name, ids) in held_by {
            if ids.len() > 1 {
                out.push(PoolProblem::SeveralIds {
                    name: name.to_owned(),
                    ids,
                });
            }
        }
        out
    }

    /// What is wrong with the id record that the bound name record `rec`
    /// of `name` points at, if anything.
    fn broken_binding(&self, name: &str, rec: &NameRecord, id: u64) -> Option<BrokenBinding> {
        let slot = match self.ids.get(&id) {
            None => return Some(BrokenBinding::NoRecord),
            Some(slot) => slot,
        };
        match &slot.record {
            None => Some(BrokenBinding::Unreadable),
            Some(r) if r.node != name => Some(BrokenBinding::HeldByOther {
                state: slot.state_label(),
                by: r.node.clone(),
            }),
            Some(r) if r.state != LockState::Active => Some(BrokenBinding::NotActive {
                state: slot.state_label(),
            }),
            Some(r) if r.machine != rec.machine => Some(BrokenBinding::OtherMachine {
                id_machine: r.machine.clone(),
                name_machine: rec.machine.clone(),
            }),
            Some(_) => None,
        }
    }
}
