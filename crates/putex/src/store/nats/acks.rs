//! Writes and their answers: one subscription per store handle.
//!
//! A write to a JetStream bucket is a publish with a reply subject; the
//! stream answers on it with an acknowledgement (the revision written) or
//! an error. The NATS client's own JetStream publish makes a new inbox name
//! for every write, takes a permit, and runs two timers of its own: at
//! 10,000 writes a second, half as much CPU again as one subscription for
//! every answer (session 32 in `docs/performance-history.md`:
//! `#session-32-2026-12-01-one-subscription-for-every-writes-answer-the-floors-under-the-last-two-targets`).
//! Here every write of a handle is answered on one wildcard subscription
//! made when the handle opens, `<inbox>.<n>` for the n-th write, and a task
//! hands each answer to the write waiting for it.
//!
//! What a write's outcome means is the store contract's: an answer that
//! says "wrong last sequence" (10071, or 10164 from a replicated stream) is
//! a **conflict** — definitely not applied; anything else that is not an
//! acknowledgement (no responders during a leader election, another error,
//! no answer before the caller's deadline, a closed connection) is
//! **unknown** — it may have landed. The deadline is the caller's
//! ([`with_deadline`](crate::store::with_deadline)): a write whose caller
//! gave up forgets its entry, and an answer that comes after that is
//! dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use async_nats::{HeaderMap, StatusCode};
use futures::StreamExt;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_CONSTANT};

/// The writes waiting for their answer, by number; `None` once the
/// subscription ended (no answer will come: writes fail at once).
type Waiting = Mutex<Option<HashMap<u64, oneshot::Sender<async_nats::Message>>>>;

/// How a write ended, before it is named by its operation and key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum WriteError {
    /// The stream refused the write's expected revision: not applied.
    Conflict,
    /// It may or may not have landed; the text says why.
    Unknown(String),
}

/// One handle's writes and the subscription their answers come on.
pub(super) struct Acks {
    client: async_nats::Client,
    /// `<inbox>.`: a write's reply subject is this and its number.
    base: String,
    next: AtomicU64,
    waiting: Arc<Waiting>,
    /// Ends the task that hands out the answers (with the handle).
    _stop: DropGuard,
}

impl Acks {
    /// Subscribes to the answers of this handle's writes. The subscription
    /// is in place on the server before any write this client sends after
    /// it (one connection keeps its order), and the client renews it after
    /// every reconnect.
    pub(super) async fn start(
        client: &async_nats::Client,
    ) -> Result<Acks, async_nats::SubscribeError> {
        let base = format!("{}.", client.new_inbox());
        let subscription = client.subscribe(format!("{base}*")).await?;
        let waiting: Arc<Waiting> = Arc::new(Mutex::new(Some(HashMap::new())));
        let stop = CancellationToken::new();
        tokio::spawn(hand_out(
            subscription,
            base.clone(),
            Arc::downgrade(&waiting),
            stop.clone(),
        ));
        Ok(Acks {
            client: client.clone(),
            base,
            next: AtomicU64::new(1),
            waiting,
            _stop: stop.drop_guard(),
        })
    }

    /// How many writes wait for their answer.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.lock().as_ref().map_or(0, HashMap::len)
    }

    /// Publishes `payload` to `subject` and waits for the stream's answer:
    /// the revision written.
    pub(super) async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Vec<u8>,
    ) -> Result<u64, WriteError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.waiting.lock().as_mut() {
            Some(waiting) => waiting.insert(n, tx),
            None => return Err(unknown("the NATS client is closed")),
        };
        // Forgets the entry however this ends (the caller's deadline drops
        // this future); after an answer there is nothing left to forget.
        let _entry = Entry {
            waiting: &self.waiting,
            n,
        };
        self.client
            .publish_with_reply_and_headers(
                subject,
                format!("{}{n}", self.base),
                headers,
                payload.into(),
            )
            .await
            .map_err(|e| unknown(format_args!("the write was not handed to the client: {e}")))?;
        match rx.await {
            Ok(answer) => classify(&answer),
            Err(_) => Err(unknown("the NATS connection closed before the answer")),
        }
    }
}

impl Acks {
    /// Publishes `payload` to `subject` without a reply: a message of an
    /// atomic batch before its last, which the stream does not answer.
    pub(super) async fn send(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Vec<u8>,
    ) -> Result<(), WriteError> {
        self.client
            .publish_with_headers(subject, headers, payload.into())
            .await
            .map_err(|e| unknown(format_args!("the write was not handed to the client: {e}")))
    }
}

