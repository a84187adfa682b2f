//! Real PostgreSQL for end-to-end tests: a streaming-replication cluster
//! made with `initdb` and `pg_basebackup -R` in a temporary directory, on
//! ephemeral loopback ports, and a writer that records every acknowledged
//! commit.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root every
//! PostgreSQL program — and the `putex run` agents that run its hooks
//! ([`PgCluster::user`]) — runs as the `postgres` user that Debian's
//! `postgresql` package creates; the cluster's directory is given to that
//! user. The programs are `$PUTEX_PG_BIN`, else the newest
//! `/usr/lib/postgresql/*/bin`, else the directory of `pg_ctl` on `PATH`.
//! A missing PostgreSQL fails the test with the command that installs it
//! (`scripts/install-postgresql`); nothing is skipped.
//!
//! The cluster's nodes are created stopped: the agents start them through
//! the recipe's hooks (`packaging/postgresql/putex-pg`): the first holder
//! starts `n1` as the primary, the others follow it as replicas.
//! Dropping the cluster stops every server (`immediate`) and removes it.
//!
//! What the `postgres` user runs comes from the cluster's directory, not
//! from the checkout: a checkout in a directory other users cannot enter
//! (a 0700 home, common for root) left it unable to start `target/…/putex`
//! or read the recipe's hooks ("start putex run: Permission denied").
//! [`PgCluster::runnable`] links or copies the binary into `bin/` there,
//! the hook script is copied at creation, and both are checked as that
//! user; a directory it cannot enter at all fails the test at once, saying
//! which and why.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::agent::{output_text, wall_ns, AgentSpec};

/// The directory of PostgreSQL's programs, or a panic saying how to install
/// them.
pub fn pg_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PUTEX_PG_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.join("initdb").is_file(),
            "PUTEX_PG_BIN={} has no initdb; run scripts/install-postgresql",
            p.display()
        );
        return p;
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("pg_ctl").is_file() && dir.join("initdb").is_file() {
                return dir;
            }
        }
    }
    panic!(
        "PostgreSQL not found (looked at $PUTEX_PG_BIN, /usr/lib/postgresql/*/bin and PATH). \
         Install it with scripts/install-postgresql (Debian's postgresql package), \
         or point PUTEX_PG_BIN at the directory of initdb and pg_ctl"
    );
}

/// The recipe's hook script, `packaging/postgresql/putex-pg`.
pub fn putex_pg_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/postgresql/putex-pg")
}

/// The user (uid, gid) PostgreSQL and its agents run as: `postgres` when
/// this process is root, nobody else otherwise (`None`).
pub fn pg_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(u)) => Some((u.uid.as_raw(), u.gid.as_raw())),
        _ => panic!(
            "the tests run as root and PostgreSQL refuses root, but there is no postgres user: \
             install Debian's postgresql package (scripts/install-postgresql), which creates it"
        ),
    }
}

pub use crate::ports::free_port;

/// One PostgreSQL server of a [`PgCluster`].
#[derive(Clone, Debug)]
pub struct PgNode {
    /// Its node id for putex (`n1`, `n2`, …).
    pub name: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory.
    pub data: PathBuf,
    /// The recipe's configuration file for it.
    pub conf: PathBuf,
}

