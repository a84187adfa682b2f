//! How a call of a handle is made: admitted in turn
//! ([`CALLS_UNDER_WAY`](super::CALLS_UNDER_WAY) at a time, first come first
//! served, each within its own deadline), and its answer noted, so that a
//! handle whose calls go unanswered on a server that still answers it (one
//! cut off from its cluster) reconnects to another ([`stuck`]).

use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;

use super::{stuck, NatsStore};
use crate::store::{with_deadline, Op, StoreError};

impl NatsStore {
    /// Runs one call of this handle within `timeout`: first the wait for
    /// its turn ([`CALLS_UNDER_WAY`](super::CALLS_UNDER_WAY), first come
    /// first served), then the call that `start` makes. The call's state
    /// (kilobytes: the client's request futures) is allocated only once it
    /// is admitted; a call waiting its turn is a few dozen bytes. Helpers a
    /// call makes take no turn of their own, so a call never waits on
    /// itself.
    pub(super) async fn call<'a, T>(
        &'a self,
        op: Op,
        key: &'a str,
        timeout: Duration,
        start: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = with_deadline(op, key, timeout, async {
            let _turn = self
                .inner
                .admission
                .acquire()
                .await
                .map_err(|e| StoreError::unknown(op, key, e))?;
            start().await
        })
        .await;
        let call = match op {
            Op::Get | Op::Open | Op::Watch => stuck::Call::Read,
            Op::Create | Op::Update | Op::Put | Op::Delete | Op::Guarded => stuck::Call::Write,
        };
        let answered = result.as_ref().map_or_else(|e| !e.is_unknown(), |_| true);
        self.note_answer(call, answered, started);
        result
    }

    /// Notes whether a call was answered; reconnects (to another server)
    /// when no write, or no read, has been for [`stuck::STUCK_AFTER`]
    /// although the client is connected, if it knows of another server.
    fn note_answer(&self, call: stuck::Call, answered: bool, started: std::time::Instant) {
        let now = std::time::Instant::now();
        if !self.inner.stuck.note(call, answered, started, now) {
            return;
        }
        let client = &self.inner.client;
        let info = client.server_info();
        let others_known = self.inner.servers > 1 || !info.connect_urls.is_empty();
        if client.connection_state() != async_nats::connection::State::Connected || !others_known {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            // A server that answers nothing at all is left to the client's
            // pings (it may be the client's own network that is cut, and a
            // reconnect would then wait out a connection timeout past the
            // cut's end); one that answers but not its calls is cut off
            // from its cluster.
            if !store.server_echoes().await {
                tracing::debug!(
                    server = %format_args!("{}:{}", info.host, info.port),
                    "NATS calls unanswered and the server silent: left to the pings"
                );
                return;
            }
            tracing::warn!(
                server = %format_args!("{}:{}", info.host, info.port),
                after = ?stuck::STUCK_AFTER,
                "NATS calls unanswered although the server answers (cut off from its cluster?): reconnecting to another"
            );
            store.inner.choice.leave();
            if let Err(e) = store.inner.client.force_reconnect().await {
                tracing::debug!(error = %e, "the reconnect could not be asked for");
            }
        });
    }

    /// Whether the server connected to answers at all: a message this
    /// handle publishes to a subject of its own comes back through the
    /// server within [`stuck::ECHO_WITHIN`]. False when it does not, or the
    /// probe cannot be made (a user not allowed to publish to its inbox).
    async fn server_echoes(&self) -> bool {
        use futures::FutureExt;
        let client = &self.inner.client;
        let mut echo = self.inner.echo.lock().await;
        if echo.is_none() {
            let subject = format!("{}.alive", client.new_inbox());
            match client.subscribe(subject.clone()).await {
                Ok(sub) => *echo = Some((subject, sub)),
                Err(_) => return false,
            }
        }
        let Some((subject, sub)) = echo.as_mut() else {
            return false;
        };
        // An echo of an earlier probe that came late.
        while let Some(Some(_)) = sub.next().now_or_never() {}
        if client.publish(subject.clone(), "".into()).await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(stuck::ECHO_WITHIN, sub.next()).await,
            Ok(Some(_))
        )
    }
}
