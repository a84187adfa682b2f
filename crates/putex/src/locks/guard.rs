//! Guarded writes: a holder's writes that the store itself refuses once the
//! lock has moved on (`docs/locks.md`, "Guarded writes").
//!
//! Fencing tokens protect a resource that checks them; a guarded write
//! protects data kept in the store itself, whatever the clocks did. The
//! store applies the write only if the lock record is, when it commits,
//! still a record this tenure wrote — one step of the store (an etcd `Txn`
//! comparing the lock key's mod revision, one SQLite transaction, a NATS
//! publish whose expected last sequence is the lock subject's), never a
//! read followed by a write. A holder frozen past its licence and resumed
//! after a takeover has its write refused by the store: the record moved.
//!
//! The keys are the caller's, kept under [`keys::KV_PREFIX`] beside
//! putex's own records; [`get`] reads them back.
//!
//! ```
//! use std::time::Duration;
//! use putex::locks::guard::{self, GuardError};
//! use putex::locks::lease::{Lease, LeaseOptions};
//! use putex::store::{AnyStore, MemoryStore};
//! use putex::core::TimingConfig;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = AnyStore::from(MemoryStore::new());
//! let timing = TimingConfig {
//!     renew: Duration::from_millis(100),
//!     failures: 3,
//!     confirm: 1,
//!     ..TimingConfig::default()
//! };
//! let lease = Lease::acquire(store.clone(), LeaseOptions::new("orders", "host-a", timing)?).await?;
//! let writes = lease.guard();
//! writes.put("orders.last", b"42").await?;
//! assert_eq!(guard::get(&store, "orders.last").await?, Some(b"42".to_vec()));
//! lease.release().await?;
//! // The tenure is over: nothing is written.
//! assert!(matches!(writes.put("orders.last", b"43").await, Err(GuardError::NotHeld)));
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use putex_core::{Timing, Token};
use thiserror::Error;

use crate::store::keys::{self, KeyError};
use crate::store::{AnyStore, ReadMode, Store, StoreError, Write};

/// Why a guarded write was not made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The tenure the guard belongs to is over (released, lost, or the lock
    /// moved on in the store): nothing was written.
    #[error("the lock is no longer held by this tenure: nothing was written")]
    NotHeld,
    /// A key or batch the store cannot take (bad characters, too long,
    /// a key named twice, a batch on a nats-server before 2.12).
    #[error(transparent)]
    Invalid(StoreError),
    /// The store did not answer in time: the write may or may not have
    /// landed. Read the key back to know.
    #[error(transparent)]
    Unknown(StoreError),
    /// The store could not be read to find the holder's record (a write
    /// made for an HTTP client's lock): nothing was sent.
    #[error("the lock could not be read, nothing was written: {0}")]
    Unavailable(StoreError),
}

/// What a guard needs to know of its tenure, from whoever holds the lock
/// (a [`super::lease::Lock`], a `putex lock` section).
pub(crate) trait Tenure: Send + Sync {
    /// The newest lock record `tenure` wrote that says it holds the lock,
    /// while it holds it by the clock too; `None` once the tenure is over.
    fn newest(&self, tenure: Token) -> Option<Token>;
    /// Completes after a change of what [`Tenure::newest`] may answer (or
    /// after a short while: callers check again).
    fn changed(&self) -> BoxFuture<'static, ()>;
}

/// The most a guarded write (all its values together) may carry: within
/// every store's limits — NATS's default `max_payload` of 1 MiB per
/// message, etcd's 1.5 MiB per request — with room for the key and the
/// framing.
pub const MAX_VALUES: usize = 512 * 1024;

/// How often a guard looks again while it waits for news of a renewal.
pub(crate) const LOOK_AGAIN: Duration = Duration::from_millis(20);

/// The least time a guarded write waits for the store's answer. The
/// lock's own store calls must answer within 2R/5 (their timing depends on
/// it); a guarded write's safety does not (the store decides at commit), so
/// it waits longer rather than report an unknown outcome on a busy store.
pub const GUARDED_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes that land only while one tenure of a lock holds it: from
/// [`super::lease::Lease::guard`] or [`super::lease::Lock::guard`]. Clones
/// share the tenure.
#[derive(Clone)]
pub struct Guard {
    store: AnyStore,
    lock_key: String,
    tenure: Token,
    view: Arc<dyn Tenure>,
    /// How long to wait for a newer record of ours after a conflict.
    patience: Duration,
    timeout: Duration,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("lock", &self.lock_key)
            .field("tenure", &self.tenure)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard for `tenure` of the lock record at `lock_key`, as `view`
    /// tells of it.
    pub(crate) fn of(
        store: AnyStore,
        lock_key: String,
        tenure: Token,
        view: Arc<dyn Tenure>,
        timing: &Timing,
    ) -> Guard {
        Guard {
            store,
            lock_key,
            tenure,
            view,
            patience: timing.lease(),
            timeout: timing.store_timeout().max(GUARDED_WRITE_TIMEOUT),
        }
    }

