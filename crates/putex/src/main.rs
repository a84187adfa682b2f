//! The `putex` command line.
//!
//! The user-facing subcommands (run, check, status, lock, id, serve) arrive
//! with the agent issue; for now the binary carries the keeper, which the
//! supervision layer starts as a separate process of the same binary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Run a piece of work in exactly one place at a time, and move it safely
/// when that place dies.
///
/// putex coordinates through NATS JetStream KV (production) or an embedded
/// SQLite store (one machine). The user-facing subcommands are on their way;
/// see the README.
#[derive(Parser, Debug)]
#[command(name = "putex", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The keeper process that owns a service and its licence deadline.
    /// Started by the agent; not meant to be run by hand.
    #[command(hide = true)]
    Keeper(KeeperArgs),
}

#[derive(clap::Args, Debug)]
struct KeeperArgs {
    /// The lock this keeper keeps (first, so `ps` shows `putex keeper LOCK`).
    lock: String,
    /// The Unix socket to listen on.
    #[arg(long)]
    socket: PathBuf,
    /// The node id, for hooks.
    #[arg(long, default_value = "")]
    node: String,
    /// The deactivate hook (hook mode).
    #[arg(long)]
    deactivate: Option<String>,
    /// Graceful stop: how long to wait after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 30_000)]
    stop_timeout_ms: u64,
    /// Emergency stop: SIGTERM and SIGKILL within this.
    #[arg(long, default_value_t = 1_000)]
    emergency_timeout_ms: u64,
    /// Never use a cgroup scope; rely on the child subreaper.
    #[arg(long)]
    no_cgroup: bool,
    /// Print `ready PID` on stdout once listening.
    #[arg(long)]
    announce: bool,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Some(Command::Keeper(a)) => {
            match putex::keeper::run_keeper(putex::keeper::KeeperOptions {
                lock: a.lock,
                node: a.node,
                socket: a.socket,
                deactivate: a.deactivate,
                stop_timeout: Duration::from_millis(a.stop_timeout_ms),
                emergency_timeout: Duration::from_millis(a.emergency_timeout_ms),
                cgroup: !a.no_cgroup,
                announce: a.announce,
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("putex keeper: {e}");
                    ExitCode::from(1)
                }
            }
        }
        None => {
            eprintln!("putex: no user-facing subcommands are implemented yet; see `putex --help`");
            ExitCode::from(2)
        }
    }
}
