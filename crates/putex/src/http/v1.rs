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
    lifetime_left_header, parse_lifetime, parse_seconds, plausible_uid, rfc3339, seconds_floor_ms,
    AcquireFailure, Shared, LIFETIME_LEFT_HEADER, TOKEN_HEADER,
};
use crate::locks::gateway::{AcquireError, AcquireRequest, AdminAction, Ended, LockInfo};
use crate::observe::status::{lock_status, LockStatus, MemberStatus, StatusError};
use crate::store::{keys, AnyStore, Entry, ReadMode, Store, StoreError};

/// What went wrong, for programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The wait ran out (`408`).
    Timeout,
    /// An administrator deleted the waiting request (`409`).
    Cancelled,
    /// The request is malformed or out of range (`400`, `413` for a body
    /// that is too large).
    Invalid,
    /// No such lock or route (`404`).
    NotFound,
    /// Credentials are missing or wrong (`401`).
    Unauthorized,
    /// The store failed (`503`).
    Store,
    /// The server is shutting down (`503`).
    Unavailable,
    /// `force` on a resource held by a `putex lock` or agent, which may
    /// still be running: nothing was done (`409`).
    NotForceable,
    /// The lock was granted, but the answer was not ready within half the
    /// grant deadline: the lock was given back; ask again (`503`). For a
    /// renewal: the lock was renewed, but count from the previous answer.
    Late,
}

impl ErrorCode {
    /// The HTTP status of the code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Cancelled | ErrorCode::NotForceable => StatusCode::CONFLICT,
            ErrorCode::Invalid => StatusCode::BAD_REQUEST,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Store | ErrorCode::Unavailable | ErrorCode::Late => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }
}

/// An error response: `{"error": {"code": …, "message": …}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The error of an [`ErrorBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// What went wrong, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// An error of the JSON API, rendered as an [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl ApiError {
    /// An error with the code's own status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status: code.status(),
            code,
            message: message.into(),
        }
    }

    /// The code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    fn store(e: impl std::fmt::Display) -> ApiError {
        ApiError::new(ErrorCode::Store, format!("store: {e}"))
    }

    fn not_found(resource: &str, uid: &str) -> ApiError {
        ApiError::new(
            ErrorCode::NotFound,
            format!("no lock {uid} on {resource} (released, expired, revoked or unknown)"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::store(e)
    }
}

impl From<AcquireFailure> for ApiError {
    fn from(f: AcquireFailure) -> Self {
        match f {
            AcquireFailure::Gateway(AcquireError::Timeout) => {
                ApiError::new(ErrorCode::Timeout, AcquireError::Timeout.to_string())
            }
            AcquireFailure::Gateway(AcquireError::Cancelled) => {
                ApiError::new(ErrorCode::Cancelled, AcquireError::Cancelled.to_string())
            }
            AcquireFailure::Gateway(AcquireError::Invalid(m)) => {
                ApiError::new(ErrorCode::Invalid, m)
            }
            AcquireFailure::Gateway(AcquireError::Store(e)) => ApiError::store(e),
            AcquireFailure::Gateway(e @ AcquireError::Late(_)) => ApiError::new(
                ErrorCode::Late,
                format!("{e} (--grant-deadline); the lock was given back: ask again"),
            ),
            AcquireFailure::ShuttingDown => {
                ApiError::new(ErrorCode::Unavailable, "the server is shutting down")
            }
        }
    }
}

impl From<StatusError> for ApiError {
    fn from(e: StatusError) -> Self {
        match e {
            StatusError::Name(_) => ApiError::new(ErrorCode::Invalid, e.to_string()),
            other => ApiError::new(ErrorCode::Store, other.to_string()),
        }
    }
}

/// `Path`, with its rejections as JSON errors.
pub(crate) struct V1Path<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for V1Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| V1Path(t))
            .map_err(|e| ApiError::new(ErrorCode::Invalid, e.body_text()))
    }
}

/// A JSON body whatever its `Content-Type` (an empty body is `{}`), with
/// its rejections as JSON errors.
pub(crate) struct V1Json<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for V1Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError {
                status: e.status(),
                code: ErrorCode::Invalid,
                message: e.body_text(),
            })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(V1Json)
            .map_err(|e| ApiError::new(ErrorCode::Invalid, format!("invalid JSON body: {e}")))
    }
}

fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    keys::validate_name(name).map_err(|e| ApiError::new(ErrorCode::Invalid, format!("{what}: {e}")))
}

/// A fencing token: compare `epoch` first, then `revision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct FencingToken {
    /// The store bucket's incarnation.
    pub epoch: u64,
    /// The store's revision of the lock record's write.
    pub revision: u64,
}

impl From<Token> for FencingToken {
    fn from(t: Token) -> Self {
        FencingToken {
            epoch: t.epoch,
            revision: t.revision,
        }
    }
}

