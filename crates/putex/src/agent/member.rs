//! Member records (`member.<lock>.<node>`): what each agent tells the
//! others and `putex status` about itself, written every 3 R and at each
//! transition.

use std::collections::HashMap;
use std::time::Duration;

use crate::driver;
use futures::StreamExt;
use putex_core::{Blocker, Candidate, Input, Role, StoreGap, StoreTime, Token};
use tracing::Instrument;

use super::state::AgentHost;
use crate::report::members::MemberRecord;
use crate::store::{keys, AnyStore, Name, Store};
use crate::supervision::hooks::HookKind;
/// Writes the member record every 3 R and whenever something changed.
pub(super) async fn member_writer(host: AgentHost, store: AnyStore, key: String) {
    let every = host.inner.settings.timing.renew() * 3;
    let timeout = host.inner.settings.timing.store_timeout();
    loop {
        let rec = host.member_record();
        // The last record (`exited`) is run_agent's to write, or not to
        // write: a refused duplicate leaves the holder's record alone.
        if host.set(|st| st.role == Some(Role::Exited)) {
            return;
        }
        let bytes = serde_json::to_vec(&rec).expect("member record serialises");
        if let Err(e) = store.put(&key, &bytes, timeout).await {
            tracing::debug!(error = %e, "member record not written");
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = host.inner.member_dirty.notified() => {}
        }
    }
}

