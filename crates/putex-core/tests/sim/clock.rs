//! Simulated clocks: piecewise linear in real time, with a rate and jumps.

/// A clock that reads `local = anchor_local + (real − anchor_real)·rate`.
#[derive(Clone, Debug)]
pub struct Clock {
    anchor_real: u64,
    anchor_local: u64,
    /// Rate in parts per million of real time (1_000_000 = exact).
    rate_ppm: u64,
}

const MILLION: u128 = 1_000_000;

impl Clock {
    pub fn new(real: u64, local: u64, rate_ppm: u64) -> Clock {
        Clock {
            anchor_real: real,
            anchor_local: local,
            rate_ppm,
        }
    }

    pub fn rate_ppm(&self) -> u64 {
        self.rate_ppm
    }

    /// The reading at real time `real` (not before the anchor).
    pub fn local(&self, real: u64) -> u64 {
        let dt = u128::from(real.saturating_sub(self.anchor_real));
        self.anchor_local + (dt * u128::from(self.rate_ppm) / MILLION) as u64
    }

    /// The earliest real time (≥ `now`) at which the clock reads `local`.
    pub fn real_at(&self, local: u64, now: u64) -> u64 {
        if local <= self.local(now) {
            return now;
        }
        let dl = u128::from(local - self.anchor_local);
        let dt = (dl * MILLION).div_ceil(u128::from(self.rate_ppm)) as u64;
        // Rounding can leave us a nanosecond short; step until the reading arrives.
        let mut t = (self.anchor_real + dt).max(now);
        while self.local(t) < local {
            t += 1;
        }
        t
    }

    /// Moves the reading by `delta` nanoseconds at real time `now`.
    pub fn jump(&mut self, now: u64, delta: i64) {
        let local = self.local(now);
        self.anchor_real = now;
        self.anchor_local = local.saturating_add_signed(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_at_inverts_local() {
        let c = Clock::new(1_000, 5_000_000, 990_000);
        for l in [5_000_000u64, 5_000_001, 7_777_777, 1_000_000_000] {
            let t = c.real_at(l, 1_000);
            assert!(c.local(t) >= l && (t == 1_000 || c.local(t - 1) < l));
        }
    }
}
