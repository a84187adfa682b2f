//! `putex serve`'s guarded writes and token checks (`docs/http.md`,
//! "Guarded writes and token checks"), on the three stores: a grant's
//! writes land while it holds and are refused (`409`, nothing written)
//! once it does not; a token checks as held exactly while its holding is
//! the record's — an HTTP grant, renewed or not, and a `putex lock` holder
//! whose record renews under it.

use std::time::{Duration, Instant};

use putex::http::HttpOptions;
use putex::store::AnyStore;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::store::Backend;
use crate::common::warm;
use crate::serve::{client, get_json, holding, holding_for, v1_post, Served};

/// `POST /v1/locks/{resource}`: the grant's lock URL and fencing token.
async fn grant(c: &Client, s: &Served, resource: &str, lifetime: f64) -> (String, String) {
    let r = v1_post(c, s, resource, json!({"wait": 10, "lifetime": lifetime})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let token = r.headers()["x-putex-token"].to_str().unwrap().to_owned();
    let url = r.headers()["location"].to_str().unwrap().to_owned();
    (url, token)
}

/// `GET /v1/locks/{lock}/check?token=T`.
async fn check(c: &Client, s: &Served, lock: &str, token: &str) -> Value {
    let r = c
        .get(s.at(&format!("/v1/locks/{lock}/check?token={token}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

fn held(v: &Value) -> bool {
    v["held"]
        .as_bool()
        .unwrap_or_else(|| panic!("no held: {v}"))
}

/// `PUT {lock}/kv/{key}`: the status and the JSON body.
async fn put(c: &Client, lock: &str, key: &str, value: &str) -> (StatusCode, Value) {
    let r = c
        .put(format!("{lock}/kv/{key}"))
        .body(value.to_owned())
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// `GET /v1/kv/{key}`: the value, `None` on `404`.
async fn value(c: &Client, s: &Served, key: &str) -> Option<String> {
    let r = c.get(s.at(&format!("/v1/kv/{key}"))).send().await.unwrap();
    match r.status() {
        StatusCode::OK => Some(r.text().await.unwrap()),
        StatusCode::NOT_FOUND => None,
        other => panic!("GET /v1/kv/{key}: {other}: {}", r.text().await.unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_writes_and_tokens_on_sqlite() {
    let server = Backend::sqlite();
    grants_writes_and_tokens(server.open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_writes_and_tokens_on_nats() {
    let server = Backend::nats();
    grants_writes_and_tokens(server.open().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grants_writes_and_tokens_on_etcd() {
    let server = Backend::etcd();
    grants_writes_and_tokens(server.open().await).await;
}

async fn grants_writes_and_tokens(store: AnyStore) {
    let s = Served::start(store, "gw1", HttpOptions::default()).await;
    let c = client();
    warm(s.gateway(), "orders").await;
    let (a, a_token) = grant(&c, &s, "orders", 30.0).await;

    // Held: its token checks, and its writes land.
    let v = check(&c, &s, "orders", &a_token).await;
    assert!(held(&v), "{v}");
    assert_eq!(v["state"], "active", "{v}");
    assert!(!held(&check(&c, &s, "orders", "1:1").await));
    let (status, body) = put(&c, &a, "orders.last", "42").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["revision"].as_str().unwrap().contains(':'), "{body}");
    assert_eq!(value(&c, &s, "orders.last").await.as_deref(), Some("42"));
    // Keys with slashes and any bytes as values.
    let (status, body) = put(&c, &a, "files/a.txt", "x y\nz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        value(&c, &s, "files/a.txt").await.as_deref(),
        Some("x y\nz")
    );

    // Renewed: the record's revision moves, the holding's tokens stay held,
    // and writes land against the renewed record.
    let r = c.post(format!("{a}/renew")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let renewed = r.headers()["x-putex-token"].to_str().unwrap().to_owned();
    assert_ne!(renewed, a_token);
    for t in [&a_token, &renewed] {
        let v = check(&c, &s, "orders", t).await;
        assert!(held(&v), "{t}: {v}");
        assert_eq!(v["record"], renewed.as_str(), "{v}");
    }
    assert_eq!(put(&c, &a, "orders.last", "43").await.0, StatusCode::OK);

    // Several at once: all or none (on NATS an atomic batch).
    let batch = json!({"writes": [
        {"op": "put", "key": "orders.batch", "value": "1"},
        {"op": "delete", "key": "files/a.txt"},
    ]});
    let r = c.post(format!("{a}/kv")).json(&batch).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    assert_eq!(value(&c, &s, "orders.batch").await.as_deref(), Some("1"));
    assert_eq!(value(&c, &s, "files/a.txt").await, None);
    let keys = get_json(&c, &s, "/v1/kv?prefix=orders.").await;
    let listed: Vec<&str> = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["orders.batch", "orders.last"], "{keys}");

    // Bad input: named, nothing written.
    let r = c
        .get(s.at("/v1/locks/orders/check?token=seven"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("token:"));
    let r = c.get(s.at("/v1/locks/orders/check")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let (status, body) = put(&c, &a, "bad key!", "1").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let big = "x".repeat(putex::locks::guard::MAX_VALUES + 1);
    let (status, body) = put(&c, &a, "orders.big", &big).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(value(&c, &s, "orders.big").await, None);

    // Released: its tokens no longer check, its writes are refused by name
    // and nothing is written.
    assert_eq!(
        c.delete(&a).send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let v = check(&c, &s, "orders", &renewed).await;
    assert!(!held(&v) && v["state"] == "released", "{v}");
    let (status, body) = put(&c, &a, "orders.last", "44").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_held", "{body}");
    assert_eq!(value(&c, &s, "orders.last").await.as_deref(), Some("43"));

    // The next holder: its token is held, the old ones are not.
    let (b, b_token) = grant(&c, &s, "orders", 30.0).await;
    assert!(held(&check(&c, &s, "orders", &b_token).await));
    for t in [&a_token, &renewed] {
        assert!(!held(&check(&c, &s, "orders", t).await), "{t}");
    }
    assert_eq!(
        put(&c, &a, "orders.last", "45").await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(put(&c, &b, "orders.last", "46").await.0, StatusCode::OK);
    assert_eq!(value(&c, &s, "orders.last").await.as_deref(), Some("46"));
}

/// A `putex lock` holder's `PUTEX_TOKEN` checks as held while its record
/// renews under it (the record carries where its holding began), and not
/// once it has released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_putex_lock_holders_token_checks_across_renewals() {
    let server = Backend::nats();
    let s = Served::on(&server).await;
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let (mut cmd, token) = holding(&server, dir.path(), "nightly", "sleep 3").await;
    let token = token.as_str();
    // Renewals move the record past the token (R is a third of --ttl 1s).
    let started = Instant::now();
    loop {
        let v = check(&c, &s, "nightly", token).await;
        assert!(held(&v), "{v}");
        let record = v["record"].as_str().unwrap();
        let rev = |t: &str| t.split_once(':').unwrap().1.parse::<u64>().unwrap();
        if rev(record) >= rev(token) + 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no renewal: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cmd.wait().await.unwrap().code(), Some(0));
    let v = check(&c, &s, "nightly", token).await;
    assert!(!held(&v) && v["state"] == "released", "{v}");
}

/// A command whose lock was revoked under it: its keeper stops it, and a
/// `putex kv put` it makes on the way out exits 76 and writes nothing;
/// its token no longer checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_lock_is_lost_writes_nothing() {
    let server = Backend::nats();
    let s = Served::on(&server).await;
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = r#"trap '"$P" kv put report.late x 2> "$D/err"; echo $? > "$D/rc"; exit 0' TERM
"$P" kv put report.early x
while :; do sleep 0.05; done"#;
    // --ttl 3s: the trap's `putex kv put` runs between the revocation and
    // the licence's end, when the keeper kills what is left; with 1 s a
    // busy machine once ended it before it wrote its exit code.
    let (mut cmd, token) = holding_for(&server, d, "report", "3s", script).await;
    let token = token.as_str();
    let started = Instant::now();
    while value(&c, &s, "report.early").await.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "report.early never written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held(&check(&c, &s, "report", token).await));
    let r = c
        .post(s.at("/v1/locks/report/revoke"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let status = cmd.wait().await.unwrap();
    assert_ne!(status.code(), Some(0), "the lock was revoked: {status:?}");
    let rc = std::fs::read_to_string(d.join("rc")).unwrap_or_default();
    let err = std::fs::read_to_string(d.join("err")).unwrap_or_default();
    assert_eq!(rc.trim(), "76", "{err}");
    assert!(err.contains("no longer held"), "{err}");
    assert_eq!(value(&c, &s, "report.early").await.as_deref(), Some("x"));
    assert_eq!(value(&c, &s, "report.late").await, None);
    // Revoked, then released by the section once its command's stop is
    // proven (S7).
    let v = check(&c, &s, "report", token).await;
    assert!(!held(&v), "{v}");
    assert!(v["state"] == "revoked" || v["state"] == "released", "{v}");
}
