//! The `putex` command line: parses it ([`putex::cli::app`]), runs the
//! command, and turns its outcome into the exit code.

use std::time::Duration;

use clap::{CommandFactory, Parser};
use putex::cli::app::{Cli, Command};
use putex::cli::CliError;
use std::process::ExitCode;

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
        Some("lock" | "id" | "kv") => ExitCode::from(putex::cli::sysexits::USAGE),
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
                    kv_socket: a.kv_socket,
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
            | Command::Kv(_)
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
            Command::Kv(a) => putex::cli::kv::run(&a).await,
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
