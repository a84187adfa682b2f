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
//!   N slots ([`Ticket::join_admitting`]). Tickets stay while their waiter
//!   holds, so the holders count among the first: a semaphore's waiters
//!   behind N holders wait, and the next in line is admitted when a holder
//!   leaves — a critical section leaves when its command exits, while it
//!   gives the lock back ([`Ticket::start_leaving`]). The host passes it to the core as
//!   [`Input::Turn`](putex_core::Input::Turn), which only ever *delays* an
//!   acquisition: a queue cannot weaken any safety rule, and a waiter that
//!   is wrongly first (or wrongly not) costs fairness, never exclusion.
//!
//! Holders that do not queue (`putex run` agents, the lease library) still
//! compete directly; the queue orders the waiters that use it.
//!
//! **At scale.** The waiters of one name in one process (a gateway with a
//! thousand requests in line) share one view of the line: one watch of the
//! queue's keys, kept in arrival order, and a walk of its first few live
//! tickets after each change — not a copy of the line per waiter, sorted
//! on every refresh of every ticket. And only the waiters near the front
//! refresh every R: one further back than [`NEAR`] places behind those
//! admitted refreshes every [`IDLE_REFRESH`] and says so in its ticket
//! ([`TicketRecord::near_at`]), so a long line costs the store a write per
//! waiter every 10 s, not every R. Such a ticket promises to refresh at R
//! again once it is within `near_at` of the front; one that does not keep
//! that promise within [`expiry`] of R (its waiter died far back in line)
//! is skipped as dead, so a dead waiter holds the line up no longer than
//! one near the front would.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
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
    /// While the waiter is far back in line: the place (counted from 0 among
    /// the live tickets) from which it refreshes every
    /// [`near_renew_ms`](Self::near_renew_ms) again; until then it
    /// refreshes every `renew_ms`. Absent: it refreshes every `renew_ms`
    /// wherever it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_at: Option<u64>,
    /// With [`near_at`](Self::near_at): the refresh interval near the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_renew_ms: Option<u64>,
    /// How long the waiter waits, in milliseconds (HTTP requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The lifetime the waiter asks for, in milliseconds (HTTP requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_ms: Option<u64>,
}

