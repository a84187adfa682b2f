//! The RDLM-compatible API at the root, so that clients of RDLM
//! (restful-distributed-lock-manager) keep working against `putex serve`.
//!
//! | call | answer |
//! |---|---|
//! | `POST /locks/{resource}` `{"title", "wait", "lifetime"}` | `201` + `Location` of the lock (waits up to `wait` s); `408` wait ran out; `409` deleted by an admin; `400` bad body |
//! | `GET /locks/{resource}/{uid}` | `200` `application/hal+json`; `404` once released, expired or revoked |
//! | `DELETE /locks/{resource}/{uid}` | `204`; `404` if not held |
//! | `GET /resources`, `GET /resources/{resource}` | admin: HAL listings (`200`, also for a resource without locks) |
//! | `DELETE /resources/{resource}` | admin: `204` (HTTP locks freed at once, `putex lock` and agent holders revoked, waiters `409`); `404` when it has no lock |
//! | `DELETE /resources` | admin: the same for every resource, `204` |
//! | `GET /` | a hello |
//!
//! As in RDLM, resource names and uids are `[a-zA-Z0-9]+` (other names
//! match no route: `404`), `wait` and `lifetime` are seconds (numbers, or
//! strings holding one), errors carry a plain-text message, and `201`,
//! `408` and `409` have an empty body. putex adds the fencing token (the
//! `X-Putex-Token: EPOCH:REVISION` header of a `201` and the `token` of a
//! lock) and what is left of a granted lock (`X-Putex-Lifetime-Left`,
//! `lifetime_left`; a grant that cannot be answered in time is given back:
//! `503`, see [`crate::locks::gateway::Grant`]). Times are ISO 8601 in UTC without
//! a zone, as RDLM writes them.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::v1::Unauthorized;
use super::{
    lifetime_left_header, lock_uid, parse_lifetime, parse_seconds, rfc3339, seconds_floor_ms,
    seconds_json, AcquireFailure, Shared, LIFETIME_LEFT_HEADER, TOKEN_HEADER,
};
use crate::locks::gateway::{AcquireError, AcquireRequest, GatewayOptions, LockInfo};
use crate::store::{Name, StoreError};

/// The `503` of an RDLM call that only reads or writes the store: plain
/// text, as RDLM answers.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 503,
    description = "Store failure",
    content_type = "text/plain"
)]
#[allow(dead_code)] // a type for the document: only the derive reads it
pub struct RdlmStoreFailure(pub String);

const HAL_JSON: &str = "application/hal+json";

/// A plain-text response, as RDLM answers errors.
fn text(status: StatusCode, message: impl Into<String>) -> Response {
    let mut m = message.into();
    m.push('\n');
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], m).into_response()
}

fn store_error(e: StoreError) -> Response {
    text(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}"))
}

fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "not found")
}

fn lock_not_found() -> Response {
    text(StatusCode::NOT_FOUND, "lock not found")
}

/// A grant that could not be answered in time, and was given back.
fn late(e: &AcquireError) -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{e} (--grant-deadline); the lock was given back: ask again"),
    )
}

fn hal(value: &impl Serialize) -> Response {
    let body = serde_json::to_string_pretty(value).expect("HAL serialises");
    ([(CONTENT_TYPE, HAL_JSON)], body).into_response()
}

/// The refusal of a resource name that is not RDLM's: `[a-zA-Z0-9]+`; a
/// name with other characters matches no route (`404`). putex also caps
/// names at 64 characters (`400`).
fn resource_name(name: &str) -> Result<Name, Box<Response>> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Box::new(not_found()));
    }
    Name::new(name).map_err(|e| Box::new(text(StatusCode::BAD_REQUEST, format!("resource: {e}"))))
}

/// `Path` whose rejections (a segment that is not UTF-8) are RDLM's `404`.
pub(crate) struct RdlmPath<T>(pub(crate) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for RdlmPath<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| RdlmPath(t))
            .map_err(|_| not_found())
    }
}

/// RDLM's time format: ISO 8601 with microseconds, UTC, no zone
/// (`2013-01-22T23:01:16.771799`).
fn rdlm_time(t: SystemTime) -> String {
    let mut s = rfc3339(t);
    s.pop(); // the `Z`
    s
}

/// A lock request, as RDLM reads it.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // documents the body in the OpenAPI document; parsed by hand
pub struct RdlmLockRequest {
    /// What the lock is for.
    title: String,
    /// How long to wait for the lock, in seconds.
    #[schema(minimum = 0)]
    wait: f64,
    /// How long to hold it, in seconds.
    #[schema(minimum = 0)]
    lifetime: f64,
}

