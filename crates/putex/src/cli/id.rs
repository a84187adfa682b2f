//! `putex id`: identity pools — a unique small number per machine (a
//! snowflake worker id, a shard number), claimed atomically and never
//! duplicated. The logic is in [`crate::locks::idpool`]; this module parses the
//! flags, opens the store and maps errors onto the `sysexits` codes.

use std::time::Duration;

use super::sysexits;
use super::CliError;
use crate::locks::idpool::{self, Claimant, IdError, IdRange, Options, PoolProblem};
use crate::store::{AnyStore, Name, NodeId, StoreError, StoreUrl};

/// The exit codes of `putex id`, for `--help`.
pub const ID_EXIT_CODES_HELP: &str = "\
Exit codes:
  0   success (claim prints the id, and only the id, on stdout)
  64  usage: a bad pool name, --name, --range or --store; a --range other than
      the pool's; the name is held from another machine (a cloned machine?);
      release of another machine's claim without --force
  65  check found inconsistencies (each is printed), or a record in the way
      cannot be read
  69  the store cannot be reached or opened
  75  the pool is exhausted (every id is claimed), or a concurrent claim of the
      same name did not finish in time
claim --lease -- CMD also exits as putex lock does: CMD's own status (128+N
for a signal), 76 the id was lost while CMD ran, 126/127 CMD cannot be run
or was not found, 70 internal failure";

/// `putex id` flags.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = ID_EXIT_CODES_HELP)]
pub struct IdArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: IdCommand,
}

/// The `putex id` subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum IdCommand {
    /// Claims an id of POOL for this machine and prints it.
    ///
    /// The claim is made for a name (the hostname, or --name) and the
    /// machine id, and persists until released. Claiming again with the same
    /// name prints the same id; the same name from another machine (a cloned
    /// VM) is refused. Only the id is printed on stdout:
    /// `WORKER_ID=$(putex id claim snowflake --range 1-254)`.
    #[command(after_help = ID_EXIT_CODES_HELP)]
    Claim(ClaimArgs),
    /// Releases the id that this machine's name holds in POOL.
    ///
    /// The id record is marked `released` (never deleted) and can be claimed
    /// again. Another machine's claim needs --force and is marked `revoked`.
    /// Releasing nothing is no error.
    #[command(after_help = ID_EXIT_CODES_HELP)]
    Release(ReleaseArgs),
    /// Lists the ids of POOL: id, name, state, kind (claim or lease),
    /// machine, age.
    ///
    /// States: active (held by a claim or a lease), confirming (a lease
    /// being acquired), released (free again), revoked (released with
    /// --force; not handed out again), garbage (unreadable; taken), pending
    /// (a name whose claim is under way or was interrupted).
    #[command(after_help = ID_EXIT_CODES_HELP)]
    List(ListArgs),
    /// Checks POOL for inconsistencies; exits 65 if it finds any.
    ///
    /// Every name must point at an id record that names it back, every
    /// claimed id must have a name pointing at it, no two names may share an
    /// id, no record may be unreadable, every id must be in the pool's range.
    /// Each problem is printed with how to repair it.
    #[command(after_help = ID_EXIT_CODES_HELP)]
    Check(CheckArgs),
}