impl TicketRecord {
    /// The ticket an entry holds, `None` for garbage. A ticket's place in
    /// line is the revision of its creation, written into the record by
    /// its first refresh: a record that still says 0 is the create itself,
    /// and its revision is the place.
    pub fn from_entry(entry: &Entry) -> Option<TicketRecord> {
        let mut record = serde_json::from_slice::<TicketRecord>(&entry.value).ok()?;
        if record.arrival == 0 {
            record.arrival = entry.token.revision;
        }
        Some(record)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long a ticket may go without a refresh before observers skip it: three
/// of its waiter's refresh intervals plus a second for a slow store.
pub fn expiry(renew: Duration) -> Duration {
    renew * 3 + Duration::from_secs(1)
}

/// How many places behind the admitted ones a waiter still refreshes its
/// ticket every R (the next few in line: a dead one among them is skipped
/// within [`expiry`] of R).
pub const NEAR: usize = 3;

/// How often a waiter further back in line refreshes its ticket (R when R
/// is longer).
pub const IDLE_REFRESH: Duration = Duration::from_secs(10);

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
            near_at: None,
            near_renew_ms: None,
        };
        let give_up = tokio::time::Instant::now() + waiter.patience;
        let token = create_ticket(&store, &key, &mut record, waiter.store_timeout, give_up).await?;
        let arrival = record.arrival;
        let (turn_tx, turn) = watch::channel(false);
        let (leave_tx, leave_rx) = oneshot::channel();
        let admit = admit.max(1);
        let member = Line::join(&store, &waiter, &key, admit);
        let task = tokio::spawn(keep(
            store, waiter, key, record, token, admit, member, turn_tx, leave_rx,
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

    /// Starts leaving the queue without waiting: the ticket stops being
    /// refreshed and is removed in the background, and the turn becomes
    /// `false`. For a waiter that has had its turn and will not want the
    /// lock again (its command ended): the next in line is admitted while
    /// it gives the lock back, not after. [`Ticket::leave`] still waits for
    /// the removal.
    pub fn start_leaving(&mut self) {
        if let Some(tx) = self.leave.take() {
            let _ = tx.send(());
        }
    }

    /// Leaves the queue: stops refreshing and removes the ticket.
    pub async fn leave(mut self) {
        self.start_leaving();
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
        // The create's revision is the place in line; the record says 0
        // until the first refresh writes it ([`TicketRecord::from_entry`]
        // reads the revision meanwhile): no second write on joining.
        record.arrival = token.revision;
        return Ok(token);
    }
}

/// Keeps our ticket: refreshes it — every R near the front of the line,
/// every [`IDLE_REFRESH`] further back, and at once when it comes near —
/// passes our turn on from the line's view, and removes the ticket when we
/// leave.
#[allow(clippy::too_many_arguments)]
async fn keep(
    store: AnyStore,
    waiter: Waiter,
    key: String,
    mut record: TicketRecord,
    mut token: Token,
    admit: usize,
    mut member: Member,
    turn: watch::Sender<bool>,
    mut leave: oneshot::Receiver<()>,
) {
    let timeout = waiter.store_timeout;
    let fast = waiter.renew;
    let idle = fast.max(IDLE_REFRESH);
    // The ticket as created says "every R".
    let mut written_near = true;
    let mut next = tokio::time::Instant::now() + fast;
    loop {
        tokio::select! {
            _ = &mut leave => break,
            () = tokio::time::sleep_until(next) => {}
            changed = member.place.changed() => {
                if changed.is_err() {
                    // The line's view ended under us (its task panicked, or
                    // the runtime that ran it stopped): join a new one —
                    // after a pause, so that a view that cannot run is not
                    // made again in a loop.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    member = Line::join(&store, &waiter, &key, admit);
                    continue;
                }
                let place = *member.place.borrow_and_update();
                turn.send_if_modified(|t| std::mem::replace(t, place.turn) != place.turn);
                // Come near the front while refreshing slowly: at once.
                if !place.near || written_near {
                    continue;
                }
            }
        }
        let near = member.place.borrow().near;
        record.renew_ms = millis(if near { fast } else { idle });
        record.near_at = (!near).then_some((admit + NEAR) as u64);
        record.near_renew_ms = (!near).then(|| millis(fast));
        let value = serde_json::to_vec(&record).expect("a ticket serialises");
        let slow = match store.put(&key, &value, timeout).await {
            Ok(t) => {
                token = t;
                written_near = near;
                !near
            }
            // Tried again at R: the ticket in the store may promise R (it
            // said so, or this write was to say so on coming near).
            Err(e) => {
                tracing::debug!(error = %e, "ticket refresh failed");
                false
            }
        };
        next = tokio::time::Instant::now() + if slow { idle } else { fast };
    }
    turn.send_replace(false);
    drop(member);
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
        match store.retire(key, token, timeout).await {
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

/// Where a waiter stands, as its process's view of the line sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    /// Among the first `admit` live tickets.
    turn: bool,
    /// Among the first `admit + NEAR` (or not seen yet): refresh every R.
    near: bool,
}

/// A waiter's membership in its process's view of a line; dropping it
/// leaves the view.
struct Member {
    place: watch::Receiver<Place>,
    key: String,
    view: Arc<ViewHandle>,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.view.commands.send(Command::Leave(self.key.clone()));
    }
}

/// A view of one line, shared by the waiters of one process (per store
/// handle and name); its task ends when the last one leaves.
struct ViewHandle {
    commands: mpsc::UnboundedSender<Command>,
}

enum Command {
    Join {
        key: String,
        admit: usize,
        place: watch::Sender<Place>,
    },
    Leave(String),
}

/// A view's key: the store handle ([`AnyStore::handle_id`]) and the name.
type ViewKey = (usize, String);

/// The views of this process.
static VIEWS: LazyLock<Mutex<HashMap<ViewKey, Weak<ViewHandle>>>> = LazyLock::new(Default::default);

/// A ticket's place in line: arrival, instance id, key.
type InLine = (u64, String, String);

/// One ticket as an observer sees it.
struct Seen {
    record: Option<TicketRecord>,
    token: Token,
    /// When we saw it written last.
    changed: tokio::time::Instant,
    /// Since when a ticket refreshing slowly has been near enough the front
    /// that it promised to refresh every R (reset by each write).
    near_since: Option<tokio::time::Instant>,
}

impl Seen {
    /// Its place in [`Line::order`], when it has a record.
    fn in_line(&self, key: &str) -> Option<InLine> {
        let r = self.record.as_ref()?;
        Some((r.arrival, r.instance.clone(), key.to_owned()))
    }

    /// Whether its waiter is taken to be alive at `now`.
    fn alive(&self, now: tokio::time::Instant) -> bool {
        self.deadline().is_some_and(|d| now < d)
    }

    /// When it stops counting as alive unless written again.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let r = self.record.as_ref()?;
        let quiet = self.changed + expiry(Duration::from_millis(r.renew_ms));
        let broken = self
            .near_since
            .zip(r.near_renew_ms)
            .map(|(since, fast)| since + expiry(Duration::from_millis(fast)));
        Some(broken.map_or(quiet, |b| b.min(quiet)))
    }
}

/// A line as one process sees it: every ticket, in order, and the waiters
/// of this process in it.
struct Line {
    tickets: HashMap<String, Seen>,
    /// The tickets with a record: lowest arrival, then instance id, then key.
    order: BTreeSet<InLine>,
    members: HashMap<String, (usize, watch::Sender<Place>)>,
    /// The members whose place says turn or near.
    flagged: HashSet<String>,
}

impl Line {
    /// Joins the view of `waiter.name`'s line on this store handle (made
    /// when it is the first), as the ticket `key`.
    fn join(store: &AnyStore, waiter: &Waiter, key: &str, admit: usize) -> Member {
        let view = {
            let mut views = VIEWS.lock();
            views.retain(|_, v| v.strong_count() > 0);
            let id = (store.handle_id(), waiter.name.to_string());
            // A view whose task ended (see `keep`) is replaced.
            match views
                .get(&id)
                .and_then(Weak::upgrade)
                .filter(|v| !v.commands.is_closed())
            {
                Some(v) => v,
                None => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let v = Arc::new(ViewHandle { commands: tx });
                    views.insert(id, Arc::downgrade(&v));
                    tokio::spawn(watch_line(
                        store.clone(),
                        keys::queue_of(&waiter.name),
                        waiter.store_timeout,
                        rx,
                    ));
                    v
                }
            }
        };
        let unseen = Place {
            turn: false,
            near: true,
        };
        let (tx, place) = watch::channel(unseen);
        let _ = view.commands.send(Command::Join {
            key: key.to_owned(),
            admit,
            place: tx,
        });
        Member {
            place,
            key: key.to_owned(),
            view,
        }
    }

