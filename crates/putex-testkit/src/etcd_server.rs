//! A real etcd for end-to-end tests: one member, or a cluster of `n`
//! members, on loopback ports with each member's data in a temporary
//! directory, killed and cleaned up on drop. Durability is etcd's default
//! (every commit fsynced), as in production.
//!
//! The binary is `$PUTEX_ETCD`, else `./.tools/bin/etcd` at the repository
//! root, else `etcd` on `PATH`; etcdctl is `$PUTEX_ETCDCTL`, else the one
//! beside that etcd, else `etcdctl` on `PATH`. A missing binary fails the
//! test with the command that installs it (`scripts/install-etcd`); it never
//! skips.
//!
//! A member is ready when `GET /health` on its own plain-HTTP listener
//! (`--listen-metrics-urls`) answers `{"health":"true"}`: it knows a leader
//! and a linearizable read went through raft. That listener answers the
//! same whatever the client listener's TLS, client certificates or
//! authentication.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::nats_server::all_stopped;
use crate::netns::Lan;
use crate::postgres::free_port;

/// How long a member (or a cluster) may take to become healthy: on a
/// loaded CI machine a member once had written nothing at all after 10 s.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How many lines of a member's log a failure shows.
const LOG_TAIL_LINES: usize = 60;

/// A path from the environment variable `var`, when it is set and not empty.
fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// `name` in one of `PATH`'s directories.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `./.tools/bin` at the repository root, where `scripts/install-etcd`
/// puts etcd and etcdctl.
fn tools_bin() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir.ancestors().nth(2).unwrap_or(crate_dir);
    root.join(".tools/bin")
}

/// Finds etcd, or panics with how to install it.
pub fn etcd_binary() -> PathBuf {
    if let Some(p) = env_path("PUTEX_ETCD") {
        assert!(
            p.is_file(),
            "PUTEX_ETCD={} does not exist; run scripts/install-etcd",
            p.display()
        );
        return p;
    }
    let local = tools_bin().join("etcd");
    if local.is_file() {
        return local;
    }
    if let Some(p) = on_path("etcd") {
        return p;
    }
    panic!(
        "etcd not found (looked at $PUTEX_ETCD, {}, and PATH). \
         Install it with scripts/install-etcd (puts etcd and etcdctl in .tools/bin), \
         or point PUTEX_ETCD at an etcd >= 3.5 binary",
        local.display()
    );
}

/// Finds etcdctl, or panics with how to install it.
pub fn etcdctl_binary() -> PathBuf {
    if let Some(p) = env_path("PUTEX_ETCDCTL") {
        assert!(
            p.is_file(),
            "PUTEX_ETCDCTL={} does not exist; run scripts/install-etcd",
            p.display()
        );
        return p;
    }
    let etcd = etcd_binary();
    let beside = etcd.with_file_name("etcdctl");
    if beside.is_file() {
        return beside;
    }
    let local = tools_bin().join("etcdctl");
    if local.is_file() {
        return local;
    }
    if let Some(p) = on_path("etcdctl") {
        return p;
    }
    panic!(
        "etcdctl not found (looked at $PUTEX_ETCDCTL, {}, {}, and PATH). \
         Install it with scripts/install-etcd (puts etcd and etcdctl in .tools/bin), \
         or point PUTEX_ETCDCTL at an etcdctl >= 3.5 binary",
        beside.display(),
        local.display()
    );
}

/// Runs etcdctl (v3 API) against `endpoints` (`127.0.0.1:PORT`, or URLs)
/// with `extra` arguments (a command and its flags, e.g. `["compact",
/// "42"]`), over plain HTTP without credentials: for a member started with
/// TLS or authentication use [`EtcdServer::etcdctl`]. A failing command is
/// the caller's to judge: see the returned status.
pub fn etcdctl(endpoints: &[String], extra: &[&str]) -> Output {
    run_etcdctl(&[format!("--endpoints={}", endpoints.join(","))], extra)
}

/// etcdctl with `flags` (global ones) then `extra`; the fixture's timeouts
/// come first, so that `extra` may override them.
fn run_etcdctl(flags: &[String], extra: &[&str]) -> Output {
    let bin = etcdctl_binary();
    let mut cmd = Command::new(&bin);
    // etcdctl takes ETCDCTL_* variables as flags: none of the caller's.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("ETCDCTL_API", "3")
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(flags)
        .args(extra)
        .stdin(Stdio::null());
    cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {}: {e}; run scripts/install-etcd",
            bin.display()
        )
    })
}

