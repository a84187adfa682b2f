//! Store URLs: which store to open, parsed once, with errors that say what
//! is wrong and show a URL that works.
//!
//! | URL | store |
//! |---|---|
//! | `sqlite:` | the embedded store at the default path ([`default_sqlite_path`]) |
//! | `sqlite:///abs/path.db` | the embedded store in that file |
//! | `nats://host:port[,host2:port...][?options]` | NATS JetStream KV |
//! | `tls://host:port[...]` | the same, TLS required |
//! | `etcd://host:port[,host2:port...][?options]` | etcd (v3 API) |
//! | `memory:` | an in-process store (tests) |
//!
//! NATS options (query keys): `bucket` (default `putex`), `replicas`
//! (default 1; 3 or 5 in production), `creds` (a `.creds` file), `nkey` (a
//! seed), `user` and `password`, `token`, `tls_ca`, `tls_cert` and
//! `tls_key` (file paths; `tls_cert` needs `tls_key`), `tls=true`. User and
//! password may also come as `nats://user:password@host:port`, a token as
//! `nats://token@host:port` (user-info without a colon, as the NATS clients
//! read it). Values are percent-decoded.
//!
//! etcd options: `prefix` (default `putex`: records live under `putex/`),
//! `user` and `password` (or `etcd://user:password@host`), `tls=true`,
//! `tls_ca`, `tls_cert` and `tls_key` (client certificate authentication;
//! any of the three implies TLS). The port defaults to 2379.
//!
//! Environment ([`StoreUrl::from_env`]): `PUTEX_STORE` is the URL; without
//! it `NATS_URL` (a NATS server list) selects NATS; without either the
//! default is `sqlite:`. `NATS_CREDS` names a credentials file for a NATS
//! URL that carries no credentials of its own.
//!
//! The code: `url/parse.rs` parses each kind of URL, `url/config.rs` holds
//! what a NATS or etcd URL names, and `url/redact.rs` keeps the secrets out
//! of every error.

mod config;
mod parse;
mod redact;

use std::fmt;
use std::path::PathBuf;

use super::StoreError;
use parse::{parse_etcd, parse_nats, parse_sqlite};
use redact::{bad, is_scheme};

pub use config::{EtcdConfig, NatsAuth, NatsConfig, NatsTls};
pub use parse::default_sqlite_path;

/// A NATS URL that works, shown in error messages.
pub const NATS_EXAMPLE: &str =
    "nats://10.0.0.1:4222,10.0.0.2:4222,10.0.0.3:4222?bucket=putex&replicas=3&creds=/etc/putex/nats.creds";
/// An etcd URL that works, shown in error messages.
pub const ETCD_EXAMPLE: &str =
    "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379?prefix=putex&tls_ca=/etc/putex/etcd-ca.pem";
/// The key prefix an etcd URL without `prefix=` names.
pub const DEFAULT_ETCD_PREFIX: &str = "putex";
/// An SQLite URL that works, shown in error messages.
pub const SQLITE_EXAMPLE: &str = "sqlite:///var/lib/putex/store.db";

/// The NATS KV bucket a URL without `bucket=` names.
pub const DEFAULT_BUCKET: &str = "putex";

/// A parsed store URL: what [`StoreUrl::parse`] makes of the text, and
/// what [`AnyStore::open`](super::AnyStore::open) opens. Its `Display`
/// form hides every secret.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreUrl {
    /// NATS JetStream KV.
    Nats(NatsConfig),
    /// The embedded SQLite store in this file.
    Sqlite {
        /// An absolute path, percent-decoded from `sqlite:///…`, or
        /// [`default_sqlite_path`] for a bare `sqlite:`.
        path: PathBuf,
    },
    /// etcd, through its v3 gRPC API.
    Etcd(EtcdConfig),
    /// An in-process store, private to this handle and its clones.
    Memory,
}

