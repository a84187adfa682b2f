//! The README's commands and the `--help` texts agree with the command line
//! as it is: every `putex …` line in README.md's shell blocks (and the
//! `cargo run -p putex -- …` ones) parses with the real clap definition,
//! and every `--store` help names every kind of store URL. A renamed
//! command or flag, or a store added without its help, fails here.

use clap::{CommandFactory, Parser};
use putex::cli::app::Cli;

const README: &str = include_str!("../../../README.md");

/// Each command line of the shell blocks (```sh, ```bash, ```console) of
/// `markdown` that runs putex, as putex's own arguments, with its line
/// number: continuation lines joined, comments dropped, words split as a
/// shell would (quotes, backslashes; no expansion).
fn putex_commands(markdown: &str) -> Vec<(usize, Vec<String>)> {
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut fenced = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let number = i + 1;
        if let Some(info) = line.trim_start().strip_prefix("```") {
            if fenced {
                fenced = false;
                in_shell = false;
            } else {
                fenced = true;
                let lang = info.trim().split([',', ' ']).next().unwrap_or("");
                in_shell = matches!(lang, "sh" | "bash" | "shell" | "console");
            }
            continue;
        }
        if !in_shell {
            continue;
        }
        let text = line.trim().strip_prefix("$ ").unwrap_or(line.trim());
        let (start, mut joined) = pending.take().unwrap_or((number, String::new()));
        match text.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
                continue;
            }
            None => joined.push_str(text),
        }
        let words = shell_words(&joined)
            .unwrap_or_else(|e| panic!("README.md:{start}: cannot split {joined:?}: {e}"));
        let args = match words.first().map(String::as_str) {
            Some("putex") => words[1..].to_vec(),
            Some("cargo") if words.get(1).is_some_and(|w| w == "run") => {
                let runs_putex = words.windows(2).any(|w| w[0] == "-p" && w[1] == "putex");
                match words.iter().position(|w| w == "--") {
                    Some(dash) if runs_putex => words[dash + 1..].to_vec(),
                    _ => continue,
                }
            }
            _ => continue,
        };
        commands.push((start, args));
    }
    commands
}

/// Splits a line into words as sh does, without expansions: quotes group,
/// a backslash escapes the next character (outside single quotes), and an
/// unquoted `#` at the start of a word begins a comment.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("an unclosed '".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("an unclosed \"".into()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("an unclosed \"".into()),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    word.get_or_insert_with(String::new).push(c);
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// The commands of `markdown` that the real parser refuses, with why.
fn refused(markdown: &str) -> Vec<String> {
    putex_commands(markdown)
        .into_iter()
        .filter_map(|(line, args)| {
            let argv = std::iter::once("putex".to_owned()).chain(args.iter().cloned());
            Cli::try_parse_from(argv)
                .err()
                .map(|e| format!("README.md:{line}: putex {}\n{}", args.join(" "), e.render()))
        })
        .collect()
}

#[test]
fn readme_commands_parse_with_the_real_command_line() {
    let commands = putex_commands(README);
    // The check finds the README's commands (a change of its fences must not
    // leave it checking nothing): the Quickstart's `demo`, the agent's, the
    // operator's, `lock` and `id`.
    for must in ["demo", "run", "check", "status", "switchover", "lock", "id"] {
        assert!(
            commands
                .iter()
                .any(|(_, a)| a.first().is_some_and(|w| w == must)),
            "no `putex {must}` found in README.md's shell blocks: {commands:?}"
        );
    }
    let refused = refused(README);
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

/// The check catches what it exists for: a renamed flag, a renamed
/// command, a flag of another command, a missing value; and it reads
/// continuation lines, comments and quotes as a shell does.
#[test]
fn the_readme_check_catches_a_renamed_flag_or_command() {
    let ok = "```sh\nputex lock nightly --store 'sqlite:///tmp/x y.db' \\\n  --wait 5s -- sh -c 'echo $X' # a comment\n```\n";
    assert_eq!(
        putex_commands(ok),
        [(
            2,
            [
                "lock",
                "nightly",
                "--store",
                "sqlite:///tmp/x y.db",
                "--wait",
                "5s",
                "--",
                "sh",
                "-c",
                "echo $X"
            ]
            .map(String::from)
            .to_vec()
        )]
    );
    assert_eq!(refused(ok), Vec::<String>::new());
    for bad in [
        "putex lock nightly --wiat 5s -- ./job.sh",
        "putex locks nightly -- ./job.sh",
        "putex status pg --healthcheck /bin/true",
        "putex switchover pg --to",
        "cargo run --release -p putex -- demoo",
    ] {
        let markdown = format!("text\n```sh\n{bad}\n```\n");
        assert_eq!(refused(&markdown).len(), 1, "{bad} was not refused");
    }
    // Not shell, or not putex: not checked.
    assert!(putex_commands("```rust\nputex --nope\n```\n```sh\nls --nope\n```\n").is_empty());
}

/// Every `--store` names every kind of store URL the parser takes, and the
/// top-level help names every store.
#[test]
fn every_store_help_names_nats_etcd_and_sqlite() {
    let mut missing = Vec::new();
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments().filter(|a| a.get_id() == "store") {
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            for scheme in ["nats://", "etcd://", "sqlite:"] {
                if !help.contains(scheme) {
                    missing.push(format!("{path} --store: no {scheme} in {help:?}"));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let cli = Cli::command();
    walk(&cli, "putex", &mut missing);
    assert!(missing.is_empty(), "{}", missing.join("\n"));

    let about = cli
        .get_long_about()
        .map(ToString::to_string)
        .unwrap_or_default();
    for store in ["NATS", "etcd", "SQLite"] {
        assert!(
            about.contains(store),
            "putex --help does not name {store}: {about}"
        );
    }
}

/// The exit codes `putex --help` lists are every code the commands it
/// covers return: 1–4 of every command, 5 of switchover, pause and resume.
#[test]
fn the_exit_code_table_lists_every_code() {
    let help = putex::cli::EXIT_CODES_HELP;
    let codes = [
        putex::cli::CliError::Other(String::new()).code(),
        putex::cli::CliError::Usage(String::new()).code(),
        putex::cli::CliError::Store(String::new()).code(),
        putex::cli::CliError::Duplicate(String::new()).code(),
        putex::cli::control::TIMED_OUT,
    ];
    for code in codes {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{code} "))),
            "exit code {code} is not in putex --help:\n{help}"
        );
    }
}
