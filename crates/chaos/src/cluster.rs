//! The store under test: a single nats-server that can be paused, killed
//! and restarted on the same port with the same storage, or the 3-node
//! JetStream cluster of the integration tests (`putex_testkit::nats_server`,
//! shared, not copied).
//!
//! Also the two things the harness does to the store itself through a NATS
//! client of its own: finding the stream leader of the bucket (to kill it)
//! and deleting and re-creating the bucket under running agents.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream::StorageType};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub use putex_testkit::nats_server::{nats_server_binary, NatsCluster};

/// The bucket putex uses by default.
pub const BUCKET: &str = "putex";

/// A single JetStream server on a fixed loopback port, restartable.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Server {
    /// Starts a server with its storage in `dir`.
    pub fn start(dir: &Path) -> Result<Server, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let port = free_port();
        let mut s = Server {
            child: None,
            port,
            dir: dir.to_path_buf(),
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new(nats_server_binary())
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start nats-server: {e}"))?;
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > until {
                return Err(format!("nats-server did not listen on {}", self.port));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The listening address.
    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn pid(&self) -> Option<Pid> {
        self.child
            .as_ref()
            .map(|c| Pid::from_raw(i32::try_from(c.id()).unwrap_or(0)))
    }

    /// SIGSTOP: every request goes unanswered.
    pub fn pause(&self) {
        if let Some(p) = self.pid() {
            let _ = kill(p, Signal::SIGSTOP);
        }
    }

    /// SIGCONT.
    pub fn resume(&self) {
        if let Some(p) = self.pid() {
            let _ = kill(p, Signal::SIGCONT);
        }
    }

    /// SIGKILL (a crash), then waits for the exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port with the same storage.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

async fn connect(url: &str) -> Result<jetstream::Context, String> {
    let servers: Vec<async_nats::ServerAddr> = url
        .trim_start_matches("nats://")
        .split(',')
        .filter_map(|h| format!("nats://{h}").parse().ok())
        .collect();
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(servers)
        .await
        .map_err(|e| format!("connect {url}: {e}"))?;
    Ok(jetstream::new(client))
}

/// The name of the bucket's stream leader (`n1`…`n3` in the cluster).
pub async fn stream_leader(url: &str) -> Result<String, String> {
    let js = connect(url).await?;
    let mut stream = js
        .get_stream(format!("KV_{BUCKET}"))
        .await
        .map_err(|e| format!("stream info: {e}"))?;
    let info = stream
        .info()
        .await
        .map_err(|e| format!("stream info: {e}"))?;
    info.cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .ok_or_else(|| "the stream has no leader".to_owned())
}

/// Moves the bucket's stream leader off server `avoid` (`n1`…`n3`): asks
/// the leader to step down until another server leads, within `within`.
/// Returns the new leader.
pub async fn move_stream_leader_off(
    url: &str,
    avoid: &str,
    within: Duration,
) -> Result<String, String> {
    let js = connect(url).await?;
    let until = Instant::now() + within;
    loop {
        match stream_leader(url).await {
            Ok(l) if l != avoid => return Ok(l),
            Ok(_) => {
                // The context adds the `$JS.API` prefix; the answer is not
                // awaited (the next loop reads the leader).
                let subject = format!("STREAM.LEADER.STEPDOWN.KV_{BUCKET}");
                let _ = js.send_request(subject, async_nats::Request::new()).await;
            }
            Err(_) => {}
        }
        if Instant::now() > until {
            return Err(format!(
                "the stream leader stayed on {avoid} for {within:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the bucket and creates it again with the settings putex gives
/// it (history 8, file storage, no expiry): a new stream, a new creation
/// time, so a new epoch, and revisions that start again from 1.
pub async fn recreate_bucket(url: &str, replicas: usize) -> Result<(), String> {
    let js = connect(url).await?;
    js.delete_key_value(BUCKET)
        .await
        .map_err(|e| format!("delete bucket: {e}"))?;
    js.create_key_value(kv::Config {
        bucket: BUCKET.into(),
        description: "putex locks".into(),
        history: 8,
        max_age: Duration::ZERO,
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("create bucket: {e}"))?;
    Ok(())
}

/// Waits until the cluster at `url` (a `nats://` store URL with
/// `?replicas=3`) serves its bucket: a freshly started cluster answers no
/// JetStream request until it has elected its meta leader, which takes up to
/// about ten seconds. The scenarios are about a running cluster, not one
/// being born, so the first agent must not race the election. The bucket is
/// opened (created when missing) as `putex` opens it.
pub async fn wait_ready(url: &str, within: Duration) -> Result<(), String> {
    let parsed = putex::store::StoreUrl::parse(url).map_err(|e| e.to_string())?;
    let until = Instant::now() + within;
    loop {
        match putex::store::AnyStore::open(&parsed).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= until => {
                return Err(format!("the cluster was not ready within {within:?}: {e}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
