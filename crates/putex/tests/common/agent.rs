//! Helpers for the end-to-end tests of `putex run` (`agent_e2e`,
//! `agent_faults`, `agent_http`, `history`, `web`): agents of the built
//! binary with the fast profile, on top of [`putex_testkit::agent`] (agent
//! processes, hook lines and checks over them).
//!
//! The tests that use them hold a [`timing_slot`]
//! ([`putex_testkit::timing`]): their bounds are tens of milliseconds, so
//! they run one at a time unless `PUTEX_TEST_TIMING_SLOTS` allows more (for
//! a larger machine); many at once on a small one would measure each other
//! rather than putex. Every agent, keeper and
//! service is killed on drop.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use putex::core::TimingConfig;
pub use putex::supervision::process::pids_matching;
use putex::supervision::process::proc_table;
pub use putex_testkit::agent::{
    assert_no_overlap, events, hooks, sigkill, starts, wait_for, wall_ns, Agent, AgentSpec,
    KillOnDrop, Line,
};
pub use putex_testkit::timing::{timing_slot, TimingSlot};

pub const R: Duration = Duration::from_millis(100);

/// The failover bound B for the fast profile, with a generous store round
/// trip (loopback NATS answers in well under a millisecond).
pub fn bound() -> Duration {
    bound_on(Duration::ZERO)
}

/// [`bound`] on a store whose clock reads in steps of `store_clock_step`
/// (etcd: 1 s).
pub fn bound_on(store_clock_step: Duration) -> Duration {
    TimingConfig {
        renew: R,
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap()
    .timeline_on(Duration::from_millis(2), store_clock_step)
    .crash_failover
}

/// [`bound`] for the store at `url`: etcd's clock reads in whole seconds.
pub fn bound_for(url: &str) -> Duration {
    if url.starts_with("etcd:") {
        bound_on(Duration::from_secs(1))
    } else {
        bound()
    }
}

/// The built `putex` binary.
pub fn putex_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_putex"))
}

/// A command for the built binary, without the caller's `PUTEX_*`,
/// `NATS_URL`, `FAKETIME*` and `LD_PRELOAD`, logging at `info`, its keeper
/// directory the process's scratch one unless a flag or the caller's
/// `PUTEX_KEEPER_DIR` names another.
pub fn putex() -> Command {
    let mut cmd = putex_testkit::agent::putex_command(putex_bin());
    cmd.env(
        "PUTEX_KEEPER_DIR",
        putex_testkit::agent::scratch_keeper_dir(),
    );
    cmd
}

/// `putex run --lock LOCK --store URL --node NODE ARGS…` of the built binary
/// with its keeper directory (`keeper-NODE`) and log in `dir` and the fast
/// profile (R = 100 ms, F = 3, C = 1), `--healthcheck true` and
/// `--stop-timeout 2s`, each unless `args` gives its own (before a `--`).
pub fn fast(dir: &Path, url: &str, lock: &str, node: &str, args: &[&str]) -> AgentSpec {
    AgentSpec::new(putex_bin(), url, lock, node, dir)
        .args(args)
        .default_flag("--stop-timeout", "2s")
        .default_flag("--healthcheck", "true")
        .default_flag("--failures", "3")
        .default_flag("--confirm", "1")
        .default_flag("--renew", "100ms")
}

/// Starts the agent `spec` describes (see [`Agent::start`]).
pub fn start(spec: AgentSpec) -> Agent {
    Agent::start(spec).expect("start putex run")
}

/// `putex ARGS… -- sh -c SCRIPT` of the built binary, as the tests run a
/// critical section: in the scratch directory `dir`, with `$D` set to it,
/// the keepers' sockets in `dir/keepers`, logging at `warn`, no stdin.
pub fn putex_sh(dir: &Path, args: &[&str], script: &str) -> Command {
    let mut c = putex();
    c.current_dir(dir)
        .env("D", dir)
        .env("PUTEX_KEEPER_DIR", dir.join("keepers"))
        .env("RUST_LOG", "warn")
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null());
    c
}

/// `putex lock NAME --ttl TTL --store URL ARGS… -- sh -c SCRIPT` in `dir`
/// (see [`putex_sh`]).
pub fn putex_lock(
    dir: &Path,
    url: &str,
    name: &str,
    ttl: &str,
    args: &[&str],
    script: &str,
) -> Command {
    let lock = ["lock", name, "--ttl", ttl, "--store", url];
    putex_sh(dir, &[&lock[..], args].concat(), script)
}

/// `putex ARGS…` (with `-o json`), which must succeed: its output.
pub fn putex_json(args: &[&str]) -> serde_json::Value {
    let out = putex().args(args).args(["-o", "json"]).output().unwrap();
    assert!(
        out.status.success(),
        "putex {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `putex status LOCK -o json` against `url`; the command must succeed.
pub fn status_json(url: &str, lock: &str) -> serde_json::Value {
    putex_json(&["status", lock, "--store", url])
}

/// Pids of live `sleep ARG` processes.
pub fn sleeps(arg: &str) -> Vec<i32> {
    proc_table()
        .into_iter()
        .filter(|e| !e.is_dead())
        .filter(|e| {
            let Ok(cmd) = std::fs::read(format!("/proc/{}/cmdline", e.pid)) else {
                return false;
            };
            let parts: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            parts.len() >= 2 && parts[0].ends_with(b"sleep") && parts[1] == arg.as_bytes()
        })
        .map(|e| e.pid)
        .collect()
}

/// The agents' logs, then the hook events: the events come last, where a
/// report that keeps only the end of a long failure still shows them.
pub fn dump(agents: &[&Agent], events_file: &Path) -> String {
    let mut s = String::new();
    for a in agents {
        s.push_str(&format!("--- {} log:\n{}\n", a.node(), a.log_text()));
    }
    s.push_str(&format!(
        "--- events:\n{}",
        std::fs::read_to_string(events_file).unwrap_or_default()
    ));
    s
}
