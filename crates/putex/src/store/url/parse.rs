//! The parsers of each kind of store URL (`sqlite:`, `nats://` and
//! `tls://`, `etcd://`) and the pieces they share: the authority (user-info,
//! hosts, query), the query's options, the host list with its default
//! port, the TLS options, percent-decoding that refuses a malformed
//! escape. Every error names what is wrong and shows a URL that works.

use std::path::PathBuf;

use super::redact::bad;
use super::{
    EtcdConfig, NatsAuth, NatsConfig, NatsTls, StoreUrl, DEFAULT_BUCKET, DEFAULT_ETCD_PREFIX,
    ETCD_EXAMPLE, NATS_EXAMPLE, SQLITE_EXAMPLE,
};
use crate::store::StoreError;

pub(super) fn parse_sqlite(url: &str, rest: &str) -> Result<StoreUrl, StoreError> {
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

pub(super) fn parse_nats(url: &str, scheme: &str, rest: &str) -> Result<StoreUrl, StoreError> {
    let rest = one_url_of_a_list(url, scheme, rest)?;
    let Authority {
        userinfo,
        hosts,
        query,
    } = Authority::split(url, &rest, "a NATS URL has no path", NATS_EXAMPLE)?;
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

/// A list of whole URLs, as `NATS_URL` and the `nats` CLI take it
/// (`nats://a:4222,nats://b:4222`), read as one URL listing its hosts
/// (`nats://a:4222,b:4222`): `rest` (what follows `scheme:`) with the
/// later URLs' schemes and credentials taken out. Every URL of the list
/// must have the scheme and the credentials of the first.
fn one_url_of_a_list(url: &str, scheme: &str, rest: &str) -> Result<String, StoreError> {
    let separator = format!(",{scheme}://");
    let mut urls = rest.split(separator.as_str());
    let first = urls.next().unwrap_or_default();
    let credentials = |authority: &str| authority.rsplit_once('@').map(|(info, _)| info.to_owned());
    let first_credentials = credentials(first.strip_prefix("//").unwrap_or(first));
    let mut joined = first.to_owned();
    for other in urls {
        if credentials(other) != first_credentials {
            return Err(bad(
                url,
                "every URL of a list must have the credentials of the first",
                NATS_EXAMPLE,
            ));
        }
        joined.push(',');
        joined.push_str(other.rsplit_once('@').map_or(other, |(_, hosts)| hosts));
    }
    Ok(joined)
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

pub(super) fn parse_etcd(url: &str, rest: &str) -> Result<StoreUrl, StoreError> {
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
