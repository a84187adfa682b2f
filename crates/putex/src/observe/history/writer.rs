//! Writing transition records: a bounded queue per process, a writer
//! task that never blocks the agent, and pruning to the newest [`KEEP`].

use super::*;

/// Who writes, and how.
#[derive(Clone, Debug)]
pub(crate) struct WriterConfig {
    pub lock: Name,
    pub node: NodeId,
    pub instance: Name,
    /// [`TransitionRecord::source`].
    pub source: &'static str,
    /// The deadline of each write.
    pub timeout: Duration,
    /// Records per lock to keep when pruning ([`KEEP`]).
    pub keep: usize,
    /// Prune after about one write in this many ([`prune_due`],
    /// [`PRUNE_EVERY`]; 0: never).
    pub prune_every: u64,
}

impl WriterConfig {
    /// A writer for `lock` with the default retention.
    pub fn new(
        lock: &Name,
        node: &NodeId,
        instance: &Name,
        source: &'static str,
        timeout: Duration,
    ) -> WriterConfig {
        WriterConfig {
            lock: lock.clone(),
            node: node.clone(),
            instance: instance.clone(),
            source,
            timeout,
            keep: KEEP,
            prune_every: PRUNE_EVERY,
        }
    }

    /// A `run` writer from text that tests know to be valid.
    #[cfg(test)]
    pub(crate) fn for_test(lock: &str, node: &str, instance: &str, timeout: Duration) -> Self {
        let name = |s: &str| -> Name { s.parse().expect("a test name") };
        let node: NodeId = node.parse().expect("a test node id");
        WriterConfig::new(&name(lock), &node, &name(instance), "run", timeout)
    }
}

enum Msg {
    Write(Box<TransitionRecord>),
    Flush(oneshot::Sender<()>),
}

/// Writes one host's transition records in the background; clones share
/// the queue. See the [module docs](crate::observe::history).
#[derive(Clone)]
pub(crate) struct HistoryWriter {
    inner: Arc<WriterInner>,
}

struct WriterInner {
    cfg: WriterConfig,
    seq: AtomicU64,
    store: AnyStore,
    /// The queue to the writing task, started with the first record: a
    /// host that never changes role (a request waiting in line at a
    /// gateway, one of a thousand) costs no task.
    tx: std::sync::OnceLock<mpsc::Sender<Msg>>,
}

impl std::fmt::Debug for HistoryWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryWriter")
            .field("lock", &self.inner.cfg.lock)
            .field("node", &self.inner.cfg.node)
            .finish_non_exhaustive()
    }
}

