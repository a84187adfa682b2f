//! The `putex` command line as clap reads it: the commands and their
//! flags. The binary (`main.rs`) parses it and runs the command; it lives
//! in the library so that tests parse with the real parser (the README's
//! commands: `tests/cli_docs.rs`) and the manual is generated from it.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::cli::config::AgentArgs;
use crate::cli::demo::DemoArgs;
use crate::cli::lock::LockArgs;
use crate::cli::status::StatusArgs;
use crate::cli::LogFormat;

/// Run a piece of work in exactly one place at a time, and move it safely
/// when that place dies.
///
/// putex coordinates through NATS JetStream KV or etcd (across hosts) or an
/// embedded SQLite store (one machine, the default; per user unless
/// --store names a file every user can write). `putex run` is the failover
/// agent and `putex check` validates its settings; `putex lock` runs a
/// command under a lock, `putex kv` makes guarded writes from its command
/// or an agent's hook, `putex id` claims unique ids, `putex serve` is the
/// HTTP lock gateway; `putex status`, `history` and `watch` show who holds
/// what and why it moved, `putex switchover`, `pause` and `resume` steer a
/// lock; `putex demo` shows a failover; `putex completions` and `putex man`
/// print shell completions and the manual.
#[derive(Parser, Debug)]
#[command(name = "putex", version, about, long_about, after_help = crate::cli::EXIT_CODES_HELP)]
pub struct Cli {
    /// More logging (-v debug, -vv trace; for one-shot commands such as
    /// status, pause or lock, which log warnings only: -v info, -vv debug);
    /// RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Log format on stderr: `text`, or `json` (one object per line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "PUTEX_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// The command (none: a hint to read `putex --help`).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// The failover agent: runs the service (hooks or a child) on exactly
    /// one node of the lock, and takes over when that node dies.
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    Run(AgentArgs),
    /// Validates the settings of `putex run` (and, if the store answers,
    /// against the store) and prints the timeline; exits non-zero naming the
    /// bad option.
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    Check(AgentArgs),
    /// Runs a command while holding a lock: a critical section for scripts,
    /// cron and configuration runs. The command and everything it started
    /// are stopped before the lock can pass to anyone else.
    #[command(after_help = crate::cli::lock::LOCK_EXIT_CODES_HELP)]
    Lock(LockArgs),
    /// Identity pools: claims a unique id from a range for this machine
    /// (e.g. a snowflake worker id), releases, lists and checks them.
    #[command(after_help = crate::cli::id::ID_EXIT_CODES_HELP)]
    Id(crate::cli::id::IdArgs),
    /// Guarded writes for the command of `putex lock` and the hooks of
    /// `putex run`: `put` and `delete` land only while its lock is held (the
    /// store refuses them once the lock has moved on); `get` and `list`
    /// read keys.
    #[command(after_help = crate::cli::kv::KV_EXIT_CODES_HELP)]
    Kv(crate::cli::kv::KvArgs),
    /// Shows who holds a lock, since when, with which fencing token, and the
    /// members' roles and health.
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    Status(StatusArgs),
    /// Shows who held a lock when and why it moved: the transition records
    /// that agents and `putex lock` write, with each handover and how long
    /// the lock had no active holder.
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    History(crate::cli::history::HistoryArgs),
    /// Hands the lock over to another node on purpose (maintenance): the
    /// holder checks the target, stops gracefully and releases to it; waits
    /// until the target is active.
    #[command(after_help = crate::cli::control::CONTROL_EXIT_CODES_HELP)]
    Switchover(crate::cli::control::SwitchoverArgs),
    /// Pauses failover (maintenance mode): nobody takes over, the holder
    /// does not step down, putex starts and stops nothing (health and
    /// position checks still run and are reported; they change nothing),
    /// until `putex resume`.
    #[command(after_help = crate::cli::control::CONTROL_EXIT_CODES_HELP)]
    Pause(crate::cli::control::PauseArgs),
    /// Ends a pause: the holder arms its keeper again, then failover works
    /// as before.
    #[command(after_help = crate::cli::control::CONTROL_EXIT_CODES_HELP)]
    Resume(crate::cli::control::ResumeArgs),
    /// A live view of a lock: its status and last transitions, redrawn on
    /// every change until SIGINT or SIGTERM (then exit 0).
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    Watch(crate::cli::watch::WatchArgs),
    /// The HTTP lock gateway: an RDLM-compatible API and a versioned JSON
    /// API (/v1/, OpenAPI at /openapi.json) over the same store as `putex
    /// lock`, with optional bearer-token and admin auth and TLS.
    #[command(after_help = crate::cli::EXIT_CODES_HELP)]
    Serve(crate::cli::serve::ServeArgs),
    /// Starts three agents on a temporary SQLite store, crashes the active
    /// one, and reports the failover time against its bound.
    Demo(DemoArgs),
    /// Prints a shell completion script: bash, zsh, fish, elvish or
    /// powershell (e.g. `putex completions bash > /etc/bash_completion.d/putex`).
    Completions(crate::cli::manual::CompletionsArgs),
    /// Prints the putex(1) man page (roff); with --dir, writes one page per
    /// command into a directory.
    Man(crate::cli::manual::ManArgs),
    /// The keeper process that owns a service and its licence deadline.
    /// Started by the agent; not meant to be run by hand.
    #[command(hide = true)]
    Keeper(KeeperArgs),
}

/// `putex keeper`'s flags (the agent starts it; not for people).
#[derive(clap::Args, Debug)]
pub struct KeeperArgs {
    /// The lock this keeper keeps (first, so `ps` shows `putex keeper LOCK`).
    pub lock: crate::store::Name,
    /// The Unix socket to listen on.
    #[arg(long)]
    pub socket: PathBuf,
    /// The node id, for hooks.
    #[arg(long)]
    pub node: crate::store::NodeId,
    /// The deactivate hook (hook mode).
    #[arg(long)]
    pub deactivate: Option<String>,
    /// Where the agent answers the deactivate hook's `putex kv`.
    #[arg(long)]
    pub kv_socket: Option<PathBuf>,
    /// Graceful stop: how long to wait after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 30_000)]
    pub stop_timeout_ms: u64,
    /// Emergency stop: SIGTERM and SIGKILL within this.
    #[arg(long, default_value_t = 1_000)]
    pub emergency_timeout_ms: u64,
    /// Never use a cgroup scope; rely on the child subreaper.
    #[arg(long)]
    pub no_cgroup: bool,
    /// Print `ready PID` on stdout once listening.
    #[arg(long)]
    pub announce: bool,
    /// Routine messages to the log only (alarms still go to stderr).
    #[arg(long)]
    pub quiet: bool,
    /// The child's stdout is the keeper's stdout, not its stderr.
    #[arg(long)]
    pub child_stdout: bool,
}
