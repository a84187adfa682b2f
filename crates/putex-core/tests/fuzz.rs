//! Property-based fuzzing of what the core reads from others: lock records
//! (any bytes a KV tool can put in the store), and the agent that acts on
//! them, plus the timing settings a config file or flags hand it.
//!
//! Every target runs `PUTEX_FUZZ_CASES` cases (default [`DEFAULT_CASES`],
//! a few seconds in all); `PUTEX_FUZZ_CASES=100000 cargo test -p putex-core
//! --test fuzz -- --nocapture` is the long run (`docs/safety.md`,
//! "Fuzzing"). Each target prints how many inputs it tried and how long it
//! took. A failure prints the smallest input proptest could shrink it to;
//! fixed ones are frozen as `rNN_…` tests at the end of this file.
//!
//! What is asserted beyond "no panic":
//! - [`Observed::decode`] classifies exactly by the rules: a record only
//!   when every field is there with its type, `v` is 1 and the write id is
//!   not empty (extra fields are allowed); anything else is
//!   [`Observed::Garbage`], never a record and so never "ours".
//! - An agent treats garbage as the rules say: a holder that sees it loses
//!   the lock (H3) and stops the service at once; a standby takes it over
//!   only as a stale record (S1: a compare-and-swap on its revision, no
//!   sooner than W for `--max-lease`, then G' for `--max-gap`), never as
//!   absent, released or its own — also when the garbage is its own record
//!   with one field broken.

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use putex_core::mutation::{Mutations, Rule};
use putex_core::record::ceil_millis;
use putex_core::{
    Agent, AgentConfig, Drift, Entry, Hook, Identity, Input, KeeperCommand, LockRecord, LockState,
    Observed, Output, Role, StopKind, StoreOp, StoreOutcome, StoreTime, Timing, TimingConfig,
    Token,
};
use serde_json::{json, Map, Value};

/// Cases per target unless `PUTEX_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u32 = 256;

fn cases() -> u32 {
    std::env::var("PUTEX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Runs one target: `cases()` inputs of `strategy` through `test`; panics
/// with the shrunk input on a failure. Prints the figures.
fn fuzz<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    fuzz_n(name, cases(), strategy, test)
}

// The test's own wall-clock time, for the figures (the core never reads a
// clock; this harness does).
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn fuzz_n<S: Strategy>(
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
        max_shrink_iters: 4096,
        max_shrink_time: 60_000,
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

// ---------------------------------------------------------------------------
// Generators.

/// Strings as others may write them: empty, ASCII, any Unicode, sometimes
/// very long.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => ".{0,24}",
        2 => "[a-z0-9.-]{1,16}",
        1 => Just(String::new()),
        1 => (1usize..70_000).prop_map(|n| "é".repeat(n / 2)),
    ]
}

/// Numbers at the edges of every integer type, and floats.
fn number() -> impl Strategy<Value = Value> {
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
            json!(u64::MAX),
            json!(i64::MIN),
            json!(1.0),
            json!(-0.0),
            json!(1e300),
        ]),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
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
}

fn state() -> impl Strategy<Value = LockState> {
    prop::sample::select(vec![
        LockState::Confirming,
        LockState::Active,
        LockState::Released,
        LockState::Revoked,
    ])
}

/// A well-formed lock record with arbitrary contents.
fn lock_record() -> impl Strategy<Value = LockRecord> {
    (
        (text(), text(), text()),
        state(),
        text().prop_filter("a record has a write id", |w| !w.is_empty()),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |((node, machine, instance), state, write, lease_ms, gap_ms)| LockRecord {
                v: 1,
                node,
                machine,
                instance,
                state,
                write,
                lease_ms,
                gap_ms,
                to: None,
                hold_ms: 0,
                catch_up: false,
                paused: None,
                since: None,
                failsafe: None,
            },
        )
}

const FIELDS: [&str; 8] = [
    "v", "node", "machine", "instance", "state", "write", "lease_ms", "gap_ms",
];

