//! `putex lock` end to end: the built binary against a real nats-server, a
//! real etcd and the embedded SQLite store — mutual exclusion, fencing tokens, exit codes,
//! faults (a holder cut off, frozen or killed), `--max-duration`,
//! `--once-per`, semaphores and bad input.
//!
//! Every section uses `--ttl 1s` (R = 100 ms, F = 10, G = 200 ms, W ≈ 1.02 s).

use std::borrow::BorrowMut;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use putex::locks::queue::Waiter;
use putex::store::{keys, AnyStore, SqliteStore, Store};

use crate::common::agent::{
    putex, putex_json, putex_lock, putex_sh, timing_slot, wall_ns, KillOnDrop,
};
use crate::common::proxy::{Mode, Proxy};
use crate::common::store::Backend;
use crate::common::{on_stores, runtime};

/// A scratch directory (with the keepers' sockets in `keepers`), a store
/// URL and the store's server (or SQLite file), stopped with it.
struct Env {
    dir: tempfile::TempDir,
    url: String,
    server: Backend,
}

impl Env {
    fn on(server: Backend) -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
            url: server.url(),
            server,
        }
    }

    fn sqlite() -> Env {
        Env::on(Backend::sqlite())
    }

    fn nats() -> Env {
        Env::on(Backend::nats())
    }

    fn etcd() -> Env {
        Env::on(Backend::etcd())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `putex lock NAME --ttl 1s ARGS -- sh -c SCRIPT`, in the scratch
    /// directory, with `$D` set to it.
    fn lock(&self, name: &str, args: &[&str], script: &str) -> Command {
        self.lock_via(&self.url, name, args, script)
    }

    fn lock_via(&self, url: &str, name: &str, args: &[&str], script: &str) -> Command {
        self.lock_ttl(url, name, "1s", args, script)
    }

    /// [`Env::lock_via`] with another `--ttl`.
    fn lock_ttl(&self, url: &str, name: &str, ttl: &str, args: &[&str], script: &str) -> Command {
        putex_lock(self.dir.path(), url, name, ttl, args, script)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn wait_for_lines(&self, name: &str, n: usize, within: Duration) {
        let started = Instant::now();
        while self.read(name).lines().count() < n {
            assert!(
                started.elapsed() < within,
                "{name} has fewer than {n} lines after {within:?}: {:?}",
                self.read(name)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `c`: its exit status and stderr.
fn run(mut c: impl BorrowMut<Command>) -> (ExitStatus, String) {
    let out = c.borrow_mut().output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawns `c` as node `node` (`PUTEX_NODE`), its stderr piped for
/// [`wait_all`].
fn spawn_as(mut c: Command, node: &str) -> Child {
    c.env("PUTEX_NODE", node).stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Waits for every one of `children`: nothing is asserted before all have
/// ended.
fn wait_all(children: Vec<Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// `out` exited 0; its stderr shows otherwise.
fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn code(c: impl BorrowMut<Command>) -> i32 {
    let (status, stderr) = run(c);
    status
        .code()
        .unwrap_or_else(|| panic!("{status:?}: {stderr}"))
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Waits until `pid` is stopped by a signal (SIGSTOP): state `T`.
fn wait_frozen(pid: u32, within: Duration) {
    let started = Instant::now();
    let state = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command's name in parentheses.
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
    };
    while state() != Some('T') {
        assert!(
            started.elapsed() < within,
            "{pid} not stopped after {within:?}: state {:?}",
            state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn pid_alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// The script of a critical section that reads, sleeps and writes a
/// counter, and logs its fencing token.
const COUNTER: &str = r#"n=$(cat "$D/counter" 2>/dev/null || echo 0)
sleep 0.01
echo $((n + 1)) > "$D/counter"
echo "$PUTEX_EPOCH $PUTEX_REVISION" >> "$D/tokens""#;

fn counter_is_exact(env: &Env) {
    // T = 3 s: eight processes on a busy two-core machine must not lose a
    // lock to a slow renewal (a lost lock kills CMD and fails the client,
    // correctly, but this test is about counting, not about lapses).
    let lock = |script: &str| env.lock_ttl(&env.url, "counter", "3s", &[], script);
    // Make the name's first use (S4: W + G) before the clients start.
    assert_eq!(code(lock("true")), 0);
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let cmds: Vec<Command> = (0..15)
                .map(|_| {
                    let mut c = lock(COUNTER);
                    c.env("PUTEX_NODE", format!("client{i}"));
                    c
                })
                .collect();
            std::thread::spawn(move || {
                for c in cmds {
                    let (status, stderr) = run(c);
                    assert!(status.success(), "{status:?}: {stderr}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(env.read("counter").trim(), "120");
    let tokens: Vec<(u64, u64)> = env
        .read("tokens")
        .lines()
        .map(|l| {
            let (e, r) = l.split_once(' ').unwrap();
            (e.parse().unwrap(), r.parse().unwrap())
        })
        .collect();
    assert_eq!(tokens.len(), 120);
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "fencing tokens must increase in critical-section order: {w:?}"
        );
    }
}

on_stores!(Env, counter_is_exact =>
    eight_clients_count_exactly_on_nats: nats,
    eight_clients_count_exactly_on_sqlite: sqlite,
    eight_clients_count_exactly_on_etcd: etcd,
);

/// Two hosts that run `putex lock` with one node id (S5): the waiter sees
/// a live record with its own node id from another machine and ends with
/// an error that says so (exit 70), not "not acquired" (75), which it once
/// reported although it would have waited forever.
#[test]
fn a_waiter_with_another_hosts_node_id_says_so() {
    let env = Env::sqlite();
    let mut holder = env.lock("dup", &[], "sleep 4");
    holder
        .env("PUTEX_NODE", "same")
        .env("PUTEX_MACHINE_ID", "m1");
    let mut holder = holder.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut waiter = env.lock("dup", &[], "true");
    waiter
        .env("PUTEX_NODE", "same")
        .env("PUTEX_MACHINE_ID", "m2");
    let out = waiter.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains("another machine (m1)") && stderr.contains("same node id"),
        "{stderr}"
    );
    assert!(!stderr.contains("not acquired"), "{stderr}");
    assert_eq!(holder.wait().unwrap().code(), Some(0));
}

/// CMD's output goes where `putex lock`'s was sent, as with `flock`: its
/// stdout to `putex lock`'s stdout (a file, a pipe, `$(…)`), its stderr
/// to stderr; `putex lock` itself writes nothing to stdout. (CMD runs
/// under the keeper, a process of its own: its stdout once went to the
/// keeper's stderr, so `putex lock backup -- pg_dump db > dump.sql` wrote
/// the dump to the terminal and an empty file.)
#[test]
fn cmds_output_goes_where_putex_locks_was_sent() {
    let env = Env::sqlite();
    let out = env
        .lock("output", &[], "echo to-stdout; echo to-stderr >&2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-stdout\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("to-stderr"), "{stderr}");
    assert!(!stderr.contains("to-stdout"), "{stderr}");

    // Into a file, through the shell's redirection, with a command that
    // writes more than a pipe holds.
    let file = env.dir.path().join("dump.out");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"$0\" lock output --store '{}' -- sh -c 'seq 1 100000' > '{}'",
            env.url,
            file.display()
        ))
        .arg(env!("CARGO_BIN_EXE_putex"))
        .env("PUTEX_KEEPER_DIR", env.dir.path().join("keepers"))
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let dumped = std::fs::read_to_string(&file).unwrap();
    assert_eq!(dumped.lines().count(), 100_000);
    assert_eq!(dumped.lines().last(), Some("100000"));
}

#[test]
fn exit_codes_pass_through_and_conflicts_are_75() {
    let env = Env::sqlite();
    assert_eq!(code(env.lock("codes", &[], "exit 3")), 3);
    assert_eq!(
        code(env.lock("codes", &[], "kill -TERM $$")),
        128 + 15,
        "a signal n becomes 128+n"
    );
    let mut holder = env
        .lock("codes", &[], r#"echo in > "$D/held"; sleep 3"#)
        .spawn()
        .unwrap();
    env.wait_for_lines("held", 1, Duration::from_secs(10));
    let started = Instant::now();
    let (status, stderr) = run(env.lock("codes", &["--no-wait"], "echo ran >> \"$D/ran\""));
    assert_eq!(status.code(), Some(75), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(stderr.contains("not acquired"), "{stderr}");
    assert_eq!(
        code(env.lock("codes", &["--no-wait", "--conflict-exit-code", "9"], "true")),
        9
    );
    let started = Instant::now();
    assert_eq!(code(env.lock("codes", &["--wait", "500ms"], "true")), 75);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(env.read("ran"), "", "no command ran without the lock");
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), Some(0));
    // Released: the next one starts at once.
    let started = Instant::now();
    let (status, stderr) = run(env
        .lock("codes", &["--no-wait"], "true")
        .env("RUST_LOG", "info"));
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn signals_are_forwarded_and_leftovers_stopped() {
    let env = Env::sqlite();
    let mut c = env
        .lock(
            "sig",
            &[],
            r#"trap 'echo got >> "$D/trap"; exit 7' TERM
sleep 1000 & echo $! > "$D/pids"
wait"#,
        )
        .spawn()
        .unwrap();
    env.wait_for_lines("pids", 1, Duration::from_secs(10));
    let sleeper: i32 = env.read("pids").trim().parse().unwrap();
    kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(wait_exit(&mut c, Duration::from_secs(15)), Some(7));
    assert_eq!(env.read("trap").trim(), "got");
    assert!(
        !pid_alive(sleeper),
        "the background sleep outlived the section"
    );
}

/// A section whose command and grandchild record their pids, and a second
/// section that checks they are gone when it starts.
const HOLD: &str = r#"echo $$ > "$D/pids"
sleep 1000 & echo $! >> "$D/pids"
wait"#;
const CHECK: &str = r#"for p in $(cat "$D/pids"); do
  if kill -0 "$p" 2>/dev/null && ! grep -q ') Z ' "/proc/$p/stat"; then echo "ALIVE $p"; fi
done > "$D/check"
echo started >> "$D/second""#;

/// The first holder of `fault`, through `url`: its [`HOLD`] section, once
/// its command and grandchild run.
fn first_holder(env: &Env, url: &str) -> Child {
    let first = env.lock_via(url, "fault", &[], HOLD).spawn().unwrap();
    env.wait_for_lines("pids", 2, Duration::from_secs(15));
    first
}

fn second_holder_finds_the_first_tree_gone(env: &Env, url: &str) {
    let (status, stderr) = run(env.lock_via(url, "fault", &["--wait", "30s"], CHECK));
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(env.read("second").trim(), "started");
    assert_eq!(
        env.read("check"),
        "",
        "the first holder's command or grandchild still ran"
    );
}

/// The holder's store connection goes through a proxy that then
/// blackholes: CMD is stopped before a second holder (connected directly)
/// starts, and the first reports the lost lock (76).
fn holder_cut_off_loses_its_command_first(env: &Env) {
    let proxy = Proxy::start_blocking(env.server.addr()).unwrap();
    let via = env.server.url_via(proxy.addr());
    let mut first = first_holder(env, &via);
    proxy.set(Mode::Blackhole);
    second_holder_finds_the_first_tree_gone(env, &env.url);
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(20)),
        Some(76),
        "the cut-off holder reports the lost lock"
    );
    drop(proxy);
}

on_stores!(timing_slot; Env, holder_cut_off_loses_its_command_first =>
    a_holder_cut_off_from_the_store_loses_its_command_first: nats,
    a_holder_cut_off_from_the_store_loses_its_command_first_on_etcd: etcd,
);

/// On NATS: frozen inside an SQLite write transaction (a renewal is one
/// every R), the holder would keep the file locked for every other
/// process until it thaws — the embedded store's single writer, not what
/// this test is about (CI s20c: "database is locked" once).
fn frozen_holder_loses_its_command_to_the_keeper(env: &Env) {
    let mut first = first_holder(env, &env.url);
    let pid = Pid::from_raw(first.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    second_holder_finds_the_first_tree_gone(env, &env.url);
    kill(pid, Signal::SIGCONT).unwrap();
    assert_eq!(wait_exit(&mut first, Duration::from_secs(15)), Some(76));
}

on_stores!(timing_slot; Env, frozen_holder_loses_its_command_to_the_keeper =>
    a_frozen_holder_loses_its_command_to_the_keeper: nats,
    a_frozen_holder_loses_its_command_to_the_keeper_on_etcd: etcd,
);

fn killed_holder_loses_its_command_to_the_keeper(env: &Env) {
    let mut first = first_holder(env, &env.url);
    first.kill().unwrap();
    first.wait().unwrap();
    second_holder_finds_the_first_tree_gone(env, &env.url);
}

on_stores!(timing_slot; Env, killed_holder_loses_its_command_to_the_keeper =>
    a_killed_holder_loses_its_command_to_the_keeper: nats,
    a_killed_holder_loses_its_command_to_the_keeper_on_etcd: etcd,
);

#[test]
fn max_duration_stops_a_hung_command() {
    let env = Env::sqlite();
    let started = Instant::now();
    let (status, stderr) = run(env.lock(
        "hung",
        &["--max-duration", "500ms"],
        r#"sleep 1000 & echo $! > "$D/pids"; wait"#,
    ));
    assert_eq!(status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("--max-duration"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let sleeper: i32 = env.read("pids").trim().parse().unwrap();
    assert!(!pid_alive(sleeper));
    // It was released: the lock is free at once.
    assert_eq!(code(env.lock("hung", &["--no-wait"], "true")), 0);
}

on_stores!(Env, runs_once_across_five_hosts =>
    once_per_runs_once_across_five_hosts: nats,
    once_per_runs_once_across_five_hosts_on_etcd: etcd,
);

fn runs_once_across_five_hosts(env: &Env) {
    let hosts: Vec<Child> = (0..5)
        .map(|i| {
            let script = r#"echo "$PUTEX_NODE" >> "$D/runs"; sleep 0.2"#;
            spawn_as(
                env.lock("daily", &["--once-per", "24h"], script),
                &format!("host{i}"),
            )
        })
        .collect();
    for out in wait_all(hosts) {
        assert_success(&out);
    }
    assert_eq!(env.read("runs").lines().count(), 1, "{}", env.read("runs"));
    let (status, stderr) =
        run(env.lock("daily", &["--once-per", "24h"], "echo again >> \"$D/runs\""));
    assert!(status.success());
    assert!(stderr.contains("already ran in period"), "{stderr}");
    assert_eq!(env.read("runs").lines().count(), 1);
    // A failed run does not count; an explicit key is its own period.
    assert_eq!(
        code(env.lock("weekly", &["--once-key", "w47"], "exit 1")),
        1
    );
    assert_eq!(
        code(env.lock("weekly", &["--once-key", "w47"], "echo ok >> \"$D/weekly\"")),
        0
    );
    assert_eq!(
        code(env.lock("weekly", &["--once-key", "w47"], "echo ok >> \"$D/weekly\"")),
        0
    );
    assert_eq!(env.read("weekly").lines().count(), 1);
}

fn semaphore_admits_two(env: &Env) {
    let script = r#"touch "$D/in.$$"
[ "$(ls "$D" | grep -c '^in\.')" -gt 2 ] && echo over >> "$D/bad"
mkdir "$D/slot.$PUTEX_SLOT" || echo "dup $PUTEX_SLOT" >> "$D/bad"
sleep 0.3
rmdir "$D/slot.$PUTEX_SLOT"
rm "$D/in.$$"
echo "$PUTEX_SLOT" >> "$D/slots""#;
    let clients: Vec<Child> = (0..6)
        .map(|i| spawn_as(env.lock("sem", &["--limit", "2"], script), &format!("c{i}")))
        .collect();
    for out in wait_all(clients) {
        assert_success(&out);
    }
    assert_eq!(env.read("bad"), "");
    let slots: Vec<String> = env.read("slots").lines().map(str::to_owned).collect();
    assert_eq!(slots.len(), 6);
    assert!(slots.iter().all(|s| s == "0" || s == "1"), "{slots:?}");
    // Clients that disagree on N are refused, naming the limit.
    let (status, stderr) = run(env.lock("sem", &["--limit", "3"], "true"));
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--limit 2"), "{stderr}");
    let (status, stderr) = run(env.lock("sem", &[], "true"));
    assert_eq!(status.code(), Some(64), "{stderr}");
    // `putex status` lists the semaphore with its slots.
    let v = putex_json(&["status", "--store", &env.url]);
    assert_eq!(v["semaphores"][0]["name"], "sem", "{v}");
    assert_eq!(v["semaphores"][0]["limit"], 2, "{v}");
    assert_eq!(v["semaphores"][0]["slots"][1]["state"], "released", "{v}");
}

on_stores!(Env, semaphore_admits_two =>
    semaphore_admits_two_on_nats: nats,
    semaphore_admits_two_on_sqlite: sqlite,
    semaphore_admits_two_on_etcd: etcd,
);

/// The most sections inside at once, from the `+ NS` / `- NS` lines that
/// [`inside`] sections append to `$D/ev` (a section's `-` is written before
/// its release, the next one's `+` after its acquisition: the wall-clock
/// order of the lines is the order of the sections on this machine).
fn most_inside(env: &Env) -> usize {
    let mut ev: Vec<(u128, i32)> = env
        .read("ev")
        .lines()
        .map(|l| {
            let (k, t) = l.split_once(' ').unwrap();
            // At equal times the leaving one first: never an overcount.
            (t.parse().unwrap(), if k == "+" { 1 } else { -1 })
        })
        .collect();
    ev.sort();
    let (mut n, mut most) = (0, 0);
    for (_, d) in ev {
        n += d;
        most = most.max(n);
    }
    most as usize
}

/// A section that logs when it enters and leaves and holds for `secs`.
fn inside(secs: f64) -> String {
    format!(r#"echo "+ $(date +%s%N)" >> "$D/ev"; sleep {secs}; echo "- $(date +%s%N)" >> "$D/ev""#)
}

/// `clients` sections of `--limit limit` holding `secs` each with `--ttl
/// ttl`, started at once: the most inside at once, and how long they all
/// took.
fn run_at_once(
    env: &Env,
    name: &str,
    ttl: &str,
    args: &[&str],
    clients: usize,
    secs: f64,
) -> (usize, Duration) {
    let _ = std::fs::remove_file(env.path("ev"));
    let started = Instant::now();
    let children: Vec<Child> = (0..clients)
        .map(|i| {
            let c = env.lock_ttl(&env.url, name, ttl, args, &inside(secs));
            spawn_as(c, &format!("c{i}"))
        })
        .collect();
    let outs = wait_all(children);
    let took = started.elapsed();
    for out in outs {
        assert_success(&out);
    }
    assert_eq!(
        env.read("ev").lines().count(),
        2 * clients,
        "{}",
        env.read("ev")
    );
    (most_inside(env), took)
}

/// N slots free and N or more waiters: N run at once, never more, and M
/// clients holding h each take about ⌈M/N⌉·h — on a fresh name (its slot
/// records are created: S4, W + G' once) and on one whose slots exist.
fn semaphore_runs_n_at_once(env: &Env, limit: u32, clients: usize, secs: f64, ttl: &str) {
    let n = limit.to_string();
    let args = ["--limit", n.as_str()];
    let serial = Duration::from_secs_f64(secs * clients as f64);
    let (fresh, took) = run_at_once(env, "par", ttl, &args, clients, secs);
    eprintln!("fresh name: {clients} × {secs}s, --limit {limit}: at most {fresh} inside, {took:?}");
    assert_eq!(fresh, limit as usize, "on a fresh name; took {took:?}");
    let (most, took) = run_at_once(env, "par", ttl, &args, clients, secs);
    eprintln!(
        "existing slots: {clients} × {secs}s, --limit {limit}: at most {most} inside, {took:?}"
    );
    assert_eq!(most, limit as usize, "took {took:?}");
    // ⌈M/N⌉·h plus hand-offs and process starts; one at a time would take
    // M·h.
    assert!(took < serial * 3 / 4, "{clients} × {secs}s took {took:?}");
}

on_stores!(timing_slot; Env, |env: &Env| semaphore_runs_n_at_once(env, 2, 6, 1.0, "1s") =>
    semaphore_runs_n_at_once_on_nats: nats,
    semaphore_runs_n_at_once_on_etcd: etcd,
);

#[test]
fn semaphore_runs_n_at_once_on_sqlite() {
    let _slot = timing_slot();
    // Holds long against a hand-off on a busy machine (a process start,
    // a few store writes), or "4 inside at once" measures the machine.
    // --ttl 3s: 8 clients of 4 slot agents each share 2 cores and one
    // SQLite file; with --ttl 1s a starved holder's licence ran out in one
    // CI run (exit 76), which is the load, not the semaphore. Hand-offs go
    // by release and watch, not by R, so the timing assertion stands.
    semaphore_runs_n_at_once(&Env::sqlite(), 4, 8, 1.5, "3s");
}

/// A lone first client of a fresh semaphore creates every slot (one agent
/// per slot) while it waits out the absent records (S4), but keeps only
/// one: the others are given back when that wait ends, so a second client
/// that came meanwhile enters at once and runs beside the first.
fn a_fresh_semaphore_leaves_its_other_slots_to_later_clients(env: &Env) {
    let _ = std::fs::remove_file(env.path("ev"));
    let first = env
        .lock("late", &["--limit", "2"], &inside(2.0))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let second = env
        .lock("late", &["--limit", "2"], &inside(2.0))
        .spawn()
        .unwrap();
    for c in [first, second] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", out.status);
    }
    let mut entered: Vec<u128> = env
        .read("ev")
        .lines()
        .filter_map(|l| l.strip_prefix("+ ")?.parse().ok())
        .collect();
    entered.sort();
    let apart = Duration::from_nanos((entered[1] - entered[0]) as u64);
    eprintln!("the second client entered {apart:?} after the first");
    assert!(
        apart < Duration::from_millis(900),
        "the second client entered {apart:?} after the first (it came 300 ms later)"
    );
    assert_eq!(most_inside(env), 2);
}

on_stores!(timing_slot; Env, a_fresh_semaphore_leaves_its_other_slots_to_later_clients =>
    a_fresh_semaphore_leaves_its_other_slots_to_later_clients_on_sqlite: sqlite,
    a_fresh_semaphore_leaves_its_other_slots_to_later_clients_on_nats: nats,
    a_fresh_semaphore_leaves_its_other_slots_to_later_clients_on_etcd: etcd,
);

/// Clients of a fresh name started at once, half with `--limit 1`, half
/// with `--limit 3`: the first definition wins, every client of the other
/// limit is refused (exit 64, naming both limits), and never more are
/// inside than the winning limit allows.
fn disagreeing_limits_never_overlap(env: &Env) {
    for round in 0..2 {
        let name = format!("mixed{round}");
        let _ = std::fs::remove_file(env.path("ev"));
        let limits: [u32; 4] = [1, 3, 1, 3];
        let children: Vec<Child> = limits
            .iter()
            .enumerate()
            .map(|(i, limit)| {
                let n = limit.to_string();
                spawn_as(
                    env.lock(&name, &["--limit", &n], &inside(1.0)),
                    &format!("c{i}"),
                )
            })
            .collect();
        let outs = limits.into_iter().zip(wait_all(children));
        let mut ran = Vec::new();
        let mut refused = Vec::new();
        for (limit, out) in outs {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            match out.status.code() {
                Some(0) => ran.push(limit),
                Some(64) => {
                    let other = if limit == 1 { 3 } else { 1 };
                    assert!(
                        stderr.contains(&format!("--limit {other}"))
                            && stderr.contains(&format!("--limit {limit}")),
                        "the refusal names both limits: {stderr}"
                    );
                    refused.push(limit);
                }
                _ => panic!("--limit {limit}: {:?}: {stderr}", out.status),
            }
        }
        ran.sort();
        refused.sort();
        let (winner, loser) = match ran.first() {
            Some(1) => (1, 3),
            Some(3) => (3, 1),
            _ => panic!("nobody ran: refused {refused:?}"),
        };
        assert_eq!(ran, [winner, winner], "round {round}: refused {refused:?}");
        assert_eq!(refused, [loser, loser], "round {round}: ran {ran:?}");
        let most = most_inside(env);
        assert!(
            most <= winner as usize,
            "round {round}: {most} inside at once under --limit {winner}"
        );
    }
}

on_stores!(Env, disagreeing_limits_never_overlap =>
    disagreeing_limits_never_overlap_on_sqlite: sqlite,
    disagreeing_limits_never_overlap_on_nats: nats,
    disagreeing_limits_never_overlap_on_etcd: etcd,
);

/// The lock is lost between CMD's run and its record: CMD logs its run,
/// freezes its own putex (SIGSTOP) and exits 0, so no renewal or record
/// follows, the keeper's deadline passes and a second host takes over.
/// Returns who ran, and the second host's stderr.
fn once_lost_before_the_record(env: &Env, mode: &str) -> (Vec<String>, String) {
    let name = format!("once-{mode}");
    let args = ["--once-per", "24h", "--once-mode", mode];
    let mut first = env.lock(
        &name,
        &args,
        r#"echo "$PUTEX_NODE" >> "$D/runs"; kill -STOP "$(cat "$D/first.pid")"; exit 0"#,
    );
    first.env("PUTEX_NODE", "first");
    let mut first = first.spawn().unwrap();
    // Whatever happens below, the frozen host does not outlive the test.
    let _kill = KillOnDrop(first.id() as i32);
    std::fs::write(env.path("first.pid"), first.id().to_string()).unwrap();
    env.wait_for_lines("runs", 1, Duration::from_secs(15));
    // CMD's kill may come late on a busy machine: the second host starts
    // once the first is frozen (an at-most second host that finds the
    // period claimed exits at once, and the SIGCONT below must come after
    // the SIGSTOP).
    wait_frozen(first.id(), Duration::from_secs(15));
    let mut second = env.lock(
        &name,
        &[&args[..], &["--wait", "30s"]].concat(),
        r#"echo "$PUTEX_NODE" >> "$D/runs""#,
    );
    second.env("PUTEX_NODE", "second");
    let (status, stderr) = run(second);
    assert!(status.success(), "{status:?}: {stderr}");
    kill(Pid::from_raw(first.id() as i32), Signal::SIGCONT).unwrap();
    // CMD ran to its end before the lock was lost: its 0, or 76 when the
    // keeper's deadline is read first.
    let code = wait_exit(&mut first, Duration::from_secs(15));
    assert!(
        matches!(code, Some(0 | 76)),
        "the frozen first host: {code:?}"
    );
    let runs = env.read("runs").lines().map(str::to_owned).collect();
    (runs, stderr)
}

// On NATS and etcd: a process frozen inside an SQLite write transaction
// would hold the file's write lock, and the second host could not even
// open the store (docs/stores.md, "a frozen writer blocks everyone").
on_stores!(Env, at_most_never_runs_twice_when_the_lock_is_lost =>
    once_at_most_never_runs_twice_when_the_lock_is_lost: nats,
    once_at_most_never_runs_twice_when_the_lock_is_lost_on_etcd: etcd,
);

fn at_most_never_runs_twice_when_the_lock_is_lost(env: &Env) {
    let (runs, stderr) = once_lost_before_the_record(env, "at-most");
    assert_eq!(runs, ["first"], "{stderr}");
    assert!(stderr.contains("already ran in period"), "{stderr}");
    // A run that fails still used the period: it is never started twice.
    let args = ["--once-key", "k1", "--once-mode", "at-most"];
    assert_eq!(
        code(env.lock("failing", &args, "echo x >> \"$D/failing\"; exit 1")),
        1
    );
    let (status, stderr) = run(env.lock("failing", &args, "echo x >> \"$D/failing\""));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("already ran in period"), "{stderr}");
    assert_eq!(env.read("failing").lines().count(), 1);
}

on_stores!(Env, at_least_runs_again_when_the_lock_is_lost =>
    once_at_least_runs_again_when_the_lock_is_lost: nats,
    once_at_least_runs_again_when_the_lock_is_lost_on_etcd: etcd,
);

fn at_least_runs_again_when_the_lock_is_lost(env: &Env) {
    let (runs, second) = once_lost_before_the_record(env, "at-least");
    assert_eq!(runs, ["first", "second"], "{second}");
    // The second run was recorded: a third host does not run it.
    let (status, stderr) = run(env.lock(
        "once-at-least",
        &["--once-per", "24h", "--once-mode", "at-least"],
        r#"echo third >> "$D/runs""#,
    ));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("already ran in period"),
        "third: {stderr}\nsecond: {second}"
    );
    assert_eq!(env.read("runs").lines().count(), 2);
}

/// The host's memory of a lock (S6) is one file, whoever wrote it: two
/// sections leave `<hash>-lock.NAME.state.json` with the last token and
/// nothing else; a higher token remembered by the host (here in the file an
/// earlier release kept, `….highest`, as after an upgrade) makes the next
/// section refuse a store that offers less, and run nothing.
#[test]
fn the_host_remembers_the_highest_token_in_one_file_and_refuses_less() {
    let env = Env::sqlite();
    let record = r#"echo "$PUTEX_EPOCH $PUTEX_REVISION" >> "$D/tokens""#;
    assert_eq!(code(env.lock("hs", &[], record)), 0);
    assert_eq!(code(env.lock("hs", &[], record)), 0);
    let tokens = env.read("tokens");
    let last: Vec<u64> = tokens
        .lines()
        .last()
        .expect("two sections ran")
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    let keepers = env.path("keepers");
    let state: Vec<PathBuf> = std::fs::read_dir(&keepers)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".sock"))
        .collect();
    assert_eq!(state.len(), 1, "one host file: {state:?}");
    let file = &state[0];
    assert!(
        file.to_string_lossy().ends_with("-lock.hs.state.json"),
        "{file:?}"
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    // The highest token seen: the last section's, or its release's after it.
    let (epoch, revision) = (
        saved["highest"]["epoch"].as_u64(),
        saved["highest"]["revision"].as_u64().unwrap_or(0),
    );
    assert_eq!(epoch, Some(last[0]), "{saved}");
    assert!(revision >= last[1], "{saved} below the last token {last:?}");

    let legacy = PathBuf::from(file.to_string_lossy().replace(".state.json", ".highest"));
    std::fs::write(
        &legacy,
        format!(r#"{{"epoch":{},"revision":{}}}"#, last[0], revision + 1000),
    )
    .unwrap();
    let (status, stderr) = run(env
        .lock("hs", &["--wait", "2s"], record)
        .env("RUST_LOG", "error"));
    assert_eq!(status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("STORE REGRESSED"), "{stderr}");
    assert_eq!(
        env.read("tokens"),
        tokens,
        "nothing ran below the host's token"
    );
}

#[test]
fn bad_input_is_refused_and_garbage_is_survived() {
    let env = Env::sqlite();
    for (args, name) in [
        (&["--limit", "0"][..], "job"),
        (&[][..], "a.b"),
        (&[][..], ""),
        (&["--ttl", "0s"][..], "job"),
        (&["--once-per", "0s"][..], "job"),
    ] {
        let (status, stderr) = run(env.lock(name, args, "true"));
        assert_eq!(status.code(), Some(64), "{args:?} {name:?}: {stderr}");
    }
    let (status, stderr) =
        run(putex().args(["lock", "job", "--store", "nosuch://x", "--", "true"]));
    assert_eq!(status.code(), Some(64), "{stderr}");
    // A usage error is 64 also behind global options, and clap's 2 for
    // commands that do not use sysexits codes.
    for (args, code) in [
        (&["--log-format", "json", "lock", "job"][..], 64),
        (
            &["-v", "lock", "--no-such-flag", "job", "--", "true"][..],
            64,
        ),
        (&["-v", "id", "claim"][..], 64),
        (&["--log-format", "json", "status", "--no-such-flag"][..], 2),
    ] {
        let (status, stderr) = run(putex().args(args));
        assert_eq!(status.code(), Some(code), "{args:?}: {stderr}");
    }
    // Garbage written by someone else into the lock record: stale (S1), taken after W.
    runtime().block_on(async {
        let store = env.server.open().await;
        store
            .create(
                &keys::lock(&"garbage".parse().unwrap()),
                b"\xff not json",
                Duration::from_secs(1),
            )
            .await
            .unwrap();
        store
            .create(
                &keys::semaphore(&"gsem".parse().unwrap()),
                b"{\"v\":9}",
                Duration::from_secs(1),
            )
            .await
            .unwrap();
    });
    let started = Instant::now();
    assert_eq!(
        code(env.lock("garbage", &[], "echo ok > \"$D/garbage\"")),
        0
    );
    assert_eq!(env.read("garbage").trim(), "ok");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "taken before W"
    );
    let (status, stderr) = run(env.lock("gsem", &["--limit", "2"], "true"));
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("does not understand"), "{stderr}");
    let _ = Path::new("");
}

/// `start NAME NS` / `end NAME NS` lines of a section that sleeps `secs`.
fn timed(name: &str, secs: f64) -> String {
    format!(
        r#"echo "start {name} $(date +%s%N)" >> "$D/times"; sleep {secs}; echo "end {name} $(date +%s%N)" >> "$D/times""#
    )
}

fn times(env: &Env) -> Vec<(String, String, u128)> {
    env.read("times")
        .lines()
        .map(|l| {
            let mut p = l.split(' ');
            (
                p.next().unwrap().to_owned(),
                p.next().unwrap().to_owned(),
                p.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

on_stores!(timing_slot; Env, waiters_take_turns =>
    waiters_take_turns_in_arrival_order_within_milliseconds: nats,
    waiters_take_turns_in_arrival_order_within_milliseconds_on_etcd: etcd,
);

fn waiters_take_turns(env: &Env) {
    assert_eq!(code(env.lock("fair", &[], "true")), 0);
    let mut children = vec![env.lock("fair", &[], &timed("h", 1.5)).spawn().unwrap()];
    env.wait_for_lines("times", 1, Duration::from_secs(10));
    for w in ["w1", "w2", "w3"] {
        children.push(env.lock("fair", &[], &timed(w, 0.2)).spawn().unwrap());
        std::thread::sleep(Duration::from_millis(250));
    }
    for mut c in children {
        assert_eq!(wait_exit(&mut c, Duration::from_secs(30)), Some(0));
    }
    let t = times(env);
    let order: Vec<&str> = t
        .iter()
        .map(|(k, n, _)| if k == "start" { n.as_str() } else { "" })
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(order, ["h", "w1", "w2", "w3"], "{t:?}");
    // Each hand-off: the previous command's end → the next one's start.
    let mut gaps = Vec::new();
    for w in t.windows(2) {
        if w[0].0 == "end" && w[1].0 == "start" {
            gaps.push(Duration::from_nanos((w[1].2 - w[0].2) as u64));
        }
    }
    assert_eq!(gaps.len(), 3, "{t:?}");
    eprintln!("hand-off gaps (end → next start): {gaps:?}");
    gaps.sort();
    // Release is a few store round trips plus two process starts; generous
    // for a loaded 2-core machine.
    assert!(
        gaps[1] < Duration::from_millis(300),
        "hand-off gaps {gaps:?}"
    );
}

#[test]
fn status_shows_the_holders_title_and_the_line() {
    let _slot = timing_slot();
    let env = Env::sqlite();
    assert_eq!(code(env.lock("line", &[], "true")), 0);
    let mut holder = env
        .lock(
            "line",
            &["--title", "nightly backup"],
            "touch \"$D/held\"; sleep 3",
        )
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !env.path("held").exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "never held");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut waiters = Vec::new();
    for title in ["first in line", "second in line"] {
        waiters.push(
            env.lock("line", &["--title", title], "true")
                .spawn()
                .unwrap(),
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = |format: &str| {
        let out = putex()
            .args(["status", "line", "-o", format, "--store", &env.url])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&status("json")).unwrap();
    assert_eq!(v["state"], "active", "{v}");
    assert_eq!(v["title"], "nightly backup", "{v}");
    let line: Vec<&str> = v["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["title"].as_str().unwrap())
        .collect();
    assert_eq!(line, ["first in line", "second in line"], "{v}");
    assert!(v["waiting"][0]["pid"].as_u64().unwrap() > 0, "{v}");
    let table = status("table");
    assert!(table.contains("held for: nightly backup"), "{table}");
    assert!(table.contains("WAITING"), "{table}");
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(15)), Some(0));
    for mut w in waiters {
        assert_eq!(wait_exit(&mut w, Duration::from_secs(15)), Some(0));
    }
    let v: serde_json::Value = serde_json::from_str(&status("json")).unwrap();
    assert_eq!(v["waiting"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn a_dead_waiter_does_not_block_the_queue() {
    let _slot = timing_slot();
    let env = Env::sqlite();
    assert_eq!(code(env.lock("queue", &[], "true")), 0);
    let mut holder = env.lock("queue", &[], &timed("h", 1.0)).spawn().unwrap();
    env.wait_for_lines("times", 1, Duration::from_secs(10));
    let mut dead = env.lock("queue", &[], &timed("dead", 0.1)).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    dead.kill().unwrap();
    dead.wait().unwrap();
    let mut next = env.lock("queue", &[], &timed("next", 0.1)).spawn().unwrap();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), Some(0));
    let released = wall_ns();
    assert_eq!(wait_exit(&mut next, Duration::from_secs(10)), Some(0));
    let t = times(&env);
    assert!(t.iter().all(|(_, n, _)| n != "dead"), "{t:?}");
    let start = t
        .iter()
        .find(|(k, n, _)| k == "start" && n == "next")
        .unwrap()
        .2;
    // The dead waiter's ticket expires 3 R + 1 s after its last refresh.
    assert!(
        start < released + 2_500_000_000,
        "the next waiter waited {:?} after the release",
        Duration::from_nanos((start.saturating_sub(released)) as u64)
    );
}

// Issue 44, "never wait in silence", both sides, where a first use waits:
// NATS cannot prove a name vacant (every first use waits W + G'), an SQLite
// file made moments ago cannot yet (once it is older than W + G', a first
// use starts at once).
on_stores!(timing_slot; Env, a_first_use_says_what_it_waits_for =>
    a_first_use_says_on_stderr_what_it_waits_for_on_nats: nats,
    a_first_use_says_on_stderr_what_it_waits_for_on_sqlite: sqlite,
);

/// The first `putex lock` of a name says on stderr what it waits for, how
/// long and why (docs/safety.md, S4); the name's second use starts at once
/// and says nothing of the kind; a leased `putex id`'s first claim waits
/// and says so where its store still cannot prove the name vacant (NATS),
/// and starts at once, silent, on an SQLite file older than W + G'.
fn a_first_use_says_what_it_waits_for(env: &Env) {
    let nats = matches!(env.server, Backend::Nats(_));
    let why = if nats {
        "this store cannot prove that no holder's record was lost"
    } else {
        "the store was made moments ago"
    };
    let said = |stderr: &str| {
        stderr.contains(" taken; waiting ")
            && stderr.contains(" s before running the command: ")
            && stderr.contains(why)
            && stderr.contains("docs/safety.md, S4")
    };
    let started = Instant::now();
    let (status, stderr) = run(env.lock("nightly", &[], "true"));
    let first = started.elapsed();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        said(&stderr) && stderr.contains("\"nightly\" taken; waiting 1."),
        "the first use did not say what it waits for ({first:?}):\n{stderr}"
    );
    // W + G' at --ttl 1s: about 1.2 s.
    assert!(first >= Duration::from_secs(1), "{first:?}");

    let (status, stderr) = run(env.lock("nightly", &[], "true"));
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        !stderr.contains("waiting"),
        "the second use waited:\n{stderr}"
    );

    let started = Instant::now();
    let (status, stderr) = run(leased_id(env, "true"));
    let claimed = started.elapsed();
    assert!(status.success(), "{status:?}: {stderr}");
    if nats {
        assert!(said(&stderr), "{stderr}");
    } else {
        assert!(
            !stderr.contains("waiting") && claimed < Duration::from_secs(1),
            "a fresh name on a file older than W + G' waited ({claimed:?}):\n{stderr}"
        );
    }
}

/// `putex id claim POOL --lease --ttl 1s -- sh -c SCRIPT`.
fn leased_id(env: &Env, script: &str) -> Command {
    let claim = [
        "id", "claim", "workers", "--range", "1-2", "--store", &env.url, "--lease", "--ttl", "1s",
    ];
    putex_sh(env.dir.path(), &claim, script)
}

#[test]
fn leased_ids_are_distinct_and_die_with_their_holder() {
    let _slot = timing_slot();
    let env = Env::sqlite();
    // Two concurrent leases: two distinct ids, each only while CMD runs.
    let script = r#"echo "$PUTEX_ID" >> "$D/ids"; sleep 0.5"#;
    let a = leased_id(&env, script).spawn().unwrap();
    let b = leased_id(&env, script).spawn().unwrap();
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", out.status);
    }
    let mut ids: Vec<String> = env.read("ids").lines().map(str::to_owned).collect();
    ids.sort();
    assert_eq!(ids, ["1", "2"]);
    // Both free again: a persistent claim takes one of them at once.
    let out = putex()
        .args([
            "id", "claim", "workers", "--name", "fixed", "--store", &env.url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fixed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // The other id, held by a lease whose putex is killed: its CMD and
    // grandchild are gone before the next lease of that id starts.
    let mut first = leased_id(
        &env,
        r#"echo "$PUTEX_ID" > "$D/held"; echo $$ > "$D/pids"; sleep 1000 & echo $! >> "$D/pids"; wait"#,
    )
    .spawn()
    .unwrap();
    env.wait_for_lines("pids", 2, Duration::from_secs(15));
    assert_ne!(env.read("held").trim(), fixed);
    first.kill().unwrap();
    first.wait().unwrap();
    let started = Instant::now();
    let (status, stderr) = run(leased_id(
        &env,
        &format!("{CHECK}\necho \"$PUTEX_ID\" > \"$D/second_id\""),
    ));
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(
        env.read("check"),
        "",
        "the killed lease's command still ran"
    );
    assert_eq!(env.read("second_id"), env.read("held"));
    // Not handed out again before W + G' (about 1.2 s with --ttl 1s).
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// Issue 14 item 1 for `putex lock`: without a cgroup, a keeper SIGKILLed
/// while CMD runs leaves CMD and its child orphaned. putex lock stops them
/// itself (from the keeper's last tree snapshot) before it gives the lock
/// back, and exits 76 (lost); the next holder finds nothing of the first
/// tree running. On the old code nothing stopped them.
#[test]
fn r21_a_killed_keeper_without_cgroups_still_stops_the_command() {
    let env = Env::nats();
    let _slot = timing_slot();
    let mut first = env
        .lock("fault", &["--no-cgroup"], HOLD)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    env.wait_for_lines("pids", 2, Duration::from_secs(15));
    // Let the keeper report its tree (it looks at most every 500 ms).
    std::thread::sleep(Duration::from_millis(1200));
    let keepers =
        crate::common::agent::pids_matching(&format!("--socket {}", env.path("keepers").display()));
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    kill(Pid::from_raw(keepers[0]), nix::sys::signal::Signal::SIGKILL).unwrap();
    let code = wait_exit(&mut first, Duration::from_secs(10));
    let mut stderr = String::new();
    if let Some(mut e) = first.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    for p in env.read("pids").split_whitespace() {
        let pid: i32 = p.parse().unwrap();
        assert!(
            !pid_alive(pid),
            "{pid} of the first tree survives\n{stderr}"
        );
    }
    assert_eq!(code, Some(76), "{stderr}");
    second_holder_finds_the_first_tree_gone(&env, &env.url);
}

/// A waiter of node `n1` in line for `name` as `instance`, refreshing its
/// ticket every R = 100 ms.
fn queue_waiter(name: &str, instance: &str, store_timeout: Duration, patience: Duration) -> Waiter {
    Waiter {
        name: name.parse().unwrap(),
        node: "n1".parse().unwrap(),
        instance: instance.parse().unwrap(),
        renew: Duration::from_millis(100),
        store_timeout,
        title: None,
        asked: None,
        patience,
    }
}

/// Issue 14 item 14: a slow moment is not a failure. A queue ticket whose
/// create keeps timing out (a busy store, a leader election: eight
/// unknown outcomes in a row) is tried again, with back-off, for as long
/// as the waiter is willing to wait (`patience`, from `--wait`), instead
/// of failing the command after a few attempts (exit 69 on the old code,
/// which gave up after 5).
#[test]
fn r22_a_busy_store_does_not_fail_a_waiter_that_still_has_time() {
    use putex::locks::queue::Ticket;
    use putex::store::memory::Fault;
    use putex::store::{AnyStore, MemoryStore};
    runtime().block_on(async {
        let mem = MemoryStore::new();
        let key = putex::store::keys::ticket(&"busy".parse().unwrap(), &"w1".parse().unwrap());
        for _ in 0..8 {
            mem.inject_on(&key, Fault::Stall);
        }
        let waiter = |patience| queue_waiter("busy", "w1", Duration::from_millis(20), patience);
        let store = AnyStore::from(mem.clone());
        let started = Instant::now();
        let ticket = Ticket::join(store.clone(), waiter(Duration::from_secs(30)))
            .await
            .expect("joined once the store answered");
        assert!(ticket.arrival() > 0, "its place in line is known");
        assert!(*ticket.turn().borrow() || ticket.turn().changed().await.is_ok());
        eprintln!("joined after {:?} of unknown outcomes", started.elapsed());
        ticket.leave().await;
        // The other side: a waiter whose patience runs out is told so.
        let key2 = putex::store::keys::ticket(&"busy".parse().unwrap(), &"w2".parse().unwrap());
        for _ in 0..100 {
            mem.inject_on(&key2, Fault::Stall);
        }
        let w2 = queue_waiter(
            "busy",
            "w2",
            Duration::from_millis(20),
            Duration::from_millis(500),
        );
        let e = Ticket::join(store, w2).await.err().expect("gives up");
        assert!(e.is_unknown(), "{e}");
    });
}

/// Issue 18: a long line costs the store little. The waiters of one name
/// in one process share one view of the line; the first `admit + NEAR`
/// refresh their tickets every R and say so, the rest every
/// `IDLE_REFRESH` with the place from which they promise R again
/// (`near_at`). Both sides: the turns still pass in order as holders
/// leave, and a ticket that made that promise and then went silent (its
/// waiter died far back in line) is skipped, and swept, within expiry(R)
/// of coming near the front — not after expiry(IDLE_REFRESH), 31 s.
#[test]
fn a_long_line_refreshes_only_its_front_and_skips_a_dead_waiter_far_back() {
    use putex::locks::queue::{expiry, Ticket, TicketRecord, IDLE_REFRESH, NEAR};
    use putex::store::{AnyStore, MemoryStore, ReadMode, Store};
    runtime().block_on(async {
        let store = AnyStore::from(MemoryStore::new());
        let renew = Duration::from_millis(100);
        let t = Duration::from_secs(1);
        let name: putex::store::Name = "line".parse().unwrap();
        let waiter = |i: usize| queue_waiter("line", &format!("w{i:02}"), t, t);
        let mut line = Vec::new();
        for i in 0..3 {
            line.push(Ticket::join(store.clone(), waiter(i)).await.unwrap());
        }
        // A waiter of another process that died far back in line: its
        // ticket says "every 10 s until I am 4th".
        let dead_key = putex::store::keys::ticket(&name, &"dead".parse().unwrap());
        let mut dead = TicketRecord {
            v: 1,
            node: "n2".into(),
            instance: "dead".into(),
            arrival: 0,
            renew_ms: IDLE_REFRESH.as_millis() as u64,
            pid: 1,
            title: None,
            wait_ms: None,
            lifetime_ms: None,
            near_at: Some(1 + NEAR as u64),
            near_renew_ms: Some(renew.as_millis() as u64),
        };
        let token = store.create(&dead_key, b"{}", t).await.unwrap();
        dead.arrival = token.revision;
        store
            .update(&dead_key, &serde_json::to_vec(&dead).unwrap(), token, t)
            .await
            .unwrap();
        for i in 3..12 {
            line.push(Ticket::join(store.clone(), waiter(i)).await.unwrap());
        }
        let turns = |line: &[Ticket]| line.iter().map(|t| *t.turn().borrow()).collect::<Vec<_>>();
        let record = |i: usize| {
            let store = store.clone();
            let key = putex::store::keys::ticket(&name, &format!("w{i:02}").parse().unwrap());
            async move {
                let e = store
                    .get(&key, ReadMode::Leader, t)
                    .await
                    .unwrap()
                    .expect("ticket");
                serde_json::from_slice::<TicketRecord>(&e.value).unwrap()
            }
        };
        // The dead ticket is 4th: skipped within expiry(R) (1.3 s) and
        // swept by the first waiter (every second).
        let started = Instant::now();
        while store
            .get(&dead_key, ReadMode::Leader, t)
            .await
            .unwrap()
            .is_some()
        {
            assert!(
                started.elapsed() < expiry(renew) + Duration::from_secs(3),
                "the dead ticket far back is still there after {:?}",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("dead ticket swept after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The front (w00 holds, w01..w03 next) refreshes every R; the rest
        // every 10 s, promising R from the 4th place.
        for i in 0..12 {
            let r = record(i).await;
            if i < 1 + NEAR {
                assert_eq!((r.renew_ms, r.near_at), (100, None), "w{i:02}: {r:?}");
            } else {
                assert_eq!(
                    r.renew_ms,
                    IDLE_REFRESH.as_millis() as u64,
                    "w{i:02}: {r:?}"
                );
                assert_eq!(r.near_at, Some(1 + NEAR as u64), "w{i:02}: {r:?}");
            }
        }
        let mut expect = vec![false; 12];
        expect[0] = true;
        assert_eq!(turns(&line), expect);
        // The turns pass in order as holders leave; a waiter that comes
        // near refreshes every R again at once.
        for i in 0..8 {
            line.remove(0).leave().await;
            let next = line[0].turn();
            let started = Instant::now();
            while !*next.borrow() {
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "w{:02} got no turn",
                    i + 1
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                turns(&line)[1..].iter().all(|t| !t),
                "only one turn at a time"
            );
            let near = i + 1 + NEAR;
            if near < 12 {
                let started = Instant::now();
                while record(near).await.near_at.is_some() {
                    assert!(
                        started.elapsed() < Duration::from_secs(1),
                        "w{near:02} stays slow"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        for t in line {
            t.leave().await;
        }
    });
}

/// Issue 18, found in review: a waiter coming near the front whose "every
/// R again" refresh fails (a busy store) tries again at R, not after the
/// idle 10 s — else every view would take it for dead 3R + 1 s later and
/// let those behind it go first. The other side: a waiter still far back
/// keeps refreshing slowly.
#[test]
fn a_waiter_whose_coming_near_refresh_fails_tries_again_at_r() {
    use putex::locks::queue::{Ticket, TicketRecord, NEAR};
    use putex::store::memory::Fault;
    use putex::store::{AnyStore, MemoryStore, ReadMode, Store};
    runtime().block_on(async {
        let mem = MemoryStore::new();
        let store = AnyStore::from(mem.clone());
        let t = Duration::from_secs(1);
        let name: putex::store::Name = "busy-line".parse().unwrap();
        let key = |i: usize| putex::store::keys::ticket(&name, &format!("w{i}").parse().unwrap());
        let mut line = Vec::new();
        for i in 0..(NEAR + 3) {
            let waiter = queue_waiter("busy-line", &format!("w{i}"), Duration::from_millis(200), t);
            line.push(Ticket::join(store.clone(), waiter).await.unwrap());
        }
        let near_at = |i: usize| {
            let store = store.clone();
            let key = key(i);
            async move {
                let e = store
                    .get(&key, ReadMode::Leader, t)
                    .await
                    .unwrap()
                    .expect("ticket");
                TicketRecord::from_entry(&e).unwrap().near_at
            }
        };
        // w4 and w5 are far back (1 holder + NEAR): they go slow.
        let started = Instant::now();
        while near_at(NEAR + 1).await.is_none() || near_at(NEAR + 2).await.is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "the far waiters stay fast"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // w4's next write stalls; then it comes near.
        mem.inject_on(&key(NEAR + 1), Fault::Stall);
        line.remove(0).leave().await;
        let started = Instant::now();
        while near_at(NEAR + 1).await.is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "w{} did not write 'every R' again within 2 s of a failed refresh",
                NEAR + 1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "near again after {:?} (one write stalled 200 ms)",
            started.elapsed()
        );
        assert!(
            near_at(NEAR + 2).await.is_some(),
            "w{} is still far back",
            NEAR + 2
        );
        for t in line {
            t.leave().await;
        }
    });
}

/// A program other than putex runs a critical section as a library
/// (`putex::locks::section::run`): the keeper is the putex binary, given as
/// `keeper_exe`, since this test binary cannot be one. CMD runs under the
/// lock with its fencing token, and the lock is released.
#[test]
fn a_program_runs_a_critical_section_with_the_putex_binary_as_its_keeper() {
    use putex::core::TimingConfig;
    use putex::locks::section::{self, Outcome, SectionOptions, Wait};
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let outcome = runtime().block_on(async {
        let store = AnyStore::from(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
        let timing = TimingConfig {
            renew: Duration::from_millis(100),
            failures: 3,
            confirm: 1,
            ..TimingConfig::default()
        }
        .validate()
        .unwrap();
        let opts = SectionOptions {
            name: "library".parse().unwrap(),
            node: "n1".parse().unwrap(),
            store_id: "sqlite-library-test".into(),
            timing,
            limit: 1,
            wait: Wait::For(Duration::from_secs(10)),
            once: None,
            once_mode: Default::default(),
            max_duration: None,
            title: None,
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("echo $PUTEX_TOKEN > {}", marker.display()),
            ],
            env: Vec::new(),
            keeper_dir: dir.path().join("keepers"),
            cgroup: false,
            queue: true,
            slots: None,
            metrics: None,
            keeper_exe: Some(env!("CARGO_BIN_EXE_putex").into()),
            exits_after: false,
        };
        let (_signals, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::time::timeout(Duration::from_secs(20), section::run(store, opts, rx))
            .await
            .expect("the section ends")
            .expect("the section runs")
    });
    let Outcome::Finished {
        exit,
        token,
        released,
    } = outcome
    else {
        panic!("not finished: {outcome:?}");
    };
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert!(released, "the lock was not released");
    let seen = std::fs::read_to_string(&marker).expect("CMD ran");
    assert_eq!(seen.trim(), token.to_string());
}

/// The keeper starts while the store opens; when the store cannot be
/// opened, `putex lock` exits 69 (unavailable) without running CMD, and
/// the keeper it began is gone within moments.
#[test]
fn a_store_that_cannot_be_opened_leaves_no_keeper_behind() {
    let env = Env::sqlite();
    // A "server" that accepts and hangs up after 200 ms, without a word:
    // long enough for the keeper to have started.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            std::thread::sleep(Duration::from_millis(200));
            drop(conn);
        }
    });
    let started = Instant::now();
    let (status, stderr) = run(env.lock_via(&url, "unopened", &[], "touch \"$D/ran\""));
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(!env.path("ran").exists(), "CMD must not run");
    let keepers = env.path("keepers");
    let keepers = keepers.to_string_lossy();
    let left = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains(&*keepers))
                    .unwrap_or(false)
            })
            .count()
    };
    while left() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a keeper outlived the failed start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Guarded writes from CMD (`putex kv`, docs/locks.md "Guarded writes").

/// CMD writes, reads and deletes keys through its `putex lock`; the values
/// are in the store afterwards for anyone to read; outside a section a
/// write is refused with its reason, and a bad key by name.
fn kv_from_cmd(env: &Env) {
    let p = crate::common::agent::putex_bin().display().to_string();
    // Eight `putex kv` processes in one section: a lease of 3 s, so that a
    // loaded machine does not take the lock away from under them (with 1 s
    // it did once beside a busy loop: "the lock is no longer held by this
    // tenure").
    let mut c = env.lock_ttl(
        &env.url,
        "kv",
        "3s",
        &[],
        r#"set -e
"$P" kv put greeting hello
"$P" kv get greeting > "$D/got"
echo "second value" | "$P" kv put note -
"$P" kv put gone x
"$P" kv delete gone
"$P" kv list > "$D/listed"
if "$P" kv get gone; then echo present >> "$D/got"; else echo "absent $?" >> "$D/got"; fi
"$P" kv put "bad key" x 2> "$D/bad" || echo "bad $?" >> "$D/got""#,
    );
    c.env("P", &p);
    let (status, stderr) = run(c);
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(env.read("got"), "hello\nabsent 1\nbad 64\n");
    assert_eq!(env.read("listed"), "greeting\nnote\n");
    assert!(
        env.read("bad").contains("kv.bad key"),
        "{}",
        env.read("bad")
    );
    // Outside the section: readable with --store, not writable.
    let get = |key: &str| run_out(putex().args(["kv", "get", key, "--store", &env.url]));
    assert_eq!(get("greeting"), (0, "hello\n".to_owned()));
    assert_eq!(get("note"), (0, "second value\n\n".to_owned()));
    assert_eq!(get("gone").0, 1);
    assert_eq!(
        run_out(putex().args(["kv", "list", "gree", "--store", &env.url])),
        (0, "greeting\n".to_owned())
    );
    let (status, stderr) = run(putex().args(["kv", "put", "greeting", "outside"]));
    assert_eq!(status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("putex lock NAME -- CMD"), "{stderr}");
    assert_eq!(get("greeting"), (0, "hello\n".to_owned()));
}

/// Exit code and stdout of `c`.
fn run_out(mut c: impl BorrowMut<Command>) -> (i32, String) {
    let out = c.borrow_mut().output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

on_stores!(Env, kv_from_cmd =>
    kv_from_cmd_on_sqlite: sqlite,
    kv_from_cmd_on_nats: nats,
    kv_from_cmd_on_etcd: etcd,
);
