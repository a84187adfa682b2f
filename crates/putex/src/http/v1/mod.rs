//! The versioned JSON API under `/v1/`: what the RDLM API cannot say —
//! fencing tokens and revisions, renewals, listings, status and members.
//!
//! | call | what |
//! |---|---|
//! | `POST /v1/locks/{resource}` | wait up to `wait` s for the lock, hold it for `lifetime` s: `201` + the lock |
//! | `GET /v1/locks/{resource}/{uid}` | the lock, granted or waiting |
//! | `DELETE /v1/locks/{resource}/{uid}` | release it: `204` |
//! | `POST /v1/locks/{resource}/{uid}/renew` | a new lifetime from now |
//! | `GET /v1/locks`, `GET /v1/locks/{resource}` | the resources with locks, and their granted and waiting locks |
//! | `DELETE /v1/locks/{resource}` | admin, RDLM's delete: cancel the waiting locks, free an HTTP lock at once, revoke a `putex lock` or agent holder |
//! | `POST /v1/locks/{resource}/revoke` | admin: revoke the holder, whatever it is (S7) |
//! | `POST /v1/locks/{resource}/force` | admin: free an HTTP lock at once (`released`); never a `putex lock` or agent holder |
//! | `GET /v1/status`, `GET /v1/status/{lock}` | any putex lock's record: holder, state, revision, fencing token |
//! | `GET /v1/status/{lock}/members` | the member records of a lock (`putex run` agents) |
//! | `GET /v1/locks/{lock}/check?token=T` | whether T is the current holder's fencing token |
//! | `PUT`/`DELETE /v1/locks/{resource}/{uid}/kv/{key}`, `POST /v1/locks/{resource}/{uid}/kv` | guarded writes for a grant: refused by the store once the lock moved |
//! | `GET /v1/kv/{key}`, `GET /v1/kv` | the keys guarded writes wrote |
//! | `GET /health` | liveness, never behind auth |
//!
//! Every response is JSON. Errors are
//! `{"error": {"code": …, "message": …}}` with the codes of [`ErrorCode`].
//! Request bodies are read as JSON whatever their `Content-Type`; an empty
//! body counts as `{}`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::header::LOCATION;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use putex_core::{LockState, Observed, StoreGap, StoreTime, Token};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    lifetime_left_header, lock_uid, parse_lifetime, parse_seconds, rfc3339, seconds_floor_ms,
    AcquireFailure, Shared, LIFETIME_LEFT_HEADER, TOKEN_HEADER,
};
use crate::locks::gateway::{AcquireError, AcquireRequest, AdminAction, Ended, LockInfo};
use crate::observe::json::RecordState;
use crate::report::status::{lock_status, LockStatus, MemberStatus, StatusError};
use crate::store::{keys, AnyStore, Entry, Name, NodeId, ReadMode, Store, StoreError};

mod errors;
pub(crate) mod kv;
pub(crate) mod views;

use errors::check_name;
pub use errors::{ApiError, ErrorBody, ErrorCode, StoreFailure, Unauthorized};
pub(crate) use errors::{V1Json, V1Path};
pub use views::*;

