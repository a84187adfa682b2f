//! `putex serve`: the HTTP lock gateway.
//!
//! Flags and `PUTEX_*` variables ([`ServeArgs`]) → validated settings
//! ([`ServeSettings`], errors name the flag) → the store, a bound listener
//! and [`crate::http::serve`] until SIGTERM or SIGINT. On the first signal
//! the server stops accepting, ends waiting lock requests and lets the
//! others finish for `--grace`; a second signal stops it at once.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use putex_core::timing::DEFAULT_MAX_DRIFT_PPM;
use putex_core::Drift;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::config::{hostname, parse_drift, parse_duration};
use super::CliError;
use crate::http::{self, AdminCredentials, AuthSettings, HttpOptions, Secret, TlsSettings};
use crate::locks::gateway::{Gateway, GatewayOptions, TIDY_EVERY};
use crate::shutdown::Shutdown;
use crate::store::{AnyStore, NodeId, StoreUrl};

/// The default `--listen`: loopback, on RDLM's port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8888";

/// The flags of `putex serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// The address to listen on (`0.0.0.0:8888` for every interface).
    #[arg(long, env = "PUTEX_LISTEN", default_value = DEFAULT_LISTEN, value_name = "ADDR")]
    pub listen: String,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
    /// This gateway's node id, written as the holder of its locks [default: the hostname].
    #[arg(long, env = "PUTEX_NODE")]
    pub node: Option<String>,
    /// The URL clients reach this server at, for the `Location` of a granted
    /// lock (e.g. behind a proxy) [default: built from --listen].
    #[arg(long, env = "PUTEX_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// The user name of the administrative calls (HTTP Basic).
    #[arg(
        long,
        env = "PUTEX_ADMIN_USER",
        value_name = "USER",
        requires = "admin_password_file"
    )]
    pub admin_user: Option<String>,
    /// A file holding the admin's password (one line).
    #[arg(
        long,
        env = "PUTEX_ADMIN_PASSWORD_FILE",
        value_name = "FILE",
        requires = "admin_user"
    )]
    pub admin_password_file: Option<PathBuf>,
    /// A file holding a bearer token every call but /health must present
    /// (`Authorization: Bearer TOKEN`).
    #[arg(long, env = "PUTEX_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The server's TLS certificate chain (PEM, leaf first); with --tls-key.
    #[arg(long, env = "PUTEX_TLS_CERT", value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, env = "PUTEX_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The longest lifetime a client may ask for.
    #[arg(long, env = "PUTEX_MAX_LIFETIME", value_parser = parse_duration, default_value = "1h", value_name = "DUR")]
    pub max_lifetime: Duration,
    /// The longest wait a client may ask for.
    #[arg(long, env = "PUTEX_MAX_WAIT", value_parser = parse_duration, default_value = "1h", value_name = "DUR")]
    pub max_wait: Duration,
    /// The lease the gateway acquires with before it grants a lock for its
    /// lifetime: the first request for a never-used resource waits about
    /// 1.2 times this (S4) unless the store proves the name unused that long
    /// (the embedded store, etcd: docs/stores.md), and after a store lost a record S4 protects
    /// holders only up to it (as --max-lease does for agents).
    #[arg(long, env = "PUTEX_ACQUIRE_LEASE", value_parser = parse_duration, default_value = "2s", value_name = "DUR")]
    pub acquire_lease: Duration,
    /// D: a granted lock's record advertises its lifetime + D, so takers
    /// wait that long; the answer must leave within D/2 of the grant (else
    /// the lock is given back and the client gets 503), which leaves D/2
    /// for it to reach the client.
    #[arg(long, env = "PUTEX_GRANT_DEADLINE", value_parser = parse_duration, default_value = "1s", value_name = "DUR")]
    pub grant_deadline: Duration,
    /// ε: clock-rate bound.
    #[arg(long, env = "PUTEX_MAX_DRIFT", value_parser = parse_drift,
          help = super::config::help_with_default("ε: clock-rate bound.",
              super::config::flag_drift(putex_core::timing::DEFAULT_MAX_DRIFT_PPM)))]
    pub max_drift: Option<f64>,
    /// How long requests in flight may take to finish after SIGTERM/SIGINT.
    #[arg(long, env = "PUTEX_GRACE", value_parser = parse_duration, default_value = "5s", value_name = "DUR")]
    pub grace: Duration,
}

