//! `putex id` (identity pools) against real stores: the embedded SQLite
//! store (separate handles, like separate processes) and a real
//! nats-server; and the `putex` binary for exit codes and output.
//!
//! Every scenario runs on both backends, each in a pool of its own, all
//! scenarios of one backend at once.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use putex::core::{LockState, Observed};
use putex::locks::idpool::{self, Claimant, IdError, IdRange, NameRecord, NameState, Options};
use putex::store::{keys, AnyStore, Name, ReadMode, SqliteStore, Store, StoreUrl};

use crate::common::nats_server::NatsServer;

const T: Duration = Duration::from_secs(5);

fn who(name: &str, machine: &str) -> Claimant {
    Claimant {
        name: name.parse().unwrap(),
        machine: machine.into(),
    }
}

fn opts() -> Options {
    Options {
        timeout: T,
        // Short, so that the interrupted-claim scenario does not wait 10 s.
        pending_takeover: Duration::from_millis(300),
        deadline: Duration::from_secs(30),
    }
}

fn range(s: &str) -> Option<IdRange> {
    Some(s.parse().unwrap())
}

async fn state_of(s: &AnyStore, pool: &Name, n: u64) -> LockState {
    let e = s
        .get(&keys::id_record(pool, n), ReadMode::Leader, T)
        .await
        .unwrap()
        .expect("id record exists");
    Observed::decode(&e.value).record().expect("readable").state
}

async fn problems(s: &AnyStore, pool: &Name) -> Vec<String> {
    let report = idpool::check(s, pool, &opts()).await.unwrap();
    report.problems.iter().map(ToString::to_string).collect()
}

// ---------------------------------------------------------------------------
// Scenarios, generic over the backend.

