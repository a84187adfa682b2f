//! Unit tests of writing, pruning, reading and deriving history.

use super::writer::prune;
use super::*;
use crate::store::MemoryStore;

fn rec(node: &str, instance: &str, from: Role, to: Role, reason: Reason) -> TransitionRecord {
    TransitionRecord {
        v: 1,
        lock: "pg".into(),
        key: None,
        node: node.into(),
        instance: instance.into(),
        seq: 0,
        source: "run".into(),
        from: from.to_string(),
        to: to.to_string(),
        reason: reason.to_string(),
        reason_code: reason_code(&reason).into(),
        token: Some(Token::new(1, 1)),
        stale: match reason {
            Reason::AcquiredStale {
                revision,
                unchanged_for,
                store_age,
            } => Some(StaleEvidence {
                revision,
                unchanged_for_ms: millis(unchanged_for),
                store_age_ms: store_age.map(millis),
            }),
            _ => None,
        },
        at: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn at(revision: u64, ms: u64, record: TransitionRecord) -> Stored {
    Stored {
        key: format!("history.pg.{}-{revision}", record.node),
        revision,
        time: StoreTime {
            era: 1,
            nanos: ms * 1_000_000,
        },
        record,
    }
}

#[test]
fn only_holding_transitions_are_recorded() {
    assert!(!is_recorded(Role::Starting, Role::Standby));
    assert!(!is_recorded(Role::Standby, Role::Exited));
    assert!(is_recorded(Role::Standby, Role::Confirming));
    assert!(is_recorded(Role::Confirming, Role::Active));
    assert!(is_recorded(Role::Active, Role::SteppingDown));
    assert!(is_recorded(Role::Lapsed, Role::Standby));
    assert!(is_recorded(Role::Starting, Role::Active)); // resumed (S5)
}

#[test]
fn codes_are_distinct() {
    let all = [
        Reason::Started,
        Reason::AcquiredReleased,
        Reason::AcquiredStale {
            revision: Token::new(1, 2),
            unchanged_for: Duration::ZERO,
            store_age: None,
        },
        Reason::AcquiredAbsent,
        Reason::Resumed,
        Reason::ResumedPaused,
        Reason::Activated,
        Reason::LicenceEnded,
        Reason::Lost(putex_core::LossCause::Revoked),
        Reason::Unhealthy,
        Reason::Shutdown,
        Reason::ReleaseRequested,
        Reason::ServiceExited,
        Reason::ActivationFailed,
        Reason::KeeperRefused,
        Reason::StopTimedOut,
        Reason::StopFailed,
        Reason::KeeperFired,
        Reason::KeeperLost,
        Reason::Released,
        Reason::ReleaseFailed,
        Reason::Stopped,
    ];
    let codes: std::collections::HashSet<_> = all.iter().map(reason_code).collect();
    assert_eq!(codes.len(), all.len());
}

#[test]
fn crash_failover_and_graceful_handover_are_derived() {
    use Role::*;
    let stale = Reason::AcquiredStale {
        revision: Token::new(1, 5),
        unchanged_for: Duration::from_millis(330),
        store_age: Some(Duration::from_millis(320)),
    };
    let records = vec![
        at(
            1,
            0,
            rec("a", "ia", Standby, Confirming, Reason::AcquiredAbsent),
        ),
        at(
            2,
            500,
            rec("a", "ia", Confirming, Active, Reason::Activated),
        ),
        // a crashes: no record. b takes over after W, activates after G.
        at(9, 2_000, rec("b", "ib", Standby, Confirming, stale)),
        at(
            10,
            2_100,
            rec("b", "ib", Confirming, Active, Reason::Activated),
        ),
        // b hands over gracefully.
        at(
            11,
            3_000,
            rec("b", "ib", Active, SteppingDown, Reason::Shutdown),
        ),
        at(
            12,
            3_050,
            rec("b", "ib", SteppingDown, Standby, Reason::Released),
        ),
        at(
            13,
            3_060,
            rec("c", "ic", Standby, Confirming, Reason::AcquiredReleased),
        ),
        at(
            14,
            3_070,
            rec("c", "ic", Confirming, Active, Reason::Activated),
        ),
    ];
    let rows = derive(&records);
    let acts: Vec<&HistoryRow> = rows.iter().filter(|r| r.activation).collect();
    assert_eq!(acts.len(), 3);
    assert_eq!(acts[0].record.node, "a");
    assert_eq!(acts[0].previous_holder, None);
    assert_eq!(acts[0].no_holder_ms, None);
    assert_eq!(acts[0].acquired.as_deref(), Some("acquired-absent"));
    // b: 100 ms after its takeover, which found a's record 320 ms old.
    assert_eq!(acts[1].previous_holder.as_deref(), Some("a"));
    assert_eq!(acts[1].no_holder_ms, Some(420));
    assert_eq!(acts[1].no_holder_basis, Some(NoHolderBasis::LastRenewal));
    assert_eq!(acts[1].acquired.as_deref(), Some("acquired-stale"));
    // c: from b's leaving active to c's activation.
    assert_eq!(acts[2].previous_holder.as_deref(), Some("b"));
    assert_eq!(acts[2].no_holder_ms, Some(70));
    assert_eq!(acts[2].no_holder_basis, Some(NoHolderBasis::Left));
    // Holders along the way.
    let holders: Vec<Option<&str>> = rows.iter().map(|r| r.holder.as_deref()).collect();
    assert_eq!(
        holders,
        [
            None,
            Some("a"),
            Some("a"),
            Some("b"),
            None,
            None,
            None,
            Some("c")
        ]
    );
    let json = serde_json::to_value(&rows[3]).unwrap();
    for k in [
        "revision",
        "store_time",
        "lock",
        "node",
        "from",
        "to",
        "reason",
        "reason_code",
        "token",
        "at",
        "holder",
        "no_holder_ms",
    ] {
        assert!(json.get(k).is_some(), "{k} missing in {json}");
    }
}

/// An epoch of NATS's size: above 2^53, inexact as a JavaScript number.
const BIG_EPOCH: u64 = 1_795_591_562_840_662_982;

#[test]
fn history_json_carries_tokens_as_strings_and_the_stored_record_numbers() {
    let stale = Reason::AcquiredStale {
        revision: Token::new(BIG_EPOCH, 812),
        unchanged_for: Duration::from_millis(330),
        store_age: Some(Duration::from_millis(320)),
    };
    let mut r = rec("b", "ib", Role::Standby, Role::Confirming, stale);
    r.token = Some(Token::new(BIG_EPOCH, 815));
    r.key = Some("sem.pg.0".into());
    // The stored record: numbers, as older versions wrote and read them.
    let stored = serde_json::to_string(&r).unwrap();
    assert!(
        stored.contains(&format!(
            r#""token":{{"epoch":{BIG_EPOCH},"revision":815}}"#
        )),
        "{stored}"
    );
    assert!(
        stored.contains(&format!(
            r#""revision":{{"epoch":{BIG_EPOCH},"revision":812}}"#
        )),
        "{stored}"
    );
    // The output: strings, every digit kept.
    let rows = derive(&[at(9, 2_000, r.clone())]);
    let text = serde_json::to_string(&rows[0]).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["token"],
        serde_json::json!({"epoch": BIG_EPOCH.to_string(), "revision": "815"}),
        "{text}"
    );
    assert_eq!(
        json["stale"]["revision"],
        serde_json::json!({"epoch": BIG_EPOCH.to_string(), "revision": "812"}),
        "{text}"
    );
    assert_eq!(json["stale"]["store_age_ms"], 320);
    // The output has every field of the stored record, and only the
    // tokens differ.
    let mut as_stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    as_stored["token"] = json["token"].clone();
    as_stored["stale"]["revision"] = json["stale"]["revision"].clone();
    for (k, v) in as_stored.as_object().unwrap() {
        assert_eq!(json.get(k), Some(v), "{k} in {text}");
    }
    // Without a token or stale evidence, neither appears.
    let mut plain = rec("b", "ib", Role::Confirming, Role::Active, Reason::Activated);
    plain.token = None;
    let json = serde_json::to_value(&derive(&[at(10, 2_100, plain)])[0]).unwrap();
    assert!(
        json.get("token").is_none() && json.get("stale").is_none(),
        "{json}"
    );
    assert!(json.get("key").is_none(), "{json}");
}

#[test]
fn stored_records_read_with_numbers_or_strings() {
    let numbers = format!(
        r#"{{"v":1,"lock":"pg","node":"b","instance":"ib","seq":3,"source":"run",
        "from":"standby","to":"confirming","reason":"r","reason_code":"acquired-stale",
        "token":{{"epoch":{BIG_EPOCH},"revision":815}},
        "stale":{{"revision":{{"epoch":{BIG_EPOCH},"revision":812}},"unchanged_for_ms":1}},
        "at":"2026-01-01T00:00:00.000Z"}}"#
    );
    let strings = numbers
        .replace(&format!(":{BIG_EPOCH},"), &format!(":\"{BIG_EPOCH}\","))
        .replace(":815}", ":\"815\"}")
        .replace(":812}", ":\"812\"}");
    assert_ne!(numbers, strings);
    let entry = |text: &str, revision| {
        (
            format!("history.pg.b-ib-{revision}"),
            Entry {
                value: text.as_bytes().to_vec(),
                token: Token::new(1, revision),
                time: StoreTime { era: 1, nanos: 0 },
            },
        )
    };
    let got = parse([entry(&numbers, 1), entry(&strings, 2)]);
    assert_eq!(got.len(), 2);
    for s in &got {
        assert_eq!(s.record.token, Some(Token::new(BIG_EPOCH, 815)));
        assert_eq!(
            s.record.stale.map(|e| e.revision),
            Some(Token::new(BIG_EPOCH, 812))
        );
    }
    assert_eq!(got[0].record, got[1].record);
}

