//! The `putex` command line.

use clap::Parser;

/// Run a piece of work in exactly one place at a time, and move it safely
/// when that place dies.
///
/// putex coordinates through NATS JetStream KV (production) or an embedded
/// SQLite store (one machine). The subcommands (run, lock, id, serve, check,
/// status) arrive with the store and agent layers; see the README.
#[derive(Parser, Debug)]
#[command(name = "putex", version, about, long_about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    eprintln!("putex: no subcommands are implemented yet; see `putex --help`");
    std::process::exit(2);
}