/// 40 concurrent claims with distinct names (and machines), spread over
/// the handles, for a pool of exactly 40 ids: 40 distinct ids, a
/// consistent pool, and nothing left for a 41st.
async fn distinct_names_get_distinct_ids(handles: &[AnyStore]) {
    let pool: &Name = &"many".parse().unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let s = handles[i % handles.len()].clone();
            let pool = pool.clone();
            tokio::spawn(async move {
                idpool::claim(
                    &s,
                    &pool,
                    range("1-40"),
                    &who(&format!("host{i}.example.com"), &format!("m{i}")),
                    &opts(),
                )
                .await
                .unwrap_or_else(|e| panic!("claim {i} of 40: {e}"))
                .id
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for t in tasks {
        let id = t.await.unwrap();
        assert!((1..=40).contains(&id), "{id}");
        assert!(ids.insert(id), "id {id} handed out twice");
    }
    assert_eq!(ids.len(), 40);
    eprintln!("40 concurrent claims: {:?}", started.elapsed());
    let report = idpool::check(&handles[0], pool, &opts()).await.unwrap();
    assert_eq!(report.problems, Vec::new());
    assert_eq!(report.claimed, 40);
    let e = idpool::claim(&handles[1], pool, None, &who("host40", "m40"), &opts())
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "pool many: all 40 ids are claimed");
}

/// 8 concurrent claims with one name: one id, which every caller gets.
///
/// The others wait for the first claim's pending record up to 2 s before
/// they take it over: with the 300 ms of [`opts`], on a loaded host each
/// claim could be taken over before it finished, again and again, until
/// the deadline (taking over a stalled claim is
/// [`interrupted_claim_resumes`]'s).
async fn one_name_gets_one_id(handles: &[AnyStore]) {
    let pool: &Name = &"same".parse().unwrap();
    let patient = Options {
        pending_takeover: Duration::from_secs(2),
        ..opts()
    };
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = handles[i % handles.len()].clone();
            let (pool, patient) = (pool.clone(), patient.clone());
            tokio::spawn(async move {
                idpool::claim(
                    &s,
                    &pool,
                    range("1-254"),
                    &who("shared", "m-shared"),
                    &patient,
                )
                .await
                .unwrap_or_else(|e| panic!("claim {i} of name shared: {e}"))
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    let mut fresh = 0;
    for t in tasks {
        let c = t.await.unwrap();
        ids.insert(c.id);
        fresh += usize::from(!c.existing);
    }
    assert_eq!(ids.len(), 1, "one name, several ids: {ids:?}");
    assert!(fresh >= 1, "someone made the claim");
    let report = idpool::check(&handles[0], pool, &opts()).await.unwrap();
    assert_eq!(report.problems, Vec::new());
    assert_eq!(report.claimed, 1, "no stray claims were left");
}

/// A pool of three: the fourth claim fails with a clear message; a release
/// frees an id for it; re-claims are idempotent.
async fn exhaustion_release_and_reclaim(s: &AnyStore) {
    let pool: &Name = &"small".parse().unwrap();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let c = idpool::claim(s, pool, range("1-3"), &who(name, "m"), &opts())
            .await
            .unwrap();
        assert_eq!(c.id, i as u64 + 1);
        assert!(!c.existing);
    }
    let again = idpool::claim(s, pool, range("1-3"), &who("b", "m"), &opts())
        .await
        .unwrap();
    assert_eq!((again.id, again.existing), (2, true), "idempotent re-claim");
    let e = idpool::claim(s, pool, range("1-3"), &who("d", "m"), &opts())
        .await
        .unwrap_err();
    assert!(matches!(e, IdError::Exhausted { .. }), "{e:?}");
    assert_eq!(e.to_string(), "pool small: all 3 ids are claimed");
    // The failed claim left no pending name record behind.
    assert_eq!(problems(s, pool).await, Vec::<String>::new());

    let r = idpool::release(s, pool, &who("b", "m"), false, &opts())
        .await
        .unwrap();
    assert_eq!(r.ids, vec![(2, LockState::Released)]);
    assert!(r.name_record);
    assert_eq!(
        state_of(s, pool, 2).await,
        LockState::Released,
        "never deleted"
    );
    // The name's record was retired (a purge marker on NATS, whose trace
    // goes after 30 s): the same name claims again over it, and lets go.
    let b2 = idpool::claim(s, pool, None, &who("b", "m"), &opts())
        .await
        .unwrap();
    assert_eq!((b2.id, b2.existing), (2, false));
    let r = idpool::release(s, pool, &who("b", "m"), false, &opts())
        .await
        .unwrap();
    assert!(r.name_record && r.ids == vec![(2, LockState::Released)]);
    let d = idpool::claim(s, pool, None, &who("d", "m"), &opts())
        .await
        .unwrap();
    assert_eq!(d.id, 2, "the released id is reused");
    // A different range for an existing pool is refused.
    let e = idpool::claim(s, pool, range("1-10"), &who("e", "m"), &opts())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has the range 1-3"), "{e}");
    assert_eq!(problems(s, pool).await, Vec::<String>::new());
}

/// A cloned machine (same name, another machine id) is refused; a forced
/// release revokes the old claim, and the revoked id is not handed out again.
async fn cloned_machine_and_forced_release(s: &AnyStore) {
    let pool: &Name = &"clone".parse().unwrap();
    let n = idpool::claim(s, pool, range("1-5"), &who("web1", "machine-a"), &opts())
        .await
        .unwrap()
        .id;
    let e = idpool::claim(s, pool, range("1-5"), &who("web1", "machine-b"), &opts())
        .await
        .unwrap_err();
    assert!(matches!(e, IdError::OtherMachine { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "name web1 holds id {n} in pool clone, claimed by machine machine-a"
        )) && msg.contains("this machine is machine-b")
            && msg.contains("a cloned machine?")
            && msg.contains("force the old claim's release"),
        "{msg}"
    );
    let e = idpool::release(s, pool, &who("web1", "machine-b"), false, &opts())
        .await
        .unwrap_err();
    assert!(matches!(e, IdError::NotOwner { .. }), "{e:?}");
    assert_eq!(
        state_of(s, pool, n).await,
        LockState::Active,
        "refused: untouched"
    );

    let r = idpool::release(s, pool, &who("web1", "machine-b"), true, &opts())
        .await
        .unwrap();
    assert_eq!(r.ids, vec![(n, LockState::Revoked)]);
    let key = keys::id_record(pool, n);
    let e = s.get(&key, ReadMode::Leader, T).await.unwrap().unwrap();
    let rec = Observed::decode(&e.value).record().cloned().unwrap();
    assert_eq!(rec.state, LockState::Revoked);
    assert_eq!(
        (rec.node.as_str(), rec.machine.as_str()),
        ("web1", "machine-a"),
        "S7: the revocation keeps the holder's identity"
    );
    // The clone may now claim with the name; it gets another id.
    let m = idpool::claim(s, pool, None, &who("web1", "machine-b"), &opts())
        .await
        .unwrap()
        .id;
    assert_ne!(m, n, "a revoked id is not reused");
    assert!(!idpool::free_candidates(s, pool, "1-5".parse().unwrap())
        .await
        .unwrap()
        .contains(&n));
    assert_eq!(problems(s, pool).await, Vec::<String>::new());
}

/// Garbage written by someone else: claims skip it, list shows it, check
/// reports it; two names pointing at one id are reported too.
async fn garbage_and_corruption(s: &AnyStore) {
    let pool: &Name = &"dirty".parse().unwrap();
    assert_eq!(
        idpool::claim(s, pool, range("1-10"), &who("a", "m"), &opts())
            .await
            .unwrap()
            .id,
        1
    );
    assert_eq!(problems(s, pool).await, Vec::<String>::new());
    s.create(&keys::id_record(pool, 2), b"\x00\xffnot json", T)
        .await
        .unwrap();
    assert_eq!(
        idpool::claim(s, pool, None, &who("b", "m"), &opts())
            .await
            .unwrap()
            .id,
        3,
        "the garbage id is treated as taken"
    );
    assert_eq!(
        idpool::free_candidates(s, pool, "1-5".parse().unwrap())
            .await
            .unwrap(),
        vec![4, 5]
    );
    let listing = idpool::list(s, pool, &opts()).await.unwrap();
    let states: Vec<(Option<u64>, &str)> = listing
        .ids
        .iter()
        .map(|e| (e.id, e.state.as_str()))
        .collect();
    assert_eq!(
        states,
        vec![
            (Some(1), "active"),
            (Some(2), "garbage"),
            (Some(3), "active")
        ]
    );
    let p = problems(s, pool).await;
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("id.dirty.2") && p[0].contains("garbage"),
        "{p:?}"
    );

    // A hand-made name record pointing at a's id.
    let forged = NameRecord {
        v: 1,
        kind: "name".into(),
        pool: pool.to_string(),
        name: "x".into(),
        machine: "m".into(),
        state: NameState::Bound,
        id: Some(1),
        write: "forged".into(),
    };
    s.create(
        &keys::id_name(pool, &"x".parse().unwrap()),
        &serde_json::to_vec(&forged).unwrap(),
        T,
    )
    .await
    .unwrap();
    let p = problems(s, pool).await;
    assert!(
        p.iter().any(|p| p.contains("several names: a, x")),
        "{p:#?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("name x points at id 1, but id 1 is active by a")),
        "{p:#?}"
    );
}

/// A claim interrupted after it took its id but before it bound its name:
/// check explains it, and the next claim with the name resumes that id.
async fn interrupted_claim_resumes(s: &AnyStore) {
    let pool: &Name = &"crash".parse().unwrap();
    let me = who("z.example.com", "m");
    // Let a claim run, then rewind its name record to `pending`, as if it
    // had crashed between steps 3 and 4.
    let n = idpool::claim(s, pool, range("1-9"), &me, &opts())
        .await
        .unwrap()
        .id;
    let key = keys::id_name(pool, &me.name);
    let e = s.get(&key, ReadMode::Leader, T).await.unwrap().unwrap();
    let pending = NameRecord {
        v: 1,
        kind: "name".into(),
        pool: pool.to_string(),
        name: me.name.to_string(),
        machine: me.machine.clone(),
        state: NameState::Pending,
        id: None,
        write: "crashed".into(),
    };
    s.update(&key, &serde_json::to_vec(&pending).unwrap(), e.token, T)
        .await
        .unwrap();
    // On etcd a record's age counts from when this handle first saw it
    // (`docs/stores.md`): let it see the pending record now, as a running
    // process would. (Elsewhere a no-op.)
    let _ = problems(s, pool).await;
    // Older than the grace, so check calls it interrupted — on the store's
    // clock, which on etcd reads in whole seconds (`clock_step`): 350 ms
    // can fall within one of them.
    tokio::time::sleep(Duration::from_millis(350) + s.clock_step()).await;
    let p = problems(s, pool).await;
    assert!(p.iter().any(|p| p.contains("pending")), "{p:#?}");
    let started = Instant::now();
    let again = idpool::claim(s, pool, None, &me, &opts()).await.unwrap();
    assert_eq!(again.id, n, "the interrupted claim's id is resumed");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited out the pending record"
    );
    assert_eq!(problems(s, pool).await, Vec::<String>::new());
}