/// Acquire a lock: waits up to `wait` seconds, then holds the lock for
/// `lifetime` seconds.
#[utoipa::path(
    post,
    path = "/v1/locks/{resource}",
    tag = "v1",
    params(("resource" = String, Path, description = "The resource: [A-Za-z0-9_-]{1,64}", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    request_body = AcquireBody,
    responses(
        (status = 201, description = "Granted", body = LockView, headers(
            ("Location" = String, description = "The lock's absolute URL"),
            ("X-Putex-Token" = String, description = "The fencing token, EPOCH:REVISION"),
            ("X-Putex-Lifetime-Left" = String, description = "Seconds left of the lock's licence as the answer left: lifetime + grant deadline - time since the grant (at least lifetime + half the deadline)"),
        )),
        (status = 400, description = "Malformed or out of range", body = ErrorBody),
        Unauthorized,
        (status = 408, description = "Not granted within the wait", body = ErrorBody),
        (status = 409, description = "An administrator deleted the waiting request", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Store failure, shutting down, or granted too late to answer within half the grant deadline (`late`: given back)", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn acquire(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
    V1Json(body): V1Json<AcquireBody>,
) -> Result<Response, ApiError> {
    let resource = check_name("resource", &resource)?;
    let opts = s.gateway.options();
    let invalid = |m| ApiError::new(ErrorCode::Invalid, m);
    let wait = parse_seconds("wait", body.wait, opts.max_wait, "--max-wait").map_err(invalid)?;
    let lifetime = parse_lifetime(body.lifetime, opts.max_lifetime).map_err(invalid)?;
    let grant = s
        .acquire(AcquireRequest {
            resource,
            title: body.title,
            wait,
            lifetime,
        })
        .await?;
    // The last step before the answer leaves.
    let info = grant.hand_over().map_err(AcquireFailure::Gateway)?;
    Ok(granted(&s, StatusCode::CREATED, &info))
}

/// The answer to a grant or renewal: the lock, `Location`, and the
/// `X-Putex-Token` and `X-Putex-Lifetime-Left` headers.
fn granted(s: &Shared, status: StatusCode, info: &LockInfo) -> Response {
    let view = LockView::new(info);
    let mut resp = (status, Json(&view)).into_response();
    let location = format!("{}{}", s.base_url, view.href);
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(LOCATION, v);
    }
    if let Some(t) = view.fencing_token.as_deref().and_then(|t| t.parse().ok()) {
        resp.headers_mut()
            .insert(HeaderName::from_static(TOKEN_HEADER), t);
    }
    if let Some(left) = info.lifetime_left {
        resp.headers_mut().insert(
            HeaderName::from_static(LIFETIME_LEFT_HEADER),
            lifetime_left_header(left),
        );
    }
    resp
}

/// A lock, granted or waiting.
#[utoipa::path(
    get,
    path = "/v1/locks/{resource}/{uid}",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The lock's uid"),
    ),
    responses(
        (status = 200, description = "The lock", body = LockView),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Released, expired, revoked or unknown", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn get_lock(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
) -> Result<Json<LockView>, ApiError> {
    let resource = check_name("resource", &resource)?;
    let Some(uid) = lock_uid(&uid) else {
        return Err(ApiError::not_found(&resource, &uid));
    };
    match s.gateway.get(&resource, &uid).await? {
        Some(info) => Ok(Json(LockView::new(&info))),
        None => Err(ApiError::not_found(&resource, &uid)),
    }
}

/// Release a granted lock (or abandon nothing: `404` if it is not held).
#[utoipa::path(
    delete,
    path = "/v1/locks/{resource}/{uid}",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The lock's uid"),
    ),
    responses(
        (status = 204, description = "Released: the next waiter gets it at once"),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Not held: released, expired, revoked or unknown", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn release(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let resource = check_name("resource", &resource)?;
    let released = match lock_uid(&uid) {
        Some(uid) => s.gateway.release(&resource, &uid).await?,
        None => false,
    };
    if released {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(&resource, &uid))
    }
}

