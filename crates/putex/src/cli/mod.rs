//! The command line: flags → validated settings → commands.
//!
//! Two stages, as in ripgrep's `lowargs`/`hiargs`: `config::AgentArgs`
//! holds what clap parsed (flags, with `PUTEX_*` environment variables
//! filled in by clap), `config::resolve` merges the TOML
//! file (`--config`) and the defaults below them and validates the result,
//! with errors that name the flag or key to change.
//!
//! | module | command |
//! |---|---|
//! | `app` | the commands and their flags as clap reads them (`main.rs` parses them) |
//! | `config` | the agent's flags, environment, config file and defaults |
//! | `check` | `putex check`: validate and print the timeline |
//! | `control` | `putex switchover`, `putex pause`, `putex resume`: the operator's requests (O1, O2) |
//! | `run` | `putex run`: flags → settings → [`crate::agent::run`] → exit code |
//! | `status` | `putex status`: the lock and member records |
//! | `history` | `putex history`: who held a lock when and why it moved (transition records) |
//! | `watch` | `putex watch`: a live view of a lock's status and last transitions |
//! | `manual` | `putex completions` and `putex man`: generated from the clap definition |
//! | `demo` | `putex demo`: three agents on a temporary SQLite store |
//! | `id` | `putex id`: identity pools — claim, release, list, check (exit codes in `sysexits`) |
//! | `lock` | `putex lock`: a command run while a lock is held (exit codes in `sysexits`) |
//! | `serve` | `putex serve`: the HTTP lock gateway (RDLM-compatible API, `/v1/` JSON API) |
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (for `run`: shut down on request) |
//! | 1 | any other failure (e.g. a stop that could not be proven) |
//! | 2 | usage or configuration error: the message names the flag or key |
//! | 3 | the store is unreachable or refused to open |
//! | 4 | another agent already runs this lock on this host (lock file), or another machine uses this node id |
//! | 5 | `switchover`, `pause`, `resume`: `--wait` ran out ([`TIMED_OUT`](crate::cli::control::TIMED_OUT)) |
//!
//! `putex lock` and `putex id` exit with codes of their own (`sysexits`),
//! so that theirs do not collide with the small codes a script's command
//! returns.

use std::fmt;
use std::process::ExitCode;

pub mod app;
pub mod check;
pub mod config;
pub mod control;
pub mod demo;
pub mod history;
pub mod id;
pub mod kv;
pub mod lock;
pub mod manual;
pub mod run;
pub mod serve;
pub mod status;
pub mod watch;

/// Whether putex reads the environment variable `name`: every `PUTEX_*`,
/// and `NATS_URL` and `NATS_CREDS` (as the `nats` CLI uses them).
pub fn is_putex_var(name: &str) -> bool {
    name.starts_with("PUTEX_") || name == "NATS_URL" || name == "NATS_CREDS"
}

/// Removes from the process environment every putex variable
/// ([`is_putex_var`]) that is set but empty or only whitespace, and returns
/// their names: an empty variable is not a value. Without this, clap takes
/// `PUTEX_STORE=` for the store URL `""` (clap 4 has no setting to ignore
/// empty environment values), `PUTEX_RENEW=` for an unparseable duration,
/// and an empty variable hides the config file's value below it.
///
/// Call it first thing in `main`, before clap reads the environment and
/// before any thread starts (the environment is process-wide and not
/// synchronised). What putex starts — hooks, `putex lock`'s CMD, the
/// keeper — inherits the environment without them, which to them means the
/// same (unset); every other variable is passed on unchanged.
pub fn unset_empty_vars() -> Vec<String> {
    let empty: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            let blank = v.to_str().is_some_and(|v| v.trim().is_empty());
            (blank && is_putex_var(&k)).then_some(k)
        })
        .collect();
    for k in &empty {
        std::env::remove_var(k);
    }
    empty
}

/// The kinds of store URL, for every `--store` help.
macro_rules! store_urls {
    () => {
        "The store URL: nats://HOST:PORT[,...][?OPTIONS] (NATS JetStream KV; \
         tls://… the same over TLS), etcd://HOST:PORT[,...][?OPTIONS] (etcd), \
         sqlite:///PATH.db (an embedded \
         SQLite file), or sqlite: (this user's embedded store, \
         $XDG_STATE_HOME/putex/store.db, else ~/.local/state/putex/store.db)"
    };
}

/// `--store`'s help: every kind of store and where the default comes from
/// (`StoreUrl::from_env`).
pub const STORE_HELP: &str = concat!(
    store_urls!(),
    " [default: PUTEX_STORE, else NATS_URL, else sqlite:]"
);

/// `putex run`'s and `putex check`'s `--store` help: the config file's
/// `store` comes between the variables.
pub const AGENT_STORE_HELP: &str = concat!(
    store_urls!(),
    " [default: PUTEX_STORE, else the config file's store, else NATS_URL, else sqlite:]"
);

/// Text for `putex --help` listing the exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success (run: shut down on request)
  1  other failure (e.g. a stop that could not be proven)
  2  usage or configuration error (the message names the flag or key)
  3  store unreachable
  4  another agent runs this lock on this host, or another machine uses this node id
  5  switchover, pause, resume: --wait ran out