/// A bad pool or claim name never reaches a pool: it does not parse (the
/// CLI's refusal and exit code are `id_pool_cli_exit_codes_and_output`'s).
async fn bad_input(_: &AnyStore) {
    let e = "bad.pool".parse::<Name>().unwrap_err();
    assert!(e.to_string().contains("invalid name"), "{e}");
    let e = "a..b".parse::<putex::store::NodeId>().unwrap_err();
    assert!(e.to_string().contains("invalid node id"), "{e}");
}

async fn suite(handles: &[AnyStore]) {
    let s = &handles[0];
    tokio::join!(
        distinct_names_get_distinct_ids(handles),
        one_name_gets_one_id(handles),
        exhaustion_release_and_reclaim(s),
        cloned_machine_and_forced_release(&handles[1]),
        garbage_and_corruption(&handles[2]),
        interrupted_claim_resumes(&handles[3]),
        bad_input(s),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_pool_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(AnyStore::from(
            SqliteStore::open(path.clone()).await.unwrap(),
        ));
    }
    let started = Instant::now();
    suite(&handles).await;
    eprintln!("sqlite suite: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_pool_nats() {
    let server = NatsServer::start();
    let url = StoreUrl::parse(&server.url).unwrap();
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(AnyStore::open(&url).await.unwrap());
    }
    let started = Instant::now();
    suite(&handles).await;
    eprintln!("nats suite: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_pool_etcd() {
    let server = crate::common::etcd_server::EtcdServer::start();
    let url = StoreUrl::parse(&format!("etcd://{}", server.endpoint())).unwrap();
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(AnyStore::open(&url).await.unwrap());
    }
    let started = Instant::now();
    suite(&handles).await;
    eprintln!("etcd suite: {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// The binary.

fn putex(store: &str, machine: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_putex"))
        .args(args)
        .env("PUTEX_STORE", store)
        .env("PUTEX_MACHINE_ID", machine)
        .env_remove("RUST_LOG")
        .output()
        .expect("run putex")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn id_pool_cli_exit_codes_and_output() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("store.db").display());
    let claim = |name: &str, machine: &str| {
        putex(
            &store,
            machine,
            &["id", "claim", "web", "--range", "1-3", "--name", name],
        )
    };
    // Claims print the id and nothing else on stdout.
    let o = claim("web1", "aaaaaaaaaaaaaaaa1111");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "1\n");
    let o = claim("web1", "aaaaaaaaaaaaaaaa1111");
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), "1\n".into()),
        "idempotent"
    );

    // Concurrent claims from separate processes: distinct ids.
    let children: Vec<_> = ["web2", "web3"]
        .iter()
        .map(|n| {
            Command::new(env!("CARGO_BIN_EXE_putex"))
                .args(["id", "claim", "web", "--range", "1-3", "--name", n])
                .env("PUTEX_STORE", &store)
                .env("PUTEX_MACHINE_ID", format!("machine-{n}"))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids: Vec<String> = children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert_eq!(o.status.code(), Some(0));
            text(&o.stdout)
        })
        .collect();
    ids.sort();
    assert_eq!(ids, vec!["2\n", "3\n"]);

    // Exhausted: 75, with the message.
    let o = claim("web4", "machine-web4");
    assert_eq!(o.status.code(), Some(75));
    assert_eq!(text(&o.stdout), "");
    assert!(
        text(&o.stderr).contains("pool web: all 3 ids are claimed"),
        "{}",
        text(&o.stderr)
    );
    // A clone of web1's machine under the same hostname: refused, 64.
    let o = claim("web1", "bbbbbbbbbbbbbbbb2222");
    assert_eq!(o.status.code(), Some(64));
    let err = text(&o.stderr);
    assert!(
        err.contains("name web1 holds id 1 in pool web, claimed by machine aaaaaaaaaaaa…; this machine is bbbbbbbbbbbb…: a cloned machine?"),
        "{err}"
    );
    // Usage errors: 64 (ours and clap's).
    for args in [
        &["id", "claim", "web", "--range", "5-1"][..],
        &["id", "claim", "new", "--range", "a-b"],
        &["id", "claim", "new", "--range", "1-100000"],
        &["id", "claim", "bad.pool", "--range", "1-3"],
        &["id", "claim", "web", "--name", "a b"],
        &["id", "claim"],
    ] {
        let o = putex(&store, "m", args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", text(&o.stderr));
    }
    // An unreachable store: 69.
    let o = putex(
        "nats://127.0.0.1:1",
        "m",
        &["id", "list", "web", "--timeout", "1s"],
    );
    assert_eq!(o.status.code(), Some(69), "{}", text(&o.stderr));

    // list, as a table and as JSON.
    let o = putex(&store, "m", &["id", "list", "web"]);
    assert_eq!(o.status.code(), Some(0));
    let table = text(&o.stdout);
    assert!(
        table.contains("pool web: range 1-3, 3 ids claimed") && table.contains("web1"),
        "{table}"
    );
    let o = putex(&store, "m", &["id", "list", "web", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["claimed"], 3);
    assert_eq!(v["ids"][0]["name"], "web1");
    assert_eq!(v["ids"][0]["state"], "active");

    // check: consistent, 0.
    let o = putex(&store, "m", &["id", "check", "web"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert_eq!(text(&o.stdout), "pool web: 3 ids claimed, consistent\n");

    // release by the owner; the released id goes to the next claim.
    let o = putex(
        &store,
        "aaaaaaaaaaaaaaaa1111",
        &["id", "release", "web", "--name", "web1"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "pool web: released id 1 (name web1)\n");
    let o = claim("web4", "machine-web4");
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), "1\n".into()));

    // Garbage in an id record: list shows it, check fails with 65.
    let o = putex(
        &store,
        "m",
        &["id", "claim", "other", "--range", "1-2", "--name", "x"],
    );
    assert_eq!(text(&o.stdout), "1\n");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = SqliteStore::open(dir.path().join("store.db"))
            .await
            .unwrap();
        s.create("id.other.2", b"garbage", T).await.unwrap();
    });
    let o = putex(&store, "m", &["id", "list", "other"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).contains("garbage"), "{}", text(&o.stdout));
    let o = putex(&store, "m", &["id", "claim", "other", "--name", "y"]);
    assert_eq!(o.status.code(), Some(75), "the garbage id counts as taken");
    assert!(
        text(&o.stderr).contains("1 unreadable"),
        "{}",
        text(&o.stderr)
    );
    let o = putex(&store, "m", &["id", "check", "other"]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        text(&o.stdout).contains("id.other.2"),
        "{}",
        text(&o.stdout)
    );
}

