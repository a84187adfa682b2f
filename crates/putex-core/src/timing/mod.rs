//! Timing configuration: R, F, C, K, S, ε and the timeouts, validated.
//!
//! [`TimingConfig`] holds what the user asked for (every field has a named
//! default); [`TimingConfig::validate`] turns it into a [`Timing`] or a
//! [`TimingError`] that names the option to change. [`Timing::timeline`]
//! explains the worst cases in words and numbers, which is what
//! `putex check` prints.
//!
//! The constraints (`docs/safety.md`, the timing constraints):
//! - F ≥ 2 (the holder survives F−2 missed renewals);
//! - health-check timeout + store deadline < R (a round fits in a round);
//! - emergency-stop timeout + scheduling margin ≤ G·(1−ε)/(1+ε): the old
//!   holder's emergency stop ends before the new holder's fencing gap does,
//!   whichever way the two clocks err;
//! - with store facts ([`StoreFacts`]): R ≥ 10 × p99 compare-and-swap
//!   latency, and T ≥ 10 s on a replicated bucket unless short leases are
//!   allowed (a stream-leader election takes 4–9 s).

use std::fmt;
use std::time::Duration;

use thiserror::Error;

use crate::mutation::{Mutations, Rule};
use crate::time::{Drift, Human};

/// Default renewal interval R.
pub const DEFAULT_RENEW: Duration = Duration::from_secs(1);
/// Default lease length in renewals F.
pub const DEFAULT_FAILURES: u32 = 10;
/// Default confirmation count C.
pub const DEFAULT_CONFIRM: u32 = 2;
/// Default unhealthy threshold K.
pub const DEFAULT_UNHEALTHY: u32 = 3;
/// Default success threshold S.
pub const DEFAULT_SUCCESSES: u32 = 1;
/// Default clock-rate bound ε: 1 %.
pub const DEFAULT_MAX_DRIFT_PPM: u32 = 10_000;
/// Default grace after the activate hook returns before `active` checks count.
pub const DEFAULT_START_GRACE: Duration = Duration::from_secs(5);
/// Default time allowed for the activate hook.
pub const DEFAULT_ACTIVATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time allowed for a graceful stop (the holder keeps renewing).
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest clock-rate bound accepted: beyond it the waits grow absurd.
pub const MAX_DRIFT_PPM: u32 = 200_000;
/// The longest duration a timing setting, T or G may be: the core's clock
/// counts nanoseconds in a `u64` (about 584 years). Longer ones are refused
/// ([`TimingError::TooLong`]) rather than overflow later.
pub const MAX_DURATION: Duration = Duration::from_nanos(u64::MAX);
/// The shortest lease allowed on a replicated bucket without
/// `--allow-short-lease`: longer than a stream-leader election.
pub const MIN_REPLICATED_LEASE: Duration = Duration::from_secs(10);

/// Default scheduling margin: 50 ms, or a tenth of G if G is short.
pub fn default_sched_margin(gap: Duration) -> Duration {
    (gap / 10).min(Duration::from_millis(50))
}

/// Default health-check timeout: half of R.
pub fn default_healthcheck_timeout(renew: Duration) -> Duration {
    renew / 2
}

/// Default store-call deadline: two fifths of R.
pub fn default_store_timeout(renew: Duration) -> Duration {
    renew * 2 / 5
}

