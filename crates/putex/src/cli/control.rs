//! `putex switchover`, `putex pause` and `putex resume`: the operator's
//! requests to a lock's agents (O1, O2), through its control record
//! ([`crate::agent::control`]). Any host with store access can ask; the
//! holder carries the request out and the command waits to see it done.
//!
//! Exit codes: 0 done; 1 refused or not possible (the message says why:
//! no holder, lock paused, target unknown, not ready, ineligible, lagging);
//! 2 usage; 3 store unreachable; 5 `--wait` ran out (a switchover is then
//! withdrawn; a pause or resume stays asked for).

use std::time::{Duration, Instant, SystemTime};

use putex_core::{LockRecord, LockState, Observed};

use super::history::open_store;
use super::CliError;
use crate::agent::control::{self, ControlRecord, PauseRequest, SwitchoverRequest};
use crate::store::{keys, AnyStore, Entry, Name, ReadMode, Store};

/// Exit code: `--wait` ran out.
pub const TIMED_OUT: u8 = 5;

/// Text for `--help`: the exit codes of these commands.
pub const CONTROL_EXIT_CODES_HELP: &str = "\
Exit codes:
  0  done
  1  refused or not possible (the message says why)
  2  usage error
  3  store unreachable
  5  --wait ran out (a switchover is withdrawn; a pause or resume stays asked for)";

const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// `putex switchover` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SwitchoverArgs {
    /// The lock.
    #[arg(value_name = "LOCK")]
    pub lock: String,
    /// The node to hand over to (default: the best eligible candidate: most
    /// data, then highest priority).
    #[arg(long, value_name = "NODE")]
    pub to: Option<String>,
    /// Hand over to a target beyond its --max-lag at once (it may lack
    /// data). Without it such a target is still handed the lock, but takes
    /// it only once its position caught up with what the stopped holder
    /// wrote last, within 2 R; otherwise nobody waits for it and the
    /// usual election (often the old holder) follows.
    #[arg(long)]
    pub allow_lag: bool,
    /// When: a duration from now (`10m`) or a time (`2026-11-28T02:00:00Z`);
    /// the holder acts that long after it sees the request.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Withdraw a pending switchover.
    #[arg(long)]
    pub cancel: bool,
    /// How long to wait for the target to be active [default: 30s, or
    /// --at's delay plus 30s].
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
}

/// `putex pause` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct PauseArgs {
    /// The lock.
    #[arg(value_name = "LOCK")]
    pub lock: String,
    /// Why, for everyone who looks at `putex status` meanwhile.
    #[arg(long, default_value = "")]
    pub reason: String,
    /// How long to wait for the holder to apply it.
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration, default_value = "10s")]
    pub wait: Duration,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
}

/// `putex resume` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ResumeArgs {
    /// The lock.
    #[arg(value_name = "LOCK")]
    pub lock: String,
    /// If the paused holder does not answer within --wait, end the pause
    /// without it: its record is revoked and a standby takes over W + G'
    /// later. At once, without the wait, when the holder's agent has not
    /// written its member record for 3 T (it cannot see the resume). Only
    /// when its host is down or its service is stopped: a paused holder's
    /// service runs unguarded.
    #[arg(long)]
    pub force: bool,
    /// How long to wait for the holder to resume.
    #[arg(long, value_name = "DUR", value_parser = humantime::parse_duration, default_value = "10s")]
    pub wait: Duration,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
}

fn lock_name(s: &str) -> Result<Name, CliError> {
    Name::new(s).map_err(|e| CliError::Usage(format!("LOCK: {e}")))
}

fn store_error(e: impl std::fmt::Display) -> CliError {
    CliError::Store(format!("store: {e}"))
}

fn now_text() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// The lock record, if it is one.
async fn lock_record(
    store: &AnyStore,
    lock: &Name,
) -> Result<Option<(Entry, LockRecord)>, CliError> {
    let entry = store
        .get(&keys::lock(lock), ReadMode::Leader, STORE_TIMEOUT)
        .await
        .map_err(store_error)?;
    Ok(entry.and_then(|e| match Observed::decode(&e.value) {
        Observed::Record(r) => Some((e, r)),
        Observed::Garbage => None,
    }))
}

fn is_live(r: &LockRecord) -> bool {
    matches!(r.state, LockState::Active | LockState::Confirming)
}

