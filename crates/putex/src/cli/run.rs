//! `putex run`: flags → settings → [`agent::run`] → exit code.
//!
//! The agent itself (start-up, host, local files, member records) lives in
//! [`crate::agent`]; this command resolves the settings, binds `--http`
//! first (a bad address fails before anything runs), connects SIGTERM and
//! SIGINT to a [`Shutdown`] and maps the outcome to the documented exit
//! codes ([`super::EXIT_CODES_HELP`]).

use putex_core::ExitReason;
use tracing::Instrument;

use super::config::{from_args, AgentArgs, Strictness};
use super::CliError;
use crate::agent::{self, AgentError, LocalFile};
use crate::shutdown::Shutdown;

/// `putex run`.
pub async fn run(args: &AgentArgs) -> Result<(), CliError> {
    let settings = from_args(args, Strictness::Run)?;
    let span = tracing::info_span!("agent", lock = %settings.lock_name(), node = %settings.node);
    let shutdown = Shutdown::new();
    shutdown
        .on_signals()
        .map_err(|e| CliError::Other(format!("cannot install signal handlers: {e}")))?;
    let http = match settings.http {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| CliError::Usage(format!("--http {addr}: cannot listen: {e}")))?,
        ),
        None => None,
    };
    let (lock, node) = (settings.lock_name().to_owned(), settings.node.clone());
    let exit = agent::run(settings, http, shutdown)
        .instrument(span)
        .await
        .map_err(agent_error)?;
    match exit {
        ExitReason::Shutdown { .. } => Ok(()),
        ExitReason::DuplicateNode { machine } => Err(CliError::Duplicate(format!(
            "another machine ({machine}) runs lock {lock:?} with node id {node:?}: give each host \
             its own --node"
        ))),
        ExitReason::StartupStopFailed => Err(CliError::Other(
            "the start-up stop (deactivate) failed: the service may be running; not starting"
                .into(),
        )),
    }
}

/// The exit code of each agent error: 2 for settings the store refuses or
/// names it cannot use, 3 for a store that does not answer, 4 for a second
/// agent on this host, 1 for the rest.
fn agent_error(e: AgentError) -> CliError {
    match e {
        AgentError::AlreadyRunning { .. } => CliError::Duplicate(e.to_string()),
        AgentError::StoreUnreachable { .. } => CliError::Store(e.to_string()),
        AgentError::Measure(m) => m.into(),
        AgentError::Timing(_) | AgentError::NoLock | AgentError::FailsafeKeyMismatch { .. } => {
            CliError::Usage(e.to_string())
        }
        AgentError::Local {
            what: LocalFile::KeeperDir,
            ..
        } => CliError::Other(format!("--keeper-dir: {e}")),
        AgentError::Local { .. }
        | AgentError::Keeper(_)
        | AgentError::NoKeeperExe(_)
        | AgentError::Aborted => CliError::Other(e.to_string()),
    }
}
