//! `putex lock`: run a command while holding a lock (a critical section).
//!
//! Flags and environment → [`SectionOptions`] → [`section::run`] → an exit
//! code ([`super::sysexits`]): the command's own status, or one of putex's
//! documented codes when the command did not run to its end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use putex_core::{Drift, TimingConfig};

use super::config::{hostname, parse_duration, TimingArgs};
use super::{sysexits, CliError};
use crate::locks::section::{self, Once, OnceMode, Outcome, SectionError, SectionOptions, Wait};
use crate::store::{AnyStore, Name, NodeId, StoreUrl};

/// The default `--stop-timeout` of `putex lock`: how long what is left of
/// CMD's tree (or CMD itself, after `--max-duration`) gets between SIGTERM
/// and SIGKILL.
pub const DEFAULT_LOCK_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Exit codes of `putex lock`, for `--help`.
pub const LOCK_EXIT_CODES_HELP: &str = "\
Exit codes:
  CMD's own    CMD ran to its end (a signal n that ended it becomes 128+n)
  0            --once-per: CMD already ran in this period (on any host)
               (at-most: was started in it)
  64           usage error: a flag, name or argument is wrong, or --limit
               differs from the limit the name was first used with
  69           the store cannot be reached or opened
  70           internal failure: the keeper or a lock machine failed (the stop is
               then not proven: the lock is not released and goes stale); a
               stop not yet proven is retried while the lock is kept, never an exit;
               or another host uses this lock with the same --node
  75           not acquired: the lock is held (--no-wait, or --wait ran out);
               --conflict-exit-code changes it
  76           the lock was lost while CMD ran; CMD and its whole tree were stopped
  124          --max-duration passed; CMD and its whole tree were stopped
  126, 127     CMD cannot be executed, or was not found
  128+n        putex was stopped by signal n while waiting

Once per period (--once-per, --once-key), by --once-mode:
  at-least     (default) the period is recorded after CMD exits 0, while the
               lock is still held. A failed or interrupted run is retried by
               the next host; if the lock is lost after CMD ran but before
               the record landed (or while CMD ran), CMD runs again.
  at-most      the period is claimed (compare-and-swap) before CMD starts, and
               CMD starts only once the claim landed: it never starts twice
               in a period, even if the lock is lost; a run that fails, is
               killed or loses the lock is not retried until the next period.

Timing: R = --renew (1s), T = F·R = 10s (--failures 10, or --ttl), G = C·R = 2s
(--confirm 2). A holder killed or frozen loses CMD at most T after its last
renewal; a crashed holder's lock is taken over after about T + G; a released
lock passes on in milliseconds. The first use of a name waits W + G' once (S4) on
NATS, and on an embedded store or etcd prefix whose proof is younger than that; it
says so.";

/// `--once-mode`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnceModeArg {
    /// Record after a successful run (retried until one succeeds; may run twice).
    #[value(alias = "at-least-once")]
    AtLeast,
    /// Claim the period before the run (never started twice; not retried).
    #[value(alias = "at-most-once")]
    AtMost,
}

impl From<OnceModeArg> for OnceMode {
    fn from(m: OnceModeArg) -> OnceMode {
        match m {
            OnceModeArg::AtLeast => OnceMode::AtLeast,
            OnceModeArg::AtMost => OnceMode::AtMost,
        }
    }
}

