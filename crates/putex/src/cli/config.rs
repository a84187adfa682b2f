//! The agent's configuration: flags > environment (`PUTEX_*`) > config file
//! (`--config`, TOML) > defaults.
//!
//! [`AgentArgs`] is what clap parsed: every value optional, so that "not
//! given" can fall through to the file and then to the defaults (clap fills
//! in the `PUTEX_*` variable of a flag that was not given). [`FileConfig`]
//! is the TOML file, with the flags' names as keys:
//!
//! ```toml
//! lock = "pg"
//! store = "nats://10.0.0.1:4222,10.0.0.2:4222,10.0.0.3:4222?replicas=3"
//! healthcheck = "/usr/local/bin/pg-health"
//! activate = "systemctl start postgresql"
//! deactivate = "systemctl stop postgresql"
//! renew = "1s"
//! failures = 10
//! max-drift = "1%"
//! ```
//!
//! [`resolve`] merges them and validates everything it can
//! without the store: names, hooks, and the timing rules
//! ([`TimingConfig::validate`]). Every error names the flag (and the file
//! key or variable) to change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use putex_core::{timing, Drift, TimingConfig};
use serde::Deserialize;

pub use crate::agent::{AgentSettings, OperatorSettings, ServiceMode};
pub use crate::identity::hostname;
use crate::store::{Name, NodeId, StoreUrl};
use crate::supervision::hooks::{Hook, HookKind};

use super::CliError;

/// Parses a duration like `100ms`, `2s`, `1m30s` (humantime), for clap.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}: write a duration like 100ms, 2s or 1m30s"))
}

/// A flag's help ending in its default, written from the named constant
/// (`putex_core::timing`, `DEFAULT_*` here and in the commands) so that
/// `--help` cannot drift from what the code does: `text [default: VALUE]`.
pub(crate) fn help_with_default(text: &str, default: impl std::fmt::Display) -> String {
    format!("{} [default: {default}]", text.trim_end_matches('.'))
}

/// A duration as the flags take it: `1s`, `100ms`, `1m 30s`.
pub(crate) fn flag_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A clock-rate bound in parts per million as the flags take it: `1%`.
pub(crate) fn flag_drift(ppm: u32) -> String {
    format!("{}%", f64::from(ppm) / 10_000.0)
}

/// Parses a clock-rate bound: `1%`, `0.5%`, or a bare number of percent.
pub fn parse_drift(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%').trim();
    let v: f64 = t
        .parse()
        .map_err(|_| format!("{s:?} is not a percentage: write e.g. 1% or 0.5%"))?;
    if !(0.0..100.0).contains(&v) || !v.is_finite() {
        return Err(format!("{s:?} must be at least 0% and below 100%"));
    }
    Ok(v)
}

/// The timing flags `putex run`, `putex check` and `putex lock` share.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TimingArgs {
    /// R: health-check (agents) and renew once per R.
    #[arg(long, env = "PUTEX_RENEW", value_parser = parse_duration,
          help = help_with_default("R: health-check (agents) and renew once per R.", flag_duration(timing::DEFAULT_RENEW)))]
    pub renew: Option<Duration>,
    /// F: lease length in renewals, T = F·R, at least 2.
    #[arg(long, env = "PUTEX_FAILURES",
          help = help_with_default("F: lease length in renewals, T = F·R, at least 2.", timing::DEFAULT_FAILURES))]
    pub failures: Option<u32>,
    /// C: confirmation count, fencing gap G = C·R.
    #[arg(long, env = "PUTEX_CONFIRM",
          help = help_with_default("C: confirmation count, fencing gap G = C·R.", timing::DEFAULT_CONFIRM))]
    pub confirm: Option<u32>,
    /// ε: clock-rate bound, e.g. 0.5%.
    #[arg(long, env = "PUTEX_MAX_DRIFT", value_parser = parse_drift,
          help = help_with_default("ε: clock-rate bound, e.g. 0.5%.", flag_drift(timing::DEFAULT_MAX_DRIFT_PPM)))]
    pub max_drift: Option<f64>,
    /// Longest lease any holder may advertise (used when a record is lost).
    #[arg(long, env = "PUTEX_MAX_LEASE", value_parser = parse_duration)]
    pub max_lease: Option<Duration>,
    /// Longest fencing gap G any holder may advertise (used when a record
    /// is lost) [default: the own G].
    #[arg(long, env = "PUTEX_MAX_GAP", value_parser = parse_duration)]
    pub max_gap: Option<Duration>,
    /// Allow T < 10 s on a replicated store (a NATS bucket with more than one
    /// replica, or an etcd cluster of more than one member).
    #[arg(long, env = "PUTEX_ALLOW_SHORT_LEASE")]
    pub allow_short_lease: bool,
    /// Deadline of each store call [default: 2R/5].
    #[arg(long, env = "PUTEX_STORE_TIMEOUT", value_parser = parse_duration)]
    pub store_timeout: Option<Duration>,
    /// Time allowed for an emergency stop [default: the budget G·(1−ε)/(1+ε) − margin].
    #[arg(long, env = "PUTEX_EMERGENCY_TIMEOUT", value_parser = parse_duration)]
    pub emergency_timeout: Option<Duration>,
}