    /// The fencing token of the tenure this guard belongs to.
    pub fn token(&self) -> Token {
        self.tenure
    }

    /// Sets `key` (under [`keys::KV_PREFIX`]) to `value` if this tenure
    /// still holds the lock when the store commits it.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<Token, GuardError> {
        self.batch(&[Write::Put {
            key: key.to_owned(),
            value: value.to_vec(),
        }])
        .await
    }

    /// Deletes `key` (nothing if absent) if this tenure still holds the
    /// lock when the store commits it.
    pub async fn delete(&self, key: &str) -> Result<Token, GuardError> {
        self.batch(&[Write::Delete {
            key: key.to_owned(),
        }])
        .await
    }

    /// Several writes, all or none, if this tenure still holds the lock
    /// when the store commits them (etcd: one `Txn`; the embedded store: one
    /// transaction; NATS: one atomic batch, nats-server 2.12+). Keys are
    /// the caller's, each named once.
    ///
    /// A renewal of ours that lands just before makes the store refuse the
    /// write (the record moved): it is made again against the newer record,
    /// unseen by the caller. A takeover, a release or the end of the
    /// licence make it [`GuardError::NotHeld`], never a silent success.
    pub async fn batch(&self, writes: &[Write]) -> Result<Token, GuardError> {
        let writes = kv_writes(writes)?;
        loop {
            let record = self.ours()?;
            match self
                .store
                .guarded(&self.lock_key, record, &writes, self.timeout)
                .await
            {
                Ok(token) => return Ok(token),
                Err(StoreError::Conflict { .. }) => {
                    // Our newer record (a renewal) or the news of a loss:
                    // either changes the view. None in time: the lock moved.
                    let wait = tokio::time::timeout(self.patience, async {
                        while self.ours().ok() == Some(record) {
                            self.view.changed().await;
                        }
                    });
                    if wait.await.is_err() {
                        return Err(GuardError::NotHeld);
                    }
                }
                Err(e @ StoreError::Unknown { .. }) => return Err(GuardError::Unknown(e)),
                Err(e @ StoreError::Config { .. }) => return Err(GuardError::Invalid(e)),
            }
        }
    }

    /// The newest lock record this tenure wrote, while it holds the lock by
    /// the clock too; otherwise [`GuardError::NotHeld`].
    fn ours(&self) -> Result<Token, GuardError> {
        self.view.newest(self.tenure).ok_or(GuardError::NotHeld)
    }
}

/// Whether a lock record's bytes, as its holder wrote them, say it holds
/// the lock (`confirming` or `active`): what a guard's [`Tenure`] keeps of
/// each landed write (`Host::lock_written`).
pub(crate) fn record_holds(value: &[u8]) -> bool {
    matches!(putex_core::Observed::decode(value),
        putex_core::Observed::Record(r)
            if matches!(r.state, putex_core::LockState::Active | putex_core::LockState::Confirming))
}

/// Who a lock record says holds the lock, for a taker that does not wait:
/// `None` for a `released` record (free at once); else the holder's node
/// and the record's state, or for a record putex cannot read, that and no
/// state. Read by `Lock::try_acquire` and `putex lock --no-wait`.
pub(crate) fn holder_in_the_way(value: &[u8]) -> Option<(String, Option<putex_core::LockState>)> {
    match putex_core::Observed::decode(value) {
        putex_core::Observed::Record(r) if r.state == putex_core::LockState::Released => None,
        putex_core::Observed::Record(r) => Some((r.node, Some(r.state))),
        putex_core::Observed::Garbage => Some(("an unreadable record".into(), None)),
    }
}

/// The caller's writes as the store's: keys under [`keys::KV_PREFIX`],
/// checked, and at most [`MAX_VALUES`] of values in all.
pub(crate) fn kv_writes(writes: &[Write]) -> Result<Vec<Write>, GuardError> {
    let writes = writes
        .iter()
        .map(|w| {
            Ok(match w {
                Write::Put { key, value } => Write::Put {
                    key: kv_key(key)?,
                    value: value.clone(),
                },
                Write::Delete { key } => Write::Delete { key: kv_key(key)? },
            })
        })
        .collect::<Result<Vec<_>, KeyError>>()
        .map_err(|e| GuardError::Invalid(e.into()))?;
    let carried: usize = writes
        .iter()
        .map(|w| match w {
            Write::Put { value, .. } => value.len(),
            Write::Delete { .. } => 0,
        })
        .sum();
    if carried > MAX_VALUES {
        return Err(GuardError::Invalid(StoreError::config(format!(
            "a guarded write carries at most {MAX_VALUES} bytes of values; this one has {carried}"
        ))));
    }
    Ok(writes)
}

