//! The HTTP server behind `putex serve`: the lock [`Gateway`] for any
//! language, over HTTP.
//!
//! | module | what it is for |
//! |---|---|
//! | `agent` | the failover agent's endpoints (`putex run --http`): `/primary`, `/replica`, health, metrics |
//! | `rdlm` | the RDLM-compatible API at the root (`/locks/…`, `/resources/…`), so existing RDLM clients keep working |
//! | `v1` | the versioned JSON API under `/v1/`: locks with fencing tokens, renewals, listings, status and members |
//! | `auth` | the optional bearer token for the whole server and Basic credentials for the admin calls |
//! | `tls` | TLS with rustls (the `ring` stack async-nats already uses) |
//! | `openapi` | the OpenAPI 3 document at `/openapi.json`, generated from the handlers and types |
//!
//! [`serve`] takes a bound listener and a shutdown future, so tests bind
//! `127.0.0.1:0` and run the real server in-process. On shutdown it stops
//! accepting, ends waiting lock requests at once (`503`; the gateway
//! abandons them, see [`Gateway::acquire`]), and gives the other requests
//! in flight [`HttpOptions::grace`] to finish.
//!
//! The business logic — waiting, granting, expiry, revocation — is the
//! [`Gateway`]'s; this module only translates HTTP.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::locks::gateway::{AcquireError, AcquireRequest, Gateway, Grant};
use crate::store::Name;

pub(crate) mod agent;
pub(crate) mod auth;
pub(crate) mod openapi;
pub(crate) mod rdlm;
pub(crate) mod tls;
pub(crate) mod v1;

pub use auth::{AdminCredentials, AuthSettings, Secret};
pub use tls::{TlsError, TlsSettings};

/// The default [`HttpOptions::grace`].
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The largest request body accepted (a lock request is a few dozen bytes).
const BODY_LIMIT: usize = 64 * 1024;

/// The response header carrying a granted lock's fencing token,
/// `EPOCH:REVISION`.
pub const TOKEN_HEADER: &str = "x-putex-token";

/// The response header of a granted or renewed lock saying how much of its
/// licence is left, in seconds with three decimals (`60.996`): `lifetime`
/// plus the grant deadline, minus the time since the grant's write, as the
/// answer left the gateway (see `docs/http.md`).
pub const LIFETIME_LEFT_HEADER: &str = "x-putex-lifetime-left";

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listener has no local address (it is not bound).
    #[error("the listener has no local address: {0}")]
    LocalAddr(#[source] io::Error),
    /// Accepting or serving connections failed: an I/O error of the
    /// listener.
    #[error("serving HTTP: {0}")]
    Serve(#[source] io::Error),
}

/// How the server presents itself and whom it lets in.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// The URL clients reach the server at (`https://locks.example.com`,
    /// maybe with a path prefix behind a reverse proxy), for the absolute
    /// `Location` of a granted lock. `None`: built from the listener's
    /// address (its host name when it listens on every address) — never
    /// from the client's `Host` header, which a client may set to anything.
    /// Check it with [`parse_public_url`].
    pub public_url: Option<String>,
    /// Who may call what.
    pub auth: AuthSettings,
    /// TLS for every connection, or plain HTTP.
    pub tls: Option<TlsSettings>,
    /// How long requests in flight may take to finish after shutdown was
    /// asked for.
    pub grace: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            public_url: None,
            auth: AuthSettings::default(),
            tls: None,
            grace: DEFAULT_GRACE,
        }
    }
}

/// Checks a public URL: `http://` or `https://`, a host, no query or
/// fragment; returns it without a trailing `/`.
pub fn parse_public_url(url: &str) -> Result<String, String> {
    let url = url.trim();
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} must start with http:// or https://"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{url:?} must be a plain base URL (no query, fragment or spaces)"
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// The base of the `Location` URLs when no public URL is configured.
fn base_url_from(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = match addr.ip() {
        ip if ip.is_unspecified() => crate::identity::hostname(),
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("{scheme}://{host}:{}", addr.port())
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) gateway: Gateway,
    /// The base of absolute URLs, without a trailing `/`.
    pub(crate) base_url: String,
    /// Cancelled when the server shuts down: waiting requests end.
    pub(crate) shutdown: CancellationToken,
    /// `/openapi.json`, rendered once.
    pub(crate) openapi: String,
}

/// Why a lock request through the HTTP layer was not granted.
#[derive(Debug)]
pub(crate) enum AcquireFailure {
    /// The gateway said no.
    Gateway(AcquireError),
    /// The server is shutting down.
    ShuttingDown,
}

impl Shared {
    /// The gateway's acquire, abandoned (dropped, so the gateway releases
    /// anything granted at that moment) when the server shuts down. The
    /// handler hands the [`Grant`] over as the last step of its answer.
    pub(crate) async fn acquire(&self, req: AcquireRequest) -> Result<Grant, AcquireFailure> {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Err(AcquireFailure::ShuttingDown),
            r = self.gateway.acquire_grant(req) => r.map_err(AcquireFailure::Gateway),
        }
    }
}