impl StoreUrl {
    /// Parses a store URL (the forms are in the [module docs](self)); an
    /// error quotes the URL without its secrets and shows one that works.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(bad(
                url,
                "it has no scheme (sqlite:, nats://, tls://, etcd:// or memory:)",
                NATS_EXAMPLE,
            ));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => parse_sqlite(url, rest),
            "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
            "memory" => Err(bad(url, "memory: takes nothing after the colon", "memory:")),
            "nats" | "tls" => parse_nats(url, scheme, rest),
            "etcd" => parse_etcd(url, rest),
            other if is_scheme(other) => Err(bad(
                url,
                format_args!(
                    "unknown scheme {other:?} (use sqlite:, nats://, tls://, etcd:// or memory:)"
                ),
                NATS_EXAMPLE,
            )),
            // Not a scheme at all (it may hold a secret: `user:pass@host`).
            _ => Err(bad(
                url,
                "it has no scheme (sqlite:, nats://, tls://, etcd:// or memory:)",
                NATS_EXAMPLE,
            )),
        }
    }

    /// The step in which this kind of store's clock reads
    /// ([`AnyStore::clock_step`](super::AnyStore::clock_step)), known
    /// without opening it: `putex check` prints the bound of an etcd store
    /// it cannot reach with etcd's witness delay.
    pub fn clock_step(&self) -> std::time::Duration {
        match self {
            StoreUrl::Etcd(_) => super::etcd::CLOCK_STEP,
            _ => std::time::Duration::ZERO,
        }
    }

    /// The store the environment names: `PUTEX_STORE`, else `NATS_URL`,
    /// else `sqlite:`; `NATS_CREDS` fills in NATS credentials.
    pub fn from_env() -> Result<StoreUrl, StoreError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self::from_vars(var("PUTEX_STORE"), var("NATS_URL"), var("NATS_CREDS"))
    }

    fn from_vars(
        putex_store: Option<String>,
        nats_url: Option<String>,
        nats_creds: Option<String>,
    ) -> Result<StoreUrl, StoreError> {
        let mut url = match (putex_store, nats_url) {
            (Some(u), _) => StoreUrl::parse(&u)?,
            (None, Some(n)) if n.contains("://") => StoreUrl::parse(&n)?,
            (None, Some(n)) => StoreUrl::parse(&format!("nats://{n}"))?,
            (None, None) => StoreUrl::parse("sqlite:")?,
        };
        if let (StoreUrl::Nats(cfg), Some(creds)) = (&mut url, nats_creds) {
            if cfg.auth == NatsAuth::None {
                cfg.auth = NatsAuth::Creds(PathBuf::from(creds));
            }
        }
        Ok(url)
    }
}