putex lock, putex id and putex kv exit with codes of their own: see their --help.";

/// Why a command failed, and which exit code that is.
#[derive(Debug)]
pub enum CliError {
    /// Exit 2: a flag, variable or config key is wrong.
    Usage(String),
    /// Exit 3: the store cannot be reached or opened.
    Store(String),
    /// Exit 4: a second agent for the lock on this host, or a duplicate node id.
    Duplicate(String),
    /// Exit 1: anything else.
    Other(String),
    /// An explicit exit code with a message: `putex lock` and `putex id`
    /// use the `sysexits` codes, and `putex lock` passes on its
    /// command's status.
    Exit(u8, String),
}

/// The exit codes of `putex lock` and `putex id`, after BSD's
/// `sysexits.h`, so that they do not collide with the small codes a
/// script's own command returns.
///
/// | code | name | meaning |
/// |---|---|---|
/// | 64 | `USAGE` | a flag, name or argument is wrong (the message names it) |
/// | 65 | `DATAERR` | `putex id check` found an inconsistency |
/// | 69 | `UNAVAILABLE` | the store cannot be reached or opened |
/// | 70 | `SOFTWARE` | internal failure: the keeper or a lock machine failed (the command's stop is then not proven: the lock is not released and goes stale). A stop not yet proven is no exit: `putex lock` keeps the lock, retries the kill and raises the alarm until the tree is gone |
/// | 75 | `TEMPFAIL` | not acquired: the lock is held (`--no-wait`, `--wait` ran out), or an id pool is exhausted |
/// | 76 | `LOST` | the lock was lost while the command ran; it and its whole tree were stopped |
/// | 124 | `TIMEOUT` | `--max-duration` passed; the command and its tree were stopped (as `timeout(1)`) |
/// | 126 | `NOT_EXECUTABLE` | the command exists but cannot be executed |
/// | 127 | `NOT_FOUND` | the command was not found |
/// | 128+n | | the command was killed by signal n |
pub mod sysexits {
    /// A flag, name or argument is wrong.
    pub const USAGE: u8 = 64;
    /// `putex id check` found an inconsistency.
    pub const DATAERR: u8 = 65;
    /// The store cannot be reached or opened.
    pub const UNAVAILABLE: u8 = 69;
    /// Internal failure: the keeper or a lock machine failed.
    pub const SOFTWARE: u8 = 70;
    /// Not acquired (held by another, or the pool is exhausted).
    pub const TEMPFAIL: u8 = 75;
    /// The lock was lost while the command ran.
    pub const LOST: u8 = 76;
    /// `--max-duration` passed.
    pub const TIMEOUT: u8 = 124;
    /// The command cannot be executed.
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

impl CliError {
    /// The same error with `putex lock`/`putex id` codes: usage errors
    /// become 64, an unreachable store 69, other failures 70.
    pub fn into_sysexits(self) -> CliError {
        match self {
            CliError::Usage(m) => CliError::Exit(sysexits::USAGE, m),
            CliError::Store(m) => CliError::Exit(sysexits::UNAVAILABLE, m),
            CliError::Duplicate(m) | CliError::Other(m) => CliError::Exit(sysexits::SOFTWARE, m),
            e @ CliError::Exit(..) => e,
        }
    }
}

impl CliError {
    /// The process exit code for this error.
    pub fn code(&self) -> u8 {
        match self {
            CliError::Other(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Store(_) => 3,
            CliError::Duplicate(_) => 4,
            CliError::Exit(code, _) => *code,
        }
    }

    /// Prints the error and returns its exit code.
    pub fn report(&self) -> ExitCode {
        // An exit code passed on from a command carries no message.
        if !self.to_string().is_empty() {
            eprintln!("putex: {self}");
        }
        ExitCode::from(self.code())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m)
            | CliError::Store(m)
            | CliError::Duplicate(m)
            | CliError::Other(m)
            | CliError::Exit(_, m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CliError {}

impl From<crate::report::status::StatusError> for CliError {
    fn from(e: crate::report::status::StatusError) -> CliError {
        CliError::Store(e.to_string())
    }
}

impl From<crate::store::measure::MeasureError> for CliError {
    fn from(e: crate::store::measure::MeasureError) -> CliError {
        CliError::Store(e.to_string())
    }
}

/// The log format on stderr (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Lines for people (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line (for journald and log shippers), with the
    /// span fields (lock, node) and the event's fields (role, revision, …).
    Json,
}

/// Installs the tracing subscriber: `RUST_LOG` if set, else `info`
/// (`debug` with `-v`, `trace` with `-vv`), to stderr.
pub fn init_logging(verbose: u8, format: LogFormat) {
    init_logging_at(
        match verbose {
            0 => "info",
            1 => "debug",
            _ => "trace",
        },
        format,
    )
}

/// [`init_logging`] for commands whose stderr belongs to a script
/// (`putex lock`): `warn` by default, `info` with `-v`, `debug` with `-vv`.
pub fn init_quiet_logging(verbose: u8, format: LogFormat) {
    init_logging_at(
        match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        },
        format,
    )
}

fn init_logging_at(default: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}
