//! The failover agent's HTTP endpoints (`putex run --http ADDR`): health
//! checks for load balancers and orchestrators, and metrics.
//!
//! | route | 200 when | otherwise |
//! |---|---|---|
//! | `GET /primary` | this node is `active` and its activate hook (or child) succeeded | 503 |
//! | `GET /replica` | this node is `standby` and its last health check passed | 503 |
//! | `GET /health` | always (the body says role and health) | — |
//! | `GET /liveness` | the agent's state machine went round its loop recently (3 R + 1 s) | 503 |
//! | `GET /readiness` | the agent has started and made its first decision | 503 |
//! | `GET /metrics` | always: OpenMetrics text ([`crate::observe::metrics`]) | — |
//! | `GET /ui` | the web status page of the lock ([`crate::report::web`]) | — |
//!
//! Every status route answers with the same JSON body ([`AgentSnapshot`]),
//! so `curl` shows why a check fails. HAProxy's `option httpchk GET /primary`
//! sends traffic to the active node only (Patroni's convention).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

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
}

/// Something that can describe the agent right now.
pub trait AgentView: Send + Sync + 'static {
    /// The agent's current state.
    fn snapshot(&self) -> AgentSnapshot;
    /// Its metrics in OpenMetrics text format.
    fn metrics(&self) -> String;
}

type View = Arc<dyn AgentView>;

/// The endpoints in the table above, answering from `view`.
pub fn router(view: View) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/ui") }))
        .route("/primary", get(primary))
        .route("/replica", get(replica))
        .route("/health", get(health))
        .route("/liveness", get(liveness))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics))
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

async fn replica(State(view): State<View>) -> Response {
    let s = view.snapshot();
    answer(s.role == "standby" && s.healthy == Some(true), s)
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
