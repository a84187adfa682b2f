//! The store contract (`docs/stores.md`) and its backends.
//!
//! Every lock decision in putex rests on one primitive: a compare-and-swap
//! on a record in a store. This module says what a store must offer and how
//! its answers are classified; the backends implement it:
//!
//! | backend | for | module |
//! |---|---|---|
//! | NATS JetStream KV | production: one bucket shared by every host | [`nats`] |
//! | SQLite file | the zero-setup default: processes on one machine | [`sqlite`] |
//! | etcd | production, where an etcd cluster already runs | [`etcd`] |
//! | memory | tests: handles in one process, with fault injection | [`memory`] |
//!
//! Callers hold an [`AnyStore`], opened from a store URL ([`StoreUrl`]), and
//! use it through the [`Store`] trait.
//!
//! # Outcomes
//!
//! Every operation takes a deadline and ends in exactly one of:
//!
//! - success, with the [`Token`] (epoch, revision) of the write or the entry read;
//! - [`StoreError::Conflict`]: the write was **definitely not applied** (the
//!   record was not at the expected revision, or already existed);
//! - [`StoreError::Unknown`]: timed out or lost the connection — the write
//!   **may or may not** have been applied (a timeout is never a conflict);
//! - [`StoreError::Config`]: a problem retrying will not fix (bad URL, bad
//!   key, unfit bucket, server too old, unreadable file).
//!
//! [`StoreError::outcome`] maps these onto the core's
//! [`StoreOutcome`](putex_core::store::StoreOutcome) classes.
//!
//! # Keys
//!
//! See [`keys`]: `lock.<name>`, `member.<name>.<node>`, `probe.<node>`.
//! Names are `[A-Za-z0-9_-]{1,64}`; node ids may be FQDNs.

use std::time::Duration;

pub use putex_core::store::{Entry, StoreGap, StoreTime, Token};

mod contract;
pub mod etcd;
mod hub;
pub mod keys;
pub(crate) mod measure;
pub mod memory;
mod names;
pub mod nats;
pub mod sqlite;
pub mod url;

pub use self::url::StoreUrl;
pub use etcd::EtcdStore;
pub use measure::MeasureError;
pub use memory::MemoryStore;
pub use names::{Name, NameError, NodeId};
pub use nats::NatsStore;
pub use sqlite::SqliteStore;

pub(crate) use self::contract::{boot_time_now, check_guarded, fnv1a, wall_nanos, with_deadline};
pub use self::contract::{
    read_prefix, snapshot_synced, Created, Op, ReadMode, Store, StoreError, WatchEvent,
    WatchStream, Write, RETIRED_KEPT,
};

/// Any backend, so that callers can hold one concrete type.
#[derive(Clone, Debug)]
pub enum AnyStore {
    /// NATS JetStream KV (`nats://…` or `tls://…`).
    Nats(NatsStore),
    /// The embedded SQLite store (`sqlite:` or `sqlite:///abs/path.db`).
    Sqlite(SqliteStore),
    /// etcd (`etcd://…`).
    Etcd(EtcdStore),
    /// The in-process store (`memory:`).
    Memory(MemoryStore),
}

impl AnyStore {
    /// Opens the store a URL names (see [`StoreUrl`]).
    pub async fn open(url: &StoreUrl) -> Result<AnyStore, StoreError> {
        Ok(match url {
            StoreUrl::Nats(cfg) => AnyStore::Nats(NatsStore::open(cfg).await?),
            StoreUrl::Sqlite { path } => AnyStore::Sqlite(SqliteStore::open(path.clone()).await?),
            StoreUrl::Etcd(cfg) => AnyStore::Etcd(EtcdStore::open(cfg).await?),
            StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
        })
    }

    /// Opens the store named by the environment (see [`StoreUrl::from_env`]).
    pub async fn from_env() -> Result<AnyStore, StoreError> {
        AnyStore::open(&StoreUrl::from_env()?).await
    }

    /// The backend's name, for logs: `nats`, `sqlite`, `etcd` or `memory`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStore::Nats(_) => "nats",
            AnyStore::Sqlite(_) => "sqlite",
            AnyStore::Etcd(_) => "etcd",
            AnyStore::Memory(_) => "memory",
        }
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(s: MemoryStore) -> Self {
        AnyStore::Memory(s)
    }
}

impl From<SqliteStore> for AnyStore {
    fn from(s: SqliteStore) -> Self {
        AnyStore::Sqlite(s)
    }
}

impl From<EtcdStore> for AnyStore {
    fn from(s: EtcdStore) -> Self {
        AnyStore::Etcd(s)
    }
}

impl From<NatsStore> for AnyStore {
    fn from(s: NatsStore) -> Self {
        AnyStore::Nats(s)
    }
}

/// Calls the backend. Its future is boxed: a backend's call (NATS's above
/// all) is kilobytes of state, and every future that awaits a store call
/// would otherwise carry it inline for its whole life — a thousand waiting
/// gateway requests or ten thousand leases, each holding a driver whose
/// state machine is as large as its largest store call. One allocation per
/// call is nothing beside a round trip.
macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Nats($s) => Box::pin($call).await,
            AnyStore::Sqlite($s) => Box::pin($call).await,
            AnyStore::Etcd($s) => Box::pin($call).await,
            AnyStore::Memory($s) => Box::pin($call).await,
        }
    };
}

impl Store for AnyStore {
    fn times_are_first_seen(&self) -> bool {
        matches!(self, AnyStore::Etcd(_))
    }

