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

use std::fmt;
use std::path::PathBuf;

use super::StoreError;

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

/// How to reach an etcd cluster.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EtcdConfig {
    /// `host:port` of each member to try.
    pub endpoints: Vec<String>,
    /// The key prefix (`prefix=`, default [`DEFAULT_ETCD_PREFIX`]): every
    /// record is stored under `<prefix>/`.
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
    /// The KV bucket's name (`bucket=`, default [`DEFAULT_BUCKET`]): only
    /// `A-Z a-z 0-9 _ -`.
    pub bucket: String,
    /// Replicas for a bucket that putex creates.
    pub replicas: usize,
    /// Credentials, from the user-info or the options (or `NATS_CREDS`,
    /// see [`StoreUrl::from_env`]).
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

fn bad(url: &str, problem: impl fmt::Display, example: &str) -> StoreError {
    // The problem may quote a piece of the URL (an option's name): what
    // `redact` hides is hidden there too.
    // (piece by piece: the parser may have cut the secret anywhere).
    let mut problem = problem.to_string();
    for (from, to) in secret_ranges(url) {
        for piece in url[from..to].split([':', '@', '?', '/', '&', '=', ',']) {
            if piece.len() >= 3 {
                problem = problem.replace(piece, "***");
            }
        }
    }
    StoreError::config(format!(
        "store URL {:?}: {problem}; for example {example:?}",
        redact(url)
    ))
}

/// Whether `s` is a URL scheme: a letter, then letters, digits, `+ - .`.
fn is_scheme(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Query options whose values are secrets.
const SECRET_OPTIONS: [&str; 3] = ["password", "token", "nkey"];

/// Hides passwords, tokens and nkeys in a URL for messages, wherever a
/// mistyped URL puts them ([`secret_ranges`]).
fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut done = 0;
    for (from, to) in secret_ranges(url) {
        if to < done {
            continue;
        }
        out.push_str(&url[done..from.max(done)]);
        out.push_str("***");
        done = to;
    }
    out.push_str(&url[done..]);
    out
}

/// Where a URL may hold secrets, in order: the user-info up to the last
/// `@` (all but the user name), read as such even without `//` or with a
/// `/` or `?` in the secret, and the value of every secret option, however
/// often it comes.
fn secret_ranges(url: &str) -> Vec<(usize, usize)> {
    let mut hide: Vec<(usize, usize)> = Vec::new();
    // Where the user-info would start: after `scheme:` and any slashes (or
    // at the start, when what precedes the first `:` is no scheme).
    let after = url
        .find(':')
        .filter(|c| is_scheme(&url[..*c]))
        .map_or(0, |c| c + 1);
    let start = after + (url[after..].len() - url[after..].trim_start_matches('/').len());
    // The user-info as the parser reads it (up to the last `@` before the
    // options), and as a secret holding a `?` would make it.
    let options = url[start..].find('?').map_or(url.len(), |i| start + i);
    for end in [options, url.len()] {
        if let Some(at) = url[start..end].rfind('@').map(|i| start + i) {
            // All but the user name; all of it if it holds another `@`
            // (`token@host:@host2` reads as user `token@host`).
            let info = &url[start..at];
            let from = match info.find(':') {
                Some(i) if !info.contains('@') => start + i + 1,
                _ => start,
            };
            hide.push((from, at));
        }
    }
    // Every `key=value` after a `?` or `&`, wherever it is (a stray `?`
    // makes the parser read `x?password` as one key; the user meant one).
    for (i, _) in url.match_indices(['?', '&']) {
        let rest = &url[i + 1..];
        let pair = &rest[..rest.find('&').unwrap_or(rest.len())];
        if let Some(eq) = pair.find('=') {
            let key = pair[..eq].trim_matches(|c: char| !c.is_ascii_alphanumeric());
            if SECRET_OPTIONS.iter().any(|s| key.eq_ignore_ascii_case(s)) {
                hide.push((i + 1 + eq + 1, i + 1 + pair.len()));
            }
        }
    }
    hide.sort_unstable();
    hide
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

fn parse_sqlite(url: &str, rest: &str) -> Result<StoreUrl, StoreError> {
    if rest.is_empty() {
        return Ok(StoreUrl::Sqlite {
            path: default_sqlite_path()?,
        });
    }
    let Some(path) = rest.strip_prefix("//") else {
        return Err(bad(
            url,
            "the path must be absolute, written sqlite:///abs/path.db (or sqlite: for the default)",
            SQLITE_EXAMPLE,
        ));
    };
    if !path.starts_with('/') {
        return Err(bad(
            url,
            "a host is not allowed, the path must be absolute (three slashes)",
            SQLITE_EXAMPLE,
        ));
    }
    if path.contains('?') {
        return Err(bad(url, "sqlite URLs take no options", SQLITE_EXAMPLE));
    }
    if path.ends_with('/') {
        return Err(bad(
            url,
            "the path names a directory, not a file",
            SQLITE_EXAMPLE,
        ));
    }
    Ok(StoreUrl::Sqlite {
        path: PathBuf::from(percent_decode(url, path, SQLITE_EXAMPLE)?),
    })
}

/// `$XDG_STATE_HOME/putex/store.db`, else `~/.local/state/putex/store.db`.
pub fn default_sqlite_path() -> Result<PathBuf, StoreError> {
    let abs = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").and_then(abs) {
        return Ok(state.join("putex").join("store.db"));
    }
    if let Some(home) = std::env::var_os("HOME").and_then(abs) {
        return Ok(home.join(".local/state/putex/store.db"));
    }
    Err(StoreError::config(format!(
        "no default place for the embedded store: neither XDG_STATE_HOME nor HOME is set to an absolute path; name a file, for example {SQLITE_EXAMPLE:?}"
    )))
}