/// Timing settings as given; `None` means "derive the default".
#[derive(Clone, Debug, PartialEq)]
pub struct TimingConfig {
    /// R: the holder health-checks and renews once per R (`--renew`).
    pub renew: Duration,
    /// F: lease length in renewals (`--failures`).
    pub failures: u32,
    /// C: confirmation count (`--confirm`); G = C·R.
    pub confirm: u32,
    /// K: consecutive failed `active` checks before stepping down (`--unhealthy`).
    pub unhealthy: u32,
    /// S: consecutive good checks before (re)acquiring (`--successes`).
    pub successes: u32,
    /// ε: the clock-rate bound (`--max-drift`).
    pub max_drift: Drift,
    /// Longest lease any holder may advertise (`--max-lease`); used when a
    /// record is absent or unreadable and its holder's T is unknown (S4).
    pub max_lease: Option<Duration>,
    /// Longest fencing gap G any holder may advertise (`--max-gap`); owed,
    /// with `--max-lease`, when a record is absent or unreadable and its
    /// holder's G is unknown (S4): that holder's emergency stop may take up
    /// to its own G after its licence ends.
    pub max_gap: Option<Duration>,
    /// Allow T below 10 s on a replicated bucket (`--allow-short-lease`).
    pub allow_short_lease: bool,
    /// After the activate hook returns, `standby` checks are used for this long
    /// (`--start-grace`).
    pub start_grace: Duration,
    /// Scheduling margin kept out of the emergency budget (`--sched-margin`).
    pub sched_margin: Option<Duration>,
    /// Health-check timeout (`--healthcheck-timeout`); default R/2.
    pub healthcheck_timeout: Option<Duration>,
    /// Store-call deadline (`--store-timeout`); default 2R/5.
    pub store_timeout: Option<Duration>,
    /// Activate-hook timeout (`--activate-timeout`).
    pub activate_timeout: Duration,
    /// Graceful-stop timeout (`--stop-timeout`).
    pub stop_timeout: Duration,
    /// Emergency-stop timeout (`--emergency-timeout`); default: the budget.
    pub emergency_timeout: Option<Duration>,
    /// Test-only: rules switched off inside the timing functions (W, G',
    /// T'), which the simulation's own bound check shares; only its
    /// overlap check can then catch them. Always empty outside tests.
    #[doc(hidden)]
    pub mutations: Mutations,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            renew: DEFAULT_RENEW,
            failures: DEFAULT_FAILURES,
            confirm: DEFAULT_CONFIRM,
            unhealthy: DEFAULT_UNHEALTHY,
            successes: DEFAULT_SUCCESSES,
            max_drift: Drift::from_ppm(DEFAULT_MAX_DRIFT_PPM),
            max_lease: None,
            max_gap: None,
            allow_short_lease: false,
            start_grace: DEFAULT_START_GRACE,
            sched_margin: None,
            healthcheck_timeout: None,
            store_timeout: None,
            activate_timeout: DEFAULT_ACTIVATE_TIMEOUT,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            emergency_timeout: None,
            mutations: Mutations::NONE,
        }
    }
}

/// A timing setting that cannot work, naming the option to change.
#[derive(Clone, Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum TimingError {
    /// A duration option is zero.
    #[error("{option} must be greater than zero")]
    Zero {
        /// The option, e.g. `--renew`.
        option: &'static str,
    },
    /// A count option is below its minimum.
    #[error("{option} must be at least {min} (got {got})")]
    TooFew {
        /// The option, e.g. `--failures`.
        option: &'static str,
        /// The smallest allowed value.
        min: u32,
        /// The value given.
        got: u32,
    },
    /// A duration option, or T = F·R or G = C·R, is longer than
    /// [`MAX_DURATION`].
    #[error("{option} is longer than the longest supported duration (about 584 years)")]
    TooLong {
        /// The option, e.g. `--renew`, or `--renew × --failures` for T.
        option: &'static str,
        /// [`MAX_DURATION`].
        max: Duration,
    },
    /// ε is too large to give useful bounds.
    #[error("--max-drift {got_percent}% is above the largest supported bound of {max_percent}%")]
    DriftTooLarge {
        /// The value given.
        got_percent: f64,
        /// The largest allowed.
        max_percent: f64,
    },
    /// A round does not fit in R.
    #[error(
        "--healthcheck-timeout ({}) + --store-timeout ({}) must be shorter than --renew ({}): \
         a renewal round must fit in one interval",
        Human(*healthcheck),
        Human(*store),
        Human(*renew)
    )]
    RoundTooLong {
        /// Health-check timeout.
        healthcheck: Duration,
        /// Store deadline.
        store: Duration,
        /// R.
        renew: Duration,
    },
    /// The emergency stop does not fit in the fencing gap.
    #[error(
        "--emergency-timeout {} exceeds the budget G·(1−ε)/(1+ε) − margin = {} (G = {}, \
         margin = {}); raise --confirm or --renew, or lower --emergency-timeout or --sched-margin",
        Human(*emergency),
        Human(*budget),
        Human(*gap),
        Human(*margin)
    )]
    EmergencyOverBudget {
        /// The emergency-stop timeout.
        emergency: Duration,
        /// The budget it must fit in.
        budget: Duration,
        /// G = C·R.
        gap: Duration,
        /// The scheduling margin.
        margin: Duration,
    },
    /// `--max-lease` is shorter than this node's own lease.
    #[error(
        "--max-lease ({}) is shorter than this node's own lease T = F·R = {}",
        Human(*max_lease),
        Human(*lease)
    )]
    MaxLeaseTooShort {
        /// The value given.
        max_lease: Duration,
        /// T.
        lease: Duration,
    },
    /// `--max-gap` is shorter than this node's own fencing gap.
    #[error(
        "--max-gap ({}) is shorter than this node's own fencing gap G = C·R = {}",
        Human(*max_gap),
        Human(*gap)
    )]
    MaxGapTooShort {
        /// The value given.
        max_gap: Duration,
        /// G.
        gap: Duration,
    },
    /// R is too short for the store's latency.
    #[error(
        "--renew ({}) must be at least ten times the store's p99 compare-and-swap latency ({}); \
         use --renew {} or more",
        Human(*renew),
        Human(*p99),
        FlagValue(*suggest)
    )]
    RenewTooShortForStore {
        /// R.
        renew: Duration,
        /// Measured p99 CAS latency.
        p99: Duration,
        /// 10 × p99, rounded up to two significant digits of milliseconds
        /// (at least 1 ms): a value to pass as `--renew`.
        suggest: Duration,
    },
    /// T is shorter than a stream-leader election on a replicated bucket.
    #[error(
        "lease T = F·R = {} is shorter than {} on a replicated bucket: a stream-leader election \
         would cause a failover; raise --failures or --renew, or pass --allow-short-lease",
        Human(*lease),
        Human(*min)
    )]
    ShortLeaseOnReplicatedStore {
        /// T.
        lease: Duration,
        /// The minimum.
        min: Duration,
    },
}

