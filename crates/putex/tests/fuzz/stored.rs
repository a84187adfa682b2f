//! The records others write beside the lock record, as the strategy
//! [`records`]: one store's worth of member, queue ticket, transition,
//! semaphore limit and slot, once-per, grant, cancel and identity-pool
//! records, each absent, valid, nearly valid or any bytes.
//!
//! Shared by the targets `records.rs` and `http.rs` and by the web page's
//! fuzz target inside the crate (`src/observe/web/tests.rs`), which includes
//! this file and `support.rs`; there the crate under test calls itself
//! `putex` too.

use std::time::Duration;

use proptest::prelude::*;
use putex::agent::member::MemberRecord;
use putex::core::{LockRecord, LockState, Token};
use putex::locks::gateway::GrantRecord;
use putex::locks::idpool::{NameRecord, NameState};
use putex::locks::queue::TicketRecord;
use putex::locks::section::{OnceRecord, OnceState, SemaphoreRecord};
use putex::observe::history::{StaleEvidence, TransitionRecord};
use putex::store::{AnyStore, Store, StoreUrl};
use serde_json::json;

use super::support::{nearly, text, Bytes};

/// The lock, semaphore, resource and pool name every record is about.
pub const NAME: &str = "L";

pub fn lock_name() -> putex::store::Name {
    NAME.parse().unwrap()
}
/// The uid of the gateway lock some records describe.
pub const UID: &str = "U1";

fn token() -> impl Strategy<Value = Token> + Clone {
    (any::<u64>(), any::<u64>()).prop_map(|(e, r)| Token::new(e, r))
}

fn millis() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        3 => 0u64..120_000,
        1 => any::<u64>(),
        1 => prop::sample::select(vec![u64::MAX, u64::MAX / 1000, u64::MAX / 10 + 1]),
    ]
}

fn lock_record() -> impl Strategy<Value = LockRecord> + Clone {
    (
        prop_oneof![Just("gw".to_owned()), text()],
        prop_oneof![Just(UID.to_owned()), text()],
        prop::sample::select(vec![
            LockState::Active,
            LockState::Confirming,
            LockState::Released,
            LockState::Revoked,
        ]),
        millis(),
        millis(),
    )
        .prop_map(|(node, instance, state, lease_ms, gap_ms)| LockRecord {
            v: 1,
            node,
            machine: "m".into(),
            instance,
            state,
            write: "w1".into(),
            lease_ms,
            gap_ms,
        })
}

fn member() -> impl Strategy<Value = MemberRecord> + Clone {
    (
        (text(), text(), text()),
        prop::option::of(any::<bool>()),
        prop::option::of(text()),
        millis(),
        any::<u32>(),
        prop::option::of(text()),
    )
        .prop_map(
            |((node, instance, role), healthy, token, renew_ms, pid, alarm)| MemberRecord {
                v: 1,
                node,
                instance,
                role,
                healthy,
                last_health: Some("active ok".into()),
                token,
                renew_ms,
                pid,
                alarm,
            },
        )
}

fn ticket() -> impl Strategy<Value = TicketRecord> + Clone {
    (
        (text(), prop_oneof![Just(UID.to_owned()), text()]),
        any::<u64>(),
        millis(),
        any::<u32>(),
        prop::option::of(text()),
        prop::option::of(millis()),
        prop::option::of(millis()),
    )
        .prop_map(
            |((node, instance), arrival, renew_ms, pid, title, wait_ms, lifetime_ms)| {
                TicketRecord {
                    v: 1,
                    node,
                    instance,
                    arrival,
                    renew_ms,
                    pid,
                    title,
                    wait_ms,
                    lifetime_ms,
                }
            },
        )
}

fn role() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => prop::sample::select(vec![
            "starting", "standby", "confirming", "active", "stepping-down", "lapsed",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ]
}

fn transition() -> impl Strategy<Value = TransitionRecord> + Clone {
    (
        (
            prop::sample::select(vec!["n1", "n2", "n3"]),
            prop::sample::select(vec!["i1", "i2", "i3"]),
        ),
        (role(), role()),
        prop::option::of(prop::sample::select(vec!["sem.L.0", "lock.L", "x"])),
        prop::option::of(token()),
        prop::option::of((token(), millis(), prop::option::of(millis())).prop_map(
            |(revision, unchanged_for_ms, store_age_ms)| StaleEvidence {
                revision,
                unchanged_for_ms,
                store_age_ms,
            },
        )),
        any::<u64>(),
        prop::sample::select(vec![
            "acquired-stale",
            "acquired-released",
            "activated",
            "x",
        ]),
    )
        .prop_map(
            |((node, instance), (from, to), key, token, stale, seq, code)| TransitionRecord {
                v: 1,
                lock: NAME.into(),
                key: key.map(str::to_owned),
                node: node.into(),
                instance: instance.into(),
                seq,
                source: "run".into(),
                from,
                to,
                reason: "fuzz".into(),
                reason_code: code.into(),
                token,
                stale,
                at: "2026-01-01T00:00:00.000Z".into(),
            },
        )
}

fn semaphore() -> impl Strategy<Value = SemaphoreRecord> + Clone {
    prop_oneof![3 => 0u32..70, 1 => any::<u32>()].prop_map(|limit| SemaphoreRecord { v: 1, limit })
}