/// Reads a lock request like RDLM: every field required, `wait` and
/// `lifetime` numbers (or strings holding one).
fn parse_request(
    body: &[u8],
    opts: &GatewayOptions,
) -> Result<(String, Duration, Duration), String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("empty body".into());
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid json body: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("invalid json body: not a JSON object")?;
    let title = match obj.get("title") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("invalid json body: title must be a string".into()),
        None => return Err("invalid json body: title is missing".into()),
    };
    let number = |field: &str| -> Result<f64, String> {
        match obj.get(field) {
            Some(Value::Number(n)) => n
                .as_f64()
                .ok_or_else(|| format!("invalid json body: {field} is out of range")),
            Some(Value::String(s)) => s
                .trim()
                .parse()
                .map_err(|_| format!("invalid json body: {field} must be a number of seconds")),
            Some(_) => Err(format!(
                "invalid json body: {field} must be a number of seconds"
            )),
            None => Err(format!("invalid json body: {field} is missing")),
        }
    };
    let wait = parse_seconds("wait", number("wait")?, opts.max_wait, "--max-wait")?;
    let lifetime = parse_lifetime(number("lifetime")?, opts.max_lifetime)?;
    Ok((title, wait, lifetime))
}

/// A HAL link.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalLink {
    /// The URL path.
    pub href: String,
}

impl HalLink {
    fn new(href: String) -> HalLink {
        HalLink { href }
    }
}

/// A lock's HAL links.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalLockLinks {
    /// The lock.
    #[serde(rename = "self")]
    pub this: HalLink,
    /// Its resource (on a lock fetched on its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<HalLink>,
}

/// A lock in RDLM's format.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalLock {
    /// The lock's unique id.
    pub uid: String,
    /// What it is for.
    pub title: String,
    /// The wait it was asked with, in seconds.
    #[schema(value_type = f64)]
    pub wait: Value,
    /// Its lifetime, in seconds.
    #[schema(value_type = f64)]
    pub lifetime: Value,
    /// Granted (`true`) or still waiting.
    pub active: bool,
    /// When it was granted (ISO 8601, UTC, no zone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_since: Option<String>,
    /// When it expires (ISO 8601, UTC, no zone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_expires: Option<String>,
    /// The fencing token `EPOCH:REVISION`, once granted (a putex addition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Seconds left of the lock's licence, once granted (a putex addition):
    /// `lifetime` plus the grant deadline, minus the time since the grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifetime_left: Option<f64>,
    /// Links.
    #[serde(rename = "_links")]
    pub links: HalLockLinks,
}

impl HalLock {
    fn new(info: &LockInfo, with_resource: bool) -> HalLock {
        HalLock {
            uid: info.uid.clone(),
            title: info.title.clone(),
            wait: seconds_json(info.wait),
            lifetime: seconds_json(info.lifetime),
            active: info.active,
            active_since: info.active_since.map(rdlm_time),
            active_expires: info.active_expires.map(rdlm_time),
            token: info.token.map(|t| t.to_string()),
            lifetime_left: info.lifetime_left.map(seconds_floor_ms),
            links: HalLockLinks {
                this: HalLink::new(format!("/locks/{}/{}", info.resource, info.uid)),
                resource: with_resource
                    .then(|| HalLink::new(format!("/resources/{}", info.resource))),
            },
        }
    }
}

/// A HAL object's own link.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalSelf {
    /// This object.
    #[serde(rename = "self")]
    pub this: HalLink,
}

/// The locks embedded in a resource.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalEmbeddedLocks {
    /// The granted lock first, then the waiting ones.
    pub locks: Vec<HalLock>,
}

/// A resource and its locks, in RDLM's format.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalResource {
    /// The resource name.
    pub name: String,
    /// Links.
    #[serde(rename = "_links")]
    pub links: HalSelf,
    /// Its locks (absent when it has none, as in RDLM).
    #[serde(rename = "_embedded", skip_serializing_if = "Option::is_none")]
    pub embedded: Option<HalEmbeddedLocks>,
}

/// A resource in a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalResourceRef {
    /// The resource name.
    pub name: String,
    /// Links.
    #[serde(rename = "_links")]
    pub links: HalSelf,
}

/// The resources embedded in a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalEmbeddedResources {
    /// The resources with locks.
    pub resources: Vec<HalResourceRef>,
}