/// `putex switchover`.
pub async fn switchover(args: &SwitchoverArgs) -> Result<(), CliError> {
    let lock = lock_name(&args.lock)?;
    let (store, _) = open_store(args.store.as_deref()).await?;
    if args.cancel {
        let mut had = None;
        control::modify(&store, &lock, STORE_TIMEOUT, |rec| {
            had = rec.switchover.take();
        })
        .await
        .map_err(store_error)?;
        match had {
            Some(r) => println!("switchover of {lock} to {} withdrawn", target_text(&r.to)),
            None => println!("no switchover of {lock} was pending"),
        }
        return Ok(());
    }
    let delay = match &args.at {
        None => Duration::ZERO,
        Some(at) => parse_at(at)?,
    };
    // Both at once: the command's round trips are on the switchover's path.
    let (record, control_read) = tokio::join!(
        lock_record(&store, &lock),
        control::read(&store, &lock, STORE_TIMEOUT)
    );
    let record = record?;
    let Some((_, holder)) = record.filter(|(_, r)| is_live(r)) else {
        return match (&args.to, args.allow_lag) {
            (Some(to), true) => waive_lag(&store, &lock, to, args.wait).await,
            _ => Err(CliError::Other(format!(
                "{lock} has no holder: nothing to switch over (to let a node beyond \
                 --max-lag take it over: --to NODE --allow-lag)"
            ))),
        };
    };
    if let Some(p) = &holder.paused {
        return Err(CliError::Other(format!(
            "{lock} is paused (by {}): resume it first (`putex resume {lock}`)",
            p.by
        )));
    }
    if args.to.as_deref() == Some(holder.node.as_str()) {
        return Err(CliError::Other(format!(
            "{} already holds {lock}",
            holder.node
        )));
    }
    let id = crate::identity::instance_id();
    let request = SwitchoverRequest {
        id: id.clone(),
        to: args.to.clone(),
        allow_lag: args.allow_lag,
        holder: holder.node.clone(),
        holder_instance: holder.instance.clone(),
        by: control::requester(),
        at: now_text(),
        delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        refused: None,
    };
    let started = Instant::now();
    let control_read = control_read.map_err(store_error)?;
    control::modify_from(&store, &lock, STORE_TIMEOUT, Some(control_read), |rec| {
        rec.switchover = Some(request.clone());
    })
    .await
    .map_err(store_error)?;
    if !delay.is_zero() {
        println!(
            "switchover of {lock} from {} to {} in {}",
            holder.node,
            target_text(&args.to),
            humantime::format_duration(delay)
        );
    }
    let wait = args.wait.unwrap_or(delay + Duration::from_secs(30));
    let outcome = wait_for_switchover(&store, &lock, &holder, args.to.as_deref(), &id, wait).await;
    // Done, refused or given up: the request is over.
    let _ = control::modify(&store, &lock, STORE_TIMEOUT, |rec| {
        if rec.switchover.as_ref().is_some_and(|r| r.id == id) {
            rec.switchover = None;
        }
    })
    .await;
    match outcome? {
        Switched::To(node, token) => {
            println!(
                "switched {lock} over from {} to {node} in {} ms (token {token})",
                holder.node,
                started.elapsed().as_millis()
            );
            Ok(())
        }
        Switched::Refused(why) => Err(CliError::Other(format!(
            "switchover of {lock} refused by {}: {why}",
            holder.node
        ))),
        Switched::NotTaken(target, by) => Err(CliError::Other(format!(
            "switchover of {lock}: {} handed it to {target}, which did not take it (a target \
             behind its --max-lag waits at most 2 R for its position to catch up; `putex \
             status {lock}` shows its lag); {by} took {lock} instead. --allow-lag hands over \
             regardless",
            holder.node
        ))),
        Switched::TimedOut(state) => Err(CliError::Exit(
            TIMED_OUT,
            format!(
                "switchover of {lock} not done within {} ({state}); the request is withdrawn",
                humantime::format_duration(wait)
            ),
        )),
    }
}

