//! Property-based fuzzing of every parser of what someone else wrote: the
//! records a KV tool can put in the store, store URLs, the config file, the
//! HTTP API's bodies and paths, the keeper's socket, and guarded writes. (The lock record
//! and the agent's handling of garbage are fuzzed in putex-core's
//! `tests/fuzz.rs`.)
//!
//! Every target runs `PUTEX_FUZZ_CASES` cases (default [`DEFAULT_CASES`],
//! seconds in all, so `scripts/test` runs them); `PUTEX_FUZZ_CASES=100000
//! cargo test -p putex --test tests fuzz:: -- --nocapture` is the long run
//! (`docs/safety.md`, "Fuzzing"). Each target prints how many inputs it
//! tried and how long it took; a failure prints the smallest input proptest
//! shrank it to. Bugs found are frozen as `rNN_…` tests in the target's
//! module.
//!
//! The inputs are of two kinds: random (bytes, any JSON, any string) and
//! nearly valid — a well-formed value with a field removed, retyped or
//! duplicated, numbers at every integer edge, long Unicode strings, extra
//! fields, truncation, a flipped bit ([`Mutation`]).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde::Serialize;
use serde_json::{json, Value};

mod config;
mod guard;
mod http;
mod keeper;
mod records;
mod urls;

/// Cases per target unless `PUTEX_FUZZ_CASES` says otherwise.
pub const DEFAULT_CASES: u32 = 256;

/// `PUTEX_FUZZ_CASES`, or [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("PUTEX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Runs one target: `cases` inputs of `strategy` through `test`; panics
/// with the shrunk input on a failure. Prints the figures.
pub fn fuzz_n<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    let started = std::time::Instant::now();
    let result = TestRunner::new(config).run(&strategy, test);
    eprintln!(
        "fuzz {name}: {cases} cases in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
}

/// [`fuzz_n`] with [`cases`].
pub fn fuzz<S: Strategy>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    fuzz_n(name, cases(), strategy, test)
}

/// A runtime for the async targets (one per target, reused by its cases).
pub use crate::common::runtime;

/// Runs `f` with a time limit: a parser that hangs is as bad as one that
/// panics.
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(20), f).await {
        Ok(t) => t,
        Err(_) => panic!("{what}: no answer within 20 s"),
    }
}

// ---------------------------------------------------------------------------
// Generators.

/// Strings as others may write them: empty, ASCII, any Unicode, sometimes
/// very long.
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![
        6 => ".{0,24}",
        2 => "[A-Za-z0-9._-]{1,16}",
        1 => Just(String::new()),
        1 => (1usize..70_000).prop_map(|n| "é".repeat(n / 2)),
    ]
    .boxed()
}

/// Numbers at the edges of every integer type, and floats.
pub fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(-1),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(i32::MAX),
            json!(i32::MIN),
            json!(u64::MAX),
            json!(u64::MAX / 1000),
            json!(u64::MAX / 10),
            json!(i64::MIN),
            json!(1.5),
            json!(-0.0),
            json!(1e300),
        ]),
    ]
    .boxed()
}

/// Any JSON value, a few levels deep.
pub fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// One change to a value's JSON text.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Remove one of the object's fields.
    Remove(prop::sample::Index),
    /// Give one of its fields another value (often of another type).
    Set(prop::sample::Index, Value),
    /// A field nobody knows.
    Extra(String, Value),
    /// Wrap the value in an array or object.
    Wrap(bool),
    /// Keep only the first bytes.
    Truncate(prop::sample::Index),
    /// Flip bits of one byte.
    Flip(prop::sample::Index, u8),
    /// Write one of its fields twice.
    Duplicate(prop::sample::Index, Value),
    /// Replace the text of the first number with another literal.
    Literal(&'static str),
}

