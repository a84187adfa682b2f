//! A name's limit (`sem.<name>`: 1 for a plain lock, N for a semaphore),
//! defined once by the first client's create, and the keys a section
//! competes for.

use super::*;

/// The semaphore limit record, `sem.<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreRecord {
    /// Format version (1).
    pub v: u32,
    /// N: how many may hold the semaphore at once.
    pub limit: u32,
}

/// A client whose limit is not the one its name was defined with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitMismatch {
    /// The lock or semaphore name, as the client passed it.
    pub name: String,
    /// The record that defines it: `sem.<name>`, or `lock.<name>` for a
    /// name used as a plain lock before limits were recorded.
    pub key: String,
    /// The name's limit (1: a plain lock).
    pub defined: u32,
    /// The limit this client asked for ([`SectionOptions::limit`]).
    pub ours: u32,
    /// The node in `lock.<name>`, when that record defines it.
    pub last_holder: Option<String>,
}

impl LimitMismatch {
    /// The refusal, naming the limit as `setting` ("limit" here; the CLI
    /// says "--limit").
    pub fn describe(&self, setting: &str) -> String {
        let holder = self
            .last_holder
            .as_ref()
            .map(|h| format!(", last holder {h}"))
            .unwrap_or_default();
        let is = match self.defined {
            1 => format!("a plain lock ({setting} 1, record {}{holder})", self.key),
            n => format!(
                "a semaphore with {setting} {n} (record {}{holder})",
                self.key
            ),
        };
        format!(
            "{:?} is {is}, but this client has {setting} {}: every client of a name must use \
             the same {setting} (or another name)",
            self.name, self.ours
        )
    }
}

impl std::fmt::Display for LimitMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe("limit"))
    }
}

/// The lock keys a section competes for: `lock.<name>`, or the semaphore's
/// slots, once the name's limit is known to be `limit`.
///
/// The limit of every name `putex lock` uses — 1 for a plain lock — is
/// recorded in `sem.<name>` by the first client, with a create: of clients
/// that disagree, exactly one create lands, and every other client finds
/// that definition and is refused. Nothing is checked and then acted on:
/// the record is written only by a create and never changed or deleted by
/// putex, so what a client finds is what every other client finds. A name
/// used as a plain lock before its limit was recorded (by an older putex, or
/// by `putex run --lock`) keeps being one: a semaphore is refused on it.
///
/// Unknown outcomes are resolved by reading, and retried with back-off
/// until `deadline`.
pub async fn targets(
    store: &AnyStore,
    name: &Name,
    limit: u32,
    timeout: Duration,
    deadline: tokio::time::Instant,
) -> Result<Vec<String>, SectionError> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(SectionError::LimitOutOfRange(limit));
    }
    let sem_key = keys::semaphore(name);
    let lock_key = keys::lock(name);
    if limit > 1 {
        let entry = patiently(deadline, timeout, |t| {
            store.get(&lock_key, ReadMode::Any, t)
        })
        .await?;
        if let Some(entry) = entry {
            let last_holder = match Observed::decode(&entry.value) {
                Observed::Record(r) => Some(r.node),
                Observed::Garbage => None,
            };
            return Err(SectionError::LimitMismatch(LimitMismatch {
                name: name.to_string(),
                key: lock_key,
                defined: 1,
                ours: limit,
                last_holder,
            }));
        }
    }
    let defined = define_limit(store, &sem_key, limit, timeout, deadline).await?;
    if defined != limit {
        return Err(SectionError::LimitMismatch(LimitMismatch {
            name: name.to_string(),
            key: sem_key,
            defined,
            ours: limit,
            last_holder: None,
        }));
    }
    if limit == 1 {
        return Ok(vec![lock_key]);
    }
    Ok((0..limit).map(|i| keys::slot(name, i)).collect())
}

/// The limit recorded in `sem_key`, recording `limit` there first if the
/// record is absent: an exclusive create, so the first definition wins.
/// Every client writes the same bytes for the same limit, so a create whose
/// outcome is unknown is resolved by reading the record back: whoever wrote
/// what is found, it is the definition.
async fn define_limit(
    store: &AnyStore,
    sem_key: &str,
    limit: u32,
    timeout: Duration,
    deadline: tokio::time::Instant,
) -> Result<u32, SectionError> {
    let parse = |e: crate::store::Entry| match serde_json::from_slice::<SemaphoreRecord>(&e.value) {
        Ok(r) if r.v == 1 && (1..=MAX_LIMIT).contains(&r.limit) => Ok(r.limit),
        _ => Err(SectionError::LimitUnreadable {
            key: sem_key.to_owned(),
            bytes: e.value.len(),
        }),
    };
    let record = serde_json::to_vec(&SemaphoreRecord { v: 1, limit }).expect("serialises");
    let mut pause = Duration::from_millis(50);
    loop {
        // Read first: after the first use of a name, no write at all.
        let read = |t| store.get(sem_key, ReadMode::Leader, t);
        if let Some(e) = patiently(deadline, timeout, read).await? {
            return parse(e);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match store
            .create(
                sem_key,
                &record,
                timeout.min(left).max(Duration::from_millis(100)),
            )
            .await
        {
            Ok(_) => return Ok(limit),
            // Someone else's definition (or ours, landed unheard): read it.
            Err(StoreError::Conflict { .. }) => {}
            Err(e @ StoreError::Unknown { .. }) => {
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(e.into());
                }
                tracing::debug!(error = %e, "recording the limit: outcome unknown; reading it back");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
