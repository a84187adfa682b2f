//! Store URLs (`--store`, `PUTEX_STORE`, `NATS_URL`, the config file) and
//! the names and keys built from what users and KV tools give.

use proptest::prelude::*;
use putex::store::keys::{self, MAX_NAME_LEN, MAX_NODE_LEN};
use putex::store::url::{NatsAuth, StoreUrl};
use putex::store::{Name, NodeId, StoreError};

use super::{fuzz, text};

/// A piece of a URL: plain, percent-escaped (well or badly), or odd.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[A-Za-z0-9._-]{0,12}",
        2 => text(),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(|b| {
            b.iter().map(|b| format!("%{b:02x}")).collect::<String>()
        }),
        1 => prop::sample::select(vec![
            "%", "%4", "%zz", "%+1", "%-1", "%%", "%C3", "%e9", "%00", "@", ":", "/", "?", "&",
            "=", ",", "[::1]", "://",
        ])
        .prop_map(str::to_owned),
    ]
}

/// A secret that must never show in a message or a displayed URL.
fn secret() -> impl Strategy<Value = String> {
    any::<u32>().prop_map(|n| format!("S3CRET{n:08x}"))
}

/// URLs: random, or assembled from schemes, credentials, hosts, ports and
/// options, some of them secrets.
fn url() -> impl Strategy<Value = (String, Option<String>)> {
    let scheme = prop::sample::select(vec![
        "nats", "tls", "sqlite", "memory", "etcd", "NATS", "Tls", "SQLite", "Etcd", "http", "",
    ]);
    let sep = prop::sample::select(vec!["://", ":", ":///", ":/", "//"]);
    let host = prop_oneof![
        3 => prop::sample::select(vec!["localhost", "10.0.0.1", "[::1]", "a.example.com"])
            .prop_map(str::to_owned),
        1 => piece(),
    ];
    let port = prop_oneof![
        2 => Just(None),
        3 => (1u32..70_000).prop_map(|p| Some(p.to_string())),
        1 => piece().prop_map(Some),
    ];
    let hosts = prop::collection::vec((host, port), 1..4).prop_map(|hs| {
        hs.into_iter()
            .map(|(h, p)| match p {
                Some(p) => format!("{h}:{p}"),
                None => h,
            })
            .collect::<Vec<_>>()
            .join(",")
    });
    let key = prop_oneof![
        4 => prop::sample::select(vec![
            "bucket", "replicas", "creds", "nkey", "user", "password", "token", "tls",
            "tls_ca", "tls_cert", "tls_key", "prefix",
        ])
        .prop_map(str::to_owned),
        1 => piece(),
    ];
    let value = prop_oneof![
        2 => piece(),
        1 => prop::sample::select(vec!["1", "3", "5", "0", "6", "true", "false", "/etc/x.creds"])
            .prop_map(str::to_owned),
    ];
    let query = prop::collection::vec((key, value), 0..4);
    // Where the secret goes, if anywhere.
    let place = prop::sample::select(vec![0u8, 1, 2, 3, 4, 5]);
    let structured = (
        scheme,
        sep,
        prop::option::of(piece()),
        hosts,
        prop::option::of(piece()),
        query,
        place,
        secret(),
    )
        .prop_map(|(scheme, sep, user, hosts, path, query, place, secret)| {
            let userinfo = match (place, user) {
                (1, Some(u)) => format!("{u}:{secret}@"),
                (1, None) => format!("u:{secret}@"),
                (2, _) => format!("{secret}@"),
                (_, Some(u)) => format!("{u}@"),
                (_, None) => String::new(),
            };
            let mut pairs: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            match place {
                3 => pairs.push(format!("password={secret}")),
                4 => pairs.insert(0, format!("token={secret}")),
                5 => pairs.push(format!("nkey={secret}")),
                _ => {}
            }
            let path = path.map(|p| format!("/{p}")).unwrap_or_default();
            let query = if pairs.is_empty() {
                String::new()
            } else {
                format!("?{}", pairs.join("&"))
            };
            let url = format!("{scheme}{sep}{userinfo}{hosts}{path}{query}");
            (url, (place != 0).then_some(secret))
        });
    prop_oneof![
        1 => text().prop_map(|u| (u, None)),
        4 => structured,
    ]
}

