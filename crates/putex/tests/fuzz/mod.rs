//! Property-based fuzzing of every parser of what someone else wrote: the
//! records a KV tool can put in the store, store URLs, the config file, the
//! HTTP API's bodies and paths, and the keeper's socket. (The lock record
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
//! One target runs inside the crate, as a unit test: the web status page's
//! reader (`observe::web`) is crate-private, so the part of the
//! store-records target that reads every lock as the page does is
//! `observe::web::tests::fuzz_page_data_from_records_in_the_store` in
//! `src/observe/web/tests.rs` (`cargo test -p putex --lib`; it honours
//! `PUTEX_FUZZ_CASES` too). It includes [`support`] and [`stored`], so its
//! harness, strategy and case count are the ones here.
//!
//! The inputs are of two kinds: random (bytes, any JSON, any string) and
//! nearly valid — a well-formed value with a field removed, retyped or
//! duplicated, numbers at every integer edge, long Unicode strings, extra
//! fields, truncation, a flipped bit ([`Mutation`]).

mod config;
mod http;
mod keeper;
mod records;
mod stored;
mod support;
mod urls;

pub use support::*;
