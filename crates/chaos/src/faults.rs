//! Fault injection that is not a signal or a proxy mode: clock faults
//! through libfaketime, the evidence that a clock fault took effect, a
//! seeded random source, and the probe for network namespaces.
//!
//! **Clocks.** putex reads `CLOCK_BOOTTIME` through libc's
//! `clock_gettime(3)`, so preloading libfaketime (Debian package
//! `faketime`) changes the agent's clock: `FAKETIME="+0 x2"` makes it run
//! twice as fast from the process's start, and a `FAKETIME_TIMESTAMP_FILE`
//! read on every call (`FAKETIME_NO_CACHE=1`) lets the harness jump it
//! forward while the agent runs. libfaketime also fakes `CLOCK_BOOTTIME`
//! and the `timerfd` the keeper uses, and the keeper inherits the
//! environment, so agent and keeper share the faulty clock, as on a real
//! host. `FAKETIME_DONT_FAKE_MONOTONIC` must be unset (it is removed from
//! every child's environment). nats-server is statically linked: store-clock
//! faults stay in the simulation of `putex-core`.
//!
//! A clock fault counts only if it took effect: libfaketime must be mapped
//! in the agent ([`preloaded`]), and the agent's own log timestamps (a
//! line per health check at `-v`) must advance at the intended rate or jump
//! by the intended amount ([`ClockSample`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Where Debian installs libfaketime.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// libfaketime, or why clock faults are skipped.
pub fn faketime() -> Result<PathBuf, String> {
    let p = PathBuf::from(LIBFAKETIME);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{LIBFAKETIME} is missing (install the Debian package `faketime`; scripts/chaos does when run as root)"
        ))
    }
}

/// The environment that runs a process's clocks at `rate` (e.g. 2.0).
pub fn rate_env(lib: &Path, rate: f64) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), format!("+0 x{rate}")),
    ]
}

/// The environment of a clock the harness can jump through `file`.
pub fn jump_env(lib: &Path, file: &Path) -> Vec<(String, String)> {
    let _ = std::fs::write(file, "+0 x1\n");
    vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
    ]
}

/// Moves the clocks reading `file` to `offset` ahead of real time.
pub fn jump(file: &Path, offset: Duration) {
    let _ = std::fs::write(file, format!("+{:.3} x1\n", offset.as_secs_f64()));
}

/// Whether libfaketime is mapped in process `pid`.
pub fn preloaded(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libfaketime"))
}

/// The newest timestamp in an agent's log (tracing's RFC 3339 prefix; the
/// keeper's plain lines have none).
pub fn last_log_time(log: &Path) -> Option<SystemTime> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|l| {
        let ts = l.split_whitespace().next()?;
        humantime::parse_rfc3339_weak(ts.trim_end_matches('Z')).ok()
    })
}

/// A reading of an agent's log clock against the harness's real clock.
#[derive(Clone, Copy)]
pub struct ClockSample {
    real: Instant,
    log: SystemTime,
}

impl ClockSample {
    /// Reads the log now.
    pub fn take(log: &Path) -> Option<ClockSample> {
        Some(ClockSample {
            real: Instant::now(),
            log: last_log_time(log)?,
        })
    }

    /// Waits (up to 2 s) for the next timestamped log line and samples at
    /// that moment: the line was written within a poll (1 ms) of it, so
    /// the sample is as precise as the machine's scheduling.
    pub fn take_fresh(log: &Path) -> Option<ClockSample> {
        let before = last_log_time(log);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let now = last_log_time(log);
            if now.is_some() && now != before {
                return Some(ClockSample {
                    real: Instant::now(),
                    log: now?,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// The agent clock's rate between two samples (log time / real time).
    pub fn rate(&self, later: &ClockSample) -> f64 {
        let real = later.real.duration_since(self.real).as_secs_f64();
        let log = later
            .log
            .duration_since(self.log)
            .map_or(0.0, |d| d.as_secs_f64());
        if real > 0.0 {
            log / real
        } else {
            0.0
        }
    }

    /// How far the agent's clock moved beyond real time between two samples.
    pub fn excess(&self, later: &ClockSample) -> f64 {
        let real = later.real.duration_since(self.real).as_secs_f64();
        let log = later
            .log
            .duration_since(self.log)
            .map_or(0.0, |d| d.as_secs_f64());
        log - real
    }
}

/// Whether network namespaces with nftables could isolate one agent, and
/// what the harness uses them for: a line for the report.
pub fn probe_netns() -> String {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        return "network namespaces: skipped (not root); the TCP proxy injects fault 3".into();
    }
    let unshare = std::process::Command::new("unshare")
        .args(["--net", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let nft = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    format!(
        "network namespaces: root yes, `unshare --net` {}, nft {}; used only to cut an etcd \
         member off from its peers (leader-isolated-etcd3: putex_testkit::netns); the TCP proxy \
         (putex_testkit::proxy) cuts an agent off from the store without touching the host's \
         network, and also does one-way loss, holds and jitter, which nftables drops cannot",
        if unshare { "works" } else { "fails" },
        if nft { "installed" } else { "not installed" }
    )
}

/// splitmix64: a small seeded random source, so that a seed replays a run's
/// choices (which node, how long, which fault).
pub struct Rng(u64);

impl Rng {
    /// A source for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// A duration in `[lo, hi]`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from(hi.saturating_sub(lo).as_millis()).unwrap_or(0);
        lo + Duration::from_millis(self.below(span + 1))
    }
}