#[test]
fn fuzz_store_urls() {
    fuzz("store URLs", url(), |(url, secret)| {
        match StoreUrl::parse(&url) {
            Err(e) => {
                prop_assert!(matches!(e, StoreError::Config { .. }), "{e:?}");
                let message = e.to_string();
                if let Some(s) = &secret {
                    prop_assert!(!message.contains(s.as_str()), "secret in {message:?}");
                }
            }
            Ok(parsed) => {
                let shown = parsed.to_string();
                // In a valid sqlite URL, `u:S3CRET@host` is part of a path;
                // in `S3CRET@a:@b`, `S3CRET@a` is the user name.
                let public = match &parsed {
                    StoreUrl::Sqlite { .. } => true,
                    StoreUrl::Nats(c) => matches!(&c.auth,
                        NatsAuth::UserPassword { user, .. } if secret.as_ref().is_some_and(|s| user.contains(s.as_str()))),
                    StoreUrl::Etcd(c) => c.user.as_ref().is_some_and(|(user, _)| {
                        secret.as_ref().is_some_and(|s| user.contains(s.as_str()))
                    }),
                    StoreUrl::Memory => false,
                };
                if let (Some(s), false) = (&secret, public) {
                    prop_assert!(!shown.contains(s.as_str()), "secret in {shown:?}");
                }
                match &parsed {
                    StoreUrl::Nats(cfg) => {
                        prop_assert!(!cfg.servers.is_empty());
                        for s in &cfg.servers {
                            let (host, port) = s.rsplit_once(':').expect("host:port");
                            prop_assert!(!host.is_empty(), "{s:?}");
                            prop_assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{s:?}");
                        }
                        prop_assert!((1..=5).contains(&cfg.replicas));
                        prop_assert!(cfg
                            .bucket
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
                        prop_assert_eq!(cfg.tls.cert.is_some(), cfg.tls.key.is_some());
                        if cfg.tls.ca.is_some() || cfg.tls.cert.is_some() {
                            prop_assert!(cfg.tls.required);
                        }
                    }
                    StoreUrl::Etcd(cfg) => {
                        prop_assert!(!cfg.endpoints.is_empty());
                        for s in &cfg.endpoints {
                            let (host, port) = s.rsplit_once(':').expect("host:port");
                            prop_assert!(!host.is_empty(), "{s:?}");
                            prop_assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{s:?}");
                        }
                        prop_assert!(!cfg.prefix.is_empty() && !cfg.prefix.ends_with('/'));
                        prop_assert_eq!(cfg.tls.cert.is_some(), cfg.tls.key.is_some());
                    }
                    StoreUrl::Sqlite { path } => prop_assert!(path.is_absolute(), "{path:?}"),
                    StoreUrl::Memory => {}
                }
            }
        }
        Ok(())
    });
}

/// What percent-decoding must give: `None` when an escape is not `%` and
/// two hex digits, or the result is not UTF-8.
fn decoded(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[test]
fn fuzz_store_url_escapes() {
    // Credentials are percent-decoded: exactly the valid escapes, and back
    // to what was escaped.
    let raw = prop_oneof![piece(), text()].prop_filter("no separators", |s| {
        !s.contains(['@', ':', '/', '?', '&', ','])
    });
    let escaped = text().prop_map(|s| {
        s.bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
            .replace('X', "x")
    });
    fuzz(
        "store URL escapes",
        (raw, escaped, any::<bool>()),
        |(raw, escaped, lower)| {
            let url = format!("nats://user:{raw}@localhost");
            match (StoreUrl::parse(&url), decoded(&raw)) {
                (Ok(StoreUrl::Nats(cfg)), Some(want)) => prop_assert_eq!(
                    cfg.auth,
                    NatsAuth::UserPassword {
                        user: "user".into(),
                        password: want
                    }
                ),
                (Err(_), None) => {}
                (got, want) => prop_assert!(false, "{url:?}: {got:?}, expected {want:?}"),
            }
            let plain = decoded(&escaped).expect("escaped text decodes");
            let escaped = if lower {
                escaped.to_ascii_lowercase()
            } else {
                escaped
            };
            let url = format!("nats://localhost?token={escaped}");
            let Ok(StoreUrl::Nats(cfg)) = StoreUrl::parse(&url) else {
                // An empty value is refused (option without a value).
                prop_assert!(plain.is_empty(), "{url:?}");
                return Ok(());
            };
            prop_assert_eq!(cfg.auth, NatsAuth::Token(plain));
            Ok(())
        },
    );
}

/// Names and node ids: exactly the documented characters and lengths.
fn name_ok(s: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn node_ok(s: &str) -> bool {
    (1..=MAX_NODE_LEN).contains(&s.len())
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// A store key NATS accepts: `[-/_=.a-zA-Z0-9]`, no empty token.
fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= keys::MAX_KEY_LEN
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b))
        && k.split('.').all(|t| !t.is_empty())
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9_-]{1,64}",
        2 => "[A-Za-z0-9_.-]{0,70}",
        1 => "[a-z]{1,63}(\\.[a-z]{1,63}){0,4}",
        1 => text(),
        1 => (60usize..300).prop_map(|n| "a".repeat(n)),
    ]
}

