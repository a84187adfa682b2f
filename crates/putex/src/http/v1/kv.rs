//! Guarded writes and token checks over HTTP (`docs/http.md`, "Guarded
//! writes and token checks").
//!
//! | call | what |
//! |---|---|
//! | `GET /v1/locks/{lock}/check?token=T` | whether T is a fencing token of the holding the lock's record shows now (Chubby's `CheckSequencer`) |
//! | `PUT /v1/locks/{resource}/{uid}/kv/{key}` | the body as the value of `key`, if the grant `uid` still holds the lock when the store commits it |
//! | `DELETE /v1/locks/{resource}/{uid}/kv/{key}` | delete `key`, on the same terms |
//! | `POST /v1/locks/{resource}/{uid}/kv` | several puts and deletes, all or none, on the same terms (not on NATS) |
//! | `GET /v1/kv/{key}` | a key's value as the store has it now |
//! | `GET /v1/kv?prefix=P` | the keys, with their revisions |
//!
//! A guarded write is refused by the store itself once the lock has moved
//! (`409 not_held`, nothing written); the token check is an answer as of
//! its read.

use axum::extract::RawQuery;
use axum::http::header::CONTENT_TYPE;

use super::*;
use crate::locks::guard::{self, GuardError, MAX_VALUES};
use crate::store::Write;

/// Whether a fencing token is the current holder's.
#[utoipa::path(
    get,
    path = "/v1/locks/{lock}/check",
    tag = "v1",
    params(
        ("lock" = String, Path, description = "The lock (an HTTP resource, a `putex lock` or agent lock)", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("token" = String, Query, description = "The fencing token, EPOCH:REVISION"),
    ),
    responses(
        (status = 200, description = "The answer (`held`: true or false)", body = TokenCheckView),
        (status = 400, description = "Malformed lock name or token", body = ErrorBody),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn check_token(
    State(s): State<Arc<Shared>>,
    V1Path(lock): V1Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<TokenCheckView>, ApiError> {
    let lock = check_name("lock", &lock)?;
    let text = query_value(query.as_deref(), "token").ok_or_else(|| {
        ApiError::new(
            ErrorCode::Invalid,
            "token: missing; ask with ?token=EPOCH:REVISION (X-Putex-Token, PUTEX_TOKEN)",
        )
    })?;
    let token = Token::parse(&text).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Invalid,
            format!("token: {text:?} is not EPOCH:REVISION (two decimal integers)"),
        )
    })?;
    let store = s.gateway.store();
    let entry = store
        .get(&keys::lock(&lock), ReadMode::Leader, READ_TIMEOUT)
        .await?;
    Ok(Json(TokenCheckView::new(&lock, token, entry.as_ref())))
}

/// How long a read of the store may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The value of `name` in a query string, percent-decoded.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| {
            let v = v.replace('+', " ");
            percent_encoding::percent_decode_str(&v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Put a key, guarded by a grant.
#[utoipa::path(
    put,
    path = "/v1/locks/{resource}/{uid}/kv/{key}",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The grant's uid"),
        ("key" = String, Path, description = "The key: A-Z a-z 0-9 - _ / = in dot-separated parts"),
    ),
    request_body(content = String, description = "The value (any bytes, at most 512 KiB)", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written while the grant held the lock", body = WrittenView),
        (status = 400, description = "Malformed key or value too large", body = ErrorBody),
        Unauthorized,
        (status = 409, description = "`not_held`: the grant no longer holds the lock; nothing was written", body = ErrorBody),
        (status = 503, description = "Store failure: a write whose outcome is unknown says so (read the key back)", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn put_key(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid, key)): V1Path<(String, String, String)>,
    body: Bytes,
) -> Result<Json<WrittenView>, ApiError> {
    let write = Write::Put {
        key,
        value: body.to_vec(),
    };
    guarded(&s, &resource, &uid, vec![write]).await
}

/// Delete a key, guarded by a grant.
#[utoipa::path(
    delete,
    path = "/v1/locks/{resource}/{uid}/kv/{key}",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The grant's uid"),
        ("key" = String, Path, description = "The key"),
    ),
    responses(
        (status = 200, description = "Deleted (or absent) while the grant held the lock", body = WrittenView),
        (status = 400, description = "Malformed key", body = ErrorBody),
        Unauthorized,
        (status = 409, description = "`not_held`: nothing was deleted", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn delete_key(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid, key)): V1Path<(String, String, String)>,
) -> Result<Json<WrittenView>, ApiError> {
    guarded(&s, &resource, &uid, vec![Write::Delete { key }]).await
}

