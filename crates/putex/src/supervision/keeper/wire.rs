//! The wire protocol between the agent and its keeper: one JSON object
//! per line (see the module docs of [`super`]).

use super::*;

/// A request to the keeper (see the module docs for the wire form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ToKeeper {
    /// Start a tenure.
    Arm {
        id: u64,
        /// Boot-time nanoseconds.
        deadline_ns: u64,
        /// The tenure's fencing token, for the deactivate hook's environment.
        token: Option<Token>,
        /// The previous holder, for the deactivate hook's environment.
        previous: Option<String>,
    },
    /// Move the deadline.
    Extend {
        id: u64,
        /// Boot-time nanoseconds.
        deadline_ns: u64,
    },
    /// End the tenure without a stop.
    Disarm { id: u64 },
    /// Start the child (child mode).
    SpawnChild {
        id: u64,
        /// Program and arguments.
        argv: Vec<String>,
        /// Extra environment.
        env: Vec<(String, String)>,
    },
    /// Stop the service.
    Stop {
        id: u64,
        /// On the wire by its name: `startup`, `graceful` or `emergency`
        /// (as the hooks' `PUTEX_STOP` spells it).
        #[serde(with = "stop_kind_by_name")]
        kind: StopKind,
    },
    /// Send a signal to the child's process group.
    Signal {
        id: u64,
        /// Signal number.
        signal: i32,
    },
    /// Report the keeper's state.
    Status { id: u64 },
    /// Exit; refused while armed or while the child's tree lives.
    Shutdown { id: u64 },
}

/// A message from the keeper: a reply (with `id`) or an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum FromKeeper {
    /// Done.
    Ok { id: u64 },
    /// Not done, on purpose.
    Refused { id: u64, reason: String },
    /// The child runs.
    Spawned {
        id: u64,
        pid: i32,
        /// Where its tree lives.
        tree: TreeInfo,
    },
    /// A stop finished.
    Stopped {
        id: u64,
        /// Proof: the hook exited 0, or the whole tree is gone.
        ok: bool,
    },
    /// The keeper's state.
    Status { id: u64, status: KeeperStatus },
    /// The request failed.
    Error { id: u64, message: String },
    /// Event: the deadline passed and the emergency stop was made.
    Fired {
        /// Whether the stop is proven.
        ok: bool,
    },
    /// Event: the child exited on its own.
    ChildExited {
        /// Exit code.
        code: Option<i32>,
        /// Terminating signal.
        signal: Option<i32>,
    },
    /// Event: what identifies the service's tree now.
    Tree {
        /// Members, groups, sessions, cgroup.
        snapshot: TreeSnapshot,
    },
}

impl FromKeeper {
    pub(super) fn id(&self) -> Option<u64> {
        match self {
            FromKeeper::Ok { id }
            | FromKeeper::Refused { id, .. }
            | FromKeeper::Spawned { id, .. }
            | FromKeeper::Stopped { id, .. }
            | FromKeeper::Status { id, .. }
            | FromKeeper::Error { id, .. } => Some(*id),
            FromKeeper::Fired { .. } | FromKeeper::ChildExited { .. } | FromKeeper::Tree { .. } => {
                None
            }
        }
    }
}

/// What `status` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeeperStatus {
    pub pid: i32,
    /// The lock it keeps.
    pub lock: String,
    /// The boot-time clock when the status was taken (ns).
    pub now_ns: u64,
    /// The armed deadline (ns), if any.
    pub deadline_ns: Option<u64>,
    /// Whether the keeper fired (and has not been re-armed since).
    pub fired: bool,
    /// `cgroup` or `subreaper`.
    pub mode: String,
    /// The child, if one was spawned.
    pub child: Option<ChildStatus>,
    /// Whether a stop is running.
    pub stopping: bool,
    /// What identifies the service's tree (see [`FromKeeper::Tree`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<TreeSnapshot>,
}

/// The child as `status` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildStatus {
    pub pid: i32,
    /// Where its tree lives.
    pub tree: TreeInfo,
    /// How it exited, if it did.
    pub exit: Option<Exit>,
    /// Whether any process of its tree still lives.
    pub tree_alive: bool,
}

/// [`StopKind`] as its name, the one the hooks see in `PUTEX_STOP`; any
/// other name is refused when the request is read.
mod stop_kind_by_name {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::StopKind;
    use crate::supervision::hooks::stop_name;

    const NAMES: [StopKind; 3] = [StopKind::Startup, StopKind::Graceful, StopKind::Emergency];

    pub(super) fn serialize<S: Serializer>(kind: &StopKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(stop_name(*kind))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<StopKind, D::Error> {
        let name = String::deserialize(d)?;
        NAMES
            .into_iter()
            .find(|k| stop_name(*k) == name)
            .ok_or_else(|| D::Error::unknown_variant(&name, &["startup", "graceful", "emergency"]))
    }
}
