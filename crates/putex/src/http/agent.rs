//! The failover agent's HTTP endpoints (`putex run --http ADDR`): health
//! checks for load balancers and orchestrators, and metrics.
//!
//! | route | 200 when | otherwise |
//! |---|---|---|
//! | `GET /primary` | this node is `active` and its activate hook (or child) succeeded | 503 |
//! | `GET /replica` | this node is `standby` and its last health check passed | 503 |
//! | `GET /replica?lag=16MB` | the same, and this node's `--position` is at most that far behind the active holder's (bytes, or PostgreSQL's units `kB` `MB` `GB` `TB`, 1024-based) | 503; 400 for a bound that is not a size |
//! | `GET /read-only` | `/primary` or `/replica` would be 200 (`?lag=` bounds a standby's as above) | 503 |
//! | `GET /health` | always (the body says role and health) | — |
//! | `GET /liveness` | the agent's state machine went round its loop recently (3 R + 1 s) | 503 |
//! | `GET /readiness` | the agent has started and made its first decision | 503 |
//! | `GET /metrics` | always: OpenMetrics text ([`crate::observe::metrics`]) | — |
//! | `GET /ui` | the web status page of the lock ([`crate::report::web`]) | — |
//! | `POST /v1/failsafe/{lock}` | `--failsafe`: a holder's signed ask, answered signed ([`crate::failsafe::member`]) | 401, 404, 409, 503 |
//!
//! Every status route answers with the same JSON body ([`AgentSnapshot`]),
//! so `curl` shows why a check fails. HAProxy's `option httpchk GET /primary`
//! sends traffic to the active node only, `GET /replica?lag=16MB` to the
//! standbys that keep up (Patroni's convention, and its `lag` units).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

/// What the endpoints report, taken from the agent at each request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentSnapshot {
    pub lock: String,
    pub node: String,
    /// The role: `starting`, `standby`, `confirming`, `active`, …
    pub role: String,
    /// Active and the service is up (activate hook or child succeeded).
    pub primary: bool,
    /// Whether the last health check passed (`None` before the first).
    pub healthy: Option<bool>,
    /// The fencing token while holding the lock.
    pub token: Option<String>,
    /// Started and made its first decision.
    pub ready: bool,
    /// The state machine is making progress.
    pub live: bool,
    /// This node's last `--position` (`None` without one).
    pub position: Option<u64>,
    /// A standby's: how far its position is behind the active holder's, as
    /// the holder last published it (`None` when either is unknown).
    pub lag: Option<u64>,
    /// A failsafe holder's last round of asks since its store renewals
    /// stopped landing (F6); absent while the store answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failsafe: Option<FailsafeView>,
}

/// A failsafe holder's last round of asks (F6): `/health` during a store
/// outage says whether the service runs on its members' grants.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FailsafeView {
    /// Every member granted the last round: the licence runs on grants.
    pub granted: bool,
    /// Since when the licence has run on grants (RFC 3339, UTC): the
    /// first round every member granted; absent if none has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// When the last round's verdicts were in (RFC 3339, UTC).
    pub at: String,
    /// Each member asked and what it answered: `granted`, `refused: …`,
    /// `unreachable: …`.
    pub members: Vec<MemberVerdict>,
}

/// One member's verdict in a failsafe round.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemberVerdict {
    /// The member's node.
    pub node: String,
    /// What it answered.
    pub verdict: String,
}

/// Something that can describe the agent right now.
pub trait AgentView: Send + Sync + 'static {
    /// The agent's current state.
    fn snapshot(&self) -> AgentSnapshot;
    /// Its metrics in OpenMetrics text format.
    fn metrics(&self) -> String;
    /// Its answers to holders' failsafe asks, with `--failsafe`.
    fn failsafe(&self) -> Option<Arc<crate::failsafe::member::Gate>> {
        None
    }
}

type View = Arc<dyn AgentView>;

/// The endpoints in the table above, answering from `view`.
pub fn router(view: View) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/ui") }))
        .route("/primary", get(primary))
        .route("/replica", get(replica))
        .route("/read-only", get(read_only))
        .route("/health", get(health))
        .route("/liveness", get(liveness))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics))
        .route("/v1/failsafe/{lock}", post(failsafe))
        .with_state(view)
}

/// Serves the endpoints, and the web status page ([`crate::report::web`]) of the
/// agent's lock, on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    view: View,
    page: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(view).merge(page))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Whether a state machine that last went round its loop `since` ago
/// counts as live for renewal interval `renew`.
pub fn live(since: Duration, renew: Duration) -> bool {
    since < renew * 3 + Duration::from_secs(1)
}

