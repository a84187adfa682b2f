//! Guarded writes for CMD (`putex kv`): while a section holds its lock, it
//! answers on a Unix socket of its own (`PUTEX_KV_SOCKET` in CMD's
//! environment) and makes each `put` or `delete` asked of it as a guarded
//! write of its tenure (`docs/locks.md`, "Guarded writes"): the store
//! refuses it once the lock has moved on. `get` and `list` read the store
//! as it is. The agent (`putex run`) answers its hooks the same way, as a
//! `KvHolder` of its own.
//!
//! One JSON object per line each way: a [`KvRequest`], then its
//! [`KvAnswer`]. The socket is made in the keeper directory (mode 0600,
//! like the keeper's) and removed when the section ends.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::shared::Shared;
use crate::clock;
use crate::locks::guard::{self, Guard, GuardError, Tenure};
use crate::store::{AnyStore, Token};

/// Whoever answers on a socket: a section, or an agent for its hooks.
pub(crate) trait KvHolder: Send + Sync + 'static {
    /// The store the keys are read from.
    fn store(&self) -> &AnyStore;
    /// The guard of the current tenure, while the lock is held.
    fn guard(&self) -> Option<Guard>;
}

/// The environment variable that tells CMD where its section answers.
pub const KV_SOCKET_VAR: &str = "PUTEX_KV_SOCKET";

/// The most a request line may hold (a value of up to 512 KiB, as JSON).
const MAX_REQUEST: usize = 1 << 20;

/// What CMD asks of its section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum KvRequest {
    /// A guarded write of `value` at `kv.<key>`.
    Put {
        /// The caller's key.
        key: String,
        /// The value, UTF-8 text.
        value: String,
    },
    /// A guarded delete of `kv.<key>`.
    Delete {
        /// The caller's key.
        key: String,
    },
    /// The value at `kv.<key>`, as the store has it now.
    Get {
        /// The caller's key.
        key: String,
    },
    /// The caller's keys that start with `prefix`, as the store has them now.
    List {
        /// What the keys start with (empty: all).
        #[serde(default)]
        prefix: String,
    },
}

/// How a [`KvRequest`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvOutcome {
    /// Done (written, deleted, or read: `value`).
    Ok,
    /// `get`: no such key.
    Absent,
    /// The section no longer holds the lock: nothing was written.
    NotHeld,
    /// A key or value the store cannot take, or a request not understood.
    Invalid,
    /// The store did not answer in time: a write may or may not have landed.
    Unknown,
}

/// The section's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvAnswer {
    /// How it went.
    pub outcome: KvOutcome,
    /// For people, when it did not go well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `get`: the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `list`: the keys, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
}

impl KvAnswer {
    fn of(outcome: KvOutcome, message: impl Into<String>) -> KvAnswer {
        KvAnswer {
            outcome,
            message: Some(message.into()),
            value: None,
            keys: None,
        }
    }

    fn ok() -> KvAnswer {
        KvAnswer {
            outcome: KvOutcome::Ok,
            message: None,
            value: None,
            keys: None,
        }
    }
}

/// Asks the section listening at `socket`.
pub async fn ask(socket: &Path, request: &KvRequest) -> std::io::Result<KvAnswer> {
    let stream = UnixStream::connect(socket).await?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    serde_json::from_str(&answer)
        .map_err(|e| std::io::Error::other(format!("the section answered something else: {e}")))
}

/// A section's view of its winner's tenure, for its guards.
struct SectionTenure(Arc<Shared>);

impl Tenure for SectionTenure {
    fn newest(&self, tenure: Token) -> Option<Token> {
        let s = self.0.lock();
        let (token, held) = *s.records.get(&s.winner?)?;
        let live = s
            .licence_until
            .is_some_and(|until| clock::boot_time_now() < until)
            && s.lost.is_none()
            && !s.released;
        let ours = s.spawned.or(s.spawning) == Some(tenure)
            && token.epoch == tenure.epoch
            && token.revision >= tenure.revision;
        (held && live && ours).then_some(token)
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        // The section's own wake-ups are its loop's: look again shortly.
        tokio::time::sleep(Duration::from_millis(20)).boxed()
    }
}