/// What [`EtcdServer::start_with`] sets up beyond a plain member.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// `(user, password)`: etcd's `root` user is created with this password
    /// (and `user`, when it is another name, with the same password and the
    /// `root` role), then authentication is enabled. The fixture's own
    /// etcdctl ([`EtcdServer::etcdctl`]) then runs as `user`.
    pub auth: Option<(String, String)>,
    /// `(user, password, prefix)`: a second user whose only role grants
    /// readwrite on the keys starting with `prefix`. Needs `auth`.
    pub limited: Option<(String, String, String)>,
    /// TLS on the client listener (`https://`).
    pub tls: Option<EtcdTls>,
    /// `--auth-token-ttl`: how long an authentication token (etcd's
    /// "simple" tokens) lives unused; etcd's default is 300 s.
    pub auth_token_ttl: Option<Duration>,
}

/// TLS for a member's client listener: PEM files.
#[derive(Clone, Debug)]
pub struct EtcdTls {
    /// The server certificate (its names should cover 127.0.0.1). With
    /// `client_ca`, it should also be usable as a client certificate
    /// (extended key usage clientAuth, issued by `client_ca`): etcd's
    /// gateway dials the member with it, and so does the fixture's etcdctl.
    pub cert: PathBuf,
    /// The server certificate's private key.
    pub key: PathBuf,
    /// When set, clients must present a certificate issued by this CA
    /// (`--client-cert-auth --trusted-ca-file`).
    pub client_ca: Option<PathBuf>,
}

/// How one member starts (again).
struct MemberConfig {
    name: String,
    client_port: u16,
    peer_port: u16,
    metrics_port: u16,
    /// The address it listens on: 127.0.0.1, or its host's on a [`Lan`].
    host: String,
    /// The network namespace it runs in (`ip netns exec`), on a [`Lan`].
    netns: Option<String>,
    /// `--initial-cluster`: every member's `name=peer URL`.
    initial_cluster: String,
    /// `--initial-cluster-token`: unique per fixture, so that members of
    /// two fixtures never join each other.
    token: String,
    tls: Option<EtcdTls>,
    /// `--auth-token-ttl`, in whole seconds.
    auth_token_ttl: Option<u64>,
}

impl MemberConfig {
    fn new(name: String, initial_cluster: String, token: String, tls: Option<EtcdTls>) -> Self {
        MemberConfig {
            name,
            client_port: free_port(),
            peer_port: free_port(),
            metrics_port: free_port(),
            host: "127.0.0.1".into(),
            netns: None,
            initial_cluster,
            token,
            tls,
            auth_token_ttl: None,
        }
    }

    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host, self.peer_port)
    }
}

/// A token naming one fixture's cluster.
fn cluster_token() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "putex-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One running etcd member: alone ([`EtcdServer::start`]) or one of an
/// [`EtcdCluster`]. Its methods take `&self`, so that a shared member can be
/// paused, killed or restarted from a test's closures.
pub struct EtcdServer {
    name: String,
    client_port: u16,
    metrics_port: u16,
    host: String,
    netns: Option<String>,
    args: Vec<String>,
    tls: Option<EtcdTls>,
    /// The credentials the fixture's etcdctl uses, once authentication is on.
    login: Option<(String, String)>,
    child: Mutex<Child>,
    paused: AtomicBool,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// A single member over plain HTTP without authentication.
    pub fn start() -> EtcdServer {
        Self::start_with(EtcdOptions::default())
    }

    /// A single member with authentication and/or TLS.
    pub fn start_with(opts: EtcdOptions) -> EtcdServer {
        assert!(
            opts.limited.is_none() || opts.auth.is_some(),
            "EtcdOptions::limited needs EtcdOptions::auth (etcd checks permissions only with auth on)"
        );
        let name = "m1".to_owned();
        let mut config = MemberConfig::new(name, String::new(), cluster_token(), opts.tls.clone());
        config.initial_cluster = format!("{}={}", config.name, config.peer_url());
        config.auth_token_ttl = opts.auth_token_ttl.map(|t| t.as_secs().max(1));
        let mut server = Self::spawn(config);
        server.wait_healthy();
        server.set_up_auth(&opts);
        server
    }

