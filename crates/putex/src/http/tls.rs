//! TLS for `putex serve`: the certificate and key from PEM files, and a
//! listener that hands axum finished TLS connections.
//!
//! It uses the rustls stack with the `ring` provider that async-nats already
//! brings, so putex carries one crypto library. Handshakes run in tasks of
//! their own, with a deadline, so that one slow or silent client cannot hold
//! up the accept loop.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the TLS configuration could not be built; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The certificate or key file, as given.
        path: PathBuf,
        /// What reading it failed with.
        source: io::Error,
    },
    /// The certificate file holds no usable PEM certificate.
    #[error("{}: no PEM certificate in it ({reason})", path.display())]
    Certificate {
        /// The certificate file, as given.
        path: PathBuf,
        /// What the PEM parser said.
        reason: String,
    },
    /// The key file holds no usable PEM private key.
    #[error("{}: no PEM private key in it ({reason})", path.display())]
    Key {
        /// The key file, as given.
        path: PathBuf,
        /// What the PEM parser said.
        reason: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("the certificate and key are not usable together: {0}")]
    Config(#[from] rustls::Error),
}

/// A server TLS configuration for HTTP/1.1.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    config: Arc<ServerConfig>,
}

impl TlsSettings {
    /// Loads a PEM certificate chain (leaf first) and its PEM private key
    /// (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<TlsSettings, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate {
                path: cert.to_owned(),
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::Certificate {
                path: cert.to_owned(),
                reason: "the file has no CERTIFICATE block".into(),
            });
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Key {
            path: key.to_owned(),
            reason: e.to_string(),
        })?;
        Self::from_der(chain, key)
    }

    /// A configuration from DER certificates and key.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsSettings, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        // The server speaks HTTP/1.1 only (axum's `http1` feature).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsSettings {
            config: Arc::new(config),
        })
    }
}

/// A listener of finished TLS connections, for `axum::serve`.
///
/// A background task accepts TCP connections and runs each handshake in a
/// task of its own (bounded by [`HANDSHAKE_TIMEOUT`]); finished streams
/// come out of [`axum::serve::Listener::accept`]. Shutdown, or dropping
/// the listener, stops the accept task.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `listener` until `shutdown` is cancelled; then the TCP
    /// listener is closed, so new connections are refused at once.
    pub(crate) fn new(
        listener: TcpListener,
        tls: &TlsSettings,
        shutdown: CancellationToken,
    ) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(tls.config.clone());
        let (tx, rx) = mpsc::channel(64);
        let accept_task = tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => return,
                    a = listener.accept() => a,
                };
                let (tcp, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off
                        // instead of spinning.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            rx,
            local,
            accept_task,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ended (it never does on its own): no more
            // connections, ever.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