impl fmt::Display for StoreUrl {
    /// The URL without secrets, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite { path } => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Etcd(c) => {
                write!(f, "etcd://{}?prefix={}", c.endpoints.join(","), c.prefix)?;
                if let Some((user, _)) = &c.user {
                    write!(f, "&user={user}&password=***")?;
                }
                if c.tls.required {
                    f.write_str("&tls=true")?;
                }
                Ok(())
            }
            StoreUrl::Nats(c) => {
                let scheme = if c.tls.required { "tls" } else { "nats" };
                write!(f, "{scheme}://{}?bucket={}", c.servers.join(","), c.bucket)?;
                if c.replicas != 1 {
                    write!(f, "&replicas={}", c.replicas)?;
                }
                match &c.auth {
                    NatsAuth::None => Ok(()),
                    NatsAuth::Creds(p) => write!(f, "&creds={}", p.display()),
                    NatsAuth::Nkey(_) => f.write_str("&nkey=***"),
                    NatsAuth::UserPassword { user, .. } => write!(f, "&user={user}&password=***"),
                    NatsAuth::Token(_) => f.write_str("&token=***"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nats(url: &str) -> NatsConfig {
        match StoreUrl::parse(url).unwrap() {
            StoreUrl::Nats(c) => c,
            other => panic!("{other:?}"),
        }
    }

    fn err(url: &str) -> String {
        StoreUrl::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn nats_urls() {
        let c = nats("nats://a:4222,b:5222,c?bucket=locks&replicas=3&creds=/x/y.creds");
        assert_eq!(c.servers, ["a:4222", "b:5222", "c:4222"]);
        assert_eq!(c.bucket, "locks");
        assert_eq!(c.replicas, 3);
        assert_eq!(c.auth, NatsAuth::Creds("/x/y.creds".into()));
        assert!(!c.tls.required);

        // A list of whole URLs, as NATS_URL and the nats CLI take it.
        let c = nats("nats://a:4222,nats://b:5222,nats://c?bucket=locks");
        assert_eq!(c.servers, ["a:4222", "b:5222", "c:4222"]);
        assert_eq!(c.bucket, "locks");
        let c = nats("tls://u:p@a,tls://u:p@b");
        assert_eq!(c.servers, ["a:4222", "b:4222"]);
        assert!(c.tls.required);
        assert_eq!(
            c.auth,
            NatsAuth::UserPassword {
                user: "u".into(),
                password: "p".into()
            }
        );
        let msg = err("nats://u:hunter2@a,nats://v:q@b");
        assert!(msg.contains("credentials of the first"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(err("nats://u:p@a,nats://b").contains("credentials of the first"));

        let c = nats("nats://u%40x:p%26w@h:1");
        assert_eq!(
            c.auth,
            NatsAuth::UserPassword {
                user: "u@x".into(),
                password: "p&w".into()
            }
        );
        assert_eq!(c.bucket, "putex");

        let c = nats("tls://h:1?tls_ca=/ca.pem");
        assert!(c.tls.required);
        assert_eq!(c.tls.ca, Some("/ca.pem".into()));
        let c = nats("nats://h?tls_cert=/c&tls_key=/k");
        assert!(c.tls.required);
        assert_eq!(
            nats("nats://h?token=s3cret").auth,
            NatsAuth::Token("s3cret".into())
        );
        assert_eq!(nats("nats://h?nkey=SU").auth, NatsAuth::Nkey("SU".into()));
        // User-info without a colon is a token (as in the NATS clients);
        // with one, a user with a possibly empty password.
        assert_eq!(
            nats("nats://s3cr%40t@h:1").auth,
            NatsAuth::Token("s3cr@t".into())
        );
        assert_eq!(
            nats("nats://u:@h").auth,
            NatsAuth::UserPassword {
                user: "u".into(),
                password: String::new()
            }
        );
    }

    #[test]
    fn errors_say_what_and_show_an_example() {
        for (url, what) in [
            ("redis://h", "unknown scheme \"redis\""),
            ("nats://", "missing host"),
            ("nats://a,,b", "missing host"),
            ("nats://:4222", "missing host"),
            ("nats://h:99999", "bad port"),
            ("nats://h?bukket=x", "unknown option \"bukket\""),
            ("nats://h?replicas=7", "replicas must be 1 to 5"),
            ("nats://h?bucket=a.b", "bucket"),
            ("nats://u:p@h?token=t", "more than one kind of credentials"),
            ("nats://t@h?nkey=SU", "more than one kind of credentials"),
            ("nats://h?tls_cert=/c", "tls_cert and tls_key go together"),
            ("nats://h/path", "no path"),
            ("nats:h", "expected //"),
            ("localhost:4222", "unknown scheme"),
            ("no-scheme", "no scheme"),
        ] {
            let msg = err(url);
            assert!(msg.contains(what), "{url}: {msg}");
            assert!(msg.contains("for example \"nats://"), "{url}: {msg}");
        }
        for (url, what) in [
            ("sqlite:relative.db", "absolute"),
            ("sqlite://host/x.db", "host is not allowed"),
            ("sqlite:///x.db?a=b", "no options"),
        ] {
            let msg = err(url);
            assert!(msg.contains(what), "{url}: {msg}");
            assert!(msg.contains("for example \"sqlite:///"), "{url}: {msg}");
        }
    }

    #[test]
    fn secrets_stay_out_of_messages() {
        let msg = err("nats://u:hunter2@h?bogus=1");
        assert!(!msg.contains("hunter2"), "{msg}");
        let msg = err("nats://h?token=hunter2&bogus=1");
        assert!(!msg.contains("hunter2"), "{msg}");
        let msg = err("nats://hunter2@h?bogus=1");
        assert!(!msg.contains("hunter2"), "{msg}");
        let shown = StoreUrl::parse("nats://u:hunter2@h").unwrap().to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn etcd_urls() {
        let StoreUrl::Etcd(c) = StoreUrl::parse("etcd://a:1,b,c:3?prefix=/svc/locks/").unwrap()
        else {
            panic!()
        };
        assert_eq!(c.endpoints, ["a:1", "b:2379", "c:3"]);
        assert_eq!(c.prefix, "svc/locks");
        assert_eq!(c.user, None);
        assert!(!c.tls.required);
        let StoreUrl::Etcd(c) =
            StoreUrl::parse("etcd://u:p%40ss@h?tls_ca=/ca.pem&tls_cert=/c&tls_key=/k").unwrap()
        else {
            panic!()
        };
        assert_eq!(c.user, Some(("u".into(), "p@ss".into())));
        assert!(c.tls.required);
        assert_eq!(c.prefix, "putex");
        let shown = StoreUrl::Etcd(c).to_string();
        assert!(!shown.contains("p@ss"), "{shown}");
        for (url, what) in [
            ("etcd://h?bucket=x", "unknown option \"bucket\""),
            ("etcd://h?prefix=a//b", "prefix"),
            ("etcd://h?prefix=a*b", "prefix"),
            ("etcd://tok@h", "user:password"),
            ("etcd://h/x", "no path"),
            ("etcd://h?tls_key=/k", "tls_cert and tls_key go together"),
            ("etcd://h?password=x", "password without user"),
            ("etcd://h:0", "bad port"),
        ] {
            let msg = err(url);
            assert!(msg.contains(what), "{url}: {msg}");
            assert!(msg.contains("for example \"etcd://"), "{url}: {msg}");
        }
        let msg = err("etcd://u:hunter2@h?bogus=1");
        assert!(!msg.contains("hunter2"), "{msg}");
    }

    #[test]
    fn sqlite_and_memory_urls() {
        assert_eq!(
            StoreUrl::parse("sqlite:///var/lib/p.db").unwrap(),
            StoreUrl::Sqlite {
                path: "/var/lib/p.db".into()
            }
        );
        match StoreUrl::parse("sqlite:") {
            Ok(StoreUrl::Sqlite { path }) => assert!(path.ends_with("putex/store.db")),
            Err(e) => assert!(e.to_string().contains("XDG_STATE_HOME")),
            other => panic!("{other:?}"),
        }
        assert_eq!(StoreUrl::parse("memory:").unwrap(), StoreUrl::Memory);
    }

    #[test]
    fn environment() {
        let u = StoreUrl::from_vars(None, Some("nats://a:1,nats://b:2".into()), None).unwrap();
        assert!(
            matches!(&u, StoreUrl::Nats(c) if c.servers == ["a:1", "b:2"]),
            "{u:?}"
        );
        let u = StoreUrl::from_vars(None, Some("a:1,b:2".into()), Some("/c.creds".into())).unwrap();
        let StoreUrl::Nats(c) = u else { panic!() };
        assert_eq!(c.servers, ["a:1", "b:2"]);
        assert_eq!(c.auth, NatsAuth::Creds("/c.creds".into()));
        let u = StoreUrl::from_vars(Some("memory:".into()), Some("a:1".into()), None).unwrap();
        assert_eq!(u, StoreUrl::Memory);
        let u = StoreUrl::from_vars(None, Some("nats://h?token=t".into()), Some("/c".into()));
        let StoreUrl::Nats(c) = u.unwrap() else {
            panic!()
        };
        assert_eq!(c.auth, NatsAuth::Token("t".into()));
    }
}
