use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use crate::supervision::process::ProcId;

const STORE: &str = "nats://127.0.0.1:4222/putex";

fn tree(pid: i32) -> TreeSnapshot {
    TreeSnapshot {
        members: vec![ProcId { pid, start: 7 }],
        ..TreeSnapshot::default()
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_record_round_trips_and_nothing_recorded_reads_as_none() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    assert!(hs.path().to_string_lossy().ends_with("-lock.pg.state.json"));
    assert_eq!(hs.load(), None);
    let written = hs
        .update(|r| {
            r.instance = "i1".into();
            r.boot_id = "b1".into();
            r.highest = Some(Token::new(5, 7));
            r.tree = Some(tree(42));
        })
        .unwrap();
    assert_eq!(hs.load(), Some(written));
    // One file, no temporary left behind.
    assert_eq!(files(dir.path()).len(), 1, "{:?}", files(dir.path()));
}

#[test]
fn the_highest_token_never_falls_whoever_writes() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    hs.raise(Token::new(3, 10)).unwrap();
    hs.raise(Token::new(3, 2)).unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(3, 10)));
    // An agent writing an older value of its own does not lower it either.
    hs.update(|r| r.highest = Some(Token::new(1, 1))).unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(3, 10)));
    hs.update(|r| r.highest = None).unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(3, 10)));
}

#[test]
fn the_files_of_earlier_releases_are_read_merged_and_then_removed() {
    let dir = tempfile::tempdir().unwrap();
    let base = socket_path(dir.path(), STORE, "pg");
    let old_agent = base.with_extension("state");
    let old_section = socket_path(dir.path(), STORE, "lock.pg").with_extension("highest");
    // As the agent of earlier releases wrote it (no optional field missing).
    std::fs::write(
        &old_agent,
        r#"{"instance":"old","boot_id":"b0","highest":{"epoch":2,"revision":40},"tree":{"members":[{"pid":42,"start":7}],"groups":[],"sessions":[]}}"#,
    )
    .unwrap();
    std::fs::write(&old_section, r#"{"epoch":2,"revision":55}"#).unwrap();
    let token = Token::new(2, 55);

    let hs =
        HostState::new(dir.path(), STORE, "lock.pg").with_agent_legacy(dir.path(), STORE, "pg");
    let loaded = hs.load().unwrap();
    assert_eq!(loaded.instance, "old");
    assert_eq!(loaded.boot_id, "b0");
    assert_eq!(loaded.highest, Some(token), "the higher of the two wins");
    assert_eq!(loaded.tree, Some(tree(42)));

    // A section (which knows nothing of the agent's file name) still sees
    // the section file of its own key.
    let section = HostState::new(dir.path(), STORE, "lock.pg");
    assert_eq!(section.load().unwrap().highest, Some(token));

    hs.update(|r| r.instance = "new".into()).unwrap();
    assert!(
        !old_agent.exists() && !old_section.exists(),
        "{:?}",
        files(dir.path())
    );
    let now = hs.load().unwrap();
    assert_eq!((now.instance.as_str(), now.highest), ("new", Some(token)));
    assert_eq!(
        now.tree,
        Some(tree(42)),
        "the orphan tree is still on record"
    );
}

#[test]
fn a_write_cut_off_midway_leaves_the_previous_record() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    hs.update(|r| {
        r.highest = Some(Token::new(4, 4));
        r.tree = Some(tree(9));
    })
    .unwrap();
    // A writer that died after writing half its temporary file.
    let tmp = hs.path().with_extension("json.tmp");
    std::fs::write(&tmp, br#"{"instance":"half","highest":{"epo"#).unwrap();
    let loaded = hs.load().unwrap();
    assert_eq!(
        (loaded.highest, loaded.tree),
        (Some(Token::new(4, 4)), Some(tree(9)))
    );
    // The next writer is not disturbed by the leftover.
    hs.raise(Token::new(4, 5)).unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(4, 5)));
    assert!(!tmp.exists());
}

#[test]
fn garbage_in_the_record_is_ignored_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    std::fs::write(hs.path(), b"\x00\xffnot json").unwrap();
    assert_eq!(hs.load(), None);
    hs.raise(Token::new(1, 1)).unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(1, 1)));
}

/// An agent (instance, tree and its tokens) and two sections (tokens only)
/// write the same record at once, as separate processes would (each opens
/// the file itself, so each holds its own `flock`): no update is lost, the
/// token a reader sees never falls, and the agent's fields survive the
/// sections' writes.
#[test]
fn concurrent_writers_lose_no_update_and_the_token_never_falls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (path, done) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            let hs = HostState::new(&path, STORE, "lock.pg");
            let mut seen = None;
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                if let Some(r) = hs.load() {
                    assert!(r.highest >= seen, "fell from {seen:?} to {:?}", r.highest);
                    seen = r.highest;
                    reads += 1;
                }
            }
            reads
        })
    };
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let hs = HostState::new(&path, STORE, "lock.pg");
                for i in 0..200u64 {
                    let token = Token::new(1, i * 3 + w);
                    if w == 0 {
                        hs.update(|r| {
                            r.instance = "agent".into();
                            r.tree = Some(tree(i32::try_from(i).unwrap() + 1));
                            r.highest = Some(token);
                        })
                        .unwrap();
                    } else {
                        hs.raise(token).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    let last = HostState::new(&path, STORE, "lock.pg").load().unwrap();
    assert_eq!(last.highest, Some(Token::new(1, 199 * 3 + 2)));
    assert_eq!(last.instance, "agent");
    assert_eq!(last.tree, Some(tree(200)));
}