    /// Starts a member's process, without waiting for it.
    fn spawn(config: MemberConfig) -> EtcdServer {
        let dir = tempfile::Builder::new()
            .prefix("putex-etcd-")
            .tempdir()
            .expect("temp dir");
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client_url = format!("{scheme}://{}:{}", config.host, config.client_port);
        let peer_url = config.peer_url();
        let mut args: Vec<String> = vec![
            "--name".into(),
            config.name.clone(),
            "--data-dir".into(),
            dir.path().join("data").display().to_string(),
            "--listen-client-urls".into(),
            client_url.clone(),
            "--advertise-client-urls".into(),
            client_url,
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url,
            "--initial-cluster".into(),
            config.initial_cluster,
            "--initial-cluster-token".into(),
            config.token,
            "--initial-cluster-state".into(),
            "new".into(),
            "--listen-metrics-urls".into(),
            format!("http://{}:{}", config.host, config.metrics_port),
        ];
        if let Some(ttl) = config.auth_token_ttl {
            args.extend(["--auth-token-ttl".into(), ttl.to_string()]);
        }
        if let Some(tls) = &config.tls {
            args.extend([
                "--cert-file".into(),
                tls.cert.display().to_string(),
                "--key-file".into(),
                tls.key.display().to_string(),
            ]);
            if let Some(ca) = &tls.client_ca {
                args.extend([
                    "--client-cert-auth".into(),
                    "--trusted-ca-file".into(),
                    ca.display().to_string(),
                ]);
            }
        }
        let child = spawn_etcd(&args, &dir.path().join("etcd.log"), config.netns.as_deref());
        EtcdServer {
            name: config.name,
            client_port: config.client_port,
            metrics_port: config.metrics_port,
            host: config.host,
            netns: config.netns,
            args,
            tls: config.tls,
            login: None,
            child: Mutex::new(child),
            paused: AtomicBool::new(false),
            dir,
        }
    }

    /// Creates the users and roles `opts` asks for, then enables
    /// authentication.
    fn set_up_auth(&mut self, opts: &EtcdOptions) {
        let Some((user, password)) = &opts.auth else {
            return;
        };
        let must = |args: &[&str]| {
            let o = self.etcdctl(args);
            assert!(
                o.status.success(),
                "etcdctl {args:?} failed ({}): {}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        };
        if let Some((limited, limited_password, prefix)) = &opts.limited {
            let role = format!("{limited}-prefix");
            must(&["role", "add", &role]);
            must(&[
                "role",
                "grant-permission",
                "--prefix=true",
                &role,
                "readwrite",
                prefix,
            ]);
            let pw = format!("--new-user-password={limited_password}");
            must(&["user", "add", limited, &pw]);
            must(&["user", "grant-role", limited, &role]);
        }
        let pw = format!("--new-user-password={password}");
        must(&["user", "add", "root", &pw]);
        must(&["role", "add", "root"]);
        must(&["user", "grant-role", "root", "root"]);
        if user != "root" {
            must(&["user", "add", user, &pw]);
            must(&["user", "grant-role", user, "root"]);
        }
        must(&["auth", "enable"]);
        self.login = Some((user.clone(), password.clone()));
    }

    /// The member's name (`m1`, `m2`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client address, `127.0.0.1:PORT` (no scheme; on a [`Lan`], its
    /// host's address).
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.client_port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The client URL: `http://127.0.0.1:PORT`, or `https://` with TLS.
    pub fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.client_port)
    }