/// Reads the other members' records (a watch on `member.<lock>.`) and
/// passes the fresh ones to the core every 3 R (O3): whom to defer to,
/// whom a switchover may go to, how far behind this node is. Also keeps
/// their `--advertise` addresses and record ages (`PUTEX_MEMBERS`) for the
/// hooks, and runs `--follow` when the active holder changes.
///
/// Fresh: written within 10 of its writer's R (plus two steps of a store
/// clock that reads in steps), by the newest record's store time (no host's
/// clock is compared with another's). A member that just
/// died may look fresh for a while; the core's deferral to it costs at
/// most D.
pub(super) async fn member_feed(
    host: AgentHost,
    store: AnyStore,
    lock: Name,
    inject: driver::InputSender,
) {
    let filter = keys::members_of(&lock);
    let every = host.inner.settings.timing.renew() * 3;
    let timeout = host.feed_timeout();
    let own = host.inner.node.clone();
    let mut members: HashMap<String, (MemberRecord, StoreTime)> = HashMap::new();
    let mut from: Option<u64> = None;
    let mut holder: Option<String> = None;
    loop {
        match store.watch(&filter, from, timeout).await {
            Ok(mut stream) => loop {
                tokio::select! {
                    event = stream.next() => {
                        let Some(Ok(event)) = event else { break };
                        from = Some(event.revision + 1);
                        match event.entry.as_ref().map(|e| serde_json::from_slice::<MemberRecord>(&e.value)) {
                            Some(Ok(rec)) => {
                                members.insert(event.key.clone(), (rec, event.time));
                            }
                            // Deleted, or written by someone else: not a member.
                            _ => {
                                members.remove(&event.key);
                            }
                        }
                    }
                    () = tokio::time::sleep(every) => {}
                }
                let fresh = fresh_members(&members, store.clock_step());
                let mut candidates: Vec<Candidate> = fresh
                    .iter()
                    .filter(|m| m.node != own.as_str())
                    .map(|m| Candidate {
                        node: m.node.clone(),
                        priority: m.priority,
                        position: m.position,
                        ready: m.role == "standby" && m.ready.unwrap_or(m.healthy == Some(true)),
                        machine: m.machine.clone(),
                    })
                    .collect();
                // The last holder's position counts for --max-lag even once
                // its record is silent (it crashed): a replica behind it
                // lacks data it acknowledged. Never a candidate itself.
                if let Some(last) = last_holder(&members) {
                    if last.node != own.as_str() && !fresh.iter().any(|m| m.node == last.node) {
                        candidates.push(Candidate {
                            node: last.node.clone(),
                            priority: last.priority,
                            position: last.position,
                            ready: false,
                            // Silent: not reported to failsafe's set.
                            machine: None,
                        });
                    }
                }
                host.set(|st| {
                    st.addrs = fresh
                        .iter()
                        .filter_map(|m| Some((m.node.clone(), m.addr.clone()?)))
                        .collect();
                    for (m, _) in members.values() {
                        if let (Some(machine), Some(fs)) = (&m.machine, &m.failsafe) {
                            st.failsafe_urls
                                .insert((m.node.clone(), machine.clone()), fs.url.clone());
                        }
                    }
                    // Failsafe: a live member that cannot grant (no
                    // --failsafe, or a putex too old to know it — and to
                    // know a failsafe record's set) stops this holder from
                    // running on grants at all.
                    st.failsafe_unfit = fresh
                        .iter()
                        .filter(|m| m.node != own.as_str() && m.failsafe.is_none())
                        .map(|m| m.node.clone())
                        .collect();
                    st.members = member_ages(&members);
                });
                if inject.unbounded_send(Input::Members(candidates)).is_err() {
                    return;
                }
                let active = active_holder(&fresh);
                let holder_position = active
                    .as_ref()
                    .and_then(|a| fresh.iter().find(|m| m.node == *a).and_then(|m| m.position));
                host.set(|st| {
                    st.active_holder.clone_from(&active);
                    st.holder_position = holder_position;
                });
                if active.is_some() && active != holder {
                    holder = active;
                    if holder.as_deref() != Some(own.as_str()) {
                        follow(&host, holder.clone());
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "member watch failed; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The node the fresh records name as the active holder. Two of them can
/// say `active` at once: a crashed holder's last record stays fresh for
/// 10 R (plus two store clock steps) while its successor's says `active`
/// too. The successor holds the higher fencing token (each acquisition's
/// is higher than any before it), so the record with the highest token
/// wins, whatever order the records come in.
fn active_holder(fresh: &[MemberRecord]) -> Option<String> {
    fresh
        .iter()
        .filter(|m| m.role == "active")
        .max_by_key(|m| m.token.as_deref().and_then(Token::parse))
        .map(|m| m.node.clone())
}

/// The newest record that says `active`, fresh or not: the last holder.
fn last_holder(members: &HashMap<String, (MemberRecord, StoreTime)>) -> Option<&MemberRecord> {
    members
        .values()
        .filter(|(m, _)| m.role == "active")
        .max_by_key(|(_, t)| (t.era, t.nanos))
        .map(|(m, _)| m)
}

/// The members whose records were written within 10 of their R of the
/// newest one, plus two steps of a store clock that reads in steps (etcd:
/// two records written 300 ms apart may be stamped a second apart).
fn fresh_members(
    members: &HashMap<String, (MemberRecord, StoreTime)>,
    clock_step: Duration,
) -> Vec<MemberRecord> {
    let newest = members
        .values()
        .map(|(_, t)| *t)
        .max_by_key(|t| (t.era, t.nanos));
    members
        .values()
        .filter(|(rec, t)| {
            let limit = Duration::from_millis(rec.renew_ms.max(1) * 10) + clock_step * 2;
            let fresh = newest.is_some_and(|n| match n.gap_since(*t) {
                StoreGap::Forward(age) => age <= limit,
                StoreGap::Backwards => true,
                StoreGap::Unbounded => false,
            });
            fresh && !matches!(rec.role.as_str(), "exited" | "starting")
        })
        .map(|(rec, _)| rec.clone())
        .collect()
}

/// Every member whose record was read, with the age of its record against
/// the newest one (`PUTEX_MEMBERS`): a member gone for an hour shows
/// 3600, one that exited cleanly counts from its last record. A record
/// whose node is no node id (written by someone else), or whose age
/// cannot be told (another store epoch), is left out.
fn member_ages(
    members: &HashMap<String, (MemberRecord, StoreTime)>,
) -> Vec<(crate::store::NodeId, Duration)> {
    let Some(newest) = members
        .values()
        .map(|(_, t)| *t)
        .max_by_key(|t| (t.era, t.nanos))
    else {
        return Vec::new();
    };
    members
        .values()
        .filter_map(|(rec, t)| {
            let node = crate::store::NodeId::new(rec.node.clone()).ok()?;
            let age = match newest.gap_since(*t) {
                StoreGap::Forward(age) => age,
                StoreGap::Backwards => Duration::ZERO,
                StoreGap::Unbounded => return None,
            };
            Some((node, age))
        })
        .collect()
}

/// `--follow`: the active holder changed to `holder` (not this node).
///
/// Follows run one at a time and never beside the rejoin hook (O4): a node
/// still to rejoin follows nobody (the rejoin's success follows the holder
/// of that moment), and a follow overtaken by a newer holder is dropped.
/// Nor before the start-up stop has finished (S5), which would stop what
/// the follow started: the move from starting to standby follows the
/// holder of that moment. A
/// follow that fails is run again every T while the holder stays the same
/// (the holder may still be starting its service, a network may be down).
pub(super) fn follow(host: &AgentHost, holder: Option<String>) {
    let Some(cmd) = host.inner.settings.operator.follow.clone() else {
        return;
    };
    let host = host.clone();
    let timeout = host.inner.settings.timing.activate_timeout();
    let again = host.inner.settings.timing.lease();
    tokio::spawn(
        async move {
            loop {
                {
                    let _resync = host.inner.resync.lock().await;
                    let (role, pending, current, stop) = host.set(|st| {
                        (
                            st.role,
                            st.rejoin_pending,
                            st.active_holder.clone(),
                            st.follow_stop.clone(),
                        )
                    });
                    let starting = matches!(role, None | Some(Role::Starting));
                    if !starting && role != Some(Role::Standby) {
                        // Taking the lock, holding it or stopping: only a
                        // standby follows (back in standby, it follows
                        // whoever holds it then).
                        return;
                    }
                    if starting {
                        // The start-up stop would stop what a follow starts
                        // (a replica): the move to standby follows instead.
                        tracing::info!(holder = ?holder, "not following yet: the start-up stop first");
                        return;
                    }
                    if pending {
                        tracing::info!(holder = ?holder, "not following yet: rejoining first (O4)");
                        return;
                    }
                    if current.is_some() && current != holder {
                        return;
                    }
                    let addr = holder
                        .as_ref()
                        .and_then(|h| host.set(|st| st.addrs.get(h).cloned()));
                    let env = host.hook_env(holder.clone(), addr);
                    tracing::info!(holder = ?env.holder, addr = ?env.holder_addr, "following the new holder");
                    let ran = AgentHost::run_hook_until(
                        &host.inner,
                        HookKind::Follow,
                        &cmd,
                        &env,
                        None,
                        timeout,
                        stop.clone().cancelled_owned(),
                    )
                    .await;
                    let failing = match &ran {
                        Err(why) if !stop.is_cancelled() => Some(format!("follow failing: {why}")),
                        _ => None,
                    };
                    let changed = host.set(|st| {
                        std::mem::replace(&mut st.follow_failing, failing.clone()) != failing
                    });
                    if changed {
                        host.inner.member_dirty.notify_one();
                    }
                    if ran.is_ok() {
                        return;
                    }
                    if stop.is_cancelled() {
                        tracing::info!(holder = ?holder, "follow hook stopped: this node left standby to take the lock");
                        return;
                    }
                }
                tracing::warn!(holder = ?holder, again = ?again, "the follow hook failed; trying again");
                tokio::time::sleep(again).await;
            }
        }
        .in_current_span(),
    );
}

/// `--position`: runs the command every R, and at once when the core asks
/// (a switchover's target catching up, O1), and passes what it prints to
/// the core (and the member record). A failure (or output that is not a
/// non-negative integer) makes the position unknown: such a node is
/// beyond any `--max-lag`.
pub(super) async fn position_feed(host: AgentHost, inject: driver::InputSender) {
    let Some(cmd) = host.inner.settings.operator.position.clone() else {
        return;
    };
    let every = host.inner.settings.timing.renew();
    let timeout = host.inner.settings.timing.healthcheck_timeout();
    let mut warned = false;
    loop {
        let position = match read_position(&cmd, timeout).await {
            Ok(p) => {
                warned = false;
                Some(p)
            }
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, "--position failed; position unknown");
                    warned = true;
                }
                None
            }
        };
        let changed = host.set(|st| std::mem::replace(&mut st.position, position) != position);
        if changed {
            host.inner.member_dirty.notify_one();
        }
        if inject.unbounded_send(Input::Position(position)).is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = host.inner.position_wanted.notified() => {}
        }
    }
}

/// Runs `--position` once: its standard output, trimmed, as a number.
async fn read_position(cmd: &str, timeout: Duration) -> Result<u64, String> {
    let vars = [("PUTEX_HOOK", HookKind::Position.name().to_string())];
    let out = command_stdout(cmd, &vars, timeout).await?;
    let text = String::from_utf8_lossy(&out);
    text.trim().parse::<u64>().map_err(|_| {
        format!(
            "{cmd:?} printed {:?}, not a non-negative integer",
            text.trim()
        )
    })
}

/// Runs `cmd` with `/bin/sh -c` and `vars`, stdin from /dev/null, stderr
/// to the agent's, for at most `timeout` (killed after): its standard
/// output, if it exited 0 (`--position`, `--info`).
pub(super) async fn command_stdout(
    cmd: &str,
    vars: &[(&'static str, String)],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .arg("putex-hook")
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("{cmd:?} took longer than {timeout:?}"))?
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} exited with {}", out.status));
    }
    Ok(out.stdout)
}

impl AgentHost {
    pub(super) fn member_record(&self) -> MemberRecord {
        self.set(|st| MemberRecord {
            alarm: st.unproven.map(|(attempts, holding)| {
                format!(
                    "stop unproven ({attempts} attempts; {})",
                    if holding {
                        "holding the lock until a stop is proven"
                    } else {
                        "the lock was lost"
                    }
                )
            }),
            v: 1,
            node: self.inner.node.to_string(),
            instance: self.inner.instance.clone(),
            // O4: a standby that must rejoin first says so.
            role: if st.rejoin_pending && st.role == Some(Role::Standby) {
                "rejoining".into()
            } else {
                st.role_name()
            },
            healthy: st.healthy,
            last_health: st.last_health.clone(),
            token: st.token.map(|t| t.to_string()),
            renew_ms: u64::try_from(self.inner.settings.timing.renew().as_millis()).unwrap_or(0),
            pid: std::process::id(),
            priority: self.inner.settings.operator.priority,
            position: st.position,
            ready: Some(st.ready()),
            blocker: why_not(st.blocker.as_ref(), st.follow_failing.as_deref()),
            addr: self.inner.settings.operator.advertise.clone(),
            paused: st.paused.as_ref().map(ToString::to_string),
            info: st.info.clone(),
            machine: Some(crate::identity::machine_id()),
            failsafe: self.inner.settings.failsafe.as_ref().map(|f| {
                crate::report::members::MemberFailsafe {
                    url: format!("http://{}/v1/failsafe/{}", f.advertise, self.inner.lock),
                    key: f.key.fingerprint(),
                }
            }),
        })
    }
}

/// A member's `why_not`: what keeps the core from taking the lock here,
/// and a follow that keeps failing (the replica may be of no use then
/// either), both when both hold.
fn why_not(blocker: Option<&Blocker>, follow_failing: Option<&str>) -> Option<String> {
    match (blocker, follow_failing) {
        (Some(b), Some(f)) => Some(format!("{b}; {f}")),
        (Some(b), None) => Some(b.to_string()),
        (None, f) => f.map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active(node: &str, token: &str) -> MemberRecord {
        MemberRecord {
            node: node.into(),
            role: "active".into(),
            token: Some(token.into()),
            ..MemberRecord::default()
        }
    }

    /// A crashed holder's record still fresh beside its successor's: the
    /// successor (the higher token) is the holder, in either order. (Taking
    /// the first `active` record left a standby following the dead holder
    /// until its record went stale: 5 s late on etcd at R = 500 ms.)
    #[test]
    fn the_active_holder_is_the_one_with_the_higher_token() {
        let dead = active("n1", "1795954618401892883:367");
        let new = active("n2", "1795954618401892883:1384");
        let standby = MemberRecord {
            node: "n3".into(),
            role: "standby".into(),
            ..MemberRecord::default()
        };
        for records in [
            vec![dead.clone(), new.clone(), standby.clone()],
            vec![standby.clone(), new.clone(), dead.clone()],
        ] {
            assert_eq!(active_holder(&records).as_deref(), Some("n2"));
        }
        // A later epoch beats any revision of an earlier one.
        let restored = active("n4", "1795954618401892884:3");
        assert_eq!(active_holder(&[new, restored, dead]).as_deref(), Some("n4"));
        assert_eq!(active_holder(&[standby]), None);
    }

    /// `PUTEX_MEMBERS`' ages: against the newest record, a member that
    /// exited counts from its last record, garbage and other eras are left
    /// out.
    #[test]
    fn member_ages_count_from_each_record_to_the_newest() {
        let at = |era: u64, secs: u64| StoreTime {
            era,
            nanos: secs * 1_000_000_000,
        };
        let rec = |node: &str, role: &str| MemberRecord {
            node: node.into(),
            role: role.into(),
            ..MemberRecord::default()
        };
        let members: HashMap<String, (MemberRecord, StoreTime)> = [
            ("member.pg.db1", rec("db1", "active"), at(7, 5000)),
            ("member.pg.db2", rec("db2", "standby"), at(7, 4999)),
            ("member.pg.db3", rec("db3", "exited"), at(7, 1400)),
            ("member.pg.x", rec("no good", "standby"), at(7, 5000)),
            ("member.pg.old", rec("old", "standby"), at(6, 9000)),
        ]
        .into_iter()
        .map(|(k, r, t)| (k.to_string(), (r, t)))
        .collect();
        let mut ages: Vec<(String, u64)> = member_ages(&members)
            .into_iter()
            .map(|(n, a)| (n.to_string(), a.as_secs()))
            .collect();
        ages.sort();
        assert_eq!(
            ages,
            [("db1".into(), 0), ("db2".into(), 1), ("db3".into(), 3600)]
        );
        assert!(member_ages(&HashMap::new()).is_empty());
    }
}