/// The flags shared by `putex run` and `putex check`, as parsed: `None`
/// means "not given on the command line nor in the environment".
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AgentArgs {
    /// The lock name: [A-Za-z0-9_-]{1,64}.
    #[arg(long, env = "PUTEX_LOCK")]
    pub lock: Option<String>,
    /// The store URL (help: [`crate::cli::AGENT_STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::AGENT_STORE_HELP, long_help = crate::cli::AGENT_STORE_HELP)]
    pub store: Option<String>,
    /// This node's id (default: the hostname).
    #[arg(long, env = "PUTEX_NODE")]
    pub node: Option<String>,
    /// Health check, run with `active` or `standby` as its last argument.
    #[arg(long, env = "PUTEX_HEALTHCHECK")]
    pub healthcheck: Option<String>,
    /// Hook mode: starts the service.
    #[arg(long, env = "PUTEX_ACTIVATE")]
    pub activate: Option<String>,
    /// Hook mode: stops the service (PUTEX_STOP says why).
    #[arg(long, env = "PUTEX_DEACTIVATE")]
    pub deactivate: Option<String>,
    /// Hook mode: fences the previous holder out before activating.
    #[arg(long, env = "PUTEX_FENCE")]
    pub fence: Option<String>,
    /// R, F, C, ε and the other timing flags `putex lock` shares.
    #[command(flatten)]
    pub timing: TimingArgs,
    /// K: failed `active` checks in a row before stepping down.
    #[arg(long, env = "PUTEX_UNHEALTHY",
          help = help_with_default("K: failed `active` checks in a row before stepping down.", timing::DEFAULT_UNHEALTHY))]
    pub unhealthy: Option<u32>,
    /// S: good checks in a row before (re)acquiring.
    #[arg(long, env = "PUTEX_SUCCESSES",
          help = help_with_default("S: good checks in a row before (re)acquiring.", timing::DEFAULT_SUCCESSES))]
    pub successes: Option<u32>,
    /// `standby` checks are used for this long after activation.
    #[arg(long, env = "PUTEX_START_GRACE", value_parser = parse_duration,
          help = help_with_default("`standby` checks are used for this long after activation.", flag_duration(timing::DEFAULT_START_GRACE)))]
    pub start_grace: Option<Duration>,
    /// Scheduling margin kept out of the emergency budget [default: min(50ms, G/10)].
    #[arg(long, env = "PUTEX_SCHED_MARGIN", value_parser = parse_duration)]
    pub sched_margin: Option<Duration>,
    /// Health-check (and --position) timeout [default: R/2].
    #[arg(long, env = "PUTEX_HEALTHCHECK_TIMEOUT", value_parser = parse_duration)]
    pub healthcheck_timeout: Option<Duration>,
    /// Time allowed for the fence, activate, rejoin and follow hooks.
    #[arg(long, env = "PUTEX_ACTIVATE_TIMEOUT", value_parser = parse_duration,
          help = help_with_default("Time allowed for the fence, activate, rejoin and follow hooks.", flag_duration(timing::DEFAULT_ACTIVATE_TIMEOUT)))]
    pub activate_timeout: Option<Duration>,
    /// Time allowed for a graceful stop.
    #[arg(long, env = "PUTEX_STOP_TIMEOUT", value_parser = parse_duration,
          help = help_with_default("Time allowed for a graceful stop.", flag_duration(timing::DEFAULT_STOP_TIMEOUT)))]
    pub stop_timeout: Option<Duration>,
    /// Directory of the keeper sockets, lock files and state files
    /// [default: /run/putex for root, else $XDG_RUNTIME_DIR/putex, else
    /// /tmp/putex-UID].
    #[arg(long, env = "PUTEX_KEEPER_DIR")]
    pub keeper_dir: Option<PathBuf>,
    /// Never use cgroup scopes for the service and the hooks: the keeper
    /// owns the child's tree as its subreaper instead (where cgroup v2 is
    /// missing, not writable, or managed by someone else). The agent then
    /// keeps a snapshot of the tree (members, process groups, sessions) to
    /// find it should the keeper die.
    #[arg(long, env = "PUTEX_NO_CGROUP")]
    pub no_cgroup: bool,
    /// Serve /primary, /replica, /read-only, /health, /liveness, /readiness,
    /// /metrics and the status page /ui on this address (e.g. 0.0.0.0:8008).
    #[arg(long, env = "PUTEX_HTTP", value_name = "ADDR")]
    pub http: Option<String>,
    /// Failsafe: during a store outage the holder keeps its service while
    /// every other member of the lock grants its signed asks, on --http
    /// (every member with the same flags; docs/operations.md "Riding out a
    /// store outage").
    #[arg(long, env = "PUTEX_FAILSAFE")]
    pub failsafe: bool,
    /// The key that signs failsafe asks and grants (the same file on every
    /// member; mode 600, at least 32 bytes).
    #[arg(long, env = "PUTEX_FAILSAFE_KEY_FILE", value_name = "FILE")]
    pub failsafe_key_file: Option<PathBuf>,
    /// The HOST:PORT other members reach this agent's --http at (default:
    /// --http's address, unless it listens on every interface).
    #[arg(long, env = "PUTEX_FAILSAFE_ADVERTISE", value_name = "HOST:PORT")]
    pub failsafe_advertise: Option<String>,
    /// The longest a holder runs on grants after its last renewal that
    /// landed (default 2m); every member of a lock the same.
    #[arg(
        long,
        env = "PUTEX_FAILSAFE_MAX",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub failsafe_max: Option<Duration>,
    /// Candidacy: 0 never takes over; among eligible standbys a higher
    /// one is preferred, after a higher --position.
    #[arg(long, env = "PUTEX_PRIORITY",
          help = help_with_default("Candidacy: 0 never takes over; among eligible standbys a higher one is preferred, after a higher --position.", crate::agent::settings::DEFAULT_PRIORITY))]
    pub priority: Option<u32>,
    /// A command printing this node's data position, run each round: a
    /// non-negative integer that only grows while it follows the holder
    /// (e.g. a replay LSN in bytes). The most advanced node takes over first.
    #[arg(long, env = "PUTEX_POSITION", value_name = "CMD")]
    pub position: Option<String>,
    /// Do not take over while this node's position is more than N behind
    /// the highest position any member published (needs --position).
    #[arg(long, env = "PUTEX_MAX_LAG", value_name = "N")]
    pub max_lag: Option<u64>,
    /// A command run after a tenure of this node ended without a clean
    /// release (crash, emergency stop, lost lease), e.g. pg_rewind against
    /// the holder (PUTEX_HOLDER, PUTEX_HOLDER_ADDR); the node takes nothing
    /// over until it exits 0.
    #[arg(long, env = "PUTEX_REJOIN", value_name = "CMD")]
    pub rejoin: Option<String>,
    /// The address this node publishes in its member record; hooks get the
    /// holder's as PUTEX_HOLDER_ADDR.
    #[arg(long, env = "PUTEX_ADVERTISE", value_name = "ADDR")]
    pub advertise: Option<String>,
    /// A command run on every node that is not the holder whenever the
    /// active holder changes, and at start (PUTEX_HOLDER, PUTEX_HOLDER_ADDR):
    /// e.g. re-point a replica at the new primary.
    #[arg(long, env = "PUTEX_FOLLOW", value_name = "CMD")]
    pub follow: Option<String>,
    /// A command printing a small JSON object about this node (e.g. its
    /// role, timeline and LSNs), run every 3 renewals: published in the
    /// member record and shown by putex status, a column per field (at most
    /// 16 fields of strings, numbers or booleans, 4 KiB).
    #[arg(long, env = "PUTEX_INFO", value_name = "CMD")]
    pub info: Option<String>,
    /// Hand the lock back: while holding, switch over to a member with a
    /// higher --priority once it has been ready (checks passing, rejoined,
    /// within --max-lag) for this long without a break [default: never].
    #[arg(long, env = "PUTEX_FAILBACK_AFTER", value_name = "DUR", value_parser = parse_duration)]
    pub failback_after: Option<Duration>,
    /// A TOML file with the same settings (keys are the flag names).
    #[arg(long, env = "PUTEX_CONFIG")]
    pub config: Option<PathBuf>,
    /// Child mode: the service command, run under the keeper while active.
    #[arg(last = true, value_name = "CHILD")]
    pub child: Vec<String>,
}

