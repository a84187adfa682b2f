//! Fair queues: the waiters of a lock take their turn in arrival order.
//!
//! The store's compare-and-swap decides who holds a lock; it does not decide
//! who is *next*. Without a queue the waiter that happens to see a release
//! first wins, and under constant contention an unlucky waiter can wait
//! forever. A [`Ticket`] fixes that:
//!
//! - joining creates a ticket record `queue.<name>.<instance>`; the revision
//!   of that create is the waiter's place in line (revisions increase per
//!   store, so every waiter sees the same order);
//! - the waiter refreshes its ticket every R; a ticket whose revision has not
//!   changed for [`expiry`] on an observer's clock belongs to a waiter that
//!   died or was cut off, and is skipped (and removed by the first live
//!   waiter), so a dead waiter never blocks the line;
//! - [`Ticket::turn`] says whether this waiter is among the first `admit`
//!   live tickets: the first one for a lock, the first N for a semaphore of
//!   N slots ([`Ticket::join_admitting`]). Tickets stay until their waiter
//!   is done, so the holders count among the first: a semaphore's
//!   waiters behind N holders wait, and the next in line is admitted when a
//!   holder leaves. The host passes it to the core as
//!   [`Input::Turn`](putex_core::Input::Turn), which only ever *delays* an
//!   acquisition: a queue cannot weaken any safety rule, and a waiter that
//!   is wrongly first (or wrongly not) costs fairness, never exclusion.
//!
//! Holders that do not queue (`putex run` agents, the lease library) still
//! compete directly; the queue orders the waiters that use it.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::store::{keys, AnyStore, Entry, Name, NodeId, ReadMode, Store, StoreError, Token};

/// A waiter's ticket as stored (versioned JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketRecord {
    /// Format version (1).
    pub v: u32,
    /// The waiter's node id.
    pub node: String,
    /// The waiter's instance id (also the last token of the key).
    pub instance: String,
    /// The revision of the ticket's creation: its place in line.
    pub arrival: u64,
    /// How often the waiter refreshes it, in milliseconds.
    pub renew_ms: u64,
    /// The waiter's pid, for operators.
    pub pid: u32,
    /// What the waiter wants the lock for (`--title`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// How long the waiter waits, in milliseconds (HTTP requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The lifetime the waiter asks for, in milliseconds (HTTP requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_ms: Option<u64>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a ticket may go without a refresh before observers skip it: three
/// of its waiter's refresh intervals plus a second for a slow store.
pub fn expiry(renew: Duration) -> Duration {
    renew * 3 + Duration::from_secs(1)
}

/// A place in a lock's queue, refreshed in the background until
/// [`Ticket::leave`] (or drop, which leaves it to expire).
pub struct Ticket {
    arrival: u64,
    turn: watch::Receiver<bool>,
    leave: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Who a ticket belongs to.
#[derive(Clone, Debug)]
pub struct Waiter {
    /// The lock (or semaphore) name.
    pub name: Name,
    /// The waiter's node id, written into the ticket
    /// ([`TicketRecord::node`]).
    pub node: NodeId,
    /// The instance id, unique per waiter.
    pub instance: Name,
    /// The refresh interval (R).
    pub renew: Duration,
    /// The deadline of each store call the ticket makes: to join, refresh
    /// and leave, and to watch the queue.
    pub store_timeout: Duration,
    /// `--title`, shown to operators.
    pub title: Option<String>,
    /// For HTTP requests: the wait and the lifetime asked for.
    pub asked: Option<(Duration, Duration)>,
    /// How long joining may go on trying a store whose answers are
    /// unknown (busy, electing a leader) before it gives up: the waiter's
    /// own patience (`--wait`, an HTTP request's wait).
    pub patience: Duration,
}

impl Ticket {
    /// Joins the queue of `waiter.name`: creates the ticket and starts
    /// refreshing it and watching the others. It is this waiter's turn when
    /// it is first in line.
    pub async fn join(store: AnyStore, waiter: Waiter) -> Result<Ticket, StoreError> {
        Ticket::join_admitting(store, waiter, 1).await
    }

