//! `putex kv`: guarded writes for the command of `putex lock` and the hooks
//! of `putex run` (`docs/locks.md`, "Guarded writes"). Inside CMD (or a
//! hook), `put` and `delete` go to the `putex lock` (or the agent)
//! that runs it (`PUTEX_KV_SOCKET`), which makes them as guarded writes of
//! its tenure: the store refuses them once the lock has moved on. `get`
//! and `list` read the keys, inside CMD or anywhere with `--store`.

use std::io::Read;
use std::path::PathBuf;

use super::{sysexits, CliError};
use crate::locks::guard;
use crate::locks::section::kv::{ask, KvAnswer, KvOutcome, KvRequest, KV_SOCKET_VAR};

/// Exit codes of `putex kv`, for `--help`.
pub const KV_EXIT_CODES_HELP: &str = "\
Exit codes:
  0   done (get: the value is on stdout; list: the keys, one per line)
  1   get: no such key
  64  usage: a wrong flag, key or value, or put/delete outside a putex lock
      command or putex run hook
  69  the store did not answer in time: a write may or may not have landed
  76  the lock is no longer held: nothing was written";

/// `putex kv` flags.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = KV_EXIT_CODES_HELP)]
pub struct KvArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: KvCommand,
}

/// The `putex kv` subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum KvCommand {
    /// Sets KEY to VALUE (`-`: standard input) as a guarded write: the store
    /// makes it only while the `putex lock` running this command (or the
    /// agent running this hook) holds its lock.
    #[command(after_help = KV_EXIT_CODES_HELP)]
    Put {
        /// The key: dot-separated tokens of A-Z a-z 0-9 - _ / =, kept in the
        /// store as `kv.<KEY>`.
        key: String,
        /// The value, UTF-8 text; `-` reads it from standard input.
        value: String,
    },
    /// Deletes KEY as a guarded write (nothing if it is absent).
    #[command(after_help = KV_EXIT_CODES_HELP)]
    Delete {
        /// The key, as for `put`.
        key: String,
    },
    /// Prints KEY's value as the store has it now (exit 1 if absent).
    #[command(after_help = KV_EXIT_CODES_HELP)]
    Get {
        /// The key, as for `put`.
        key: String,
        /// Outside a `putex lock` command: the store to read (help:
        /// [`crate::cli::STORE_HELP`]).
        #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
        store: Option<String>,
    },
    /// Prints the keys that start with PREFIX (all without one), one per
    /// line, in order.
    #[command(after_help = KV_EXIT_CODES_HELP)]
    List {
        /// What the keys start with, e.g. `orders.`.
        #[arg(default_value = "")]
        prefix: String,
        /// Outside a `putex lock` command: the store to read (help:
        /// [`crate::cli::STORE_HELP`]).
        #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
        store: Option<String>,
    },
}

/// `putex kv`.
pub async fn run(args: &KvArgs) -> Result<(), CliError> {
    let socket = std::env::var_os(KV_SOCKET_VAR)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    let request = match &args.command {
        KvCommand::Put { key, value } => {
            let value = if value == "-" {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).map_err(|e| {
                    CliError::Exit(sysexits::USAGE, format!("kv put: standard input: {e}"))
                })?;
                text
            } else {
                value.clone()
            };
            KvRequest::Put {
                key: key.clone(),
                value,
            }
        }
        KvCommand::Delete { key } => KvRequest::Delete { key: key.clone() },
        KvCommand::Get { key, store } => {
            if socket.is_none() || store.is_some() {
                return get_direct(key, store.as_deref()).await;
            }
            KvRequest::Get { key: key.clone() }
        }
        KvCommand::List { prefix, store } => {
            if socket.is_none() || store.is_some() {
                return list_direct(prefix, store.as_deref()).await;
            }
            KvRequest::List {
                prefix: prefix.clone(),
            }
        }
    };
    let Some(socket) = socket else {
        return Err(CliError::Exit(
            sysexits::USAGE,
            format!(
                "kv: a guarded write is made by the `putex lock` that runs this command (or \
                 the `putex run` agent that runs this hook), and {KV_SOCKET_VAR} is not set: \
                 run it inside `putex lock NAME -- CMD` or a hook"
            ),
        ));
    };
    let answer = ask(&socket, &request).await.map_err(|e| {
        CliError::Exit(
            sysexits::UNAVAILABLE,
            format!(
                "kv: cannot reach the putex lock or agent at {} ({KV_SOCKET_VAR}): {e}",
                socket.display()
            ),
        )
    })?;
    finish(answer)
}

/// `get` outside a section: the store read directly.
async fn get_direct(key: &str, store: Option<&str>) -> Result<(), CliError> {
    let (store, _) = super::history::open_store(store)
        .await
        .map_err(CliError::into_sysexits)?;
    match guard::get(&store, key).await {
        Ok(Some(value)) => {
            let text = String::from_utf8(value).map_err(|_| {
                CliError::Exit(sysexits::USAGE, format!("kv get {key}: not UTF-8 text"))
            })?;
            println!("{text}");
            Ok(())
        }
        Ok(None) => Err(CliError::Exit(1, String::new())),
        Err(e) if e.is_unknown() => Err(CliError::Exit(sysexits::UNAVAILABLE, e.to_string())),
        Err(e) => Err(CliError::Exit(sysexits::USAGE, e.to_string())),
    }
}

/// `list` outside a section: the store read directly.
async fn list_direct(prefix: &str, store: Option<&str>) -> Result<(), CliError> {
    let (store, _) = super::history::open_store(store)
        .await
        .map_err(CliError::into_sysexits)?;
    match guard::list(&store, prefix).await {
        Ok(keys) => {
            for (key, _) in keys {
                println!("{key}");
            }
            Ok(())
        }
        Err(e) if e.is_unknown() => Err(CliError::Exit(sysexits::UNAVAILABLE, e.to_string())),
        Err(e) => Err(CliError::Exit(sysexits::USAGE, e.to_string())),
    }
}

fn finish(answer: KvAnswer) -> Result<(), CliError> {
    let message = || answer.message.clone().unwrap_or_default();
    match answer.outcome {
        KvOutcome::Ok => {
            if let Some(value) = &answer.value {
                println!("{value}");
            }
            for key in answer.keys.iter().flatten() {
                println!("{key}");
            }
            Ok(())
        }
        KvOutcome::Absent => Err(CliError::Exit(1, String::new())),
        KvOutcome::NotHeld => Err(CliError::Exit(sysexits::LOST, message())),
        KvOutcome::Invalid => Err(CliError::Exit(sysexits::USAGE, message())),
        KvOutcome::Unknown => Err(CliError::Exit(sysexits::UNAVAILABLE, message())),
    }
}
