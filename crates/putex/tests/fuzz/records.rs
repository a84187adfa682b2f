//! The records others write beside the lock record — member, queue ticket,
//! transition, semaphore limit and slot, once-per, grant, cancel, and the
//! identity pool's meta, id and name records — put in a store as any bytes
//! a KV tool can write, then read by every reader putex has: `putex
//! status` (one lock, a semaphore, all locks as the web page reads them),
//! `putex history`, `putex id` (list, check, free ids, claim), `putex lock`
//! (the semaphore's limit, once-per), and the HTTP gateway (get, list,
//! renew, release, revoke).
//!
//! Beyond "no panic, no hang, typed errors": an unreadable lock record is
//! shown as `unreadable` and held by nobody; the gateway never reports a
//! lock over garbage as granted; an unreadable id record is never a free
//! id, and a claim never takes it.

use std::time::Duration;

use proptest::prelude::*;
use putex::cli::status::render;
use putex::core::{Drift, LockRecord, LockState, Observed, Token};
use putex::locks::gateway::{Gateway, GatewayOptions, GrantRecord};
use putex::locks::idpool::{self, Claimant, IdRange, NameRecord, NameState};
use putex::locks::queue::TicketRecord;
use putex::locks::section::{self, OnceRecord, OnceState, SemaphoreRecord};
use putex::observe::history::{self, StaleEvidence, TransitionRecord};
use putex::report::members::MemberRecord;
use putex::report::status;
use putex::store::{AnyStore, Store, StoreUrl};
use serde_json::json;

use super::{bounded, fuzz_n, nearly, runtime, text, Bytes};

/// The lock, semaphore, resource and pool name every record is about.
const NAME: &str = "L";

fn lock_name() -> putex::store::Name {
    NAME.parse().unwrap()
}
/// The uid of the gateway lock some records describe.
const UID: &str = "U1";

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
            to: None,
            hold_ms: 0,
            catch_up: false,
            paused: None,
            since: None,
            failsafe: None,
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
                ..MemberRecord::default()
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
        prop::option::of((any::<u64>(), millis())),
    )
        .prop_map(
            |((node, instance), arrival, renew_ms, pid, title, wait_ms, lifetime_ms, near)| {
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
                    near_at: near.map(|n| n.0),
                    near_renew_ms: near.map(|n| n.1),
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
pub(super) fn records() -> impl Strategy<Value = Vec<(String, Bytes)>> {
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

async fn seeded(records: &[(String, Bytes)]) -> AnyStore {
    let store = AnyStore::open(&StoreUrl::Memory).await.unwrap();
    for (k, v) in records {
        store.put(k, &v.0, Duration::from_secs(5)).await.unwrap();
    }
    store
}

fn gateway(store: &AnyStore) -> Gateway {
    Gateway::new(
        store.clone(),
        GatewayOptions {
            node: "gw".parse().unwrap(),
            max_drift: Drift::from_percent(1.0),
            max_lifetime: Duration::from_secs(60),
            max_wait: Duration::from_secs(1),
            acquire_lease: putex::locks::gateway::DEFAULT_ACQUIRE_LEASE,
            grant_deadline: putex::locks::gateway::DEFAULT_GRANT_DEADLINE,
        },
    )
}

fn get<'a>(records: &'a [(String, Bytes)], key: &str) -> Option<&'a [u8]> {
    records
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.0.as_slice())
}

