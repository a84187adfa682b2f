//! How a call reaches etcd: made again while it never reached etcd (a
//! member that refuses connections, one without a raft leader), never
//! once etcd took it; a write run on a task of its own, so that a caller
//! giving up does not cancel it half-sent; and its failure classified —
//! refused before it was proposed (a configuration error that names the
//! cause) or unknown (it may have been applied).

use std::time::Duration;

use super::client::Error as ClientError;
use crate::store::{Op, StoreError};

/// Classifies a client error: refused before it was proposed (a
/// configuration problem), or anything else (unknown: it may have been
/// applied).
pub(super) fn client_error(op: Op, key: &str, e: ClientError) -> StoreError {
    use tonic::Code;
    match e {
        ClientError::Status(status) => match status.code() {
            Code::PermissionDenied
            | Code::Unauthenticated
            | Code::InvalidArgument
            | Code::OutOfRange
            | Code::Unimplemented => StoreError::config(format!(
                "etcd refused {op} {key}: {} (check the user's permissions on the prefix, the password or certificate, and the etcd version >= 3.5)",
                status.message()
            )),
            Code::ResourceExhausted if status.message().contains("no space") => {
                StoreError::config(format!(
                    "etcd refused {op} {key}: {} (the cluster is out of space: compact and defragment it, then disarm the alarm)",
                    status.message()
                ))
            }
            _ => StoreError::unknown(op, key, format!("etcd: {}", status.message())),
        },
        ClientError::Config(m) => StoreError::config(format!("etcd {op} {key}: {m}")),
        other @ ClientError::Internal(_) => StoreError::unknown(op, key, format!("etcd: {other}")),
    }
}

/// Runs a write on a task of its own, so that a caller whose deadline
/// passed does not cancel it half-sent: it goes on to its end, landed or
/// not, and the caller's outcome is unknown either way (H4 finds it).
pub(super) async fn detached<C, F, T>(
    client: C,
    call: impl FnOnce(C) -> F,
) -> Result<T, ClientError>
where
    F: std::future::Future<Output = Result<T, ClientError>> + Send + 'static,
    T: Send + 'static,
{
    match tokio::spawn(call(client)).await {
        Ok(r) => r,
        Err(e) => Err(ClientError::Internal(format!(
            "the write's task ended: {e}"
        ))),
    }
}

/// How often a call that was never sent is tried again. The client's
/// balancer keeps a member that refuses connections among its choices and
/// picks it for about two calls in three (it looks idle), so with one
/// member of three down a call can meet it several times in a row; each
/// such try fails at once (a refused connection), and 50 of them in a row
/// happen about once in a billion calls. A member that does not answer at
/// all is skipped by the balancer while it reconnects (up to the connect
/// timeout); the call's deadline bounds everything.
const UNSENT_RETRIES: u32 = 50;

/// How many of those follow one another at once; the later ones wait
/// [`unsent_pause`] first. With every member down (an outage, a restart),
/// 50 tries at once made each call of an agent connect 50 times in a
/// millisecond or two: about 1,300 connections a second from one agent,
/// half a core, for as long as the outage lasted.
const UNSENT_AT_ONCE: u32 = 8;

/// The pause before the `tries`-th try of a call never sent, once
/// [`UNSENT_AT_ONCE`] have failed: doubling from 1 ms up to 50 ms. With one
/// member of three down, eight tries in a row meet it about once in 26
/// calls, and the pauses then cost a few milliseconds.
fn unsent_pause(tries: u32) -> Duration {
    let doubling = tries.saturating_sub(UNSENT_AT_ONCE + 1).min(6);
    Duration::from_millis(1 << doubling).min(Duration::from_millis(50))
}

/// How long a call refused for want of a leader is made again (every
/// [`NO_LEADER_PAUSE`]): another member may have one (the balancer picks
/// at random), and an election takes one to two election timeouts (1 s
/// each by default). The caller's deadline ends it sooner; a write, which
/// runs detached from its caller, stops trying after this.
const NO_LEADER_PATIENCE: Duration = Duration::from_secs(2);

/// The pause between tries of a call refused for want of a leader.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(10);

/// Calls again when a call failed before etcd took it:
///
/// - it failed connecting (up to [`UNSENT_RETRIES`] more times, the
///   first [`UNSENT_AT_ONCE`] at once, then after [`unsent_pause`]): the
///   client spreads calls over every member, and one that is down answers
///   "tcp connect error" to the calls that pick it, until its connection
///   is given up;
/// - the member that took it has no raft leader (for up to
///   [`NO_LEADER_PATIENCE`]). The handle requires one
///   of every member (`open.rs`), and etcd checks that before the call's
///   handler runs: nothing was proposed. A member cut off from the quorum
///   so refuses at once instead of holding the call until the caller's
///   deadline, and the next try goes wherever the balancer sends it.
///
/// A call that etcd took is never repeated (a write may have landed).
pub(crate) async fn retry_unsent<T, F, Fut>(mut call: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let started = tokio::time::Instant::now();
    let mut tries = 0;
    loop {
        match call().await {
            Err(e) if no_leader(&e) && started.elapsed() < NO_LEADER_PATIENCE => {
                tokio::time::sleep(NO_LEADER_PAUSE).await;
            }
            Err(e) if tries < UNSENT_RETRIES && never_sent(&e) => {
                tries += 1;
                if tries > UNSENT_AT_ONCE {
                    tokio::time::sleep(unsent_pause(tries)).await;
                }
            }
            other => return other,
        }
    }
}

/// Whether a call failed connecting, so nothing of it reached etcd.
fn never_sent(e: &ClientError) -> bool {
    let ClientError::Status(s) = e else {
        return false;
    };
    let text = s.message();
    [
        "tcp connect error",
        "Connection refused",
        "error trying to connect",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// Whether a member refused a call for want of a raft leader (etcd's
/// `ErrGRPCNoLeader`, the answer when a required leader is absent).
fn no_leader(e: &ClientError) -> bool {
    matches!(e, ClientError::Status(s)
        if s.code() == tonic::Code::Unavailable && s.message().contains("no leader"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_never_sent_is_tried_again_at_once_then_after_growing_pauses() {
        let ms = Duration::from_millis;
        assert_eq!(unsent_pause(UNSENT_AT_ONCE + 1), ms(1));
        assert_eq!(unsent_pause(UNSENT_AT_ONCE + 2), ms(2));
        assert_eq!(unsent_pause(UNSENT_AT_ONCE + 6), ms(32));
        assert_eq!(unsent_pause(UNSENT_AT_ONCE + 7), ms(50));
        assert_eq!(unsent_pause(UNSENT_RETRIES), ms(50));
    }
}
