//! The page's data read from stores of fuzzed records: the part of the
//! integration tests' store-records fuzz target (`tests/fuzz/records.rs`)
//! that reads every lock as the page does. It lives here because
//! [`collect`](super::collect) is crate-private; the harness, the strategy
//! and the case count are those of the integration tests, whose files are
//! included below (they name this crate `putex`: see `lib.rs`).

use proptest::test_runner::TestCaseError;

#[allow(dead_code)]
#[path = "../../../tests/fuzz/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../../../tests/fuzz/stored.rs"]
mod stored;

use stored::{records, seeded};
use support::{bounded, cases, fuzz_n, runtime, Bytes};

/// What `/ui/status.json` reads from a store of such records: an answer,
/// within the time limit, that serializes.
async fn page_data(records: Vec<(String, Bytes)>) -> Result<(), TestCaseError> {
    let store = seeded(&records).await;
    let page = bounded("web::collect", super::collect(&store, None))
        .await
        .expect("the page's data");
    let _ = serde_json::to_string(&page).unwrap();
    Ok(())
}

#[test]
fn fuzz_page_data_from_records_in_the_store() {
    let rt = runtime();
    // As the store-records target: each case seeds a store, fewer cases.
    fuzz_n(
        "records in the store: the web page",
        (cases() / 2).max(16),
        records(),
        |records| rt.block_on(page_data(records)),
    );
}