/// The config file (`--config`): the flags' names as keys, durations as
/// strings (`"100ms"`), `max-drift` as `"1%"`. Unknown keys are refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// `lock`.
    pub lock: Option<String>,
    /// `store`.
    pub store: Option<String>,
    /// `node`.
    pub node: Option<String>,
    /// `healthcheck`.
    pub healthcheck: Option<String>,
    /// `activate`.
    pub activate: Option<String>,
    /// `deactivate`.
    pub deactivate: Option<String>,
    /// `fence`.
    pub fence: Option<String>,
    /// `child`: the child command as a list, e.g. `["my-server", "--port", "5432"]`.
    pub child: Option<Vec<String>>,
    /// `renew`.
    pub renew: Option<String>,
    /// `failures`.
    pub failures: Option<u32>,
    /// `confirm`.
    pub confirm: Option<u32>,
    /// `unhealthy`.
    pub unhealthy: Option<u32>,
    /// `successes`.
    pub successes: Option<u32>,
    /// `max-drift`.
    pub max_drift: Option<String>,
    /// `max-lease`.
    pub max_lease: Option<String>,
    /// `max-gap`.
    pub max_gap: Option<String>,
    /// `allow-short-lease`.
    pub allow_short_lease: Option<bool>,
    /// `start-grace`.
    pub start_grace: Option<String>,
    /// `sched-margin`.
    pub sched_margin: Option<String>,
    /// `healthcheck-timeout`.
    pub healthcheck_timeout: Option<String>,
    /// `store-timeout`.
    pub store_timeout: Option<String>,
    /// `activate-timeout`.
    pub activate_timeout: Option<String>,
    /// `stop-timeout`.
    pub stop_timeout: Option<String>,
    /// `emergency-timeout`.
    pub emergency_timeout: Option<String>,
    /// `keeper-dir`.
    pub keeper_dir: Option<PathBuf>,
    /// `no-cgroup`.
    pub no_cgroup: Option<bool>,
    /// `http`.
    pub http: Option<String>,
    /// `failsafe`.
    pub failsafe: Option<bool>,
    /// `failsafe-key-file`.
    pub failsafe_key_file: Option<PathBuf>,
    /// `failsafe-advertise`.
    pub failsafe_advertise: Option<String>,
    /// `failsafe-max`.
    pub failsafe_max: Option<String>,
    /// `priority`.
    pub priority: Option<u32>,
    /// `position`.
    pub position: Option<String>,
    /// `max-lag`.
    pub max_lag: Option<u64>,
    /// `rejoin`.
    pub rejoin: Option<String>,
    /// `advertise`.
    pub advertise: Option<String>,
    /// `follow`.
    pub follow: Option<String>,
    /// `info`.
    pub info: Option<String>,
    /// `failback-after`.
    pub failback_after: Option<String>,
}