fn once() -> impl Strategy<Value = OnceRecord> + Clone {
    (
        prop_oneof![Just("p1".to_owned()), text()],
        text(),
        token(),
        any::<bool>(),
        proptest::option::of(text()),
    )
        .prop_map(|(period, node, token, done, write)| OnceRecord {
            v: 1,
            period,
            node,
            token,
            at: "2026-01-01T00:00:00Z".into(),
            state: if done {
                OnceState::Done
            } else {
                OnceState::Started
            },
            write,
        })
}

fn grant() -> impl Strategy<Value = GrantRecord> + Clone {
    (
        text(),
        millis(),
        millis(),
        prop_oneof![3 => 0u64..2_000_000_000_000_000_000, 1 => any::<u64>()],
        token(),
        millis(),
    )
        .prop_map(
            |(title, wait_ms, lifetime_ms, since_ns, token, deadline_ms)| GrantRecord {
                v: 1,
                title,
                wait_ms,
                lifetime_ms,
                since_ns,
                token,
                deadline_ms,
            },
        )
}

fn meta() -> impl Strategy<Value = serde_json::Value> + Clone {
    prop_oneof![
        3 => (0u64..10, 0u64..20).prop_map(|(a, b)| (a, a + b)),
        1 => (any::<u64>(), any::<u64>()),
    ]
    .prop_map(
        |(first, last)| json!({"v": 1, "kind": "meta", "pool": NAME, "first": first, "last": last}),
    )
}

fn id_record() -> impl Strategy<Value = serde_json::Value> + Clone {
    (lock_record(), any::<bool>(), 0u64..40).prop_map(|(r, claim, id)| {
        let mut v = serde_json::to_value(r).unwrap();
        let o = v.as_object_mut().unwrap();
        o.insert("pool".into(), json!(NAME));
        o.insert("id".into(), json!(id));
        o.insert("kind".into(), json!(if claim { "claim" } else { "lease" }));
        v
    })
}

fn name_record() -> impl Strategy<Value = NameRecord> + Clone {
    (
        prop::sample::select(vec!["a", "b", "me"]),
        any::<bool>(),
        prop::option::of(prop_oneof![0u64..40, any::<u64>()]),
    )
        .prop_map(|(name, bound, id)| NameRecord {
            v: 1,
            kind: "name".into(),
            pool: NAME.into(),
            name: name.into(),
            machine: "m".into(),
            state: if bound {
                NameState::Bound
            } else {
                NameState::Pending
            },
            id,
            write: "w".into(),
        })
}

/// The records of one case: (key, bytes), each key at most once.
pub fn records() -> impl Strategy<Value = Vec<(String, Bytes)>> {
    let one = |key: &'static str, bytes: BoxedStrategy<Bytes>| {
        prop::option::of(bytes).prop_map(move |b| b.map(|b| (key.to_owned(), b)))
    };
    let lock = nearly(lock_record()).boxed();
    let parts = (
        (
            one("lock.L", lock.clone()),
            one("member.L.n1", nearly(member()).boxed()),
            one("member.L.n2.example.com", nearly(member()).boxed()),
            one("queue.L.U2", nearly(ticket()).boxed()),
            one("queue.L.w1", nearly(ticket()).boxed()),
            one("history.L.n1-i1-00000001", nearly(transition()).boxed()),
            one("history.L.n2-i2-00000001", nearly(transition()).boxed()),
            one("history.L.n1-i1-00000002", nearly(transition()).boxed()),
        ),
        (
            one("sem.L", nearly(semaphore()).boxed()),
            one("sem.L.0", lock.clone()),
            one("sem.L.1", lock.clone()),
            one("once.L", nearly(once()).boxed()),
            one("grant.L.U1", nearly(grant()).boxed()),
            one(
                "cancel.L",
                prop::collection::vec(any::<u8>(), 0..8)
                    .prop_map(Bytes)
                    .boxed(),
            ),
        ),
        (
            one("id.L.meta", nearly(meta()).boxed()),
            one("id.L.0", nearly(id_record()).boxed()),
            one("id.L.1", nearly(id_record()).boxed()),
            one("id.L.7", nearly(id_record()).boxed()),
            one("id.L.007", nearly(id_record()).boxed()),
            one("id.L.name.a", nearly(name_record()).boxed()),
            one("id.L.name.me", nearly(name_record()).boxed()),
        ),
    );
    parts.prop_map(|(a, b, c)| {
        let (a0, a1, a2, a3, a4, a5, a6, a7) = a;
        let (b0, b1, b2, b3, b4, b5) = b;
        let (c0, c1, c2, c3, c4, c5, c6) = c;
        [
            a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, c0, c1, c2, c3, c4, c5, c6,
        ]
        .into_iter()
        .flatten()
        .collect()
    })
}

/// A memory store holding `records`.
pub async fn seeded(records: &[(String, Bytes)]) -> AnyStore {
    let store = AnyStore::open(&StoreUrl::Memory).await.unwrap();
    for (k, v) in records {
        store.put(k, &v.0, Duration::from_secs(5)).await.unwrap();
    }
    store
}
