//! The one clock putex reads: `CLOCK_BOOTTIME`.
//!
//! Licences and staleness waits are measured on the host's boot-time clock,
//! a clock that keeps counting through suspend (`docs/safety.md`): a host that wakes
//! from a suspend knows at once how long it slept, and a licence that ended
//! while it slept has ended when it wakes. Wall-clock time is never used for a
//! decision, and tokio's timers (`CLOCK_MONOTONIC`, which stops during
//! suspend) never decide a licence.
//!
//! Every reading goes through libc's `clock_gettime(3)` (via `nix`, which calls
//! the libc symbol), so fault tests can preload libfaketime to move or skew
//! it. Nothing else in putex may read a clock for a safety decision; the keeper's
//! deadline timer is a `timerfd` on the same clock ([`crate::supervision::keeper`]).

use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use putex_core::Instant;

/// Reads `CLOCK_BOOTTIME`: nanoseconds since boot, including suspend.
///
/// # Panics
///
/// If the kernel has no `CLOCK_BOOTTIME` (Linux before 2.6.39), which putex
/// does not support.
pub fn boot_time_now() -> Instant {
    let ts = clock_gettime(ClockId::CLOCK_BOOTTIME)
        .expect("clock_gettime(CLOCK_BOOTTIME) failed: putex needs Linux >= 2.6.39");
    let nanos = u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0);
    Instant::from_nanos(nanos)
}

/// How long until `deadline` on the boot-time clock; zero if it has passed.
pub fn until(deadline: Instant) -> Duration {
    deadline.saturating_since(boot_time_now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_moves_forward() {
        let a = boot_time_now();
        std::thread::sleep(Duration::from_millis(5));
        let b = boot_time_now();
        assert!(b.saturating_since(a) >= Duration::from_millis(5));
        assert!(a > Instant::ZERO);
        assert_eq!(until(a), Duration::ZERO);
    }
}
