//! `putex history`: who held a lock when, and why it moved.
//!
//! Reads the lock's transition records ([`crate::observe::history`]) consistently
//! (a scan marker, [`crate::store::snapshot_synced`]), orders them by store
//! revision and derives the holder after each one, the handovers and the
//! time the lock had no active holder ([`history::derive`]).
//!
//! The TIME column is the writing host's wall clock, for reading only;
//! NO HOLDER is measured on the store's clock (`≈` marks an estimate from
//! the takeover's evidence, when the previous holder left no record).

use std::time::Duration;

use serde::Serialize;

use super::status::{table, Format};
use super::CliError;
use crate::observe::history::{self, HistoryRow, NoHolderBasis};
use crate::store::{AnyStore, Name, StoreUrl};

/// `putex history` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct HistoryArgs {
    /// The lock.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The store URL (help: [`crate::cli::STORE_HELP`]).
    #[arg(long, env = "PUTEX_STORE", help = crate::cli::STORE_HELP, long_help = crate::cli::STORE_HELP)]
    pub store: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Show the last N transitions (0: every kept one).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,
}

/// What `putex history -o json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct HistoryOutput {
    pub lock: String,
    /// The transitions, oldest first (the last `--limit`).
    pub transitions: Vec<HistoryRow>,
}

/// Opens the store `--store` names (or the environment's).
pub(crate) async fn open_store(store: Option<&str>) -> Result<(AnyStore, StoreUrl), CliError> {
    let url = match store {
        Some(u) => StoreUrl::parse(u).map_err(|e| CliError::Usage(format!("--store: {e}")))?,
        None => StoreUrl::from_env().map_err(|e| CliError::Usage(format!("--store: {e}")))?,
    };
    let store = AnyStore::open(&url)
        .await
        .map_err(|e| CliError::Store(format!("store {url}: {e}")))?;
    Ok((store, url))
}

/// Reads and derives lock `name`'s history.
pub async fn rows(store: &AnyStore, name: &Name) -> Result<Vec<HistoryRow>, CliError> {
    let records = history::read(store, name, Duration::from_secs(5))
        .await
        .map_err(|e| CliError::Store(format!("store: {e}")))?;
    Ok(history::derive(&records))
}

fn secs(ms: u64) -> String {
    format!("{:.2}s", ms as f64 / 1000.0)
}

/// Renders transitions for people: time, token, node, role change, holder
/// (`old → new` on an activation), time without a holder, reason.
pub fn render(rows: &[HistoryRow]) -> String {
    if rows.is_empty() {
        return "no transitions recorded\n".into();
    }
    let mut out = vec![vec![
        "TIME".to_string(),
        "TOKEN".into(),
        "NODE".into(),
        "TRANSITION".into(),
        "HOLDER".into(),
        "NO HOLDER".into(),
        "REASON".into(),
    ]];
    let dash = || "-".to_string();
    for r in rows {
        let holder = if r.activation {
            format!(
                "{} → {}",
                r.previous_holder.as_deref().unwrap_or("-"),
                r.record.node
            )
        } else if r.record.from == "active" && r.holder.is_none() {
            format!("{} → -", r.record.node)
        } else {
            r.holder.clone().unwrap_or_else(dash)
        };
        let gap = match (r.no_holder_ms, r.no_holder_basis) {
            (Some(ms), Some(NoHolderBasis::LastRenewal)) => format!("≈{}", secs(ms)),
            (Some(ms), _) => secs(ms),
            _ => dash(),
        };
        out.push(vec![
            r.record.at.clone(),
            r.record.token.map_or_else(dash, |t| t.to_string()),
            r.record.node.clone(),
            format!("{} → {}", r.record.from, r.record.to),
            holder,
            gap,
            r.record.reason.clone(),
        ]);
    }
    table(&out)
}

/// The last `limit` rows (all for 0).
pub fn last(mut rows: Vec<HistoryRow>, limit: usize) -> Vec<HistoryRow> {
    if limit > 0 && rows.len() > limit {
        rows.drain(..rows.len() - limit);
    }
    rows
}

/// `putex history`.
pub async fn run(args: &HistoryArgs) -> Result<(), CliError> {
    let name = Name::new(&*args.name).map_err(|e| CliError::Usage(format!("lock name: {e}")))?;
    let (store, _) = open_store(args.store.as_deref()).await?;
    let rows = last(rows(&store, &name).await?, args.limit);
    match args.output {
        Format::Json => {
            let out = HistoryOutput {
                lock: args.name.clone(),
                transitions: rows,
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&out).expect("history serialises")
            );
        }
        Format::Table => print!("{}", render(&rows)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::history::{HistoryWriter, WriterConfig};
    use crate::store::MemoryStore;
    use putex_core::{Reason, Role, Token};

    #[tokio::test]
    async fn renders_a_handover() {
        let store = AnyStore::from(MemoryStore::new());
        let t = Duration::from_secs(1);
        let a = HistoryWriter::spawn(store.clone(), WriterConfig::for_test("pg", "a", "ia", t));
        let b = HistoryWriter::spawn(store.clone(), WriterConfig::for_test("pg", "b", "ib", t));
        let tok = Some(Token::new(1, 2));
        a.transition(
            Role::Standby,
            Role::Confirming,
            &Reason::AcquiredAbsent,
            tok,
        );
        a.transition(Role::Confirming, Role::Active, &Reason::Activated, tok);
        a.transition(Role::Active, Role::SteppingDown, &Reason::Shutdown, tok);
        a.transition(Role::SteppingDown, Role::Standby, &Reason::Released, tok);
        a.flush(t).await;
        let tok = Some(Token::new(1, 9));
        b.transition(
            Role::Standby,
            Role::Confirming,
            &Reason::AcquiredReleased,
            tok,
        );
        b.transition(Role::Confirming, Role::Active, &Reason::Activated, tok);
        b.flush(t).await;
        let rows = rows(&store, &"pg".parse().unwrap()).await.unwrap();
        assert_eq!(rows.len(), 6);
        let text = render(&rows);
        assert!(text.contains("- → a") && text.contains("a → b"), "{text}");
        assert!(text.contains("lock released by its holder (S3)"), "{text}");
        assert!(text.contains("NO HOLDER") && text.contains("1:9"), "{text}");
        let last2 = last(rows, 2);
        assert_eq!(last2.len(), 2);
        assert_eq!(last2[1].previous_holder.as_deref(), Some("a"));
        assert_eq!(
            last2[1].no_holder_basis,
            Some(NoHolderBasis::Left),
            "{last2:?}"
        );
        assert_eq!(render(&[]), "no transitions recorded\n");
    }
}