    fn seen(&mut self, key: String, entry: Option<Entry>) {
        if let Some(place) = self.tickets.remove(&key).and_then(|o| o.in_line(&key)) {
            self.order.remove(&place);
        }
        let Some(entry) = entry else {
            return;
        };
        let seen = Seen {
            record: TicketRecord::from_entry(&entry),
            token: entry.token,
            changed: tokio::time::Instant::now(),
            near_since: None,
        };
        if let Some(place) = seen.in_line(&key) {
            self.order.insert(place);
        }
        self.tickets.insert(key, seen);
    }

    /// Walks the front of the line and tells our waiters where they stand;
    /// returns when that may change without a write (a ticket in front
    /// expiring).
    fn settle(&mut self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let window = self
            .members
            .values()
            .map(|(admit, _)| admit + NEAR)
            .max()
            .unwrap_or(0);
        let mut next: Option<tokio::time::Instant> = None;
        let mut flagged = HashSet::new();
        let mut at = 0usize;
        for (_, _, key) in &self.order {
            if at >= window {
                break;
            }
            let Some(seen) = self.tickets.get_mut(key) else {
                continue;
            };
            if let Some(r) = &seen.record {
                if seen.near_since.is_none() && r.near_at.is_some_and(|n| (at as u64) < n) {
                    seen.near_since = Some(now);
                }
            }
            if !seen.alive(now) {
                continue;
            }
            next = match (next, seen.deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some((admit, tx)) = self.members.get(key) {
                let place = Place {
                    turn: at < *admit,
                    near: at < admit + NEAR,
                };
                tx.send_if_modified(|p| std::mem::replace(p, place) != place);
                if place.turn || place.near {
                    flagged.insert(key.clone());
                }
            }
            at += 1;
        }
        for key in self.flagged.drain() {
            if flagged.contains(&key) {
                continue;
            }
            if let Some((_, tx)) = self.members.get(&key) {
                // Not seen yet: near (it refreshes every R) until it is.
                let near = !self.tickets.contains_key(&key);
                let place = Place { turn: false, near };
                tx.send_if_modified(|p| std::mem::replace(p, place) != place);
                if near {
                    flagged.insert(key);
                }
            }
        }
        self.flagged = flagged;
        next
    }

    /// The expired (and unreadable) tickets of other waiters, when one of
    /// ours is first in line: they are removed, keeping the line short
    /// without anyone in charge.
    fn dead(&self) -> Vec<(String, Token)> {
        let now = tokio::time::Instant::now();
        let first = self
            .order
            .iter()
            .map(|(_, _, k)| k)
            .find(|k| self.tickets.get(*k).is_some_and(|s| s.alive(now)));
        if !first.is_some_and(|k| self.members.contains_key(k)) {
            return Vec::new();
        }
        self.tickets
            .iter()
            .filter(|(k, s)| {
                !self.members.contains_key(*k)
                    && match &s.record {
                        Some(_) => !s.alive(now),
                        // Garbage under the queue prefix: removed after a while.
                        None => now.duration_since(s.changed) >= expiry(Duration::from_secs(10)),
                    }
            })
            .map(|(k, s)| (k.clone(), s.token))
            .collect()
    }
}

/// The task of one view: watches the line's keys, tells the waiters in it
/// where they stand, and sweeps dead tickets while one of ours is first.
async fn watch_line(
    store: AnyStore,
    filter: String,
    timeout: Duration,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut line = Line {
        tickets: HashMap::new(),
        order: BTreeSet::new(),
        members: HashMap::new(),
        flagged: HashSet::new(),
    };
    let mut watch: Option<crate::store::WatchStream> = None;
    let mut from: Option<u64> = None;
    let mut next: Option<tokio::time::Instant> = None;
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        if watch.is_none() {
            match store.watch(&filter, from, timeout).await {
                Ok(w) => watch = Some(w),
                Err(e) => {
                    tracing::debug!(error = %e, "queue watch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tokio::select! {
            command = commands.recv() => match command {
                None => break,
                Some(Command::Join { key, admit, place }) => {
                    line.flagged.insert(key.clone());
                    line.members.insert(key, (admit, place));
                }
                Some(Command::Leave(key)) => {
                    line.members.remove(&key);
                    line.flagged.remove(&key);
                }
            },
            ev = async { watch.as_mut().expect("set").next().await }, if watch.is_some() => {
                let mut ev = ev;
                // Take every change already delivered before the walk.
                loop {
                    match ev {
                        Some(Ok(e)) => {
                            from = Some(e.revision + 1);
                            line.seen(e.key, e.entry);
                        }
                        _ => {
                            watch = None;
                            break;
                        }
                    }
                    match watch.as_mut().and_then(|w| w.next().now_or_never()) {
                        Some(more) => ev = more,
                        None => break,
                    }
                }
                if watch.is_none() {
                    // Ended or failed: watched again from `from`, after a
                    // pause (a watch that dies at once is no busy loop).
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            () = async { tokio::time::sleep_until(next.expect("set")).await }, if next.is_some() => {}
            _ = sweep.tick() => {
                let dead = line.dead();
                if !dead.is_empty() && !sweeping.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let store = store.clone();
                    let sweeping = sweeping.clone();
                    tokio::spawn(async move {
                        for (k, t) in dead {
                            if store.retire(&k, t, timeout).await.is_ok() {
                                tracing::debug!(ticket = %k, "removed an expired ticket");
                            }
                        }
                        sweeping.store(false, std::sync::atomic::Ordering::SeqCst);
                    });
                }
            }
        }
        next = line.settle();
    }
}
