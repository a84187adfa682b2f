//! The `putex` command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use putex::cli::config::AgentArgs;
use putex::cli::demo::DemoArgs;
use putex::cli::lock::LockArgs;
use putex::cli::status::StatusArgs;
use putex::cli::{CliError, LogFormat};
use std::process::ExitCode;

/// Run a piece of work in exactly one place at a time, and move it safely
/// when that place dies.
///
/// putex coordinates through NATS JetStream KV (production) or an embedded
/// SQLite store (one machine, the default). `putex run` is the failover
/// agent; `putex check` validates its settings and prints the timeline;
/// `putex status` shows holders and members; `putex history` shows who held
/// a lock when and why it moved, and `putex watch` follows a lock live;
/// `putex demo` shows a failover; `putex completions` and `putex man` print
/// shell completions and the manual.
#[derive(Parser, Debug)]
#[command(name = "putex", version, about, long_about, after_help = putex::cli::EXIT_CODES_HELP)]
struct Cli {
    /// More logging (-v debug, -vv trace; for one-shot commands such as
    /// status, pause or lock, which log warnings only: -v info, -vv debug);
    /// RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Log format on stderr: `text`, or `json` (one object per line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "PUTEX_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The failover agent: runs the service (hooks or a child) on exactly
    /// one node of the lock, and takes over when that node dies.
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    Run(AgentArgs),
    /// Validates the settings of `putex run` (and, if the store answers,
    /// against the store) and prints the timeline; exits non-zero naming the
    /// bad option.
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    Check(AgentArgs),
    /// Runs a command while holding a lock: a critical section for scripts,
    /// cron and configuration runs. The command and everything it started
    /// are stopped before the lock can pass to anyone else.
    #[command(after_help = putex::cli::lock::LOCK_EXIT_CODES_HELP)]
    Lock(LockArgs),
    /// Identity pools: claims a unique id from a range for this machine
    /// (e.g. a snowflake worker id), releases, lists and checks them.
    #[command(after_help = putex::cli::id::ID_EXIT_CODES_HELP)]
    Id(putex::cli::id::IdArgs),
    /// Shows who holds a lock, since when, with which fencing token, and the
    /// members' roles and health.
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    Status(StatusArgs),
    /// Shows who held a lock when and why it moved: the transition records
    /// that agents and `putex lock` write, with each handover and how long
    /// the lock had no active holder.
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    History(putex::cli::history::HistoryArgs),
    /// Hands the lock over to another node on purpose (maintenance): the
    /// holder checks the target, stops gracefully and releases to it; waits
    /// until the target is active.
    #[command(after_help = putex::cli::control::CONTROL_EXIT_CODES_HELP)]
    Switchover(putex::cli::control::SwitchoverArgs),
    /// Pauses failover (maintenance mode): nobody takes over, the holder
    /// does not step down, putex runs no hooks and stops nothing, until
    /// `putex resume`.
    #[command(after_help = putex::cli::control::CONTROL_EXIT_CODES_HELP)]
    Pause(putex::cli::control::PauseArgs),
    /// Ends a pause: the holder arms its keeper again, then failover works
    /// as before.
    #[command(after_help = putex::cli::control::CONTROL_EXIT_CODES_HELP)]
    Resume(putex::cli::control::ResumeArgs),
    /// A live view of a lock: its status and last transitions, redrawn on
    /// every change until SIGINT or SIGTERM (then exit 0).
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    Watch(putex::cli::watch::WatchArgs),
    /// The HTTP lock gateway: an RDLM-compatible API and a versioned JSON
    /// API (/v1/, OpenAPI at /openapi.json) over the same store as `putex
    /// lock`, with optional bearer-token and admin auth and TLS.
    #[command(after_help = putex::cli::EXIT_CODES_HELP)]
    Serve(putex::cli::serve::ServeArgs),
    /// Starts three agents on a temporary SQLite store, crashes the active
    /// one, and reports the failover time against its bound.
    Demo(DemoArgs),
    /// Prints a shell completion script: bash, zsh, fish, elvish or
    /// powershell (e.g. `putex completions bash > /etc/bash_completion.d/putex`).
    Completions(putex::cli::manual::CompletionsArgs),
    /// Prints the putex(1) man page (roff); with --dir, writes one page per
    /// command into a directory.
    Man(putex::cli::manual::ManArgs),
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
    /// Routine messages to the log only (alarms still go to stderr).
    #[arg(long)]
    quiet: bool,
    /// The child's stdout is the keeper's stdout, not its stderr.
    #[arg(long)]
    child_stdout: bool,
}