impl PgNode {
    /// `--advertise`: how the other nodes reach it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// A primary and its replicas, created stopped.
pub struct PgCluster {
    dir: tempfile::TempDir,
    /// The recipe's hook script as the cluster's user runs it (a copy in
    /// the cluster's directory when that user is another).
    hooks: PathBuf,
    /// PostgreSQL's programs.
    pub bin: PathBuf,
    /// The nodes; `n1` is the first primary.
    pub nodes: Vec<PgNode>,
    /// Who runs PostgreSQL and the agents (see [`pg_user`]).
    pub user: Option<(u32, u32)>,
    sock: PathBuf,
    /// Where [`PgCluster::use_systemctl_stand_in`] put its `systemctl`.
    stand_in: Option<PathBuf>,
}

/// The settings every node gets (its port comes with `pg_ctl -o`, since
/// `pg_basebackup` copies this file).
/// The roles' password in a cluster [`PgCluster::as_the_guide_says`] made,
/// with what each of its readers escapes: `'` (SQL, libpq connection
/// strings), `:` and `\` (`~/.pgpass`).
pub const GUIDE_PASSWORD: &str = r"s3cret'p:w\x";

const SETTINGS: &str = "
listen_addresses = '127.0.0.1'
wal_log_hints = on
max_wal_senders = 10
max_connections = 40
shared_buffers = '16MB'
# Process crashes are tested, not machine crashes: fsync buys nothing here.
fsync = off
wal_receiver_status_interval = '1s'
wal_retrieve_retry_interval = '200ms'
";

impl PgCluster {
    /// `n` nodes: `n1` made by `initdb`, the others by `pg_basebackup -R`
    /// from it, each through its replication slot (`-C -S putex_n2`, as
    /// `docs/postgresql.md` sets replicas up), all stopped. `sync`: the recipe's synchronous mode.
    pub fn create(n: usize, sync: bool) -> PgCluster {
        let cluster = Self::layout(n);
        cluster.build();
        cluster.write_configs(sync);
        cluster
    }

    /// `n` nodes with nothing in their data directories (which do not
    /// exist) and the recipe's configuration of each written: what the
    /// recipe's bootstrap starts from (`docs/postgresql.md`, "Bootstrap").
    pub fn empty(n: usize, sync: bool) -> PgCluster {
        let cluster = Self::layout(n);
        cluster.write_configs(sync);
        cluster
    }

    /// `n` nodes with empty data directories, configured as
    /// `docs/postgresql.md` ("Bootstrap") says: the packaged
    /// `packaging/postgresql/bootstrap/postgresql.conf` and `pg_hba.conf`
    /// verbatim, the roles' password ([`GUIDE_PASSWORD`]) in the cluster
    /// user's `~/.pgpass`, initdb's default options (peer and
    /// scram-sha-256), `putex` where that user can run it. The bootstrap
    /// test and the benchmark start from this.
    pub fn as_the_guide_says(n: usize, sync: bool, putex: &Path) -> PgCluster {
        let pg = PgCluster::empty(n, sync);
        let examples =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/postgresql/bootstrap");
        let read = |f: &str| {
            std::fs::read_to_string(examples.join(f))
                .unwrap_or_else(|e| panic!("the guide's {f}: {e}"))
        };
        let conf = pg.put_file("postgresql.conf", &read("postgresql.conf"), 0o644);
        let hba = pg.put_file("pg_hba.conf", &read("pg_hba.conf"), 0o644);
        // `~/.pgpass` escapes `:` and `\`.
        let field = GUIDE_PASSWORD.replace('\\', r"\\").replace(':', r"\:");
        pg.put_file(
            ".pgpass",
            &format!("*:*:*:replicator:{field}\n*:*:*:postgres:{field}\n"),
            0o600,
        );
        let putex = pg.runnable(putex);
        for i in 0..n {
            let mut lines = format!(
                "POSTGRESQL_CONF='{}'\nPG_HBA='{}'\nPUTEX='{}'\n",
                conf.display(),
                hba.display(),
                putex.display()
            );
            if pg.user.is_none() {
                // Not root: the servers run as this user, whom peer
                // authentication knows by that name only.
                let me = std::env::var("USER").unwrap_or_else(|_| "postgres".into());
                lines += &format!("PGUSER={me}\n");
            }
            pg.configure(i, &lines);
        }
        pg
    }

    /// [`PgCluster::primary_conninfo`] with [`GUIDE_PASSWORD`]: how a
    /// client reaches a cluster [`PgCluster::as_the_guide_says`] made.
    pub fn guide_conninfo(&self) -> String {
        format!(
            "{} password='{}'",
            self.primary_conninfo(),
            GUIDE_PASSWORD.replace('\\', r"\\").replace('\'', r"\'")
        )
    }