/// The flags of `putex lock`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LockArgs {
    /// The lock name: [A-Za-z0-9_-]{1,64}.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
    /// This node's id [default: the hostname].
    #[arg(long, env = "PUTEX_NODE")]
    pub node: Option<String>,
    /// Wait at most this long for the lock, then exit 75 [default: forever].
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    pub no_wait: bool,
    /// A semaphore: at most N holders at once, each in its own slot
    /// (PUTEX_SLOT = 0..N-1). Every client of a name must use the same N:
    /// the first client's N is recorded (1 for a plain lock), and a client
    /// with another N is refused (exit 64).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub limit: u32,
    /// What the lock is held for: shown to operators, given to CMD as PUTEX_TITLE.
    #[arg(long)]
    pub title: Option<String>,
    /// Run once per period across all hosts, periods aligned to UTC on the
    /// store's clock (`24h` = once per UTC day). What "once" means is
    /// --once-mode's: by default (at-least) only a run that exits 0 counts,
    /// and CMD may run again in the same period if the lock is lost between
    /// its end and its record, or while it runs.
    #[arg(long, value_parser = parse_duration, value_name = "DUR", conflicts_with = "once_key")]
    pub once_per: Option<Duration>,
    /// Like --once-per, with an explicit period key (e.g. `$(date +%G-W%V)`).
    #[arg(long, value_name = "TEXT")]
    pub once_key: Option<String>,
    /// With --once-per/--once-key: `at-least` (the default) records the
    /// period after CMD exits 0, so a failed or interrupted run is retried
    /// by the next host, and CMD may run twice in a period if the lock is
    /// lost before the record is written. `at-most` claims the period
    /// (compare-and-swap) before CMD starts: CMD never starts twice in a
    /// period, and a run that fails, is killed or loses the lock is not
    /// retried until the next period.
    #[arg(long, value_enum, value_name = "MODE")]
    pub once_mode: Option<OnceModeArg>,
    /// Stop CMD (and its tree) when it runs longer than this; exit 124.
    #[arg(long, value_parser = parse_duration, value_name = "DUR")]
    pub max_duration: Option<Duration>,
    /// The exit code when the lock is not acquired.
    #[arg(long, value_name = "N", default_value_t = sysexits::TEMPFAIL)]
    pub conflict_exit_code: u8,
    /// T, the lease: how long one renewal keeps the lock; R = T / F.
    #[arg(long, value_parser = parse_duration, value_name = "DUR", conflicts_with = "renew")]
    pub ttl: Option<Duration>,
    /// R, F, C, ε and the other timing flags `putex run` shares.
    #[command(flatten)]
    pub timing: TimingArgs,
    /// SIGTERM to SIGKILL when CMD's leftovers (or a CMD past
    /// --max-duration) are stopped.
    #[arg(long, value_parser = parse_duration,
          help = super::config::help_with_default(
              "SIGTERM to SIGKILL when CMD's leftovers (or a CMD past --max-duration) are stopped.",
              super::config::flag_duration(DEFAULT_LOCK_STOP_TIMEOUT)))]
    pub stop_timeout: Option<Duration>,
    /// Directory of the keeper sockets and host state files
    /// [default: /run/putex for root, else $XDG_RUNTIME_DIR/putex, else /tmp/putex-UID].
    #[arg(long, env = "PUTEX_KEEPER_DIR")]
    pub keeper_dir: Option<PathBuf>,
    /// Never use a cgroup scope for CMD: the keeper owns its tree as
    /// subreaper (should the keeper die, putex finds the tree from the
    /// keeper's last snapshot: members, process groups, sessions).
    #[arg(long, env = "PUTEX_NO_CGROUP")]
    pub no_cgroup: bool,
    /// CMD and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD", required = true)]
    pub command: Vec<String>,
}

/// A refused section in the words of `putex lock`: its flags.
fn refusal(e: &SectionError) -> String {
    match e {
        SectionError::LimitOutOfRange(limit) => {
            format!(
                "--limit must be between 1 and {} (got {limit})",
                section::MAX_LIMIT
            )
        }
        SectionError::LimitMismatch(m) => m.describe("--limit"),
        SectionError::KeeperDir { dir, source } => {
            format!("--keeper-dir {}: {source}", dir.display())
        }
        other => other.to_string(),
    }
}

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Exit(sysexits::USAGE, msg.into())
}

