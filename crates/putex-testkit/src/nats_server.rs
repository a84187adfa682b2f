//! A real nats-server for end-to-end tests: one server, or a 3-node
//! JetStream cluster, on ephemeral loopback ports with temporary storage
//! (or each node in a network namespace of its own on a [`Lan`], so that
//! one can be cut off from its peers), stopped and cleaned up on drop.
//!
//! The binary is `$PUTEX_NATS_SERVER`, else `./.tools/bin/nats-server` at
//! the repository root, else `nats-server` on `PATH`. A missing server fails
//! the test with the command that installs it; it never skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netns::Lan;

/// How long a server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Finds nats-server, or panics with how to install it.
pub fn nats_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("PUTEX_NATS_SERVER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "PUTEX_NATS_SERVER={} does not exist; run scripts/install-nats-server",
            p.display()
        );
        return p;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let local = root.join(".tools/bin/nats-server");
    if local.is_file() {
        return local;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nats-server");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "nats-server not found (looked at $PUTEX_NATS_SERVER, {}, and PATH). \
         Install it with scripts/install-nats-server (puts it in .tools/bin), \
         or point PUTEX_NATS_SERVER at a nats-server >= 2.11 binary",
        local.display()
    );
}

/// One running nats-server.
pub struct NatsServer {
    child: Child,
    /// The client URL, `nats://127.0.0.1:<port>`.
    pub url: String,
    dir: tempfile::TempDir,
    /// How it was started (a restart uses the same).
    args: Vec<String>,
}

impl NatsServer {
    /// A single JetStream server.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let args = jetstream_args(dir.path());
        Self::spawn(dir, args)
    }

    /// A single JetStream server on a loopback ephemeral port, configured
    /// by a configuration file: `extra` (e.g. an `authorization` or `tls`
    /// block) follows the listen address and the `jetstream` block.
    pub fn start_with_config(extra: &str) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let sd = dir.path().join("store");
        let conf = dir.path().join("server.conf");
        let text = format!(
            "host: 127.0.0.1\nport: -1\njetstream {{ store_dir: {:?} }}\n{extra}\n",
            sd.display().to_string()
        );
        std::fs::write(&conf, text).expect("write server.conf");
        let args = vec!["-c".into(), conf.display().to_string()];
        Self::spawn(dir, args)
    }

    /// The server's pid (the benchmarks measure its CPU time and memory).
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {:?}", self.url))
    }

    fn spawn(dir: tempfile::TempDir, args: Vec<String>) -> NatsServer {
        Self::spawn_in(dir, args, None)
    }

    /// Starts nats-server with `args`, in network namespace `netns` if
    /// given (`ip netns exec` execs it there: the child is the server).
    fn spawn_in(dir: tempfile::TempDir, mut args: Vec<String>, netns: Option<&str>) -> NatsServer {
        let ports_dir = dir.path().join("ports");
        std::fs::create_dir_all(&ports_dir).expect("ports dir");
        args.push("--ports_file_dir".into());
        args.push(ports_dir.display().to_string());
        let child = launch(dir.path(), &args, netns);
        let mut server = NatsServer {
            child,
            url: String::new(),
            dir,
            args,
        };
        server.url = server.wait_listening();
        server
    }

    /// The URL of the ports file the server writes once it listens.
    fn wait_listening(&mut self) -> String {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(url) = read_ports_file(&self.dir.path().join("ports")) {
                return url;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nats-server exited with {status} on start:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start within {START_TIMEOUT:?} ({}):\n{}",
                crate::procfs::describe(self.child.id() as i32),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a server of [`NatsServer::start`] again, on the same port
    /// and store directory (killing it first if it runs), as after a crash
    /// or an upgrade, and returns once it listens.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port().to_string();
        let p = self
            .args
            .iter()
            .position(|a| a == "-p")
            .expect("restart: a server of NatsServer::start (its port on the command line)");
        self.args[p + 1] = port;
        // A killed server leaves its ports file behind.
        let ports_dir = self.dir.path().join("ports");
        for entry in std::fs::read_dir(&ports_dir).expect("ports dir").flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        self.child = launch(self.dir.path(), &self.args, None);
        self.wait_listening();
    }

    /// Freezes the server (SIGSTOP): requests get no answer. Returns once
    /// every thread of the server is stopped (the signal is asynchronous).
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
        let tasks = format!("/proc/{}/task", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_stopped(Path::new(&tasks)) {
            assert!(Instant::now() < deadline, "nats-server did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills the server (SIGKILL, as a crash) and waits for it to exit.
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return; // gone already: its pid may belong to another process
        }
        // A paused server would not die of SIGKILL any slower, but thaw it
        // so nothing lingers stopped if the kill races.
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    fn signal(&self, sig: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"));
        kill(pid, sig).expect("signal nats-server");
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether every thread under `/proc/<pid>/task` is stopped (state `T`).
pub(crate) fn all_stopped(tasks: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return false;
    };
    entries.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|stat| {
                // The state follows the parenthesised command name.
                let rest = &stat[stat.rfind(')')? + 1..];
                rest.split_whitespace().next().map(|s| s == "T" || s == "t")
            })
            .unwrap_or(false)
    })
}

fn read_ports_file(dir: &Path) -> Option<String> {
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if path.extension().is_some_and(|e| e == "ports") {
            let text = std::fs::read_to_string(&path).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let url = v.get("nats")?.get(0)?.as_str()?;
            return Some(url.to_owned());
        }
    }
    None
}