    /// The cluster's directory, its socket directory and the nodes' names,
    /// ports and paths; nothing made yet.
    fn layout(n: usize) -> PgCluster {
        let bin = pg_bin();
        let user = pg_user();
        let dir = tempfile::Builder::new()
            .prefix("putex-pg-")
            .tempdir()
            .expect("temp dir");
        let sock = dir.path().join("sock");
        std::fs::create_dir(&sock).expect("socket dir");
        if let Some((uid, gid)) = user {
            for p in [dir.path(), sock.as_path()] {
                nix::unistd::chown(
                    p,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .expect("give the cluster's directory to postgres");
            }
        }
        if let Some(user) = user {
            user_can(user, "-w", dir.path());
        }
        let hooks = match user {
            Some(user) => {
                let bin = staging_dir(dir.path());
                let to = bin.join("putex-pg");
                std::fs::copy(putex_pg_script(), &to).expect("copy the recipe's hooks");
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod the recipe's hooks");
                user_can(user, "-r", &to);
                to
            }
            None => putex_pg_script(),
        };
        let nodes: Vec<PgNode> = (1..=n)
            .map(|i| PgNode {
                name: format!("n{i}"),
                port: free_port(),
                data: dir.path().join(format!("n{i}")),
                conf: dir.path().join(format!("n{i}.conf")),
            })
            .collect();
        PgCluster {
            dir,
            hooks,
            bin,
            nodes,
            user,
            sock,
            stand_in: None,
        }
    }

    fn build(&self) {
        let first = &self.nodes[0];
        self.ok(self
            .pg("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&first.data));
        let conf = format!(
            "{SETTINGS}unix_socket_directories = '{}'\n",
            self.sock.display()
        );
        append(&first.data.join("postgresql.conf"), &conf);
        append(
            &first.data.join("pg_hba.conf"),
            "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
        );
        self.pg_ctl_start(first);
        self.sql(0, "create role replicator replication login")
            .expect("create the replication role");
        for node in &self.nodes[1..] {
            self.ok(self
                .pg("pg_basebackup")
                .args(["-h", "127.0.0.1", "-p", &first.port.to_string()])
                .args(["-U", "replicator", "-X", "stream", "-c", "fast", "-R"])
                .args(["-C", "-S", &format!("putex_{}", node.name), "-D"])
                .arg(&node.data));
        }
        self.ok(self
            .pg("pg_ctl")
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(&first.data));
    }

    /// The recipe's configuration file of every node.
    fn write_configs(&self, sync: bool) {
        for node in &self.nodes {
            let text = format!(
                "PGDATA='{}'\nPGBIN='{}'\nPGHOST='{}'\nPGPORT={}\nPGCTL_OPTS='-p {}'\n\
                 SYNC={}\nPROMOTE_TIMEOUT=10\nSTOP_TIMEOUT=10\nEMERGENCY_FAST=1\nEMERGENCY_IMMEDIATE=1\n",
                node.data.display(),
                self.bin.display(),
                self.sock.display(),
                node.port,
                node.port,
                if sync { "on" } else { "off" },
            );
            std::fs::write(&node.conf, text).expect("write the recipe's config");
        }
    }

    fn pg_ctl_start(&self, node: &PgNode) {
        let log = node.data.with_extension("log");
        let mut cmd = self.pg("pg_ctl");
        cmd.args(["start", "-w", "-o", &format!("-p {}", node.port), "-l"])
            .arg(&log)
            .arg("-D")
            .arg(&node.data)
            .stdin(Stdio::null());
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        if !out.status.success() {
            // The server's own words, before the directory goes.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            panic!(
                "{cmd:?} failed:\n{}\n--- the server's log, last lines ---\n{}",
                output_text(&out),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }

    /// Writes `text` to `name` in the cluster's directory, owned by the
    /// cluster's user with `mode` (a `~/.pgpass` must be 0600 and its
    /// user's); returns its path.
    pub fn put_file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = self.dir().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .expect("chmod the file");
        if let Some((uid, gid)) = self.user {
            nix::unistd::chown(
                &path,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("give the file to postgres");
        }
        path
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `program` (the built `putex`) where the cluster's user can run it:
    /// itself when that user is this one, else a hard link in the
    /// cluster's `bin/` (a copy, mode 0755, when a link cannot be made or
    /// the file is not executable by others), checked as that user.
    pub fn runnable(&self, program: &Path) -> PathBuf {
        let Some(user) = self.user else {
            return program.to_owned();
        };
        let name = program.file_name().expect("a program's file name");
        let to = staging_dir(self.dir()).join(name);
        if !to.exists() {
            let open_to_all = std::fs::metadata(program)
                .map(|m| m.permissions().mode() & 0o005 == 0o005)
                .unwrap_or(false);
            if !open_to_all || std::fs::hard_link(program, &to).is_err() {
                std::fs::copy(program, &to)
                    .unwrap_or_else(|e| panic!("copy {} for postgres: {e}", program.display()));
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod the copy");
            }
        }
        user_can(user, "-x", &to);
        to
    }

    /// A command for one of PostgreSQL's programs, run as the cluster's user.
    pub fn pg(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        self.as_user(&mut cmd);
        cmd
    }

    /// Makes `cmd` run as the cluster's user, with the cluster's directory as
    /// its home and its working directory (this process's may be one that
    /// user cannot enter).
    pub fn as_user(&self, cmd: &mut Command) {
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid).current_dir(self.dir.path());
        }
        cmd.env("HOME", self.dir.path());
    }

    fn ok(&self, cmd: &mut Command) {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed:\n{}",
            output_text(&out)
        );
    }

    /// Runs `sql` on node `i` over its socket; the rows, one per line.
    pub fn sql(&self, i: usize, sql: &str) -> Result<String, String> {
        let out = self
            .pg("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", &self.sock.display().to_string()])
            .args([
                "-p",
                &self.nodes[i].port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(output_text(&out))
        }
    }

    /// Whether node `i` runs and is a primary (`Some(true)`), a replica
    /// (`Some(false)`), or does not answer (`None`).
    pub fn is_primary(&self, i: usize) -> Option<bool> {
        self.sql(i, "select pg_is_in_recovery()")
            .ok()
            .map(|r| r == "f")
    }

    /// The index of the node with this name.
    pub fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The postmaster's pid of node `i`, if it runs. A pid file left by a
    /// server that was killed names a process that is gone — or, once the
    /// pid was used again, another one (another test's postmaster): a
    /// postmaster works in its data directory, so the process counts only
    /// if that is its working directory (when this user may read it).
    pub fn postmaster(&self, i: usize) -> Option<i32> {
        let data = &self.nodes[i].data;
        let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        crate::agent::start_time(pid)?;
        match std::fs::read_link(format!("/proc/{pid}/cwd")) {
            Ok(cwd) => {
                let data = data.canonicalize().unwrap_or_else(|_| data.clone());
                (cwd == data).then_some(pid)
            }
            Err(_) => Some(pid),
        }
    }

    /// Runs every node's server as the systemd unit `putex-pg@NODE` of the
    /// recipe's `SERVICE` setting — through a `systemctl` stand-in (no
    /// systemd in a test): `start` and `stop` (a fast shutdown, waited for)
    /// as the unit would, each call logged in `systemctl.log`
    /// ([`PgCluster::systemctl_calls`]). Agents get it first on `PATH`.
    pub fn use_systemctl_stand_in(&mut self) {
        let bin = self.dir().join("stand-in");
        std::fs::create_dir_all(&bin).expect("stand-in dir");
        let dir = self.dir().display().to_string();
        let script = format!(
            "#!/bin/sh\n\
             # systemctl stand-in for the tests: start|stop putex-pg@NODE\n\
             echo \"$*\" >>'{dir}/systemctl.log'\n\
             . '{dir}/'\"${{2#putex-pg@}}\".conf\n\
             case $1 in\n\
             start) exec \"$PGBIN/pg_ctl\" start -D \"$PGDATA\" -w -l \"$PGDATA/service.log\" -o \"$PGCTL_OPTS\" >/dev/null ;;\n\
             stop) exec \"$PGBIN/pg_ctl\" stop -D \"$PGDATA\" -m fast -w -t 600 >/dev/null ;;\n\
             *) echo \"systemctl stand-in: $1 is not supported\" >&2; exit 1 ;;\n\
             esac\n"
        );
        let path = bin.join("systemctl");
        std::fs::write(&path, script).expect("write the systemctl stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the stand-in");
        std::fs::write(self.dir().join("systemctl.log"), "").expect("systemctl.log");
        if let Some((uid, gid)) = self.user {
            nix::unistd::chown(
                &self.dir().join("systemctl.log"),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("give systemctl.log to postgres");
        }
        for node in &self.nodes {
            append(&node.conf, &format!("SERVICE=putex-pg@{}\n", node.name));
        }
        self.stand_in = Some(bin);
    }

    /// The `systemctl` calls so far (one line each: `stop putex-pg@n1`).
    pub fn systemctl_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir().join("systemctl.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Node `i`, a replica, stops receiving WAL: its `primary_conninfo`
    /// points nowhere (reloaded, not restarted).
    pub fn stop_receiving(&self, i: usize) {
        self.sql(
            i,
            "alter system set primary_conninfo = 'host=127.0.0.1 port=1'",
        )
        .and_then(|_| self.sql(i, "select pg_reload_conf()"))
        .unwrap_or_else(|e| panic!("{}: {e}", self.nodes[i].name));
    }

    /// Adds `lines` (`KEY=value`, one per line) to node `i`'s recipe
    /// configuration: the hooks read it at each run.
    pub fn configure(&self, i: usize, lines: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.nodes[i].conf)
            .and_then(|mut f| writeln!(f, "{lines}"))
            .expect("append to the recipe's config");
    }

    /// Starts node `i`'s server by hand (`pg_ctl start`), as an operator
    /// would, whatever putex thinks of it.
    pub fn start_server(&self, i: usize) {
        self.pg_ctl_start(&self.nodes[i]);
    }

    /// Stops node `i`'s server with a fast shutdown, as an operator would.
    pub fn stop_server(&self, i: usize) {
        let data = &self.nodes[i].data;
        let mut cmd = self.pg("pg_ctl");
        cmd.args(["stop", "-m", "fast", "-w", "-D"]).arg(data);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        if !out.status.success() {
            let log = std::fs::read_to_string(data.join("putex-pg.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let pid = std::fs::read_to_string(data.join("postmaster.pid")).unwrap_or_default();
            let ps = Command::new("ps")
                .args(["-eo", "pid,ppid,stat,etimes,args"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!(
                "{cmd:?} failed:\n{}\npostmaster.pid: {pid}\nthe server's log, last lines first:\n{}\nps:\n{ps}",
                output_text(&out),
                tail.join("\n")
            );
        }
    }

    /// SIGKILLs node `i`'s postmaster and every process it started, and
    /// waits (up to 10 s) until they are gone: the server's part of a host
    /// crash. The postmaster is frozen first, so that it starts no process
    /// while its tree is read: one left behind keeps the shared memory
    /// attached, and the next `pg_ctl start` on the data directory fails
    /// ("pre-existing shared memory block is still in use").
    pub fn kill_server(&self, i: usize) {
        let Some(pid) = self.postmaster(i) else {
            return;
        };
        crate::agent::signal(pid, nix::sys::signal::Signal::SIGSTOP);
        let tree = crate::agent::descendants(pid);
        for p in &tree {
            crate::agent::sigkill(*p);
        }
        crate::agent::sigkill(pid);
        let gone = |p: i32| {
            // Gone, or a zombie: nothing of it is attached any more.
            std::fs::read_to_string(format!("/proc/{p}/stat")).map_or(true, |stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            })
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !(gone(pid) && tree.iter().all(|p| gone(*p))) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The `putex run` flags of the recipe for node `i`: every hook,
    /// `--advertise`, `--position` and `--info`.
    pub fn hook_flags(&self, i: usize) -> Vec<String> {
        let script = &self.hooks;
        let hook = |cmd: &str| {
            format!(
                "sh {} -c {} {cmd}",
                script.display(),
                self.nodes[i].conf.display()
            )
        };
        vec![
            "--advertise".into(),
            self.nodes[i].addr(),
            "--healthcheck".into(),
            hook("health"),
            "--position".into(),
            hook("position"),
            "--activate".into(),
            hook("activate"),
            "--deactivate".into(),
            hook("deactivate"),
            "--follow".into(),
            hook("follow"),
            "--rejoin".into(),
            hook("rejoin"),
            "--info".into(),
            hook("info"),
        ]
    }

    /// `putex run` for node `i` of lock `pg` with every hook of the recipe
    /// ([`PgCluster::hook_flags`]), its keeper directory and log in the
    /// cluster's directory, run as the cluster's user with that directory
    /// as its home (and the `systemctl` stand-in first on `PATH` when in
    /// use); timing and other flags are the caller's. `putex` is run from
    /// where that user can ([`PgCluster::runnable`]).
    pub fn agent_spec(&self, putex: &Path, url: &str, i: usize) -> AgentSpec {
        let putex = self.runnable(putex);
        let mut spec = AgentSpec::new(&putex, url, "pg", &self.nodes[i].name, self.dir())
            .args(&self.hook_flags(i))
            .env(&[("HOME", self.dir().display().to_string())])
            .run_as(self.user);
        if let Some(bin) = &self.stand_in {
            let path = std::env::var("PATH").unwrap_or_default();
            spec = spec.env(&[("PATH", format!("{}:{path}", bin.display()))]);
        }
        spec
    }

    /// The replicas streaming from node `i` (their application names: the
    /// node ids), sorted; none if it does not answer.
    pub fn streaming_from(&self, i: usize) -> Vec<String> {
        self.sql(
            i,
            "select application_name from pg_stat_replication where state = 'streaming' order by 1",
        )
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
    }

    /// The acknowledged sequence numbers missing from node `i`'s
    /// `putex_writes`.
    pub fn missing(&self, i: usize, acks: &[Ack]) -> Result<Vec<i64>, String> {
        let rows = self.sql(i, "select seq from putex_writes")?;
        let have: std::collections::HashSet<i64> =
            rows.lines().filter_map(|l| l.parse().ok()).collect();
        Ok(acks
            .iter()
            .map(|a| a.seq)
            .filter(|s| !have.contains(s))
            .collect())
    }

    /// A libpq connection string that finds the primary among all nodes
    /// (`target_session_attrs=read-write`).
    pub fn primary_conninfo(&self) -> String {
        let hosts = vec!["127.0.0.1"; self.nodes.len()].join(",");
        let ports: Vec<String> = self.nodes.iter().map(|n| n.port.to_string()).collect();
        format!(
            "host={hosts} port={} user=postgres dbname=postgres \
             target_session_attrs=read-write connect_timeout=1",
            ports.join(",")
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = self
                .pg("pg_ctl")
                .args(["stop", "-m", "immediate", "-w", "-t", "5", "-D"])
                .arg(&node.data)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            self.kill_server(i);
        }
    }
}

/// `bin/` in the cluster's directory, for what its user runs.
fn staging_dir(cluster: &Path) -> PathBuf {
    let bin = cluster.join("bin");
    std::fs::create_dir_all(&bin).expect("the cluster's bin directory");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the cluster's bin directory");
    bin
}

/// Checks that `user` passes `test FLAG PATH` (`-x`, `-r`, `-w`), or fails
/// the test at once naming the first directory on the way that it cannot
/// enter.
fn user_can(user: (u32, u32), flag: &str, path: &Path) {
    let ok = Command::new("test")
        .arg(flag)
        .arg(path)
        .uid(user.0)
        .gid(user.1)
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return;
    }
    let closed = path.ancestors().skip(1).find(|dir| {
        !Command::new("test")
            .arg("-x")
            .arg(dir)
            .uid(user.0)
            .gid(user.1)
            .status()
            .is_ok_and(|s| s.success())
    });
    let why = match closed {
        Some(dir) => format!(
            "it cannot enter {} (mode {:o}): set TMPDIR to a directory it can reach, \
             e.g. TMPDIR=/tmp",
            dir.display(),
            std::fs::metadata(dir)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0)
        ),
        None => "the file's own mode forbids it".into(),
    };
    panic!(
        "the postgres user (uid {}) fails `test {flag} {}`: {why}",
        user.0,
        path.display()
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes()).expect("append");
}

/// One write the [`Writer`] had acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The sequence number it inserted.
    pub seq: i64,
    /// The port of the server that acknowledged it.
    pub port: u16,
    /// When the acknowledgement arrived (wall-clock ns).
    pub ns: u128,
}

/// How long writes were unavailable around the first change of primary in
/// `acks`: from the old primary's last acknowledgement to the new one's
/// first.
pub fn write_gap(acks: &[Ack]) -> Option<Duration> {
    acks.windows(2)
        .find(|w| w[0].port != w[1].port)
        .map(|w| Duration::from_nanos((w[1].ns - w[0].ns) as u64))
}

/// Every stretch in `acks` in which the writer waited longer than `longer`
/// between two acknowledgements (its writes failed or hung): the earlier
/// acknowledgement's time and the later one's (wall-clock ns).
pub fn write_outages(acks: &[Ack], longer: Duration) -> Vec<(u128, u128)> {
    acks.windows(2)
        .filter(|w| w[1].ns.saturating_sub(w[0].ns) > longer.as_nanos())
        .map(|w| (w[0].ns, w[1].ns))
        .collect()
}

/// A client inserting sequence numbers into table `putex_writes` through a
/// connection string that finds the primary, recording each acknowledged
/// commit; on any error it reconnects (every 20 ms) and goes on with the
/// next number. Its own thread and runtime, so sync tests can use it.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts writing 1, 2, 3, … through `conninfo` (creating the table on
    /// the first server it reaches, if needed).
    pub fn start(conninfo: String) -> Writer {
        Writer::start_after(conninfo, 0)
    }

    /// The same, writing `after + 1`, `after + 2`, …: writers pinned to
    /// different servers need ranges of their own, or the second primary's
    /// writer would collide with the rows the first one replicated to it.
    pub fn start_after(conninfo: String, after: i64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (s, a) = (stop.clone(), acks.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(write_loop(conninfo, after, s, a));
        });
        Writer {
            stop,
            acks,
            thread: Some(thread),
        }
    }

    /// The acknowledged writes so far.
    pub fn acks(&self) -> Vec<Ack> {
        self.acks.lock().unwrap().clone()
    }

    /// Stops writing; every acknowledged write.
    pub fn stop(mut self) -> Vec<Ack> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.acks()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One connection kept open to a server, whose statements are sent now and
/// answered later: a test can send a statement to a server it froze
/// (SIGSTOP) and read the answer once it resumed. Its own thread and
/// runtime, as [`Writer`].
pub struct Session {
    requests: std::sync::mpsc::Sender<(String, std::sync::mpsc::Sender<Result<(), String>>)>,
}

impl Session {
    /// Connects through `conninfo` (within 5 s, else the error).
    pub fn connect(conninfo: &str) -> Result<Session, String> {
        let (requests, incoming) =
            std::sync::mpsc::channel::<(String, std::sync::mpsc::Sender<Result<(), String>>)>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let conninfo = conninfo.to_owned();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let connected = tokio::time::timeout(
                    Duration::from_secs(5),
                    tokio_postgres::connect(&conninfo, tokio_postgres::NoTls),
                )
                .await;
                let client = match connected {
                    Ok(Ok((client, connection))) => {
                        tokio::spawn(connection);
                        let _ = ready_tx.send(Ok(()));
                        client
                    }
                    Ok(Err(e)) => return drop(ready_tx.send(Err(e.to_string()))),
                    Err(_) => return drop(ready_tx.send(Err("no connection within 5 s".into()))),
                };
                while let Ok((sql, answer)) = incoming.recv() {
                    let done =
                        client
                            .batch_execute(&sql)
                            .await
                            .map_err(|e| match e.as_db_error() {
                                Some(db) => format!("{}: {}", db.code().code(), db.message()),
                                None => e.to_string(),
                            });
                    let _ = answer.send(done);
                }
            });
        });
        ready
            .recv()
            .map_err(|_| "the session's thread ended".to_owned())??;
        Ok(Session { requests })
    }