/// The validated settings of `putex serve`.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    /// Where to listen.
    pub listen: SocketAddr,
    pub store: StoreUrl,
    pub gateway: GatewayOptions,
    pub http: HttpOptions,
}

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// The first line of a secret file; refuses an unreadable or empty file.
fn read_secret(flag: &str, path: &Path) -> Result<Secret, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("{flag} {}: cannot read it: {e}", path.display())))?;
    let line = text.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        return Err(usage(format!(
            "{flag} {}: the file is empty; put the secret on its first line",
            path.display()
        )));
    }
    Ok(Secret::new(line))
}

impl ServeArgs {
    /// The validated settings; errors name the flag.
    pub fn settings(&self) -> Result<ServeSettings, CliError> {
        let listen = self
            .listen
            .to_socket_addrs()
            .map_err(|e| {
                usage(format!(
                    "--listen {:?}: {e}; write e.g. 127.0.0.1:8888",
                    self.listen
                ))
            })?
            .next()
            .ok_or_else(|| usage(format!("--listen {:?}: no address", self.listen)))?;
        let store = match &self.store {
            Some(u) => StoreUrl::parse(u),
            None => StoreUrl::from_env(),
        }
        .map_err(|e| usage(format!("--store: {e}")))?;
        let node = NodeId::new(self.node.clone().unwrap_or_else(hostname))
            .map_err(|e| usage(format!("--node: {e}")))?;
        if self.max_lifetime.is_zero() {
            return Err(usage("--max-lifetime must be above 0"));
        }
        if self.grant_deadline < Duration::from_millis(10) {
            return Err(usage(
                "--grant-deadline must be at least 10ms: the answer to a grant must leave within half of it",
            ));
        }
        let public_url = self
            .public_url
            .as_deref()
            .map(http::parse_public_url)
            .transpose()
            .map_err(|e| usage(format!("--public-url: {e}")))?;
        let token = self
            .token_file
            .as_deref()
            .map(|p| read_secret("--token-file", p))
            .transpose()?;
        let admin = match (&self.admin_user, &self.admin_password_file) {
            (Some(user), Some(file)) => {
                if user.is_empty() || user.contains(':') {
                    return Err(usage(format!(
                        "--admin-user {user:?}: must be non-empty and without ':'"
                    )));
                }
                Some(AdminCredentials {
                    user: user.clone(),
                    password: read_secret("--admin-password-file", file)?,
                })
            }
            (None, None) => None,
            _ => return Err(usage("--admin-user and --admin-password-file go together")),
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(
                TlsSettings::from_pem_files(cert, key)
                    .map_err(|e| usage(format!("--tls-cert/--tls-key: {e}")))?,
            ),
            (None, None) => None,
            _ => return Err(usage("--tls-cert and --tls-key go together")),
        };
        Ok(ServeSettings {
            listen,
            store,
            gateway: GatewayOptions {
                node,
                max_drift: match self.max_drift {
                    Some(p) => Drift::from_percent(p),
                    None => Drift::from_ppm(DEFAULT_MAX_DRIFT_PPM),
                },
                max_lifetime: self.max_lifetime,
                max_wait: self.max_wait,
                acquire_lease: self.acquire_lease,
                grant_deadline: self.grant_deadline,
            },
            http: HttpOptions {
                public_url,
                auth: AuthSettings { token, admin },
                tls,
                grace: self.grace,
            },
        })
    }
}