    fn epoch(&self) -> u64 {
        match self {
            AnyStore::Nats(s) => s.epoch(),
            AnyStore::Sqlite(s) => s.epoch(),
            AnyStore::Etcd(s) => s.epoch(),
            AnyStore::Memory(s) => s.epoch(),
        }
    }

    async fn get(
        &self,
        key: &str,
        mode: ReadMode,
        timeout: Duration,
    ) -> Result<Option<Entry>, StoreError> {
        delegate!(self, s => s.get(key, mode, timeout))
    }

    async fn create(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        delegate!(self, s => s.create(key, value, timeout))
    }

    async fn create_vacant(
        &self,
        key: &str,
        value: &[u8],
        timeout: Duration,
    ) -> Result<Created, StoreError> {
        delegate!(self, s => s.create_vacant(key, value, timeout))
    }

    async fn update(
        &self,
        key: &str,
        value: &[u8],
        expected: Token,
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        delegate!(self, s => s.update(key, value, expected, timeout))
    }

    async fn put(&self, key: &str, value: &[u8], timeout: Duration) -> Result<Token, StoreError> {
        delegate!(self, s => s.put(key, value, timeout))
    }

    async fn delete(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.delete(key, expected, timeout))
    }

    async fn retire(
        &self,
        key: &str,
        expected: Token,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.retire(key, expected, timeout))
    }

    async fn guarded(
        &self,
        guard_key: &str,
        guard: Token,
        writes: &[Write],
        timeout: Duration,
    ) -> Result<Token, StoreError> {
        delegate!(self, s => s.guarded(guard_key, guard, writes, timeout))
    }

    async fn watch(
        &self,
        filter: &str,
        from_revision: Option<u64>,
        timeout: Duration,
    ) -> Result<WatchStream, StoreError> {
        delegate!(self, s => s.watch(filter, from_revision, timeout))
    }
}

impl AnyStore {
    /// What tells this handle apart from every other open one; its clones
    /// share it (and its change feed).
    pub(crate) fn handle_id(&self) -> usize {
        match self {
            AnyStore::Nats(s) => s.handle_id(),
            AnyStore::Sqlite(s) => s.handle_id(),
            AnyStore::Etcd(s) => s.handle_id(),
            AnyStore::Memory(s) => s.handle_id(),
        }
    }

    /// The step in which the store's clock reads: whole seconds on etcd
    /// (a lease's TTL, see [`etcd`]), zero (fine enough) elsewhere. The
    /// store-clock witness (S1 b) can agree up to two steps late.
    pub fn clock_step(&self) -> Duration {
        match self {
            AnyStore::Etcd(_) => etcd::CLOCK_STEP,
            _ => Duration::ZERO,
        }
    }

    /// Tells the handle that the process exits soon (a one-shot command
    /// whose work is done but for a few writes): it lets go now of what
    /// would cost time to let go at the exit. On SQLite the change feed
    /// removes its inotify watch of the `-wal` file — the kernel frees one
    /// only after a grace period, which a process closing it at its exit
    /// waits for (7–15 ms) — and its watches learn of other processes'
    /// writes from its poll ([`sqlite::WATCH_POLL`]) from then on. Watches
    /// stay correct, only slower; other stores ignore it.
    pub fn prepare_exit(&self) {
        if let AnyStore::Sqlite(s) = self {
            s.prepare_exit();
        }
    }

    /// Warnings about how the store is run, for `putex check` and an
    /// agent's start: on etcd, a cluster that keeps its whole history
    /// ([`EtcdStore::history_warning_from`]). Empty elsewhere, and when
    /// the store cannot be asked.
    pub async fn warnings(&self) -> Vec<String> {
        match self {
            AnyStore::Etcd(s) => s
                .history_warning_from(etcd::HISTORY_WARNING_REVISIONS)
                .await
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// How many watches this handle serves: they all share its one change
    /// feed (the memory store, for tests, gives each its own).
    pub fn watches(&self) -> usize {
        match self {
            AnyStore::Nats(s) => s.watches(),
            AnyStore::Sqlite(s) => s.watches(),
            AnyStore::Etcd(s) => s.watches(),
            AnyStore::Memory(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_core_outcomes() {
        use putex_core::store::StoreOutcome;
        assert_eq!(
            StoreError::conflict(Op::Update, "lock.a").outcome(),
            StoreOutcome::Conflict
        );
        assert_eq!(
            StoreError::timed_out(Op::Update, "lock.a", Duration::from_millis(5)).outcome(),
            StoreOutcome::Unknown
        );
        assert!(matches!(
            StoreError::config("x").outcome(),
            StoreOutcome::Failed(_)
        ));
    }

    /// An unknown outcome speaks of a write only for a call that writes:
    /// `putex status` against a store that is down must not say that "a
    /// write may or may not have been applied".
    #[test]
    fn an_unknown_outcome_mentions_a_write_only_for_writes() {
        let reading = StoreError::timed_out(Op::Open, "127.0.0.1:4222", Duration::from_secs(5));
        assert_eq!(
            reading.to_string(),
            "open 127.0.0.1:4222: store unavailable (no answer within 5s)"
        );
        let writing = StoreError::timed_out(Op::Update, "lock.a", Duration::from_secs(1));
        assert!(writing
            .to_string()
            .ends_with("a write may or may not have been applied"));
    }

    #[test]
    fn boot_time_moves_forward_in_one_era() {
        let a = boot_time_now();
        let b = boot_time_now();
        assert_eq!(a.era, b.era);
        assert!(b.nanos >= a.nanos);
        assert_ne!(a.era, 0);
    }

    #[test]
    fn fnv_is_stable() {
        // Other processes (and other putex versions) must derive the same era.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