/// A duration in seconds from a request: finite, not negative, at most
/// `max` (`flag` names the option that sets it).
pub(crate) fn parse_seconds(
    field: &str,
    secs: f64,
    max: Duration,
    flag: &str,
) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!(
            "{field} must be a finite number of seconds, at least 0 (got {secs})"
        ));
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= max => Ok(d),
        _ => Err(format!(
            "{field} {secs}s is above the maximum {}s ({flag})",
            max.as_secs_f64()
        )),
    }
}

/// A lifetime in seconds from a request: [`parse_seconds`], and at least
/// the gateway's [`MIN_LIFETIME`](crate::locks::gateway::MIN_LIFETIME).
pub(crate) fn parse_lifetime(secs: f64, max: Duration) -> Result<Duration, String> {
    let d = parse_seconds("lifetime", secs, max, "--max-lifetime")?;
    if d < crate::locks::gateway::MIN_LIFETIME {
        return Err(format!(
            "lifetime must be at least {}s (got {secs})",
            crate::locks::gateway::MIN_LIFETIME.as_secs_f64()
        ));
    }
    Ok(d)
}

/// Whether `uid` can be a lock uid (`[A-Za-z0-9]{1,64}`); anything else
/// names no lock.
pub(crate) fn lock_uid(uid: &str) -> Option<Name> {
    let plausible = (1..=64).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_alphanumeric());
    plausible.then(|| Name::new(uid).ok()).flatten()
}

/// A duration in seconds, rounded down to the millisecond: what is left of a
/// lock is never overstated.
pub(crate) fn seconds_floor_ms(d: Duration) -> f64 {
    (d.as_millis() as f64) / 1000.0
}

/// [`LIFETIME_LEFT_HEADER`]'s value for `left`.
pub(crate) fn lifetime_left_header(left: Duration) -> axum::http::HeaderValue {
    axum::http::HeaderValue::from_str(&format!("{:.3}", seconds_floor_ms(left)))
        .expect("a number is a header value")
}

/// A duration as JSON seconds: an integer when whole (as RDLM writes
/// them), else a float.
pub(crate) fn seconds_json(d: Duration) -> serde_json::Value {
    if d.subsec_nanos() == 0 {
        d.as_secs().into()
    } else {
        d.as_secs_f64().into()
    }
}

/// RFC 3339 in UTC with microseconds: `2013-01-22T23:01:16.771799Z`. RFC
/// 3339 ends with the year 9999: a later time (from a record a KV tool
/// wrote) shows as its last microsecond, an earlier one as the epoch.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let last = UNIX_EPOCH + Duration::from_micros(253_402_300_799_999_999);
    humantime::format_rfc3339_micros(t.clamp(UNIX_EPOCH, last)).to_string()
}

/// The server: the gateway and how to present it.
#[derive(Clone, Debug)]
pub struct App {
    gateway: Gateway,
    options: HttpOptions,
}

impl App {
    /// The server for `gateway`, presented and guarded as `options` say;
    /// [`serve`] runs it.
    pub fn new(gateway: Gateway, options: HttpOptions) -> App {
        App { gateway, options }
    }