/// Flags every `putex id` command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// The pool: 1 to 64 characters from A-Z a-z 0-9 _ -.
    #[arg(value_name = "POOL")]
    pub pool: String,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
    /// Deadline of each store call.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `putex id claim` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ClaimArgs {
    /// Pool, store, timeout.
    #[command(flatten)]
    pub common: Common,
    /// The ids of the pool, FIRST-LAST (at most 65536), e.g. 1-254. Fixed by
    /// the pool's first claim; may be left out afterwards.
    #[arg(long, value_name = "FIRST-LAST")]
    pub range: Option<String>,
    /// The claim's name (default: the hostname). One name holds one id.
    #[arg(long)]
    pub name: Option<String>,
    /// Hold the id only while CMD runs (given to it as PUTEX_ID): a lease
    /// renewed like a lock, lost — with CMD and its tree — like a lock.
    #[arg(long, requires = "command")]
    pub lease: bool,
    /// With --lease: T, the lease; R = T / 10 (F = 10).
    #[arg(long, value_parser = super::config::parse_duration, requires = "lease",
          help = super::config::help_with_default(
              "With --lease: T, the lease; R = T / 10.",
              super::config::flag_duration(
                  putex_core::timing::DEFAULT_RENEW * putex_core::timing::DEFAULT_FAILURES)))]
    pub ttl: Option<std::time::Duration>,
    /// With --lease: wait at most this long for a free id, then exit 75
    /// [default: forever].
    #[arg(long, value_parser = super::config::parse_duration, requires = "lease")]
    pub wait: Option<std::time::Duration>,
    /// With --lease: the keeper directory (see `putex lock --help`).
    #[arg(long, env = "PUTEX_KEEPER_DIR")]
    pub keeper_dir: Option<std::path::PathBuf>,
    /// With --lease: the command to run while holding the id, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `putex id release` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ReleaseArgs {
    /// Pool, store, timeout.
    #[command(flatten)]
    pub common: Common,
    /// The claim's name (default: the hostname).
    #[arg(long)]
    pub name: Option<String>,
    /// Release a claim made from another machine: its id record is marked
    /// `revoked` (not reused by claims; its holder is not told), and the
    /// name is free again. Also removes an unreadable name record.
    #[arg(long)]
    pub force: bool,
}

/// `putex id list` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// Pool, store, timeout.
    #[command(flatten)]
    pub common: Common,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = super::status::Format::Table)]
    pub output: super::status::Format,
}

/// `putex id check` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CheckArgs {
    /// Pool, store, timeout.
    #[command(flatten)]
    pub common: Common,
}

/// The CLI error for a pool error: usage 64, inconsistent data 65, store
/// unreachable 69, exhausted or busy 75.
pub fn exit_error(e: IdError) -> CliError {
    let code = match &e {
        IdError::Range(_)
        | IdError::RangeMismatch { .. }
        | IdError::NoRange { .. }
        | IdError::OtherMachine { .. }
        | IdError::NotOwner { .. } => sysexits::USAGE,
        IdError::Unreadable { .. } => sysexits::DATAERR,
        IdError::Exhausted { .. } | IdError::Busy { .. } => sysexits::TEMPFAIL,
        IdError::Store(StoreError::Config { .. } | StoreError::Unknown { .. }) => {
            sysexits::UNAVAILABLE
        }
        // A conflict never escapes the pool logic; should one, it is internal.
        IdError::Store(StoreError::Conflict { .. }) => sysexits::SOFTWARE,
    };
    CliError::Exit(code, message(&e))
}

/// The pool error in the words of `putex id`: the library describes what
/// is wrong, this adds the flags and commands that mend it.
fn message(e: &IdError) -> String {
    match e {
        IdError::Range(e) => format!("--range {e}"),
        IdError::RangeMismatch { stored, .. } => format!("{e}: use --range {stored}"),
        IdError::NoRange { .. } => format!("{e} (--range, for example --range 1-254)"),
        IdError::OtherMachine { pool, name, .. } => {
            format!("{e} (putex id release {pool} --name {name} --force)")
        }
        IdError::NotOwner { .. } => format!("{e}; --force revokes it"),
        IdError::Unreadable { pool, name, .. } => {
            let mut m = format!("{e}; see `putex id check {pool}`");
            if let Some(name) = name {
                m.push_str(&format!(
                    "; `putex id release {pool} --name {name} --force` removes it"
                ));
            }
            m
        }
        _ => e.to_string(),
    }
}

/// The pool name, checked: a bad one is a usage error.
fn pool_name(pool: &str) -> Result<Name, CliError> {
    Name::new(pool).map_err(|e| CliError::Exit(sysexits::USAGE, format!("pool name: {e}")))
}