#[test]
fn fuzz_names_and_keys() {
    fuzz(
        "names and keys",
        (name(), name(), name(), any::<u64>(), any::<u32>()),
        |(a, b, c, seq, slot)| {
            let (na, nb, nc) = (Name::new(&*a), NodeId::new(&*b), Name::new(&*c));
            prop_assert_eq!(na.is_ok(), name_ok(&a), "{:?}", a);
            prop_assert_eq!(nb.is_ok(), node_ok(&b), "{:?}", b);
            prop_assert_eq!(keys::validate_key(&c).is_ok(), key_ok(&c), "{:?}", c);
            prop_assert_eq!(nc.is_ok(), name_ok(&c), "{:?}", c);
            let (Ok(a), Ok(b), Ok(c)) = (na, nb, nc) else {
                return Ok(());
            };
            // Every key built from valid parts is valid, starts with its
            // filter, and is never one of another kind's.
            let built = [
                keys::lock(&a),
                keys::member(&a, &b),
                keys::probe(&b),
                keys::semaphore(&a),
                keys::slot(&a, slot),
                keys::ticket(&a, &c),
                keys::grant(&a, &c),
                keys::cancel(&a),
                keys::once(&a),
                keys::id_record(&a, seq),
                keys::id_name(&a, &b),
                keys::id_meta(&a),
                keys::history(&a, &b, &c, seq),
                keys::history_scan(&a),
            ];
            for k in built {
                prop_assert!(key_ok(&k), "{k:?}");
            }
            let (m, f) = (keys::member(&a, &b), keys::members_of(&a));
            prop_assert!(m.starts_with(&f) && keys::filter_matches(&f, &m));
            // A member of `a` is never selected as a member of another lock
            // whose name `a` starts with.
            if let Ok(other) = Name::new(format!("{a}x")) {
                prop_assert!(!keys::filter_matches(&keys::members_of(&other), &m));
            }
            let (h, f) = (keys::history(&a, &b, &c, seq), keys::history_of(&a));
            prop_assert!(keys::filter_matches(&f, &h));
            prop_assert_ne!(h, keys::history_scan(&a));
            for f in [keys::members_of(&a), keys::queue_of(&a), keys::id_pool(&a)] {
                prop_assert!(keys::validate_filter(&f).is_ok(), "{f:?}");
            }
            Ok(())
        },
    );
}

/// r47: a store URL's error message hid its secrets only where a well-formed
/// URL has them: `nats:user:SECRET@host` (no `//`), a second `token=`, a
/// token with `/`, `?` or `@` in it, a stray `?` before `password=`, or a
/// message quoting a mangled option name showed them (and so put them in
/// logs). Found by `fuzz_store_urls`, one after another.
#[test]
fn r47_secrets_never_show_in_url_errors() {
    for url in [
        "nats:u:S3CRET@localhost",
        "nats:S3CRET@localhost",
        "nats://localhost?token=a&token=S3CRET",
        "nats://localhost?nkey=a&nkey=S3CRET&x=1",
        "nats://S3/CRET@localhost",
        "nats://u:S3?CRET@localhost",
        "tls://u:p@localhost?password=S3CRET&bucket=a.b",
        "nats://localhost?xpassword=1&password=S3CRET&bucket=a.b",
        "nats://localhost?bucket=a.b&password=S3CRET&password=S3CRET",
        "nats://S3CRET@localhost:1?bucket=@",
        "nats//S3CRET@localhost:1",
        "nats://??password=S3CRET",
        "nats://localhost/?0?password=S3CRET",
        "nats://S3CRET@localhost:@",
        "nats://!?:S3CRET@localhost",
        "S3CRET@localhost",
        "NATS://@0?:S3CRET@localhost",
    ] {
        let e = StoreUrl::parse(url).unwrap_err().to_string();
        assert!(!e.contains("S3") || !e.contains("CRET"), "{url}: {e}");
    }
}

/// r48: percent-decoding took `%+1` for an escape (Rust's `from_str_radix`
/// accepts a sign): `nats://user:%+1@host` had the password "\u{1}".
/// Now an escape is `%` and two hex digits, or an error. Found by
/// `fuzz_store_url_escapes`.
#[test]
fn r48_a_percent_escape_is_two_hex_digits() {
    for url in [
        "nats://user:%+1@localhost",
        "nats://user:%-1@localhost",
        "nats://localhost?token=%+f",
    ] {
        assert!(StoreUrl::parse(url).is_err(), "{url}");
    }
    let StoreUrl::Nats(cfg) = StoreUrl::parse("nats://user:%2B1@localhost").unwrap() else {
        panic!()
    };
    assert_eq!(
        cfg.auth,
        NatsAuth::UserPassword {
            user: "user".into(),
            password: "+1".into()
        }
    );
}