#[test]
fn a_late_record_of_an_old_holder_does_not_take_the_lock_back() {
    use Role::*;
    let records = vec![
        at(2, 0, rec("a", "ia", Confirming, Active, Reason::Activated)),
        at(
            10,
            2_100,
            rec("b", "ib", Confirming, Active, Reason::Activated),
        ),
        // a's agent was frozen; it records its lapse afterwards.
        at(
            11,
            2_500,
            rec("a", "ia", Active, Lapsed, Reason::KeeperFired),
        ),
    ];
    let rows = derive(&records);
    assert_eq!(rows[2].holder.as_deref(), Some("b"));
    assert_eq!(rows[1].previous_holder.as_deref(), Some("a"));
}

#[tokio::test]
async fn pruning_leaves_nothing_behind_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = AnyStore::from(crate::store::SqliteStore::open(path.clone()).await.unwrap());
    let t = Duration::from_secs(2);
    let w = HistoryWriter::spawn(store.clone(), WriterConfig::for_test("pg", "a", "ia", t));
    for _ in 0..3 {
        w.transition(Role::Confirming, Role::Active, &Reason::Activated, None);
        w.transition(Role::Active, Role::SteppingDown, &Reason::Shutdown, None);
    }
    w.flush(t).await;
    assert_eq!(
        prune(&store, &"pg".parse().unwrap(), 2, t).await.unwrap(),
        4
    );
    let left = read(&store, &"pg".parse().unwrap(), t).await.unwrap();
    assert_eq!(
        left.iter().map(|s| s.record.seq).collect::<Vec<_>>(),
        [4, 5]
    );
    // No tombstones: the records and the scan marker are all that is left.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM kv WHERE key LIKE 'history.%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 3);
}

