//! `putex watch`: a live view of one lock.
//!
//! Watches `lock.<name>`, `member.<name>.` and `history.<name>.` and, on
//! every change, redraws what `putex status` shows ([`status::lock_status`],
//! [`render`]) and the last few transitions
//! ([`super::history::render`]). The transition records come from the
//! watch itself (its initial delivery, then each new record), so a redraw
//! costs one status read.
//!
//! On a terminal each frame replaces the previous one (ANSI: cursor home,
//! clear screen) and frames are redrawn at least once a second so that
//! ages move. Otherwise (a pipe, a file) a frame is appended only when
//! something other than an age or a renewal changed, so a log of the
//! output reads as a list of changes.
//!
//! A watch that ends or fails is re-established (and the records re-read)
//! after a short pause. SIGINT and SIGTERM end the command with status 0.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use futures::StreamExt;
use putex_core::Observed;
use tokio::time::Instant;

use super::history::open_store;
use super::status::render;
use super::CliError;
use crate::observe::history;
use crate::report::status::{self, LockStatus, StatusError};
use crate::shutdown::Shutdown;
use crate::store::{keys, AnyStore, Entry, Name, Store, WatchStream};

/// `putex watch` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// The lock.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
    /// How many of the last transitions to show.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub transitions: usize,
}

/// Changes that arrive within this of each other make one frame.
const SETTLE: Duration = Duration::from_millis(100);
/// A terminal frame is redrawn at least this often (ages move).
const TICK: Duration = Duration::from_secs(1);
/// The pause before re-establishing a broken watch.
const RETRY: Duration = Duration::from_millis(500);

/// The watches of one lock, merged.
async fn open_watches(
    store: &AnyStore,
    name: &Name,
) -> Result<futures::stream::SelectAll<WatchStream>, CliError> {
    let filters = [
        keys::lock(name),
        keys::members_of(name),
        keys::history_of(name),
    ];
    let mut all = futures::stream::SelectAll::new();
    for f in filters {
        let w = store
            .watch(&f, None, Duration::from_secs(5))
            .await
            .map_err(|e| CliError::Store(format!("watch {f}: {e}")))?;
        all.push(w);
    }
    Ok(all)
}

/// What a lock or member record says, without what changes on every
/// renewal (a lock record's write id): a renewal alone is no change to
/// draw (a terminal's ages move once a second anyway).
fn meaning(key: &str, value: &[u8]) -> Vec<u8> {
    if key.starts_with(keys::LOCK_PREFIX) {
        if let Observed::Record(r) = Observed::decode(value) {
            return format!("{}|{:?}|{}|{}", r.node, r.state, r.instance, r.machine).into_bytes();
        }
    }
    value.to_vec()
}

/// What a plain (non-terminal) frame is compared by: everything but ages
/// and the renewals' revisions.
fn signature(st: &Result<LockStatus, StatusError>, rows: &[history::HistoryRow]) -> String {
    let mut s = match st {
        Ok(st) => {
            let mut s = format!("{:?}|{:?}|{}|", st.holder, st.state, st.stale);
            for m in &st.members {
                s.push_str(&format!(
                    "{}:{}:{:?}:{};",
                    m.node, m.role, m.healthy, m.silent
                ));
            }
            s
        }
        Err(e) => e.to_string(),
    };
    if let Some(r) = rows.last() {
        s.push_str(&format!("|{}", r.revision));
    }
    s
}

fn frame(
    name: &str,
    url: &str,
    st: &Result<LockStatus, StatusError>,
    rows: &[history::HistoryRow],
) -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let mut out = format!("putex watch {name} — {url} — {now}\n\n");
    match st {
        Ok(st) => out.push_str(&render(st)),
        Err(e) => out.push_str(&format!("status unavailable: {e}\n")),
    }
    out.push_str("\nLAST TRANSITIONS\n");
    out.push_str(&super::history::render(rows));
    out
}

/// `putex watch`.
pub async fn run(args: &WatchArgs) -> Result<(), CliError> {
    let name = Name::new(&*args.name).map_err(|e| CliError::Usage(format!("lock name: {e}")))?;
    let (store, url) = open_store(args.store.as_deref()).await?;
    let shutdown = Shutdown::new();
    shutdown
        .on_signals()
        .map_err(|e| CliError::Other(format!("cannot install signal handlers: {e}")))?;
    let stop = shutdown.graceful();
    let tty = std::io::stdout().is_terminal();
    let history_prefix = keys::history_of(&name);
    let scan = keys::history_scan(&name);
    let url = url.to_string();

    let mut last_signature = None;
    loop {
        let mut watches = tokio::select! {
            w = open_watches(&store, &name) => match w {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the lock; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => continue,
                        () = stop.cancelled() => return Ok(()),
                    }
                }
            },
            () = stop.cancelled() => return Ok(()),
        };
        // The watch delivers every record again: start from nothing.
        let mut records: BTreeMap<String, Entry> = BTreeMap::new();
        let mut seen: HashMap<String, Option<Vec<u8>>> = HashMap::new();
        let mut draw_at = Some(Instant::now() + SETTLE);
        let mut next_tick = Instant::now() + TICK;
        loop {
            let wake = draw_at.unwrap_or(next_tick).min(next_tick);
            tokio::select! {
                ev = watches.next() => match ev {
                    Some(Ok(ev)) => {
                        let changed = if ev.key.starts_with(&history_prefix) {
                            let changed = ev.key != scan;
                            match ev.entry {
                                Some(e) if changed => records.insert(ev.key, e),
                                _ => records.remove(&ev.key),
                            };
                            changed
                        } else {
                            let now = ev.entry.as_ref().map(|e| meaning(&ev.key, &e.value));
                            seen.insert(ev.key, now.clone()) != Some(now)
                        };
                        if changed {
                            draw_at.get_or_insert(Instant::now() + SETTLE);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the watch failed; re-establishing it");
                        break;
                    }
                    None => {
                        tracing::warn!("the watch ended; re-establishing it");
                        break;
                    }
                },
                () = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= next_tick {
                        next_tick = now + TICK;
                        if tty {
                            draw_at.get_or_insert(now);
                        }
                    }
                    if draw_at.is_some_and(|at| at <= now) {
                        draw_at = None;
                        let st = status::lock_status(&store, &name).await;
                        let rows = super::history::last(
                            history::derive(&history::parse(records.clone())),
                            args.transitions,
                        );
                        let sig = signature(&st, &rows);
                        if tty || last_signature.as_ref() != Some(&sig) {
                            let mut text = frame(&args.name, &url, &st, &rows);
                            if tty {
                                text.insert_str(0, "\x1b[H\x1b[2J");
                            } else if last_signature.is_some() {
                                text.insert(0, '\n');
                            }
                            let mut out = std::io::stdout().lock();
                            if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                                // Nobody reads any more.
                                return Ok(());
                            }
                            last_signature = Some(sig);
                        }
                    }
                }
                () = stop.cancelled() => return Ok(()),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = stop.cancelled() => return Ok(()),
        }
    }
}