/// `putex serve`.
pub async fn run(args: &ServeArgs) -> Result<(), CliError> {
    let settings = args.settings()?;
    raise_open_files();
    let shutdown = Shutdown::new();
    shutdown
        .on_signals()
        .map_err(|e| CliError::Other(format!("cannot install signal handlers: {e}")))?;
    let store = AnyStore::open(&settings.store)
        .await
        .map_err(|e| CliError::Store(format!("store {}: {e}", settings.store)))?;
    let listener = TcpListener::bind(settings.listen).await.map_err(|e| {
        CliError::Other(format!("--listen {}: cannot listen: {e}", settings.listen))
    })?;
    let gateway = Gateway::new(store, settings.gateway);
    tokio::spawn(tidy_grants(gateway.clone(), shutdown.graceful().clone()));
    let app = http::App::new(gateway, settings.http);
    let graceful = shutdown.graceful().clone();
    let stopping = async move {
        graceful.cancelled().await;
        tracing::info!("shutting down (a second signal stops at once)");
    };
    tokio::select! {
        r = http::serve(listener, app, stopping) => r.map_err(|e| CliError::Other(e.to_string())),
        () = shutdown.aborted().cancelled() => {
            tracing::warn!("second signal: stopping at once");
            Ok(())
        }
    }
}

/// Removes the grant records of ended locks now and every
/// [`TIDY_EVERY`] until `stop` ([`Gateway::forget_ended_grants`]).
async fn tidy_grants(gateway: Gateway, stop: CancellationToken) {
    let mut every = tokio::time::interval(TIDY_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        match gateway.forget_ended_grants().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "removed the grant records of ended locks"),
            Err(e) => tracing::debug!(error = %e, "cannot remove the grant records of ended locks"),
        }
    }
}

/// Lifts the soft limit on open files to the hard one: every waiting
/// request holds a connection, and the common soft limit of 1,024 would
/// refuse connections at about a thousand waiters (the hard limit is what
/// the operator allows; systemd's default is 524,288). Also for load
/// generators of the gateway.
pub fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit"),
        },
        Ok((soft, _)) => tracing::debug!(limit = soft, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeSettings, String> {
        let cli = Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.serve.settings().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let s = parse(&["--store", "sqlite:///tmp/x.db", "--node", "gw1"]).unwrap();
        assert_eq!(s.listen, "127.0.0.1:8888".parse().unwrap());
        assert_eq!(s.gateway.node, "gw1");
        assert_eq!(s.gateway.max_lifetime, Duration::from_secs(3600));
        assert_eq!(s.gateway.max_wait, Duration::from_secs(3600));
        assert_eq!(s.gateway.max_drift, Drift::from_percent(1.0));
        assert_eq!(
            s.gateway.grant_deadline,
            crate::locks::gateway::DEFAULT_GRANT_DEADLINE
        );
        assert!(s.http.tls.is_none() && s.http.auth.token.is_none());
    }

    #[test]
    fn errors_name_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let missing = dir.path().join("missing");
        let s = |p: &Path| p.display().to_string();
        for (args, flag) in [
            (vec!["--listen", "nonsense"], "--listen"),
            (vec!["--public-url", "locks.example.com"], "--public-url"),
            (vec!["--token-file", &s(&missing)], "--token-file"),
            (vec!["--token-file", &s(&empty)], "--token-file"),
            (
                vec!["--admin-user", "a", "--admin-password-file", &s(&missing)],
                "--admin-password-file",
            ),
            (vec!["--admin-user", "a"], "--admin-password-file"),
            (vec!["--tls-cert", &s(&missing)], "--tls-key"),
            (
                vec!["--tls-cert", &s(&missing), "--tls-key", &s(&missing)],
                "--tls-cert",
            ),
            (vec!["--max-wait", "soon"], "--max-wait"),
            (vec!["--max-lifetime", "0s"], "--max-lifetime"),
            (vec!["--grant-deadline", "0s"], "--grant-deadline"),
        ] {
            let mut all = vec!["--store", "sqlite:///tmp/x.db", "--node", "gw1"];
            all.extend(args.iter().copied());
            let e = parse(&all)
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn secrets_are_read_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "  s3cret  \nignored\n").unwrap();
        let p = token.display().to_string();
        let s = parse(&[
            "--store",
            "sqlite:///tmp/x.db",
            "--node",
            "gw1",
            "--token-file",
            &p,
        ])
        .unwrap();
        assert!(s.http.auth.token.is_some());
        assert!(!format!("{:?}", s.http.auth).contains("s3cret"));
    }
}