/// The pool's name, checked, and its store.
async fn open(common: &Common) -> Result<(Name, AnyStore, Options), CliError> {
    let pool = pool_name(&common.pool)?;
    let url = match &common.store {
        Some(u) => StoreUrl::parse(u),
        None => StoreUrl::from_env(),
    }
    .map_err(|e| CliError::Usage(format!("--store: {e}")).into_sysexits())?;
    let store = AnyStore::open(&url)
        .await
        .map_err(|e| CliError::Store(format!("store {url}: {e}")).into_sysexits())?;
    let opts = Options {
        timeout: common.timeout,
        ..Options::default()
    };
    Ok((pool, store, opts))
}

fn claimant(name: &Option<String>) -> Result<Claimant, CliError> {
    let name = NodeId::new(name.clone().unwrap_or_else(super::config::hostname))
        .map_err(|e| CliError::Exit(sysexits::USAGE, format!("--name: {e}")))?;
    Ok(Claimant {
        name,
        machine: crate::identity::machine_id(),
    })
}

/// `putex id`.
pub async fn run(args: &IdArgs) -> Result<(), CliError> {
    match &args.command {
        IdCommand::Claim(a) => claim(a).await,
        IdCommand::Release(a) => release(a).await,
        IdCommand::List(a) => list(a).await,
        IdCommand::Check(a) => check(a).await,
    }
}

/// The most free ids a leased claim competes for at once (one agent each).
const LEASE_CANDIDATES: usize = 4;

/// `putex id claim --lease -- CMD`: CMD runs while one free id of the pool
/// is held as a lock (`id.<pool>.<n>`), by the rules of `putex lock`.
async fn leased_claim(a: &ClaimArgs) -> Result<u8, CliError> {
    let range = a
        .range
        .as_deref()
        .map(str::parse::<IdRange>)
        .transpose()
        .map_err(exit_error)?;
    let who = claimant(&a.name)?;
    super::lock::check_command(&a.command)?;
    let lock_args = super::lock::LockArgs {
        name: a.common.pool.clone(),
        store: a.common.store.clone(),
        node: Some(who.name.to_string()),
        ttl: a.ttl,
        wait: a.wait,
        keeper_dir: a.keeper_dir.clone(),
        command: a.command.clone(),
        limit: 1,
        conflict_exit_code: sysexits::TEMPFAIL,
        ..super::lock::LockArgs::default()
    };
    let (_, mut opts) = lock_args.options()?;
    let (pool, store, id_opts) = open(&a.common).await?;
    let pool = &pool;
    let range = idpool::pool_range(&store, pool, range, id_opts.timeout)
        .await
        .map_err(exit_error)?;
    let mut candidates = idpool::free_candidates(&store, pool, range)
        .await
        .map_err(exit_error)?;
    if candidates.is_empty() {
        // None free: wait for an id held by another lease (released, or
        // taken over once stale); persistent claims never go stale.
        let view = idpool::PoolView::read(&store, pool, id_opts.timeout)
            .await
            .map_err(exit_error)?;
        candidates = view
            .ids
            .iter()
            .filter(|(n, slot)| range.contains(**n) && !slot.claim && slot.is_held())
            .map(|(n, _)| *n)
            .collect();
    }
    if candidates.is_empty() {
        return Err(exit_error(IdError::Exhausted {
            pool: pool.to_string(),
            size: range.size(),
            detail: String::new(),
        }));
    }
    let chosen: Vec<u64> = candidates.into_iter().take(LEASE_CANDIDATES).collect();
    opts.queue = false;
    opts.slots = Some(crate::locks::section::Slots {
        keys: chosen
            .iter()
            .map(|n| crate::store::keys::id_record(pool, *n))
            .collect(),
        var: "PUTEX_ID".into(),
        values: chosen.iter().map(u64::to_string).collect(),
    });
    let what = format!("pool {pool:?}: a free id");
    super::lock::run_section(store, opts, &what, sysexits::TEMPFAIL, None).await
}