/// One [`Mutation`].
pub fn mutation() -> BoxedStrategy<Mutation> {
    let index = any::<prop::sample::Index>;
    prop_oneof![
        2 => index().prop_map(Mutation::Remove),
        3 => (index(), json_value()).prop_map(|(i, v)| Mutation::Set(i, v)),
        3 => (index(), number()).prop_map(|(i, v)| Mutation::Set(i, v)),
        2 => (index(), text().prop_map(Value::String)).prop_map(|(i, v)| Mutation::Set(i, v)),
        2 => (text(), json_value()).prop_map(|(k, v)| Mutation::Extra(k, v)),
        1 => any::<bool>().prop_map(Mutation::Wrap),
        1 => index().prop_map(Mutation::Truncate),
        1 => (index(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (index(), json_value()).prop_map(|(i, v)| Mutation::Duplicate(i, v)),
        1 => prop::sample::select(vec![
            "18446744073709551616",
            "-1",
            "1e400",
            "1.0",
            "-0",
            "00",
            "0x10",
            "NaN",
            "340282366920938463463374607431768211456",
        ])
        .prop_map(Mutation::Literal),
    ]
    .boxed()
}

/// Applies mutations to JSON text: object-level ones while it is still an
/// object, text-level ones always.
pub fn mutate(bytes: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for m in mutations {
        let object = match serde_json::from_slice::<Value>(&out) {
            Ok(Value::Object(o)) => Some(o),
            _ => None,
        };
        let pick = |o: &serde_json::Map<String, Value>, i: &prop::sample::Index| {
            (!o.is_empty()).then(|| o.keys().nth(i.index(o.len())).cloned().unwrap())
        };
        match m {
            Mutation::Remove(i) => {
                if let Some(mut o) = object {
                    if let Some(k) = pick(&o, i) {
                        o.remove(&k);
                    }
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Set(i, v) => {
                if let Some(mut o) = object {
                    if let Some(k) = pick(&o, i) {
                        o.insert(k, v.clone());
                    }
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Extra(k, v) => {
                if let Some(mut o) = object {
                    o.insert(k.clone(), v.clone());
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Wrap(array) => {
                if let Ok(v) = serde_json::from_slice::<Value>(&out) {
                    let w = if *array {
                        json!([v])
                    } else {
                        json!({ "value": v })
                    };
                    out = serde_json::to_vec(&w).unwrap();
                }
            }
            Mutation::Truncate(i) => {
                let n = i.index(out.len() + 1);
                out.truncate(n);
            }
            Mutation::Flip(i, x) => {
                if !out.is_empty() {
                    let n = i.index(out.len());
                    out[n] ^= x;
                }
            }
            Mutation::Duplicate(i, v) => {
                if let Some(o) = object {
                    if let Some(k) = pick(&o, i) {
                        let mut text = format!("{{{}:{},", json!(k), v).into_bytes();
                        text.extend_from_slice(&out[1..]);
                        out = text;
                    }
                }
            }
            Mutation::Literal(lit) => {
                if let Some(start) = out.iter().position(u8::is_ascii_digit) {
                    let end = out[start..]
                        .iter()
                        .position(|b| !b.is_ascii_digit())
                        .map_or(out.len(), |e| start + e);
                    out.splice(start..end, lit.bytes());
                }
            }
        }
    }
    out
}

/// Bytes that show as text in a failure report.
#[derive(Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// The bytes of a value others may have written where `valid` belongs:
/// the value itself, nearly valid variants of it, any JSON, any bytes.
pub fn nearly<T: Serialize + std::fmt::Debug>(
    valid: impl Strategy<Value = T> + Clone + 'static,
) -> BoxedStrategy<Bytes> {
    prop_oneof![
        2 => valid.clone().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        6 => (valid, prop::collection::vec(mutation(), 1..4))
            .prop_map(|(v, ms)| mutate(&serde_json::to_vec(&v).unwrap(), &ms)),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
    .prop_map(Bytes)
    .boxed()
}