#[tokio::test]
async fn writer_writes_in_order_and_prunes() {
    let store = AnyStore::from(MemoryStore::new());
    let mut cfg = WriterConfig::new(
        &"pg".parse().unwrap(),
        &"db1.example.com".parse().unwrap(),
        &"abcdef0123".parse().unwrap(),
        "run",
        Duration::from_secs(1),
    );
    cfg.keep = 4;
    cfg.prune_every = 1;
    let w = HistoryWriter::spawn(store.clone(), cfg);
    for _ in 0..5 {
        w.transition(
            Role::Standby,
            Role::Confirming,
            &Reason::AcquiredReleased,
            Some(Token::new(1, 3)),
        );
        w.transition(
            Role::Confirming,
            Role::Active,
            &Reason::Activated,
            Some(Token::new(1, 3)),
        );
        // Not recorded.
        w.transition(Role::Starting, Role::Standby, &Reason::Started, None);
    }
    // The flush finishes the prune that the last write made due, as a
    // process about to exit needs (`putex lock`): nothing to wait for after.
    w.flush(Duration::from_secs(5)).await;
    drop(w);
    let all = read(&store, &"pg".parse().unwrap(), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    let seqs: Vec<u64> = all.iter().map(|s| s.record.seq).collect();
    assert_eq!(seqs, [6, 7, 8, 9]);
    assert!(all[0]
        .key
        .starts_with("history.pg.db1.example.com-abcdef01-"));
    assert_eq!(all[3].record.reason_code, "activated");
    assert_eq!(all[3].record.token, Some(Token::new(1, 3)));
}

/// A one-shot command's writer (`putex lock`): a few records, the exit's
/// flush, and the runtime gone right after — every task cut off, as at a
/// process exit. The flush finishes the prune the last record made due;
/// before, the exit cut every prune short and the lock kept every record
/// ever written.
#[test]
fn a_flush_finishes_the_due_prune_before_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let t = Duration::from_secs(2);
    for run in 0..3 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let store =
                AnyStore::from(crate::store::SqliteStore::open(path.clone()).await.unwrap());
            let mut cfg = WriterConfig::for_test("pg", "a", &format!("i{run}"), t);
            cfg.keep = 2;
            cfg.prune_every = 1;
            let w = HistoryWriter::spawn(store, cfg);
            for _ in 0..2 {
                w.transition(Role::Confirming, Role::Active, &Reason::Activated, None);
                w.transition(Role::Active, Role::SteppingDown, &Reason::Shutdown, None);
            }
            w.flush(t).await;
        });
        drop(rt);
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let left = rt.block_on(async {
        let store = AnyStore::from(crate::store::SqliteStore::open(path.clone()).await.unwrap());
        read(&store, &"pg".parse().unwrap(), t).await.unwrap()
    });
    assert_eq!(left.len(), 2, "{left:?}");
}

