//! The OpenAPI 3 document of `putex serve`, served at `/openapi.json`.
//!
//! It is generated from the code: the handlers carry `#[utoipa::path]`
//! attributes and the request and response types derive
//! [`utoipa::ToSchema`], so the document changes with them. Both APIs are
//! in it, tagged `rdlm` and `v1`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::auth::AuthSettings;
use super::{rdlm, v1, Shared};
use crate::locks::gateway::{GatewayOptions, MIN_LIFETIME};

/// The document's skeleton, from the handlers' attributes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "putex serve",
        description = "The putex lock gateway: an RDLM-compatible API at the root and a \
                       versioned JSON API under /v1/ with fencing tokens. Locks live in \
                       the putex store and are exclusive with `putex lock` on the same name."
    ),
    paths(
        rdlm::hello,
        rdlm::acquire,
        rdlm::get_lock,
        rdlm::release,
        rdlm::list_resources,
        rdlm::get_resource,
        rdlm::delete_resource,
        rdlm::delete_all,
        v1::acquire,
        v1::get_lock,
        v1::release,
        v1::renew,
        v1::list,
        v1::list_resource,
        v1::delete_resource,
        v1::revoke,
        v1::force,
        v1::status_all,
        v1::status,
        v1::members,
        v1::kv::check_token,
        v1::kv::put_key,
        v1::kv::delete_key,
        v1::kv::batch,
        v1::kv::get_key,
        v1::kv::list_keys,
        v1::health,
    ),
    modifiers(&SecuritySchemes),
    tags(
        (name = "rdlm", description = "RDLM-compatible API (restful-distributed-lock-manager)"),
        (name = "v1", description = "Versioned JSON API"),
        (name = "ops", description = "Operations"),
    )
)]
pub struct ApiDoc;

/// Declares the `bearer` (`--token-file`) and `basic` (`--admin-user`)
/// schemes the operations refer to.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "basic",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Basic).build()),
        );
    }
}

/// The document for a server with `auth`: each operation lists the
/// credentials it needs there, or none (`{}`).
pub fn document(auth: &AuthSettings) -> utoipa::openapi::OpenApi {
    let scheme = |name: &str| SecurityRequirement::new(name, Vec::<String>::new());
    let mut doc = ApiDoc::openapi();
    for item in doc.paths.paths.values_mut() {
        for op in [&mut item.get, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
        {
            // The attributes list every option; an admin call is one that
            // lists `basic`. `/health` lists nothing: it is always open.
            let Some(reqs) = &mut op.security else {
                continue;
            };
            let admin = reqs.contains(&scheme("basic"));
            let needed = match (admin, &auth.admin, &auth.token) {
                // Basic replaces the bearer token on admin calls.
                (true, Some(_), _) => scheme("basic"),
                (_, _, Some(_)) => scheme("bearer"),
                _ => SecurityRequirement::default(),
            };
            *reqs = vec![needed];
        }
    }
    doc
}

/// Writes this server's limits into the request schemas: `wait` at most
/// `--max-wait`, `lifetime` between the gateway's minimum and
/// `--max-lifetime`.
pub fn set_limits(doc: &mut serde_json::Value, opts: &GatewayOptions) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    else {
        return;
    };
    for name in ["AcquireBody", "RenewBody", "RdlmLockRequest"] {
        let Some(props) = schemas
            .get_mut(name)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.as_object_mut())
        else {
            continue;
        };
        if let Some(w) = props.get_mut("wait").and_then(|w| w.as_object_mut()) {
            w.insert("maximum".into(), opts.max_wait.as_secs_f64().into());
        }
        if let Some(l) = props.get_mut("lifetime").and_then(|l| l.as_object_mut()) {
            l.insert("minimum".into(), MIN_LIFETIME.as_secs_f64().into());
            l.insert("maximum".into(), opts.max_lifetime.as_secs_f64().into());
        }
    }
}

/// `GET /openapi.json`.
pub(crate) async fn serve_document(State(s): State<Arc<Shared>>) -> Response {
    ([(CONTENT_TYPE, "application/json")], s.openapi.clone()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::auth::{AdminCredentials, Secret};
    use crate::observe::json::RecordState;

    #[test]
    fn fencing_tokens_are_strings_in_the_document_and_the_bodies() {
        let v = serde_json::to_value(document(&AuthSettings::default())).unwrap();
        let props = &v["components"]["schemas"]["FencingToken"]["properties"];
        for part in ["epoch", "revision"] {
            assert_eq!(props[part]["type"], "string", "{part}: {props}");
        }
        let epoch = 1_795_591_562_840_662_982_u64;
        let body = serde_json::to_string(&crate::http::v1::FencingToken::from(
            putex_core::Token::new(epoch, 37),
        ))
        .unwrap();
        assert_eq!(body, format!(r#"{{"epoch":"{epoch}","revision":"37"}}"#));
    }

    #[test]
    fn record_states_are_a_closed_list_in_the_document_and_the_records_spelling() {
        let v = serde_json::to_value(document(&AuthSettings::default())).unwrap();
        let states = &v["components"]["schemas"]["RecordState"]["enum"];
        let names = [
            "confirming",
            "active",
            "released",
            "revoked",
            "absent",
            "unreadable",
        ];
        assert_eq!(states, &serde_json::json!(names), "{states}");
        // The holder's states are spelled as its record spells them.
        use putex_core::LockState;
        for s in [
            LockState::Confirming,
            LockState::Active,
            LockState::Released,
            LockState::Revoked,
        ] {
            let record = serde_json::to_value(s).unwrap();
            assert_eq!(record, RecordState::from(s).as_str());
            assert_eq!(serde_json::to_value(RecordState::from(s)).unwrap(), record);
        }
    }

    fn security(doc: &utoipa::openapi::OpenApi, path: &str, method: &str) -> serde_json::Value {
        let v = serde_json::to_value(doc).unwrap();
        v["paths"][path][method]["security"].clone()
    }

    #[test]
    fn documents_every_route_and_its_security() {
        let open = document(&AuthSettings::default());
        let v = serde_json::to_value(&open).unwrap();
        assert!(v["openapi"].as_str().unwrap().starts_with("3."));
        for p in [
            "/locks/{resource}",
            "/locks/{resource}/{uid}",
            "/resources",
            "/resources/{resource}",
            "/v1/locks",
            "/v1/locks/{resource}",
            "/v1/locks/{resource}/{uid}",
            "/v1/locks/{resource}/{uid}/renew",
            "/v1/status/{lock}",
            "/v1/status/{lock}/members",
            "/health",
        ] {
            assert!(v["paths"].get(p).is_some(), "{p} missing");
        }
        assert!(v["components"]["schemas"].get("LockView").is_some());
        assert_eq!(security(&open, "/v1/locks", "get"), serde_json::json!([{}]));

        let token = AuthSettings {
            token: Some(Secret::new("t")),
            admin: None,
        };
        let doc = document(&token);
        assert_eq!(
            security(&doc, "/v1/locks", "get"),
            serde_json::json!([{"bearer": []}])
        );
        assert_eq!(
            security(&doc, "/resources", "delete"),
            serde_json::json!([{"bearer": []}])
        );
        assert!(security(&doc, "/health", "get").is_null());

        let both = AuthSettings {
            token: Some(Secret::new("t")),
            admin: Some(AdminCredentials {
                user: "a".into(),
                password: Secret::new("p"),
            }),
        };
        let doc = document(&both);
        assert_eq!(
            security(&doc, "/resources", "delete"),
            serde_json::json!([{"basic": []}])
        );
    }
}