const NATS_KEYS: &str =
    "bucket, replicas, creds, nkey, user, password, token, tls, tls_ca, tls_cert, tls_key";

fn parse_nats(url: &str, scheme: &str, rest: &str) -> Result<StoreUrl, StoreError> {
    let Authority {
        userinfo,
        hosts,
        query,
    } = Authority::split(url, rest, "a NATS URL has no path", NATS_EXAMPLE)?;
    let servers = host_list(url, hosts, 4222, NATS_EXAMPLE)?;

    let mut cfg = NatsConfig {
        servers,
        bucket: DEFAULT_BUCKET.to_owned(),
        replicas: 1,
        auth: NatsAuth::None,
        tls: NatsTls {
            required: scheme.eq_ignore_ascii_case("tls"),
            ..NatsTls::default()
        },
    };
    let (mut user, mut password) = (None, None);
    let mut auth_kinds = Vec::new();
    match userinfo.map(|info| (info, info.split_once(':'))) {
        Some((_, Some((u, p)))) => {
            user = Some(percent_decode(url, u, NATS_EXAMPLE)?);
            password = Some(percent_decode(url, p, NATS_EXAMPLE)?);
        }
        // `nats://TOKEN@host`: a token, as the NATS clients and CLI read it.
        Some((info, None)) => {
            auth_kinds.push("token");
            cfg.auth = NatsAuth::Token(percent_decode(url, info, NATS_EXAMPLE)?);
        }
        None => {}
    }
    for (k, v) in options(url, query, NATS_EXAMPLE)? {
        if cfg.tls.option(url, k, &v, NATS_EXAMPLE)? {
            continue;
        }
        match k {
            "bucket" => {
                if !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(bad(
                        url,
                        format_args!("bucket {v:?} may hold only A-Z a-z 0-9 _ -"),
                        NATS_EXAMPLE,
                    ));
                }
                cfg.bucket = v;
            }
            "replicas" => {
                cfg.replicas = v
                    .parse()
                    .ok()
                    .filter(|r| (1..=5).contains(r))
                    .ok_or_else(|| {
                        bad(
                            url,
                            format_args!("replicas must be 1 to 5, not {v:?}"),
                            NATS_EXAMPLE,
                        )
                    })?;
            }
            "creds" => {
                auth_kinds.push("creds");
                cfg.auth = NatsAuth::Creds(PathBuf::from(v));
            }
            "nkey" => {
                auth_kinds.push("nkey");
                cfg.auth = NatsAuth::Nkey(v);
            }
            "token" => {
                auth_kinds.push("token");
                cfg.auth = NatsAuth::Token(v);
            }
            "user" => user = Some(v),
            "password" => password = Some(v),
            other => {
                return Err(bad(
                    url,
                    format_args!("unknown option {other:?} (known: {NATS_KEYS})"),
                    NATS_EXAMPLE,
                ))
            }
        }
    }
    match (user, password) {
        (Some(user), password) => {
            auth_kinds.push("user/password");
            cfg.auth = NatsAuth::UserPassword {
                user,
                password: password.unwrap_or_default(),
            };
        }
        (None, Some(_)) => return Err(bad(url, "password without user", NATS_EXAMPLE)),
        (None, None) => {}
    }
    if auth_kinds.len() > 1 {
        return Err(bad(
            url,
            format_args!(
                "more than one kind of credentials ({})",
                auth_kinds.join(", ")
            ),
            NATS_EXAMPLE,
        ));
    }
    cfg.tls.finish(url, NATS_EXAMPLE)?;
    Ok(StoreUrl::Nats(cfg))
}

/// A network store URL after its scheme: `//[userinfo@]hosts[/][?query]`.
struct Authority<'a> {
    userinfo: Option<&'a str>,
    hosts: &'a str,
    query: &'a str,
}

impl<'a> Authority<'a> {
    /// Splits `rest` (what follows `scheme:`); a path is refused with
    /// `no_path`.
    fn split(
        url: &str,
        rest: &'a str,
        no_path: &str,
        example: &str,
    ) -> Result<Authority<'a>, StoreError> {
        let Some(rest) = rest.strip_prefix("//") else {
            return Err(bad(url, "expected // after the scheme", example));
        };
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err(bad(url, no_path, example));
        }
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        Ok(Authority {
            userinfo,
            hosts,
            query,
        })
    }
}

