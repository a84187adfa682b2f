//! `putex demo` as a newcomer runs it: three agents on a temporary SQLite
//! store, a host crash, a failover — with this build, in a temporary
//! directory of the test's own (`TMPDIR`), in memory where there is
//! `/dev/shm` as the demo's own directory is.
//!
//! - r53: the three agents start together; each measured the store's
//!   compare-and-swaps while the other two did the same, so all three
//!   refused `--renew 100ms` (a p99 of 10–19 ms) in about one run of four on
//!   a loaded machine. The demo must succeed, and no agent's log may show
//!   the refusal — a refusal is no longer retried anywhere on the way.
//! - An agent that exits is noticed at once (not after the demo's 15 s
//!   wait for an active node), its last log lines are shown, and the
//!   demo's directory is kept on failure, named in the message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::agent::{putex, timing_slot};
use putex_testkit::agent::output_text;

/// The test's `TMPDIR` for the demo: in memory where it can be.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// `putex demo --keep` with `TMPDIR` set to `tmp` and `env` added.
fn demo(tmp: &Path, env: &[(&str, &str)]) -> Output {
    let mut c: Command = putex();
    c.env("TMPDIR", tmp)
        .envs(env.iter().copied())
        .args(["demo", "--keep"])
        .stdin(Stdio::null());
    c.output().unwrap()
}

/// The demo's directory (`putex-demo-PID`) under `tmp`.
fn demo_dir(tmp: &Path) -> PathBuf {
    std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("putex-demo-"))
        })
        .unwrap_or_else(|| panic!("no putex-demo-* in {}", tmp.display()))
}

#[test]
fn r53_demo_agents_started_together_do_not_refuse_each_others_store() {
    let _slot = timing_slot();
    let tmp = scratch();
    let out = demo(tmp.path(), &[]);
    let text = output_text(&out);
    let dir = demo_dir(tmp.path());
    let logs: Vec<(String, String)> = ["node-1", "node-2", "node-3"]
        .into_iter()
        .map(|n| {
            let log = std::fs::read_to_string(dir.join(format!("{n}.log"))).unwrap_or_default();
            (n.to_string(), log)
        })
        .collect();
    let all_logs: String = logs.iter().map(|(n, l)| format!("--- {n}:\n{l}")).collect();
    assert!(out.status.success(), "{text}\n{all_logs}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "steady: exactly one active",
        "crashed (SIGKILL",
        "failover: ",
    ] {
        assert!(stdout.contains(line), "no {line:?}:\n{text}");
    }
    for (n, log) in &logs {
        assert!(
            log.contains("store ok"),
            "{n} did not pass the store check\n{all_logs}"
        );
        assert!(
            !log.contains("ten times the store's p99"),
            "{n} refused the store\n{all_logs}"
        );
    }
}

#[test]
fn demo_an_agent_that_exits_is_shown_at_once_and_the_directory_kept() {
    let _slot = timing_slot();
    let tmp = scratch();
    // The agents read PUTEX_* like any `putex run`: a --max-lease below
    // their lease makes every one of them refuse to start.
    let began = Instant::now();
    let out = demo(tmp.path(), &[("PUTEX_MAX_LEASE", "100ms")]);
    let took = began.elapsed();
    let text = output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dir = demo_dir(tmp.path());
    assert!(
        stderr.contains("'s agent exited (exit status: 2)"),
        "{text}"
    );
    // Its last log lines, with the reason.
    assert!(stderr.contains("--max-lease (100 ms) is shorter"), "{text}");
    assert!(
        stderr.contains(&format!("kept {}", dir.display())),
        "{text}"
    );
    assert!(dir.join("store.db").exists(), "{text}");
    assert!(
        took < Duration::from_secs(10),
        "noticed only after {took:?}\n{text}"
    );
}
