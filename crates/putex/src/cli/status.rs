//! `putex status`: who holds a lock, since when, with which token, and how
//! its members are doing.
//!
//! Ages come from store timestamps only: the store's "now" is read by a
//! probe write (`probe._status`) and compared with the records' store
//! times, so no host's wall clock is compared with another's. A record
//! from another clock domain (the embedded store after a reboot) has no
//! age (`null`).

use std::time::Duration;

use putex_core::{Observed, StoreGap, StoreTime};
use serde::Serialize;

use super::CliError;
use crate::agent::member::MemberRecord;
use crate::store::{keys, AnyStore, ReadMode, Store, StoreUrl};

/// `putex status` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    /// The lock (or use --lock); all locks when omitted.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// The lock name.
    #[arg(long, env = "PUTEX_LOCK", conflicts_with = "name")]
    pub lock: Option<String>,
    /// The store URL (default: PUTEX_STORE, NATS_URL, else the embedded SQLite store).
    #[arg(long, env = "PUTEX_STORE")]
    pub store: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Output format of `putex status`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A table for people.
    Table,
    /// JSON for programs.
    Json,
}

/// One lock as `status` reports it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LockStatus {
    /// The lock name.
    pub lock: String,
    /// The holder's node id (also for `released` and `revoked` records:
    /// the last holder).
    pub holder: Option<String>,
    /// `active`, `confirming`, `released`, `revoked`, `absent` or `unreadable`.
    pub state: String,
    /// The fencing token `epoch:revision`.
    pub token: Option<String>,
    /// The record's revision.
    pub revision: Option<u64>,
    /// Store time since the record was last written (renewed), in ms.
    pub renewed_ago_ms: Option<u64>,
    /// The lease T the holder advertises, in ms.
    pub lease_ms: Option<u64>,
    /// The emergency-stop gap the holder advertises, in ms.
    pub gap_ms: Option<u64>,
    /// The holder's instance id.
    pub instance: Option<String>,
    /// Whether the record is older than its advertised lease (the holder
    /// stopped renewing: a takeover is due).
    pub stale: bool,
    /// The members' records.
    pub members: Vec<MemberStatus>,
    /// What the holder holds it for (`putex lock --title`), from its
    /// place in the line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `putex lock` clients waiting in line, first first.
    pub waiting: Vec<WaiterStatus>,
}

/// One `putex lock` client waiting in line (its queue ticket).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WaiterStatus {
    /// The waiter's node id.
    pub node: String,
    /// Its process id, on that node.
    pub pid: u32,
    /// What it wants the lock for (`--title`).
    pub title: Option<String>,
    /// Its place in line: the revision that created its ticket.
    pub arrival: u64,
    /// Store time since it last refreshed its ticket, in ms.
    pub refreshed_ago_ms: Option<u64>,
    /// Whether its ticket outlived its refreshes (the waiter died): others
    /// skip it, and it will be removed.
    pub expired: bool,
}

/// One member as `status` reports it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemberStatus {
    /// The node id.
    pub node: String,
    /// The agent's role.
    pub role: String,
    /// Whether its last health check passed.
    pub healthy: Option<bool>,
    /// Its last health check.
    pub last_health: Option<String>,
    /// Its fencing token while holding.
    pub token: Option<String>,
    /// Store time since its member record was written, in ms.
    pub last_seen_ms: Option<u64>,
    /// Whether it has not written its record for more than 10 of its R.
    pub silent: bool,
    /// Something an operator must look at (`stop unproven …`: the service
    /// may still run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
}

