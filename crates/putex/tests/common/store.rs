//! The store of a test that runs on more than one: a fresh nats-server, a
//! fresh single-member etcd or a fresh SQLite file, kept for the test and
//! stopped (or removed) with it.

use std::net::SocketAddr;

use putex::store::{AnyStore, SqliteStore, StoreUrl};

use super::etcd_server::EtcdServer;
use super::nats_server::NatsServer;

/// A test's store server (or SQLite file).
pub enum Backend {
    Nats(NatsServer),
    Etcd(Box<EtcdServer>),
    /// The directory of the store's file, `s.db`.
    Sqlite(tempfile::TempDir),
}

impl Backend {
    pub fn nats() -> Backend {
        Backend::Nats(NatsServer::start())
    }

    pub fn etcd() -> Backend {
        Backend::Etcd(Box::new(EtcdServer::start()))
    }

    pub fn sqlite() -> Backend {
        Backend::Sqlite(tempfile::tempdir().unwrap())
    }

    /// The store URL (`putex lock --store`, `putex status --store`).
    pub fn url(&self) -> String {
        match self {
            Backend::Nats(s) => s.url.clone(),
            Backend::Etcd(s) => format!("etcd://{}", s.endpoint()),
            Backend::Sqlite(dir) => format!("sqlite://{}", dir.path().join("s.db").display()),
        }
    }

    /// The server's client address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Backend::Nats(s) => format!("127.0.0.1:{}", s.port()).parse().unwrap(),
            Backend::Etcd(s) => s.endpoint().parse().unwrap(),
            Backend::Sqlite(_) => panic!("an SQLite store has no address"),
        }
    }

    /// The store URL through a proxy listening on `addr`.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        match self {
            Backend::Nats(_) => format!("nats://{addr}"),
            Backend::Etcd(_) => format!("etcd://{addr}"),
            Backend::Sqlite(_) => panic!("an SQLite store has no address"),
        }
    }

    /// A store handle of its own.
    pub async fn open(&self) -> AnyStore {
        match self {
            Backend::Sqlite(dir) => {
                AnyStore::from(SqliteStore::open(dir.path().join("s.db")).await.unwrap())
            }
            _ => AnyStore::open(&StoreUrl::parse(&self.url()).unwrap())
                .await
                .unwrap(),
        }
    }

    /// Freezes the server (SIGSTOP): calls get no answer.
    pub fn pause(&self) {
        match self {
            Backend::Nats(s) => s.pause(),
            Backend::Etcd(s) => s.pause(),
            Backend::Sqlite(_) => panic!("an SQLite store has no server to pause"),
        }
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        match self {
            Backend::Nats(s) => s.resume(),
            Backend::Etcd(s) => s.resume(),
            Backend::Sqlite(_) => panic!("an SQLite store has no server to resume"),
        }
    }

    /// Kills the server (SIGKILL, as a crash).
    pub fn kill(&mut self) {
        match self {
            Backend::Nats(s) => s.kill(),
            Backend::Etcd(s) => s.kill(),
            Backend::Sqlite(_) => panic!("an SQLite store has no server to kill"),
        }
    }

    /// Starts the server again on its port and data (killing it first if
    /// it runs); returns once it listens (nats-server) or once it is
    /// healthy (etcd).
    pub fn restart(&mut self) {
        match self {
            Backend::Nats(s) => s.restart(),
            Backend::Etcd(s) => s.restart(),
            Backend::Sqlite(_) => panic!("an SQLite store has no server to restart"),
        }
    }

    /// A suffix for the tags of test services' `sleep` arguments: a service
    /// a failed test leaves behind on one store is never taken for another
    /// store's.
    pub fn tag(&self) -> &'static str {
        match self {
            Backend::Nats(_) => "",
            Backend::Etcd(_) => "7",
            Backend::Sqlite(_) => "5",
        }
    }
}