impl LockArgs {
    /// The validated options (everything but the store).
    pub fn options(&self) -> Result<(StoreUrl, SectionOptions), CliError> {
        let name = Name::new(&*self.name).map_err(|e| usage(format!("NAME: {e}")))?;
        let node = NodeId::new(self.node.clone().unwrap_or_else(hostname))
            .map_err(|e| usage(format!("--node: {e}")))?;
        let store = match &self.store {
            Some(u) => StoreUrl::parse(u),
            None => StoreUrl::from_env(),
        }
        .map_err(|e| usage(format!("--store: {e}")))?;
        if self.limit == 0 || self.limit > section::MAX_LIMIT {
            return Err(usage(format!(
                "--limit must be between 1 and {} (got {})",
                section::MAX_LIMIT,
                self.limit
            )));
        }
        let failures = self
            .timing
            .failures
            .unwrap_or(putex_core::timing::DEFAULT_FAILURES);
        let renew = match self.ttl {
            Some(ttl) => {
                if failures == 0 {
                    return Err(usage("--failures must be at least 2 (got 0)"));
                }
                ttl / failures
            }
            None => self
                .timing
                .renew
                .unwrap_or(putex_core::timing::DEFAULT_RENEW),
        };
        let timing = TimingConfig {
            renew,
            failures,
            confirm: self
                .timing
                .confirm
                .unwrap_or(putex_core::timing::DEFAULT_CONFIRM),
            max_drift: match self.timing.max_drift {
                Some(p) => Drift::from_percent(p),
                None => Drift::from_ppm(putex_core::timing::DEFAULT_MAX_DRIFT_PPM),
            },
            max_lease: self.timing.max_lease,
            max_gap: self.timing.max_gap,
            allow_short_lease: self.timing.allow_short_lease,
            store_timeout: self.timing.store_timeout,
            stop_timeout: self.stop_timeout.unwrap_or(DEFAULT_LOCK_STOP_TIMEOUT),
            emergency_timeout: self.timing.emergency_timeout,
            ..TimingConfig::default()
        }
        .validate()
        .map_err(|e| usage(e.to_string()))?;
        let once = match (&self.once_per, &self.once_key) {
            (Some(d), _) if d.is_zero() => return Err(usage("--once-per must be longer than 0")),
            (Some(d), _) if d.subsec_nanos() != 0 => {
                return Err(usage("--once-per must be a whole number of seconds"))
            }
            (Some(d), _) => Some(Once::Every(*d)),
            (None, Some(k)) if k.trim().is_empty() => {
                return Err(usage("--once-key must not be empty"))
            }
            (None, Some(k)) => Some(Once::Key(k.clone())),
            (None, None) => None,
        };
        if once.is_none() && self.once_mode.is_some() {
            return Err(usage("--once-mode needs --once-per or --once-key"));
        }
        if self.max_duration.is_some_and(|d| d.is_zero()) {
            return Err(usage("--max-duration must be longer than 0"));
        }
        let wait = match (self.no_wait, self.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        Ok((
            store.clone(),
            SectionOptions {
                name,
                node,
                store_id: store.to_string(),
                timing,
                limit: self.limit,
                wait,
                once,
                once_mode: self.once_mode.map(OnceMode::from).unwrap_or_default(),
                max_duration: self.max_duration,
                title: self.title.clone(),
                argv: self.command.clone(),
                env: Vec::new(),
                keeper_dir: self
                    .keeper_dir
                    .clone()
                    .unwrap_or_else(crate::supervision::keeper::default_keeper_dir),
                cgroup: !self.no_cgroup,
                queue: true,
                slots: None,
                // `putex lock` serves no `/metrics`.
                metrics: None,
                // `putex lock` is the putex binary.
                keeper_exe: None,
                exits_after: true,
            },
        ))
    }
}

/// Checks that CMD can be executed before waiting for the lock: 127 when it
/// is not found, 126 when it is not executable (as a shell would).
pub fn check_command(argv: &[String]) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(cmd) = argv.first().filter(|c| !c.is_empty()) else {
        return Err(usage("nothing to run: give the command after `--`"));
    };
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if cmd.contains('/') {
        let p = Path::new(cmd);
        if !p.exists() {
            return Err(CliError::Exit(
                sysexits::NOT_FOUND,
                format!("{cmd}: not found"),
            ));
        }
        if !executable(p) {
            return Err(CliError::Exit(
                sysexits::NOT_EXECUTABLE,
                format!("{cmd}: not an executable file"),
            ));
        }
        return Ok(());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut found_not_executable = false;
    for dir in std::env::split_paths(&path) {
        let p = dir.join(cmd);
        if executable(&p) {
            return Ok(());
        }
        found_not_executable |= p.is_file();
    }
    if found_not_executable {
        Err(CliError::Exit(
            sysexits::NOT_EXECUTABLE,
            format!("{cmd}: found in PATH but not executable"),
        ))
    } else {
        Err(CliError::Exit(
            sysexits::NOT_FOUND,
            format!("{cmd}: command not found in PATH"),
        ))
    }
}

/// `putex lock`: returns the process exit code.
pub async fn run(args: &LockArgs) -> Result<u8, CliError> {
    let (url, opts) = args.options()?;
    check_command(&opts.argv)?;
    // A section that will wait and run CMD needs its keeper: start it
    // while the store opens (a few milliseconds each). `--no-wait` and
    // `--once` may end before anything runs, and start it only then.
    let keeper = if opts.wait != Wait::No && opts.once.is_none() {
        Some(section::KeeperStart::begin(&opts).map_err(section_error)?)
    } else {
        None
    };
    let store = match AnyStore::open(&url).await {
        Ok(store) => store,
        Err(e) => {
            if let Some(k) = keeper {
                k.cancel().await;
            }
            return Err(CliError::Exit(
                sysexits::UNAVAILABLE,
                format!("store {url}: {e}"),
            ));
        }
    };
    let what = format!("lock {:?}", opts.name);
    run_section(store, opts, &what, args.conflict_exit_code, keeper).await
}

/// A section's error as the CLI reports it.
fn section_error(e: SectionError) -> CliError {
    match e {
        SectionError::Store(e) => CliError::Exit(sysexits::UNAVAILABLE, format!("store: {e}")),
        SectionError::Keeper(m) => CliError::Exit(sysexits::SOFTWARE, m),
        e @ SectionError::DuplicateNode { .. } => CliError::Exit(sysexits::SOFTWARE, e.to_string()),
        refused => usage(refusal(&refused)),
    }
}

/// Runs a section and turns its outcome into an exit code, telling the
/// user on stderr what happened when CMD did not run to its end. `what`
/// names the lock in messages (`lock "nightly"`).
pub async fn run_section(
    store: AnyStore,
    opts: SectionOptions,
    what: &str,
    conflict_exit_code: u8,
    keeper: Option<section::KeeperStart>,
) -> Result<u8, CliError> {
    let signals = match forward_signals() {
        Ok(signals) => signals,
        Err(e) => {
            if let Some(k) = keeper {
                k.cancel().await;
            }
            return Err(e);
        }
    };
    let name = opts.name.clone();
    let outcome = section::run_with_keeper(store, opts, signals, keeper)
        .await
        .map_err(section_error)?;
    Ok(match outcome {
        Outcome::Finished { exit, .. } => exit_code(exit),
        Outcome::NotAcquired { holder } => {
            let by = holder
                .map(|h| format!(" (held by {h})"))
                .unwrap_or_default();
            eprintln!("putex: {what} not acquired{by}");
            conflict_exit_code
        }
        Outcome::AlreadyDone { period, by } => {
            eprintln!(
                "putex: {name:?} already ran in period {period}: by {by}; not running it again"
            );
            0
        }
        Outcome::Lost { reason } => {
            eprintln!("putex: {what} lost while the command ran ({reason}); the command and its tree were stopped");
            sysexits::LOST
        }
        Outcome::TimedOut { after, .. } => {
            eprintln!(
                "putex: the command ran longer than --max-duration {}; it and its tree were stopped",
                humantime::format_duration(after)
            );
            sysexits::TIMEOUT
        }
        Outcome::Interrupted { signal } => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
        Outcome::StopUnproven => {
            eprintln!(
                "putex: a lock machine failed, so the command's stop was not proven; the lock was \
                 not released and goes stale"
            );
            sysexits::SOFTWARE
        }
    })
}

/// CMD's status as an exit code: its code, or 128+n for signal n.
pub fn exit_code(exit: crate::supervision::process::Exit) -> u8 {
    match (exit.code, exit.signal) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(s)) => 128u8.saturating_add(u8::try_from(s).unwrap_or(0)),
        (None, None) => sysexits::SOFTWARE,
    }
}

