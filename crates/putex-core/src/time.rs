//! Time as putex-core sees it: readings of one host's boot-time clock, passed in.
//!
//! The core never reads a clock. The driver reads `CLOCK_BOOTTIME` (a clock
//! that keeps counting through suspend) and hands the reading to every
//! `handle` call as an [`Instant`]. Readings from different hosts are never
//! compared: only the *rate* of clocks matters (`docs/safety.md`), and that is what
//! [`Drift`] bounds.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A reading of the local boot-time clock, in nanoseconds since boot.
///
/// Only meaningful on the host (and boot) that produced it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The clock's zero: the boot of the host.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after boot.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since boot.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(d)))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_nanos(d)))
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0 as f64 / 1e9)
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The clock-rate bound ε, in parts per million.
///
/// Every host's clock is assumed to run at a rate within `[1−ε, 1+ε]` of
/// real time. Durations that guard safety are stretched or shrunk by the
/// worst-case ratio `(1+ε)/(1−ε)` so that they hold whichever way two clocks
/// err.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Drift {
    ppm: u32,
}

impl Drift {
    /// One million parts: a rate bound of 100 %.
    pub const MILLION: u32 = 1_000_000;

    /// ε given in parts per million; must be below one million.
    pub const fn from_ppm(ppm: u32) -> Self {
        Drift { ppm }
    }

    /// ε given in percent (e.g. `1.0` for the default 1 %).
    pub fn from_percent(percent: f64) -> Self {
        Drift {
            ppm: (percent * 10_000.0)
                .round()
                .clamp(0.0, Self::MILLION as f64) as u32,
        }
    }

    /// ε in parts per million.
    pub const fn ppm(self) -> u32 {
        self.ppm
    }

    /// `d·(1+ε)/(1−ε)`, rounded up: a wait that, measured on any clock within
    /// the bound, lasts at least `d` measured on any other.
    pub fn stretch(self, d: Duration) -> Duration {
        let m = u128::from(Self::MILLION);
        let e = u128::from(self.ppm);
        if e >= m {
            return Duration::MAX;
        }
        scale_up(d, m + e, m - e)
    }

    /// `d·(1−ε)/(1+ε)`, rounded down: a budget that, measured on any clock
    /// within the bound, ends no later than `d` measured on any other.
    pub fn shrink(self, d: Duration) -> Duration {
        let m = u128::from(Self::MILLION);
        let e = u128::from(self.ppm);
        if e >= m {
            return Duration::ZERO;
        }
        let n = d.as_nanos() * (m - e) / (m + e);
        Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

fn scale_up(d: Duration, num: u128, den: u128) -> Duration {
    let n = (d.as_nanos() * num).div_ceil(den);
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_and_shrink_bracket_the_duration() {
        let e = Drift::from_percent(1.0);
        assert_eq!(e.ppm(), 10_000);
        let t = Duration::from_secs(10);
        // 10 s · 1.01 / 0.99 = 10.20202… s, rounded up to the nanosecond.
        assert_eq!(e.stretch(t), Duration::from_nanos(10_202_020_203));
        assert_eq!(
            e.shrink(Duration::from_secs(2)),
            Duration::from_nanos(1_960_396_039)
        );
        assert_eq!(Drift::from_ppm(0).stretch(t), t);
    }

    #[test]
    fn instants_saturate() {
        let a = Instant::from_nanos(5);
        assert_eq!(a - Duration::from_nanos(10), Instant::ZERO);
        assert_eq!(Instant::ZERO.saturating_since(a), Duration::ZERO);
    }
}