    /// [`Ticket::join`] for a lock that `admit` may hold at once (a
    /// semaphore): it is this waiter's turn while fewer than `admit` live
    /// tickets are ahead of it.
    pub async fn join_admitting(
        store: AnyStore,
        waiter: Waiter,
        admit: usize,
    ) -> Result<Ticket, StoreError> {
        let key = keys::ticket(&waiter.name, &waiter.instance);
        let filter = keys::queue_of(&waiter.name);
        let mut record = TicketRecord {
            v: 1,
            node: waiter.node.to_string(),
            instance: waiter.instance.to_string(),
            arrival: 0,
            renew_ms: u64::try_from(waiter.renew.as_millis()).unwrap_or(u64::MAX),
            pid: std::process::id(),
            title: waiter.title.clone(),
            wait_ms: waiter.asked.map(|(w, _)| millis(w)),
            lifetime_ms: waiter.asked.map(|(_, l)| millis(l)),
        };
        let give_up = tokio::time::Instant::now() + waiter.patience;
        let token = create_ticket(&store, &key, &mut record, waiter.store_timeout, give_up).await?;
        let arrival = record.arrival;
        let (turn_tx, turn) = watch::channel(false);
        let (leave_tx, leave_rx) = oneshot::channel();
        let task = tokio::spawn(keep(
            store,
            waiter,
            key,
            filter,
            record,
            token,
            admit.max(1),
            turn_tx,
            leave_rx,
        ));
        Ok(Ticket {
            arrival,
            turn,
            leave: Some(leave_tx),
            task: Some(task),
        })
    }

    /// The place in line: the store revision of the ticket's creation.
    pub fn arrival(&self) -> u64 {
        self.arrival
    }

    /// Whether it is this waiter's turn (first in line, or among the first
    /// `admit`); changes are signalled.
    pub fn turn(&self) -> watch::Receiver<bool> {
        self.turn.clone()
    }

