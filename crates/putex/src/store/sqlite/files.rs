//! The files of an open store and what guards them: the database, its
//! `-wal` and its `-shm` are checked after every call to still be the
//! files the handle opened (device and inode), so that a handle never goes
//! on writing in a file nobody else sees ([`FileError::Replaced`]); and a
//! missing database next to another one's log is refused at open
//! ([`FileError::Leftovers`]).

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::store::{Op, StoreError};

/// Why the store's files are not (or no longer) the ones to use.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// The path no longer names the file this handle opened: the file was
    /// deleted, or another file took its name. Its writes would reach a
    /// file no other process sees.
    #[error(
        "embedded store file {} was deleted or replaced while in use (the path now names {now}): \
         this handle no longer sees the store that others use; restart to open the file now at the path",
        path.display()
    )]
    Replaced {
        /// The file (the database, or its `-wal` or `-shm`).
        path: PathBuf,
        /// What the path names now: `no file` or `another file`.
        now: &'static str,
    },
    /// The database is missing but its write-ahead log or shared-memory
    /// index is still there: a new database would share them with handles
    /// of the deleted one.
    #[error(
        "embedded store {} is missing but {} remain: the database was deleted while in use, and a new \
         one would share the old one's write-ahead log. Make sure no process uses the deleted store \
         (a putex holding a lock there stops within its lease), then remove them",
        path.display(),
        leftovers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ")
    )]
    Leftovers {
        path: PathBuf,
        /// The `-wal` and `-shm` files found without it.
        leftovers: Vec<PathBuf>,
    },
    /// A store file could not be examined.
    #[error("embedded store file {}: cannot stat it: {source}", path.display())]
    Stat {
        path: PathBuf,
        /// What `stat` said.
        source: std::io::Error,
    },
}

/// What a path names: (device, inode). While a connection keeps a file
/// open its inode cannot be reused, so equal identities mean the same file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

/// What `path` names now; `None` when nothing.
pub(super) fn file_id(path: &Path) -> Result<Option<FileId>, FileError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Stat {
            path: path.to_owned(),
            source,
        }),
    }
}

/// `path` with `suffix` appended: how SQLite names a database's `-wal` and
/// `-shm`.
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    s.into()
}

/// The files of an open store and the identity each had when it was
/// opened: the database (by the path the user named) and its `-wal` and
/// `-shm` (named, as SQLite names them, after the database's real path).
/// SQLite removes a `-wal` or `-shm` only when the last connection to the
/// database closes, so while a handle is open all three stay put unless
/// something else deletes or replaces them.
#[derive(Debug)]
pub(super) struct Files {
    pub(super) files: [(PathBuf, FileId); 3],
    /// Set once the loss has been logged.
    alarmed: std::sync::atomic::AtomicBool,
}

impl Files {
    /// The files as they are now, right after the connection opened them.
    pub(super) fn capture(path: &Path) -> Result<Files, FileError> {
        let real = std::fs::canonicalize(path).map_err(|source| FileError::Stat {
            path: path.to_owned(),
            source,
        })?;
        let one = |p: PathBuf| -> Result<(PathBuf, FileId), FileError> {
            match file_id(&p)? {
                Some(id) => Ok((p, id)),
                None => Err(FileError::Replaced {
                    path: p,
                    now: "no file",
                }),
            }
        };
        Ok(Files {
            files: [
                one(path.to_owned())?,
                one(with_suffix(&real, "-wal"))?,
                one(with_suffix(&real, "-shm"))?,
            ],
            alarmed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether every path still names the file it named when opened.
    fn verify(&self) -> Result<(), FileError> {
        for (path, id) in &self.files {
            let now = match file_id(path)? {
                Some(now) if now == *id => continue,
                Some(_) => "another file",
                None => "no file",
            };
            return Err(FileError::Replaced {
                path: path.clone(),
                now,
            });
        }
        Ok(())
    }

    /// [`Files::verify`] as the outcome of a call: unknown, since a write
    /// may have landed in the file that is gone.
    /// The first time, the loss is logged as an error: every later call
    /// fails the same way, and the process needs a restart.
    pub(super) fn check(&self, op: Op, key: &str) -> Result<(), StoreError> {
        match self.lost() {
            None => Ok(()),
            Some(e) => Err(StoreError::unknown(op, key, e)),
        }
    }

    /// [`Files::verify`], the loss logged the first time: `None` while the
    /// files are in place.
    pub(super) fn lost(&self) -> Option<FileError> {
        let e = self.verify().err()?;
        if !self
            .alarmed
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(error = %e, "the embedded store's file is gone");
        }
        Some(e)
    }
}

/// Refuses a missing database whose `-wal` or `-shm` is still there (see
/// [`FileError::Leftovers`]). They are looked at first: a database is
/// always created before them, so finding one and then no database means
/// the database was deleted, not that it is still being created.
pub(super) fn refuse_leftovers(path: &Path) -> Result<(), FileError> {
    let mut leftovers = Vec::new();
    for suffix in ["-wal", "-shm"] {
        let p = with_suffix(path, suffix);
        if file_id(&p)?.is_some() {
            leftovers.push(p);
        }
    }
    if leftovers.is_empty() || file_id(path)?.is_some() {
        return Ok(());
    }
    Err(FileError::Leftovers {
        path: path.to_owned(),
        leftovers,
    })
}
