//! Authentication for `putex serve`: an optional bearer token for the whole
//! server and optional HTTP Basic credentials for the administrative calls.
//!
//! | route | needs |
//! |---|---|
//! | `/health` | nothing |
//! | admin calls (`/resources…`, `DELETE /v1/locks/{resource}`) | the admin's Basic credentials when `--admin-user` is set, else the bearer token when `--token-file` is set |
//! | everything else | the bearer token when `--token-file` is set |
//!
//! An `Authorization` header carries one scheme, so an admin call needs
//! only the admin's credentials, not the token as well: they are the
//! stronger, narrower secret. A refusal is `401` with a `WWW-Authenticate`
//! challenge (`Basic realm="putex admin"` or `Bearer`) and the API's JSON
//! error body.
//!
//! Secrets are compared in constant time with [`subtle`]: the comparison
//! reads every byte whatever the first difference, so its duration tells
//! an attacker nothing about how much of a guess was right. `subtle`
//! compares the lengths first; a secret's length is not treated as secret
//! (tokens should be long random strings).

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use subtle::ConstantTimeEq;

use super::v1::{ApiError, ErrorCode};

/// A secret string that does not show in `Debug` output or logs.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// Whether `candidate` equals the secret, in constant time.
    fn matches(&self, candidate: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(candidate).into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// The admin's HTTP Basic credentials.
#[derive(Clone, Debug)]
pub struct AdminCredentials {
    /// The user name an admin call must present (`--admin-user`); `putex
    /// serve` refuses an empty one or one with `:`.
    pub user: String,
    /// The password it must present (`--admin-password-file`), compared in
    /// constant time.
    pub password: Secret,
}

/// Who may call what. The default lets everyone call everything (RDLM's
/// default).
#[derive(Clone, Debug, Default)]
pub struct AuthSettings {
    /// The bearer token every route but `/health` needs.
    pub token: Option<Secret>,
    /// The credentials the administrative calls need.
    pub admin: Option<AdminCredentials>,
}

impl AuthSettings {
    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        credentials(headers, "Bearer").is_some_and(|c| token.matches(c.as_bytes()))
    }

    fn basic_ok(admin: &AdminCredentials, headers: &HeaderMap) -> bool {
        let Some(encoded) = credentials(headers, "Basic") else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return false;
        };
        let Some(colon) = decoded.iter().position(|&b| b == b':') else {
            return false;
        };
        let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
        // Both halves are compared, whatever the first one says.
        let user_ok = admin.user.as_bytes().ct_eq(user);
        let password_ok = admin.password.0.as_bytes().ct_eq(password);
        (user_ok & password_ok).into()
    }
}

/// The credentials of `Authorization: <scheme> <credentials>` (the scheme
/// is case-insensitive).
fn credentials<'h>(headers: &'h HeaderMap, scheme: &str) -> Option<&'h str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (s, rest) = value.split_once(' ')?;
    s.eq_ignore_ascii_case(scheme).then(|| rest.trim_start())
}

fn refuse(challenge: &'static str, message: &str) -> Response {
    let mut resp = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    resp.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    resp
}

/// Middleware: the bearer token, when one is configured.
pub(crate) async fn require_token(
    State(auth): State<Arc<AuthSettings>>,
    req: Request,
    next: Next,
) -> Response {
    if auth.bearer_ok(req.headers()) {
        next.run(req).await
    } else {
        refuse(
            "Bearer",
            "a valid `Authorization: Bearer <token>` is needed",
        )
    }
}

/// Middleware for the administrative calls: the admin's Basic credentials
/// when configured, else the bearer token when configured.
pub(crate) async fn require_admin(
    State(auth): State<Arc<AuthSettings>>,
    req: Request,
    next: Next,
) -> Response {
    match &auth.admin {
        Some(admin) if !AuthSettings::basic_ok(admin, req.headers()) => refuse(
            "Basic realm=\"putex admin\"",
            "administrative calls need the admin's HTTP Basic credentials",
        ),
        None if !auth.bearer_ok(req.headers()) => refuse(
            "Bearer",
            "a valid `Authorization: Bearer <token>` is needed",
        ),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let auth = AuthSettings {
            token: Some(Secret::new("s3cret")),
            admin: None,
        };
        assert!(auth.bearer_ok(&headers("Bearer s3cret")));
        assert!(auth.bearer_ok(&headers("bearer s3cret")));
        assert!(!auth.bearer_ok(&headers("Bearer s3cre")));
        assert!(!auth.bearer_ok(&headers("Bearer s3cret2")));
        assert!(!auth.bearer_ok(&headers("Basic s3cret")));
        assert!(!auth.bearer_ok(&HeaderMap::new()));
        assert!(AuthSettings::default().bearer_ok(&HeaderMap::new()));
    }

    #[test]
    fn basic_credentials_need_user_and_password() {
        let admin = AdminCredentials {
            user: "admin".into(),
            password: Secret::new("pa:ss"),
        };
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ok = |s: &str| AuthSettings::basic_ok(&admin, &headers(&format!("Basic {}", b64(s))));
        assert!(ok("admin:pa:ss"), "the password may contain a colon");
        assert!(!ok("admin:pa"));
        assert!(!ok("admi:pa:ss"));
        assert!(!ok("adminpa:ss"));
        assert!(!ok(""));
        assert!(!AuthSettings::basic_ok(&admin, &headers("Basic !!!")));
        assert!(!AuthSettings::basic_ok(&admin, &HeaderMap::new()));
        assert_eq!(format!("{:?}", admin.password), "Secret(…)");
    }
}