impl FileConfig {
    /// Reads and parses a config file; errors name the file and the key.
    pub fn load(path: &Path) -> Result<FileConfig, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::Usage(format!("--config {}: cannot read it: {e}", path.display()))
        })?;
        FileConfig::parse(&text)
            .map_err(|e| CliError::Usage(format!("--config {}: {e}", path.display())))
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| e.message().to_string() + &location(text, &e))
    }
}

fn location(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

/// Whether the hooks and the lock name are required (`run`) or optional
/// (`check`, which can validate timing alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// Everything `putex run` needs must be there.
    Run,
    /// Only what is given is checked.
    Check,
}

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// The flag, its variable and its file key, for messages.
fn names(flag: &str) -> String {
    let var = format!("PUTEX_{}", flag.replace('-', "_").to_ascii_uppercase());
    format!("--{flag} (or {var}, or `{flag}` in the config file)")
}

fn file_duration(key: &str, v: &Option<String>) -> Result<Option<Duration>, CliError> {
    v.as_deref()
        .map(|s| parse_duration(s).map_err(|e| usage(format!("config key `{key}` = {s:?}: {e}"))))
        .transpose()
}

/// Merges flags/environment (`args`), the config file (`file`) and the
/// defaults, and validates the result.
pub fn resolve(
    args: &AgentArgs,
    file: &FileConfig,
    strict: Strictness,
) -> Result<AgentSettings, CliError> {
    let pick = |a: &Option<String>, f: &Option<String>| {
        a.clone()
            .or_else(|| f.clone())
            .filter(|s| !s.trim().is_empty())
    };
    let lock = match pick(&args.lock, &file.lock) {
        Some(l) => Some(Name::new(l).map_err(|e| usage(format!("--lock: {e}")))?),
        None if strict == Strictness::Run => {
            return Err(usage(format!("missing {}", names("lock"))))
        }
        None => None,
    };
    let store = match pick(&args.store, &file.store) {
        Some(u) => StoreUrl::parse(&u).map_err(|e| usage(format!("--store: {e}")))?,
        // PUTEX_STORE was clap's; NATS_URL (and NATS_CREDS), else sqlite:.
        None => StoreUrl::from_env().map_err(|e| usage(format!("--store: {e}")))?,
    };
    let node = NodeId::new(pick(&args.node, &file.node).unwrap_or_else(hostname))
        .map_err(|e| usage(format!("--node: {e}")))?;

    let healthcheck = pick(&args.healthcheck, &file.healthcheck);
    let activate = pick(&args.activate, &file.activate);
    let deactivate = pick(&args.deactivate, &file.deactivate);
    let fence = pick(&args.fence, &file.fence);
    let child = if args.child.is_empty() {
        file.child.clone().unwrap_or_default()
    } else {
        args.child.clone()
    };
    if healthcheck.is_none() && strict == Strictness::Run {
        return Err(usage(format!("missing {}", names("healthcheck"))));
    }
    let service = match (activate, deactivate, child.is_empty()) {
        (Some(_), _, false) | (_, Some(_), false) => {
            return Err(usage(
                "give either --activate and --deactivate (hook mode) or `-- CHILD ARGS...` \
                 (child mode), not both",
            ))
        }
        (Some(activate), Some(deactivate), true) => Some(ServiceMode::Hooks {
            activate,
            deactivate,
            fence,
        }),
        (Some(_), None, true) => {
            return Err(usage(format!(
                "--activate needs {} to stop the service",
                names("deactivate")
            )))
        }
        (None, Some(_), true) => {
            return Err(usage(format!(
                "--deactivate needs {} to start the service",
                names("activate")
            )))
        }
        (None, None, false) => Some(ServiceMode::Child { argv: child, fence }),
        (None, None, true) if strict == Strictness::Run => {
            return Err(usage(
                "nothing to run: give --activate and --deactivate (hook mode) or \
                 `-- CHILD ARGS...` after the flags (child mode)",
            ))
        }
        (None, None, true) => None,
    };
    validate_hooks(healthcheck.as_deref(), service.as_ref())?;

    let timing_config = TimingConfig {
        renew: args
            .timing
            .renew
            .or(file_duration("renew", &file.renew)?)
            .unwrap_or(putex_core::timing::DEFAULT_RENEW),
        failures: args
            .timing
            .failures
            .or(file.failures)
            .unwrap_or(putex_core::timing::DEFAULT_FAILURES),
        confirm: args
            .timing
            .confirm
            .or(file.confirm)
            .unwrap_or(putex_core::timing::DEFAULT_CONFIRM),
        unhealthy: args
            .unhealthy
            .or(file.unhealthy)
            .unwrap_or(putex_core::timing::DEFAULT_UNHEALTHY),
        successes: args
            .successes
            .or(file.successes)
            .unwrap_or(putex_core::timing::DEFAULT_SUCCESSES),
        max_drift: match args.timing.max_drift {
            Some(p) => Drift::from_percent(p),
            None => match &file.max_drift {
                Some(s) => Drift::from_percent(
                    parse_drift(s).map_err(|e| usage(format!("config key `max-drift`: {e}")))?,
                ),
                None => Drift::from_ppm(putex_core::timing::DEFAULT_MAX_DRIFT_PPM),
            },
        },
        max_lease: args
            .timing
            .max_lease
            .or(file_duration("max-lease", &file.max_lease)?),
        max_gap: args
            .timing
            .max_gap
            .or(file_duration("max-gap", &file.max_gap)?),
        allow_short_lease: args.timing.allow_short_lease || file.allow_short_lease.unwrap_or(false),
        start_grace: args
            .start_grace
            .or(file_duration("start-grace", &file.start_grace)?)
            .unwrap_or(putex_core::timing::DEFAULT_START_GRACE),
        sched_margin: args
            .sched_margin
            .or(file_duration("sched-margin", &file.sched_margin)?),
        healthcheck_timeout: args.healthcheck_timeout.or(file_duration(
            "healthcheck-timeout",
            &file.healthcheck_timeout,
        )?),
        store_timeout: args
            .timing
            .store_timeout
            .or(file_duration("store-timeout", &file.store_timeout)?),
        activate_timeout: args
            .activate_timeout
            .or(file_duration("activate-timeout", &file.activate_timeout)?)
            .unwrap_or(putex_core::timing::DEFAULT_ACTIVATE_TIMEOUT),
        stop_timeout: args
            .stop_timeout
            .or(file_duration("stop-timeout", &file.stop_timeout)?)
            .unwrap_or(putex_core::timing::DEFAULT_STOP_TIMEOUT),
        emergency_timeout: args
            .timing
            .emergency_timeout
            .or(file_duration("emergency-timeout", &file.emergency_timeout)?),
        mutations: Default::default(),
    };
    let timing = timing_config.validate().map_err(|e| usage(e.to_string()))?;
    let keeper_dir = args
        .keeper_dir
        .clone()
        .or_else(|| file.keeper_dir.clone())
        .unwrap_or_else(crate::supervision::keeper::default_keeper_dir);
    let http: Option<std::net::SocketAddr> = match pick(&args.http, &file.http) {
        Some(a) => Some(a.trim().parse().map_err(|e| {
            usage(format!(
                "{}: {a:?} is not an address ({e}); write e.g. 0.0.0.0:8008",
                names("http")
            ))
        })?),
        None => None,
    };
    let operator = OperatorSettings {
        priority: args
            .priority
            .or(file.priority)
            .unwrap_or(crate::agent::settings::DEFAULT_PRIORITY),
        position: pick(&args.position, &file.position),
        max_lag: args.max_lag.or(file.max_lag),
        rejoin: pick(&args.rejoin, &file.rejoin),
        advertise: pick(&args.advertise, &file.advertise),
        follow: pick(&args.follow, &file.follow),
        info: pick(&args.info, &file.info),
        failback_after: args
            .failback_after
            .or(file_duration("failback-after", &file.failback_after)?),
    };
    for (flag, kind, cmd) in [
        ("--position", HookKind::Position, &operator.position),
        ("--rejoin", HookKind::Rejoin, &operator.rejoin),
        ("--follow", HookKind::Follow, &operator.follow),
        ("--info", HookKind::Info, &operator.info),
    ] {
        if let Some(cmd) = cmd {
            Hook::new(kind, cmd.as_str())
                .validate()
                .map_err(|e| usage(format!("{flag}: {e}")))?;
        }
    }
    let failsafe = if args.failsafe || file.failsafe.unwrap_or(false) {
        let Some(path) = args
            .failsafe_key_file
            .clone()
            .or_else(|| file.failsafe_key_file.clone())
        else {
            return Err(usage(format!(
                "{} needs {}: members sign their asks and grants with it",
                names("failsafe"),
                names("failsafe-key-file")
            )));
        };
        let Some(listen) = http else {
            return Err(usage(format!(
                "{} needs {}: holders ask the members on it",
                names("failsafe"),
                names("http")
            )));
        };
        let advertise = match pick(&args.failsafe_advertise, &file.failsafe_advertise) {
            Some(a) => a.trim().to_owned(),
            None if listen.ip().is_unspecified() => {
                return Err(usage(format!(
                    "{} listens on every interface ({listen}): say with {} which address other members reach it at",
                    names("http"),
                    names("failsafe-advertise")
                )))
            }
            None => listen.to_string(),
        };
        let key = crate::failsafe::auth::FailsafeKey::from_file(&path)
            .map_err(|e| usage(format!("{}: {e}", names("failsafe-key-file"))))?;
        let max = args
            .failsafe_max
            .or(file_duration("failsafe-max", &file.failsafe_max)?)
            .unwrap_or(crate::agent::settings::DEFAULT_FAILSAFE_MAX);
        if max.is_zero() {
            return Err(usage(format!(
                "{} must be more than 0 (without failsafe, leave out {})",
                names("failsafe-max"),
                names("failsafe")
            )));
        }
        Some(crate::agent::settings::FailsafeSettings {
            key,
            advertise,
            max,
        })
    } else {
        None
    };
    if operator.max_lag.is_some() && operator.position.is_none() {
        return Err(usage(format!(
            "{} needs {}: the lag is measured between positions",
            names("max-lag"),
            names("position")
        )));
    }
    Ok(AgentSettings {
        lock,
        store,
        node,
        healthcheck,
        service,
        timing_config,
        timing,
        keeper_dir,
        http,
        no_cgroup: args.no_cgroup || file.no_cgroup.unwrap_or(false),
        keeper_exe: None,
        operator,
        failsafe,
    })
}

