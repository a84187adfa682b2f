//! The failover agent's settings: validated, whatever they came from.
//!
//! The command line builds them from flags, `PUTEX_*` variables and the
//! config file (`cli::config`); a program can build them itself.

use std::net::SocketAddr;
use std::path::PathBuf;

use putex_core::{Timing, TimingConfig};

use crate::store::{Name, NodeId, StoreUrl};

/// How the service is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceMode {
    /// `--activate`/`--deactivate` (and optionally `--fence`) hooks.
    Hooks {
        /// `--activate`: a shell command (run by `/bin/sh -c`) that starts
        /// the service.
        activate: String,
        /// `--deactivate`: a shell command that stops it (`PUTEX_STOP`
        /// says why).
        deactivate: String,
        /// `--fence`: a shell command that fences the previous holder out
        /// before activating.
        fence: Option<String>,
    },
    /// `-- CHILD ARGS...`, spawned and owned by the keeper.
    Child {
        /// The child's program and arguments, executed directly (not
        /// through a shell).
        argv: Vec<String>,
        /// `--fence`, run before the child is spawned.
        fence: Option<String>,
    },
}

/// Validated settings of `putex run` / `putex check`.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The lock name (`None` only for a lenient `check`).
    pub lock: Option<Name>,
    /// The store holding the lock (`--store`, `PUTEX_STORE` or the config
    /// file's `store`; without any, [`StoreUrl::from_env`]).
    pub store: StoreUrl,
    /// This host's node id in the lock and member records (`--node`,
    /// default the hostname).
    pub node: NodeId,
    /// The health check (`None` only for a lenient `check`).
    pub healthcheck: Option<String>,
    /// Hooks or child (`None` only for a lenient `check`).
    pub service: Option<ServiceMode>,
    /// The timing settings as the flags and the config file gave them,
    /// before validation; the agent runs on [`timing`](Self::timing).
    pub timing_config: TimingConfig,
    /// The timing, validated.
    pub timing: Timing,
    /// Keeper sockets, lock files and host state files live here.
    pub keeper_dir: PathBuf,
    /// `--http`: where the health and metrics endpoints listen.
    pub http: Option<SocketAddr>,
    /// `--no-cgroup`: process trees by the keeper as subreaper only.
    pub no_cgroup: bool,
    /// The program that runs the keeper (`<exe> keeper …`); `None`: this
    /// program itself, which must then be the putex binary.
    pub keeper_exe: Option<PathBuf>,
    /// Candidacy, position, rejoin and address (O3, O4).
    pub operator: OperatorSettings,
    /// `--failsafe`: this member answers holders' signed asks
    /// ([`crate::failsafe::member`]).
    pub failsafe: Option<FailsafeSettings>,
}

/// `--failsafe`'s settings.
#[derive(Clone, Debug)]
pub struct FailsafeSettings {
    /// `--failsafe-key-file`, read.
    pub key: crate::failsafe::auth::FailsafeKey,
    /// `--failsafe-advertise` (default: `--http`'s address): the
    /// `HOST:PORT` other members reach this agent's `--http` at, published
    /// in its member record.
    pub advertise: String,
    /// `--failsafe-max`: the longest the holder runs on grants after its
    /// last renewal that landed (F3's cap).
    pub max: std::time::Duration,
}

/// `--failsafe-max`'s default: two minutes of a store outage ridden out.
pub const DEFAULT_FAILSAFE_MAX: std::time::Duration = std::time::Duration::from_secs(120);

/// How this node stands as a candidate (O3, O4) and what it tells others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorSettings {
    /// `--priority`: 0 never takes over; higher is preferred.
    pub priority: u32,
    /// `--position`: a shell command printing this node's data position
    /// (a non-negative integer that only grows while it follows the holder).
    pub position: Option<String>,
    /// `--max-lag`: the most this node's position may be behind the
    /// highest published one for it to take over.
    pub max_lag: Option<u64>,
    /// `--rejoin`: a shell command that resynchronises this node with the
    /// holder after a tenure that ended without a clean release.
    pub rejoin: Option<String>,
    /// `--advertise`: the address published in the member record; hooks
    /// get the holder's as `PUTEX_HOLDER_ADDR`.
    pub advertise: Option<String>,
    /// `--follow`: a shell command run on every node that is not the
    /// holder whenever the active holder changes (and at start).
    pub follow: Option<String>,
    /// `--failback-after`: while holding, switch over to a member with a
    /// higher `--priority` once it has been ready this long (O5).
    pub failback_after: Option<std::time::Duration>,
    /// `--info`: a shell command printing a small JSON object for the
    /// member record ([`crate::report::info`]).
    pub info: Option<String>,
}

/// The default `--priority`.
pub const DEFAULT_PRIORITY: u32 = 1;

impl Default for OperatorSettings {
    fn default() -> Self {
        OperatorSettings {
            priority: DEFAULT_PRIORITY,
            position: None,
            max_lag: None,
            rejoin: None,
            advertise: None,
            follow: None,
            failback_after: None,
            info: None,
        }
    }
}

impl AgentSettings {
    /// The lock name; present for `run` settings.
    pub fn lock_name(&self) -> &str {
        self.lock.as_deref().unwrap_or("")
    }

    /// A stable id of the store for the keeper socket and the lock file
    /// (the URL without secrets).
    pub fn store_id(&self) -> String {
        self.store.to_string()
    }
}

/// Settings that validate but do not do what they seem to: each a sentence
/// naming the options, for `putex check` to print and `putex run` to log.
pub fn timing_warnings(t: &Timing) -> Vec<String> {
    let mut w = Vec::new();
    let (k, f) = (t.unhealthy(), t.config().failures);
    if k >= f {
        // A failed check skips its renewal (H2): after K − 1 of them the
        // licence has K − 1 rounds fewer to run, and with K ≥ F it ends
        // about when the K-th check is due.
        w.push(format!(
            "--unhealthy ({k}) is not below --failures ({f}): a holder whose health checks \
             fail lapses when its licence ends (an emergency stop, no release, a full \
             stale takeover) before it can step down gracefully after {k} failed checks; \
             use --unhealthy {} or more --failures",
            f - 1
        ));
    }
    w
}
