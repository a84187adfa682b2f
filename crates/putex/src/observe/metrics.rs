//! Metrics in OpenMetrics text format, for `/metrics`.
//!
//! A [`Metrics`] is one agent's (or one lock's) set of series, registered
//! into a [`Registry`] its caller owns and passes in: `putex run` registers
//! one set under the prefix `putex` and serves it on `/metrics`; a program
//! holding several locks registers a set per lock in a sub-registry with a
//! label of its own (`registry.sub_registry_with_label(("lock", name))`)
//! and gets labelled series instead of one shared set. The driver records
//! every store call's latency and its own progress; the agent's host
//! records roles, transitions, health checks, hook durations, stops and the
//! keeper's deadline. The licence left and the last renewal's age are
//! computed when the registry is encoded ([`encode`]).
//!
//! | series | type | what |
//! |---|---|---|
//! | `putex_role{role}` | gauge | 1 for the current role (`standby`, `confirming`, `active`, …) |
//! | `putex_held` | gauge | 1 while holding the lock (confirming, active, stepping down) |
//! | `putex_revision` | gauge | the revision of the fencing token while holding |
//! | `putex_transitions_total{to}` | counter | role transitions, by the new role |
//! | `putex_licence_left_seconds` | gauge | until the licence ends (0 when not holding) |
//! | `putex_last_renewal_age_seconds` | gauge | since the last successful renewal (NaN before the first) |
//! | `putex_store_call_duration_seconds{op,outcome}` | histogram | store calls by operation and outcome |
//! | `putex_health_checks_total{mode,result}` | counter | health checks by mode and result |
//! | `putex_hook_duration_seconds{hook}` | histogram | fence, activate and stop durations |
//! | `putex_hook_failures_total{hook}` | counter | hooks that failed: exited non-zero, timed out or could not run |
//! | `putex_graceful_stop_failures_total` | counter | graceful stops that could not prove the service stopped |
//! | `putex_stop_unproven` | gauge | 1 while the last stop proved nothing: the service may still run (alarm) |
//! | `putex_stops_unproven_total` | counter | stops, of any kind, that could not prove the service stopped |
//! | `putex_keeper_armed` | gauge | 1 while the keeper holds a deadline |
//! | `putex_keeper_fired_total` | counter | the keeper reached its deadline and stopped the service |
//! | `putex_failsafe_granted` | gauge | 1 while the last round of this holder's failsafe asks was granted by every member: the licence runs on grants (the store does not answer) |
//! | `putex_failsafe_rounds_total{result}` | counter | rounds of this holder's failsafe asks: `granted` (by every member) or `lost` |
//! | `putex_failsafe_answers_total{answer}` | counter | holders' failsafe asks this member answered: `granted`, `refused` (its state says no) or `rejected` (a MAC that does not verify, another lock or member, no answer in time) |
//! | `putex_build_info{version}` | info | the putex version |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
/// The registry the series are registered in (prometheus-client's).
pub use prometheus_client::registry::Registry;
use putex_core::{Instant, Role};