/// Every reader over one store of such records.
async fn read_everything(records: Vec<(String, Bytes)>) -> Result<(), TestCaseError> {
    let t = Duration::from_secs(5);
    let store = seeded(&records).await;
    let lock = get(&records, "lock.L");
    let garbage_lock = lock.is_some_and(|b| Observed::decode(b) == Observed::Garbage);

    // putex status, one lock, as text and JSON.
    let st = bounded("lock_status", status::lock_status(&store, &lock_name()))
        .await
        .expect("status of a valid name");
    if garbage_lock {
        prop_assert_eq!(st.state.as_str(), "unreadable");
        prop_assert_eq!(&st.holder, &None);
    }
    let _ = render(&st);
    let _ = serde_json::to_string(&st).unwrap();
    // A semaphore's slots; the web page's data (every lock, its history).
    if let Some(sem) = bounded(
        "semaphore_status",
        status::semaphore_status(&store, &lock_name()),
    )
    .await
    .expect("semaphore status")
    {
        prop_assert!(sem.slots.len() <= section::MAX_LIMIT as usize);
    }
    let page = bounded("web::collect", putex::report::web::collect(&store, None))
        .await
        .expect("the page's data");
    let _ = serde_json::to_string(&page).unwrap();

    // putex history.
    let stored = bounded("history::read", history::read(&store, &lock_name(), t))
        .await
        .expect("history");
    let rows = history::derive(&stored);
    prop_assert_eq!(rows.len(), stored.len());
    let _ = putex::cli::history::render(&rows);
    let _ = serde_json::to_string(&rows).unwrap();

    // putex lock: the semaphore's limit and once-per.
    for limit in [1, 2, 3] {
        match bounded(
            "targets",
            section::targets(
                &store,
                &lock_name(),
                limit,
                t,
                tokio::time::Instant::now() + t,
            ),
        )
        .await
        {
            Ok(keys) => prop_assert_eq!(keys.len(), limit as usize),
            Err(e) if e.is_refusal() => {}
            Err(e) => prop_assert!(false, "targets: {e}"),
        }
    }
    let done = bounded("done_in", section::done_in(&store, &lock_name(), "p1", t))
        .await
        .expect("once record");
    if done.is_some() {
        let r = serde_json::from_slice::<OnceRecord>(get(&records, "once.L").unwrap());
        prop_assert!(r.is_ok_and(|r| r.v == 1 && r.period == "p1"));
    }

    // putex id: list, check, free ids; a claim never takes garbage.
    let opts = idpool::Options {
        timeout: t,
        pending_takeover: Duration::from_secs(10),
        deadline: Duration::from_secs(3),
    };
    let listing = bounded("idpool::list", idpool::list(&store, &lock_name(), &opts)).await;
    let _ = listing.map(|l| serde_json::to_string(&l.ids).unwrap());
    let _ = bounded("idpool::check", idpool::check(&store, &lock_name(), &opts)).await;
    let range = IdRange::new(0, 9).unwrap();
    let unusable = |n: u64| {
        get(&records, &format!("id.L.{n}")).is_some_and(|b| match Observed::decode(b) {
            Observed::Record(r) => r.state != LockState::Released,
            Observed::Garbage => true,
        })
    };
    if let Ok(free) = bounded(
        "free_candidates",
        idpool::free_candidates(&store, &lock_name(), range),
    )
    .await
    {
        for n in free {
            prop_assert!(
                !unusable(n),
                "id {n} offered, its record is held or garbage"
            );
        }
    }
    let me = Claimant {
        name: "me".parse().unwrap(),
        machine: "m".into(),
    };
    if let Ok(c) = bounded(
        "claim",
        idpool::claim(&store, &lock_name(), Some(range), &me, &opts),
    )
    .await
    {
        prop_assert!(
            c.existing || !unusable(c.id),
            "claimed id {} over a held or garbage record",
            c.id
        );
    }
    let _ = bounded(
        "release",
        idpool::release(&store, &lock_name(), &me, false, &opts),
    )
    .await;

    // The gateway: never a granted lock over garbage.
    let gw = gateway(&store);
    let info = bounded("gateway get", gw.get(&lock_name(), &UID.parse().unwrap()))
        .await
        .expect("gateway get");
    if garbage_lock {
        prop_assert!(info.is_none_or(|i| !i.active), "granted over garbage");
    }
    let locks = bounded("gateway locks", gw.locks(&lock_name()))
        .await
        .expect("gateway locks");
    if garbage_lock {
        prop_assert!(locks.iter().all(|l| !l.active), "granted over garbage");
    }
    bounded("gateway resources", gw.resources())
        .await
        .expect("gateway resources");
    let _ = bounded(
        "gateway renew",
        gw.renew(&lock_name(), &UID.parse().unwrap(), None),
    )
    .await;
    bounded(
        "gateway release",
        gw.release(&lock_name(), &UID.parse().unwrap()),
    )
    .await
    .expect("gateway release");
    bounded("gateway revoke", gw.revoke(&lock_name()))
        .await
        .expect("gateway revoke");
    Ok(())
}

#[test]
fn fuzz_records_in_the_store() {
    let rt = runtime();
    // Each case seeds a store and runs every reader: fewer cases.
    fuzz_n(
        "records in the store",
        (super::cases() / 2).max(16),
        records(),
        |records| rt.block_on(read_everything(records)),
    );
}

fn store_with(records: &[(&str, serde_json::Value)]) -> Vec<(String, Bytes)> {
    records
        .iter()
        .map(|(k, v)| (k.to_string(), Bytes(serde_json::to_vec(v).unwrap())))
        .collect()
}