    /// The routes, with absolute URLs based on `base_url` and waiting
    /// requests ended by `shutdown`.
    fn router(&self, base_url: String, shutdown: CancellationToken) -> Router {
        let mut doc = serde_json::to_value(openapi::document(&self.options.auth))
            .expect("the OpenAPI document serialises");
        openapi::set_limits(&mut doc, self.gateway.options());
        let shared = Arc::new(Shared {
            gateway: self.gateway.clone(),
            base_url,
            shutdown,
            openapi: doc.to_string(),
        });
        let auth = Arc::new(self.options.auth.clone());
        let token = axum::middleware::from_fn_with_state(auth.clone(), auth::require_token);
        // The web status page ([`crate::report::web`]), behind the same token.
        let page = crate::report::web::router(self.gateway.store().clone(), None).route_layer(
            axum::middleware::from_fn_with_state(auth.clone(), auth::require_token),
        );
        let admin = axum::middleware::from_fn_with_state(auth, auth::require_admin);
        let user_routes = Router::new()
            .route("/", get(rdlm::hello))
            .route("/locks/{resource}", post(rdlm::acquire))
            .route(
                "/locks/{resource}/{uid}",
                get(rdlm::get_lock).delete(rdlm::release),
            )
            .route("/v1/locks", get(v1::list))
            .route(
                "/v1/locks/{resource}",
                post(v1::acquire).get(v1::list_resource),
            )
            .route(
                "/v1/locks/{resource}/{uid}",
                get(v1::get_lock).delete(v1::release),
            )
            .route("/v1/locks/{resource}/{uid}/renew", post(v1::renew))
            .route("/v1/locks/{resource}/check", get(v1::kv::check_token))
            .route(
                "/v1/locks/{resource}/{uid}/kv",
                post(v1::kv::batch).layer(DefaultBodyLimit::max(v1::kv::KV_BODY_LIMIT)),
            )
            .route(
                "/v1/locks/{resource}/{uid}/kv/{*key}",
                put(v1::kv::put_key)
                    .delete(v1::kv::delete_key)
                    .layer(DefaultBodyLimit::max(v1::kv::KV_BODY_LIMIT)),
            )
            .route("/v1/kv", get(v1::kv::list_keys))
            .route("/v1/kv/{*key}", get(v1::kv::get_key))
            .route("/v1/status", get(v1::status_all))
            .route("/v1/status/{lock}", get(v1::status))
            .route("/v1/status/{lock}/members", get(v1::members))
            .route("/openapi.json", get(openapi::serve_document))
            .route_layer(token);
        let admin_routes = Router::new()
            .route(
                "/resources",
                get(rdlm::list_resources).delete(rdlm::delete_all),
            )
            .route(
                "/resources/{resource}",
                get(rdlm::get_resource).delete(rdlm::delete_resource),
            )
            .route("/v1/locks/{resource}", delete(v1::delete_resource))
            .route("/v1/locks/{resource}/revoke", post(v1::revoke))
            .route("/v1/locks/{resource}/force", post(v1::force))
            .route_layer(admin);
        Router::new()
            .merge(user_routes)
            .merge(admin_routes)
            .route("/health", get(v1::health))
            .fallback(v1::not_found)
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(shared)
            .merge(page)
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then stops
/// accepting, ends waiting lock requests (`503`) and gives the requests
/// still in flight [`HttpOptions::grace`] to finish.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    let local = listener.local_addr().map_err(HttpError::LocalAddr)?;
    let base_url = match &app.options.public_url {
        Some(u) => u.clone(),
        None => base_url_from(local, app.options.tls.is_some()),
    };
    let token = CancellationToken::new();
    let router = app.router(base_url.clone(), token.clone());
    tracing::info!(
        listen = %local,
        url = %base_url,
        tls = app.options.tls.is_some(),
        "putex serve: listening"
    );
    // One task turns the caller's shutdown future into the token that the
    // server, the TLS accept loop and the waiting handlers share.
    let signal = {
        let token = token.clone();
        tokio::spawn(async move {
            shutdown.await;
            token.cancel();
        })
    };
    let grace = app.options.grace;
    let stopped = {
        let token = token.clone();
        async move {
            token.cancelled().await;
            tokio::time::sleep(grace).await;
        }
    };
    let result = match &app.options.tls {
        None => {
            let server = axum::serve(listener, router.into_make_service())
                .with_graceful_shutdown(token.clone().cancelled_owned());
            tokio::select! {
                r = server => r,
                () = stopped => {
                    tracing::warn!("requests still in flight {grace:?} after shutdown: dropping them");
                    Ok(())
                }
            }
        }
        Some(tls) => {
            let listener =
                tls::TlsListener::new(listener, tls, token.clone()).map_err(HttpError::Serve)?;
            let server = axum::serve(listener, router.into_make_service())
                .with_graceful_shutdown(token.clone().cancelled_owned());
            tokio::select! {
                r = server => r,
                () = stopped => {
                    tracing::warn!("requests still in flight {grace:?} after shutdown: dropping them");
                    Ok(())
                }
            }
        }
    };
    signal.abort();
    tracing::info!("putex serve: stopped");
    result.map_err(HttpError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls_are_checked_and_normalised() {
        assert_eq!(
            parse_public_url("https://locks.example.com/").unwrap(),
            "https://locks.example.com"
        );
        assert_eq!(
            parse_public_url("http://10.0.0.1:8888/putex").unwrap(),
            "http://10.0.0.1:8888/putex"
        );
        assert!(parse_public_url("locks.example.com").is_err());
        assert!(parse_public_url("https:///x").is_err());
        assert!(parse_public_url("https://a/?q=1").is_err());
    }

    #[test]
    fn base_url_comes_from_the_listen_address() {
        let a: SocketAddr = "127.0.0.1:8888".parse().unwrap();
        assert_eq!(base_url_from(a, false), "http://127.0.0.1:8888");
        assert_eq!(base_url_from(a, true), "https://127.0.0.1:8888");
        let a: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(base_url_from(a, false), "http://[::1]:80");
        let a: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert!(!base_url_from(a, false).contains("0.0.0.0"));
    }

    #[test]
    fn times_and_durations_render_like_rdlm() {
        let t = UNIX_EPOCH + Duration::from_micros(1_358_895_676_771_799);
        assert_eq!(rfc3339(t), "2013-01-22T23:01:16.771799Z");
        assert_eq!(seconds_json(Duration::from_secs(5)), serde_json::json!(5));
        assert_eq!(
            seconds_json(Duration::from_millis(1500)),
            serde_json::json!(1.5)
        );
        assert!(lock_uid("aa4e181e17374148a21b30d9dcb941f9").is_some());
        assert!(lock_uid("").is_none());
        assert!(lock_uid("a-b").is_none());
    }
}