/// SIGINT, SIGTERM and SIGHUP, as numbers, for the section to forward to
/// CMD (or to end the wait with).
fn forward_signals() -> Result<section::Signals, CliError> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        let mut s = signal(kind).map_err(|e| {
            CliError::Exit(
                sysexits::SOFTWARE,
                format!("cannot install signal handlers: {e}"),
            )
        })?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                if tx.send(kind.as_raw_value()).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lock: LockArgs,
    }

    fn parse(args: &[&str]) -> Result<LockArgs, String> {
        let mut argv = vec!["putex-lock"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map(|c| c.lock)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn ttl_sets_t_and_derives_r() {
        let a = parse(&["job", "--ttl", "3s", "--store", "memory:", "--", "true"]).unwrap();
        let (_, o) = a.options().unwrap();
        assert_eq!(o.timing.lease(), Duration::from_secs(3));
        assert_eq!(o.timing.renew(), Duration::from_millis(300));
        assert_eq!(o.wait, Wait::Forever);
    }

    #[test]
    fn bad_input_names_the_flag() {
        let e = parse(&["a.b", "--store", "memory:", "--", "true"])
            .unwrap()
            .options()
            .unwrap_err();
        assert_eq!(e.code(), sysexits::USAGE);
        assert!(e.to_string().starts_with("NAME: invalid name"), "{e}");
        let e = parse(&["job", "--limit", "0", "--store", "memory:", "--", "true"])
            .unwrap()
            .options()
            .unwrap_err();
        assert!(e.to_string().contains("--limit must be between 1"), "{e}");
        let e = parse(&["job", "--failures", "1", "--store", "memory:", "--", "true"])
            .unwrap()
            .options()
            .unwrap_err();
        assert!(e.to_string().contains("--failures"), "{e}");
        assert!(parse(&["job", "--wait", "1s", "--no-wait", "--", "true"]).is_err());
        assert!(parse(&["job"]).is_err(), "a command is required");
    }

    #[test]
    fn once_mode_defaults_to_at_least_and_needs_a_period() {
        let o = |args: &[&str]| parse(args).unwrap().options();
        let (_, opts) = o(&["job", "--once-per", "1h", "--", "true"]).unwrap();
        assert_eq!(opts.once_mode, OnceMode::AtLeast);
        for (flag, mode) in [
            ("at-most", OnceMode::AtMost),
            ("at-most-once", OnceMode::AtMost),
            ("at-least-once", OnceMode::AtLeast),
        ] {
            let (_, opts) =
                o(&["job", "--once-key", "k", "--once-mode", flag, "--", "true"]).unwrap();
            assert_eq!(opts.once_mode, mode, "{flag}");
        }
        let e = o(&["job", "--once-mode", "at-most", "--", "true"]).unwrap_err();
        assert_eq!(e.code(), sysexits::USAGE);
        assert!(e.to_string().contains("--once-per"), "{e}");
        assert!(parse(&[
            "job",
            "--once-per",
            "1h",
            "--once-mode",
            "never",
            "--",
            "true"
        ])
        .is_err());
    }

    #[test]
    fn commands_are_checked_before_waiting() {
        assert_eq!(
            check_command(&["no-such-command-putex".into()])
                .unwrap_err()
                .code(),
            sysexits::NOT_FOUND
        );
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "echo").unwrap();
        assert_eq!(
            check_command(&[plain.display().to_string()])
                .unwrap_err()
                .code(),
            sysexits::NOT_EXECUTABLE
        );
        check_command(&["true".into()]).unwrap();
        check_command(&["/bin/sh".into()]).unwrap();
    }

    #[test]
    fn exit_codes_pass_through() {
        use crate::supervision::process::Exit;
        assert_eq!(
            exit_code(Exit {
                code: Some(3),
                signal: None
            }),
            3
        );
        assert_eq!(
            exit_code(Exit {
                code: None,
                signal: Some(15)
            }),
            143
        );
    }
}
