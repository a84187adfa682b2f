use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
fn a_change_that_changes_nothing_writes_nothing_and_a_change_is_written() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "sem.job.0");
    hs.raise(Token::new(3, 10)).unwrap();
    let inode = || std::fs::metadata(hs.path()).unwrap().ino();
    let first = inode();
    // The waiters that see the same token after the first: no new file.
    hs.raise(Token::new(3, 10)).unwrap();
    hs.raise(Token::new(3, 9)).unwrap();
    assert_eq!(inode(), first, "an unchanged record was rewritten");
    // A higher token is a change: a new file renamed over the old.
    hs.raise(Token::new(3, 11)).unwrap();
    assert_ne!(inode(), first, "a higher token was not written");
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(3, 11)));
}

const OLD_AGENT: &str = r#"{"instance":"old","boot_id":"b0","highest":{"epoch":2,"revision":40},"tree":{"members":[{"pid":42,"start":7}],"groups":[],"sessions":[]}}"#;

#[test]
fn the_files_of_earlier_releases_are_read_merged_and_the_agents_removed() {
    let dir = tempfile::tempdir().unwrap();
    let old_agent = socket_path(dir.path(), STORE, "pg").with_extension("state");
    let old_section = socket_path(dir.path(), STORE, "lock.pg").with_extension("highest");
    // As the agent and a section of earlier releases wrote them.
    std::fs::write(&old_agent, OLD_AGENT).unwrap();
    std::fs::write(&old_section, r#"{"epoch":2,"revision":55}"#).unwrap();
    let token = Token::new(2, 55);

    let agent = HostState::new(dir.path(), STORE, "lock.pg").for_agent(dir.path(), STORE, "pg");
    let loaded = agent.load().unwrap();
    assert_eq!(loaded.instance, "old");
    assert_eq!(loaded.boot_id, "b0");
    assert_eq!(loaded.highest, Some(token), "the higher of the two wins");
    assert_eq!(loaded.tree, Some(tree(42)));

    // A section sees both too, and its write removes neither: an agent of
    // the earlier release may still run, and `.highest` stays.
    let section =
        HostState::new(dir.path(), STORE, "lock.pg").with_agent_legacy(dir.path(), STORE, "pg");
    assert_eq!(section.load().unwrap().highest, Some(token));
    section.raise(Token::new(2, 56)).unwrap();
    assert!(
        old_agent.exists() && old_section.exists(),
        "{:?}",
        files(dir.path())
    );
    assert_eq!(section.load().unwrap().tree, Some(tree(42)));

    // The agent's first write removes its old file, and loses nothing.
    agent.update(|r| r.instance = "new".into()).unwrap();
    assert!(!old_agent.exists(), "{:?}", files(dir.path()));
    assert!(old_section.exists());
    let now = agent.load().unwrap();
    assert_eq!(
        (now.instance.as_str(), now.highest),
        ("new", Some(Token::new(2, 56)))
    );
    assert_eq!(
        now.tree,
        Some(tree(42)),
        "the orphan tree is still on record"
    );
}

/// A section merged the old agent file into the record; then an agent of
/// the earlier release (still running) wrote a newer tree: the newer file's
/// tree and instance count, so the orphan it describes is the one killed.
#[test]
fn an_old_agent_file_newer_than_the_record_wins_its_tree() {
    let dir = tempfile::tempdir().unwrap();
    let old_agent = socket_path(dir.path(), STORE, "pg").with_extension("state");
    std::fs::write(&old_agent, OLD_AGENT).unwrap();
    let section =
        HostState::new(dir.path(), STORE, "lock.pg").with_agent_legacy(dir.path(), STORE, "pg");
    section.raise(Token::new(2, 60)).unwrap();
    assert_eq!(section.load().unwrap().tree, Some(tree(42)));
    // Older than the record: the record's fields stand.
    let agent = HostState::new(dir.path(), STORE, "lock.pg").for_agent(dir.path(), STORE, "pg");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(
        &old_agent,
        OLD_AGENT
            .replace(r#""pid":42"#, r#""pid":43"#)
            .replace("old", "older"),
    )
    .unwrap();
    let loaded = agent.load().unwrap();
    assert_eq!(loaded.tree, Some(tree(43)), "the newer file's tree");
    assert_eq!(loaded.instance, "older");
    assert_eq!(loaded.highest, Some(Token::new(2, 60)), "the higher token");
    // Once the agent wrote, its record is the newer: a stale old file that
    // could not be removed changes nothing.
    agent.update(|r| r.tree = None).unwrap();
    std::fs::write(&old_agent, OLD_AGENT).unwrap();
    let t = std::time::SystemTime::now() - Duration::from_secs(60);
    File::options()
        .write(true)
        .open(&old_agent)
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(agent.load().unwrap().tree, None);
}

/// A record that exists but cannot be read is never replaced: the write
/// fails and says why (here the record's path is a directory).
#[test]
fn a_record_that_cannot_be_read_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    std::fs::create_dir(hs.path()).unwrap();
    assert_eq!(hs.load(), None);
    assert!(hs.raise(Token::new(1, 1)).is_err());
    assert!(hs.path().is_dir());
}

/// A writer that finds the record locked waits, and takes it as soon as
/// the other lets go.
#[test]
fn a_writer_waits_for_the_lock_and_then_writes() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HostState::new(dir.path(), STORE, "lock.pg");
    hs.raise(Token::new(1, 1)).unwrap();
    let held = Flock::lock(File::open(hs.path()).unwrap(), FlockArg::LockExclusive).unwrap();
    let writer = {
        let hs = hs.clone();
        std::thread::spawn(move || hs.raise(Token::new(1, 2)))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!writer.is_finished(), "it waits while the lock is held");
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(1, 1)));
    drop(held);
    writer.join().unwrap().unwrap();
    assert_eq!(hs.load().unwrap().highest, Some(Token::new(1, 2)));
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
    std::fs::write(hs.path(), b"{\"instance\": 7, not json").unwrap();
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