async fn claim(a: &ClaimArgs) -> Result<(), CliError> {
    if a.lease {
        return match leased_claim(a).await? {
            0 => Ok(()),
            code => Err(CliError::Exit(code, String::new())),
        };
    }
    if !a.command.is_empty() {
        return Err(CliError::Exit(
            sysexits::USAGE,
            "a command after `--` needs --lease (the id is then held while it runs)".into(),
        ));
    }
    // Validate everything before touching the store.
    let range = a
        .range
        .as_deref()
        .map(str::parse::<IdRange>)
        .transpose()
        .map_err(exit_error)?;
    let who = claimant(&a.name)?;
    let (pool, store, opts) = open(&a.common).await?;
    let claimed = idpool::claim(&store, &pool, range, &who, &opts)
        .await
        .map_err(exit_error)?;
    tracing::info!(
        pool = %a.common.pool,
        name = %who.name,
        id = claimed.id,
        existing = claimed.existing,
        "claimed"
    );
    println!("{}", claimed.id);
    Ok(())
}

async fn release(a: &ReleaseArgs) -> Result<(), CliError> {
    let who = claimant(&a.name)?;
    let (pool, store, opts) = open(&a.common).await?;
    let pool = &pool;
    let done = idpool::release(&store, pool, &who, a.force, &opts)
        .await
        .map_err(exit_error)?;
    if done.is_empty() {
        eprintln!(
            "pool {pool}: name {} holds no id; nothing to release",
            who.name
        );
    }
    for (n, state) in &done.ids {
        let what = match state {
            putex_core::LockState::Revoked => "revoked",
            _ => "released",
        };
        println!("pool {pool}: {what} id {n} (name {})", who.name);
    }
    Ok(())
}

async fn list(a: &ListArgs) -> Result<(), CliError> {
    let (pool, store, opts) = open(&a.common).await?;
    let listing = idpool::list(&store, &pool, &opts)
        .await
        .map_err(exit_error)?;
    match a.output {
        super::status::Format::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&listing).expect("a listing serialises")
            );
        }
        super::status::Format::Table => print!("{}", render(&listing)),
    }
    Ok(())
}

fn ids_claimed(n: usize) -> String {
    format!("{n} id{} claimed", if n == 1 { "" } else { "s" })
}

/// Renders a listing for people.
pub fn render(l: &idpool::Listing) -> String {
    let mut out = format!(
        "pool {}: range {}, {}\n",
        l.pool,
        l.range.as_deref().unwrap_or("unknown"),
        ids_claimed(l.claimed)
    );
    if l.ids.is_empty() {
        return out;
    }
    let mut rows = vec![vec![
        "ID".to_string(),
        "NAME".into(),
        "STATE".into(),
        "KIND".into(),
        "MACHINE".into(),
        "AGE".into(),
    ]];
    for e in &l.ids {
        rows.push(vec![
            e.id.map_or("-".into(), |n| n.to_string()),
            e.name.clone().unwrap_or_else(|| "-".into()),
            e.state.clone(),
            e.kind.clone(),
            e.machine.as_deref().map_or("-".into(), idpool::short),
            super::status::ago(e.age_ms),
        ]);
    }
    out.push('\n');
    out.push_str(&super::status::table(&rows));
    out
}

async fn check(a: &CheckArgs) -> Result<(), CliError> {
    let (pool, store, opts) = open(&a.common).await?;
    let pool = &pool;
    let report = idpool::check(&store, pool, &opts)
        .await
        .map_err(exit_error)?;
    if !report.exists {
        println!("pool {pool} has no records (never claimed from)");
        return Ok(());
    }
    if report.problems.is_empty() {
        println!("pool {pool}: {}, consistent", ids_claimed(report.claimed));
        return Ok(());
    }
    for p in &report.problems {
        match repair(pool, p) {
            Some(how) => println!("{p} ({how})"),
            None => println!("{p}"),
        }
    }
    Err(CliError::Exit(
        sysexits::DATAERR,
        format!(
            "pool {pool}: {} problem{} found ({})",
            report.problems.len(),
            if report.problems.len() == 1 { "" } else { "s" },
            ids_claimed(report.claimed)
        ),
    ))
}

