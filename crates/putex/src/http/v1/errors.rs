//! The API's errors: `{"error": {"code", "message"}}` with the codes
//! of [`ErrorCode`], and the extractors that answer malformed requests so.

use super::*;

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
    /// A guarded write for a lock its grant no longer holds: nothing was
    /// written (`409`).
    NotHeld,
}

impl ErrorCode {
    /// The HTTP status of the code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Cancelled | ErrorCode::NotForceable | ErrorCode::NotHeld => {
                StatusCode::CONFLICT
            }
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

    fn store(e: impl std::fmt::Display) -> ApiError {
        ApiError::new(ErrorCode::Store, format!("store: {e}"))
    }

    pub(super) fn not_found(resource: &str, uid: &str) -> ApiError {
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
            AcquireFailure::Gateway(e @ AcquireError::TimeoutInAbsentWait { .. }) => {
                ApiError::new(ErrorCode::Timeout, e.to_string())
            }
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
        ApiError::new(ErrorCode::Store, e.to_string())
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

/// `name` checked: a malformed one is `400` naming `what`.
pub(super) fn check_name(what: &str, name: &str) -> Result<Name, ApiError> {
    Name::new(name).map_err(|e| ApiError::new(ErrorCode::Invalid, format!("{what}: {e}")))
}

// ---------------------------------------------------------------------------
// Responses shared by the handlers' OpenAPI attributes (both APIs).

/// The `401` of every call behind auth: a JSON error, on both APIs.
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "Missing or wrong credentials")]
#[allow(dead_code)] // a type for the document: only the derive reads it
pub struct Unauthorized(pub ErrorBody);

/// The `503` of a `/v1/` call that only reads or writes the store.
#[derive(utoipa::IntoResponses)]
#[response(status = 503, description = "Store failure")]
#[allow(dead_code)] // a type for the document: only the derive reads it
pub struct StoreFailure(pub ErrorBody);
