//! Unit tests of identity pools on the memory store.

use super::records::{claim_record, encode_id, IdSlot};
use super::*;
use crate::store::{AnyStore, MemoryStore};

fn who(name: &str, machine: &str) -> Claimant {
    Claimant {
        name: name.parse().unwrap(),
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
        // The library names no flag: `putex id` says "--range" itself.
        assert!(e.starts_with("range "), "{e}");
    }
}

#[test]
fn id_records_are_lock_records_with_extra_fields() {
    let rec = claim_record(&who("web1", "m1"), "i1");
    let bytes = encode_id(&"web".parse().unwrap(), 7, &rec);
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
    let a = claim(&store, &"p".parse().unwrap(), range, &who("a", "m"), &o)
        .await
        .unwrap();
    assert_eq!(
        a,
        Claimed {
            id: 1,
            existing: false
        }
    );
    // Idempotent; the range may be left out once the pool exists.
    let again = claim(&store, &"p".parse().unwrap(), None, &who("a", "m"), &o)
        .await
        .unwrap();
    assert_eq!(
        again,
        Claimed {
            id: 1,
            existing: true
        }
    );
    assert_eq!(
        claim(&store, &"p".parse().unwrap(), range, &who("b", "m"), &o)
            .await
            .unwrap()
            .id,
        2
    );
    let e = claim(&store, &"p".parse().unwrap(), range, &who("c", "m"), &o)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "pool p: all 2 ids are claimed");
    let r = release(&store, &"p".parse().unwrap(), &who("a", "m"), false, &o)
        .await
        .unwrap();
    assert_eq!(r.ids, vec![(1, LockState::Released)]);
    assert!(
        release(&store, &"p".parse().unwrap(), &who("a", "m"), false, &o)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        claim(&store, &"p".parse().unwrap(), range, &who("c", "m"), &o)
            .await
            .unwrap()
            .id,
        1
    );
    let e = claim(
        &store,
        &"p".parse().unwrap(),
        Some("1-3".parse().unwrap()),
        &who("d", "m"),
        &o,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, IdError::RangeMismatch { .. }), "{e}");
    let e = claim(&store, &"q".parse().unwrap(), None, &who("d", "m"), &o)
        .await
        .unwrap_err();
    assert!(matches!(e, IdError::NoRange { .. }), "{e}");
    let report = check(&store, &"p".parse().unwrap(), &o).await.unwrap();
    assert_eq!(report.problems, Vec::new());
    assert_eq!(report.claimed, 2);
}

/// Reads that go unanswered for a moment (a slow store, a lost connection)
/// do not fail a claim that still has time; a store that never answers
/// fails it at its deadline, saying the store did not answer.
#[tokio::test]
async fn a_claim_outlives_unanswered_reads_until_its_deadline() {
    use crate::store::memory::Fault;
    let mem = MemoryStore::new();
    let store = AnyStore::from(mem.clone());
    let pool: Name = "p".parse().unwrap();
    let o = Options {
        timeout: Duration::from_millis(50),
        deadline: Duration::from_millis(600),
        ..Options::default()
    };
    let range = Some("1-3".parse().unwrap());
    assert_eq!(
        claim(&store, &pool, range, &who("a", "m"), &o)
            .await
            .unwrap()
            .id,
        1
    );

    // The next three operations (the claim's first reads) time out.
    for _ in 0..3 {
        mem.inject(Fault::Stall);
    }
    let b = claim(&store, &pool, None, &who("b", "m"), &o)
        .await
        .unwrap();
    assert_eq!((b.id, b.existing), (2, false));
    let report = check(&store, &pool, &o).await.unwrap();
    assert_eq!((report.claimed, report.problems), (2, Vec::new()));

    // A store that answers nothing: the claim gives up at its deadline.
    for _ in 0..1_000 {
        mem.inject(Fault::Stall);
    }
    let started = std::time::Instant::now();
    let e = claim(&store, &pool, None, &who("c", "m"), &o)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(&e, IdError::Store(s) if s.is_unknown()), "{e:?}");
    assert!(
        took >= o.deadline - Duration::from_millis(100) && took < o.deadline * 2,
        "gave up after {took:?}"
    );
}
