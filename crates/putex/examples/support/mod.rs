//! What the benchmark examples (`failover_bench`, `lock_bench`,
//! `scale_bench`) share: a single nats-server on a loopback port, readings
//! of `/proc` for the machine and its processes, and a count of watches
//! that failed to start. Included by each
//! with `#[path = "support/mod.rs"] mod support;` (examples are separate
//! crates); not every example uses every item.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One JetStream nats-server on `127.0.0.1` with a temporary store, killed
/// on drop. The binary is `$PUTEX_NATS_SERVER`, else `.tools/bin/nats-server`
/// (`scripts/install-nats-server`), else `nats-server` on `PATH`.
pub struct NatsServer {
    /// The binary that runs.
    pub bin: PathBuf,
    child: Child,
    /// The client URL, `nats://127.0.0.1:<port>`.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Finds the binary, or exits saying how to install it.
    pub fn binary() -> PathBuf {
        if let Some(p) = std::env::var_os("PUTEX_NATS_SERVER").filter(|p| !p.is_empty()) {
            return p.into();
        }
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/nats-server");
        if local.is_file() {
            return local;
        }
        std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join("nats-server"))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| {
                eprintln!(
                    "nats-server not found: set PUTEX_NATS_SERVER or run scripts/install-nats-server"
                );
                std::process::exit(1)
            })
    }

    /// Starts a server and waits until it listens (its ports file).
    pub fn start() -> NatsServer {
        let bin = Self::binary();
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = dir.path().join("ports");
        std::fs::create_dir_all(&ports).expect("ports dir");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log");
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-sd"])
            .arg(dir.path().join("store"))
            .arg("--ports_file_dir")
            .arg(&ports)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut server = NatsServer {
            bin,
            child,
            url: String::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let url = std::fs::read_dir(&ports)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v["nats"][0].as_str().map(str::to_owned));
            if let Some(url) = url {
                server.url = url;
                return server;
            }
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl NatsServer {
    /// The server's pid (its CPU time and memory are measured too).
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(0)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPUs this process may use.
pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A process's resident set (`VmRSS`), in kB; 0 if it is gone.
pub fn rss_kb(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A process's CPU time (utime + stime), in clock ticks; 0 if it is gone.
pub fn cpu_ticks(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s[s.rfind(')')? + 1..].to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After the command: state is field 3, utime 14, stime 15.
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

/// The live processes, other than `except`, whose command line names
/// `path` (an agent's keeper names its keeper directory).
pub fn processes_naming(path: &std::path::Path, except: i32) -> Vec<i32> {
    let needle = path.display().to_string();
    putex::supervision::process::proc_table()
        .into_iter()
        .filter(|e| !e.is_dead() && e.pid != except)
        .filter(|e| {
            std::fs::read(format!("/proc/{}/cmdline", e.pid))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(&needle)
                })
                .unwrap_or(false)
        })
        .map(|e| e.pid)
        .collect()
}

/// Counts the "watch failed" debug events of the lease driver and the queue
/// (a watch that cannot start leaves the lease to poll, and a queue ticket
/// blind); `RUST_LOG` adds the usual log on stderr.
#[derive(Clone, Default)]
pub struct WatchFailures {
    count: Arc<AtomicUsize>,
    first: Arc<Mutex<Option<Instant>>>,
}

impl WatchFailures {
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
