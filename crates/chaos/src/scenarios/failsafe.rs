//! Failsafe (rules F1–F6, `docs/safety.md`): three agents with
//! `--failsafe`, each asked by the others through a peer proxy of its own
//! (its `--failsafe-advertise`), and a store that goes away — for everyone,
//! for the holder only, for the holder and the path to one member — or a
//! member that restarts while it is away.
//!
//! Each scenario checks both sides: the holder's service runs on while
//! every member grants, and it stops (and another takes over) when one
//! cannot.

use super::*;

/// The members' shared key (a file of mode 600, 32 bytes or more).
const KEY: &str = "chaos: the members' failsafe key, 32 bytes or more";

/// One agent's failsafe endpoint: its `--http` port and the proxy the
/// other members reach it through.
pub(super) struct Peer {
    node: String,
    http: u16,
    proxy: Proxy,
}

impl World<'_> {
    /// Starts n1..n3 with `--failsafe` and `--failsafe-max cap`, each with
    /// `--http` on a port of its own behind a peer proxy (the address it
    /// advertises); then waits for the first activation. The lock is used
    /// once before (`putex lock`), as a lock in service has been: a failsafe
    /// lock's first use on NATS waits W over T + the cap (the store cannot
    /// prove the name unused, `docs/operations.md`), seconds of every run
    /// that measure nothing here.
    fn failsafe_agents(&mut self, cap: Duration) -> Result<(), String> {
        putex_testkit::agent::use_lock_once(
            &self.ctx.putex,
            &self.direct_url(),
            &self.lock,
            "n1",
            // Short, as the agents' `k-n1`: a keeper socket's path must
            // fit in 108 bytes, and CI's scratch directory is deep.
            &self.dir.join("k0"),
        )?;
        use std::os::unix::fs::PermissionsExt as _;
        let key = self.dir.join("failsafe.key");
        std::fs::write(&key, KEY)
            .and_then(|()| std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)))
            .map_err(|e| format!("{}: {e}", key.display()))?;
        let max = format!("{}ms", cap.as_millis());
        for n in AGENTS {
            let http = cluster::free_port();
            let target = std::net::SocketAddr::from(([127, 0, 0, 1], http));
            let proxy = self
                .ctx
                .rt
                .block_on(Proxy::start(target))
                .map_err(|e| format!("peer proxy: {e}"))?;
            let advertise = proxy.addr().to_string();
            self.peers.push(Peer {
                node: n.to_owned(),
                http,
                proxy,
            });
            self.add_agent(
                n,
                Vec::new(),
                &[
                    "--http",
                    &format!("127.0.0.1:{http}"),
                    "--failsafe",
                    "--failsafe-key-file",
                    &key.display().to_string(),
                    "--failsafe-max",
                    &max,
                    "--failsafe-advertise",
                    &advertise,
                ],
            )?;
        }
        let within = cap + self.bound() * 2 + Duration::from_secs(10);
        match self.h.wait_start(1, within) {
            Some(_) => Ok(()),
            None => Err(format!("no first activation within {within:?}")),
        }
    }

    /// Waits for a steady state in which the holder's record carries the
    /// set: every member record names its failsafe endpoint, and a few
    /// renewals have passed since (the shell reports members as their
    /// records change). Returns the holder.
    fn steady_with_set(&mut self) -> Result<String, String> {
        let active = self.steady()?;
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new(&self.ctx.putex)
                .args([
                    "status",
                    &self.lock,
                    "--store",
                    &self.direct_url(),
                    "-o",
                    "json",
                ])
                .output()
                .map_err(|e| format!("putex status: {e}"))?;
            let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let published = st["members"].as_array().is_some_and(|ms| {
                ms.len() == AGENTS.len() && ms.iter().all(|m| m["failsafe"]["url"].is_string())
            });
            if published {
                break;
            }
            if Instant::now() > until {
                return Err(format!(
                    "the members' failsafe endpoints are not in status: {st}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(self.profile.r() * 5);
        Ok(active)
    }

    /// Sets the mode of the proxy other members ask `node` through.
    fn set_peer_mode(&self, node: &str, mode: Mode) {
        for p in self.peers.iter().filter(|p| p.node == node) {
            p.proxy.set(mode);
        }
    }

    /// `node`'s `/health`, parsed.
    fn health(&self, node: &str) -> Option<serde_json::Value> {
        use std::io::{Read as _, Write as _};
        let port = self.peers.iter().find(|p| p.node == node)?.http;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
    }

    /// Freezes (SIGSTOP) every store server, or thaws them.
    fn store_frozen(&mut self, frozen: bool) {
        match &mut self.store {
            Store::Single(s) if frozen => s.pause(),
            Store::Single(s) => s.resume(),
            Store::Cluster(c) => {
                for s in &c.servers {
                    if frozen {
                        s.pause();
                    } else {
                        s.resume();
                    }
                }
            }
            Store::Etcd(c) => {
                for i in 0..c.members().len() {
                    if frozen {
                        c.pause(i);
                    } else {
                        c.resume(i);
                    }
                }
            }
        }
    }

    /// Lets every peer link pass again (the end of a run).
    fn heal_peers(&self) {
        for p in &self.peers {
            p.proxy.set(Mode::Pass);
        }
    }

    /// While the store is down: the holder's `/health` says its licence
    /// runs on grants; an error for the run when it does not.
    fn expect_on_grants(&mut self, holder: &str) {
        let h = self.health(holder);
        let granted = h
            .as_ref()
            .is_some_and(|h| h["failsafe"]["granted"] == serde_json::Value::Bool(true));
        if !granted {
            self.out.errors.push(format!(
                "{holder}'s /health does not say it runs on grants: {}",
                h.map_or_else(|| "no answer".into(), |h| h.to_string())
            ));
        }
    }

    /// Services stopped or started in `(from, to]` are errors: `what` must
    /// have changed nothing.
    fn expect_nothing_moved(&mut self, from: u64, to: u64, what: &str) {
        let events = self.h.events();
        let (starts, stops) = (
            check::starts_between(&events, from, to),
            check::stops_between(&events, from, to),
        );
        if starts + stops > 0 {
            self.out.errors.push(format!(
                "{what}: {stops} service(s) stopped and {starts} started, where every member granted"
            ));
        }
    }
}

/// How long the whole store is down: 10 s quick, 60 s (the issue's) in a
/// full run.
fn outage(ctx: &Ctx) -> Duration {
    Duration::from_secs(if ctx.quick { 10 } else { 60 })
}

/// The whole store frozen (SIGSTOP) for [`outage`] under three failsafe
/// agents: the holder's service runs throughout on its members' grants,
/// nobody else starts; once the store is back the holder renews through
/// it again. The cap outlasts the outage.
fn store_down(ctx: &Ctx, kind: Kind, profile: Profile, name: &str) -> Result<RunOut, String> {
    let mut w = World::new(ctx, kind, profile, name)?;
    w.failsafe_agents(outage(ctx) + Duration::from_secs(3))?;
    w.out.expected_starts = 1;
    let holder = w.steady_with_set()?;
    w.fault(format!("store frozen {}s", outage(ctx).as_secs()));
    w.store_frozen(true);
    std::thread::sleep(Duration::from_secs(2).min(outage(ctx) / 2));
    w.expect_on_grants(&holder);
    std::thread::sleep(outage(ctx).saturating_sub(Duration::from_secs(2)));
    w.store_frozen(false);
    w.h.fault("store thawed");
    // Back on the store: the failsafe ends, the same holder renews.
    std::thread::sleep(Duration::from_secs(2));
    if w.health(&holder)
        .is_some_and(|h| h.get("failsafe").is_some())
    {
        w.out.errors.push(format!(
            "{holder} still runs on grants 2 s after the store came back"
        ));
    }
    Ok(w.finish())
}

/// The holder cut off from the store (proxy blackhole), its members not:
/// for less than the cap nothing moves (the members grant, and every grant
/// holds their takeover back); for longer, the holder stops when the cap
/// ends and a member takes over within B of that.
fn standbys_only(ctx: &Ctx, kind: Kind, p: Profile, name: &str) -> Result<RunOut, String> {
    let cap = Duration::from_secs(3);
    let mut w = World::new(ctx, kind, p.clone(), name)?;
    w.failsafe_agents(cap)?;
    w.out.expected_starts = 1;
    let holder = w.steady_with_set()?;
    let at = w.fault(format!(
        "blackhole {holder} {}ms (< the cap)",
        (cap / 2).as_millis()
    ));
    w.set_mode(&holder, Mode::Blackhole);
    std::thread::sleep(cap / 2);
    w.expect_on_grants(&holder);
    w.set_mode(&holder, Mode::Pass);
    w.h.fault(format!("blackhole {holder} ends"));
    // A takeover the grants did not hold back would come within B.
    std::thread::sleep(w.bound() * 2);
    let end = w.h.now();
    w.expect_nothing_moved(
        at,
        end,
        "the holder cut off from the store for half the cap",
    );

    // Past the cap: the holder's licence ends at its last landed renewal +
    // the cap, the members' W at their last grant; then one takes over.
    let holder = w.steady_with_set()?;
    let at = w.fault(format!("blackhole {holder} cap + 3T"));
    w.set_mode(&holder, Mode::Blackhole);
    std::thread::sleep(cap);
    let cap_end = w.h.fault("the cap ends".to_owned());
    w.out.expected_starts += 1;
    w.expect_failover(cap_end, p.r());
    std::thread::sleep(p.t() * 3);
    w.set_mode(&holder, Mode::Pass);
    w.h.fault(format!("blackhole {holder} ends"));
    let early = check::stops_between(
        &w.h.events(),
        at,
        cap_end.saturating_sub(p.r().as_nanos() as u64),
    );
    if early > 0 {
        w.out.errors.push(format!(
            "{holder} stopped before the cap ended, though every member granted"
        ));
    }
    if let Err(e) = w.steady() {
        w.out.errors.push(e);
    }
    Ok(w.finish())
}

/// The holder cut off from the store and from one member (its peer
/// proxy): it cannot tell that member from one about to take over, so it
/// stops at T, and a member takes over within B — the same as without
/// failsafe.
fn cut_off(ctx: &Ctx, rng: &mut Rng, kind: Kind, p: Profile, name: &str) -> Result<RunOut, String> {
    let mut w = World::new(ctx, kind, p.clone(), name)?;
    w.failsafe_agents(Duration::from_secs(3))?;
    w.out.expected_starts = 1;
    for _ in 0..faults_per_run(ctx, 2, 4) {
        let holder = match w.steady_with_set() {
            Ok(h) => h,
            Err(e) => {
                w.out.errors.push(e);
                break;
            }
        };
        let others: Vec<&str> = AGENTS.iter().copied().filter(|n| *n != holder).collect();
        let member = others[rng.below(others.len() as u64) as usize];
        let at = w.fault(format!("blackhole {holder}: the store and {member} 3T"));
        w.set_mode(&holder, Mode::Blackhole);
        w.set_peer_mode(member, Mode::Blackhole);
        // The cut-off member's W runs from the last landed renewal; the
        // other member's from its last grant, about T later. When the
        // other outranks it (O3: equal priorities rank by node name), the
        // cut-off member defers D = 2 R to a candidate that cannot act yet.
        w.expect_failover(at, p.r() * 3);
        std::thread::sleep(p.t() * 3);
        w.set_mode(&holder, Mode::Pass);
        w.set_peer_mode(member, Mode::Pass);
        w.h.fault(format!("blackhole {holder} ends"));
    }
    if let Err(e) = w.steady() {
        w.out.errors.push(e);
    }
    w.heal_peers();
    Ok(w.finish())
}

/// A member killed (kill -9) and started again while the whole store is
/// down: it knows no record, so it grants nothing, and the holder stops
/// at T after its member went (F3: one missing grant is no extension);
/// nobody starts while the store is down; once it is back, one member
/// takes over, the restarted one only after W from its start (F4).
fn member_restart(
    ctx: &Ctx,
    rng: &mut Rng,
    kind: Kind,
    p: Profile,
    name: &str,
) -> Result<RunOut, String> {
    let mut w = World::new(ctx, kind, p.clone(), name)?;
    w.failsafe_agents(Duration::from_secs(10))?;
    w.out.expected_starts = 1;
    let holder = w.steady_with_set()?;
    let others: Vec<&str> = AGENTS.iter().copied().filter(|n| *n != holder).collect();
    let member = others[rng.below(others.len() as u64) as usize].to_owned();
    w.fault("store frozen".into());
    w.store_frozen(true);
    std::thread::sleep(Duration::from_secs(1));
    w.expect_on_grants(&holder);
    let killed = w.fault(format!(
        "kill -9 {member}, started again (the store still down)"
    ));
    if let Some(a) = w.agent(&member) {
        a.crash();
    }
    // Not `start_agent`: it waits for the store, which is down.
    w.restart_with(&member, |spec| {
        Agent::spawn(spec).map_err(|e| format!("cannot start it again: {e}"))
    })?;
    let stopped = {
        let until = Instant::now() + p.t() * 3;
        loop {
            if w.services_of(&holder).is_empty() || Instant::now() > until {
                break !w.services_of(&holder).is_empty();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    if stopped {
        w.out.errors.push(format!(
            "{holder} still ran {:?} after {member} went, with the store down",
            p.t() * 3
        ));
    }
    std::thread::sleep(Duration::from_secs(3));
    w.store_frozen(false);
    let thawed = w.h.fault("store thawed");
    if check::starts_between(&w.h.events(), killed, thawed) > 0 {
        w.out
            .errors
            .push("a service started while the store was down".into());
    }
    w.out.expected_starts += 1;
    // The takeover waits W from the restart or the last grant, both
    // before the thaw; the thaw itself costs a reconnect.
    w.expect_failover(thawed, Duration::from_secs(1));
    if let Err(e) = w.steady() {
        w.out.errors.push(e);
    }
    Ok(w.finish())
}

/// The failsafe scenarios, in table order.
pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "failsafe-store-down",
            fault_no: "F3",
            about: "failsafe on: nats-server SIGSTOP for 10 s (quick) or 60 s; the holder runs on its members' grants",
            quick_runs: 1,
            full_runs: 1,
            zero_transitions: true,
            run: |ctx, _| store_down(ctx, Kind::Single, FAST3, "failsafe-store-down"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-store-down-etcd3",
            fault_no: "F3",
            about: "failsafe on: every member of a 3-member etcd SIGSTOP for 10 s (quick) or 60 s; the holder runs on its members' grants",
            quick_runs: 1,
            full_runs: 1,
            zero_transitions: true,
            run: |ctx, _| store_down(ctx, Kind::Etcd3, FAST3_R200, "failsafe-store-down-etcd3"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-standbys-only",
            fault_no: "F1, F3",
            about: "failsafe on, cap 3 s: the holder cut off from the store for half the cap (nothing moves), then past the cap (it stops, one takes over)",
            quick_runs: 1,
            full_runs: 2,
            run: |ctx, _| standbys_only(ctx, Kind::Single, FAST3, "failsafe-standbys-only"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-cut-off",
            fault_no: "F3",
            about: "failsafe on: the holder cut off from the store and from one member for 3T",
            quick_runs: 1,
            full_runs: 2,
            run: |ctx, rng| cut_off(ctx, rng, Kind::Single, FAST3, "failsafe-cut-off"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-member-restart",
            fault_no: "F3, F4",
            about: "failsafe on: the store frozen, a member killed and started again; the store back 3 s later",
            quick_runs: 1,
            full_runs: 2,
            run: |ctx, rng| member_restart(ctx, rng, Kind::Single, FAST3, "failsafe-member-restart"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-standbys-only-etcd3",
            fault_no: "F1, F3",
            about: "failsafe-standbys-only on a 3-member etcd (R = 200 ms); full mode only",
            quick_runs: 0,
            full_runs: 1,
            run: |ctx, _| {
                standbys_only(ctx, Kind::Etcd3, FAST3_R200, "failsafe-standbys-only-etcd3")
            },
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-cut-off-etcd3",
            fault_no: "F3",
            about: "failsafe-cut-off on a 3-member etcd (R = 200 ms); full mode only",
            quick_runs: 0,
            full_runs: 1,
            run: |ctx, rng| cut_off(ctx, rng, Kind::Etcd3, FAST3_R200, "failsafe-cut-off-etcd3"),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "failsafe-member-restart-etcd3",
            fault_no: "F3, F4",
            about: "failsafe-member-restart on a 3-member etcd, every member frozen (R = 200 ms); full mode only",
            quick_runs: 0,
            full_runs: 1,
            run: |ctx, rng| {
                member_restart(ctx, rng, Kind::Etcd3, FAST3_R200, "failsafe-member-restart-etcd3")
            },
            ..Scenario::DEFAULTS
        },
    ]
}
