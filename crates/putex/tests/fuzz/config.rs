//! The config file (`--config`, TOML) and its merge with flags and the
//! environment (`AgentSettings::resolve`): any text gives settings or an
//! error that names the key or flag, never a panic; and a flag always
//! beats the file.

use std::time::Duration;

use proptest::prelude::*;
use putex::cli::config::{AgentArgs, FileConfig, Strictness};
use putex::cli::CliError;
use toml::{Table, Value};

use super::{fuzz, mutation, text};

const STRINGS: &[&str] = &[
    "lock",
    "store",
    "node",
    "healthcheck",
    "activate",
    "deactivate",
    "fence",
    "max-drift",
    "keeper-dir",
    "http",
];
const DURATIONS: &[&str] = &[
    "renew",
    "max-lease",
    "max-gap",
    "start-grace",
    "sched-margin",
    "healthcheck-timeout",
    "store-timeout",
    "activate-timeout",
    "stop-timeout",
    "emergency-timeout",
];
const COUNTS: &[&str] = &["failures", "confirm", "unhealthy", "successes"];
const BOOLS: &[&str] = &["allow-short-lease", "no-cgroup"];

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u64..100_000, prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "y", ""]))
            .prop_map(|(n, u)| format!("{n}{u}")),
        1 => any::<u64>().prop_map(|n| format!("{n}s")),
        1 => any::<u64>().prop_map(|n| format!("{n}y")),
        1 => prop::sample::select(vec![
            "", "1", "-1s", "1.5s", "1e9h", "1s 2ms", "soon", "18446744073709551616ns",
            "99999999999999999999y", "1%", "0ms",
        ])
        .prop_map(str::to_owned),
        1 => text(),
    ]
}

fn toml_value(key: &'static str) -> BoxedStrategy<Value> {
    let any_value = prop_oneof![
        text().prop_map(Value::String),
        any::<i64>().prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        prop::collection::vec(text().prop_map(Value::String), 0..4).prop_map(Value::Array),
    ];
    let typed: BoxedStrategy<Value> = if DURATIONS.contains(&key) {
        duration_text().prop_map(Value::String).boxed()
    } else if COUNTS.contains(&key) {
        prop_oneof![
            (-5i64..30).prop_map(Value::Integer),
            any::<i64>().prop_map(Value::Integer),
            Just(Value::Integer(i64::from(u32::MAX) + 1)),
        ]
        .boxed()
    } else if BOOLS.contains(&key) {
        any::<bool>().prop_map(Value::Boolean).boxed()
    } else if key == "child" {
        prop::collection::vec(text().prop_map(Value::String), 0..4)
            .prop_map(Value::Array)
            .boxed()
    } else if key == "max-drift" {
        prop_oneof![
            (0u32..200).prop_map(|p| Value::String(format!("{}%", f64::from(p) / 10.0))),
            text().prop_map(Value::String),
            Just(Value::String("NaN".into())),
            Just(Value::String("inf%".into())),
        ]
        .boxed()
    } else if key == "store" {
        prop::sample::select(vec![
            "memory:",
            "memory:x",
            "nats://localhost:4222",
            "sqlite:///tmp/x.db",
            "sqlite:relative",
            "",
            "  ",
        ])
        .prop_map(|s| Value::String(s.into()))
        .boxed()
    } else if key == "lock" || key == "node" {
        prop_oneof![
            "[A-Za-z0-9_-]{1,10}".prop_map(Value::String),
            "[a-z]{1,5}\\.[a-z]{1,5}".prop_map(Value::String),
            text().prop_map(Value::String),
        ]
        .boxed()
    } else {
        text().prop_map(Value::String).boxed()
    };
    prop_oneof![12 => typed, 1 => any_value].boxed()
}

/// A config file: known keys with plausible or wrong values, unknown
/// keys, and text-level damage.
fn config_text() -> impl Strategy<Value = String> {
    let keys: Vec<&'static str> = STRINGS
        .iter()
        .chain(DURATIONS)
        .chain(COUNTS)
        .chain(BOOLS)
        .chain(&["child"])
        .copied()
        .collect();
    let entry = prop::sample::select(keys).prop_flat_map(|k| (Just(k.to_owned()), toml_value(k)));
    let extra = (text(), text().prop_map(Value::String));
    let table = (
        prop::collection::vec(entry, 0..10),
        prop::collection::vec(extra, 0..2),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(entries, extra, with_extra)| {
            let mut t = Table::new();
            for (k, v) in entries {
                t.insert(k, v);
            }
            if with_extra {
                for (k, v) in extra {
                    t.insert(k, v);
                }
            }
            toml::to_string(&t).unwrap_or_default()
        })
        .boxed();
    prop_oneof![
        6 => table.clone(),
        2 => (table, prop::collection::vec(mutation(), 1..3)).prop_map(|(t, ms)| {
            // The text-level mutations (truncation, bit flips, numbers).
            String::from_utf8_lossy(&super::mutate(t.as_bytes(), &ms)).into_owned()
        }),
        1 => text(),
        1 => prop::collection::vec(
            prop::sample::select(vec![
                "[", "]", "[[a]]", "=", "\"", "'''", "\n", "renew", " = ", "1", "#", "\\u",
                "é", "\r\n", "{", "}", ",", "[table]", "lock = \"a\"",
            ]),
            0..20,
        )
        .prop_map(|ps| ps.concat()),
    ]
}

/// Flags (and the environment, which clap folds into them).
fn args() -> impl Strategy<Value = AgentArgs> {
    (
        prop::option::of("[A-Za-z0-9_-]{1,10}"),
        prop::option::of("[a-z]{1,8}"),
        prop::option::of((1u64..5_000).prop_map(Duration::from_millis)),
        prop::option::of(2u32..20),
        any::<bool>(),
    )
        .prop_map(|(lock, node, renew, failures, hooks)| {
            let mut a = AgentArgs {
                lock,
                node,
                store: Some("memory:".into()),
                keeper_dir: Some("/tmp/putex-fuzz-keeper".into()),
                ..AgentArgs::default()
            };
            if hooks {
                a.healthcheck = Some("true".into());
                a.activate = Some("true".into());
                a.deactivate = Some("true".into());
            }
            a.timing.renew = renew;
            a.timing.failures = failures;
            a
        })
}

#[test]
fn fuzz_config_file() {
    fuzz("config file", (config_text(), args()), |(text, args)| {
        let file = match FileConfig::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                prop_assert!(!e.is_empty());
                return Ok(());
            }
        };
        for strict in [Strictness::Check, Strictness::Run] {
            match putex::cli::config::resolve(&args, &file, strict) {
                Ok(s) => {
                    // The flag beats the file.
                    if args.lock.is_some() {
                        prop_assert_eq!(s.lock.as_deref(), args.lock.as_deref());
                    }
                    if let Some(n) = &args.node {
                        prop_assert_eq!(s.node.as_str(), n.as_str());
                    }
                    if let Some(r) = args.timing.renew {
                        prop_assert_eq!(s.timing.renew(), r);
                    }
                    if let Some(f) = args.timing.failures {
                        prop_assert_eq!(s.timing_config.failures, f);
                    }
                    // Everything derived is computable.
                    let _ = s.timing.timeline(s.timing.store_timeout()).to_string();
                    let _ = s.store_id();
                }
                Err(CliError::Usage(m)) => prop_assert!(!m.is_empty()),
                Err(e) => prop_assert!(false, "not a usage error: {e:?}"),
            }
        }
        Ok(())
    });
}
