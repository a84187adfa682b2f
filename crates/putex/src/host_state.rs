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
//!   `<store hash>-<key>.highest`; reading merges them in (the higher token
//!   wins), and the first write removes them.
//!
//! The file lives in the keeper directory (`/run/putex` for root: memory,
//! gone at reboot, like the processes it describes). Unreadable content
//! (written by someone else, or by hand) is logged and treated as empty.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use putex_core::Token;
use serde::{Deserialize, Serialize};

use crate::supervision::keeper::socket_path;
use crate::supervision::process::TreeSnapshot;

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
            legacy_highest: base.with_extension("highest"),
        }
    }

    /// Also reads (and, once written, removes) the state file that the agent
    /// for lock `lock` kept in earlier releases.
    pub fn with_agent_legacy(mut self, dir: &Path, store_id: &str, lock: &str) -> HostState {
        self.legacy_agent = Some(socket_path(dir, store_id, lock).with_extension("state"));
        self
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the host remembers; `None` when nothing was ever recorded.
    pub fn load(&self) -> Option<HostRecord> {
        let current = read_json::<HostRecord>(&self.path);
        self.merge_legacy(current)
    }

    /// Reads, changes with `change` and writes the record, under the lock
    /// that serialises every writer on the host. Returns what was written.
    pub fn update(&self, change: impl FnOnce(&mut HostRecord)) -> io::Result<HostRecord> {
        let _guard = self.lock()?;
        let mut record = self
            .merge_legacy(read_json::<HostRecord>(&self.path))
            .unwrap_or_default();
        let before = record.highest;
        change(&mut record);
        record.raise(before);
        self.replace(&record)?;
        for old in self.legacy_agent.iter().chain([&self.legacy_highest]) {
            match std::fs::remove_file(old) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %old.display(), error = %e, "cannot remove a state file of an earlier release");
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

    /// The earlier releases' files merged into `current`.
    fn merge_legacy(&self, current: Option<HostRecord>) -> Option<HostRecord> {
        let agent = self
            .legacy_agent
            .as_deref()
            .and_then(read_json::<HostRecord>);
        let highest = read_json::<Token>(&self.legacy_highest);
        if agent.is_none() && highest.is_none() {
            return current;
        }
        let mut merged = match (current, agent) {
            (Some(mut c), Some(a)) => {
                c.raise(a.highest);
                if c.instance.is_empty() {
                    c.instance = a.instance;
                    c.boot_id = a.boot_id;
                }
                c.tree = c.tree.or(a.tree);
                c
            }
            (c, a) => c.or(a).unwrap_or_default(),
        };
        merged.raise(highest);
        Some(merged)
    }

    /// The exclusive lock on the record file as it is now (created empty
    /// when missing): held, no other writer changes it.
    fn lock(&self) -> io::Result<Flock<File>> {
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)?;
            let locked = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e)?;
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
    /// the record (the caller holds the lock).
    fn replace(&self, record: &HostRecord) -> io::Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(record).expect("a host record serialises"))?;
        f.sync_data()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            // The rename itself, durable where the directory is on disk.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

/// A file's JSON content: `None` when it is missing or empty (a writer's
/// lock created it), logged and `None` when it is not what we wrote.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let mut text = String::new();
    File::open(path).ok()?.read_to_string(&mut text).ok()?;
    if text.trim().is_empty() {
        return None;
    }
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable host state; ignoring it");
            None
        }
    }
}

#[cfg(test)]
mod tests;