/// The store key of a caller's key: `kv.<key>`.
fn kv_key(key: &str) -> Result<String, KeyError> {
    let full = format!("{}{key}", keys::KV_PREFIX);
    keys::validate_key(&full)?;
    Ok(full)
}

/// Reads a caller's key (under [`keys::KV_PREFIX`]) as the store has it
/// now: `None` when absent.
pub async fn get(store: &AnyStore, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let key = kv_key(key)?;
    Ok(store
        .get(&key, ReadMode::Leader, Duration::from_secs(5))
        .await?
        .map(|e| e.value))
}

/// The caller's keys (under [`keys::KV_PREFIX`]) that start with `prefix`,
/// in order, each with the revision of its last write.
pub async fn list(store: &AnyStore, prefix: &str) -> Result<Vec<(String, Token)>, StoreError> {
    let mut keys: Vec<(String, Token)> =
        crate::store::read_prefix(store, keys::KV_PREFIX, Duration::from_secs(5))
            .await?
            .into_iter()
            .filter_map(|(key, entry)| {
                let key = key.strip_prefix(keys::KV_PREFIX)?;
                key.starts_with(prefix)
                    .then(|| (key.to_owned(), entry.token))
            })
            .collect();
    keys.sort();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::store::MemoryStore;
    use futures::FutureExt;

    /// A tenure whose newest record is what the test says, told late.
    struct Told {
        epoch: u64,
        revision: AtomicU64,
    }

    impl Tenure for Told {
        fn newest(&self, _tenure: Token) -> Option<Token> {
            match self.revision.load(Ordering::SeqCst) {
                0 => None,
                r => Some(Token::new(self.epoch, r)),
            }
        }

        fn changed(&self) -> BoxFuture<'static, ()> {
            tokio::time::sleep(Duration::from_millis(5)).boxed()
        }
    }

    fn timing() -> Timing {
        putex_core::TimingConfig {
            renew: Duration::from_millis(100),
            failures: 3,
            confirm: 1,
            ..putex_core::TimingConfig::default()
        }
        .validate()
        .unwrap()
    }

    #[tokio::test]
    async fn a_renewal_that_lands_first_is_retried_against_unseen() {
        let store = AnyStore::from(MemoryStore::new());
        let t = Duration::from_secs(1);
        let tenure = store.create("lock.g", b"held", t).await.unwrap();
        // A renewal lands; the holder hears of it only 30 ms later.
        let renewed = store.update("lock.g", b"held", tenure, t).await.unwrap();
        let told = Arc::new(Told {
            epoch: tenure.epoch,
            revision: AtomicU64::new(tenure.revision),
        });
        let guard = Guard::of(
            store.clone(),
            "lock.g".into(),
            tenure,
            told.clone(),
            &timing(),
        );
        let tell = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            told.revision.store(renewed.revision, Ordering::SeqCst);
        });
        guard.put("k", b"v").await.unwrap();
        tell.await.unwrap();
        assert_eq!(get(&store, "k").await.unwrap(), Some(b"v".to_vec()));
    }

    #[tokio::test]
    async fn a_record_that_moved_and_no_news_is_not_held() {
        let store = AnyStore::from(MemoryStore::new());
        let t = Duration::from_secs(1);
        let tenure = store.create("lock.g", b"held", t).await.unwrap();
        // Someone else's write: the holder never hears of a newer record.
        store.update("lock.g", b"other", tenure, t).await.unwrap();
        let told = Arc::new(Told {
            epoch: tenure.epoch,
            revision: AtomicU64::new(tenure.revision),
        });
        let guard = Guard::of(store.clone(), "lock.g".into(), tenure, told, &timing());
        let started = tokio::time::Instant::now();
        let refused = guard.put("k", b"v").await;
        assert!(matches!(refused, Err(GuardError::NotHeld)), "{refused:?}");
        // Given up after T (300 ms here), not before.
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(get(&store, "k").await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_ended_tenure_sends_nothing() {
        let store = AnyStore::from(MemoryStore::new());
        let t = Duration::from_secs(1);
        let tenure = store.create("lock.g", b"held", t).await.unwrap();
        let told = Arc::new(Told {
            epoch: tenure.epoch,
            revision: AtomicU64::new(0),
        });
        let guard = Guard::of(store.clone(), "lock.g".into(), tenure, told, &timing());
        assert!(matches!(guard.delete("k").await, Err(GuardError::NotHeld)));
        let bad = guard.put("a b", b"v").await;
        assert!(matches!(bad, Err(GuardError::Invalid(_))), "{bad:?}");
        let big = guard.put("k", &vec![b'x'; MAX_VALUES + 1]).await;
        assert!(
            matches!(&big, Err(GuardError::Invalid(e)) if e.to_string().contains("at most 524288 bytes")),
            "{big:?}"
        );
    }
}
