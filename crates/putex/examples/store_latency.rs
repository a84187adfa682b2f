//! Measures store latency: create, compare-and-swap update and leader read,
//! median and p99, one operation at a time.
//!
//! ```text
//! cargo run --release -p putex --example store_latency -- [--ops N] [STORE_URL...]
//! ```
//!
//! It always measures the embedded SQLite store in a temporary directory,
//! then each store URL given (e.g. `nats://127.0.0.1:4222`). The timing
//! rules want R at least ten times the p99 of a compare-and-swap.

use std::time::{Duration, Instant};

use clap::Parser;

use putex::store::{AnyStore, ReadMode, SqliteStore, Store, StoreUrl};
use putex_testkit::bench::at_least_one;

const DEADLINE: Duration = Duration::from_secs(5);

/// Store latency, one operation at a time.
///
/// Create, compare-and-swap update and leader read, median, p99 and max,
/// on the embedded SQLite store in a temporary directory, then on each
/// store URL given.
#[derive(Parser)]
#[command(name = "store_latency")]
struct Args {
    /// Operations of each kind on each store
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = at_least_one)]
    ops: usize,
    /// More stores to measure (e.g. nats://127.0.0.1:4222)
    #[arg(value_name = "STORE_URL")]
    urls: Vec<String>,
}

#[tokio::main]
async fn main() {
    let Args { ops, urls } = Args::parse();

    let dir = tempfile::tempdir().expect("temp dir");
    let mut stores: Vec<(String, AnyStore)> = Vec::new();
    let sqlite = SqliteStore::open(dir.path().join("store.db"))
        .await
        .expect("sqlite");
    stores.push(("sqlite (temp file)".into(), sqlite.into()));
    for u in &urls {
        let url = match StoreUrl::parse(u) {
            Ok(url) => url,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        };
        match AnyStore::open(&url).await {
            Ok(s) => stores.push((url.to_string(), s)),
            Err(e) => {
                eprintln!("cannot open {url}: {e}");
                std::process::exit(1);
            }
        }
    }

    println!("{ops} operations each, one at a time\n");
    println!(
        "{:<44} {:<14} {:>10} {:>10} {:>10}",
        "store", "operation", "median", "p99", "max"
    );
    let run = std::process::id();
    for (name, s) in &stores {
        let mut create = Vec::with_capacity(ops);
        for i in 0..ops {
            let t = Instant::now();
            s.create(&format!("bench.{run}.c{i}"), b"{\"v\":1}", DEADLINE)
                .await
                .expect("create");
            create.push(t.elapsed());
        }
        let key = format!("bench.{run}.cas");
        let mut token = s.create(&key, b"0", DEADLINE).await.expect("create");
        let mut update = Vec::with_capacity(ops);
        for i in 0..ops {
            let t = Instant::now();
            token = s
                .update(&key, format!("{i}").as_bytes(), token, DEADLINE)
                .await
                .expect("update");
            update.push(t.elapsed());
        }
        let mut read = Vec::with_capacity(ops);
        for _ in 0..ops {
            let t = Instant::now();
            s.get(&key, ReadMode::Leader, DEADLINE).await.expect("get");
            read.push(t.elapsed());
        }
        for (op, samples) in [
            ("create", create),
            ("update (CAS)", update),
            ("get (leader)", read),
        ] {
            let (median, p99, max) = stats(samples);
            println!(
                "{:<44} {:<14} {:>10} {:>10} {:>10}",
                name,
                op,
                ms(median),
                ms(p99),
                ms(max)
            );
        }
    }
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), *v.last().expect("samples"))
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}
