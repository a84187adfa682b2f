//! The command line: flags → validated settings → commands.
//!
//! Two stages, as in ripgrep's `lowargs`/`hiargs`: [`config::AgentArgs`]
//! holds what clap parsed (flags, with `PUTEX_*` environment variables
//! filled in by clap), [`config::AgentSettings::resolve`] merges the TOML
//! file (`--config`) and the defaults below them and validates the result,
//! with errors that name the flag or key to change.
//!
//! | module | command |
//! |---|---|
//! | [`config`] | the agent's flags, environment, config file and defaults |
//! | [`check`] | `putex check`: validate and print the timeline |
//! | [`run`] | `putex run`: the failover agent ([`run::AgentHost`]) |
//! | [`status`] | `putex status`: the lock and member records |
//! | [`demo`] | `putex demo`: three agents on a temporary SQLite store |
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

use std::fmt;
use std::process::ExitCode;

pub mod check;
pub mod config;
pub mod demo;
pub mod run;
pub mod status;

/// Text for `putex --help` listing the exit codes.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success (run: shut down on request)
  1  other failure (e.g. a stop that could not be proven)
  2  usage or configuration error (the message names the flag or key)
  3  store unreachable
  4  another agent runs this lock on this host, or another machine uses this node id";

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
}

impl CliError {
    /// The process exit code for this error.
    pub fn code(&self) -> u8 {
        match self {
            CliError::Other(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Store(_) => 3,
            CliError::Duplicate(_) => 4,
        }
    }

    /// Prints the error and returns its exit code.
    pub fn report(&self) -> ExitCode {
        eprintln!("putex: {self}");
        ExitCode::from(self.code())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m)
            | CliError::Store(m)
            | CliError::Duplicate(m)
            | CliError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CliError {}

/// Installs the tracing subscriber: `RUST_LOG` if set, else `info`
/// (`debug` with `-v`, `trace` with `-vv`), to stderr.
pub fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
