//! What a host remembers about one lock record between processes: one file
//! per (store, record key) beside the keeper sockets, shared by the failover
//! agent (`putex run`) and every critical section (`putex lock`) on the host.
//!
//! It holds the highest fencing token the host has seen for the record (S6:
//! a store that hands out a lower one has regressed, and this host refuses
//! to act on it), and what the agent needs at its next start (S5): the
//! instance and boot that wrote it last, and the service tree the keeper last
//! reported, so that an orphan of a dead keeper is found and killed.
//!
//! Guarantees:
//! - **Never torn.** Every write goes to a temporary file, is synced, and
//!   renamed over the old one: a crash at any point leaves the previous
//!   complete record or the new one, never a mix.
//! - **No lost update.** Writers (an agent and any number of sections, in
//!   separate processes) read, change and write under an exclusive `flock`
//!   on the record file; a writer that locked a file another writer has just
//!   replaced notices and locks the new one.
//! - **The highest token only rises**, whoever writes.
//! - **Upgrades lose nothing.** Earlier releases kept the agent's record in
//!   `<store hash>-<lock>.state` and each section's token in
//!   `<store hash>-<key>.highest`. Every read merges them in: the higher
//!   token wins, and the old agent file's instance, boot and tree win when
//!   it was written after the record (an agent of the earlier release ran
//!   since). The agent, which the lock file makes the only one of its lock
//!   on the host, removes the old agent file once its own record is
//!   durable; `.highest` files are left where they are (an earlier
//!   release's `putex lock` may still raise one; merging is idempotent).
//! - **Waits are bounded.** A writer that cannot take the lock within
//!   [`LOCK_PATIENCE`] (another process stopped while holding it) gets an
//!   error instead of hanging.
//!
//! The file lives in the keeper directory (`/run/putex` for root: memory,
//! gone at reboot, like the processes it describes). A missing or empty file
//! is "nothing recorded"; content that is not a record (written by someone
//! else, or by hand) is logged and treated as empty; any other read error is
//! an error, so a write never replaces a record it could not read.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use putex_core::Token;
use serde::{Deserialize, Serialize};

use crate::supervision::keeper::socket_path;
use crate::supervision::process::TreeSnapshot;

/// How long a writer waits for another writer's lock before giving up.
pub(crate) const LOCK_PATIENCE: Duration = Duration::from_secs(5);

/// The record: the same fields as the agent's state file of earlier
/// releases, each optional, so those files read as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostRecord {
    /// The instance id of the agent that wrote it last ("" when only
    /// sections wrote).
    #[serde(default)]
    pub instance: String,
    /// The boot id when the agent wrote it.
    #[serde(default)]
    pub boot_id: String,
    /// The highest fencing token seen for the record (S6).
    #[serde(default)]
    pub highest: Option<Token>,
    /// What identifies the agent's service tree, as its keeper last
    /// reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSnapshot>,
    /// The agent's last tenure may have run the service and has not ended
    /// in a proven release: set when it becomes active, cleared when its
    /// release lands. A new agent with `--rejoin` must rejoin first (O4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tenure_open: bool,
}

impl HostRecord {
    /// Raises the highest token to `token` if that is higher.
    pub fn raise(&mut self, token: Option<Token>) {
        if token > self.highest {
            self.highest = token;
        }
    }
}

/// The host-state file of one record, and the files of earlier releases
/// that it replaces.
#[derive(Clone, Debug)]
pub(crate) struct HostState {
    path: PathBuf,
    /// An earlier release's agent state file (same JSON fields).
    legacy_agent: Option<PathBuf>,
    /// This is the agent's: it removes `legacy_agent` once merged.
    owns_legacy_agent: bool,
    /// An earlier release's section token file (a JSON token).
    legacy_highest: PathBuf,
}

impl HostState {
    /// The file for record `key` of store `store_id` in the keeper
    /// directory `dir`: `<dir>/<store hash>-<key>.state.json`.
    pub fn new(dir: &Path, store_id: &str, key: &str) -> HostState {
        let base = socket_path(dir, store_id, key);
        HostState {
            path: base.with_extension("state.json"),
            legacy_agent: None,
            owns_legacy_agent: false,
            legacy_highest: base.with_extension("highest"),
        }
    }

    /// Also reads the state file that the agent for lock `lock` kept in
    /// earlier releases (a section of the lock reads it too).
    pub fn with_agent_legacy(mut self, dir: &Path, store_id: &str, lock: &str) -> HostState {
        self.legacy_agent = Some(socket_path(dir, store_id, lock).with_extension("state"));
        self
    }

    /// [`HostState::with_agent_legacy`] for the agent itself, which removes
    /// that file once its own record is durable.
    pub fn for_agent(self, dir: &Path, store_id: &str, lock: &str) -> HostState {
        let mut me = self.with_agent_legacy(dir, store_id, lock);
        me.owns_legacy_agent = true;
        me
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the host remembers; `None` when nothing was ever recorded (or
    /// it cannot be read: logged).
    pub fn load(&self) -> Option<HostRecord> {
        // The old files first: a writer removes one only after the record
        // that includes it is in place.
        let legacy = self.read_legacy();
        let current = match read_record(&self.path, None) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the host state");
                None
            }
        };
        merge(current, legacy)
    }

