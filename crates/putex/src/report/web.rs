//! The web status page, served by `putex serve` and by the agent's
//! `--http`: locks, holders, members, health, time since the last renewal,
//! fencing tokens and a timeline of who held each lock when (drawn as an
//! SVG chart by the page's script, with the transitions as a table),
//! refreshed every second.
//!
//! | route | what |
//! |---|---|
//! | `GET /ui` | the page (one HTML file with its script, no assets) |
//! | `GET /ui/status.json` | what the page shows: every lock's status and its latest transitions |
//!
//! The data is what `putex status` and `putex history` read
//! ([`crate::report::status::lock_status`], [`crate::observe::history`]); the page
//! only draws it. Fencing tokens in it are strings ([`crate::observe::json`]),
//! which the page's script shows as they are: an epoch is beyond what a
//! JavaScript number holds exactly.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use putex_core::StoreTime;
use serde::Serialize;

use crate::observe::history::{self, HistoryRow};
use crate::report::status::{lock_status, store_now, LockStatus};
use crate::store::{keys, AnyStore, Name};

/// How many transitions per lock the page shows: enough for a chart of
/// a few dozen handovers (an agent's tenure takes 2 to 4 records), small
/// enough for a page that refreshes every second (about 0.5 kB a record in
/// JSON: some 50 kB per lock).
pub const TIMELINE_LEN: usize = 100;

/// What `/ui/status.json` returns.
#[derive(Clone, Debug, Serialize)]
pub struct PageData {
    /// The store's time when the data was read (a probe write; `None` when
    /// it could not be read): the right edge of the timeline chart, on the
    /// clock of the timeline rows' `store_time`.
    pub now: Option<StoreTime>,
    /// One entry per lock.
    pub locks: Vec<LockPage>,
}

/// One lock on the page.
#[derive(Clone, Debug, Serialize)]
pub struct LockPage {
    /// Holder, state, token, members: as `putex status -o json`.
    pub status: LockStatus,
    /// The latest transitions, newest last: as `putex history -o json`.
    pub timeline: Vec<HistoryRow>,
}

#[derive(Clone)]
struct Page {
    store: AnyStore,
    locks: Option<Vec<Name>>,
}

/// The page's routes for `store`: every lock, or only `locks`.
pub fn router(store: AnyStore, locks: Option<Vec<Name>>) -> Router {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/status.json", get(data))
        .with_state(Page { store, locks })
}

async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("web/status.html"),
    )
        .into_response()
}

async fn data(State(p): State<Page>) -> Response {
    match collect(&p.store, p.locks.as_deref()).await {
        Ok(d) => Json(d).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": {"code": "store", "message": e}})),
        )
            .into_response(),
    }
}

/// Reads what the page shows.
pub async fn collect(store: &AnyStore, only: Option<&[Name]>) -> Result<PageData, String> {
    let timeout = Duration::from_secs(5);
    let names: Vec<Name> = match only {
        Some(n) => n.to_vec(),
        None => crate::store::read_prefix(store, keys::LOCK_PREFIX, timeout)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|(k, _)| Name::new(k.strip_prefix(keys::LOCK_PREFIX)?).ok())
            .collect(),
    };
    let mut locks = Vec::with_capacity(names.len());
    for name in names {
        let status = lock_status(store, &name).await.map_err(|e| e.to_string())?;
        let records = history::read(store, &name, timeout)
            .await
            .map_err(|e| e.to_string())?;
        let mut timeline = history::derive(&records);
        let skip = timeline.len().saturating_sub(TIMELINE_LEN);
        timeline.drain(..skip);
        locks.push(LockPage { status, timeline });
    }
    // After the records: no row's store time is later than this one.
    let now = store_now(store, Duration::from_secs(2)).await;
    Ok(PageData { now, locks })
}