/// Renew a granted lock: a new lifetime from now.
#[utoipa::path(
    post,
    path = "/v1/locks/{resource}/{uid}/renew",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The lock's uid"),
    ),
    request_body = RenewBody,
    responses(
        (status = 200, description = "Renewed", body = LockView, headers(
            ("X-Putex-Token" = String, description = "The new fencing token, EPOCH:REVISION"),
            ("X-Putex-Lifetime-Left" = String, description = "Seconds left of the renewed licence as the answer left"),
        )),
        (status = 400, description = "Malformed or out of range", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Not held", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Store failure, or renewed too late to answer within half the grant deadline (`late`: count from the previous answer)", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn renew(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
    V1Json(body): V1Json<RenewBody>,
) -> Result<Response, ApiError> {
    let resource = check_name("resource", &resource)?;
    let max = s.gateway.options().max_lifetime;
    let lifetime = body
        .lifetime
        .map(|l| parse_lifetime(l, max))
        .transpose()
        .map_err(|m| ApiError::new(ErrorCode::Invalid, m))?;
    let Some(uid) = lock_uid(&uid) else {
        return Err(ApiError::not_found(&resource, &uid));
    };
    let Some(renewal) = s.gateway.renew(&resource, &uid, lifetime).await? else {
        return Err(ApiError::not_found(&resource, &uid));
    };
    let info = renewal.hand_over().map_err(late_renewal)?;
    Ok(granted(&s, StatusCode::OK, &info))
}

/// A renewal that could not be answered in time: it stays, but its client
/// only knows the previous answer, which ends earlier.
fn late_renewal(e: AcquireError) -> ApiError {
    ApiError::new(
        ErrorCode::Late,
        format!(
            "{e} (--grant-deadline); the lock was renewed, but count from the previous \
             answer, or renew again"
        ),
    )
}

/// Every resource with a granted or waiting lock, and its locks.
#[utoipa::path(
    get,
    path = "/v1/locks",
    tag = "v1",
    responses(
        (status = 200, description = "The resources", body = LockList),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn list(State(s): State<Arc<Shared>>) -> Result<Json<LockList>, ApiError> {
    let mut resources = Vec::new();
    for resource in s.gateway.resources().await? {
        let locks = s.gateway.locks(&resource).await?;
        if locks.is_empty() {
            continue; // released or expired since the listing
        }
        resources.push(ResourceLocks {
            locks: locks.iter().map(LockView::new).collect(),
            resource: resource.to_string(),
        });
    }
    Ok(Json(LockList { resources }))
}

/// One resource's granted and waiting locks (none is not an error).
#[utoipa::path(
    get,
    path = "/v1/locks/{resource}",
    tag = "v1",
    params(("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Its locks", body = ResourceLocks),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn list_resource(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<ResourceLocks>, ApiError> {
    let resource = check_name("resource", &resource)?;
    let locks = s.gateway.locks(&resource).await?;
    Ok(Json(ResourceLocks {
        locks: locks.iter().map(LockView::new).collect(),
        resource: resource.to_string(),
    }))
}

/// Admin: delete every lock of a resource, as RDLM does.
///
/// As `DELETE /resources/{resource}`: the waiting requests get `409`, a
/// lock granted over HTTP is freed at once (`released`, as `force`), and a
/// `putex lock` or agent holder is revoked (`revoked`, S7, as `revoke`).
#[utoipa::path(
    delete,
    path = "/v1/locks/{resource}",
    tag = "v1",
    params(("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 204, description = "Deleted: waiters cancelled, an HTTP lock freed at once, a putex lock or agent holder revoked"),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "The resource has no lock", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn delete_resource(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<StatusCode, ApiError> {
    let resource = check_name("resource", &resource)?;
    if s.gateway.delete(&resource).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            ErrorCode::NotFound,
            format!("{resource} has no lock"),
        ))
    }
}

/// What an admin call did to a resource's holder.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminView {
    /// The resource.
    pub resource: String,
    /// `freed` (`force`: an HTTP lock, now `released`, the next request
    /// gets it at once) or `revoked` (`revoke`: now `revoked`, S7).
    pub action: String,
    /// The holder's node id (the gateway's `--node` for an HTTP lock).
    pub holder: String,
    /// The holder's instance id (an HTTP lock's uid).
    pub instance: String,
    /// The holder's fencing token, `EPOCH:REVISION`: tell the protected
    /// resource to refuse it and anything older.
    pub fencing_token: String,
    /// The same token.
    pub token: FencingToken,
}

impl AdminView {
    fn new(resource: String, ended: &Ended) -> AdminView {
        AdminView {
            resource,
            action: match ended.action {
                AdminAction::Freed => "freed",
                AdminAction::Revoked => "revoked",
                AdminAction::Refused => "refused",
            }
            .into(),
            holder: ended.node.clone(),
            instance: ended.instance.clone(),
            fencing_token: ended.token.to_string(),
            token: ended.token.into(),
        }
    }
}

fn no_holder(resource: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("nothing holds {resource} (free, expired, released or revoked)"),
    )
}

/// Admin: revoke a resource's holder, whatever it is (S7).
///
/// Its record becomes `revoked`: a `putex lock` or agent holder stops at
/// once; an HTTP client cannot be told. Takers wait W + G' of the holder's
/// advertised lease (an HTTP lock's lifetime + grant deadline): the lock
/// is not free at once. Waiting requests keep their place.
#[utoipa::path(
    post,
    path = "/v1/locks/{resource}/revoke",
    tag = "v1",
    params(("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Revoked", body = AdminView),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Nothing holds the resource", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn revoke(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<AdminView>, ApiError> {
    let resource = check_name("resource", &resource)?;
    match s.gateway.revoke(&resource).await? {
        Some(ended) => Ok(Json(AdminView::new(resource.to_string(), &ended))),
        None => Err(no_holder(&resource)),
    }
}

/// Admin: free a lock granted over HTTP at once.
///
/// Its record becomes `released`: the next request (or `putex lock`) gets
/// it at once, with a higher fencing token. Its client is not told: its
/// fencing token is what protects the resource. A `putex lock` or agent
/// holder, which may still be running, is never forced (`409`
/// `not_forceable`: revoke it). Waiting requests keep their place.
#[utoipa::path(
    post,
    path = "/v1/locks/{resource}/force",
    tag = "v1",
    params(("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Freed", body = AdminView),
        (status = 400, description = "Malformed resource name", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "Nothing holds the resource", body = ErrorBody),
        (status = 409, description = "Held by a putex lock or agent, not over HTTP (`not_forceable`): nothing was done", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn force(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<AdminView>, ApiError> {
    let resource = check_name("resource", &resource)?;
    match s.gateway.force(&resource).await? {
        Some(ended) if ended.action == AdminAction::Refused => Err(ApiError::new(
            ErrorCode::NotForceable,
            format!(
                "{resource} is held by {} (instance {}), a putex lock or agent that may still \
                 be running, not over HTTP: nothing was done; revoke it instead",
                ended.node, ended.instance
            ),
        )),
        Some(ended) => Ok(Json(AdminView::new(resource.to_string(), &ended))),
        None => Err(no_holder(&resource)),
    }
}

/// The store's current time, by a probe write and read (as `putex
/// status` reads it): ages come from store timestamps only.
async fn store_now(store: &AnyStore, t: Duration) -> Option<StoreTime> {
    let key = keys::probe(&NodeId::new("_status").ok()?);
    store
        .put(&key, br#"{"v":1,"node":"_status","write":"serve"}"#, t)
        .await
        .ok()?;
    Some(store.get(&key, ReadMode::Leader, t).await.ok()??.time)
}

/// One lock record without its members, from a snapshot entry.
fn summary(lock: &str, entry: &Entry, now: Option<StoreTime>) -> StatusView {
    let renewed_ago_ms = now.and_then(|now| match now.gap_since(entry.time) {
        StoreGap::Forward(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        StoreGap::Backwards => Some(0),
        StoreGap::Unbounded => None,
    });
    let mut v = StatusView {
        lock: lock.to_owned(),
        holder: None,
        state: RecordState::Unreadable,
        token: Some(entry.token.into()),
        fencing_token: Some(entry.token.to_string()),
        revision: Some(entry.token.revision),
        renewed_ago_ms,
        lease_ms: None,
        gap_ms: None,
        instance: None,
        stale: false,
        members: None,
        failsafe: None,
    };
    if let Observed::Record(r) = Observed::decode(&entry.value) {
        v.failsafe = crate::report::status::FailsafeStatus::of(&r);
        v.state = r.state.into();
        v.stale = matches!(r.state, LockState::Active | LockState::Confirming)
            && renewed_ago_ms.is_none_or(|a| a > r.lease_ms);
        v.holder = Some(r.node);
        v.lease_ms = Some(r.lease_ms);
        v.gap_ms = Some(r.gap_ms);
        v.instance = Some(r.instance);
    }
    v
}

/// Every lock record in the store (gateway locks, `putex lock` and `putex
/// run` locks alike), from one snapshot; without members (see
/// `/v1/status/{lock}/members`).
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "v1",
    responses(
        (status = 200, description = "Every lock", body = StatusList),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn status_all(State(s): State<Arc<Shared>>) -> Result<Json<StatusList>, ApiError> {
    let store = s.gateway.store();
    let t = Duration::from_secs(2);
    let now = store_now(store, t).await;
    let entries = crate::store::read_prefix(store, keys::LOCK_PREFIX, t).await?;
    let locks = entries
        .iter()
        .filter_map(|(key, entry)| {
            // Skip keys under the prefix that are no lock (scan markers).
            let name = Name::new(key.strip_prefix(keys::LOCK_PREFIX)?).ok()?;
            Some(summary(&name, entry, now))
        })
        .collect();
    Ok(Json(StatusList { locks }))
}

/// A lock record: holder, state, revision, fencing token, members.
#[utoipa::path(
    get,
    path = "/v1/status/{lock}",
    tag = "v1",
    params(("lock" = String, Path, description = "The lock name", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "The lock (state `absent` if it has no record)", body = StatusView),
        (status = 400, description = "Malformed lock name", body = ErrorBody),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn status(
    State(s): State<Arc<Shared>>,
    V1Path(lock): V1Path<String>,
) -> Result<Json<StatusView>, ApiError> {
    let lock = check_name("lock", &lock)?;
    Ok(Json(lock_status(s.gateway.store(), &lock).await?.into()))
}

/// The member records of a lock (`putex run` agents: role, health).
#[utoipa::path(
    get,
    path = "/v1/status/{lock}/members",
    tag = "v1",
    params(("lock" = String, Path, description = "The lock name", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Its members", body = MembersView),
        (status = 400, description = "Malformed lock name", body = ErrorBody),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn members(
    State(s): State<Arc<Shared>>,
    V1Path(lock): V1Path<String>,
) -> Result<Json<MembersView>, ApiError> {
    let lock = check_name("lock", &lock)?;
    let st = lock_status(s.gateway.store(), &lock).await?;
    Ok(Json(MembersView {
        lock: st.lock,
        members: st.members.into_iter().map(MemberView::from).collect(),
    }))
}

/// Liveness: `200` while the server answers. Never behind auth.
#[utoipa::path(
    get,
    path = "/health",
    tag = "ops",
    responses((status = 200, description = "The server answers", body = HealthView)),
)]
pub(crate) async fn health() -> Json<HealthView> {
    Json(HealthView {
        status: "ok".into(),
    })
}

/// Any other route: `404` as JSON.
pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("no route for {method} {}", uri.path()),
    )
}
