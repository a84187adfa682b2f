//! A tracing layer that counts the "watch failed" events of the lease
//! driver and the fair queue (a watch that cannot start leaves a lease to
//! poll, and a queue ticket blind): the scale benchmarks report them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Counts the "watch failed" debug events of the lease driver and the queue
/// (a watch that cannot start leaves the lease to poll, and a queue ticket
/// blind); `RUST_LOG` adds the usual log on stderr.
#[derive(Clone, Default)]
pub struct WatchFailures {
    count: Arc<AtomicUsize>,
    first: Arc<Mutex<Option<Instant>>>,
}

impl WatchFailures {
    /// Installs the counter as the global subscriber (with the usual log on
    /// stderr when `RUST_LOG` is set).
    pub fn install() -> WatchFailures {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::Layer;
        let counter = WatchFailures::default();
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target("putex::driver", tracing::Level::DEBUG)
            .with_target("putex::locks::queue", tracing::Level::DEBUG);
        let log = std::env::var_os("RUST_LOG").map(|_| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::from_default_env())
        });
        tracing_subscriber::registry()
            .with(counter.clone().with_filter(targets))
            .with(log)
            .init();
        counter
    }

    /// How many watches failed so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Forgets the first failure seen so far.
    pub fn reset_first(&self) {
        *self.first.lock().expect("first") = None;
    }

    /// When the first failure since [`WatchFailures::reset_first`] came.
    pub fn first(&self) -> Option<Instant> {
        *self.first.lock().expect("first")
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WatchFailures {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" && format!("{v:?}").contains("watch failed") {
                    self.0 = true;
                }
            }
        }
        let mut m = Message(false);
        event.record(&mut m);
        if m.0 {
            self.count.fetch_add(1, Ordering::SeqCst);
            self.first
                .lock()
                .expect("first")
                .get_or_insert_with(Instant::now);
        }
    }
}