/// `d` rounded up to two significant digits of whole milliseconds, at least
/// 1 ms: a suggestion that is not below what it suggests and reads well
/// (126.09374 ms becomes 130 ms, 1261 ms becomes 1300 ms).
fn round_up_for_flag(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000).max(1);
    let mut step = 1;
    while ms / step >= 100 {
        step *= 10;
    }
    let rounded = ms.div_ceil(step) * step;
    Duration::from_millis(u64::try_from(rounded).unwrap_or(u64::MAX))
}

/// A duration written as a flag value (`130ms`, `2s`): what
/// [`humantime`-style](https://docs.rs/humantime) duration flags accept,
/// with no space, so that it can be copied into a command line. Whole
/// seconds are written in seconds, anything else in milliseconds (rounded
/// up).
struct FlagValue(Duration);

impl fmt::Display for FlagValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_nanos().div_ceil(1_000_000);
        if ms > 0 && ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

/// What the driver learned about the store, for the checks that depend on it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreFacts {
    /// Measured p99 compare-and-swap latency.
    pub p99_cas: Option<Duration>,
    /// Whether the bucket is replicated (leader elections can happen).
    pub replicated: bool,
}

/// Validated timing; every derived value is computed here once.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    config: TimingConfig,
    sched_margin: Duration,
    healthcheck_timeout: Duration,
    store_timeout: Duration,
    emergency_timeout: Duration,
}

