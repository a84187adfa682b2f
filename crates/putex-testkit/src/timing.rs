//! Turns for the timing-sensitive tests: a test whose bounds are tens of
//! milliseconds (a takeover by B + 100 ms, a store's p99 under a licence of
//! 300 ms) holds a [`TimingSlot`] while it runs, so that such tests do not
//! measure each other instead of putex.
//!
//! Within one process at most `PUTEX_TEST_TIMING_SLOTS` of them run at
//! once (default 1). Across processes — the integration tests, the
//! PostgreSQL version matrix and the chaos suite run side by side by
//! `scripts/test` — a slot also takes an exclusive lock on the file named
//! by `PUTEX_TEST_TIMING_LOCK`, when set: one timing-sensitive test on the
//! machine at a time, whichever process runs it, while the other tests of
//! each process go on beside it.
//!
//! While a test holds its slot, its thread runs at nice
//! [`TURN_NICE`] where the system allows it (root, or `CAP_SYS_NICE`;
//! elsewhere the nice value stays as it was), and so does every process it
//! starts meanwhile (a child inherits its creator's nice value): the agents,
//! keepers and hooks of the test that is measured win the CPU over the
//! tests that measure nothing and over whatever else the machine runs (a
//! busy loop beside a suite on 2 cores made R = 100 ms holders lapse and a
//! hook start 2 s late). Its nice value goes back when the slot does: drop
//! a slot on the thread that took it (a test's local, a chaos world's field).
//!
//! With `PUTEX_TEST_TIMING_LOG` set, each slot given back appends a line
//! to that file: the test (its thread's name, or the program's), the
//! seconds it waited for the slot, the seconds it held it and when it got
//! it (seconds since the Unix epoch) — `scripts/test` sums them in its
//! table of where the time went.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Timing-sensitive tests running now in this process, and the signal that
/// one ended.
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// The default of `PUTEX_TEST_TIMING_SLOTS`: one at a time, as a plain
/// `cargo test` on any machine can afford. On 2 cores, six at once (three
/// of them these, with debug builds of putex, etcd and PostgreSQL) pushed
/// the store's p99 from 4 to 30 ms and licences lapsed, and two at once
/// still failed on time (`scripts/test` keeps the default).
pub const DEFAULT_TIMING_SLOTS: usize = 1;

/// The nice value of a test's thread while it holds its slot.
pub const TURN_NICE: i32 = -10;

/// A place among the timing-sensitive tests running at once, held until
/// dropped (and with it the machine-wide lock, if one is configured).
#[must_use = "the slot is given back when dropped"]
pub struct TimingSlot {
    /// The locked `PUTEX_TEST_TIMING_LOCK` file; closing it unlocks.
    _machine: Option<File>,
    /// How long the test waited for the slot.
    waited: Duration,
    /// When the test got it.
    since: Instant,
    /// The thread's nice value before the slot raised its priority, if it did.
    nice_before: Option<i32>,
}

impl Drop for TimingSlot {
    fn drop(&mut self) {
        if let Some(nice) = self.nice_before {
            set_thread_nice(nice);
        }
        log_turn(self.waited, self.since.elapsed());
        let (running, ended) = &RUNNING;
        *running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        ended.notify_one();
    }
}

/// Waits for a [`TimingSlot`]: at most `PUTEX_TEST_TIMING_SLOTS` (default
/// 1: one at a time) timing-sensitive tests run at once in this process,
/// and with `PUTEX_TEST_TIMING_LOCK` set, one at a time on the machine.
///
/// # Panics
///
/// When `PUTEX_TEST_TIMING_LOCK` names a file that cannot be created or
/// locked (the message names it).
pub fn timing_slot() -> TimingSlot {
    let asked = Instant::now();
    let slots = std::env::var("PUTEX_TEST_TIMING_SLOTS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(DEFAULT_TIMING_SLOTS)
        .max(1);
    let (running, ended) = &RUNNING;
    let mut n = running.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= slots {
        n = ended.wait(n).unwrap_or_else(|e| e.into_inner());
    }
    *n += 1;
    drop(n);
    // From here on the slot is counted: a panic below gives it back.
    let mut slot = TimingSlot {
        _machine: None,
        waited: Duration::ZERO,
        since: asked,
        nice_before: None,
    };
    if let Some(path) = std::env::var_os("PUTEX_TEST_TIMING_LOCK").filter(|p| !p.is_empty()) {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("PUTEX_TEST_TIMING_LOCK {path:?}: {e}"));
        file.lock()
            .unwrap_or_else(|e| panic!("PUTEX_TEST_TIMING_LOCK {path:?}: lock: {e}"));
        slot._machine = Some(file);
    }
    let before = thread_nice();
    if before > TURN_NICE && set_thread_nice(TURN_NICE) {
        slot.nice_before = Some(before);
    }
    slot.since = Instant::now();
    slot.waited = slot.since - asked;
    slot
}

/// The calling thread's nice value (on Linux, nice is a thread's own).
#[allow(unsafe_code)] // two libc calls; nix has no getpriority/setpriority
fn thread_nice() -> i32 {
    // SAFETY: getpriority reads the scheduling priority of the calling
    // thread (who 0 of PRIO_PROCESS is the caller); errno is reset first,
    // as -1 is also a valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            0
        } else {
            nice
        }
    }
}

/// Sets the calling thread's nice value; false where it is not allowed
/// (raising a priority needs root or `CAP_SYS_NICE`).
#[allow(unsafe_code)]
fn set_thread_nice(nice: i32) -> bool {
    // SAFETY: setpriority changes only the calling thread's priority.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) == 0 }
}

/// Appends a turn to `PUTEX_TEST_TIMING_LOG`, if set:
/// `TEST\tWAITED\tHELD\tSTARTED` (seconds; STARTED since the Unix epoch).
/// A log that cannot be written loses the line, not the test.
fn log_turn(waited: Duration, held: Duration) {
    let Some(path) = std::env::var_os("PUTEX_TEST_TIMING_LOG").filter(|p| !p.is_empty()) else {
        return;
    };
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => std::env::args()
            .next()
            .map(|a| a.rsplit('/').next().unwrap_or_default().to_owned())
            .unwrap_or_default(),
    };
    // One write of the whole line: appends of several processes do not
    // interleave within it.
    let started = (SystemTime::now() - held)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{test}\t{:.1}\t{:.1}\t{:.1}\n",
        waited.as_secs_f64(),
        held.as_secs_f64(),
        started.as_secs_f64()
    );
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = file.write_all(line.as_bytes());
    }
}