/// One change to a record's JSON: what a KV tool, an old or new putex, or
/// a bit flip could leave behind.
#[derive(Clone, Debug)]
enum Mutation {
    /// Remove a field.
    Remove(usize),
    /// Give a field another value (often of the wrong type).
    Set(usize, Value),
    /// Another format version.
    Version(Value),
    /// A field putex does not know.
    Extra(String, Value),
    /// Wrap the record in an array or object.
    Wrap(bool),
    /// Keep only the first bytes of the text.
    Truncate(prop::sample::Index),
    /// Flip bits of one byte of the text.
    Flip(prop::sample::Index, u8),
    /// Write a field twice (the second value differs).
    Duplicate(usize, Value),
    /// Replace the text of the first number with another literal.
    Literal(&'static str),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let field = 0..FIELDS.len();
    prop_oneof![
        2 => field.clone().prop_map(Mutation::Remove),
        4 => (field.clone(), json_value()).prop_map(|(f, v)| Mutation::Set(f, v)),
        2 => (field.clone(), number()).prop_map(|(f, v)| Mutation::Set(f, v)),
        2 => (field.clone(), text().prop_map(Value::String)).prop_map(|(f, v)| Mutation::Set(f, v)),
        2 => number().prop_map(Mutation::Version),
        2 => (text(), json_value()).prop_map(|(k, v)| Mutation::Extra(k, v)),
        1 => any::<bool>().prop_map(Mutation::Wrap),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (field, json_value()).prop_map(|(f, v)| Mutation::Duplicate(f, v)),
        1 => prop::sample::select(vec![
            "18446744073709551616",
            "-1",
            "1e400",
            "1.0",
            "-0",
            "00",
            "1e2",
            "0x10",
            "NaN",
            "340282366920938463463374607431768211456",
        ])
        .prop_map(Mutation::Literal),
    ]
}

/// Applies mutations to a record's JSON text. Value-level mutations are
/// applied while the text still parses as JSON; text-level ones always.
fn mutate(bytes: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for m in mutations {
        let value = serde_json::from_slice::<Value>(&out).ok();
        let obj = |v: Option<Value>| match v {
            Some(Value::Object(o)) => Some(o),
            _ => None,
        };
        match m {
            Mutation::Remove(f) => {
                if let Some(mut o) = obj(value) {
                    o.remove(FIELDS[*f]);
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Set(f, v) => {
                if let Some(mut o) = obj(value) {
                    o.insert(FIELDS[*f].into(), v.clone());
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Version(v) => {
                if let Some(mut o) = obj(value) {
                    o.insert("v".into(), v.clone());
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Extra(k, v) => {
                if let Some(mut o) = obj(value) {
                    o.insert(k.clone(), v.clone());
                    out = serde_json::to_vec(&o).unwrap();
                }
            }
            Mutation::Wrap(array) => {
                if let Some(v) = value {
                    out = if *array {
                        serde_json::to_vec(&json!([v])).unwrap()
                    } else {
                        serde_json::to_vec(&json!({ "record": v })).unwrap()
                    };
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
            Mutation::Duplicate(f, v) => {
                // `{"v":1,...}` → `{"v":<v>,"v":1,...}`: serde refuses
                // duplicate fields.
                if out.first() == Some(&b'{') {
                    let mut text = format!("{{{}:{},", json!(FIELDS[*f]), v).into_bytes();
                    text.extend_from_slice(&out[1..]);
                    out = text;
                }
            }
            Mutation::Literal(lit) => {
                if let Some(start) = out.iter().position(|b| b.is_ascii_digit()) {
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

/// The rules, written out independently of serde: what a value must be to
/// be a lock record.
fn expected_record(v: &Value) -> Option<LockRecord> {
    let o: &Map<String, Value> = v.as_object()?;
    let uint = |k: &str| o.get(k)?.as_u64();
    let string = |k: &str| o.get(k)?.as_str().map(str::to_owned);
    if uint("v")? != 1 {
        return None;
    }
    let state = match o.get("state")?.as_str()? {
        "confirming" => LockState::Confirming,
        "active" => LockState::Active,
        "released" => LockState::Released,
        "revoked" => LockState::Revoked,
        _ => return None,
    };
    let write = string("write")?;
    if write.is_empty() {
        return None;
    }
    Some(LockRecord {
        v: 1,
        node: string("node")?,
        machine: string("machine")?,
        instance: string("instance")?,
        state,
        write,
        lease_ms: uint("lease_ms")?,
        gap_ms: uint("gap_ms")?,
        to: None,
        hold_ms: 0,
        catch_up: false,
        paused: None,
        since: None,
        failsafe: None,
    })
}

/// Bytes that are not a record: random, or a record (perhaps the agent's
/// own) with mutations and, if those left it valid, another version.
#[derive(Clone, Debug)]
enum Garbage {
    Bytes(Vec<u8>),
    Mutated(Vec<Mutation>),
}

fn garbage() -> impl Strategy<Value = Garbage> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Garbage::Bytes),
        3 => prop::collection::vec(mutation(), 1..4).prop_map(Garbage::Mutated),
    ]
}

impl Garbage {
    /// The garbage made from `current` (the record in the store, if any).
    fn bytes(&self, current: Option<&[u8]>) -> Vec<u8> {
        match self {
            Garbage::Bytes(b) => b.clone(),
            Garbage::Mutated(ms) => {
                let base = current.map(<[u8]>::to_vec).unwrap_or_else(|| {
                    br#"{"v":1,"node":"b","machine":"mb","instance":"ib","state":"active","write":"ib-1","lease_ms":10000,"gap_ms":2000}"#.to_vec()
                });
                let mut out = mutate(&base, ms);
                if let Observed::Record(_) = Observed::decode(&out) {
                    out = mutate(&out, &[Mutation::Version(json!(2))]);
                }
                if let Observed::Record(_) = Observed::decode(&out) {
                    out = b"not a record".to_vec();
                }
                out
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Records.

#[test]
fn fuzz_lock_record_any_bytes() {
    fuzz(
        "lock record, any bytes",
        prop::collection::vec(any::<u8>(), 0..256),
        |bytes| {
            let observed = Observed::decode(&bytes);
            let by_rules = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| expected_record(&v));
            prop_assert_eq!(observed.record(), by_rules.as_ref());
            Ok(())
        },
    );
}

#[test]
fn fuzz_lock_record_round_trip() {
    fuzz("lock record, round trip", lock_record(), |r| {
        let bytes = r.encode();
        prop_assert_eq!(Observed::decode(&bytes), Observed::Record(r.clone()));
        // Whatever it advertises, the durations are representable.
        prop_assert_eq!(ceil_millis(r.lease()), r.lease_ms);
        prop_assert_eq!(ceil_millis(r.gap()), r.gap_ms);
        Ok(())
    });
}

#[test]
fn fuzz_lock_record_nearly_valid() {
    fuzz(
        "lock record, nearly valid",
        (lock_record(), prop::collection::vec(mutation(), 1..5)),
        |(r, ms)| {
            let bytes = mutate(&r.encode(), &ms);
            let observed = Observed::decode(&bytes);
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) if !has_duplicate_keys(&bytes) => {
                    let by_rules = expected_record(&v);
                    prop_assert_eq!(observed.record(), by_rules.as_ref());
                }
                // `1e400` is JSON, but no `Value`: in a field putex does
                // not know, it is skipped like any other value.
                Err(e) if e.to_string().contains("number out of range") => {
                    if let Observed::Record(r) = observed {
                        prop_assert_eq!(Observed::decode(&r.encode()), Observed::Record(r));
                    }
                }
                _ => prop_assert_eq!(observed, Observed::Garbage),
            }
            Ok(())
        },
    );
}

/// Whether the JSON text writes some object key twice (serde_json's
/// `Value` keeps the last one; a record with a field twice is refused).
fn has_duplicate_keys(bytes: &[u8]) -> bool {
    struct Dup(bool);
    impl<'de> serde::de::Visitor<'de> for &mut Dup {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
            while a.next_element_seed(&mut *self)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
            let mut keys = std::collections::HashSet::new();
            while let Some(k) = a.next_key::<String>()? {
                if !keys.insert(k) {
                    self.0 = true;
                }
                a.next_value_seed(&mut *self)?;
            }
            Ok(())
        }
    }
    impl<'de> serde::de::DeserializeSeed<'de> for &mut Dup {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    let mut dup = Dup(false);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let _ = serde::de::DeserializeSeed::deserialize(&mut dup, &mut de);
    dup.0
}

// ---------------------------------------------------------------------------
// Timing settings (from flags, the environment or a config file).

/// Durations from zero to `Duration::MAX`, mostly plausible.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (0u64..120_000).prop_map(Duration::from_millis),
        2 => any::<u64>().prop_map(Duration::from_nanos),
        1 => any::<u64>().prop_map(Duration::from_secs),
        1 => Just(Duration::MAX),
        1 => Just(Duration::ZERO),
    ]
}

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..20, 1 => any::<u32>()]
}

fn timing_config() -> impl Strategy<Value = TimingConfig> {
    (
        (duration(), count(), count(), count(), count()),
        prop_oneof![0u32..300_000, any::<u32>()],
        (
            prop::option::of(duration()),
            prop::option::of(duration()),
            any::<bool>(),
            duration(),
        ),
        (
            prop::option::of(duration()),
            prop::option::of(duration()),
            prop::option::of(duration()),
        ),
        (duration(), duration(), prop::option::of(duration())),
    )
        .prop_map(
            |(
                (renew, failures, confirm, unhealthy, successes),
                ppm,
                (max_lease, max_gap, allow_short_lease, start_grace),
                (sched_margin, healthcheck_timeout, store_timeout),
                (activate_timeout, stop_timeout, emergency_timeout),
            )| TimingConfig {
                renew,
                failures,
                confirm,
                unhealthy,
                successes,
                max_drift: Drift::from_ppm(ppm),
                max_lease,
                max_gap,
                allow_short_lease,
                start_grace,
                sched_margin,
                healthcheck_timeout,
                store_timeout,
                activate_timeout,
                stop_timeout,
                emergency_timeout,
                ..TimingConfig::default()
            },
        )
}

#[test]
fn fuzz_timing_settings() {
    fuzz(
        "timing settings",
        (timing_config(), duration(), duration(), duration()),
        |(config, round_trip, lease, gap)| {
            let Ok(t) = config.validate() else {
                return Ok(());
            };
            // Everything derived from valid settings is computable, and so
            // is everything the agent does with them and a record's advert.
            let _ = (t.lease(), t.gap(), t.emergency_budget());
            let w = t.staleness_wait(t.lease_against(lease));
            prop_assert!(w >= t.lease());
            let _ = t.staleness_wait(t.lease_unknown()) + t.gap_unknown();
            let _ = t.gap_against(gap);
            let _ = t.advertised_timing_warning(lease, gap);
            let _ = t.timeline(round_trip.min(t.store_timeout())).to_string();
            let mut world = World::new(t, 1);
            world.run_steps(200);
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------
// The agent against garbage in its lock record.

const SEC: u64 = 1_000_000_000;

fn at(nanos: u64) -> putex_core::Instant {
    putex_core::Instant::from_nanos(nanos)
}

/// What happened, for the checks.
#[derive(Clone, Debug)]
enum Note {
    /// Garbage was written to the lock record by someone else, while the
    /// service ran or not.
    Garbage { token: Token, running: bool },
    /// The agent wrote the lock record (`expected`: the CAS's expectation).
    LockWrite {
        expected: Option<Token>,
        outcome: Option<Token>,
    },
    /// The fence hook ran: the tenure activates.
    Fence(Token),
    /// A stop ran.
    Stop(StopKind),
}

/// One agent with a store that answers at once, whose clock is the
/// agent's, and that someone else writes garbage into.
struct World {
    agent: Agent,
    now: u64,
    lock: Option<Entry>,
    probe: Option<Entry>,
    revision: u64,
    inputs: VecDeque<Input>,
    log: Vec<(u64, Note)>,
    running: bool,
}

impl World {
    fn new(timing: Timing, seed: u64) -> World {
        World::with(timing, seed, Mutations::NONE)
    }

    fn with(timing: Timing, seed: u64, mutations: Mutations) -> World {
        let now = 100 * SEC;
        let identity = Identity {
            node: "a".into(),
            machine: "ma".into(),
            instance: format!("ia{seed}"),
        };
        let config = AgentConfig {
            supervised_stops: true,
            mutations,
            ..AgentConfig::new(identity, timing)
        };
        let mut w = World {
            agent: Agent::new(config, at(now)),
            now,
            lock: None,
            probe: None,
            revision: 0,
            inputs: VecDeque::new(),
            log: Vec::new(),
            running: false,
        };
        w.pump();
        w
    }

    fn entry(&mut self, value: Vec<u8>) -> Entry {
        self.revision += 1;
        Entry {
            value,
            token: Token::new(1, self.revision),
            time: StoreTime {
                era: 1,
                nanos: self.now,
            },
        }
    }

    fn store(&mut self, op: StoreOp) -> StoreOutcome {
        let lock_key = |k| k == putex_core::store::Key::Lock;
        match op {
            StoreOp::Get { key, .. } => StoreOutcome::Read(if lock_key(key) {
                self.lock.clone()
            } else {
                self.probe.clone()
            }),
            StoreOp::Put { key, value } if lock_key(key) => {
                let outcome = self.write_lock(value);
                self.log.push((
                    self.now,
                    Note::LockWrite {
                        expected: None,
                        outcome: written(&outcome),
                    },
                ));
                outcome
            }
            StoreOp::Put { value, .. } => {
                let e = self.entry(value);
                let token = e.token;
                self.probe = Some(e);
                StoreOutcome::Written(token)
            }
            StoreOp::Create { value, .. } => {
                let outcome = if self.lock.is_some() {
                    StoreOutcome::Conflict
                } else {
                    self.write_lock(value)
                };
                self.log.push((
                    self.now,
                    Note::LockWrite {
                        expected: None,
                        outcome: written(&outcome),
                    },
                ));
                outcome
            }
            StoreOp::Update {
                value, expected, ..
            } => {
                let outcome = if self.lock.as_ref().map(|e| e.token) == Some(expected) {
                    self.write_lock(value)
                } else {
                    StoreOutcome::Conflict
                };
                self.log.push((
                    self.now,
                    Note::LockWrite {
                        expected: Some(expected),
                        outcome: written(&outcome),
                    },
                ));
                outcome
            }
        }
    }

    fn write_lock(&mut self, value: Vec<u8>) -> StoreOutcome {
        let e = self.entry(value);
        let token = e.token;
        self.lock = Some(e.clone());
        self.inputs.push_back(Input::Watch(Some(e)));
        StoreOutcome::Written(token)
    }

    /// Someone else writes `garbage` over the lock record.
    fn write_garbage(&mut self, garbage: &Garbage) {
        let current = self.lock.as_ref().map(|e| e.value.clone());
        let bytes = garbage.bytes(current.as_deref());
        assert_eq!(Observed::decode(&bytes), Observed::Garbage);
        let e = self.entry(bytes);
        self.log.push((
            self.now,
            Note::Garbage {
                token: e.token,
                running: self.running,
            },
        ));
        self.lock = Some(e.clone());
        self.inputs.push_back(Input::Watch(Some(e)));
        self.pump();
    }

    /// Answers every output at once (healthy checks, hooks and stops that
    /// succeed, a keeper that acknowledges) until the agent is quiet.
    fn pump(&mut self) {
        loop {
            while let Some(o) = self.agent.poll_output() {
                match o {
                    Output::Store(req) => {
                        let outcome = self.store(req.op);
                        // The reply first, then the watch event of a write.
                        self.inputs.push_front(Input::Store {
                            id: req.id,
                            outcome,
                        });
                    }
                    Output::HealthCheck { id, .. } => {
                        self.inputs.push_back(Input::Health { id, ok: true })
                    }
                    Output::Fence { token, .. } => {
                        self.log.push((self.now, Note::Fence(token)));
                        self.inputs.push_back(Input::Hook {
                            hook: Hook::Fence,
                            ok: true,
                        });
                    }
                    Output::Activate { .. } => {
                        self.running = true;
                        self.inputs.push_back(Input::Hook {
                            hook: Hook::Activate,
                            ok: true,
                        });
                    }
                    Output::Stop { id, kind, .. } => {
                        self.running = false;
                        self.log.push((self.now, Note::Stop(kind)));
                        self.inputs.push_back(Input::Stopped { id, ok: true });
                    }
                    Output::Keeper(command) => {
                        if let KeeperCommand::Arm(_) = command {
                            self.inputs
                                .push_back(Input::KeeperAck { command, ok: true });
                        }
                    }
                    Output::Rejoin { .. } => self.inputs.push_back(Input::Hook {
                        hook: Hook::Rejoin,
                        ok: true,
                    }),
                    Output::PersistHighest(_)
                    | Output::SamplePosition
                    | Output::FailsafeAnswer { .. }
                    | Output::FailsafeAsk { .. }
                    | Output::Event(_)
                    | Output::Exit(_) => {}
                }
            }
            match self.inputs.pop_front() {
                Some(i) => self.agent.handle(at(self.now), i),
                None => break,
            }
        }
    }

    /// Wakes the agent at its next `steps` timeouts, whenever they are.
    fn run_steps(&mut self, steps: usize) {
        for _ in 0..steps {
            let Some(next) = self.agent.poll_timeout() else {
                return;
            };
            // A timeout beyond a day (T of centuries saturates the clock)
            // is never reached by a real host.
            if next.as_nanos() > self.now.saturating_add(86_400 * SEC) {
                return;
            }
            self.now = self.now.max(next.as_nanos());
            self.agent.handle_timeout(at(self.now));
            self.pump();
        }
    }

    /// Moves time to `until`, waking the agent at each of its timeouts.
    fn run_until(&mut self, until: u64) {
        while let Some(next) = self.agent.poll_timeout() {
            let next = next.as_nanos();
            if next > until {
                break;
            }
            self.now = self.now.max(next);
            self.agent.handle_timeout(at(self.now));
            self.pump();
        }
        self.now = self.now.max(until);
        self.agent.handle_timeout(at(self.now));
        self.pump();
    }
}

fn written(o: &StoreOutcome) -> Option<Token> {
    match o {
        StoreOutcome::Written(t) => Some(t.to_owned()),
        _ => None,
    }
}

/// A scenario: timing, and garbage written at moments after the start.
#[derive(Clone, Debug)]
struct Scenario {
    max_lease: Option<u64>,
    max_gap: Option<u64>,
    /// (ms after the previous write, what to write)
    garbage: Vec<(u64, Garbage)>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::option::of(prop::sample::select(vec![10u64, 15, 30])),
        prop::option::of(prop::sample::select(vec![2u64, 3, 5])),
        prop::collection::vec(
            (
                prop_oneof![0u64..3_000, 3_000u64..30_000, Just(0)],
                garbage(),
            ),
            1..5,
        ),
    )
        .prop_map(|(max_lease, max_gap, garbage)| Scenario {
            max_lease,
            max_gap,
            garbage,
        })
}

/// Plays a scenario and checks the rules on what the agent did.
fn check_scenario(s: &Scenario, mutations: Mutations) -> Result<(), TestCaseError> {
    let timing = TimingConfig {
        max_lease: s.max_lease.map(Duration::from_secs),
        max_gap: s.max_gap.map(Duration::from_secs),
        ..TimingConfig::default()
    }
    .validate()
    .expect("valid timing");
    let renew = timing.renew().as_nanos() as u64;
    // W and G' for a holder whose T and G nobody can read (S1, S4).
    let w = timing
        .staleness_wait(timing.lease_unknown().max(timing.lease()))
        .as_nanos() as u64;
    let g = timing.gap_unknown().as_nanos() as u64;
    let mut world = World::with(timing, 7, mutations);
    // First a holder: S4 on the empty store, then active.
    world.run_until(world.now + 40 * SEC);
    prop_assert!(world.running, "the agent never activated on its own");
    let mut last = world.now;
    for (after, garbage) in &s.garbage {
        world.run_until(world.now + after * 1_000_000);
        let was_running = world.running;
        world.write_garbage(garbage);
        last = world.now;
        // H3: a holder that sees garbage has lost the lock: emergency stop
        // at once (the store answers at once here).
        if was_running {
            prop_assert!(!world.running, "still running over garbage");
        }
    }
    world.run_until(last + w + g + 6 * renew);
    let role = world.agent.role();

    // The checks, over the whole log.
    let mut garbage_at: Vec<(u64, Token)> = Vec::new();
    // The last acquisition that landed, and the wait it owes (S2, S4).
    let mut acquired: Option<(u64, u64)> = None;
    let mut activated_after_last = false;
    // A stop owed since garbage landed under a running service (H3).
    let mut owed_stop: Option<u64> = None;
    for (t, note) in &world.log {
        match note {
            Note::Garbage { token, running } => {
                garbage_at.push((*t, *token));
                if *running {
                    owed_stop = Some(*t);
                }
            }
            Note::LockWrite { expected, outcome } => {
                let over_garbage = garbage_at.iter().find(|(_, g)| Some(*g) == *expected);
                if let Some((since, token)) = over_garbage {
                    // S1: a CAS on garbage only after W since it was written.
                    prop_assert!(
                        *t >= since + w,
                        "wrote over garbage {token} {} ms after it appeared (W = {} ms)",
                        (t - since) / 1_000_000,
                        w / 1_000_000
                    );
                    if outcome.is_some() {
                        // S2: then G' for a holder whose G nobody can read.
                        acquired = Some((*t, g));
                    }
                } else if expected.is_none() {
                    // A create only on the empty store: garbage is never
                    // taken for an absent record.
                    prop_assert!(garbage_at.is_empty(), "a create over garbage at {t}");
                    if outcome.is_some() {
                        acquired = Some((*t, w + g));
                    }
                }
            }
            Note::Fence(token) => {
                // Fencing tokens only grow: above every garbage revision.
                if let Some((_, g)) = garbage_at.last() {
                    prop_assert!(token > g, "activated on {token}, garbage at {g}");
                }
                prop_assert!(owed_stop.is_none(), "activated before stopping");
                if let Some((acked, owed)) = acquired.take() {
                    prop_assert!(
                        *t >= acked + owed,
                        "activated {} ms after acquiring (owed {} ms)",
                        (t - acked) / 1_000_000,
                        owed / 1_000_000
                    );
                }
                if *t >= last {
                    activated_after_last = true;
                }
            }
            Note::Stop(kind) => {
                if let Some(since) = owed_stop.take() {
                    prop_assert_eq!(*kind, StopKind::Emergency);
                    prop_assert!(*t == since, "stopped {} ns after garbage", t - since);
                }
            }
        }
    }
    // Liveness: garbage is stale, not a lock held forever.
    prop_assert!(
        activated_after_last && role == Role::Active,
        "not active again after the garbage (role {role:?})"
    );
    Ok(())
}

#[test]
fn fuzz_agent_against_garbage_records() {
    // Each case simulates a few minutes of one agent: fewer cases.
    fuzz_n(
        "agent vs garbage lock records",
        (cases() / 4).max(16),
        scenario(),
        |s| check_scenario(&s, Mutations::NONE),
    );
}

/// The checks above can fail: with a rule switched off, they do.
#[test]
fn fuzz_agent_checks_catch_broken_rules() {
    let s = Scenario {
        max_lease: None,
        max_gap: None,
        garbage: vec![(1_000, Garbage::Bytes(b"{}".to_vec()))],
    };
    check_scenario(&s, Mutations::NONE).unwrap();
    for rule in [Rule::NoDriftFactor, Rule::NoGap, Rule::TakeoverByPut] {
        assert!(
            check_scenario(&s, Mutations::only(rule)).is_err(),
            "{rule:?} not caught"
        );
    }
}

// ---------------------------------------------------------------------------
// Regressions found by the fuzz targets.

/// r40: serde_json skips unknown fields without checking that their
/// strings are UTF-8, so a record whose extra field held a broken byte
/// (not JSON at all) was read as a record. Found by
/// `fuzz_lock_record_nearly_valid` (a bit flip in an extra field).
#[test]
fn r40_invalid_utf8_in_an_unknown_field_is_garbage() {
    let valid = r#"{"v":1,"node":"a","machine":"m","instance":"i","state":"active","write":"w","lease_ms":1,"gap_ms":1,"x":["é"]}"#.as_bytes().to_vec();
    assert!(Observed::decode(&valid).record().is_some());
    let mut broken = valid.clone();
    let at = broken.iter().position(|b| *b == 0xc3).unwrap();
    broken[at] ^= 0x20; // 0xc3 → 0xe3: a three-byte lead, one continuation
    assert!(std::str::from_utf8(&broken).is_err());
    assert_eq!(Observed::decode(&broken), Observed::Garbage);
}

/// r41: the agent caught up with missed rounds one R at a time. With a tiny
/// R (3 ns passes validation) and an hour without a wake-up (a suspend, a
/// stall), one `handle_timeout` stepped 10¹² times. Found by
/// `fuzz_timing_settings`.
#[test]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)] // a wall-clock bound
fn r41_missed_rounds_are_skipped_in_one_step() {
    let timing = TimingConfig {
        renew: Duration::from_nanos(3),
        ..TimingConfig::default()
    }
    .validate()
    .unwrap();
    let mut world = World::new(timing, 2);
    let started = std::time::Instant::now();
    world.now += 3600 * SEC;
    world.agent.handle_timeout(at(world.now));
    world.pump();
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// r42: `TimingConfig::validate` multiplied and added the settings as
/// given: a `--renew` of a few billion years times `--confirm 17`, or two
/// huge timeouts, overflowed and panicked instead of naming the option.
/// Found by `fuzz_timing_settings`.
#[test]
fn r42_huge_timing_settings_are_refused_by_name() {
    let huge = Duration::from_secs(1_085_102_592_571_150_096);
    let e = TimingConfig {
        renew: huge,
        confirm: 17,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap_err();
    assert!(
        matches!(
            e,
            putex_core::TimingError::TooLong {
                option: "--renew",
                ..
            }
        ),
        "{e}"
    );
    let e = TimingConfig {
        renew: Duration::from_secs(1 << 33),
        failures: u32::MAX,
        ..TimingConfig::default()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("--failures"), "{e}");
    let e = TimingConfig {
        healthcheck_timeout: Some(Duration::MAX),
        store_timeout: Some(Duration::MAX),
        ..TimingConfig::default()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("--healthcheck-timeout"), "{e}");
}