/// The exit code for a command line that clap refused (or answered, as
/// `--help`): `putex lock` and `putex id` use sysexits codes, 64 for usage;
/// the other commands clap's own, 2.
fn refused(e: &clap::Error) -> ExitCode {
    if e.exit_code() == 0 {
        return ExitCode::SUCCESS;
    }
    // Which command was meant, as clap reads the line past its errors
    // (global options may come first: `putex -v lock …`).
    let meant = Cli::command()
        .ignore_errors(true)
        .try_get_matches()
        .ok()
        .and_then(|m| m.subcommand_name().map(str::to_owned));
    match meant.as_deref() {
        Some("lock" | "id") => ExitCode::from(putex::cli::sysexits::USAGE),
        _ => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)),
    }
}

fn main() -> ExitCode {
    // Before clap reads the environment, and before any thread starts.
    let ignored = putex::cli::unset_empty_vars();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return refused(&e);
        }
    };
    let command = match cli.command {
        Some(Command::Keeper(a)) => {
            return match putex::supervision::keeper::run_keeper(
                putex::supervision::keeper::KeeperOptions {
                    lock: a.lock,
                    node: a.node,
                    socket: a.socket,
                    deactivate: a.deactivate,
                    stop_timeout: Duration::from_millis(a.stop_timeout_ms),
                    emergency_timeout: Duration::from_millis(a.emergency_timeout_ms),
                    cgroup: !a.no_cgroup,
                    announce: a.announce,
                    quiet: a.quiet,
                    child_stdout: a.child_stdout,
                },
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => CliError::Other(format!("keeper: {e}")).report(),
            };
        }
        Some(Command::Completions(a)) => {
            let out = &mut std::io::stdout().lock();
            return match putex::cli::manual::completions(Cli::command(), &a, out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => e.report(),
            };
        }
        Some(Command::Man(a)) => {
            let out = &mut std::io::stdout().lock();
            return match putex::cli::manual::man(Cli::command(), &a, out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => e.report(),
            };
        }
        Some(c) => c,
        None => {
            eprintln!("putex: a command is needed; see `putex --help`");
            return ExitCode::from(2);
        }
    };
    let format = cli.log_format;
    if matches!(
        command,
        Command::Lock(_)
            | Command::Id(_)
            | Command::Status(_)
            | Command::History(_)
            | Command::Switchover(_)
            | Command::Pause(_)
            | Command::Resume(_)
    ) {
        // A critical section's stderr belongs to the script, and a one-shot
        // command's to the person who ran it: warnings only (the store
        // client's "connected" lines are noise there; -v brings them back).
        putex::cli::init_quiet_logging(cli.verbose, format);
    } else {
        putex::cli::init_logging(cli.verbose, format);
    }
    if !ignored.is_empty() {
        tracing::debug!(vars = ?ignored, "empty environment variables ignored (taken as unset)");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return CliError::Other(format!("cannot start the runtime: {e}")).report(),
    };
    // A critical section is over once its lock is given back: nothing left
    // in the runtime is worth a moment of the script's time.
    let one_shot = matches!(command, Command::Lock(_));
    let result = runtime.block_on(async {
        match command {
            Command::Run(a) => putex::cli::run::run(&a).await,
            // CMD's status (or putex's own code) without a message.
            Command::Lock(a) => match putex::cli::lock::run(&a).await {
                Ok(0) => Ok(()),
                Ok(code) => Err(CliError::Exit(code, String::new())),
                Err(e) => Err(e),
            },
            Command::Check(a) => putex::cli::check::run(&a).await,
            Command::Id(a) => putex::cli::id::run(&a).await,
            Command::Status(a) => putex::cli::status::run(&a).await,
            Command::History(a) => putex::cli::history::run(&a).await,
            Command::Switchover(a) => putex::cli::control::switchover(&a).await,
            Command::Pause(a) => putex::cli::control::pause(&a).await,
            Command::Resume(a) => putex::cli::control::resume(&a).await,
            Command::Watch(a) => putex::cli::watch::run(&a).await,
            Command::Demo(a) => putex::cli::demo::run(&a).await,
            Command::Serve(a) => putex::cli::serve::run(&a).await,
            Command::Keeper(_) | Command::Completions(_) | Command::Man(_) => {
                unreachable!("handled above")
            }
        }
    });
    // Hooks, watches and timers may still be pending; do not wait for them
    // (`putex lock` awaited all it needs: the release, the keeper's
    // shutdown, the ticket's removal, the history).
    if one_shot {
        runtime.shutdown_background();
    } else {
        runtime.shutdown_timeout(Duration::from_millis(100));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}