/// The query's `key=value` options, values percent-decoded; an option
/// without a value is refused (but `password=`, an empty password).
fn options<'q>(
    url: &str,
    query: &'q str,
    example: &str,
) -> Result<Vec<(&'q str, String)>, StoreError> {
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(url, v, example)?;
        if v.is_empty() && k != "password" {
            return Err(bad(url, format_args!("option {k:?} has no value"), example));
        }
        out.push((k, v));
    }
    Ok(out)
}

impl NatsTls {
    /// Takes the TLS option `k` (`tls`, `tls_ca`, `tls_cert`, `tls_key`);
    /// `false` when `k` is another option.
    fn option(&mut self, url: &str, k: &str, v: &str, example: &str) -> Result<bool, StoreError> {
        match k {
            "tls" => {
                self.required = match v {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return Err(bad(url, "tls must be true or false", example)),
                }
            }
            "tls_ca" => self.ca = Some(PathBuf::from(v)),
            "tls_cert" => self.cert = Some(PathBuf::from(v)),
            "tls_key" => self.key = Some(PathBuf::from(v)),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A certificate needs its key; any file implies TLS.
    fn finish(&mut self, url: &str, example: &str) -> Result<(), StoreError> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(bad(url, "tls_cert and tls_key go together", example));
        }
        if self.ca.is_some() || self.cert.is_some() {
            self.required = true;
        }
        Ok(())
    }
}

/// `host[:port],…` as `host:port` strings, `default_port` where none is given.
fn host_list(
    url: &str,
    hosts: &str,
    default_port: u16,
    example: &str,
) -> Result<Vec<String>, StoreError> {
    let mut servers = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(bad(url, "missing host", example));
        }
        let (name, port) = match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        };
        if name.is_empty() {
            return Err(bad(url, format_args!("missing host in {host:?}"), example));
        }
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad(url, format_args!("bad port {p:?} in {host:?}"), example))?,
        };
        servers.push(format!("{name}:{port}"));
    }
    Ok(servers)
}

const ETCD_KEYS: &str = "prefix, user, password, tls, tls_ca, tls_cert, tls_key";

fn parse_etcd(url: &str, rest: &str) -> Result<StoreUrl, StoreError> {
    let Authority {
        userinfo,
        hosts,
        query,
    } = Authority::split(
        url,
        rest,
        "an etcd URL has no path (name the key prefix with prefix=)",
        ETCD_EXAMPLE,
    )?;
    let mut cfg = EtcdConfig {
        endpoints: host_list(url, hosts, 2379, ETCD_EXAMPLE)?,
        prefix: DEFAULT_ETCD_PREFIX.to_owned(),
        user: None,
        tls: NatsTls::default(),
    };
    let (mut user, mut password) = (None, None);
    if let Some(info) = userinfo {
        let Some((u, p)) = info.split_once(':') else {
            return Err(bad(
                url,
                "etcd credentials are user:password (etcd has no tokens)",
                ETCD_EXAMPLE,
            ));
        };
        user = Some(percent_decode(url, u, ETCD_EXAMPLE)?);
        password = Some(percent_decode(url, p, ETCD_EXAMPLE)?);
    }
    for (k, v) in options(url, query, ETCD_EXAMPLE)? {
        if cfg.tls.option(url, k, &v, ETCD_EXAMPLE)? {
            continue;
        }
        match k {
            "prefix" => {
                let p = v.trim_matches('/');
                let fine = !p.is_empty()
                    && p.split('/').all(|part| {
                        !part.is_empty()
                            && part
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                    });
                if !fine {
                    return Err(bad(
                        url,
                        format_args!(
                            "prefix {v:?}: one or more /-separated parts of A-Z a-z 0-9 _ - ."
                        ),
                        ETCD_EXAMPLE,
                    ));
                }
                cfg.prefix = p.to_owned();
            }
            "user" => user = Some(v),
            "password" => password = Some(v),
            other => {
                return Err(bad(
                    url,
                    format_args!("unknown option {other:?} (known: {ETCD_KEYS})"),
                    ETCD_EXAMPLE,
                ))
            }
        }
    }
    match (user, password) {
        (Some(user), password) => cfg.user = Some((user, password.unwrap_or_default())),
        (None, Some(_)) => return Err(bad(url, "password without user", ETCD_EXAMPLE)),
        (None, None) => {}
    }
    cfg.tls.finish(url, ETCD_EXAMPLE)?;
    Ok(StoreUrl::Etcd(cfg))
}

fn percent_decode(url: &str, s: &str, example: &str) -> Result<String, StoreError> {
    // percent-encoding passes a malformed escape through as text; a URL with
    // one is refused instead (a typo in a password must not become part of it).
    let malformed = s.match_indices('%').any(|(i, _)| {
        !s.get(i + 1..i + 3)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if malformed {
        return Err(bad(url, "a bad percent escape", example));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| bad(url, "percent escapes that are not UTF-8", example))
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