/// r44: `putex status` (and `/v1/status/…/members`, the web page) judged
/// a member silent by `renew_ms × 10`: a member record advertising a
/// `renew_ms` above `u64::MAX / 10` overflowed — a panic in debug builds, a
/// wrong verdict in release builds. Found by `fuzz_records_in_the_store`.
#[test]
fn r44_member_with_a_huge_renew_is_not_an_overflow() {
    let records = store_with(&[(
        "member.L.n1",
        json!({"v": 1, "node": "n1", "instance": "i", "role": "standby", "healthy": true,
               "last_health": null, "token": null, "renew_ms": u64::MAX / 5, "pid": 1}),
    )]);
    runtime().block_on(async {
        let store = seeded(&records).await;
        let st = status::lock_status(&store, &lock_name()).await.unwrap();
        assert_eq!(st.members.len(), 1);
        assert!(!st.members[0].silent, "just written");
    });
}

/// r45: a semaphore limit record holding a limit putex never writes (above
/// `--limit`'s maximum of 64, up to 4 294 967 295) made `putex status`
/// read that many slot records, one store call each: hours. Only the
/// slots a semaphore can have are read now. Seen in `putex status` while
/// writing `fuzz_records_in_the_store` (whose records reach it).
#[test]
fn r45_a_huge_semaphore_limit_reads_no_more_than_the_largest_semaphore() {
    let records = store_with(&[("sem.L", json!({"v": 1, "limit": u32::MAX}))]);
    runtime().block_on(async {
        let store = seeded(&records).await;
        let sem = bounded(
            "semaphore_status",
            status::semaphore_status(&store, &lock_name()),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(sem.slots.len() <= section::MAX_LIMIT as usize);
    });
}

/// r46: `putex history` (and the web page's timeline) added a stale
/// takeover's recorded store age to the time since: a transition record
/// with an age near `u64::MAX` ms overflowed. Seen in `history::derive`
/// while writing `fuzz_records_in_the_store`, which reaches it only rarely
/// (it writes its records within a millisecond; the overflow needs the
/// activation to come later than the takeover).
#[test]
fn r46_a_huge_store_age_in_a_transition_is_not_an_overflow() {
    let t = |seq: u64, to: &str, stale: serde_json::Value| {
        json!({"v": 1, "lock": NAME, "node": "n1", "instance": "i1", "seq": seq,
               "source": "run", "from": "standby", "to": to, "reason": "r",
               "reason_code": "acquired-stale", "stale": stale, "at": "x"})
    };
    let records = store_with(&[
        (
            "history.L.n1-i1-00000001",
            t(
                1,
                "confirming",
                json!({"revision": {"epoch": 1, "revision": 1}, "unchanged_for_ms": 1,
                       "store_age_ms": u64::MAX}),
            ),
        ),
        ("history.L.n1-i1-00000002", t(2, "active", json!(null))),
    ]);
    runtime().block_on(async {
        // The activation a few ms after the takeover.
        let store = seeded(&records[..1]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (k, v) = &records[1];
        store.put(k, &v.0, Duration::from_secs(5)).await.unwrap();
        let stored = history::read(&store, &lock_name(), Duration::from_secs(5))
            .await
            .unwrap();
        let rows = history::derive(&stored);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].no_holder_ms, Some(u64::MAX));
    });
}

/// r49: the gateway looked up a granted lock's grant record by the lock
/// record's instance id; a lock held by anything whose instance id is no
/// name (an empty one, a dot) failed the whole listing — `GET /v1/locks`
/// and RDLM's `GET /resources/…` answered 503. Found by `fuzz_http_api`.
#[test]
fn r49_a_holder_whose_instance_is_no_name_is_listed() {
    let records = store_with(&[(
        "lock.L",
        json!({"v": 1, "node": "gw", "machine": "m", "instance": "", "state": "active",
               "write": "w1", "lease_ms": 60_000, "gap_ms": 0}),
    )]);
    runtime().block_on(async {
        let store = seeded(&records).await;
        let gw = gateway(&store);
        let locks = gw.locks(&lock_name()).await.unwrap();
        assert_eq!(locks.len(), 1);
        assert!(locks[0].active);
        assert_eq!(gw.resources().await.unwrap(), vec![lock_name()]);
    });
}

/// r51: `putex lock --once-per` took a once record of any format version
/// for a run in the period (every other reader checks `v`); a record it
/// does not understand is no recorded run now, like one that does not
/// parse. Found by the long run of `fuzz_records_in_the_store`.
#[test]
fn r51_a_once_record_of_another_version_is_no_recorded_run() {
    for v in [0, 2] {
        let records = store_with(&[(
            "once.L",
            json!({"v": v, "period": "p1", "node": "n", "at": "",
                   "token": {"epoch": 1, "revision": 1}}),
        )]);
        runtime().block_on(async {
            let store = seeded(&records).await;
            let done = section::done_in(&store, &lock_name(), "p1", Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(done, None, "v = {v}");
        });
    }
}
