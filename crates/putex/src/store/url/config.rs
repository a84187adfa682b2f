//! What a store URL names, store by store: how to reach a NATS bucket or
//! an etcd cluster, with the credentials and TLS settings its options
//! gave. Plain data: every value in them has been checked by the parser.

use std::path::PathBuf;

/// How to reach an etcd cluster.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EtcdConfig {
    /// `host:port` of each member to try.
    pub endpoints: Vec<String>,
    /// The key prefix (`prefix=`, default
    /// [`DEFAULT_ETCD_PREFIX`](super::DEFAULT_ETCD_PREFIX)): every record is
    /// stored under `<prefix>/`.
    pub prefix: String,
    /// User and password (etcd's password authentication), if any.
    pub user: Option<(String, String)>,
    /// TLS: the same settings as NATS's (`tls=true`, `tls_ca`, `tls_cert`,
    /// `tls_key`); a client certificate authenticates as its common name.
    pub tls: NatsTls,
}

/// How to reach a NATS bucket.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NatsConfig {
    /// `host:port` of each seed server.
    pub servers: Vec<String>,
    /// The KV bucket's name (`bucket=`, default
    /// [`DEFAULT_BUCKET`](super::DEFAULT_BUCKET)): only `A-Z a-z 0-9 _ -`.
    pub bucket: String,
    /// Replicas for a bucket that putex creates.
    pub replicas: usize,
    /// Credentials, from the user-info or the options (or `NATS_CREDS`,
    /// see [`StoreUrl::from_env`](super::StoreUrl::from_env)).
    pub auth: NatsAuth,
    /// Whether TLS is required, and its files.
    pub tls: NatsTls,
}

/// NATS credentials: at most one kind.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// A `.creds` file (JWT and nkey seed): `creds=`, or `NATS_CREDS`.
    Creds(PathBuf),
    /// An nkey seed (`nkey=`).
    Nkey(String),
    /// User and password (`nats://user:password@host` or `user=` and
    /// `password=`).
    UserPassword {
        /// The user name, percent-decoded.
        user: String,
        /// The password, percent-decoded; may be empty.
        password: String,
    },
    /// A token (`token=`, or user-info without a colon:
    /// `nats://token@host`).
    Token(String),
}

/// NATS TLS settings.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct NatsTls {
    /// Require TLS (`tls://` or `tls=true`, implied by any file below).
    pub required: bool,
    /// CA certificates to trust (`tls_ca=`).
    pub ca: Option<PathBuf>,
    /// Client certificate (`tls_cert=`, with `key`).
    pub cert: Option<PathBuf>,
    /// Client key (`tls_key=`, with `cert`).
    pub key: Option<PathBuf>,
}