/// A lock request.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AcquireBody {
    /// What the lock is for (shown to operators).
    #[serde(default)]
    pub title: String,
    /// How long to wait for the lock, in seconds (0: do not wait).
    #[serde(default)]
    #[schema(minimum = 0)]
    pub wait: f64,
    /// How long to hold it once granted, in seconds. There are no
    /// renewals unless you renew: the lock ends after this.
    #[schema(minimum = 0)]
    pub lifetime: f64,
}

/// A renewal.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct RenewBody {
    /// The new lifetime from now, in seconds; the lock's own when omitted.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub lifetime: Option<f64>,
}

/// A lock, granted or waiting.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockView {
    /// The resource.
    pub resource: String,
    /// The lock's unique id.
    pub uid: String,
    /// What it is for.
    pub title: String,
    /// The wait it was asked with, in seconds.
    pub wait: f64,
    /// Its lifetime, in seconds.
    pub lifetime: f64,
    /// Granted (`true`) or still waiting.
    pub active: bool,
    /// When it was granted (RFC 3339, UTC, the store's clock).
    pub active_since: Option<String>,
    /// When it expires (RFC 3339, UTC, the store's clock).
    pub active_expires: Option<String>,
    /// The fencing token, once granted: pass it to what the lock protects,
    /// which rejects anything older than the newest it has seen.
    pub token: Option<FencingToken>,
    /// The fencing token as `EPOCH:REVISION`.
    pub fencing_token: Option<String>,
    /// The store revision of the lock record (the token's revision).
    pub revision: Option<u64>,
    /// Seconds left of the lock's licence, once granted: in the answer to
    /// a grant or renewal, `lifetime` plus the grant deadline minus the
    /// time since the granting write, as the answer left the gateway (also
    /// in `X-Putex-Lifetime-Left`); in a listing, as of the read.
    pub lifetime_left: Option<f64>,
    /// This lock's URL path.
    pub href: String,
}

impl LockView {
    fn new(info: &LockInfo) -> LockView {
        LockView {
            resource: info.resource.clone(),
            uid: info.uid.clone(),
            title: info.title.clone(),
            wait: info.wait.as_secs_f64(),
            lifetime: info.lifetime.as_secs_f64(),
            active: info.active,
            active_since: info.active_since.map(rfc3339),
            active_expires: info.active_expires.map(rfc3339),
            token: info.token.map(FencingToken::from),
            fencing_token: info.token.map(|t| t.to_string()),
            revision: info.token.map(|t| t.revision),
            lifetime_left: info.lifetime_left.map(seconds_floor_ms),
            href: format!("/v1/locks/{}/{}", info.resource, info.uid),
        }
    }
}

/// A resource and its granted and waiting locks.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceLocks {
    /// The resource.
    pub resource: String,
    /// Its locks: the granted one first, then the waiting ones in order.
    pub locks: Vec<LockView>,
}

/// Every resource with a granted or waiting lock.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockList {
    /// The resources.
    pub resources: Vec<ResourceLocks>,
}

/// A member of a lock (a `putex run` agent), from its member record.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemberView {
    /// The node id.
    pub node: String,
    /// Its role (`active`, `standby`, …).
    pub role: String,
    /// Whether its last health check passed.
    pub healthy: Option<bool>,
    /// Its last health check.
    pub last_health: Option<String>,
    /// Its fencing token while holding, `EPOCH:REVISION`.
    pub token: Option<String>,
    /// Store time since its record was written, in ms.
    pub last_seen_ms: Option<u64>,
    /// Whether it has not written its record for more than ten renewals.
    pub silent: bool,
    /// Something an operator must look at, e.g. `stop unproven (3 attempts;
    /// holding the lock until a stop is proven)`: the service may still run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<String>,
}

impl From<MemberStatus> for MemberView {
    fn from(m: MemberStatus) -> Self {
        MemberView {
            node: m.node,
            role: m.role,
            healthy: m.healthy,
            last_health: m.last_health,
            token: m.token,
            last_seen_ms: m.last_seen_ms,
            silent: m.silent,
            alarm: m.alarm,
        }
    }
}

/// A lock record, as `putex status` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusView {
    /// The lock name.
    pub lock: String,
    /// The holder's node id (for `released` and `revoked`: the last
    /// holder). Gateway locks name the gateway's node.
    pub holder: Option<String>,
    /// `active`, `confirming`, `released`, `revoked`, `absent` or
    /// `unreadable`.
    pub state: String,
    /// The record's fencing token.
    pub token: Option<FencingToken>,
    /// The fencing token as `EPOCH:REVISION`.
    pub fencing_token: Option<String>,
    /// The record's revision.
    pub revision: Option<u64>,
    /// Store time since the record was last written, in ms.
    pub renewed_ago_ms: Option<u64>,
    /// The lease T the holder advertises, in ms (a gateway lock's lifetime).
    pub lease_ms: Option<u64>,
    /// The emergency-stop gap the holder advertises, in ms.
    pub gap_ms: Option<u64>,
    /// The holder's instance id (a gateway lock's uid).
    pub instance: Option<String>,
    /// Whether the record is older than its advertised lease.
    pub stale: bool,
    /// The members' records (absent in the `/v1/status` listing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<MemberView>>,
}