/// Every resource with locks, in RDLM's format.
#[derive(Debug, Serialize, ToSchema)]
pub struct HalResources {
    /// Links.
    #[serde(rename = "_links")]
    pub links: HalSelf,
    /// The resources (absent when there is none, as in RDLM).
    #[serde(rename = "_embedded", skip_serializing_if = "Option::is_none")]
    pub embedded: Option<HalEmbeddedResources>,
}

/// A hello.
#[utoipa::path(
    get,
    path = "/",
    tag = "rdlm",
    responses(
        (status = 200, description = "A hello", body = String, content_type = "text/plain"),
        Unauthorized,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn hello() -> Response {
    text(
        StatusCode::OK,
        "Welcome on putex serve, an RDLM-compatible lock gateway ! (JSON API: /v1/, OpenAPI: /openapi.json)",
    )
}

/// Acquire a lock (RDLM): blocks up to `wait` seconds.
#[utoipa::path(
    post,
    path = "/locks/{resource}",
    tag = "rdlm",
    params(("resource" = String, Path, description = "The resource: [a-zA-Z0-9]+", pattern = "^[a-zA-Z0-9]{1,64}$")),
    request_body(content = RdlmLockRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Granted; empty body", headers(
            ("Location" = String, description = "The lock's absolute URL"),
            ("X-Putex-Token" = String, description = "The fencing token, EPOCH:REVISION"),
            ("X-Putex-Lifetime-Left" = String, description = "Seconds left of the lock's licence as the answer left: lifetime + grant deadline - time since the grant (at least lifetime + half the deadline)"),
        )),
        (status = 400, description = "Empty, malformed or incomplete body", body = String, content_type = "text/plain"),
        Unauthorized,
        (status = 404, description = "Not an RDLM resource name", body = String, content_type = "text/plain"),
        (status = 408, description = "Not granted within the wait; empty body"),
        (status = 409, description = "An administrator deleted the waiting request; empty body"),
        (status = 413, description = "Body too large", body = String, content_type = "text/plain"),
        (status = 503, description = "Store failure, shutting down, or granted too late to answer within half the grant deadline (given back)", body = String, content_type = "text/plain"),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn acquire(
    State(s): State<Arc<Shared>>,
    RdlmPath(resource): RdlmPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let resource = match resource_name(&resource) {
        Ok(name) => name,
        Err(refusal) => return *refusal,
    };
    let body = match body {
        Ok(b) => b,
        Err(e) => return text(e.status(), e.body_text()),
    };
    let (title, wait, lifetime) = match parse_request(&body, s.gateway.options()) {
        Ok(r) => r,
        Err(m) => return text(StatusCode::BAD_REQUEST, m),
    };
    let req = AcquireRequest {
        resource: resource.clone(),
        title,
        wait,
        lifetime,
    };
    match s.acquire(req).await {
        Ok(grant) => {
            let info = grant.info();
            let url = format!("{}/locks/{resource}/{}", s.base_url, info.uid);
            let mut resp = StatusCode::CREATED.into_response();
            if let Ok(v) = HeaderValue::from_str(&url) {
                resp.headers_mut().insert(LOCATION, v);
            }
            if let Some(t) = info.token.and_then(|t| t.to_string().parse().ok()) {
                resp.headers_mut()
                    .insert(HeaderName::from_static(TOKEN_HEADER), t);
            }
            // The last step before the answer leaves.
            match grant.hand_over() {
                Ok(info) => {
                    if let Some(left) = info.lifetime_left {
                        resp.headers_mut().insert(
                            HeaderName::from_static(LIFETIME_LEFT_HEADER),
                            lifetime_left_header(left),
                        );
                    }
                    resp
                }
                Err(e) => late(&e),
            }
        }
        Err(AcquireFailure::Gateway(e @ AcquireError::Late(_))) => late(&e),
        Err(AcquireFailure::Gateway(AcquireError::Timeout)) => {
            StatusCode::REQUEST_TIMEOUT.into_response()
        }
        // A fresh resource's first grant waits W + G' (S4): say so in the
        // body (RDLM clients read only the status).
        Err(AcquireFailure::Gateway(e @ AcquireError::TimeoutInAbsentWait { .. })) => {
            (StatusCode::REQUEST_TIMEOUT, e.to_string()).into_response()
        }
        Err(AcquireFailure::Gateway(AcquireError::Cancelled)) => {
            StatusCode::CONFLICT.into_response()
        }
        Err(AcquireFailure::Gateway(AcquireError::Invalid(m))) => text(StatusCode::BAD_REQUEST, m),
        Err(AcquireFailure::Gateway(AcquireError::Store(e))) => store_error(e),
        Err(AcquireFailure::ShuttingDown) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        ),
    }
}