/// How `putex id` mends `problem`, when a claim or a release does.
fn repair(pool: &str, problem: &PoolProblem) -> Option<String> {
    Some(match problem {
        PoolProblem::BrokenBinding { name, .. } => {
            format!("claiming again with --name {name} repairs it")
        }
        PoolProblem::PendingClaim { name, machine, .. } => format!(
            "claiming again with --name {name} on machine {} resumes it; releasing it clears it",
            idpool::short(machine)
        ),
        PoolProblem::Unnamed { name, .. } => format!(
            "`putex id claim {pool} --name {name}` on that machine completes it, \
             `putex id release {pool} --name {name}` frees it"
        ),
        PoolProblem::SeveralIds { name, .. } => {
            format!("`putex id release {pool} --name {name}` frees them all")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupted_claims_say_how_to_mend_them() {
        let unnamed = PoolProblem::Unnamed {
            id: 3,
            name: "web1".into(),
            machine: "m".into(),
        };
        assert_eq!(
            repair("web", &unnamed).unwrap(),
            "`putex id claim web --name web1` on that machine completes it, \
             `putex id release web --name web1` frees it"
        );
        let several = PoolProblem::SeveralIds {
            name: "a".into(),
            ids: vec![1, 2],
        };
        assert!(repair("web", &several).unwrap().contains("--name a"));
        let garbage = PoolProblem::IdUnreadable {
            pool: "web".into(),
            id: 2,
        };
        assert_eq!(
            repair("web", &garbage),
            None,
            "nothing of ours mends garbage"
        );
    }

    #[test]
    fn errors_map_to_sysexits() {
        let code = |e: IdError| exit_error(e).code();
        assert_eq!(code(IdError::Range("x".into())), 64);
        assert_eq!(
            code(IdError::Exhausted {
                pool: "p".into(),
                size: 3,
                detail: String::new()
            }),
            75
        );
        assert_eq!(
            code(IdError::Store(StoreError::unknown(
                crate::store::Op::Get,
                "k",
                "down"
            ))),
            69
        );
        let e = IdError::OtherMachine {
            pool: "web".into(),
            name: "web1".into(),
            id: Some(7),
            holder: "abcdef0123456789".into(),
            this: "def".into(),
        };
        // The library says what is wrong; the CLI adds the command that
        // mends it.
        assert_eq!(
            e.to_string(),
            "name web1 holds id 7 in pool web, claimed by machine abcdef012345…; this machine is def: \
             a cloned machine? give it a name of its own, or force the old claim's release"
        );
        assert_eq!(
            message(&e),
            format!("{e} (putex id release web --name web1 --force)")
        );
        assert_eq!(code(e), 64);
    }

    #[test]
    fn pool_errors_name_the_flags_only_in_the_cli() {
        let errors = [
            IdError::Range("\"5-1\": the first id is larger than the last".into()),
            IdError::RangeMismatch {
                pool: "web".into(),
                stored: IdRange::new(1, 3).unwrap(),
                asked: IdRange::new(1, 5).unwrap(),
            },
            IdError::NoRange { pool: "web".into() },
            IdError::NotOwner {
                pool: "web".into(),
                name: "web1".into(),
                id: None,
                holder: "m1".into(),
                this: "m2".into(),
            },
            IdError::Unreadable {
                pool: "web".into(),
                key: "id.web.name.web1".into(),
                name: Some("web1".into()),
            },
        ];
        for e in errors {
            let (library, cli) = (e.to_string(), message(&e));
            assert!(!library.contains("--"), "{library}");
            assert!(cli.starts_with(&library) || cli.contains(&library), "{cli}");
            assert!(cli.contains("--"), "{cli}");
        }
    }
}
