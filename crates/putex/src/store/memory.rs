//! An in-process store for tests.
//!
//! Clones of a [`MemoryStore`] share one store, so several simulated nodes
//! in one test can talk through it. It keeps every change (watches never
//! coalesce), stamps entries with this boot's `CLOCK_BOOTTIME` unless given a
//! clock of its own ([`MemoryStore::with_clock`], e.g. one driven by paused
//! tokio time), and can be told to misbehave ([`MemoryStore::inject`]) to
//! produce unknown outcomes on demand.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::keys::{filter_matches, validate_filter, validate_key};
use super::{
    boot_time_now, check_guarded, wall_nanos, Entry, Op, ReadMode, Store, StoreError, StoreTime,
    Token, WatchEvent, WatchStream, Write,
};
use parking_lot::{Mutex, MutexGuard};

/// A fault for the next operation on a [`MemoryStore`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fault {
    /// The operation is not applied; its call waits out its deadline and
    /// reports [`StoreError::Unknown`].
    Stall,
    /// The operation is applied, but its call waits out its deadline and
    /// reports [`StoreError::Unknown`] (a write that landed after a timeout).
    ApplyThenStall,
    /// A write is not applied now; its call waits out its deadline and
    /// reports [`StoreError::Unknown`]; the write lands this long after the
    /// call began, its condition (absent, at a revision) judged then — as
    /// NATS has been seen to apply a write after reporting a timeout.
    /// Other operations take it as [`Fault::Stall`].
    LandLater(Duration),
}

type Clock = Arc<dyn Fn() -> StoreTime + Send + Sync>;

/// An in-process store; clones share it.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    epoch: u64,
    clock: Clock,
    state: Mutex<State>,
    /// The newest revision, for watches to wait on.
    notify: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    revision: u64,
    /// The latest change per key; `value: None` is a delete marker.
    current: BTreeMap<String, Change>,
    /// Every change, in revision order.
    log: Vec<Change>,
    faults: VecDeque<Fault>,
    /// Faults for the next operation on a key with this exact name.
    targeted: Vec<(String, Fault)>,
}

#[derive(Clone)]
struct Change {
    key: String,
    value: Option<Vec<u8>>,
    revision: u64,
    time: StoreTime,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("epoch", &self.inner.epoch)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Copy)]
enum Expect {
    Absent,
    At(Token),
    Anything,
}

impl MemoryStore {
    /// What tells this handle apart from every other open one (its clones
    /// included, which share it): the address of what they share.
    pub(crate) fn handle_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// A new, empty store; its epoch is the current wall-clock time.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(boot_time_now))
    }

    /// A new store whose entries are stamped by `clock`.
    pub fn with_clock(clock: Arc<dyn Fn() -> StoreTime + Send + Sync>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                epoch: wall_nanos(),
                clock,
                state: Mutex::new(State::default()),
                notify: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    /// Queues a fault for the next operation (faults apply in order, one per
    /// operation).
    pub fn inject(&self, fault: Fault) {
        self.state().faults.push_back(fault);
    }

    /// Queues a fault for the next write (create, update, put, delete) on
    /// `key` only, ahead of any fault queued with [`MemoryStore::inject`].
    pub fn inject_on(&self, key: &str, fault: Fault) {
        self.state().targeted.push((key.to_owned(), fault));
    }

    /// The fault for the next write on `key`, taken off its queue.
    fn next_write_fault(&self, key: &str) -> Option<Fault> {
        let mut st = self.state();
        if let Some(i) = st.targeted.iter().position(|(k, _)| k == key) {
            return Some(st.targeted.remove(i).1);
        }
        st.faults.pop_front()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way later operations would misread; keep going.
        self.inner.state.lock()
    }

    fn token(&self, revision: u64) -> Token {
        Token::new(self.inner.epoch, revision)
    }

    fn read(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        let st = self.state();
        Ok(st.current.get(key).and_then(|c| {
            c.value.as_ref().map(|v| Entry {
                value: v.clone(),
                token: self.token(c.revision),
                time: c.time,
            })
        }))
    }

    fn write(
        &self,
        op: Op,
        key: &str,
        value: Option<&[u8]>,
        expect: Expect,
    ) -> Result<Token, StoreError> {
        validate_key(key)?;
        let mut st = self.state();
        let current = st
            .current
            .get(key)
            .filter(|c| c.value.is_some())
            .map(|c| c.revision);
        let ok = match expect {
            Expect::Anything => true,
            Expect::Absent => current.is_none(),
            Expect::At(t) => t.epoch == self.inner.epoch && current == Some(t.revision),
        };
        if !ok {
            return Err(StoreError::conflict(op, key));
        }
        st.revision += 1;
        let change = Change {
            key: key.to_owned(),
            value: value.map(<[u8]>::to_vec),
            revision: st.revision,
            time: (self.inner.clock)(),
        };
        st.current.insert(key.to_owned(), change.clone());
        st.log.push(change);
        let revision = st.revision;
        drop(st);
        self.inner.notify.send_replace(revision);
        Ok(self.token(revision))
    }

    /// [`Store::guarded`]: every write, in one step under the state's
    /// lock, if `guard_key` is still at `guard`.
    fn write_guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
    ) -> Result<Token, StoreError> {
        check_guarded(guard_key, writes)?;
        let mut st = self.state();
        let at = st
            .current
            .get(guard_key)
            .filter(|c| c.value.is_some())
            .map(|c| c.revision);
        if guard.epoch != self.inner.epoch || at != Some(guard.revision) {
            return Err(StoreError::conflict(Op::Guarded, guard_key));
        }
        let time = (self.inner.clock)();
        for w in writes {
            let value = match w {
                Write::Put { value, .. } => Some(value.clone()),
                Write::Delete { key } => {
                    if st.current.get(key).is_none_or(|c| c.value.is_none()) {
                        continue;
                    }
                    None
                }
            };
            st.revision += 1;
            let change = Change {
                key: w.key().to_owned(),
                value,
                revision: st.revision,
                time,
            };
            st.current.insert(change.key.clone(), change.clone());
            st.log.push(change);
        }
        let revision = st.revision;
        drop(st);
        self.inner.notify.send_replace(revision);
        Ok(self.token(revision))
    }

    /// A write under the next queued fault, if any.
    async fn write_op(
        &self,
        op: Op,
        key: &str,
        value: Option<&[u8]>,
        expect: Expect,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        let fault = self.next_write_fault(key);
        if let Some(Fault::LandLater(after)) = fault {
            let store = self.clone();
            let (k, v) = (key.to_owned(), value.map(<[u8]>::to_vec));
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = store.write(op, &k, v.as_deref(), expect);
            });
            tokio::time::sleep(timeout).await;
            return Err(StoreError::timed_out(op, key, timeout));
        }
        self.run_with(fault, op, key, timeout, || {
            self.write(op, key, value, expect)
        })
        .await
    }

    /// Runs `f` under the next queued fault, if any.
    async fn run<T>(
        &self,
        op: Op,
        key: &str,
        timeout: Duration,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let fault = self.state().faults.pop_front();
        self.run_with(fault, op, key, timeout, f).await
    }

    /// Runs `f` under `fault`.
    async fn run_with<T>(
        &self,
        fault: Option<Fault>,
        op: Op,
        key: &str,
        timeout: Duration,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match fault {
            None => f(),
            Some(fault) => {
                // LandLater reaches here only for reads: a stall.
                if fault == Fault::ApplyThenStall {
                    let _ = f();
                }
                tokio::time::sleep(timeout).await;
                Err(StoreError::timed_out(op, key, timeout))
            }
        }
    }
}

