//! What a section's slot agents share: the section's [`State`] behind one
//! lock, the keeper and the store. The slot hosts ([`super::host`]), the
//! once-per records ([`super::once`]) and the `putex kv` server
//! ([`super::kv`]) all work on it; it depends on none of them.

use super::*;

/// What the slot agents share.
#[derive(Default)]
pub(super) struct State {
    /// The slot whose agent armed the keeper first: CMD runs under it.
    pub(super) winner: Option<usize>,
    /// The slot whose agent took a released record first (confirming,
    /// no fencing gap owed) and has not lost it before activating: the only
    /// one that competes until a slot arms the keeper.
    pub(super) claimed: Option<usize>,
    /// The winner's activation began: CMD may be running from then on, so
    /// the winner is never handed to another slot.
    pub(super) activating: bool,
    /// The winner's token once CMD was spawned.
    pub(super) spawned: Option<Token>,
    /// The token CMD is being spawned with, from the moment it is asked
    /// of the keeper: the keeper's report of CMD's exit can be read before
    /// the task that asked hears that it started.
    pub(super) spawning: Option<Token>,
    /// When CMD was spawned (for `max_duration`).
    pub(super) spawned_at: Option<tokio::time::Instant>,
    /// CMD's exit.
    pub(super) exit: Option<Exit>,
    /// The winner's tenure ended without our asking.
    pub(super) lost: Option<String>,
    /// The deadline the keeper was last armed with (or extended to) and
    /// accepted: the licence's end on `CLOCK_BOOTTIME`, where the keeper
    /// stops CMD on its own. `None` once disarmed.
    pub(super) licence_until: Option<Instant>,
    /// The winner's release was written.
    pub(super) released: bool,
    /// CMD was not run: it already ran in this period.
    pub(super) already_done: Option<(String, String)>,
    /// The once-per period CMD runs in (read at activation: a run that
    /// crosses into the next period is recorded for the one it started in).
    pub(super) period: Option<String>,
    /// The once-per record could not be read or claimed in time: CMD was
    /// not run.
    pub(super) once_failed: Option<StoreError>,
    /// Why CMD could not be spawned, if it could not.
    pub(super) spawn_failed: Option<String>,
    /// Slots whose agent must stop (lost the race for CMD).
    pub(super) losers: Vec<usize>,
    /// Which slots' records are released, as the section's own watch of
    /// them shows: `None` while unknown (a plain lock, or the watch
    /// failed).
    pub(super) free: Option<Vec<bool>>,
    /// Where this section starts looking among the free slots, so that
    /// clients admitted together spread over the slots instead of all
    /// trying the first.
    pub(super) spread: usize,
    /// A slot's absent-record wait was told on stderr (S4): once per run.
    pub(super) absent_wait_said: bool,
    /// Per slot, the lock record its agent wrote last and whether it says
    /// held: what CMD's guarded writes compare against ([`super::kv`]).
    pub(super) records: std::collections::BTreeMap<usize, (Token, bool)>,
}

impl State {
    /// The slot to compete for before one armed the keeper: the claimed
    /// one, else one of those seen released, picked by [`State::spread`];
    /// `None` when there is none (every slot competes).
    pub(super) fn preferred_slot(&self) -> Option<usize> {
        if self.claimed.is_some() {
            return self.claimed;
        }
        let free: Vec<usize> = (self.free.as_ref()?.iter().enumerate())
            .filter(|(_, f)| **f)
            .map(|(slot, _)| slot)
            .collect();
        (!free.is_empty()).then(|| free[self.spread % free.len()])
    }
}

pub(super) struct Shared {
    pub(super) opts: SectionOptions,
    pub(super) store: AnyStore,
    pub(super) keeper: Arc<KeeperClient>,
    pub(super) ops: KeeperQueue,
    pub(super) state: Mutex<State>,
    pub(super) changed: Notify,
    /// The winner's transition records (`putex history`).
    pub(super) history: HistoryWriter,
    /// Writes of the highest token seen (S6) still under way: the section
    /// waits for them before it returns, so that the process's exit never
    /// cuts one off (and the host forgets a token it saw).
    pub(super) persisting: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Where CMD asks for guarded writes (`PUTEX_KV_SOCKET`), if anywhere.
    pub(super) kv_socket: Option<std::path::PathBuf>,
}

impl Shared {
    /// Changes the state and wakes the section's loop.
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.notify_one();
        r
    }

    /// The state, for the section's loop (no wake-up).
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Waits up to `within` for every write of the highest token begun so
    /// far ([`Shared::persisting`]).
    pub(super) async fn persisted(&self, within: Duration) {
        let writes = std::mem::take(&mut *self.persisting.lock());
        if writes.is_empty() {
            return;
        }
        if tokio::time::timeout(within, future::join_all(writes))
            .await
            .is_err()
        {
            tracing::warn!(
                ?within,
                "the host state is still being written; not waiting longer"
            );
        }
    }

    pub(super) fn is_winner(&self, slot: usize) -> bool {
        self.lock().winner == Some(slot)
    }
}