fn age(now: Option<StoreTime>, then: StoreTime) -> Option<u64> {
    match now?.gap_since(then) {
        StoreGap::Forward(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        StoreGap::Backwards => Some(0),
        StoreGap::Unbounded => None,
    }
}

/// The store's current time, by a probe write and read.
async fn store_now(store: &AnyStore, timeout: Duration) -> Option<StoreTime> {
    let key = keys::probe("_status").ok()?;
    store
        .put(
            &key,
            br#"{"v":1,"node":"_status","write":"status"}"#,
            timeout,
        )
        .await
        .ok()?;
    Some(store.get(&key, ReadMode::Leader, timeout).await.ok()??.time)
}

/// Every record under `filter` as of now ([`crate::store::read_prefix`]:
/// no waiting for a watch to go quiet, which busy members never do).
async fn snapshot(
    store: &AnyStore,
    filter: &str,
    timeout: Duration,
) -> Result<Vec<(String, crate::store::Entry)>, CliError> {
    crate::store::read_prefix(store, filter, timeout)
        .await
        .map_err(|e| CliError::Store(format!("store: {e}")))
}

/// Reads one lock's status.
pub async fn lock_status(store: &AnyStore, lock: &str) -> Result<LockStatus, CliError> {
    let timeout = Duration::from_secs(2);
    let key = keys::lock(lock).map_err(|e| CliError::Usage(format!("--lock: {e}")))?;
    let now = store_now(store, timeout).await;
    let mut st = record_status(store, lock, &key, now, timeout).await?;
    let filter = keys::members_of(lock).map_err(|e| CliError::Usage(e.to_string()))?;
    for (_, e) in snapshot(store, &filter, timeout).await? {
        let Ok(m) = serde_json::from_slice::<MemberRecord>(&e.value) else {
            continue;
        };
        let last_seen_ms = age(now, e.time);
        st.members.push(MemberStatus {
            silent: last_seen_ms.is_none_or(|a| a > m.renew_ms.max(1).saturating_mul(10)),
            node: m.node,
            role: m.role,
            healthy: m.healthy,
            last_health: m.last_health,
            token: m.token,
            last_seen_ms,
            alarm: m.alarm,
        });
    }
    let line = keys::queue_of(lock).map_err(|e| CliError::Usage(e.to_string()))?;
    let mut waiting = Vec::new();
    for (_, e) in snapshot(store, &line, timeout).await? {
        let Ok(t) = serde_json::from_slice::<crate::locks::queue::TicketRecord>(&e.value) else {
            continue;
        };
        let refreshed_ago_ms = age(now, e.time);
        let expiry = crate::locks::queue::expiry(Duration::from_millis(t.renew_ms));
        let expired = refreshed_ago_ms.is_none_or(|a| u128::from(a) > expiry.as_millis());
        if st.instance.as_deref() == Some(t.instance.as_str())
            && matches!(st.state.as_str(), "active" | "confirming")
        {
            // The holder keeps its place until it leaves: its title.
            st.title = t.title;
            continue;
        }
        waiting.push(WaiterStatus {
            node: t.node,
            pid: t.pid,
            title: t.title,
            arrival: t.arrival,
            refreshed_ago_ms,
            expired,
        });
    }
    waiting.sort_by_key(|w| w.arrival);
    st.waiting = waiting;
    Ok(st)
}

/// One semaphore as `status` reports it (`putex lock --limit N`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SemaphoreStatus {
    /// The semaphore's name.
    pub name: String,
    /// Its limit N.
    pub limit: u32,
    /// Its slots, each an ordinary lock record (`lock` is `NAME.SLOT`).
    pub slots: Vec<LockStatus>,
}

/// One identity pool as `status` reports it (`putex id`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PoolStatus {
    /// The pool.
    pub pool: String,
    /// Its range, if recorded.
    pub range: Option<String>,
    /// Ids held by persistent claims.
    pub claimed: usize,
    /// Id records in all (claimed, leased, released, revoked, unreadable).
    pub records: usize,
}

/// Reads a semaphore's slots.
pub async fn semaphore_status(
    store: &AnyStore,
    name: &str,
) -> Result<Option<SemaphoreStatus>, CliError> {
    let timeout = Duration::from_secs(2);
    let key = keys::semaphore(name).map_err(|e| CliError::Usage(e.to_string()))?;
    let store_err = |e: crate::store::StoreError| CliError::Store(format!("store: {e}"));
    let Some(e) = store
        .get(&key, ReadMode::Any, timeout)
        .await
        .map_err(store_err)?
    else {
        return Ok(None);
    };
    let limit = serde_json::from_slice::<crate::locks::section::SemaphoreRecord>(&e.value)
        .ok()
        .filter(|r| r.v == 1)
        .map_or(0, |r| r.limit);
    if limit == 1 {
        // A plain lock's recorded limit (`putex lock` without --limit).
        return Ok(None);
    }
    let now = store_now(store, timeout).await;
    let mut slots = Vec::new();
    // A record from elsewhere may claim any limit; no semaphore has more
    // slots than `--limit` allows.
    for i in 0..limit.min(crate::locks::section::MAX_LIMIT) {
        let slot = keys::slot(name, i).map_err(|e| CliError::Usage(e.to_string()))?;
        slots.push(record_status(store, &format!("{name}.{i}"), &slot, now, timeout).await?);
    }
    Ok(Some(SemaphoreStatus {
        name: name.to_owned(),
        limit,
        slots,
    }))
}

