//! Opening the etcd store: connecting (password or client certificate,
//! TLS) and settling the epoch record.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::calls::{client_error, retry_unsent};
use super::client::{self, Client, Options};
use super::{pb, Clock, EpochRecord, EtcdStore, Inner, EPOCH_KEY, OPEN_TIMEOUT};
use crate::store::hub::Hub;
use crate::store::url::EtcdConfig;
use crate::store::{wall_nanos, Op, StoreError};

impl EtcdStore {
    /// Connects to the cluster and reads (or, at first use, writes) the
    /// epoch record under the prefix.
    pub async fn open(cfg: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let where_ = cfg.endpoints.join(",");
        match tokio::time::timeout(OPEN_TIMEOUT, Self::open_inner(cfg)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::unknown(
                Op::Open,
                &where_,
                format_args!("etcd did not answer within {OPEN_TIMEOUT:?}"),
            )),
        }
    }

    async fn open_inner(cfg: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        let where_ = cfg.endpoints.join(",");
        // Every call asks for a member with a raft leader (`client.rs`):
        // one cut off from the quorum refuses at once ("no leader") instead
        // of holding reads and writes it cannot serve until the caller's
        // deadline, and cancels its watches after a few election timeouts
        // without one, so the feed starts again elsewhere. With a user,
        // the client signs in again when etcd's token expired (unused for
        // --auth-token-ttl, 300 s by default, at a member's restart, or at
        // its TTL with JWT): a call refused for an expired token ("invalid
        // auth token", checked before anything is proposed) is made once
        // more, instead of failing as a configuration error.
        let options = Options {
            connect_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_timeout: Duration::from_secs(5),
            user: cfg.user.clone(),
            tls: if cfg.tls.required {
                Some(tls_options(cfg)?)
            } else {
                None
            },
        };
        // Signing in (with a password) asks one member, which may have no
        // leader: asked again like any call refused before it was taken.
        let client = retry_unsent(|| Client::connect(&cfg.endpoints, &options))
            .await
            .map_err(|e| match client_error(Op::Open, &where_, e) {
                StoreError::Unknown { reason, .. } => {
                    StoreError::unknown(Op::Open, &where_, format_args!("cannot connect: {reason}"))
                }
                other => other,
            })?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                prefix: format!("{}/", cfg.prefix),
                epoch: AtomicU64::new(0),
                epoch_record: parking_lot::Mutex::new((0, Vec::new())),
                cluster: AtomicU64::new(0),
                epoch_stale: AtomicBool::new(true),
                clock: Clock::new(),
                seen: super::vacancy::FeedSeen::new(),
                hub: Hub::new(),
                starting: tokio::sync::Mutex::new(None),
            }),
        };
        let (status, epoch) = tokio::join!(
            store.inner.client.status(),
            store.ensure_epoch(Op::Open, &where_)
        );
        epoch?;
        // A member too old is refused; a status we may not read is no
        // reason to refuse (the epoch read worked).
        if let Ok(status) = status {
            let version = status.version.as_str();
            if parse_version(version).is_some_and(|v| v < MIN_SERVER) {
                return Err(StoreError::config(format!(
                    "etcd at {where_} is version {version}; putex needs etcd >= {}.{}",
                    MIN_SERVER.0, MIN_SERVER.1
                )));
            }
            if ["3.5.0", "3.5.1", "3.5.2"].contains(&version) {
                tracing::warn!(
                    version,
                    "etcd 3.5.0-3.5.2 can lose data consistency when members crash under load (fixed in 3.5.3): upgrade before production"
                );
            }
        }
        Ok(store)
    }

    /// Reads the epoch record and the cluster id; writes the record at
    /// first use, and a later epoch when the record was written by another
    /// cluster (a snapshot restored as a new cluster).
    pub(super) async fn ensure_epoch(&self, op: Op, about: &str) -> Result<(), StoreError> {
        let key = self.full(EPOCH_KEY);
        let client = &self.inner.client;
        let read = pb::RangeRequest {
            key: key.clone().into_bytes(),
            ..Default::default()
        };
        for _ in 0..5 {
            let resp = retry_unsent(|| client.range(read.clone()))
                .await
                .map_err(|e| client_error(op, about, e))?;
            let cluster = resp.header.as_ref().map_or(0, |h| h.cluster_id);
            let (compare, epoch) = match resp.kvs.first() {
                None => (client::create_revision_is(key.clone(), 0), wall_nanos()),
                Some(e) => {
                    let record: EpochRecord = serde_json::from_slice(&e.value).map_err(|err| {
                        StoreError::config(format!(
                            "the etcd record {key} is not putex's epoch record ({err}); is the prefix used by something else? Choose another with prefix="
                        ))
                    })?;
                    if record.cluster == cluster {
                        self.set_epoch(record.epoch, &e.value);
                        self.inner.cluster.store(cluster, Ordering::Release);
                        self.inner.epoch_stale.store(false, Ordering::Release);
                        return Ok(());
                    }
                    // Written by another cluster: its revisions are not
                    // ours; a later epoch makes our tokens compare higher.
                    tracing::warn!(
                        key,
                        was = format_args!("{:x}", record.cluster),
                        now = format_args!("{cluster:x}"),
                        "the etcd cluster is not the one that wrote the epoch record (restored from a snapshot?): starting a new epoch"
                    );
                    (
                        client::mod_revision_is(key.clone(), e.mod_revision),
                        wall_nanos().max(record.epoch + 1),
                    )
                }
            };
            let value = serde_json::to_vec(&EpochRecord {
                v: 1,
                epoch,
                cluster,
            })
            .expect("serialisable");
            let txn = client::txn([compare], [client::put_op(key.clone(), value, 0)], []);
            // Won or lost, the next round reads what stands.
            retry_unsent(|| client.txn(txn.clone()))
                .await
                .map_err(|e| client_error(op, about, e))?;
        }
        Err(StoreError::unknown(
            op,
            about,
            "the etcd epoch record kept changing while it was read",
        ))
    }
}

/// The oldest etcd putex runs against.
pub const MIN_SERVER: (u64, u64) = (3, 5);

/// `major.minor` of an etcd version string (`3.5.1`).
fn parse_version(v: &str) -> Option<(u64, u64)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// TLS settings from the URL's files; without `tls_ca`, the system's roots.
fn tls_options(cfg: &EtcdConfig) -> Result<ClientTlsConfig, StoreError> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            StoreError::config(format!("etcd {what}: cannot read {}: {e}", path.display()))
        })
    };
    let mut tls = ClientTlsConfig::new();
    match &cfg.tls.ca {
        Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(read("tls_ca", ca)?)),
        None => tls = tls.with_native_roots(),
    }
    if let (Some(cert), Some(key)) = (&cfg.tls.cert, &cfg.tls.key) {
        tls = tls.identity(Identity::from_pem(
            read("tls_cert", cert)?,
            read("tls_key", key)?,
        ));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions() {
        assert_eq!(super::parse_version("3.5.1"), Some((3, 5)));
        assert_eq!(super::parse_version("3.4.23"), Some((3, 4)));
        assert!(super::parse_version("3.4.23").unwrap() < super::MIN_SERVER);
        assert_eq!(super::parse_version("x"), None);
    }
}
