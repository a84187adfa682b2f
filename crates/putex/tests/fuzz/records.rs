//! The records others write beside the lock record — member, queue ticket,
//! transition, semaphore limit and slot, once-per, grant, cancel, and the
//! identity pool's meta, id and name records — put in a store as any bytes
//! a KV tool can write ([`super::stored::records`]), then read by every
//! reader putex has: `putex status` (one lock, a semaphore), `putex
//! history`, `putex id` (list, check, free ids, claim), `putex lock` (the
//! semaphore's limit, once-per), and the HTTP gateway (get, list, renew,
//! release, revoke). The web page's reader (all locks, each with its
//! history), which is crate-private, reads the same stores in a unit test
//! inside the crate: `src/observe/web/tests.rs`, run by `cargo test -p
//! putex --lib`.
//!
//! Beyond "no panic, no hang, typed errors": an unreadable lock record is
//! shown as `unreadable` and held by nobody; the gateway never reports a
//! lock over garbage as granted; an unreadable id record is never a free
//! id, and a claim never takes it.

use std::time::Duration;

use proptest::prelude::*;
use putex::cli::status::render;
use putex::core::{Drift, LockState, Observed};
use putex::locks::gateway::{Gateway, GatewayOptions};
use putex::locks::idpool::{self, Claimant, IdRange};
use putex::locks::section::{self, OnceRecord};
use putex::observe::history;
use putex::observe::status;
use putex::store::{AnyStore, Store};
use serde_json::json;

use super::stored::{lock_name, records, seeded, NAME, UID};
use super::{bounded, fuzz_n, runtime, Bytes};

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
    // A semaphore's slots.
    if let Some(sem) = bounded(
        "semaphore_status",
        status::semaphore_status(&store, &lock_name()),
    )
    .await
    .expect("semaphore status")
    {
        prop_assert!(sem.slots.len() <= section::MAX_LIMIT as usize);
    }

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