/// Issue 14 item 9: a claim's write that times out and lands later (as
/// NATS writes have been seen to) must not leave an orphaned claim. Every
/// id record's first write is reported unknown and lands 300 ms later; the
/// claim settles it (read back, write again) instead of taking it for "not
/// written" and moving on to the next id.
#[tokio::test]
async fn r20_a_claim_whose_write_lands_late_leaves_no_orphan() {
    use putex::store::memory::Fault;
    use putex::store::MemoryStore;
    let mem = MemoryStore::new();
    let pool: &Name = &"late".parse().unwrap();
    for n in 1..=4 {
        mem.inject_on(
            &keys::id_record(pool, n),
            Fault::LandLater(Duration::from_millis(300)),
        );
    }
    let s = AnyStore::from(mem);
    let opts = Options {
        timeout: Duration::from_millis(100),
        ..opts()
    };
    let got = idpool::claim(&s, pool, range("1-4"), &who("h1", "m1"), &opts)
        .await
        .unwrap();
    // Every late write has landed (or found its condition gone) by now.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut claimed = Vec::new();
    for n in 1..=4 {
        let e = s
            .get(&keys::id_record(pool, n), ReadMode::Leader, T)
            .await
            .unwrap();
        if let Some(e) = e {
            if let Some(r) = Observed::decode(&e.value).record() {
                if r.state == LockState::Active && r.node == "h1" {
                    claimed.push(n);
                }
            }
        }
    }
    assert_eq!(claimed, vec![got.id], "one claim, the one reported");
    assert!(
        problems(&s, pool).await.is_empty(),
        "{:?}",
        problems(&s, pool).await
    );
    // Claiming again under the same name gives the same id.
    let again = idpool::claim(&s, pool, None, &who("h1", "m1"), &opts)
        .await
        .unwrap();
    assert_eq!(again.id, got.id);
}