    /// Reads, changes with `change` and writes the record, under the lock
    /// that serialises every writer on the host. Returns what was written.
    /// A record that cannot be read is an error, never replaced. A change
    /// that changes nothing writes nothing: every waiter of a lock sees each
    /// new token, and all but the first find it recorded already.
    pub fn update(&self, change: impl FnOnce(&mut HostRecord)) -> io::Result<HostRecord> {
        let mut locked = self.lock()?;
        let legacy = self.read_legacy();
        let current = read_record(&self.path, Some(&mut locked))?;
        let unmerged = legacy.agent.is_some() || legacy.highest.is_some();
        let as_read = current.as_ref().map(|(r, _)| r.clone());
        let mut record = merge(current, legacy).unwrap_or_default();
        let before = record.highest;
        change(&mut record);
        record.raise(before);
        if !unmerged && as_read.as_ref() == Some(&record) {
            return Ok(record);
        }
        let durable = self.replace(&record)?;
        if let (true, true, Some(old)) = (durable, self.owns_legacy_agent, &self.legacy_agent) {
            match std::fs::remove_file(old) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %old.display(), error = %e, "cannot remove the state file of an earlier release");
                }
                _ => {}
            }
        }
        Ok(record)
    }

    /// Raises the highest token to `token` (a section's only write).
    pub fn raise(&self, token: Token) -> io::Result<()> {
        self.update(|r| r.raise(Some(token))).map(drop)
    }

    /// The earlier releases' files, as far as they exist and read.
    fn read_legacy(&self) -> Legacy {
        let agent = self.legacy_agent.as_deref().and_then(|p| {
            let modified = std::fs::metadata(p).and_then(|m| m.modified()).ok()?;
            let (record, _) = read_record(p, None).ok().flatten()?;
            Some((record, modified))
        });
        // An earlier release's section rewrites `.highest` in place under an
        // exclusive flock: read it under a shared one, so never half-written.
        let highest = File::open(&self.legacy_highest)
            .ok()
            .and_then(|f| Flock::lock(f, FlockArg::LockShared).ok())
            .and_then(|mut f| {
                let mut text = String::new();
                f.read_to_string(&mut text).ok()?;
                serde_json::from_str::<Token>(&text).ok()
            });
        Legacy { agent, highest }
    }

    /// The exclusive lock on the record file as it is now (created empty
    /// when missing): held, no other writer changes it. Gives up after
    /// [`LOCK_PATIENCE`].
    fn lock(&self) -> io::Result<Flock<File>> {
        let give_up = Instant::now() + LOCK_PATIENCE;
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)?;
            let locked = loop {
                match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                    Ok(locked) => break locked,
                    Err((f, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < give_up => {
                        file = f;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "another process has held the lock on {} for {LOCK_PATIENCE:?}",
                                self.path.display()
                            ),
                        ))
                    }
                    Err((_, e)) => return Err(e.into()),
                }
            };
            // Another writer may have renamed a new file over the one we
            // waited for: then that one is the record, and we lock it.
            let ours = locked.metadata()?;
            match std::fs::metadata(&self.path) {
                Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => return Ok(locked),
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes `record` to a temporary file, syncs it and renames it over
    /// the record (the caller holds the lock). `true` when the rename is
    /// durable too (the directory synced).
    fn replace(&self, record: &HostRecord) -> io::Result<bool> {
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(record).expect("a host record serialises"))?;
        f.sync_data()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        Ok(File::open(dir).and_then(|d| d.sync_all()).is_ok())
    }
}

/// What the files of earlier releases hold.
struct Legacy {
    /// The agent's record, and when it was written.
    agent: Option<(HostRecord, SystemTime)>,
    /// A section's token.
    highest: Option<Token>,
}

/// The record with the earlier releases' files merged in: the higher token;
/// the old agent file's instance, boot and tree when it is newer than the
/// record (or there is none).
fn merge(current: Option<(HostRecord, SystemTime)>, legacy: Legacy) -> Option<HostRecord> {
    let mut merged = match (current, legacy.agent) {
        (Some((mut c, at)), Some((a, old_at))) => {
            c.raise(a.highest);
            if old_at > at {
                c.instance = a.instance;
                c.boot_id = a.boot_id;
                c.tree = a.tree;
            }
            Some(c)
        }
        (c, a) => c.or(a).map(|(r, _)| r),
    };
    if let Some(h) = legacy.highest {
        merged
            .get_or_insert_with(HostRecord::default)
            .raise(Some(h));
    }
    merged
}

/// The record in `path` and when it was written: `None` when the file is
/// missing or empty (a writer's lock creates it empty), logged and `None`
/// when it is not a record; an error when it cannot be read. `locked` reads
/// through the writer's locked handle.
fn read_record(
    path: &Path,
    locked: Option<&mut Flock<File>>,
) -> io::Result<Option<(HostRecord, SystemTime)>> {
    let mut bytes = Vec::new();
    let modified = match locked {
        Some(f) => {
            f.read_to_end(&mut bytes)?;
            f.metadata()?.modified()?
        }
        None => match File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
                f.metadata()?.modified()?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        },
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice(&bytes) {
        Ok(r) => Ok(Some((r, modified))),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the host state is not a record; ignoring it");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests;
