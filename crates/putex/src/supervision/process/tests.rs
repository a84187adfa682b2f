//! Unit tests of process-tree control on this machine's `/proc`.

use super::*;

fn entry(pid: i32, ppid: i32, pgid: i32, session: i32, state: char) -> ProcEntry {
    ProcEntry {
        pid,
        ppid,
        pgid,
        session,
        state,
        start: 1000 + pid as u64,
    }
}

fn id(pid: i32) -> ProcId {
    ProcId {
        pid,
        start: 1000 + pid as u64,
    }
}

#[test]
fn a_snapshot_finds_the_tree_after_its_keeper_died() {
    // The keeper (session 500, dead) ran the child 600 (group 600); the
    // child started 601 (same group) and 602, which called setsid and
    // double-forked into 603 (re-parented to init).
    let snap = TreeSnapshot {
        cgroup: None,
        members: vec![id(600), id(601), id(602)],
        groups: vec![id(600)],
        sessions: vec![id(500)],
    };
    let table = vec![
        entry(1, 0, 1, 1, 'S'),
        entry(600, 1, 600, 500, 'S'),
        entry(601, 600, 600, 500, 'S'),
        entry(603, 1, 602, 602, 'S'),
        // Started after the snapshot, still in the child's group.
        entry(604, 601, 600, 500, 'S'),
        // A grandchild of a member that moved to a group of its own.
        entry(605, 601, 605, 500, 'S'),
        // Unrelated.
        entry(700, 1, 700, 700, 'S'),
        entry(701, 700, 700, 700, 'S'),
    ];
    let mut found = snap.survivors(&table);
    found.sort();
    assert_eq!(found, vec![600, 601, 604, 605]);
    // 602 is gone; 603 left its group and session before the snapshot
    // saw it: only the newer snapshot that lists it finds it.
    let later = TreeSnapshot {
        members: vec![id(600), id(601), id(603)],
        ..snap.clone()
    };
    assert!(later.survivors(&table).contains(&603));
}

#[test]
fn a_snapshot_never_takes_a_reused_pid_for_a_member() {
    let snap = TreeSnapshot {
        cgroup: None,
        members: vec![id(600)],
        groups: vec![id(600)],
        sessions: vec![ProcId { pid: 500, start: 0 }],
    };
    // Pid 600 and 500 now belong to other processes, leading groups and
    // sessions of their own.
    let table = vec![
        ProcEntry {
            start: 5,
            ..entry(600, 1, 600, 600, 'S')
        },
        entry(601, 600, 600, 600, 'S'),
        ProcEntry {
            start: 7,
            ..entry(500, 1, 500, 500, 'S')
        },
        entry(501, 500, 500, 500, 'S'),
    ];
    assert_eq!(snap.survivors(&table), Vec::<i32>::new());
    // Zombies are not survivors.
    let dead = vec![entry(600, 1, 600, 500, 'Z')];
    assert!(snap.survivors(&dead).is_empty());
}

#[test]
fn a_snapshot_never_names_this_process_or_its_ancestors() {
    let me = std::process::id() as i32;
    let table = proc_table();
    let mine = table.iter().find(|e| e.pid == me).copied().unwrap();
    let snap = TreeSnapshot {
        cgroup: None,
        members: vec![mine.id()],
        groups: vec![ProcId {
            pid: mine.pgid,
            start: 0,
        }],
        sessions: vec![ProcId {
            pid: mine.session,
            start: 0,
        }],
    };
    let found = snap.survivors(&table);
    assert!(!found.contains(&me));
    assert!(!found.contains(&mine.ppid));
    assert!(!found.contains(&1));
}

#[test]
fn finds_cgroup2_on_a_hybrid_host() {
    let mi = "25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
              31 25 0:27 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755\n\
              41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n\
              42 31 0:39 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
    assert_eq!(
        cgroup2_mount(mi),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    assert_eq!(
        cgroup2_mount("1 2 0:1 / /a\\040b rw - cgroup2 x rw"),
        Some(PathBuf::from("/a b"))
    );
    assert_eq!(
        cgroup2_mount("31 25 0:27 / /sys/fs/cgroup ro - tmpfs tmpfs ro"),
        None
    );
}

#[test]
fn reads_the_unified_cgroup_path() {
    let c = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/putex.service\n";
    assert_eq!(
        unified_cgroup_path(c).as_deref(),
        Some("/system.slice/putex.service")
    );
    assert_eq!(unified_cgroup_path("1:cpu:/\n"), None);
}

#[test]
fn parses_stat_with_odd_command_names() {
    let e = ProcEntry::parse(
        "123 (a) b (c)) S 1 123 120 0 -1 4194560 86 0 0 0 0 0 0 0 20 0 1 0 987654 1 2",
    )
    .unwrap();
    assert_eq!(
        e,
        ProcEntry {
            pid: 123,
            ppid: 1,
            pgid: 123,
            session: 120,
            state: 'S',
            start: 987654,
        }
    );
    assert_eq!(ProcEntry::parse("123 (a) S 1 123 120 0"), None, "truncated");
    let me = std::process::id() as i32;
    let table = proc_table();
    assert!(table.iter().any(|e| e.pid == me));
    let d = descendants(
        &[
            entry(2, 1, 2, 2, 'S'),
            entry(3, 2, 2, 2, 'S'),
            entry(4, 3, 4, 4, 'Z'),
            entry(5, 9, 5, 5, 'S'),
        ],
        2,
    );
    assert_eq!(d.iter().map(|e| e.pid).collect::<Vec<_>>(), vec![3, 4]);
}
