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

/// A duration for people: three significant digits in the unit that fits
/// (`306 ms`, `13.3 ms`, `1.5 s`, `48 µs`), trailing zeros dropped.
/// `Debug` of a [`Duration`] prints every digit (`306.060607ms`); use this
/// wherever an operator reads a duration: the CLI, logs, the web page.
///
/// ```
/// use std::time::Duration;
/// use putex_core::time::Human;
/// assert_eq!(Human(Duration::from_nanos(306_060_607)).to_string(), "306 ms");
/// assert_eq!(Human(Duration::from_micros(13_340)).to_string(), "13.3 ms");
/// assert_eq!(Human(Duration::from_millis(1500)).to_string(), "1.5 s");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return f.write_str("0 s");
        }
        let (value, unit) = match ns {
            0..1_000 => return write!(f, "{ns} ns"),
            1_000..1_000_000 => (ns as f64 / 1e3, "µs"),
            1_000_000..1_000_000_000 => (ns as f64 / 1e6, "ms"),
            _ => (ns as f64 / 1e9, "s"),
        };
        let digits = if value >= 100.0 {
            0
        } else if value >= 10.0 {
            1
        } else {
            2
        };
        let text = format!("{value:.digits$}");
        let text = if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.')
        } else {
            &text
        };
        write!(f, "{text} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_keep_three_significant_digits() {
        let h = |d: Duration| Human(d).to_string();
        assert_eq!(h(Duration::ZERO), "0 s");
        assert_eq!(h(Duration::from_nanos(850)), "850 ns");
        assert_eq!(h(Duration::from_nanos(48_400)), "48.4 µs");
        assert_eq!(h(Duration::from_nanos(306_060_607)), "306 ms");
        assert_eq!(h(Duration::from_micros(13_340)), "13.3 ms");
        assert_eq!(h(Duration::from_micros(1_250)), "1.25 ms");
        assert_eq!(h(Duration::from_millis(2000)), "2 s");
        assert_eq!(h(Duration::from_millis(1530)), "1.53 s");
        assert_eq!(h(Duration::from_secs(3600)), "3600 s");
        // Rounding may reach the next unit's threshold.
        assert_eq!(h(Duration::from_nanos(999_999_999)), "1000 ms");
    }

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
