//! A member's answers to holders' asks (F1, F5): `POST /v1/failsafe/{lock}`
//! on the agent's `--http` listener.
//!
//! The handler checks the ask's MAC ([`super::auth`]), that it names this
//! lock and this member (node and machine), and passes it to the core as
//! `Input::Failsafe`; the core answers from its state at once — no hook
//! runs on the path — and the answer goes back signed, grant or refusal.
//! An ask the core has not answered within [`ANSWER_WITHIN`] gets a `503`
//! (a holder counts that member as not granting, F3).
//!
//! | status | when |
//! |---|---|
//! | 200 | a signed [`SignedAnswer`]: `granted`, or not and `why` |
//! | 400 | the body is no ask, or its token is no `EPOCH:REVISION` |
//! | 401 | its MAC does not verify under this member's key |
//! | 404 | failsafe is off on this agent, or it runs another lock |
//! | 409 | it names another member (node or machine) |
//! | 503 | the agent's state machine did not answer in time, or is gone |

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use parking_lot::Mutex;
use putex_core::{FailsafeAnswer, FailsafeRequest, Input, Token};
use tokio::sync::oneshot;

use super::auth::{Answer, FailsafeKey, Peer, SignedAnswer, SignedAsk};
use crate::driver::InputSender;
use crate::observe::metrics::Metrics;

/// How long an ask waits for the core's answer. The core answers at once;
/// this bounds a wedged or busy agent, well inside a holder's round (its
/// asks' deadline is the store timeout, 2R/5).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// What the agent's failsafe listener needs: the key, who this member is,
/// and the way into its state machine.
pub struct Gate {
    key: FailsafeKey,
    lock: String,
    me: Peer,
    inject: InputSender,
    pending: Mutex<HashMap<u64, oneshot::Sender<FailsafeAnswer>>>,
    next: AtomicU64,
    metrics: Metrics,
}

/// An ask the gate did not pass to the core, or could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// The MAC does not verify.
    #[error("{0}")]
    Unauthenticated(#[from] super::auth::AuthError),
    /// Another lock.
    #[error("this agent runs lock {ours:?}, not {asked:?}")]
    OtherLock {
        /// This agent's lock.
        ours: String,
        /// The ask's.
        asked: String,
    },
    /// Another member.
    #[error("the ask is for {asked_node} ({asked_machine}); this is {node} ({machine})")]
    OtherMember {
        /// The node the ask names.
        asked_node: String,
        /// The machine it names.
        asked_machine: String,
        /// This member's node.
        node: String,
        /// This member's machine.
        machine: String,
    },
    /// A token that is not `EPOCH:REVISION`.
    #[error("the token {0:?} is not EPOCH:REVISION")]
    BadToken(String),
    /// The state machine did not answer.
    #[error("the agent did not answer within {ANSWER_WITHIN:?}")]
    NoAnswer,
}

impl Rejected {
    /// The HTTP status the table in the module docs gives it.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejected::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Rejected::OtherLock { .. } => StatusCode::NOT_FOUND,
            Rejected::OtherMember { .. } => StatusCode::CONFLICT,
            Rejected::BadToken(_) => StatusCode::BAD_REQUEST,
            Rejected::NoAnswer => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Gate {
    /// A gate for `lock`, answering as `me` under `key`, asking the state
    /// machine through `inject`, counting its answers in `metrics` (F6).
    pub fn new(
        key: FailsafeKey,
        lock: String,
        me: Peer,
        inject: InputSender,
        metrics: Metrics,
    ) -> Gate {
        Gate {
            key,
            lock,
            me,
            inject,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            metrics,
        }
    }

    /// Answers one signed ask: the core's grant or refusal, signed.
    pub async fn answer(&self, signed: &SignedAsk) -> Result<SignedAnswer, Rejected> {
        let result = self.ask_core(signed).await;
        self.metrics.failsafe_answer(match &result {
            Ok(a) if a.answer.granted => "granted",
            Ok(_) => "refused",
            Err(_) => "rejected",
        });
        if let Err(e) = &result {
            tracing::warn!(error = %e, "failsafe ask rejected");
        }
        result
    }

    async fn ask_core(&self, signed: &SignedAsk) -> Result<SignedAnswer, Rejected> {
        let ask = self.key.verify_ask(signed)?;
        if ask.lock != self.lock {
            return Err(Rejected::OtherLock {
                ours: self.lock.clone(),
                asked: ask.lock.clone(),
            });
        }
        if ask.member != self.me {
            return Err(Rejected::OtherMember {
                asked_node: ask.member.node.clone(),
                asked_machine: ask.member.machine.clone(),
                node: self.me.node.clone(),
                machine: self.me.machine.clone(),
            });
        }
        let token =
            Token::parse(&ask.token).ok_or_else(|| Rejected::BadToken(ask.token.clone()))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        let request = FailsafeRequest {
            id,
            node: ask.holder.node.clone(),
            machine: ask.holder.machine.clone(),
            instance: ask.holder.instance.clone(),
            token,
        };
        let answer = match self.inject.unbounded_send(Input::Failsafe(request)) {
            Ok(()) => tokio::time::timeout(ANSWER_WITHIN, rx)
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        };
        self.pending.lock().remove(&id);
        let answer = answer.ok_or(Rejected::NoAnswer)?;
        let (granted, why) = match answer {
            FailsafeAnswer::Granted => (true, None),
            FailsafeAnswer::Refused(why) => (false, Some(why.to_string())),
        };
        Ok(self.key.sign_answer(&Answer {
            ask: ask.clone(),
            granted,
            why,
        }))
    }

    /// The core's answer to the ask injected with `id` (the driver's
    /// `Output::FailsafeAnswer`). An answer after the wait gave up is
    /// dropped.
    pub fn deliver(&self, id: u64, answer: FailsafeAnswer) {
        if let Some(tx) = self.pending.lock().remove(&id) {
            let _ = tx.send(answer);
        }
    }
}