/// Every semaphore and identity pool in the store.
async fn semaphores_and_pools(
    store: &AnyStore,
) -> Result<(Vec<SemaphoreStatus>, Vec<PoolStatus>), CliError> {
    let timeout = Duration::from_secs(2);
    let store_err = |e: crate::store::StoreError| CliError::Store(format!("store: {e}"));
    let mut sems = Vec::new();
    for (k, _) in crate::store::read_prefix(store, keys::SEM_PREFIX, timeout)
        .await
        .map_err(store_err)?
    {
        let name = &k[keys::SEM_PREFIX.len()..];
        if keys::validate_name(name).is_ok() {
            if let Some(s) = semaphore_status(store, name).await? {
                sems.push(s);
            }
        }
    }
    let mut pools = std::collections::BTreeSet::new();
    for (k, _) in crate::store::read_prefix(store, keys::ID_PREFIX, timeout)
        .await
        .map_err(store_err)?
    {
        if let Some((pool, _)) = k[keys::ID_PREFIX.len()..].split_once('.') {
            if keys::validate_name(pool).is_ok() {
                pools.insert(pool.to_owned());
            }
        }
    }
    let mut out = Vec::new();
    for pool in pools {
        let l = crate::locks::idpool::list(store, &pool, &crate::locks::idpool::Options::default())
            .await
            .map_err(|e| CliError::Store(format!("pool {pool}: {e}")))?;
        out.push(PoolStatus {
            pool,
            range: l.range,
            claimed: l.claimed,
            records: l.ids.iter().filter(|e| e.id.is_some()).count(),
        });
    }
    Ok((sems, out))
}