    /// Sends `sql` (one or more statements); the answer arrives on the
    /// receiver once the server gave it (`Err`: the server's SQLSTATE and
    /// message, or why the connection failed).
    pub fn send(&self, sql: &str) -> std::sync::mpsc::Receiver<Result<(), String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = self.requests.send((sql.to_owned(), tx));
        rx
    }

    /// Sends `sql` and waits `within` for its answer.
    pub fn run(&self, sql: &str, within: Duration) -> Result<(), String> {
        self.send(sql)
            .recv_timeout(within)
            .map_err(|_| format!("no answer to {sql:?} within {within:?}"))?
    }
}

/// One read of a [`Reader`].
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// When it came (wall-clock ns).
    pub ns: u128,
    /// Which server answered (its port) and whether it is in recovery;
    /// `None`: the read failed.
    pub server: Option<(u16, bool)>,
}

/// A client reading `select inet_server_port(), pg_is_in_recovery()`
/// through 127.0.0.1:`port` (a load balancer's) every 100 ms, each on a new
/// connection, recording who answered. Its own thread, as [`Writer`].
pub struct Reader {
    stop: Arc<AtomicBool>,
    reads: Arc<Mutex<Vec<Answer>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    /// Starts reading through `port`.
    pub fn start(port: u16) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(Mutex::new(Vec::new()));
        let (s, r) = (stop.clone(), reads.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let conninfo = format!(
                "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=1"
            );
            rt.block_on(async move {
                while !s.load(Ordering::SeqCst) {
                    let server = read_once(&conninfo).await;
                    r.lock().unwrap().push(Answer {
                        ns: wall_ns(),
                        server,
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        });
        Reader {
            stop,
            reads,
            thread: Some(thread),
        }
    }

    /// The reads made from `ns` (wall-clock ns) on.
    pub fn since(&self, ns: u128) -> Vec<Answer> {
        self.reads
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.ns >= ns)
            .copied()
            .collect()
    }

    /// Stops reading; every read.
    pub fn stop(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.reads.lock().unwrap().clone()
    }
}

async fn read_once(conninfo: &str) -> Option<(u16, bool)> {
    let call = Duration::from_secs(2);
    let (client, connection) = tokio::time::timeout(
        call,
        tokio_postgres::connect(conninfo, tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    let conn = tokio::spawn(connection);
    let row = tokio::time::timeout(
        call,
        client.query_one("select inet_server_port(), pg_is_in_recovery()", &[]),
    )
    .await
    .ok()
    .and_then(Result::ok);
    conn.abort();
    let row = row?;
    let port: i32 = row.get(0);
    Some((port as u16, row.get(1)))
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn write_loop(
    conninfo: String,
    after: i64,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
) {
    const CALL: Duration = Duration::from_secs(2);
    let mut seq: i64 = after;
    while !stop.load(Ordering::SeqCst) {
        let connected = tokio::time::timeout(
            CALL,
            tokio_postgres::connect(&conninfo, tokio_postgres::NoTls),
        )
        .await;
        let Ok(Ok((client, connection))) = connected else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let conn = tokio::spawn(connection);
        let ready = client
            .batch_execute("create table if not exists putex_writes (seq bigint primary key)")
            .await;
        if ready.is_ok() {
            while !stop.load(Ordering::SeqCst) {
                seq += 1;
                let row = tokio::time::timeout(
                    CALL,
                    client.query_one(
                        "insert into putex_writes values ($1) returning inet_server_port()",
                        &[&seq],
                    ),
                )
                .await;
                match row {
                    Ok(Ok(row)) => {
                        let port: i32 = row.get(0);
                        acks.lock().unwrap().push(Ack {
                            seq,
                            port: port as u16,
                            ns: wall_ns(),
                        });
                    }
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        conn.abort();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