impl HistoryWriter {
    /// A writer whose task starts, on the current tokio runtime, with its
    /// first record.
    pub fn spawn(store: AnyStore, cfg: WriterConfig) -> HistoryWriter {
        HistoryWriter {
            inner: Arc::new(WriterInner {
                cfg,
                seq: AtomicU64::new(0),
                store,
                tx: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The queue to the writing task, which it starts the first time.
    fn queue(&self) -> &mpsc::Sender<Msg> {
        self.inner.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(write_loop(
                self.inner.store.clone(),
                self.inner.cfg.clone(),
                rx,
            ));
            tx
        })
    }

    /// The record of a transition, stamped now with the next sequence
    /// number; `None` for a transition that is not recorded
    /// ([`is_recorded`]). `key` is the lock record's key when it is not
    /// `lock.<lock>`.
    pub fn record(
        &self,
        from: Role,
        to: Role,
        reason: &Reason,
        token: Option<Token>,
        key: Option<&str>,
    ) -> Option<TransitionRecord> {
        if !is_recorded(from, to) {
            return None;
        }
        let cfg = &self.inner.cfg;
        let stale = match reason {
            Reason::AcquiredStale {
                revision,
                unchanged_for,
                store_age,
            } => Some(StaleEvidence {
                revision: *revision,
                unchanged_for_ms: millis(*unchanged_for),
                store_age_ms: store_age.map(millis),
            }),
            _ => None,
        };
        Some(TransitionRecord {
            v: RECORD_VERSION,
            lock: cfg.lock.to_string(),
            key: key.map(str::to_owned),
            node: cfg.node.to_string(),
            instance: cfg.instance.to_string(),
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
            source: cfg.source.to_owned(),
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_string(),
            reason_code: reason_code(reason).to_owned(),
            token,
            stale,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        })
    }

    /// Queues a record for writing. Never blocks: a full queue drops it
    /// with a warning.
    pub fn send(&self, record: TransitionRecord) {
        if let Err(e) = self.queue().try_send(Msg::Write(Box::new(record))) {
            tracing::warn!(error = %e, "transition record dropped: the history queue is full or closed");
        }
    }

    /// [`record`](Self::record) and [`send`](Self::send): what a host's
    /// `event` calls on [`putex_core::Event::Transition`].
    pub fn transition(&self, from: Role, to: Role, reason: &Reason, token: Option<Token>) {
        if let Some(r) = self.record(from, to, reason, token, None) {
            self.send(r);
        }
    }

    /// Records an operator event of an active holder (O2): a record from
    /// `active` to `active` with `reason_code` `code` (`paused`,
    /// `unpaused`) and `reason` saying who asked and why.
    pub fn operator(&self, code: &'static str, reason: String, token: Option<Token>) {
        self.note(Role::Active, code, reason, token);
    }

    /// Records an event that changes no role: a record from `role` to
    /// `role` with `reason_code` `code` (`failsafe`, and the operator's
    /// events) and `reason` for people.
    pub fn note(&self, role: Role, code: &'static str, reason: String, token: Option<Token>) {
        let cfg = &self.inner.cfg;
        self.send(TransitionRecord {
            v: RECORD_VERSION,
            lock: cfg.lock.to_string(),
            key: None,
            node: cfg.node.to_string(),
            instance: cfg.instance.to_string(),
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
            source: cfg.source.to_owned(),
            from: role.to_string(),
            to: role.to_string(),
            reason,
            reason_code: code.to_owned(),
            token,
            stale: None,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        });
    }

    /// Waits until every record queued so far was written or given up on,
    /// or `within` passed, whichever comes first.
    pub async fn flush(&self, within: Duration) {
        // Nothing was ever queued: nothing to wait for.
        let Some(queue) = self.inner.tx.get() else {
            return;
        };
        let (tx, rx) = oneshot::channel();
        let work = async {
            if queue.send(Msg::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        };
        if tokio::time::timeout(within, work).await.is_err() {
            tracing::debug!("transition records still queued at exit");
        }
    }
}

async fn write_loop(store: AnyStore, cfg: WriterConfig, mut rx: mpsc::Receiver<Msg>) {
    // Pruning runs beside the writes, so that it never delays a record
    // (whose store time measures a gap). A request while one is pending
    // is merged into it; the pruner ends with this loop. A flush finishes
    // a prune that is due or under way: a process that exits after a few
    // records (`putex lock`) would otherwise cut every prune short, and
    // its lock's records would pile up without end.
    let (prune_tx, prune_rx) = mpsc::channel(1);
    let pruning = Arc::new(Pruning::default());
    tokio::spawn(prune_loop(
        store.clone(),
        cfg.clone(),
        prune_rx,
        pruning.clone(),
    ));
    while let Some(msg) = rx.recv().await {
        let rec = match msg {
            Msg::Flush(done) => {
                pruning.finish(&store, &cfg).await;
                let _ = done.send(());
                continue;
            }
            Msg::Write(rec) => *rec,
        };
        let key = keys::history(&cfg.lock, &cfg.node, &cfg.instance, rec.seq);
        let bytes = serde_json::to_vec(&rec).expect("a transition record serialises");
        match store.put(&key, &bytes, cfg.timeout).await {
            Ok(token) => {
                tracing::debug!(key, revision = token.revision, "transition record written");
                if prune_due(token.revision, cfg.prune_every) {
                    pruning.due.store(true, Ordering::SeqCst);
                    let _ = prune_tx.try_send(());
                }
            }
            Err(e) => tracing::warn!(
                key,
                error = %e,
                "transition record not written (best effort: `putex history` will miss it)"
            ),
        }
    }
}

/// Whether a prune is due, and the turn to run one (the pruner's, or a
/// flush's).
#[derive(Default)]
struct Pruning {
    due: AtomicBool,
    running: tokio::sync::Mutex<()>,
}

impl Pruning {
    /// Runs the prune if one is due, after any under way.
    async fn finish(&self, store: &AnyStore, cfg: &WriterConfig) {
        let _turn = self.running.lock().await;
        if self.due.swap(false, Ordering::SeqCst) {
            prune_logged(store, cfg).await;
        }
    }
}

async fn prune_loop(
    store: AnyStore,
    cfg: WriterConfig,
    mut wake: mpsc::Receiver<()>,
    pruning: Arc<Pruning>,
) {
    while wake.recv().await.is_some() {
        pruning.finish(&store, &cfg).await;
    }
}

async fn prune_logged(store: &AnyStore, cfg: &WriterConfig) {
    match prune(store, &cfg.lock, cfg.keep, cfg.timeout * 4).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(removed = n, "pruned transition records"),
        // Best effort, tried again at the next prune; an unknown
        // outcome is also what a prune cut off by the exit of a
        // one-shot command (`putex lock`) reports — no news for
        // the operator.
        Err(e) if e.is_unknown() => {
            tracing::debug!(error = %e, "cannot prune transition records now")
        }
        Err(e) => tracing::warn!(error = %e, "cannot prune transition records"),
    }
}

/// Removes all but the newest `keep` transition records of `lock` (by
/// store revision); returns how many it removed. Records that cannot be
/// removed now are left for the next prune.
///
/// On NATS and SQLite that is one request, the store doing the counting:
/// a stream purge with a filter and `keep` (which counts the scan
/// marker's few messages among those kept: up to [`HISTORY`] records
/// more stay), or one `DELETE`. Elsewhere, or when the credentials may not
/// purge the stream, the records are read and the oldest removed one by
/// one — a read of the whole history, too slow for the exit of every
/// eighth `putex lock` (40–80 ms with 1,000 records on NATS).
///
/// [`HISTORY`]: crate::store::nats::HISTORY
pub(super) async fn prune(
    store: &AnyStore,
    lock: &Name,
    keep: usize,
    timeout: Duration,
) -> Result<usize, StoreError> {
    let filter = keys::history_of(lock);
    let marker = keys::history_scan(lock);
    let kept = u64::try_from(keep).unwrap_or(u64::MAX);
    let as_count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    match store {
        AnyStore::Nats(nats) => {
            let marker_messages = u64::try_from(crate::store::nats::HISTORY).unwrap_or(0);
            match nats
                .purge_prefix_keeping(&filter, kept + marker_messages, timeout)
                .await
            {
                Ok(n) => return Ok(as_count(n)),
                Err(e) => tracing::debug!(error = %e, "cannot purge; reading and deleting instead"),
            }
        }
        AnyStore::Sqlite(sqlite) => {
            return sqlite
                .purge_prefix_keeping(&filter, kept, &marker, timeout)
                .await
                .map(as_count)
        }
        AnyStore::Etcd(_) | AnyStore::Memory(_) => {}
    }
    let (entries, _) = snapshot_synced(store, &filter, &marker, timeout).await?;
    if entries.len() <= keep {
        return Ok(0);
    }
    let mut entries: Vec<(String, Entry)> = entries.into_iter().collect();
    entries.sort_by_key(|(_, e)| e.token.revision);
    let excess = entries.len() - keep;
    let mut removed = 0;
    for (key, e) in entries.into_iter().take(excess) {
        match remove(store, &key, e.token, timeout).await {
            Ok(()) => removed += 1,
            Err(e) => tracing::debug!(key, error = %e, "transition record not removed"),
        }
    }
    Ok(removed)
}

/// Deletes one transition record (etcd, memory, or NATS credentials that
/// may not purge the stream: [`prune`] purges on NATS and SQLite).
async fn remove(
    store: &AnyStore,
    key: &str,
    token: Token,
    timeout: Duration,
) -> Result<(), StoreError> {
    match store.delete(key, token, timeout).await {
        // Someone else pruned it first.
        Err(e) if e.is_conflict() => Ok(()),
        other => other,
    }
}
