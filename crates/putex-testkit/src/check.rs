//! Reading what `putex check` prints, for the benchmarks and the tests that
//! compare a measured failover with its bound.

use std::time::Duration;

/// B, the worst-case crash failover, from `putex check`'s line
/// "worst-case crash failover ≈ W + G' + three store round trips = 407 ms
/// (round trip assumed 354 µs)".
pub fn worst_case_bound(check: &str) -> Option<Duration> {
    let line = check
        .lines()
        .find(|l| l.contains("worst-case crash failover"))?;
    let value = line.rsplit_once("= ")?.1;
    let value = value.split(" (").next()?;
    human_duration(value)
}

/// A duration as putex prints it for people: `407 ms`, `12.2 s`, `354 µs`,
/// `800 ns` (also without the space, and `us` for `µs`).
pub fn human_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let per_unit = match unit.trim() {
        "ns" => 1e-9,
        "µs" | "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "min" => 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(number * per_unit).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_reads_as_putex_check_prints_it() {
        let line = "worst-case crash failover ≈ W + G' + three store round trips = 407 ms (round trip assumed 354 µs)";
        assert_eq!(worst_case_bound(line), Some(Duration::from_millis(407)));
        let line = "worst-case crash failover ≈ W + G' + three store round trips = 12.2 s (round trip assumed 1.04 ms)";
        assert_eq!(worst_case_bound(line), Some(Duration::from_millis(12_200)));
        assert_eq!(worst_case_bound("no such line"), None);
        assert_eq!(human_duration("354 µs"), Some(Duration::from_micros(354)));
        assert_eq!(human_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(human_duration("12 parsecs"), None);
    }
}