/// A lock (RDLM), granted or waiting.
#[utoipa::path(
    get,
    path = "/locks/{resource}/{uid}",
    tag = "rdlm",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[a-zA-Z0-9]{1,64}$"),
        ("uid" = String, Path, description = "The lock's uid", pattern = "^[a-zA-Z0-9]+$"),
    ),
    responses(
        (status = 200, description = "The lock", body = HalLock, content_type = "application/hal+json"),
        (status = 400, description = "Resource name too long", body = String, content_type = "text/plain"),
        Unauthorized,
        (status = 404, description = "Released, expired, revoked or unknown", body = String, content_type = "text/plain"),
        RdlmStoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn get_lock(
    State(s): State<Arc<Shared>>,
    RdlmPath((resource, uid)): RdlmPath<(String, String)>,
) -> Response {
    let resource = match resource_name(&resource) {
        Ok(name) => name,
        Err(refusal) => return *refusal,
    };
    let Some(uid) = lock_uid(&uid) else {
        return lock_not_found();
    };
    match s.gateway.get(&resource, &uid).await {
        Ok(Some(info)) => hal(&HalLock::new(&info, true)),
        Ok(None) => lock_not_found(),
        Err(e) => store_error(e),
    }
}

/// Release a lock (RDLM).
#[utoipa::path(
    delete,
    path = "/locks/{resource}/{uid}",
    tag = "rdlm",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[a-zA-Z0-9]{1,64}$"),
        ("uid" = String, Path, description = "The lock's uid", pattern = "^[a-zA-Z0-9]+$"),
    ),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "Resource name too long", body = String, content_type = "text/plain"),
        Unauthorized,
        (status = 404, description = "Not held: released, expired, revoked or unknown", body = String, content_type = "text/plain"),
        RdlmStoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn release(
    State(s): State<Arc<Shared>>,
    RdlmPath((resource, uid)): RdlmPath<(String, String)>,
) -> Response {
    let resource = match resource_name(&resource) {
        Ok(name) => name,
        Err(refusal) => return *refusal,
    };
    let Some(uid) = lock_uid(&uid) else {
        return lock_not_found();
    };
    match s.gateway.release(&resource, &uid).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => lock_not_found(),
        Err(e) => store_error(e),
    }
}