/// A prune is due after about one write in `PRUNE_EVERY`, also when the
/// revisions keep one remainder (a `putex lock` run writing the same
/// records each time: 1,000 runs whose transition records' revisions were
/// never a multiple of 32 pruned nothing).
#[test]
fn a_prune_is_due_about_once_in_prune_every_whatever_the_revisions() {
    for (start, step) in [(1_796_006_227_958_561_u64, 32), (5, 64), (1, 1), (7, 4)] {
        let due = (0..32_000u64)
            .filter(|i| prune_due(start + i * step, PRUNE_EVERY))
            .count();
        assert!(
            (700..1300).contains(&due),
            "{start}+{step}k: {due} of 32,000"
        );
    }
    assert!((0..100).all(|r| prune_due(r, 1)));
    assert!(!(0..100).any(|r| prune_due(r, 0)));
}

/// A note that changes no role (a stretch on failsafe grants, an
/// operator's pause) is never an activation, even written after its
/// holder's tenure ended and another node took over; the takeover still is.
#[test]
fn a_late_note_of_an_old_holder_is_no_activation() {
    use Role::*;
    let note = |node: &str, instance: &str| TransitionRecord {
        reason_code: "failsafe".into(),
        reason: "failsafe from … for 9s: …; a round lost at …".into(),
        ..rec(node, instance, Active, Active, Reason::Activated)
    };
    let records = vec![
        at(
            1,
            0,
            rec("a", "ia", Standby, Confirming, Reason::AcquiredAbsent),
        ),
        at(
            2,
            500,
            rec("a", "ia", Confirming, Active, Reason::Activated),
        ),
        at(3, 600, note("a", "ia")),
        at(
            4,
            9_000,
            rec("b", "ib", Standby, Confirming, Reason::AcquiredReleased),
        ),
        at(
            5,
            9_100,
            rec("b", "ib", Confirming, Active, Reason::Activated),
        ),
        // a's records of the end of its tenure, written once the store
        // answered it again: after b's.
        at(6, 9_200, note("a", "ia")),
        at(
            7,
            9_300,
            rec("a", "ia", Active, Lapsed, Reason::LicenceEnded),
        ),
    ];
    let rows = derive(&records);
    let acts: Vec<&str> = rows
        .iter()
        .filter(|r| r.activation)
        .map(|r| r.record.node.as_str())
        .collect();
    assert_eq!(acts, ["a", "b"]);
    assert_eq!(rows.last().unwrap().holder.as_deref(), Some("b"));
}