    /// Leaves the queue: stops refreshing and removes the ticket.
    pub async fn leave(mut self) {
        if let Some(tx) = self.leave.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Creates the ticket; its revision is the place in line. An unknown
/// outcome is resolved by reading the key back (our instance id names it),
/// and tried again with back-off until `give_up`: a busy store or a leader
/// election is no reason to fail a waiter that still has time.
async fn create_ticket(
    store: &AnyStore,
    key: &str,
    record: &mut TicketRecord,
    timeout: Duration,
    give_up: tokio::time::Instant,
) -> Result<Token, StoreError> {
    let mut pause = Duration::from_millis(50);
    let mut attempt = 0u32;
    loop {
        if attempt > 0 {
            // Back off: an unknown outcome is usually a store that is busy
            // or electing a leader.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        attempt += 1;
        let value = serde_json::to_vec(&*record).expect("a ticket serialises");
        let created = match store.create(key, &value, timeout).await {
            Ok(token) => Some(token),
            Err(e @ StoreError::Config { .. }) => return Err(e),
            Err(e) => {
                // Conflict: a ticket of ours landed (an unknown create), or a
                // leftover with our instance id — either way it is ours.
                match store.get(key, ReadMode::Leader, timeout).await {
                    Ok(Some(entry)) => Some(entry.token),
                    Ok(None) if e.is_conflict() => None,
                    Ok(None) | Err(_) if tokio::time::Instant::now() + pause < give_up => None,
                    Ok(None) => return Err(e),
                    Err(read) => return Err(read),
                }
            }
        };
        let Some(token) = created else { continue };
        record.arrival = token.revision;
        let value = serde_json::to_vec(&*record).expect("a ticket serialises");
        // The arrival is written into the record for readers that see only
        // a later refresh (an adopted create still says 0, which would
        // put us first in line); failing here is harmless, the next
        // refresh writes it.
        return Ok(store
            .update(key, &value, token, timeout)
            .await
            .unwrap_or(token));
    }
}

/// One ticket as an observer sees it.
struct Seen {
    record: Option<TicketRecord>,
    token: Token,
    changed: tokio::time::Instant,
}

#[allow(clippy::too_many_arguments)]
async fn keep(
    store: AnyStore,
    waiter: Waiter,
    key: String,
    filter: String,
    record: TicketRecord,
    mut token: Token,
    admit: usize,
    turn: watch::Sender<bool>,
    mut leave: oneshot::Receiver<()>,
) {
    let timeout = waiter.store_timeout;
    let mut tickets: HashMap<String, Seen> = HashMap::new();
    let mut refresh = tokio::time::interval(waiter.renew);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch: Option<crate::store::WatchStream> = None;
    let mut from: Option<u64> = None;
    loop {
        if watch.is_none() {
            match store.watch(&filter, from, timeout).await {
                Ok(w) => watch = Some(w),
                Err(e) => tracing::debug!(error = %e, "queue watch failed; retrying"),
            }
        }
        tokio::select! {
            _ = &mut leave => break,
            _ = refresh.tick() => {
                let value = serde_json::to_vec(&record).expect("a ticket serialises");
                match store.put(&key, &value, timeout).await {
                    Ok(t) => token = t,
                    Err(e) => tracing::debug!(error = %e, "ticket refresh failed"),
                }
                sweep(&store, &mut tickets, &key, timeout).await;
            }
            ev = async { watch.as_mut().expect("set above").next().await }, if watch.is_some() => {
                match ev {
                    Some(Ok(ev)) => {
                        from = Some(ev.revision + 1);
                        match ev.entry {
                            Some(Entry { value, token, .. }) => {
                                let record = serde_json::from_slice::<TicketRecord>(&value).ok();
                                tickets.insert(ev.key, Seen {
                                    record,
                                    token,
                                    changed: tokio::time::Instant::now(),
                                });
                            }
                            None => {
                                tickets.remove(&ev.key);
                            }
                        }
                    }
                    _ => {
                        watch = None;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        let ours = ahead_of(&tickets, &key).is_some_and(|n| n < admit);
        turn.send_if_modified(|t| std::mem::replace(t, ours) != ours);
    }
    turn.send_replace(false);
    remove_ticket(&store, &key, token, &waiter).await;
}

/// Removes our ticket on leaving. Its last refresh may have landed without
/// our hearing of it (an unknown outcome), so a conflict or an unknown
/// outcome is resolved by reading the ticket back — every record under our
/// key is ours — and deleting at the revision read, with back-off, for up
/// to one expiry: after that it has expired for everyone anyway.
async fn remove_ticket(store: &AnyStore, key: &str, mut token: Token, waiter: &Waiter) {
    let give_up = tokio::time::Instant::now() + expiry(waiter.renew);
    let mut pause = Duration::from_millis(50);
    loop {
        let left = give_up.saturating_duration_since(tokio::time::Instant::now());
        let timeout = waiter.store_timeout.min(left);
        if timeout.is_zero() {
            tracing::debug!("ticket not removed; it expires");
            return;
        }
        match store.delete(key, token, timeout).await {
            Ok(()) => return,
            Err(e @ StoreError::Config { .. }) => {
                tracing::debug!(error = %e, "ticket not removed; it expires");
                return;
            }
            Err(e) => match store.get(key, ReadMode::Leader, timeout).await {
                Ok(None) => return,
                Ok(Some(entry)) if entry.token != token => token = entry.token,
                _ if tokio::time::Instant::now() + pause >= give_up => {
                    tracing::debug!(error = %e, "ticket not removed; it expires");
                    return;
                }
                _ => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            },
        }
    }
}

/// The live tickets, in line: lowest arrival, then instance id.
fn live_line(tickets: &HashMap<String, Seen>) -> Vec<&str> {
    let now = tokio::time::Instant::now();
    let mut line: Vec<(u64, &str, &str)> = tickets
        .iter()
        .filter_map(|(k, s)| {
            let r = s.record.as_ref()?;
            let alive = now.duration_since(s.changed) < expiry(Duration::from_millis(r.renew_ms));
            alive.then_some((r.arrival, r.instance.as_str(), k.as_str()))
        })
        .collect();
    line.sort_unstable();
    line.into_iter().map(|(_, _, k)| k).collect()
}

/// How many live tickets are ahead of `ours`; `None` while ours is not
/// among the live ones (not seen yet, or expired).
fn ahead_of(tickets: &HashMap<String, Seen>, ours: &str) -> Option<usize> {
    live_line(tickets).iter().position(|k| *k == ours)
}

/// The key of the first live ticket.
fn first_live(tickets: &HashMap<String, Seen>) -> Option<String> {
    live_line(tickets).first().map(|k| (*k).to_owned())
}

/// Removes the expired (and unreadable) tickets of others, when we are the
/// first live waiter: keeps the queue short without anyone in charge.
async fn sweep(
    store: &AnyStore,
    tickets: &mut HashMap<String, Seen>,
    ours: &str,
    timeout: Duration,
) {
    if first_live(tickets).as_deref() != Some(ours) {
        return;
    }
    let now = tokio::time::Instant::now();
    let dead: Vec<(String, Token)> = tickets
        .iter()
        .filter(|(k, s)| {
            k.as_str() != ours
                && match &s.record {
                    Some(r) => {
                        now.duration_since(s.changed) >= expiry(Duration::from_millis(r.renew_ms))
                    }
                    // Garbage under the queue prefix: removed after a while.
                    None => now.duration_since(s.changed) >= expiry(Duration::from_secs(10)),
                }
        })
        .map(|(k, s)| (k.clone(), s.token))
        .collect();
    for (k, t) in dead {
        if store.delete(&k, t, timeout).await.is_ok() {
            tracing::debug!(ticket = %k, "removed an expired ticket");
            tickets.remove(&k);
        }
    }
}