/// No holder: lets `to` take the lock over beyond its `--max-lag` (once
/// the record is stale by the usual rules) and waits for it to be active.
async fn waive_lag(
    store: &AnyStore,
    lock: &Name,
    to: &str,
    wait: Option<Duration>,
) -> Result<(), CliError> {
    let id = crate::identity::instance_id();
    let request = SwitchoverRequest {
        id: id.clone(),
        to: Some(to.to_owned()),
        allow_lag: true,
        holder: String::new(),
        holder_instance: String::new(),
        by: control::requester(),
        at: now_text(),
        delay_ms: 0,
        refused: None,
    };
    control::modify(store, lock, STORE_TIMEOUT, |rec| {
        rec.switchover = Some(request.clone());
    })
    .await
    .map_err(store_error)?;
    let started = Instant::now();
    let deadline = started + wait.unwrap_or(Duration::from_secs(30));
    let outcome = loop {
        if let Some((e, r)) = lock_record(store, lock).await? {
            if r.node == to && r.state == LockState::Active {
                break Ok(e.token);
            }
        }
        if Instant::now() >= deadline {
            break Err(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = control::modify(store, lock, STORE_TIMEOUT, |rec| {
        if rec.switchover.as_ref().is_some_and(|r| r.id == id) {
            rec.switchover = None;
        }
    })
    .await;
    match outcome {
        Ok(token) => {
            println!(
                "{to} took {lock} over beyond its --max-lag in {} ms (token {token})",
                started.elapsed().as_millis()
            );
            Ok(())
        }
        Err(()) => Err(CliError::Exit(
            TIMED_OUT,
            format!("{to} has not taken {lock} over; the override is withdrawn"),
        )),
    }
}

fn target_text(to: &Option<String>) -> String {
    to.clone().unwrap_or_else(|| "the best candidate".into())
}

/// `--at`: a duration from now or an RFC 3339 time.
fn parse_at(at: &str) -> Result<Duration, CliError> {
    if let Ok(d) = humantime::parse_duration(at) {
        return Ok(d);
    }
    let when = humantime::parse_rfc3339_weak(at).map_err(|_| {
        CliError::Usage(format!(
            "--at {at:?}: neither a duration (`10m`) nor a time (`2026-11-28T02:00:00Z`)"
        ))
    })?;
    when.duration_since(SystemTime::now())
        .map_err(|_| CliError::Usage(format!("--at {at:?} is in the past")))
}

enum Switched {
    To(String, putex_core::Token),
    Refused(String),
    TimedOut(String),
    /// The holder handed the lock to the first node, which did not take
    /// it; the second took it instead.
    NotTaken(String, String),
}

async fn wait_for_switchover(
    store: &AnyStore,
    lock: &Name,
    from: &LockRecord,
    to: Option<&str>,
    id: &str,
    wait: Duration,
) -> Result<Switched, CliError> {
    let deadline = Instant::now() + wait;
    let mut polls = 0u64;
    let mut last = String::from("the holder has not acted yet");
    // The node the holder's release named, once seen.
    let mut handed_to: Option<String> = None;
    loop {
        if let Some((e, r)) = lock_record(store, lock).await? {
            let moved = r.node != from.node && to.is_none_or(|t| r.node == t);
            if moved && r.state == LockState::Active {
                return Ok(Switched::To(r.node, e.token));
            }
            if r.state == LockState::Released && r.node == from.node {
                if let Some(t) = &r.to {
                    handed_to = Some(t.clone());
                }
            }
            if let Some(t) = handed_to.as_ref().filter(|t| **t != r.node) {
                if matches!(r.state, LockState::Confirming | LockState::Active) {
                    return Ok(Switched::NotTaken(t.clone(), r.node));
                }
            }
            last = format!("{} is {:?}", r.node, r.state).to_lowercase();
        }
        if polls.is_multiple_of(10) {
            let (_, rec) = control::read(store, lock, STORE_TIMEOUT)
                .await
                .map_err(store_error)?;
            if let Some(why) = rec
                .switchover
                .filter(|r| r.id == id)
                .and_then(|r| r.refused)
            {
                return Ok(Switched::Refused(why));
            }
        }
        polls += 1;
        if Instant::now() >= deadline {
            return Ok(Switched::TimedOut(last));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `putex pause`.
pub async fn pause(args: &PauseArgs) -> Result<(), CliError> {
    let lock = lock_name(&args.lock)?;
    let (store, _) = open_store(args.store.as_deref()).await?;
    let Some((_, holder)) = lock_record(&store, &lock)
        .await?
        .filter(|(_, r)| is_live(r))
    else {
        return Err(CliError::Other(format!(
            "{lock} has no holder: nothing to pause (a pause takes effect through the holder's record)"
        )));
    };
    let request = PauseRequest {
        by: control::requester(),
        reason: args.reason.clone(),
        at: now_text(),
    };
    control::modify(&store, &lock, STORE_TIMEOUT, |rec: &mut ControlRecord| {
        rec.pause = Some(request.clone());
    })
    .await
    .map_err(store_error)?;
    let deadline = Instant::now() + args.wait;
    loop {
        if let Some((_, r)) = lock_record(&store, &lock).await? {
            // The record says so, and the holder knows it landed (its
            // member record says paused once it disarmed its keeper).
            if r.paused.is_some() && is_live(&r) && holder_knows(&store, &lock, &r.node).await {
                println!(
                    "{lock} paused: {} holds it; nobody takes over and putex starts and stops \
                     nothing until `putex resume {lock}` (health and position checks still run \
                     and are reported; they change nothing)",
                    r.node
                );
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(CliError::Exit(
                TIMED_OUT,
                format!(
                    "{} has not paused {lock} within {} (the pause stays asked for; a holder \
                     still starting its service applies it once the service is up)",
                    holder.node,
                    humantime::format_duration(args.wait)
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `node`'s member record says failover is paused: it has seen its
/// paused record land and disarmed its keeper (O2).
async fn holder_knows(store: &AnyStore, lock: &Name, node: &str) -> bool {
    let Ok(node) = crate::store::NodeId::new(node.to_owned()) else {
        return true; // a record putex did not write: the record alone
    };
    let Ok(Some(e)) = store
        .get(&keys::member(lock, &node), ReadMode::Leader, STORE_TIMEOUT)
        .await
    else {
        return false;
    };
    serde_json::from_slice::<crate::report::members::MemberRecord>(&e.value)
        .is_ok_and(|m| m.paused.is_some())
}

/// How long `node`'s agent has not written its member record (every 3 R
/// while it reaches the store), on the store's clock as of `now`; `None`
/// when that cannot be told (no member record, a store whose times say when
/// this handle first saw a write: etcd).
async fn member_silent_for(
    store: &AnyStore,
    lock: &Name,
    node: &str,
    now: crate::store::StoreTime,
) -> Option<Duration> {
    if store.times_are_first_seen() {
        return None;
    }
    let node = crate::store::NodeId::new(node.to_owned()).ok()?;
    let member = store
        .get(&keys::member(lock, &node), ReadMode::Leader, STORE_TIMEOUT)
        .await
        .ok()??;
    match now.gap_since(member.time) {
        crate::store::StoreGap::Forward(d) => Some(d),
        crate::store::StoreGap::Unbounded => Some(Duration::MAX),
        crate::store::StoreGap::Backwards => None,
    }
}

/// For `putex resume --force`, right after the control record was
/// written: how long the paused holder's agent has not written its member
/// record, if that is more than 3 T of its record (on the store's clock:
/// the control record's time is "now").
async fn holder_silent(store: &AnyStore, lock: &Name) -> Result<Option<Duration>, CliError> {
    let now = store
        .get(&keys::control(lock), ReadMode::Leader, STORE_TIMEOUT)
        .await
        .map_err(store_error)?
        .map(|e| e.time);
    let paused = lock_record(store, lock)
        .await?
        .filter(|(_, r)| r.paused.is_some() && is_live(r));
    let (Some(now), Some((_, r))) = (now, paused) else {
        return Ok(None);
    };
    Ok(member_silent_for(store, lock, &r.node, now)
        .await
        .filter(|d| *d >= r.lease() * 3))
}

/// `putex resume`.
pub async fn resume(args: &ResumeArgs) -> Result<(), CliError> {
    let lock = lock_name(&args.lock)?;
    let (store, _) = open_store(args.store.as_deref()).await?;
    control::modify(&store, &lock, STORE_TIMEOUT, |rec| {
        rec.pause = None;
    })
    .await
    .map_err(store_error)?;
    // A holder whose agent has not reached the store for 3 T cannot see
    // the resume either: --force need not wait for it.
    let silent = if args.force {
        holder_silent(&store, &lock).await?
    } else {
        None
    };
    let deadline = Instant::now() + args.wait;
    loop {
        let record = lock_record(&store, &lock).await?;
        let paused = record
            .as_ref()
            .filter(|(_, r)| r.paused.is_some() && is_live(r));
        let Some((entry, r)) = paused else {
            println!("{lock} resumed: failover is on");
            return Ok(());
        };
        if silent.is_some() || Instant::now() >= deadline {
            if !args.force {
                return Err(CliError::Exit(
                    TIMED_OUT,
                    format!(
                        "{} has not resumed {lock} within {}: is its agent running? If its host \
                         is down or its service stopped, `putex resume --force {lock}` ends the \
                         pause without it",
                        r.node,
                        humantime::format_duration(args.wait)
                    ),
                ));
            }
            let revoked = LockRecord {
                state: LockState::Revoked,
                write: format!("{}-resume", crate::identity::instance_id()),
                paused: None,
                ..r.clone()
            };
            store
                .update(
                    &keys::lock(&lock),
                    &revoked.encode(),
                    entry.token,
                    STORE_TIMEOUT,
                )
                .await
                .map_err(|e| CliError::Other(format!("the forced resume failed: {e}")))?;
            let why = match silent {
                Some(Duration::MAX) => format!(
                    " at once ({}'s agent last wrote its member record before this \
                     machine's last boot: it cannot see a resume)",
                    r.node
                ),
                Some(d) => format!(
                    " at once ({}'s agent has not written its member record for {}, more than \
                     3 T: it cannot see a resume)",
                    r.node,
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
                    ))
                ),
                None => String::new(),
            };
            println!(
                "{lock} resumed by force{why}: {}'s paused record is revoked; a standby takes \
                 over W + G' from now",
                r.node
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