/// Several puts and deletes, all or none, guarded by a grant.
#[utoipa::path(
    post,
    path = "/v1/locks/{resource}/{uid}/kv",
    tag = "v1",
    params(
        ("resource" = String, Path, description = "The resource", pattern = "^[A-Za-z0-9_-]{1,64}$"),
        ("uid" = String, Path, description = "The grant's uid"),
    ),
    request_body = KvBatchBody,
    responses(
        (status = 200, description = "All written while the grant held the lock", body = WrittenView),
        (status = 400, description = "Malformed, a key named twice, too large, or a batch on a nats-server before 2.12", body = ErrorBody),
        Unauthorized,
        (status = 409, description = "`not_held`: nothing was written", body = ErrorBody),
        (status = 503, description = "Store failure", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn batch(
    State(s): State<Arc<Shared>>,
    V1Path((resource, uid)): V1Path<(String, String)>,
    V1Json(body): V1Json<KvBatchBody>,
) -> Result<Json<WrittenView>, ApiError> {
    if body.writes.is_empty() {
        return Err(ApiError::new(ErrorCode::Invalid, "writes: empty"));
    }
    let writes = body
        .writes
        .into_iter()
        .map(|w| match w {
            KvWriteBody::Put { key, value } => Write::Put {
                key,
                value: value.into_bytes(),
            },
            KvWriteBody::Delete { key } => Write::Delete { key },
        })
        .collect();
    guarded(&s, &resource, &uid, writes).await
}

async fn guarded(
    s: &Shared,
    resource: &str,
    uid: &str,
    writes: Vec<Write>,
) -> Result<Json<WrittenView>, ApiError> {
    let resource = check_name("resource", resource)?;
    let not_held = || {
        ApiError::new(
            ErrorCode::NotHeld,
            format!("lock {uid} on {resource} is not held (released, expired, revoked, taken over or unknown): nothing was written"),
        )
    };
    let Some(uid) = lock_uid(uid) else {
        return Err(not_held());
    };
    match s.gateway.guarded(&resource, &uid, &writes).await {
        Ok(token) => Ok(Json(WrittenView {
            revision: token.to_string(),
        })),
        Err(GuardError::NotHeld) => Err(not_held()),
        Err(e @ GuardError::Invalid(_)) => Err(ApiError::new(ErrorCode::Invalid, e.to_string())),
        Err(e @ GuardError::Unknown(_)) => Err(ApiError::new(
            ErrorCode::Store,
            format!("{e}: the write may or may not have landed; read the key back"),
        )),
        Err(e) => Err(ApiError::new(ErrorCode::Store, e.to_string())),
    }
}

/// A key's value as the store has it now.
#[utoipa::path(
    get,
    path = "/v1/kv/{key}",
    tag = "v1",
    params(("key" = String, Path, description = "The key")),
    responses(
        (status = 200, description = "The value, as written", content_type = "application/octet-stream", body = String),
        (status = 400, description = "Malformed key", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "No such key", body = ErrorBody),
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn get_key(
    State(s): State<Arc<Shared>>,
    V1Path(key): V1Path<String>,
) -> Result<Response, ApiError> {
    match guard::get(s.gateway.store(), &key).await {
        Ok(Some(value)) => Ok((
            [(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            value,
        )
            .into_response()),
        Ok(None) => Err(ApiError::new(ErrorCode::NotFound, format!("no key {key}"))),
        Err(e @ StoreError::Config { .. }) => Err(ApiError::new(ErrorCode::Invalid, e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// The keys (all, or those that start with `prefix`).
#[utoipa::path(
    get,
    path = "/v1/kv",
    tag = "v1",
    params(("prefix" = Option<String>, Query, description = "Only keys that start with this")),
    responses(
        (status = 200, description = "The keys, in order", body = KvList),
        Unauthorized,
        StoreFailure,
    ),
    security((), ("bearer" = [])),
)]
pub(crate) async fn list_keys(
    State(s): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Json<KvList>, ApiError> {
    let prefix = query_value(query.as_deref(), "prefix").unwrap_or_default();
    let keys = guard::list(s.gateway.store(), &prefix)
        .await?
        .into_iter()
        .map(|(key, token)| KvKeyView {
            key,
            revision: token.to_string(),
        })
        .collect();
    Ok(Json(KvList { keys }))
}

/// The answer to a token check.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCheckView {
    /// The lock.
    pub lock: String,
    /// The token asked about, `EPOCH:REVISION`.
    pub token: String,
    /// Whether it is a fencing token of the holding the lock's record
    /// shows at the moment of the read: the record is `confirming` or
    /// `active`, and the token lies between that holding's first write and
    /// the record's own revision (`docs/safety.md` §6).
    pub held: bool,
    /// The record's state.
    pub state: RecordState,
    /// The holder's node id (the last holder's, for `released` and
    /// `revoked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The record's own revision now, `EPOCH:REVISION` (a renewal moves
    /// it; a holding's tokens stay held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
}

impl TokenCheckView {
    fn new(lock: &Name, token: Token, entry: Option<&Entry>) -> TokenCheckView {
        let mut view = TokenCheckView {
            lock: lock.to_string(),
            token: token.to_string(),
            held: false,
            state: RecordState::Absent,
            holder: None,
            record: entry.map(|e| e.token.to_string()),
        };
        if let Some(e) = entry {
            match Observed::decode(&e.value) {
                Observed::Record(r) => {
                    view.held = r.holds_token(e.token, token);
                    view.state = r.state.into();
                    view.holder = Some(r.node);
                }
                Observed::Garbage => view.state = RecordState::Unreadable,
            }
        }
        view
    }
}

/// A guarded write that landed.
#[derive(Debug, Serialize, ToSchema)]
pub struct WrittenView {
    /// The store's revision of the write, `EPOCH:REVISION`.
    pub revision: String,
}

/// Several guarded writes, all or none.
#[derive(Debug, Deserialize, ToSchema)]
pub struct KvBatchBody {
    /// The writes, each key at most once; at most 512 KiB of values in all.
    pub writes: Vec<KvWriteBody>,
}

/// One write of a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum KvWriteBody {
    /// Set `key` to `value` (text).
    Put {
        /// The key.
        key: String,
        /// The value, as text.
        value: String,
    },
    /// Delete `key` (nothing if absent).
    Delete {
        /// The key.
        key: String,
    },
}

/// The keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct KvList {
    /// The keys, in order.
    pub keys: Vec<KvKeyView>,
}

/// A key.
#[derive(Debug, Serialize, ToSchema)]
pub struct KvKeyView {
    /// The key (without the store's `kv.`).
    pub key: String,
    /// The store's revision of its last write, `EPOCH:REVISION`.
    pub revision: String,
}

/// The most a body of the guarded-write calls may carry: a batch's JSON
/// with values of up to [`MAX_VALUES`] in all, escaped.
pub(crate) const KV_BODY_LIMIT: usize = 4 * MAX_VALUES;
