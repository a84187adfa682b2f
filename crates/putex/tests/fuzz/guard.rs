//! Guarded writes (`putex::locks::guard`) with keys and values as anyone may
//! pass them: any string as a key, any bytes as a value, sometimes past the
//! size limit. A held lease's write either lands — and reads back the same
//! — or is refused as invalid, naming the key or the limit; never a panic,
//! never "not held" while the lease holds, never a half-written batch.

use std::time::Duration;

use proptest::prelude::*;
use putex::core::TimingConfig;
use putex::locks::guard::{self, GuardError, MAX_VALUES};
use putex::locks::lease::{Lease, LeaseOptions};
use putex::store::{AnyStore, MemoryStore, Write};

use super::{bounded, fuzz, runtime, text};

/// Keys: any text, or nearly valid ones (dots in odd places, too long).
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => text(),
        3 => "[A-Za-z0-9_=/-]{1,12}(\\.[A-Za-z0-9_=/-]{1,12}){0,3}",
        1 => "\\.?[a-z]{0,3}\\.{1,2}[a-z]{0,3}\\.?",
        1 => (500usize..520).prop_map(|n| "k".repeat(n)),
    ]
    .boxed()
}

/// Values: small, empty, or around the limit.
fn value() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (MAX_VALUES - 2..MAX_VALUES + 3).prop_map(|n| vec![b'v'; n]),
    ]
    .boxed()
}

#[test]
fn fuzz_guarded_writes_take_any_key_and_value() {
    let rt = runtime();
    let store = AnyStore::from(MemoryStore::new());
    let timing = TimingConfig {
        renew: Duration::from_millis(100),
        failures: 3,
        confirm: 1,
        ..TimingConfig::default()
    };
    let lease = rt
        .block_on(Lease::acquire(
            store.clone(),
            LeaseOptions::new("fuzz", "node-a", timing).unwrap(),
        ))
        .unwrap();
    let writes = lease.guard();
    fuzz(
        "guarded writes",
        prop::collection::vec((key(), value()), 1..4),
        |batch| {
            rt.block_on(bounded("a guarded write", async {
                let batch: Vec<Write> = batch
                    .into_iter()
                    .map(|(key, value)| Write::Put { key, value })
                    .collect();
                match writes.batch(&batch).await {
                    Ok(_) => {
                        // A batch names each key once (or is refused).
                        for w in &batch {
                            if let Write::Put { key, value } = w {
                                let read = guard::get(&store, key).await.unwrap();
                                prop_assert_eq!(read.as_ref(), Some(value), "{}", key);
                            }
                        }
                    }
                    Err(GuardError::Invalid(e)) => {
                        let said = e.to_string();
                        prop_assert!(
                            said.contains("kv.")
                                || said.contains("bytes of values")
                                || said.contains("twice"),
                            "a refusal names its reason: {}",
                            said
                        );
                    }
                    Err(e) => prop_assert!(false, "held, yet: {e}"),
                }
                Ok(())
            }))
        },
    );
    assert!(lease.is_held());
}