/// A write's place among the waiting, removed when the write ends.
struct Entry<'a> {
    waiting: &'a Waiting,
    n: u64,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = self.waiting.lock().as_mut() {
            waiting.remove(&self.n);
        }
    }
}

/// Hands every answer to the write waiting for it, until the handle is gone
/// or the subscription ends (the client closed); then the writes still
/// waiting fail, and later ones fail at once.
async fn hand_out(
    mut answers: async_nats::Subscriber,
    base: String,
    waiting: Weak<Waiting>,
    stop: CancellationToken,
) {
    loop {
        let answer = tokio::select! {
            answer = answers.next() => answer,
            () = stop.cancelled() => return,
        };
        let Some(waiting) = waiting.upgrade() else {
            return;
        };
        let Some(answer) = answer else {
            // Dropping the senders tells every waiting write.
            waiting.lock().take();
            return;
        };
        let n = answer
            .subject
            .strip_prefix(base.as_str())
            .and_then(|n| n.parse::<u64>().ok());
        let sender = n.and_then(|n| waiting.lock().as_mut()?.remove(&n));
        if let Some(sender) = sender {
            let _ = sender.send(answer);
        }
    }
}

/// The stream's answer to a write.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    seq: u64,
    error: Option<Refusal>,
}

#[derive(Deserialize)]
struct Refusal {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

fn unknown(why: impl std::fmt::Display) -> WriteError {
    WriteError::Unknown(why.to_string())
}

/// What an answer says of the write: its revision, a conflict, or unknown.
fn classify(answer: &async_nats::Message) -> Result<u64, WriteError> {
    match answer.status {
        None | Some(StatusCode::OK) => {}
        Some(StatusCode::NO_RESPONDERS) => {
            return Err(unknown(
                "no responders: no stream takes writes to the bucket now (a leader election?)",
            ))
        }
        Some(status) => {
            return Err(unknown(format_args!(
                "status {status} {}",
                answer.description.as_deref().unwrap_or("")
            )))
        }
    }
    parse_answer(&answer.payload)
}

/// The body of an answer: `{"stream":…,"seq":N}` or `{"error":{…}}`.
fn parse_answer(body: &[u8]) -> Result<u64, WriteError> {
    let answer: Answer = serde_json::from_slice(body).map_err(|e| {
        unknown(format_args!(
            "an answer that is not a JetStream acknowledgement ({e}): {}",
            String::from_utf8_lossy(body)
        ))
    })?;
    match answer.error {
        Some(Refusal {
            err_code: ERR_WRONG_LAST_SEQUENCE | ERR_WRONG_LAST_SEQUENCE_CONSTANT,
            ..
        }) => Err(WriteError::Conflict),
        Some(r) => Err(unknown(format_args!(
            "{} (JetStream error {})",
            r.description, r.err_code
        ))),
        None if answer.seq == 0 => Err(unknown(format_args!(
            "an acknowledgement without a revision: {}",
            String::from_utf8_lossy(body)
        ))),
        None => Ok(answer.seq),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgements_give_the_revision() {
        assert_eq!(parse_answer(br#"{"stream":"KV_putex","seq":42}"#), Ok(42));
        assert_eq!(
            parse_answer(br#"{"stream":"KV_putex","domain":"hub","seq":7,"duplicate":false}"#),
            Ok(7)
        );
    }

    #[test]
    fn wrong_last_sequence_is_a_conflict_from_any_stream() {
        // 10164 is what a replicated stream answers.
        for code in [10071, 10164] {
            let body = format!(
                r#"{{"error":{{"code":400,"err_code":{code},"description":"wrong last sequence: 5"}},"stream":"KV_putex","seq":0}}"#
            );
            assert_eq!(parse_answer(body.as_bytes()), Err(WriteError::Conflict));
        }
    }

    #[test]
    fn everything_else_may_have_landed() {
        for body in [
            r#"{"error":{"code":503,"err_code":10077,"description":"JetStream resource limits exceeded for account"}}"#,
            r#"{"error":{"code":500,"err_code":10163,"description":"expected stream sequence does not match"}}"#,
            r#"{"error":{"code":400}}"#,
            r#"{"stream":"KV_putex"}"#,
            "",
            "not json",
        ] {
            assert!(
                matches!(parse_answer(body.as_bytes()), Err(WriteError::Unknown(_))),
                "{body:?}"
            );
        }
        let described = parse_answer(
            br#"{"error":{"code":503,"err_code":10077,"description":"resource limits exceeded"}}"#,
        );
        assert_eq!(
            described,
            Err(WriteError::Unknown(
                "resource limits exceeded (JetStream error 10077)".into()
            ))
        );
    }
}