    /// The process's pid (the last one started, when it is not running).
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child().id()).expect("pid fits i32")
    }

    /// Whether the process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }

    /// Runs etcdctl against this member with what it takes: TLS (the
    /// server's certificate is not verified; with a client CA, the server
    /// certificate is presented as the client's) and, with authentication
    /// on, the `auth` user's credentials.
    pub fn etcdctl(&self, extra: &[&str]) -> Output {
        let mut flags = vec![format!("--endpoints={}", self.client_url())];
        if let Some(tls) = &self.tls {
            flags.push("--insecure-transport=false".into());
            flags.push("--insecure-skip-tls-verify".into());
            if tls.client_ca.is_some() {
                flags.push(format!("--cert={}", tls.cert.display()));
                flags.push(format!("--key={}", tls.key.display()));
            }
        }
        if let Some((user, password)) = &self.login {
            flags.push(format!("--user={user}"));
            flags.push(format!("--password={password}"));
        }
        run_etcdctl(&flags, extra)
    }

    /// Kills the member (SIGKILL, as a crash) and waits for it to exit.
    pub fn kill(&self) {
        let mut child = self.child();
        if matches!(child.try_wait(), Ok(Some(_))) {
            return; // gone already: its pid may belong to another process
        }
        // Thaw a paused member, so that nothing lingers stopped if the
        // kill races.
        let _ = kill(pid_of(&child), Signal::SIGCONT);
        let _ = child.kill();
        let _ = child.wait();
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freezes the member (SIGSTOP): requests get no answer. Returns once
    /// every thread of it is stopped (the signal is asynchronous).
    pub fn pause(&self) {
        let pid = self.signal(Signal::SIGSTOP);
        self.paused.store(true, Ordering::SeqCst);
        let tasks = format!("/proc/{pid}/task");
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_stopped(Path::new(&tasks)) {
            assert!(Instant::now() < deadline, "etcd {} did not stop", self.name);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws a paused member (SIGCONT).
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Whether the member is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Starts the member again on the same ports and data directory
    /// (killing it first if it runs), and waits until it is healthy — in a
    /// cluster, that needs a quorum of members running.
    pub fn restart(&self) {
        self.kill();
        let child = spawn_etcd(&self.args, &self.log_path(), self.netns.as_deref());
        *self.child() = child;
        self.wait_healthy();
    }

    /// The member's log so far (every start's, one after the other).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// The log's last lines, for a failure's message.
    fn log_tail(&self) -> String {
        let log = match std::fs::read_to_string(self.log_path()) {
            Ok(log) => log,
            Err(e) => return format!("cannot read {}: {e}", self.log_path().display()),
        };
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "--- the last {} lines of {} ---\n{}",
            lines.len() - from,
            self.log_path().display(),
            lines[from..].join("\n")
        )
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn exited(&self) -> Option<ExitStatus> {
        self.child().try_wait().ok().flatten()
    }

    /// Signals the running process; returns its pid.
    fn signal(&self, sig: Signal) -> Pid {
        let mut child = self.child();
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "etcd {} is not running",
            self.name
        );
        let pid = pid_of(&child);
        kill(pid, sig).unwrap_or_else(|e| panic!("signal etcd {}: {e}", self.name));
        pid
    }

    /// Waits until `/health` answers true, or panics with the log's tail.
    fn wait_healthy(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                panic!(
                    "etcd {} ({}) exited with {status} on start:\n{}",
                    self.name,
                    self.endpoint(),
                    self.log_tail()
                );
            }
            if healthy(&self.host, self.metrics_port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd {} ({}) was not healthy within {START_TIMEOUT:?} ({}):\n{}",
                self.name,
                self.endpoint(),
                crate::procfs::describe(pid_of(&self.child()).as_raw()),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether this member says it is the raft leader (`endpoint status`:
    /// `leader` equals `header.member_id`). A member that does not answer
    /// within a second is not.
    fn is_leader(&self) -> bool {
        if !self.is_running() || self.is_paused() {
            return false;
        }
        let o = self.etcdctl(&[
            "endpoint",
            "status",
            "-w",
            "json",
            "--dial-timeout=1s",
            "--command-timeout=1s",
        ]);
        if !o.status.success() {
            return false;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.stdout) else {
            return false;
        };
        let status = &v[0]["Status"];
        let leader = status["leader"].as_u64();
        let me = status["header"]["member_id"].as_u64();
        leader.is_some() && leader == me
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"))
}

/// Starts etcd with `args`, its output appended to `log`, in network
/// namespace `netns` if given.
fn spawn_etcd(args: &[String], log: &Path, netns: Option<&str>) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("etcd log file");
    let bin = etcd_binary();
    let mut cmd = crate::netns::command_in(&bin, netns);
    // etcd takes ETCD_* variables as flags (and refuses one that a flag
    // shadows): none of the caller's.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCD_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("etcd log file"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e}; run scripts/install-etcd",
                bin.display()
            )
        })
}