fn answer(ok: bool, snapshot: AgentSnapshot) -> Response {
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(snapshot)).into_response()
}

async fn primary(State(view): State<View>) -> Response {
    let s = view.snapshot();
    answer(s.primary, s)
}

/// `?lag=`: the most a standby may be behind to count as a replica.
#[derive(Debug, Default, Deserialize)]
struct LagBound {
    lag: Option<String>,
}

impl LagBound {
    /// The bound in bytes, or why it is none (for a 400).
    fn bytes(&self) -> Result<Option<u64>, String> {
        let Some(text) = &self.lag else {
            return Ok(None);
        };
        parse_size(text)
            .map(Some)
            .map_err(|why| format!("lag={text:?}: {why}\n"))
    }
}

/// A size as PostgreSQL writes one (and Patroni's `?lag=` takes): a whole
/// number of bytes, or one followed by `B`, `kB`, `MB`, `GB` or `TB`
/// (1024-based), with no space or one.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| {
        "not a size: a whole number of bytes, or one with kB, MB, GB or TB".to_string()
    })?;
    let scale: u64 = match unit.trim_start() {
        "" | "B" => 1,
        "kB" | "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        other => return Err(format!("unknown unit {other:?}: use B, kB, MB, GB or TB")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| "too large".to_string())
}

/// A healthy standby within `bound` of the holder (any lag without one;
/// an unknown lag is not within a bound).
fn is_replica(s: &AgentSnapshot, bound: Option<u64>) -> bool {
    s.role == "standby"
        && s.healthy == Some(true)
        && bound.is_none_or(|b| s.lag.is_some_and(|lag| lag <= b))
}

async fn replica(State(view): State<View>, Query(q): Query<LagBound>) -> Response {
    match q.bytes() {
        Ok(bound) => {
            let s = view.snapshot();
            answer(is_replica(&s, bound), s)
        }
        Err(why) => (StatusCode::BAD_REQUEST, why).into_response(),
    }
}

async fn read_only(State(view): State<View>, Query(q): Query<LagBound>) -> Response {
    match q.bytes() {
        Ok(bound) => {
            let s = view.snapshot();
            answer(s.primary || is_replica(&s, bound), s)
        }
        Err(why) => (StatusCode::BAD_REQUEST, why).into_response(),
    }
}

async fn health(State(view): State<View>) -> Response {
    answer(true, view.snapshot())
}

async fn liveness(State(view): State<View>) -> Response {
    let s = view.snapshot();
    answer(s.live, s)
}

async fn readiness(State(view): State<View>) -> Response {
    let s = view.snapshot();
    answer(s.ready, s)
}

async fn metrics(State(view): State<View>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        view.metrics(),
    )
        .into_response()
}

/// `POST /v1/failsafe/{lock}`: a holder's signed ask, answered by this
/// member's core ([`crate::failsafe::member`]).
async fn failsafe(
    State(view): State<View>,
    Path(lock): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let refuse = |status: StatusCode, error: String| {
        (status, Json(serde_json::json!({ "error": error }))).into_response()
    };
    let Some(gate) = view.failsafe() else {
        return refuse(
            StatusCode::NOT_FOUND,
            "failsafe is off on this agent (putex run --failsafe)".into(),
        );
    };
    let ask: crate::failsafe::auth::SignedAsk = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("not a failsafe ask: {e}")),
    };
    if ask.ask.lock != lock {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("the ask names lock {:?}, the path {lock:?}", ask.ask.lock),
        );
    }
    match gate.answer(&ask).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => refuse(e.status(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_or_postgresql_units() {
        for (text, bytes) in [
            ("0", 0),
            ("16777216", 16 << 20),
            ("16MB", 16 << 20),
            ("16 MB", 16 << 20),
            ("512kB", 512 << 10),
            ("1GB", 1 << 30),
            ("2TB", 2 << 40),
            ("100B", 100),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for bad in [
            "",
            "MB",
            "-1",
            "1.5MB",
            "16mb",
            "16 MiB",
            "99999999999999TB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lag_bound_admits_only_standbys_known_to_be_within_it() {
        let standby = |lag| AgentSnapshot {
            role: "standby".into(),
            healthy: Some(true),
            lag,
            ..AgentSnapshot::default()
        };
        assert!(is_replica(&standby(None), None));
        assert!(is_replica(&standby(Some(10)), Some(10)));
        assert!(!is_replica(&standby(Some(11)), Some(10)));
        assert!(!is_replica(&standby(None), Some(10)));
        let unhealthy = AgentSnapshot {
            healthy: Some(false),
            ..standby(Some(0))
        };
        assert!(!is_replica(&unhealthy, None));
    }
}