fn event(c: &Change, epoch: u64) -> WatchEvent {
    WatchEvent {
        key: c.key.clone(),
        entry: c.value.as_ref().map(|v| Entry {
            value: v.clone(),
            token: Token::new(epoch, c.revision),
            time: c.time,
        }),
        revision: c.revision,
        time: c.time,
    }
}

impl Store for MemoryStore {
    fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    async fn get(
        &self,
        key: &str,
        _mode: ReadMode,
        timeout: Duration,
    ) -> Result<Option<Entry>, StoreError> {
        self.run(Op::Get, key, timeout, || self.read(key)).await
    }

    async fn create(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        self.write_op(Op::Create, key, Some(value), Expect::Absent, timeout)
            .await
    }

    async fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        self.write_op(Op::Update, key, Some(value), Expect::At(expected), timeout)
            .await
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        self.write_op(Op::Put, key, Some(value), Expect::Anything, timeout)
            .await
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.write_op(Op::Delete, key, None, Expect::At(expected), timeout)
            .await
            .map(drop)
    }

    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        let fault = self.next_write_fault(guard_key);
        self.run_with(fault, Op::Guarded, guard_key, timeout, || {
            self.write_guarded(guard_key, guard, writes)
        })
        .await
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        _timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        validate_filter(filter)?;
        let epoch = self.inner.epoch;
        // Subscribe before reading, so no change slips between the two.
        let rx = self.inner.notify.subscribe();
        let (queue, next) = {
            let st = self.state();
            let mut queue: Vec<WatchEvent> = match from_revision {
                None => st
                    .current
                    .values()
                    .filter(|c| filter_matches(filter, &c.key))
                    .map(|c| event(c, epoch))
                    .collect(),
                Some(from) => {
                    let start = st.log.partition_point(|c| c.revision < from);
                    st.log[start..]
                        .iter()
                        .filter(|c| filter_matches(filter, &c.key))
                        .map(|c| event(c, epoch))
                        .collect()
                }
            };
            queue.sort_by_key(|e| e.revision);
            (VecDeque::from(queue), st.revision + 1)
        };
        let store = self.clone();
        let filter = filter.to_owned();
        let stream =
            futures::stream::unfold((store, filter, rx, queue, next), |state| async move {
                let (store, filter, mut rx, mut queue, mut next) = state;
                loop {
                    if let Some(ev) = queue.pop_front() {
                        return Some((Ok(ev), (store, filter, rx, queue, next)));
                    }
                    {
                        let st = store.state();
                        let start = st.log.partition_point(|c| c.revision < next);
                        queue.extend(
                            st.log[start..]
                                .iter()
                                .filter(|c| filter_matches(&filter, &c.key))
                                .map(|c| event(c, store.inner.epoch)),
                        );
                        next = st.revision + 1;
                    }
                    if queue.is_empty() && rx.changed().await.is_err() {
                        return None;
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}