/// Whether `GET /health` on `host:port` answers `{"health":"true"}`.
fn healthy(host: &str, port: u16) -> bool {
    let Ok(addr) = format!("{host}:{port}").parse::<SocketAddr>() else {
        return false;
    };
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.contains(r#""health":"true""#)
}

/// A cluster of etcd members on loopback (plain HTTP, no authentication),
/// or each member in a network namespace of its own on a [`Lan`]
/// ([`EtcdCluster::start_on_lan`]).
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
    /// Declared after the members: they are killed before their
    /// namespaces go.
    lan: Option<Lan>,
}

impl EtcdCluster {
    /// Starts `n` members (`m1` … `mn`) that form one cluster, and waits
    /// until every one is healthy and one of them leads.
    pub fn start(n: usize) -> EtcdCluster {
        Self::start_with_lan(n, None)
    }

    /// Starts `n` members, member `i` in host `i`'s namespace of a new
    /// [`Lan`] (root only), so that [`EtcdCluster::isolate`] can cut one
    /// off from its peers while clients still reach it.
    pub fn start_on_lan(n: usize) -> Result<EtcdCluster, String> {
        let lan = Lan::create(n)?;
        Ok(Self::start_with_lan(n, Some(lan)))
    }

    fn start_with_lan(n: usize, lan: Option<Lan>) -> EtcdCluster {
        assert!(n >= 1, "a cluster needs a member");
        let token = cluster_token();
        let mut configs: Vec<MemberConfig> = (1..=n)
            .map(|i| {
                let mut c = MemberConfig::new(format!("m{i}"), String::new(), token.clone(), None);
                if let Some(lan) = &lan {
                    c.host = lan.addr(i - 1);
                    c.netns = Some(lan.ns(i - 1));
                }
                c
            })
            .collect();
        let initial = configs
            .iter()
            .map(|c| format!("{}={}", c.name, c.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for c in &mut configs {
            c.initial_cluster = initial.clone();
        }
        // Every member runs before any is waited for: none is healthy
        // without a quorum. The cluster owns them from the start, so that a
        // failure below kills them all.
        let cluster = EtcdCluster {
            members: configs.into_iter().map(EtcdServer::spawn).collect(),
            lan,
        };
        for m in &cluster.members {
            m.wait_healthy();
        }
        let deadline = Instant::now() + START_TIMEOUT;
        while cluster.leader().is_none() {
            assert!(
                Instant::now() < deadline,
                "the etcd cluster had no leader within {START_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Cuts member `i` off from every other member (both ways); clients
    /// still reach it. Only on a [`Lan`].
    pub fn isolate(&self, i: usize) -> Result<(), String> {
        self.lan
            .as_ref()
            .ok_or("not on a Lan: EtcdCluster::start_on_lan")?
            .isolate(i)
    }

    /// Undoes [`EtcdCluster::isolate`].
    pub fn rejoin(&self, i: usize) -> Result<(), String> {
        self.lan
            .as_ref()
            .ok_or("not on a Lan: EtcdCluster::start_on_lan")?
            .rejoin(i)
    }

    /// Every member's client address, `127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Member `i` (from 0).
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// All members, in order.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// Kills member `i` (SIGKILL, as a crash) and waits for it to exit.
    pub fn kill(&self, i: usize) {
        self.members[i].kill();
    }

    /// Starts member `i` again on its ports and data, and waits until it is
    /// healthy (which needs a quorum of members running).
    pub fn restart(&self, i: usize) {
        self.members[i].restart();
    }

    /// Freezes member `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.members[i].pause();
    }

    /// Thaws member `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.members[i].resume();
    }

    /// The member that is the raft leader, as it says itself (`etcdctl
    /// endpoint status`: its `leader` is its own `header.member_id`); None
    /// when no running, unpaused member says so (e.g. during an election).
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(EtcdServer::is_leader)
    }

    /// Makes member `i` the raft leader (`etcdctl move-leader`, which finds
    /// the current leader itself) and waits until it says so.
    pub fn move_leader(&self, i: usize) -> Result<(), String> {
        if self.leader() == Some(i) {
            return Ok(());
        }
        let list = self.etcdctl(&["member", "list", "-w", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&list.stdout)
            .map_err(|e| format!("etcdctl member list: {e}"))?;
        let name = self.members[i].name();
        let id = v["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == name))
            .and_then(|m| m["ID"].as_u64())
            .ok_or_else(|| format!("no member {name} in {v}"))?;
        let out = self.etcdctl(&["move-leader", &format!("{id:x}")]);
        if !out.status.success() {
            return Err(format!(
                "etcdctl move-leader {name}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let deadline = Instant::now() + START_TIMEOUT;
        while self.leader() != Some(i) {
            if Instant::now() > deadline {
                return Err(format!("{name} did not become the leader"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The members other than `i` that say they are the leader (after
    /// [`EtcdCluster::isolate`], the majority's new leader; an isolated
    /// leader may still say so until it steps down).
    pub fn leaders_besides(&self, i: usize) -> Vec<usize> {
        (0..self.members.len())
            .filter(|j| *j != i && self.members[*j].is_leader())
            .collect()
    }

    /// Runs etcdctl against every member's endpoint.
    pub fn etcdctl(&self, extra: &[&str]) -> Output {
        etcdctl(&self.endpoints(), extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Pki;

    fn ok(o: &Output) -> String {
        assert!(
            o.status.success(),
            "etcdctl failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `get KEY --print-value-only`'s value.
    fn value(o: &Output) -> String {
        ok(o).trim_end().to_owned()
    }

    #[test]
    fn etcd_single_member_put_get_pause_restart() {
        let server = EtcdServer::start();
        assert!(server.client_url().starts_with("http://127.0.0.1:"));
        assert_eq!(server.endpoint(), format!("127.0.0.1:{}", server.port()));
        ok(&server.etcdctl(&["put", "k", "v1"]));
        let eps = [server.endpoint()];
        assert_eq!(
            value(&etcdctl(&eps, &["get", "k", "--print-value-only"])),
            "v1"
        );

        // Paused: no answer within the command's deadline; thawed: answers.
        server.pause();
        let o = etcdctl(&eps, &["get", "k", "--command-timeout=300ms"]);
        assert!(!o.status.success(), "a paused member answered: {o:?}");
        server.resume();
        assert_eq!(
            value(&etcdctl(&eps, &["get", "k", "--print-value-only"])),
            "v1"
        );

        // Killed: gone; restarted on the same port with the same data.
        let pid = server.pid();
        server.kill();
        assert!(!server.is_running());
        let o = etcdctl(
            &eps,
            &[
                "get",
                "k",
                "--dial-timeout=300ms",
                "--command-timeout=300ms",
            ],
        );
        assert!(!o.status.success(), "a killed member answered: {o:?}");
        server.restart();
        assert_ne!(server.pid(), pid);
        assert_eq!(
            value(&etcdctl(&eps, &["get", "k", "--print-value-only"])),
            "v1"
        );
        assert!(
            server.log().contains("\"msg\":\"serving client traffic"),
            "{}",
            server.log_tail()
        );
    }

    #[test]
    fn etcd_auth_root_and_a_prefix_user() {
        let server = EtcdServer::start_with(EtcdOptions {
            auth: Some(("root".into(), "r00t-pw".into())),
            limited: Some(("app".into(), "app-pw".into(), "app/".into())),
            ..EtcdOptions::default()
        });
        let eps = [server.endpoint()];
        // Without credentials: refused.
        let o = etcdctl(&eps, &["put", "k", "v"]);
        assert!(!o.status.success(), "an unauthenticated put worked: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("user name is empty"),
            "{o:?}"
        );
        // A wrong password: refused.
        let o = etcdctl(&eps, &["--user=root", "--password=wrong", "put", "k", "v"]);
        assert!(!o.status.success(), "a wrong password worked: {o:?}");
        // root: anything (through the fixture's etcdctl, and by hand).
        ok(&server.etcdctl(&["put", "k", "v"]));
        ok(&etcdctl(
            &eps,
            &["--user=root", "--password=r00t-pw", "put", "k2", "v"],
        ));
        // The limited user: its prefix only.
        let app = ["--user=app", "--password=app-pw"];
        ok(&etcdctl(&eps, &[&app[..], &["put", "app/x", "1"]].concat()));
        let o = etcdctl(&eps, &[&app[..], &["put", "other/x", "1"]].concat());
        assert!(
            !o.status.success(),
            "a put outside the prefix worked: {o:?}"
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("permission denied"),
            "{o:?}"
        );
        assert_eq!(
            value(&etcdctl(
                &eps,
                &[&app[..], &["get", "app/x", "--print-value-only"]].concat()
            )),
            "1"
        );
    }

    #[test]
    fn etcd_tls_with_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path(), "client");
        let server = EtcdServer::start_with(EtcdOptions {
            tls: Some(EtcdTls {
                cert: pki.server_cert.clone(),
                key: pki.server_key.clone(),
                client_ca: Some(pki.ca.clone()),
            }),
            ..EtcdOptions::default()
        });
        assert_eq!(
            server.client_url(),
            format!("https://127.0.0.1:{}", server.port())
        );
        // The fixture's etcdctl (the server certificate as the client's).
        ok(&server.etcdctl(&["put", "k", "v"]));
        // A client that verifies the server and shows its own certificate.
        let eps = [server.client_url()];
        let cacert = format!("--cacert={}", pki.ca.display());
        let cert = format!("--cert={}", pki.client_cert.display());
        let key = format!("--key={}", pki.client_key.display());
        let got = etcdctl(
            &eps,
            &[&cacert, &cert, &key, "get", "k", "--print-value-only"],
        );
        assert_eq!(value(&got), "v");
        // Without a client certificate: refused.
        let o = etcdctl(&eps, &[&cacert, "get", "k", "--command-timeout=2s"]);
        assert!(!o.status.success(), "no client certificate, yet: {o:?}");
        // Plain HTTP against the TLS listener: no answer.
        let o = etcdctl(&[server.endpoint()], &["get", "k", "--command-timeout=1s"]);
        assert!(!o.status.success(), "plain HTTP, yet: {o:?}");
    }

    #[test]
    fn etcd_tls_without_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path(), "client");
        let server = EtcdServer::start_with(EtcdOptions {
            auth: Some(("root".into(), "pw".into())),
            tls: Some(EtcdTls {
                cert: pki.server_cert.clone(),
                key: pki.server_key.clone(),
                client_ca: None,
            }),
            ..EtcdOptions::default()
        });
        ok(&server.etcdctl(&["put", "k", "v"]));
        let cacert = format!("--cacert={}", pki.ca.display());
        let got = etcdctl(
            &[server.client_url()],
            &[
                &cacert,
                "--user=root",
                "--password=pw",
                "get",
                "k",
                "--print-value-only",
            ],
        );
        assert_eq!(value(&got), "v");
    }

    #[test]
    fn etcd_cluster_survives_a_member_and_it_rejoins() {
        let cluster = EtcdCluster::start(3);
        assert_eq!(cluster.endpoints().len(), 3);
        ok(&cluster.etcdctl(&["put", "k", "v1"]));
        let leader = cluster.leader().expect("a leader");

        // The leader dies: the other two elect one of them and go on.
        cluster.kill(leader);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let o = cluster.etcdctl(&["put", "k", "v2", "--command-timeout=2s"]);
            if o.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no put after the leader died: {o:?}"
            );
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        let next = loop {
            if let Some(l) = cluster.leader() {
                break l;
            }
            assert!(Instant::now() < deadline, "no new leader");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_ne!(next, leader);

        // It comes back and catches up: a linearizable read through it
        // sees the write it missed.
        cluster.restart(leader);
        let eps = [cluster.member(leader).endpoint()];
        assert_eq!(
            value(&etcdctl(&eps, &["get", "k", "--print-value-only"])),
            "v2"
        );
        let o = ok(&etcdctl(&eps, &["member", "list"]));
        assert_eq!(
            o.lines().filter(|l| l.contains("started")).count(),
            3,
            "{o}"
        );

        // A paused member: the others still answer.
        let other = (next + 1) % 3;
        cluster.pause(other);
        ok(&etcdctl(
            &[cluster.member(next).endpoint()],
            &["put", "k", "v3"],
        ));
        cluster.resume(other);
        let eps = [cluster.member(other).endpoint()];
        assert_eq!(
            value(&etcdctl(&eps, &["get", "k", "--print-value-only"])),
            "v3"
        );
    }
}