/// The lock record at `key`, reported as lock `name` (no members).
async fn record_status(
    store: &AnyStore,
    name: &str,
    key: &str,
    now: Option<StoreTime>,
    timeout: Duration,
) -> Result<LockStatus, CliError> {
    let lock = name;
    let entry = store
        .get(key, ReadMode::Any, timeout)
        .await
        .map_err(|e| CliError::Store(format!("store: {e}")))?;
    let mut st = LockStatus {
        lock: lock.to_owned(),
        holder: None,
        state: "absent".into(),
        token: None,
        revision: None,
        renewed_ago_ms: None,
        lease_ms: None,
        gap_ms: None,
        instance: None,
        stale: false,
        members: Vec::new(),
        title: None,
        waiting: Vec::new(),
    };
    if let Some(e) = entry {
        st.token = Some(e.token.to_string());
        st.revision = Some(e.token.revision);
        st.renewed_ago_ms = age(now, e.time);
        match Observed::decode(&e.value) {
            Observed::Record(r) => {
                st.holder = Some(r.node.clone());
                st.state = serde_json::to_value(r.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                st.lease_ms = Some(r.lease_ms);
                st.gap_ms = Some(r.gap_ms);
                st.instance = Some(r.instance.clone());
                st.stale = matches!(st.state.as_str(), "active" | "confirming")
                    && st.renewed_ago_ms.is_none_or(|a| a > r.lease_ms);
            }
            Observed::Garbage => st.state = "unreadable".into(),
        }
    }
    Ok(st)
}

pub(crate) fn ago(ms: Option<u64>) -> String {
    match ms {
        Some(ms) if ms < 10_000 => format!("{:.1}s ago", ms as f64 / 1000.0),
        Some(ms) => format!("{}s ago", ms / 1000),
        None => "long ago".into(),
    }
}

pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Renders one lock for people.
pub fn render(st: &LockStatus) -> String {
    let mut rows = vec![vec![
        "LOCK".to_string(),
        "HOLDER".into(),
        "STATE".into(),
        "TOKEN".into(),
        "RENEWED".into(),
        "LEASE".into(),
    ]];
    let state = if st.stale {
        format!("{} (STALE: not renewed within its lease)", st.state)
    } else {
        st.state.clone()
    };
    rows.push(vec![
        st.lock.clone(),
        st.holder.clone().unwrap_or_else(|| "-".into()),
        state,
        st.token.clone().unwrap_or_else(|| "-".into()),
        if st.revision.is_some() {
            ago(st.renewed_ago_ms)
        } else {
            "-".into()
        },
        st.lease_ms
            .map(|l| format!("{:.1}s", l as f64 / 1000.0))
            .unwrap_or_else(|| "-".into()),
    ]);
    let mut out = table(&rows);
    if let Some(title) = &st.title {
        out.push_str(&format!("held for: {title}\n"));
    }
    if !st.waiting.is_empty() {
        out.push('\n');
        let mut rows = vec![vec![
            "WAITING".to_string(),
            "NODE".into(),
            "PID".into(),
            "REFRESHED".into(),
            "TITLE".into(),
        ]];
        for (i, w) in st.waiting.iter().enumerate() {
            rows.push(vec![
                format!("{}", i + 1),
                w.node.clone(),
                w.pid.to_string(),
                if w.expired {
                    format!("{} (EXPIRED)", ago(w.refreshed_ago_ms))
                } else {
                    ago(w.refreshed_ago_ms)
                },
                w.title.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push_str(&table(&rows));
    }
    if st.members.is_empty() {
        if st.waiting.is_empty() && st.title.is_none() {
            out.push_str("no members have reported\n");
        }
        return out;
    }
    out.push('\n');
    let mut rows = vec![vec![
        "NODE".to_string(),
        "ROLE".into(),
        "HEALTHY".into(),
        "LAST CHECK".into(),
        "LAST SEEN".into(),
    ]];
    for m in &st.members {
        rows.push(vec![
            m.node.clone(),
            match &m.alarm {
                Some(a) => format!("{} ({})", m.role, a.to_uppercase()),
                None => m.role.clone(),
            },
            match m.healthy {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "-".into(),
            },
            m.last_health.clone().unwrap_or_else(|| "-".into()),
            if m.silent && m.role != "exited" {
                format!("{} (SILENT)", ago(m.last_seen_ms))
            } else {
                ago(m.last_seen_ms)
            },
        ]);
    }
    out.push_str(&table(&rows));
    out
}

/// `putex status`.
pub async fn run(args: &StatusArgs) -> Result<(), CliError> {
    let url = match &args.store {
        Some(u) => StoreUrl::parse(u).map_err(|e| CliError::Usage(format!("--store: {e}")))?,
        None => StoreUrl::from_env().map_err(|e| CliError::Usage(format!("--store: {e}")))?,
    };
    let store = AnyStore::open(&url)
        .await
        .map_err(|e| CliError::Store(format!("store {url}: {e}")))?;
    let name = args.name.clone().or_else(|| args.lock.clone());
    let names = match name {
        Some(n) => {
            keys::validate_name(&n).map_err(|e| CliError::Usage(format!("lock name: {e}")))?;
            vec![n]
        }
        None => crate::store::read_prefix(&store, keys::LOCK_PREFIX, Duration::from_secs(2))
            .await
            .map_err(|e| CliError::Store(format!("store: {e}")))?
            .into_iter()
            .filter_map(|(k, _)| k.strip_prefix(keys::LOCK_PREFIX).map(str::to_owned))
            // Scan markers (`lock.=scan`) and foreign keys are no locks.
            .filter(|n| keys::validate_name(n).is_ok())
            .collect(),
    };
    let mut all = Vec::new();
    for n in &names {
        all.push(lock_status(&store, n).await?);
    }
    let one = args.name.is_some() || args.lock.is_some();
    // A single name may be a semaphore's; all names: every semaphore and
    // identity pool too.
    let (sems, pools) = if one {
        let sem = semaphore_status(&store, &names[0]).await?;
        (sem.into_iter().collect(), Vec::new())
    } else {
        semaphores_and_pools(&store).await?
    };
    match args.output {
        Format::Json => {
            let v = if one && sems.is_empty() {
                serde_json::to_string_pretty(&all[0])
            } else if one {
                serde_json::to_string_pretty(&serde_json::json!({
                    "lock": all[0],
                    "semaphore": sems[0],
                }))
            } else {
                serde_json::to_string_pretty(&serde_json::json!({
                    "locks": all,
                    "semaphores": sems,
                    "pools": pools,
                }))
            };
            println!("{}", v.expect("status serialises"));
        }
        Format::Table => {
            if all.is_empty() && sems.is_empty() && pools.is_empty() {
                println!("no locks in {url}");
            }
            let mut first = true;
            for st in &all {
                if one && st.state == "absent" && !sems.is_empty() {
                    continue;
                }
                if !first {
                    println!();
                }
                first = false;
                print!("{}", render(st));
            }
            for sem in &sems {
                if !first {
                    println!();
                }
                first = false;
                println!("semaphore {} (limit {})", sem.name, sem.limit);
                let mut rows = vec![vec![
                    "SLOT".to_string(),
                    "HOLDER".into(),
                    "STATE".into(),
                    "TOKEN".into(),
                    "RENEWED".into(),
                ]];
                for slot in &sem.slots {
                    rows.push(vec![
                        slot.lock.clone(),
                        slot.holder.clone().unwrap_or_else(|| "-".into()),
                        slot.state.clone() + if slot.stale { " (STALE)" } else { "" },
                        slot.token.clone().unwrap_or_else(|| "-".into()),
                        if slot.revision.is_some() {
                            ago(slot.renewed_ago_ms)
                        } else {
                            "-".into()
                        },
                    ]);
                }
                print!("{}", table(&rows));
            }
            if !pools.is_empty() {
                if !first {
                    println!();
                }
                let mut rows = vec![vec![
                    "POOL".to_string(),
                    "RANGE".into(),
                    "CLAIMED".into(),
                    "ID RECORDS".into(),
                ]];
                for p in &pools {
                    rows.push(vec![
                        p.pool.clone(),
                        p.range.clone().unwrap_or_else(|| "-".into()),
                        p.claimed.to_string(),
                        p.records.to_string(),
                    ]);
                }
                print!("{}", table(&rows));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use putex_core::{LockRecord, LockState};

    #[tokio::test]
    async fn reports_holder_age_and_members() {
        let store = AnyStore::from(crate::store::MemoryStore::new());
        let rec = LockRecord {
            v: 1,
            node: "db1".into(),
            machine: "m".into(),
            instance: "i".into(),
            state: LockState::Active,
            write: "w1".into(),
            lease_ms: 10_000,
            gap_ms: 2_000,
        };
        let t = Duration::from_secs(1);
        store.create("lock.pg", &rec.encode(), t).await.unwrap();
        let m = MemberRecord {
            v: 1,
            node: "db1".into(),
            role: "active".into(),
            healthy: Some(true),
            last_health: Some("active ok".into()),
            renew_ms: 1000,
            ..MemberRecord::default()
        };
        store
            .put("member.pg.db1", &serde_json::to_vec(&m).unwrap(), t)
            .await
            .unwrap();
        let st = lock_status(&store, "pg").await.unwrap();
        assert_eq!(st.holder.as_deref(), Some("db1"));
        assert_eq!(st.state, "active");
        assert!(!st.stale);
        assert!(st.renewed_ago_ms.is_some_and(|a| a < 5_000), "{st:?}");
        assert_eq!(st.members.len(), 1);
        assert_eq!(st.members[0].healthy, Some(true));
        let text = render(&st);
        assert!(
            text.contains("HOLDER") && text.contains("db1") && text.contains("active ok"),
            "{text}"
        );
        let json = serde_json::to_value(&st).unwrap();
        for k in [
            "lock",
            "holder",
            "state",
            "revision",
            "renewed_ago_ms",
            "lease_ms",
            "members",
        ] {
            assert!(json.get(k).is_some(), "{k} missing in {json}");
        }
        let absent = lock_status(&store, "other").await.unwrap();
        assert_eq!(absent.state, "absent");
    }
}
