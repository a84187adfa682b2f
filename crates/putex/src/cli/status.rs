//! `putex status`: who holds a lock, since when, with which token, and how
//! its members are doing. The queries are [`crate::report::status`]'s;
//! this command renders them.

use std::time::Duration;

use super::CliError;
use crate::observe::json::RecordState;
use crate::report::status::{lock_status, semaphore_status, semaphores_and_pools, LockStatus};
use crate::store::{keys, AnyStore, Name, StoreUrl};

/// `putex status` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    /// The lock (or use --lock); all locks when omitted.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// The lock name.
    #[arg(long, env = "PUTEX_LOCK", conflicts_with = "name")]
    pub lock: Option<String>,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
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
    let state = match (&st.paused, &st.handed_to) {
        (Some(p), _) => format!("{} (PAUSED {p})", st.state),
        (None, Some(to)) => format!("{} (handed to {to})", st.state),
        _ if st.stale => format!("{} (STALE: not renewed within its lease)", st.state),
        _ => st.state.to_string(),
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
    match &st.failsafe {
        Some(f) if f.set.is_empty() => out.push_str(
            "failsafe: no other member is in the holder's set yet: a store outage stops it at T\n",
        ),
        Some(f) => out.push_str(&format!(
            "failsafe: through a store outage the holder keeps its service while {} grant{} its asks, for at most {}\n",
            f.set.join(", "),
            if f.set.len() == 1 { "s" } else { "" },
            humantime::format_duration(std::time::Duration::from_millis(f.max_ms))
        )),
        None => {}
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
    // A column per `--info` field any member published, by name.
    let info: std::collections::BTreeSet<&String> =
        st.members.iter().flat_map(|m| m.info.keys()).collect();
    let mut header = vec![
        "NODE".to_string(),
        "ROLE".into(),
        "HEALTHY".into(),
        "LAST CHECK".into(),
        "LAST SEEN".into(),
        "PRIO".into(),
        "POSITION".into(),
    ];
    header.extend(info.iter().map(|k| k.to_uppercase()));
    header.push("WHY NOT".into());
    let mut rows = vec![header];
    for m in &st.members {
        let mut row = vec![
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
            m.priority.to_string(),
            match (m.position, m.lag) {
                (Some(p), Some(l)) if l > 0 => format!("{p} (-{l})"),
                (Some(p), _) => p.to_string(),
                (None, _) => "-".into(),
            },
        ];
        row.extend(
            info.iter()
                .map(|k| m.info.get(*k).cloned().unwrap_or_else(|| "-".into())),
        );
        row.push(match (&st.paused, m.role.as_str()) {
            (Some(_), "standby") => "paused".into(),
            _ => m.why_not.clone().unwrap_or_else(|| "-".into()),
        });
        rows.push(row);
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
    let store = AnyStore::open(&url).await.map_err(|e| {
        // The store down: say where a lock's state can still be seen.
        let hint = if e.is_unknown() {
            "; while the store is down, each agent shows its own view on its --http (/health, and /ui in a browser)"
        } else {
            ""
        };
        CliError::Store(format!("store {url}: {e}{hint}"))
    })?;
    let name = args.name.clone().or_else(|| args.lock.clone());
    let names = match name {
        Some(n) => {
            vec![Name::new(n).map_err(|e| CliError::Usage(format!("lock name: {e}")))?]
        }
        None => crate::store::read_prefix(&store, keys::LOCK_PREFIX, Duration::from_secs(2))
            .await
            .map_err(|e| CliError::Store(format!("store: {e}")))?
            .into_iter()
            // Scan markers (`lock.=scan`) and foreign keys are no locks.
            .filter_map(|(k, _)| Name::new(k.strip_prefix(keys::LOCK_PREFIX)?).ok())
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
                if one && st.state == RecordState::Absent && !sems.is_empty() {
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
                        slot.state.to_string() + if slot.stale { " (STALE)" } else { "" },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::members::MemberRecord;
    use crate::store::Store;
    use putex_core::{LockRecord, LockState};

    /// db1's active record, lease 10 s.
    fn active_record() -> LockRecord {
        LockRecord {
            v: 1,
            node: "db1".into(),
            machine: "m".into(),
            instance: "i".into(),
            state: LockState::Active,
            write: "w1".into(),
            lease_ms: 10_000,
            gap_ms: 2_000,
            to: None,
            hold_ms: 0,
            catch_up: false,
            paused: None,
            since: None,
            failsafe: None,
        }
    }

    #[tokio::test]
    async fn reports_holder_age_and_members() {
        let store = AnyStore::from(crate::store::MemoryStore::new());
        let rec = active_record();
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
        let st = lock_status(&store, &"pg".parse().unwrap()).await.unwrap();
        assert_eq!(st.holder.as_deref(), Some("db1"));
        assert_eq!(st.state, RecordState::Active);
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
        let absent = lock_status(&store, &"other".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(absent.state, RecordState::Absent);
    }

    /// F6: a held record's failsafe set and cap, in the text, the JSON and
    /// the gateway's `/v1/status` view; a released record has none.
    #[tokio::test]
    async fn a_held_failsafe_record_names_its_set() {
        let store = AnyStore::from(crate::store::MemoryStore::new());
        let member = |node: &str| putex_core::FailsafeMember {
            node: node.into(),
            machine: "m".into(),
        };
        let mut rec = LockRecord {
            failsafe: Some(putex_core::FailsafeSet {
                members: vec![member("db2"), member("db3")],
                max_ms: 120_000,
            }),
            ..active_record()
        };
        let t = Duration::from_secs(1);
        let token = store.create("lock.pg", &rec.encode(), t).await.unwrap();
        let st = lock_status(&store, &"pg".parse().unwrap()).await.unwrap();
        let text = render(&st);
        assert!(
            text.contains("failsafe: through a store outage the holder keeps its service while db2, db3 grant its asks, for at most 2m"),
            "{text}"
        );
        let want = serde_json::json!({"set": ["db2", "db3"], "max_ms": 120_000});
        assert_eq!(serde_json::to_value(&st).unwrap()["failsafe"], want);
        let view = crate::http::v1::views::StatusView::from(st);
        assert_eq!(serde_json::to_value(&view).unwrap()["failsafe"], want);

        rec.state = LockState::Released;
        store
            .update("lock.pg", &rec.encode(), token, t)
            .await
            .unwrap();
        let st = lock_status(&store, &"pg".parse().unwrap()).await.unwrap();
        assert_eq!(st.failsafe, None);
        assert!(!render(&st).contains("failsafe"));
    }
}