/// A JetStream server on an ephemeral loopback port, storing under `dir`.
fn jetstream_args(dir: &Path) -> Vec<String> {
    let store = dir.join("store").display().to_string();
    ["-js", "-a", "127.0.0.1", "-p", "-1", "-sd", &store]
        .map(String::from)
        .into()
}

/// Starts nats-server with `args` in `dir` (its log appended to
/// `server.log` there), in network namespace `netns` if given.
fn launch(dir: &Path, args: &[String], netns: Option<&str>) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .expect("log file");
    let bin = nats_server_binary();
    let mut cmd = crate::netns::command_in(&bin, netns);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e}; run scripts/install-nats-server",
                bin.display()
            )
        })
}

/// Node `i`'s cluster flags: its name (`n1` …), the cluster's, where it
/// listens for routes and the routes to every node.
fn cluster_args(i: usize, listen: &str, routes: &str) -> Vec<String> {
    vec![
        "-n".into(),
        format!("n{}", i + 1),
        "--cluster_name".into(),
        "putex-test".into(),
        "--cluster".into(),
        listen.into(),
        "--routes".into(),
        routes.into(),
    ]
}

/// A free loopback port for a cluster route, which must be known before
/// the servers start: below the ephemeral range ([`crate::ports`]), so
/// that no server's own client port, picked by the kernel from that range,
/// takes it first (seen: a node's client listener on the route port chosen
/// for it, and its route listener refused).
fn free_port() -> u16 {
    crate::ports::free_port()
}

/// A 3-node JetStream cluster on loopback, or on a [`Lan`].
pub struct NatsCluster {
    /// The servers, in start order.
    pub servers: Vec<NatsServer>,
    /// Declared after the servers: they are killed before their
    /// namespaces go.
    lan: Option<Lan>,
}

/// The route port of every node on a [`Lan`] (each has its own address).
const LAN_ROUTE_PORT: u16 = 6222;

impl NatsCluster {
    /// Starts three clustered JetStream servers with routes to each other.
    /// Each tells its clients of the others (a client that knows one
    /// learns all three).
    pub fn start() -> NatsCluster {
        Self::start_loopback(true)
    }

    /// [`NatsCluster::start`], but the servers tell their clients of no
    /// other server (`--no_advertise`): a client knows only the addresses
    /// its URL names. For clients behind fault proxies, which a client
    /// that reconnects must not slip past.
    pub fn start_unadvertised() -> NatsCluster {
        Self::start_loopback(false)
    }

    fn start_loopback(advertise: bool) -> NatsCluster {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let servers = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let dir = tempfile::tempdir().expect("temp dir");
                let mut args = jetstream_args(dir.path());
                args.extend(cluster_args(
                    i,
                    &format!("nats://127.0.0.1:{port}"),
                    &routes,
                ));
                if !advertise {
                    args.push("--no_advertise=true".into());
                }
                NatsServer::spawn(dir, args)
            })
            .collect();
        NatsCluster { servers, lan: None }
    }

    /// Starts three clustered servers, node `i` in host `i`'s namespace
    /// of a new [`Lan`] (root only), listening on its address there, so
    /// that [`NatsCluster::isolate`] can cut one off from its peers while
    /// clients still reach it.
    pub fn start_on_lan() -> Result<NatsCluster, String> {
        let lan = Lan::create(3)?;
        let routes = (0..3)
            .map(|i| format!("nats-route://{}:{LAN_ROUTE_PORT}", lan.addr(i)))
            .collect::<Vec<_>>()
            .join(",");
        let servers = (0..3)
            .map(|i| {
                let dir = tempfile::tempdir().expect("temp dir");
                let store = dir.path().join("store").display().to_string();
                let mut args: Vec<String> = ["-js", "-a", &lan.addr(i), "-p", "-1", "-sd", &store]
                    .map(String::from)
                    .into();
                let listen = format!("nats://{}:{LAN_ROUTE_PORT}", lan.addr(i));
                args.extend(cluster_args(i, &listen, &routes));
                NatsServer::spawn_in(dir, args, Some(&lan.ns(i)))
            })
            .collect();
        Ok(NatsCluster {
            servers,
            lan: Some(lan),
        })
    }

    /// Cuts node `i` off from the other two (both ways); clients still
    /// reach it. Only on a [`Lan`].
    pub fn isolate(&self, i: usize) -> Result<(), String> {
        self.lan
            .as_ref()
            .ok_or("not on a Lan: NatsCluster::start_on_lan")?
            .isolate(i)
    }

    /// Undoes [`NatsCluster::isolate`].
    pub fn rejoin(&self, i: usize) -> Result<(), String> {
        self.lan
            .as_ref()
            .ok_or("not on a Lan: NatsCluster::start_on_lan")?
            .rejoin(i)
    }

    /// Kills the node a JetStream API answer names (`n1`, `n2` or `n3`,
    /// the server names given at start), as a crash.
    pub fn kill_node(&mut self, name: &str) {
        let i: usize = name
            .strip_prefix('n')
            .and_then(|n| n.parse().ok())
            .filter(|n| (1..=self.servers.len()).contains(n))
            .unwrap_or_else(|| panic!("no node named {name:?}"));
        self.servers[i - 1].kill();
    }

    /// A store URL naming every server.
    pub fn url(&self) -> String {
        let hosts: Vec<&str> = self
            .servers
            .iter()
            .map(|s| s.url.trim_start_matches("nats://"))
            .collect();
        format!("nats://{}", hosts.join(","))
    }
}