/// Admin: every resource with locks (RDLM).
#[utoipa::path(
    get,
    path = "/resources",
    tag = "rdlm",
    responses(
        (status = 200, description = "The resources", body = HalResources, content_type = "application/hal+json"),
        Unauthorized,
        RdlmStoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn list_resources(State(s): State<Arc<Shared>>) -> Response {
    let names = match s.gateway.resources().await {
        Ok(n) => n,
        Err(e) => return store_error(e),
    };
    let resources: Vec<HalResourceRef> = names
        .into_iter()
        .map(|name| HalResourceRef {
            links: HalSelf {
                this: HalLink::new(format!("/resources/{name}")),
            },
            name: name.to_string(),
        })
        .collect();
    hal(&HalResources {
        links: HalSelf {
            this: HalLink::new("/resources".into()),
        },
        embedded: (!resources.is_empty()).then_some(HalEmbeddedResources { resources }),
    })
}

/// Admin: a resource and its locks (RDLM); `200` also without locks.
#[utoipa::path(
    get,
    path = "/resources/{resource}",
    tag = "rdlm",
    params(("resource" = String, Path, description = "The resource", pattern = "^[a-zA-Z0-9]{1,64}$")),
    responses(
        (status = 200, description = "The resource", body = HalResource, content_type = "application/hal+json"),
        (status = 400, description = "Resource name too long", body = String, content_type = "text/plain"),
        Unauthorized,
        (status = 404, description = "Not an RDLM resource name", body = String, content_type = "text/plain"),
        RdlmStoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn get_resource(
    State(s): State<Arc<Shared>>,
    RdlmPath(resource): RdlmPath<String>,
) -> Response {
    let resource = match resource_name(&resource) {
        Ok(name) => name,
        Err(refusal) => return *refusal,
    };
    let locks = match s.gateway.locks(&resource).await {
        Ok(l) => l,
        Err(e) => return store_error(e),
    };
    let locks: Vec<HalLock> = locks.iter().map(|l| HalLock::new(l, false)).collect();
    hal(&HalResource {
        links: HalSelf {
            this: HalLink::new(format!("/resources/{resource}")),
        },
        name: resource.to_string(),
        embedded: (!locks.is_empty()).then_some(HalEmbeddedLocks { locks }),
    })
}

/// Admin: delete every lock of a resource (RDLM): the waiting ones get
/// `409`; a lock granted over HTTP is freed at once (`released`: the next
/// request gets it at once; its client is not told, its fencing token is
/// what protects the resource); a `putex lock` or agent holder is revoked
/// (S7: it stops, takers wait W + G').
#[utoipa::path(
    delete,
    path = "/resources/{resource}",
    tag = "rdlm",
    params(("resource" = String, Path, description = "The resource", pattern = "^[a-zA-Z0-9]{1,64}$")),
    responses(
        (status = 204, description = "Deleted: waiters cancelled, an HTTP lock freed at once, a putex lock or agent holder revoked"),
        (status = 400, description = "Resource name too long", body = String, content_type = "text/plain"),
        Unauthorized,
        (status = 404, description = "The resource has no lock", body = String, content_type = "text/plain"),
        RdlmStoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn delete_resource(
    State(s): State<Arc<Shared>>,
    RdlmPath(resource): RdlmPath<String>,
) -> Response {
    let resource = match resource_name(&resource) {
        Ok(name) => name,
        Err(refusal) => return *refusal,
    };
    match s.gateway.delete(&resource).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => text(StatusCode::NOT_FOUND, "no resource (with locks) found"),
        Err(e) => store_error(e),
    }
}

/// Admin: delete every lock of every resource (RDLM), as
/// `DELETE /resources/{resource}` does for one.
#[utoipa::path(
    delete,
    path = "/resources",
    tag = "rdlm",
    responses(
        (status = 204, description = "Deleted: waiters cancelled, HTTP locks freed at once, putex lock and agent holders revoked"),
        Unauthorized,
        RdlmStoreFailure,
    ),
    security((), ("basic" = []), ("bearer" = [])),
)]
pub(crate) async fn delete_all(State(s): State<Arc<Shared>>) -> Response {
    match s.gateway.delete_all().await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => store_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> GatewayOptions {
        GatewayOptions {
            node: "n".parse().unwrap(),
            max_drift: putex_core::Drift::from_percent(1.0),
            max_lifetime: Duration::from_secs(3600),
            max_wait: Duration::from_secs(60),
            acquire_lease: crate::locks::gateway::DEFAULT_ACQUIRE_LEASE,
            grant_deadline: crate::locks::gateway::DEFAULT_GRANT_DEADLINE,
        }
    }

    #[test]
    fn lock_requests_are_read_like_rdlm() {
        let ok = |b: &str| parse_request(b.as_bytes(), &opts());
        assert_eq!(
            ok(r#"{"title": "t", "wait": 5, "lifetime": 300}"#).unwrap(),
            ("t".into(), Duration::from_secs(5), Duration::from_secs(300))
        );
        assert_eq!(
            ok(r#"{"title": "t", "wait": "1.5", "lifetime": 0.25}"#).unwrap(),
            (
                "t".into(),
                Duration::from_millis(1500),
                Duration::from_millis(250)
            )
        );
        for (body, says) in [
            ("", "empty body"),
            ("  \n", "empty body"),
            (r#"{"title": "t", "wa"#, "invalid json body"),
            ("[1]", "not a JSON object"),
            (r#"{"wait": 5, "lifetime": 10}"#, "title is missing"),
            (r#"{"title": "t", "lifetime": 10}"#, "wait is missing"),
            (r#"{"title": "t", "wait": 1}"#, "lifetime is missing"),
            (r#"{"title": 1, "wait": 1, "lifetime": 1}"#, "title must be"),
            (r#"{"title": "t", "wait": -1, "lifetime": 1}"#, "at least 0"),
            (r#"{"title": "t", "wait": "NaN", "lifetime": 1}"#, "finite"),
            (r#"{"title": "t", "wait": true, "lifetime": 1}"#, "number"),
            (r#"{"title": "t", "wait": 61, "lifetime": 1}"#, "--max-wait"),
            (
                r#"{"title": "t", "wait": 1, "lifetime": 1e300}"#,
                "--max-lifetime",
            ),
        ] {
            let e = ok(body).unwrap_err();
            assert!(e.contains(says), "{body:?}: {e}");
        }
    }

    #[test]
    fn rdlm_names_and_times() {
        assert!(resource_name("resource1").is_ok());
        assert_eq!(
            resource_name("a_b").unwrap_err().status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            resource_name(&"a".repeat(65)).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_358_895_676_771_799);
        assert_eq!(rdlm_time(t), "2013-01-22T23:01:16.771799");
    }
}