impl TimingConfig {
    /// Checks every constraint that does not depend on the store.
    pub fn validate(&self) -> Result<Timing, TimingError> {
        for (option, d) in [
            ("--renew", self.renew),
            ("--activate-timeout", self.activate_timeout),
            ("--stop-timeout", self.stop_timeout),
        ] {
            if d.is_zero() {
                return Err(TimingError::Zero { option });
            }
        }
        for (option, min, got) in [
            ("--failures", 2, self.failures),
            ("--confirm", 1, self.confirm),
            ("--unhealthy", 1, self.unhealthy),
            ("--successes", 1, self.successes),
        ] {
            if got < min {
                return Err(TimingError::TooFew { option, min, got });
            }
        }
        let too_long = |option| TimingError::TooLong {
            option,
            max: MAX_DURATION,
        };
        for (option, d) in [
            ("--renew", Some(self.renew)),
            ("--activate-timeout", Some(self.activate_timeout)),
            ("--stop-timeout", Some(self.stop_timeout)),
            ("--start-grace", Some(self.start_grace)),
            ("--max-lease", self.max_lease),
            ("--max-gap", self.max_gap),
            ("--sched-margin", self.sched_margin),
            ("--healthcheck-timeout", self.healthcheck_timeout),
            ("--store-timeout", self.store_timeout),
            ("--emergency-timeout", self.emergency_timeout),
        ] {
            if d.is_some_and(|d| d > MAX_DURATION) {
                return Err(too_long(option));
            }
        }
        // T and G (and every sum the agent forms from the settings) stay
        // within the clock's range.
        let within = |d: Option<Duration>| d.filter(|d| *d <= MAX_DURATION);
        let Some(lease) = within(self.renew.checked_mul(self.failures)) else {
            return Err(too_long("T = --failures × --renew"));
        };
        let Some(gap) = within(self.renew.checked_mul(self.confirm)) else {
            return Err(too_long("G = --confirm × --renew"));
        };
        if self.max_drift.ppm() > MAX_DRIFT_PPM {
            return Err(TimingError::DriftTooLarge {
                got_percent: f64::from(self.max_drift.ppm()) / 10_000.0,
                max_percent: f64::from(MAX_DRIFT_PPM) / 10_000.0,
            });
        }
        let healthcheck = self
            .healthcheck_timeout
            .unwrap_or_else(|| default_healthcheck_timeout(self.renew));
        let store = self
            .store_timeout
            .unwrap_or_else(|| default_store_timeout(self.renew));
        for (option, d) in [
            ("--healthcheck-timeout", healthcheck),
            ("--store-timeout", store),
        ] {
            if d.is_zero() {
                return Err(TimingError::Zero { option });
            }
        }
        if healthcheck + store >= self.renew {
            return Err(TimingError::RoundTooLong {
                healthcheck,
                store,
                renew: self.renew,
            });
        }
        let margin = self
            .sched_margin
            .unwrap_or_else(|| default_sched_margin(gap));
        let budget = self.max_drift.shrink(gap).saturating_sub(margin);
        let emergency = self.emergency_timeout.unwrap_or(budget);
        if emergency.is_zero() {
            return Err(TimingError::Zero {
                option: "--emergency-timeout",
            });
        }
        if emergency > budget {
            return Err(TimingError::EmergencyOverBudget {
                emergency,
                budget: round_ms(budget),
                gap,
                margin,
            });
        }
        if let Some(max_lease) = self.max_lease {
            if max_lease < lease {
                return Err(TimingError::MaxLeaseTooShort { max_lease, lease });
            }
        }
        if let Some(max_gap) = self.max_gap {
            if max_gap < gap {
                return Err(TimingError::MaxGapTooShort { max_gap, gap });
            }
        }
        Ok(Timing {
            config: self.clone(),
            sched_margin: margin,
            healthcheck_timeout: healthcheck,
            store_timeout: store,
            emergency_timeout: emergency,
        })
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Timing {
    /// The settings as given.
    pub fn config(&self) -> &TimingConfig {
        &self.config
    }
    /// R.
    pub fn renew(&self) -> Duration {
        self.config.renew
    }
    /// T = F·R: how long one successful write keeps its holder's licence.
    pub fn lease(&self) -> Duration {
        self.config.renew * self.config.failures
    }
    /// G = C·R: the fencing gap between a stale takeover and activation.
    pub fn gap(&self) -> Duration {
        self.config.renew * self.config.confirm
    }
    /// ε.
    pub fn drift(&self) -> Drift {
        self.config.max_drift
    }
    /// K.
    pub fn unhealthy(&self) -> u32 {
        self.config.unhealthy
    }
    /// S.
    pub fn successes(&self) -> u32 {
        self.config.successes
    }
    /// `--max-lease`, if set.
    pub fn max_lease(&self) -> Option<Duration> {
        self.config.max_lease
    }
    /// `--max-gap`, if set.
    pub fn max_gap(&self) -> Option<Duration> {
        self.config.max_gap
    }
    /// `--start-grace`.
    pub fn start_grace(&self) -> Duration {
        self.config.start_grace
    }
    /// Health-check timeout.
    pub fn healthcheck_timeout(&self) -> Duration {
        self.healthcheck_timeout
    }
    /// Store-call deadline.
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }
    /// Activate-hook timeout.
    pub fn activate_timeout(&self) -> Duration {
        self.config.activate_timeout
    }
    /// Graceful-stop timeout.
    pub fn stop_timeout(&self) -> Duration {
        self.config.stop_timeout
    }
    /// Emergency-stop timeout; fits in [`Timing::emergency_budget`].
    pub fn emergency_timeout(&self) -> Duration {
        self.emergency_timeout
    }
    /// Scheduling margin.
    pub fn sched_margin(&self) -> Duration {
        self.sched_margin
    }
    /// `G·(1−ε)/(1+ε) − margin`: how long an emergency stop may take.
    pub fn emergency_budget(&self) -> Duration {
        self.drift()
            .shrink(self.gap())
            .saturating_sub(self.sched_margin)
    }

    /// T' for a record advertising `advertised`: the larger of the two.
    pub fn lease_against(&self, advertised: Duration) -> Duration {
        if self.config.mutations.is(Rule::TimingIgnoresAdvertisedLease) {
            return self.lease();
        }
        self.lease().max(advertised)
    }

    /// T' when the holder's T is unknown (record absent or unreadable): the
    /// `--max-lease` if set, else the own T (S4).
    pub fn lease_unknown(&self) -> Duration {
        self.max_lease().unwrap_or(self.lease())
    }

    /// W = T'·(1+ε)/(1−ε): the staleness wait for a holder whose T' is given.
    pub fn staleness_wait(&self, lease: Duration) -> Duration {
        if self.config.mutations.is(Rule::TimingWaitWithoutDrift) {
            return lease;
        }
        self.drift().stretch(lease)
    }

    /// G' for a displaced holder advertising `gap`: the larger of the two.
    pub fn gap_against(&self, advertised: Duration) -> Duration {
        if self.config.mutations.is(Rule::TimingGapDropped) {
            return Duration::ZERO;
        }
        self.gap().max(advertised)
    }

    /// G' when the holder's G is unknown (record absent or unreadable): the
    /// larger of `--max-gap` and the own G (S4).
    pub fn gap_unknown(&self) -> Duration {
        if self.config.mutations.is(Rule::TimingGapDropped) {
            return Duration::ZERO;
        }
        self.max_gap().map_or(self.gap(), |m| m.max(self.gap()))
    }

    /// Checks the constraints that depend on the store.
    pub fn check_store(&self, facts: &StoreFacts) -> Result<(), TimingError> {
        if let Some(p99) = facts.p99_cas {
            if self.renew() < p99.saturating_mul(10) {
                return Err(TimingError::RenewTooShortForStore {
                    renew: self.renew(),
                    p99,
                    suggest: round_up_for_flag(p99.saturating_mul(10)),
                });
            }
        }
        if facts.replicated && !self.config.allow_short_lease && self.lease() < MIN_REPLICATED_LEASE
        {
            return Err(TimingError::ShortLeaseOnReplicatedStore {
                lease: self.lease(),
                min: MIN_REPLICATED_LEASE,
            });
        }
        Ok(())
    }

    /// A warning when a record advertises a T above `--max-lease` or a G
    /// above `--max-gap`: after a store data loss, S4 protects only up to
    /// them.
    pub fn advertised_timing_warning(&self, lease: Duration, gap: Duration) -> Option<String> {
        let mut over = Vec::new();
        if let Some(max) = self.max_lease().filter(|m| lease > *m) {
            over.push(format!(
                "lease {}, above --max-lease {}",
                Human(lease),
                Human(max)
            ));
        }
        if let Some(max) = self.max_gap().filter(|m| gap > *m) {
            over.push(format!(
                "fencing gap {}, above --max-gap {}",
                Human(gap),
                Human(max)
            ));
        }
        (!over.is_empty()).then(|| {
            format!(
                "a holder advertises {}: if the store loses its record, takers wait only for \
                 --max-lease and --max-gap",
                over.join(" and ")
            )
        })
    }

    /// The worst cases of this configuration, for `putex check`.
    ///
    /// `store_round_trip` is the typical store round trip (measured, or the
    /// store deadline as an upper bound).
    pub fn timeline(&self, store_round_trip: Duration) -> Timeline {
        self.timeline_on(store_round_trip, Duration::ZERO)
    }

    /// [`Timing::timeline`] on a store whose clock reads in steps of
    /// `store_clock_step` (etcd's lease TTL: whole seconds; zero for NATS
    /// and the embedded store). The store-clock witness (S1 b) then agrees
    /// up to two steps late (a record's stamp rounded up, the probe's
    /// down), and the standby probes again once per R until it does.
    pub fn timeline_on(&self, store_round_trip: Duration, store_clock_step: Duration) -> Timeline {
        let wait = self.staleness_wait(self.lease());
        let witness_delay = if store_clock_step.is_zero() {
            Duration::ZERO
        } else {
            store_clock_step * 2 + self.renew()
        };
        let crash_failover = wait + witness_delay + self.gap() + store_round_trip * 3;
        Timeline {
            renew: self.renew(),
            lease: self.lease(),
            // T on a clock running at 1−ε lasts T/(1−ε) in real time.
            lease_real_max: slow_clock(self.lease(), self.drift()),
            staleness_wait: wait,
            gap: self.gap(),
            emergency_budget: self.emergency_budget(),
            emergency_timeout: self.emergency_timeout(),
            absent_wait: self.staleness_wait(self.lease_unknown()) + self.gap_unknown(),
            store_round_trip,
            witness_delay,
            crash_failover,
            survives_missed: self.config.failures - 2,
            drift_percent: f64::from(self.drift().ppm()) / 10_000.0,
        }
    }
}

fn slow_clock(d: Duration, drift: Drift) -> Duration {
    let m = u128::from(Drift::MILLION);
    let e = u128::from(drift.ppm());
    let n = (d.as_nanos() * m).div_ceil(m - e);
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// The worst cases of a timing configuration, in numbers; `Display` says them
/// in words.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// R.
    pub renew: Duration,
    /// T on the holder's clock.
    pub lease: Duration,
    /// T in real time on a clock running at the slow bound.
    pub lease_real_max: Duration,
    /// W for a holder with the same T.
    pub staleness_wait: Duration,
    /// G.
    pub gap: Duration,
    /// The emergency-stop budget.
    pub emergency_budget: Duration,
    /// The configured emergency-stop timeout.
    pub emergency_timeout: Duration,
    /// Wait before activating over an absent record (S4): W(max-lease) + G(max-gap).
    pub absent_wait: Duration,
    /// The store round trip assumed.
    pub store_round_trip: Duration,
    /// How much later than W the store's clock can agree (S1 b), on a store
    /// whose clock reads in steps (etcd); zero elsewhere.
    pub witness_delay: Duration,
    /// Worst-case crash failover B ≈ W + G' + three store round trips (+
    /// the witness delay).
    pub crash_failover: Duration,
    /// Missed renewals in a row the holder survives (F−2).
    pub survives_missed: u32,
    /// ε in percent.
    pub drift_percent: f64,
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| crate::time::Human(d).to_string();
        writeln!(
            f,
            "renewal every R = {}; lease T = {} (survives {} missed renewals in a row)",
            ms(self.renew),
            ms(self.lease),
            self.survives_missed
        )?;
        writeln!(
            f,
            "the holder stops at most T = {} after sending its last successful renewal \
             ({} of real time if its clock runs {}% slow)",
            ms(self.lease),
            ms(self.lease_real_max),
            self.drift_percent
        )?;
        writeln!(
            f,
            "a standby takes over no earlier than W = {} after it last saw a renewal \
             (T·(1+ε)/(1−ε), ε = {}%)",
            ms(self.staleness_wait),
            self.drift_percent
        )?;
        writeln!(
            f,
            "the service starts no earlier than G' = {} later; the old holder's emergency stop \
             must finish within {} (configured: {})",
            ms(self.gap),
            ms(self.emergency_budget),
            ms(self.emergency_timeout)
        )?;
        if self.witness_delay.is_zero() {
            writeln!(
                f,
                "worst-case crash failover ≈ W + G' + three store round trips = {} \
                 (round trip assumed {})",
                ms(self.crash_failover),
                ms(self.store_round_trip)
            )?;
        } else {
            writeln!(
                f,
                "the store's clock reads in whole seconds (etcd): it agrees that W has passed \
                 up to {} later (two steps and a probe every R)",
                ms(self.witness_delay)
            )?;
            writeln!(
                f,
                "worst-case crash failover ≈ W + {} + G' + three store round trips = {} \
                 (round trip assumed {})",
                ms(self.witness_delay),
                ms(self.crash_failover),
                ms(self.store_round_trip)
            )?;
        }
        write!(
            f,
            "first use of a lock name (no record yet) waits {} before activating, unless \
             the store proves the name unused that long (the embedded store and etcd do, \
             once their proof is that old: docs/stores.md)",
            ms(self.absent_wait)
        )
    }
}

#[cfg(test)]
mod tests;
