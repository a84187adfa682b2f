//! `putex completions` and `putex man`: shell completions and man pages,
//! generated from the command line's own clap definition, so they never
//! disagree with `--help`.
//!
//! The binary hands its [`clap::Command`] in (`Cli::command()`); nothing
//! here knows the commands by name.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::CliError;

/// `putex completions` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `putex man` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ManArgs {
    /// Write one page per command (putex.1, putex-run.1, putex-id-claim.1,
    /// …) into this directory instead of printing putex(1).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Writes `shell`'s completion script for `cmd` to `out`.
pub fn completions(
    mut cmd: clap::Command,
    args: &CompletionsArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(args.shell, &mut cmd, name, out);
    out.flush()
        .map_err(|e| CliError::Other(format!("cannot write the completions: {e}")))
}

/// `putex man`: the roff page of `cmd` to `out`, or with `--dir` one page
/// per visible command and subcommand into that directory (their paths
/// are listed on `out`).
pub fn man(cmd: clap::Command, args: &ManArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let io = |what: &str, e: std::io::Error| CliError::Other(format!("{what}: {e}"));
    let Some(dir) = &args.dir else {
        clap_mangen::Man::new(cmd)
            .render(out)
            .and_then(|()| out.flush())
            .map_err(|e| io("cannot write the man page", e))?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|e| io(&format!("--dir {}", dir.display()), e))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    pages(&cmd, dir, &mut written).map_err(|e| io(&format!("--dir {}", dir.display()), e))?;
    for p in written {
        writeln!(out, "{}", p.display()).map_err(|e| io("stdout", e))?;
    }
    Ok(())
}

/// One page for `cmd` and each visible subcommand, recursively (as
/// `clap_mangen::generate_to`, but telling what it wrote).
fn pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    written.push(clap_mangen::Man::new(cmd.clone()).generate_to(dir)?);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> clap::Command {
        clap::Command::new("putex")
            .about("about putex")
            .subcommand(clap::Command::new("run").about("the agent"))
            .subcommand(
                clap::Command::new("id")
                    .subcommand(clap::Command::new("claim").about("claims an id")),
            )
            .subcommand(clap::Command::new("keeper").hide(true))
    }

    #[test]
    fn completions_and_pages() {
        let mut out = Vec::new();
        let args = CompletionsArgs {
            shell: clap_complete::Shell::Bash,
        };
        completions(app(), &args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("putex") && text.contains("run"), "{text}");

        let mut out = Vec::new();
        man(app(), &ManArgs { dir: None }, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{text}");
        assert!(text.contains("run"), "{text}");

        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        let args = ManArgs {
            dir: Some(dir.path().join("man1")),
        };
        man(app(), &args, &mut out).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("man1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["putex-id-claim.1", "putex-id.1", "putex-run.1", "putex.1"]
        );
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 4);
    }
}