/// Resolves `args`, reading the config file it names (if any).
pub fn from_args(args: &AgentArgs, strict: Strictness) -> Result<AgentSettings, CliError> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    resolve(args, &file, strict)
}

fn validate_hooks(
    healthcheck: Option<&str>,
    service: Option<&ServiceMode>,
) -> Result<(), CliError> {
    let mut hooks: Vec<(&str, Hook)> = Vec::new();
    if let Some(h) = healthcheck {
        hooks.push(("--healthcheck", Hook::new(HookKind::Health, h)));
    }
    match service {
        Some(ServiceMode::Hooks {
            activate,
            deactivate,
            fence,
        }) => {
            hooks.push((
                "--activate",
                Hook::new(HookKind::Activate, activate.as_str()),
            ));
            hooks.push((
                "--deactivate",
                Hook::new(HookKind::Deactivate, deactivate.as_str()),
            ));
            if let Some(f) = fence {
                hooks.push(("--fence", Hook::new(HookKind::Fence, f.as_str())));
            }
        }
        Some(ServiceMode::Child { fence: Some(f), .. }) => {
            hooks.push(("--fence", Hook::new(HookKind::Fence, f.as_str())));
        }
        _ => {}
    }
    for (flag, hook) in hooks {
        hook.validate().map_err(|e| usage(format!("{flag}: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> AgentArgs {
        AgentArgs {
            lock: Some("pg".into()),
            node: Some("n1".into()),
            store: Some("memory:".into()),
            healthcheck: Some("true".into()),
            activate: Some("true".into()),
            deactivate: Some("true".into()),
            ..AgentArgs::default()
        }
    }

    #[test]
    fn flags_beat_the_file_which_beats_the_defaults() {
        let file =
            FileConfig::parse("renew = \"200ms\"\nfailures = 4\nconfirm = 3\nmax-drift = \"2%\"\n")
                .unwrap();
        let mut a = args();
        a.timing.failures = Some(5);
        let s = resolve(&a, &file, Strictness::Run).unwrap();
        assert_eq!(s.timing.renew(), Duration::from_millis(200));
        assert_eq!(s.timing_config.failures, 5, "the flag wins");
        assert_eq!(s.timing_config.confirm, 3, "the file beats the default");
        assert_eq!(s.timing.drift().ppm(), 20_000);
        assert_eq!(s.timing_config.unhealthy, 3, "the default");
    }

    #[test]
    fn file_errors_name_the_key() {
        let e = FileConfig::parse("renw = \"1s\"\n").unwrap_err();
        assert!(e.contains("renw"), "{e}");
        let file = FileConfig::parse("renew = \"soon\"\n").unwrap();
        let e = resolve(&args(), &file, Strictness::Run)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("config key `renew`"), "{e}");
    }

    #[test]
    fn validation_names_the_flag() {
        let mut a = args();
        a.timing.failures = Some(1);
        let e = resolve(&a, &FileConfig::default(), Strictness::Run).unwrap_err();
        assert_eq!(e.code(), 2);
        assert_eq!(e.to_string(), "--failures must be at least 2 (got 1)");
        let mut a = args();
        a.lock = None;
        let e = resolve(&a, &FileConfig::default(), Strictness::Run)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--lock (or PUTEX_LOCK"), "{e}");
        let mut a = args();
        a.child = vec!["sleep".into(), "1".into()];
        let e = resolve(&a, &FileConfig::default(), Strictness::Run)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not both"), "{e}");
        let mut a = args();
        a.lock = Some("a.b".into());
        let e = resolve(&a, &FileConfig::default(), Strictness::Run)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--lock: "), "{e}");
    }

    #[test]
    fn the_help_shows_the_defaults_the_code_applies() {
        use clap::CommandFactory;
        let cmd = crate::cli::app::Cli::command();
        let run = cmd.find_subcommand("run").expect("putex run");
        // The default a flag's help names, parsed as the flag would be.
        let shown = |flag: &str| -> String {
            let arg = run
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("--{flag}"));
            let help = arg.get_help().expect("help").to_string();
            let at = help.rfind("[default: ").expect(&help);
            help[at + 10..help.len() - 1].to_string()
        };
        let s = resolve(
            &AgentArgs::default(),
            &FileConfig::default(),
            Strictness::Check,
        )
        .unwrap();
        let t = &s.timing_config;
        let dur = |flag: &str| parse_duration(&shown(flag)).unwrap();
        let num = |flag: &str| shown(flag).parse::<u32>().unwrap();
        assert_eq!(dur("renew"), t.renew);
        assert_eq!(num("failures"), t.failures);
        assert_eq!(num("confirm"), t.confirm);
        assert_eq!(
            Drift::from_percent(parse_drift(&shown("max-drift")).unwrap()),
            t.max_drift
        );
        assert_eq!(num("unhealthy"), t.unhealthy);
        assert_eq!(num("successes"), t.successes);
        assert_eq!(dur("start-grace"), t.start_grace);
        assert_eq!(dur("activate-timeout"), t.activate_timeout);
        assert_eq!(dur("stop-timeout"), t.stop_timeout);
        assert_eq!(num("priority"), s.operator.priority);
    }

    #[test]
    fn check_is_lenient_and_defaults_apply() {
        let s = resolve(
            &AgentArgs::default(),
            &FileConfig::default(),
            Strictness::Check,
        )
        .unwrap();
        assert_eq!(s.timing.lease(), Duration::from_secs(10));
        assert!(matches!(s.store, StoreUrl::Sqlite { .. }), "{:?}", s.store);
        assert!(!s.node.is_empty());
    }

    #[test]
    fn durations_and_drift_parse() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("1").is_err());
        assert_eq!(parse_drift("1%").unwrap(), 1.0);
        assert_eq!(parse_drift("0.5").unwrap(), 0.5);
        assert!(parse_drift("x").is_err());
        assert!(parse_drift("150%").is_err());
    }
}