/// The section's answering socket; removed on drop.
pub(crate) struct KvServer {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KvServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A socket bound for a section, not yet answering.
pub(crate) struct KvListener {
    path: PathBuf,
    listener: UnixListener,
}

impl KvListener {
    /// Binds `path` (mode 0600), replacing a leftover socket file.
    pub(crate) fn bind(path: PathBuf) -> std::io::Result<KvListener> {
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let closed = std::fs::Permissions::from_mode(0o600);
        if let Err(e) = std::fs::set_permissions(&path, closed) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(KvListener { path, listener })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl KvServer {
    /// Answers at `bound` for the section `shared`, whose slots' lock keys
    /// are `keys`.
    pub(super) fn start(shared: Arc<Shared>, keys: Vec<String>, bound: KvListener) -> KvServer {
        KvServer::answering(Arc::new(SectionKv { shared, keys }), bound)
    }

    /// Answers at `bound` for `holder`.
    pub(crate) fn answering(holder: Arc<dyn KvHolder>, bound: KvListener) -> KvServer {
        let KvListener { path, listener } = bound;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let holder = holder.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &*holder).await;
                });
            }
        });
        KvServer { path, task }
    }
}

/// A section as a [`KvHolder`].
struct SectionKv {
    shared: Arc<Shared>,
    keys: Vec<String>,
}

impl KvHolder for SectionKv {
    fn store(&self) -> &AnyStore {
        &self.shared.store
    }

    fn guard(&self) -> Option<Guard> {
        guard_of(&self.shared, &self.keys)
    }
}

async fn serve(stream: UnixStream, holder: &dyn KvHolder) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST as u64);
    reader.read_until(b'\n', &mut line).await?;
    let answer = match serde_json::from_slice::<KvRequest>(&line) {
        Ok(request) => answer(request, holder).await,
        Err(e) => KvAnswer::of(KvOutcome::Invalid, format!("not a request: {e}")),
    };
    let mut out = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
    out.push(b'\n');
    write.write_all(&out).await
}

/// A guarded write made while the tenure looked held here and refused
/// (the store found the lock record moved on): said in the log, since it
/// means this holder learned of its loss from the store.
fn refused_said<T>(key: &str, written: Result<T, GuardError>) -> Result<T, GuardError> {
    if let Err(GuardError::NotHeld) = &written {
        tracing::warn!(key, "guarded write refused: the lock record moved on (another holder, a release or a revocation)");
    }
    written
}

/// The guard of the section's current tenure, if it holds the lock.
fn guard_of(shared: &Arc<Shared>, keys: &[String]) -> Option<Guard> {
    let (winner, tenure) = {
        let s = shared.lock();
        (s.winner?, s.spawned.or(s.spawning)?)
    };
    Some(Guard::of(
        shared.store.clone(),
        keys.get(winner)?.clone(),
        tenure,
        Arc::new(SectionTenure(shared.clone())),
        &shared.opts.timing,
    ))
}

async fn answer(request: KvRequest, holder: &dyn KvHolder) -> KvAnswer {
    let written = match &request {
        KvRequest::Get { key } => {
            return match guard::get(holder.store(), key).await {
                Ok(Some(value)) => match String::from_utf8(value) {
                    Ok(value) => KvAnswer {
                        value: Some(value),
                        ..KvAnswer::ok()
                    },
                    Err(_) => KvAnswer::of(KvOutcome::Invalid, format!("{key}: not UTF-8 text")),
                },
                Ok(None) => KvAnswer::of(KvOutcome::Absent, format!("{key}: no such key")),
                Err(e) if e.is_unknown() => KvAnswer::of(KvOutcome::Unknown, e.to_string()),
                Err(e) => KvAnswer::of(KvOutcome::Invalid, e.to_string()),
            };
        }
        KvRequest::List { prefix } => {
            return match guard::list(holder.store(), prefix).await {
                Ok(listed) => KvAnswer {
                    keys: Some(listed.into_iter().map(|(k, _)| k).collect()),
                    ..KvAnswer::ok()
                },
                Err(e) if e.is_unknown() => KvAnswer::of(KvOutcome::Unknown, e.to_string()),
                Err(e) => KvAnswer::of(KvOutcome::Invalid, e.to_string()),
            };
        }
        KvRequest::Put { key, value } => match holder.guard() {
            Some(g) => refused_said(key, g.put(key, value.as_bytes()).await),
            None => Err(GuardError::NotHeld),
        },
        KvRequest::Delete { key } => match holder.guard() {
            Some(g) => refused_said(key, g.delete(key).await),
            None => Err(GuardError::NotHeld),
        },
    };
    match written {
        Ok(_) => KvAnswer::ok(),
        Err(e @ GuardError::NotHeld) => KvAnswer::of(KvOutcome::NotHeld, e.to_string()),
        Err(e @ GuardError::Invalid(_)) => KvAnswer::of(KvOutcome::Invalid, e.to_string()),
        Err(e) => KvAnswer::of(KvOutcome::Unknown, e.to_string()),
    }
}