use crate::clock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToLabel {
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    op: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    mode: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabel {
    hook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabel {
    answer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

/// A boot-time moment kept for a gauge computed when scraped (0: none).
#[derive(Clone, Debug, Default)]
struct Moment(Arc<AtomicU64>);

impl Moment {
    fn set(&self, at: Option<Instant>) {
        self.0
            .store(at.map_or(0, |at| at.as_nanos()), Ordering::Relaxed);
    }

    fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|n| *n != 0)
    }
}

/// Seconds until a moment, 0 when there is none (the licence left).
#[derive(Clone, Debug, Default)]
struct SecondsUntil(Moment);

impl EncodeMetric for SecondsUntil {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let now = clock::boot_time_now().as_nanos();
        let left = Duration::from_nanos(self.0.get().unwrap_or(0).saturating_sub(now));
        encoder.encode_gauge(&left.as_secs_f64())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Seconds since a moment, NaN before there is one (the last renewal).
#[derive(Clone, Debug, Default)]
struct SecondsSince(Moment);

impl EncodeMetric for SecondsSince {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let age = self.0.get().map_or(f64::NAN, |at| {
            let now = clock::boot_time_now().as_nanos();
            Duration::from_nanos(now.saturating_sub(at)).as_secs_f64()
        });
        encoder.encode_gauge(&age)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// One agent's (or lock's) metrics: a cheap handle, clones share the
/// series.
#[derive(Clone)]
pub struct Metrics(Arc<Series>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct Series {
    role: Family<RoleLabel, Gauge>,
    held: Gauge,
    revision: Gauge,
    transitions: Family<ToLabel, Counter>,
    store: Family<StoreLabels, Histogram>,
    health: Family<HealthLabels, Counter>,
    hooks: Family<HookLabel, Histogram>,
    hook_failures: Family<HookLabel, Counter>,
    stop_failures: Counter,
    stop_unproven: Gauge,
    stops_unproven: Counter,
    keeper_armed: Gauge,
    keeper_fired: Counter,
    failsafe_answers: Family<AnswerLabel, Counter>,
    failsafe_granted: Gauge,
    failsafe_rounds: Family<ResultLabel, Counter>,
    /// The licence deadline, none when not holding.
    deadline: Moment,
    /// When the last renewal was acknowledged, none before the first.
    renewed_at: Moment,
    /// When the driver last went round its loop (boot-time ns).
    progress: AtomicU64,
    current_role: Mutex<Option<Role>>,
}

const ROLES: [Role; 7] = [
    Role::Starting,
    Role::Standby,
    Role::Confirming,
    Role::Active,
    Role::SteppingDown,
    Role::Lapsed,
    Role::Exited,
];

impl Metrics {
    /// Registers the series into `registry` (named `putex_…` in a registry
    /// made with `Registry::with_prefix("putex")`).
    pub fn register(registry: &mut Registry) -> Metrics {
        let role = Family::<RoleLabel, Gauge>::default();
        registry.register("role", "1 for the agent's current role", role.clone());
        for r in ROLES {
            role.get_or_create(&RoleLabel {
                role: r.to_string(),
            })
            .set(i64::from(r == Role::Starting));
        }
        let held = Gauge::default();
        registry.register("held", "1 while this node holds the lock", held.clone());
        let revision = Gauge::default();
        registry.register(
            "revision",
            "The revision of the fencing token while holding the lock",
            revision.clone(),
        );
        let transitions = Family::<ToLabel, Counter>::default();
        registry.register(
            "transitions",
            "Role transitions, by the new role",
            transitions.clone(),
        );
        for r in ROLES {
            // Every series exists from the start, at 0.
            let _ = transitions.get_or_create(&ToLabel { to: r.to_string() });
        }
        let deadline = Moment::default();
        registry.register(
            "licence_left_seconds",
            "Seconds until the licence ends (0 when not holding)",
            SecondsUntil(deadline.clone()),
        );
        let renewed_at = Moment::default();
        registry.register(
            "last_renewal_age_seconds",
            "Seconds since the last successful renewal (NaN before the first)",
            SecondsSince(renewed_at.clone()),
        );
        let store = Family::<StoreLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
        });
        registry.register(
            "store_call_duration_seconds",
            "Store calls by operation and outcome",
            store.clone(),
        );
        let health = Family::<HealthLabels, Counter>::default();
        registry.register(
            "health_checks",
            "Health checks by mode and result",
            health.clone(),
        );
        let hooks = Family::<HookLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 18))
        });
        registry.register(
            "hook_duration_seconds",
            "Fence, activate and stop durations",
            hooks.clone(),
        );
        let hook_failures = Family::<HookLabel, Counter>::default();
        registry.register(
            "hook_failures",
            "Hooks that failed: exited non-zero, timed out or could not run",
            hook_failures.clone(),
        );
        let stop_failures = Counter::default();
        registry.register(
            "graceful_stop_failures",
            "Graceful stops that could not prove the service stopped",
            stop_failures.clone(),
        );
        let stop_unproven = Gauge::default();
        registry.register(
            "stop_unproven",
            "1 while the last stop could not prove the service stopped: it may still run",
            stop_unproven.clone(),
        );
        let stops_unproven = Counter::default();
        registry.register(
            "stops_unproven",
            "Stops, of any kind, that could not prove the service stopped",
            stops_unproven.clone(),
        );
        let keeper_armed = Gauge::default();
        registry.register(
            "keeper_armed",
            "1 while the keeper holds a licence deadline",
            keeper_armed.clone(),
        );
        let keeper_fired = Counter::default();
        registry.register(
            "keeper_fired",
            "The keeper reached its deadline and stopped the service",
            keeper_fired.clone(),
        );
        let failsafe_answers = Family::<AnswerLabel, Counter>::default();
        registry.register(
            "failsafe_answers",
            "Holders' failsafe asks this member answered, by answer",
            failsafe_answers.clone(),
        );
        let failsafe_granted = Gauge::default();
        registry.register(
            "failsafe_granted",
            "1 while the last round of failsafe asks was granted by every member",
            failsafe_granted.clone(),
        );
        let failsafe_rounds = Family::<ResultLabel, Counter>::default();
        registry.register(
            "failsafe_rounds",
            "Rounds of this holder's failsafe asks, by result (granted by every member, or lost)",
            failsafe_rounds.clone(),
        );
        registry.register(
            "build",
            "The putex build",
            Info::new(VersionLabel {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        Metrics(Arc::new(Series {
            role,
            held,
            revision,
            transitions,
            store,
            health,
            hooks,
            hook_failures,
            stop_failures,
            stop_unproven,
            stops_unproven,
            keeper_armed,
            keeper_fired,
            failsafe_answers,
            failsafe_granted,
            failsafe_rounds,
            deadline,
            renewed_at,
            progress: AtomicU64::new(clock::boot_time_now().as_nanos()),
            current_role: Mutex::new(None),
        }))
    }

    /// Series that nobody scrapes: for a host without an endpoint, or a
    /// library caller that passed no registry.
    pub fn unregistered() -> Metrics {
        Metrics::register(&mut Registry::default())
    }

    /// Records a transition into `to`: `putex_role`, `putex_held`,
    /// `putex_revision` (`revision` while holding) and
    /// `putex_transitions_total`.
    pub(crate) fn transition(&self, to: Role, revision: Option<u64>) {
        for r in ROLES {
            self.0
                .role
                .get_or_create(&RoleLabel {
                    role: r.to_string(),
                })
                .set(i64::from(r == to));
        }
        self.0
            .transitions
            .get_or_create(&ToLabel { to: to.to_string() })
            .inc();
        let held = matches!(to, Role::Confirming | Role::Active | Role::SteppingDown);
        self.0.held.set(i64::from(held));
        match revision {
            Some(r) if held => {
                self.0.revision.set(i64::try_from(r).unwrap_or(i64::MAX));
            }
            _ if !held => {
                self.0.revision.set(0);
            }
            _ => {}
        }
        *self.0.current_role.lock() = Some(to);
    }

    /// The current role, once one was reported.
    pub fn role(&self) -> Option<Role> {
        *self.0.current_role.lock()
    }

    /// Records a finished store call's duration, by operation and
    /// outcome.
    pub(crate) fn store_call(&self, op: &str, outcome: &str, took: Duration) {
        self.0
            .store
            .get_or_create(&StoreLabels {
                op: op.to_string(),
                outcome: outcome.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a finished health check, by mode and result.
    pub(crate) fn health_check(&self, mode: &str, ok: bool) {
        self.0
            .health
            .get_or_create(&HealthLabels {
                mode: mode.to_string(),
                result: if ok { "ok" } else { "failed" }.to_string(),
            })
            .inc();
    }

    /// Records how long a hook (or stop) took.
    pub(crate) fn hook(&self, hook: &str, took: Duration) {
        self.0
            .hooks
            .get_or_create(&HookLabel {
                hook: hook.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// A hook failed: exited non-zero, timed out or could not run.
    pub(crate) fn hook_failed(&self, hook: &str) {
        self.0
            .hook_failures
            .get_or_create(&HookLabel {
                hook: hook.to_string(),
            })
            .inc();
    }

    /// A graceful stop could not prove the service stopped.
    pub(crate) fn graceful_stop_failed(&self) {
        self.0.stop_failures.inc();
    }

    /// A stop proved nothing (`true`: alarm) or, after that, proved the
    /// service stopped (`false`).
    pub(crate) fn stop_unproven(&self, unproven: bool) {
        if unproven {
            self.0.stops_unproven.inc();
        }
        self.0.stop_unproven.set(i64::from(unproven));
    }

    /// The keeper was armed or extended to `deadline` (a renewal
    /// succeeded), or disarmed (`None`).
    pub(crate) fn licence(&self, deadline: Option<Instant>) {
        self.0.deadline.set(deadline);
        if deadline.is_some() {
            self.0.renewed_at.set(Some(clock::boot_time_now()));
        }
        self.0.keeper_armed.set(i64::from(deadline.is_some()));
    }

    /// Counts the keeper reaching its deadline; the keeper is disarmed.
    pub(crate) fn keeper_fired(&self) {
        self.0.keeper_fired.inc();
        self.0.deadline.set(None);
        self.0.keeper_armed.set(0);
    }

    /// Counts one answer to a holder's failsafe ask: `granted`, `refused`
    /// or `rejected` ([`crate::failsafe::member`]).
    pub(crate) fn failsafe_answer(&self, answer: &'static str) {
        self.0
            .failsafe_answers
            .get_or_create(&AnswerLabel { answer })
            .inc();
    }

    /// Counts one round of this holder's failsafe asks and notes whether
    /// every member granted it.
    pub(crate) fn failsafe_round(&self, granted: bool) {
        let result = if granted { "granted" } else { "lost" };
        self.0
            .failsafe_rounds
            .get_or_create(&ResultLabel { result })
            .inc();
        self.0.failsafe_granted.set(i64::from(granted));
    }

    /// The failsafe ended: a write landed again.
    pub(crate) fn failsafe_over(&self) {
        self.0.failsafe_granted.set(0);
    }

    /// Notes that the driver went round its loop (for
    /// [`since_progress`](Metrics::since_progress)).
    pub(crate) fn progress(&self) {
        self.0
            .progress
            .store(clock::boot_time_now().as_nanos(), Ordering::Relaxed);
    }

    /// How long since the driver last went round its loop.
    pub(crate) fn since_progress(&self) -> Duration {
        Duration::from_nanos(
            clock::boot_time_now()
                .as_nanos()
                .saturating_sub(self.0.progress.load(Ordering::Relaxed)),
        )
    }
}

/// `registry` in OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_prefixed_and_change() {
        let mut registry = Registry::with_prefix("putex");
        let m = Metrics::register(&mut registry);
        m.transition(Role::Active, Some(42));
        m.store_call("update", "ok", Duration::from_millis(2));
        m.health_check("active", true);
        m.licence(Some(clock::boot_time_now() + Duration::from_secs(5)));
        let text = encode(&registry);
        for series in [
            "putex_role{role=\"active\"} 1",
            "putex_held 1",
            "putex_revision 42",
            "putex_transitions_total{to=\"active\"} 1",
            "putex_store_call_duration_seconds_count{op=\"update\",outcome=\"ok\"} 1",
            "putex_health_checks_total{mode=\"active\",result=\"ok\"} 1",
            "putex_keeper_armed 1",
            "putex_build_info{version=",
        ] {
            assert!(text.contains(series), "{series} missing in\n{text}");
        }
        assert!(text.contains("putex_licence_left_seconds 4."), "{text}");
        assert!(text.contains("putex_last_renewal_age_seconds 0."), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn computed_gauges_before_anything_happened() {
        let mut registry = Registry::with_prefix("putex");
        let m = Metrics::register(&mut registry);
        let text = encode(&registry);
        assert!(text.contains("putex_licence_left_seconds 0.0"), "{text}");
        assert!(
            text.contains("putex_last_renewal_age_seconds NaN"),
            "{text}"
        );
        m.licence(Some(clock::boot_time_now() + Duration::from_secs(5)));
        m.keeper_fired();
        let text = encode(&registry);
        assert!(text.contains("putex_licence_left_seconds 0.0"), "{text}");
        assert!(text.contains("putex_keeper_fired_total 1"), "{text}");
    }

    #[test]
    fn several_locks_in_one_registry_get_labelled_series() {
        let mut registry = Registry::with_prefix("putex");
        let a = Metrics::register(registry.sub_registry_with_label(("lock".into(), "a".into())));
        let b = Metrics::register(registry.sub_registry_with_label(("lock".into(), "b".into())));
        a.transition(Role::Active, Some(7));
        b.transition(Role::Standby, None);
        b.store_call("update", "ok", Duration::from_millis(1));
        let text = encode(&registry);
        for series in [
            "putex_held{lock=\"a\"} 1",
            "putex_held{lock=\"b\"} 0",
            "putex_revision{lock=\"a\"} 7",
            "putex_store_call_duration_seconds_count{lock=\"b\",op=\"update\",outcome=\"ok\"} 1",
        ] {
            assert!(text.contains(series), "{series} missing in\n{text}");
        }
        assert!(!text.contains("lock=\"a\",op=\"update\""), "{text}");
    }
}