fn parse_token(s: &str) -> Option<FencingToken> {
    let (e, r) = s.split_once(':')?;
    Some(FencingToken {
        epoch: e.parse().ok()?,
        revision: r.parse().ok()?,
    })
}

impl From<LockStatus> for StatusView {
    fn from(s: LockStatus) -> Self {
        StatusView {
            token: s.token.as_deref().and_then(parse_token),
            fencing_token: s.token,
            lock: s.lock,
            holder: s.holder,
            state: s.state,
            revision: s.revision,
            renewed_ago_ms: s.renewed_ago_ms,
            lease_ms: s.lease_ms,
            gap_ms: s.gap_ms,
            instance: s.instance,
            stale: s.stale,
            members: Some(s.members.into_iter().map(MemberView::from).collect()),
        }
    }
}

/// The status of several locks.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusList {
    /// One entry per lock record in the store.
    pub locks: Vec<StatusView>,
}

/// A lock's members.
#[derive(Debug, Serialize, ToSchema)]
pub struct MembersView {
    /// The lock name.
    pub lock: String,
    /// Its members' records.
    pub members: Vec<MemberView>,
}

/// `/health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthView {
    /// Always `ok`: the server answers.
    pub status: String,
}

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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
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
    check_name("resource", &resource)?;
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 404, description = "Released, expired, revoked or unknown", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn get_lock(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
) -> Result<Json<LockView>, ApiError> {
    check_name("resource", &resource)?;
    if !plausible_uid(&uid) {
        return Err(ApiError::not_found(&resource, &uid));
    }
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 404, description = "Not held: released, expired, revoked or unknown", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn release(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    check_name("resource", &resource)?;
    if plausible_uid(&uid) && s.gateway.release(&resource, &uid).await? {
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
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
    check_name("resource", &resource)?;
    let max = s.gateway.options().max_lifetime;
    let lifetime = body
        .lifetime
        .map(|l| parse_lifetime(l, max))
        .transpose()
        .map_err(|m| ApiError::new(ErrorCode::Invalid, m))?;
    if !plausible_uid(&uid) {
        return Err(ApiError::not_found(&resource, &uid));
    }
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
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
            resource,
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn list_resource(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<ResourceLocks>, ApiError> {
    check_name("resource", &resource)?;
    let locks = s.gateway.locks(&resource).await?;
    Ok(Json(ResourceLocks {
        locks: locks.iter().map(LockView::new).collect(),
        resource,
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 404, description = "The resource has no lock", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn delete_resource(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<StatusCode, ApiError> {
    check_name("resource", &resource)?;
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 404, description = "Nothing holds the resource", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn revoke(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<AdminView>, ApiError> {
    check_name("resource", &resource)?;
    match s.gateway.revoke(&resource).await? {
        Some(ended) => Ok(Json(AdminView::new(resource, &ended))),
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 404, description = "Nothing holds the resource", body = ErrorBody),
        (status = 409, description = "Held by a putex lock or agent, not over HTTP (`not_forceable`): nothing was done", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn force(
    State(s): State<Arc<Shared>>,
    V1Path(resource): V1Path<String>,
) -> Result<Json<AdminView>, ApiError> {
    check_name("resource", &resource)?;
    match s.gateway.force(&resource).await? {
        Some(ended) if ended.action == AdminAction::Refused => Err(ApiError::new(
            ErrorCode::NotForceable,
            format!(
                "{resource} is held by {} (instance {}), a putex lock or agent that may still \
                 be running, not over HTTP: nothing was done; revoke it instead",
                ended.node, ended.instance
            ),
        )),
        Some(ended) => Ok(Json(AdminView::new(resource, &ended))),
        None => Err(no_holder(&resource)),
    }
}

/// The store's current time, by a probe write and read (as `putex
/// status` reads it): ages come from store timestamps only.
async fn store_now(store: &AnyStore, t: Duration) -> Option<StoreTime> {
    let key = keys::probe("_status").ok()?;
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
        state: "unreadable".into(),
        token: Some(entry.token.into()),
        fencing_token: Some(entry.token.to_string()),
        revision: Some(entry.token.revision),
        renewed_ago_ms,
        lease_ms: None,
        gap_ms: None,
        instance: None,
        stale: false,
        members: None,
    };
    if let Observed::Record(r) = Observed::decode(&entry.value) {
        v.state = serde_json::to_value(r.state)
            .ok()
            .and_then(|s| s.as_str().map(str::to_owned))
            .unwrap_or_default();
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
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
            let name = key.strip_prefix(keys::LOCK_PREFIX)?;
            keys::validate_name(name).ok()?;
            Some(summary(name, entry, now))
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn status(
    State(s): State<Arc<Shared>>,
    V1Path(lock): V1Path<String>,
) -> Result<Json<StatusView>, ApiError> {
    check_name("lock", &lock)?;
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
        (status = 401, description = "Missing or wrong credentials", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn members(
    State(s): State<Arc<Shared>>,
    V1Path(lock): V1Path<String>,
) -> Result<Json<MembersView>, ApiError> {
    check_name("lock", &lock)?;
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
