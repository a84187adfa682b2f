//! `putex serve` over HTTP: the RDLM-compatible API's contract (every
//! status code of RDLM's API.md), the `/v1/` JSON API and its OpenAPI
//! document, auth, TLS, waiting in turn, parallel resources, a client that
//! disconnects mid-wait, two gateways on one store, graceful shutdown, and
//! interplay with `putex lock` on a real nats-server.
//!
//! The server runs in-process on `127.0.0.1:0` ([`putex::http::serve`]);
//! one test runs the built binary. Lifetimes are a second or two.
//!
//! Each test makes a store of its own, and on a store made moments ago the
//! first use of a resource name still costs W + G' (S4: a file that young
//! cannot prove the name was vacant), so most tests warm their names with
//! a short lifetime first. The `rdlm_a_fresh_resource_is_granted_at_once_*`
//! tests and RDLM's own client (`rdlm_py_client_works_against_putex_serve`)
//! wait for an older store and ask for fresh names with `wait: 1`.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use putex::core::Drift;
use putex::http::{
    self, AdminCredentials, App, AuthSettings, HttpError, HttpOptions, Secret, TlsSettings,
};
use putex::locks::gateway::{Gateway, GatewayOptions};
use putex::store::{AnyStore, StoreUrl};
use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::rustls;

use crate::common::agent::{putex, wall_ns};
use crate::common::store::Backend;
use crate::common::{on_stores, warm};

const MAX_LIFETIME: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(30);

/// A `putex serve` running in this process.
pub(crate) struct Served {
    /// `http://127.0.0.1:PORT` (or `https://`).
    url: String,
    /// Its gateway (a clone: the same one).
    gateway: Gateway,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), HttpError>>>,
}

/// The gateway options of the tests' servers.
fn gateway_options(node: &str) -> GatewayOptions {
    GatewayOptions {
        node: node.parse().unwrap(),
        max_drift: Drift::from_percent(1.0),
        max_lifetime: MAX_LIFETIME,
        max_wait: MAX_WAIT,
        acquire_lease: putex::locks::gateway::DEFAULT_ACQUIRE_LEASE,
        grant_deadline: putex::locks::gateway::DEFAULT_GRANT_DEADLINE,
    }
}

impl Served {
    pub(crate) async fn start(store: AnyStore, node: &str, opts: HttpOptions) -> Served {
        Served::start_gateway(store, gateway_options(node), opts).await
    }

    /// `gw1` with the default options on a store handle of its own of
    /// `server`'s.
    pub(crate) async fn on(server: &Backend) -> Served {
        Served::start(server.open().await, "gw1", HttpOptions::default()).await
    }

    async fn start_gateway(store: AnyStore, gateway: GatewayOptions, opts: HttpOptions) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let gateway = Gateway::new(store, gateway);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(http::serve(
            listener,
            App::new(gateway.clone(), opts),
            async {
                let _ = stopped.await;
            },
        ));
        Served {
            url: format!("{scheme}://127.0.0.1:{port}"),
            gateway,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub(crate) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Its gateway, for [`warm`]: the first use of a name out of the way.
    pub(crate) fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Asks for shutdown; returns how long `serve` took to return.
    async fn shutdown(mut self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.take().unwrap().send(());
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
            .unwrap();
        started.elapsed()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A test's usual start: `putex serve` ([`Served::on`]) on a fresh SQLite
/// store, kept while the [`Backend`] lives, and a client.
async fn serve_sqlite() -> (Backend, Served, Client) {
    let store = Backend::sqlite();
    let s = Served::on(&store).await;
    (store, s, client())
}

fn rustls_client_config(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A client (reqwest without a crypto provider of its own: ring, as the
/// server).
pub(crate) fn client() -> Client {
    client_trusting(rustls::RootCertStore::empty())
}

fn client_trusting(roots: rustls::RootCertStore) -> Client {
    Client::builder()
        .tls_backend_preconfigured(rustls_client_config(roots))
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap()
}

fn lock_body(title: &str, wait: f64, lifetime: f64) -> String {
    json!({"title": title, "wait": wait, "lifetime": lifetime}).to_string()
}

async fn rdlm_post(c: &Client, s: &Served, resource: &str, wait: f64, lifetime: f64) -> Response {
    c.post(s.at(&format!("/locks/{resource}")))
        .body(lock_body("test case", wait, lifetime))
        .send()
        .await
        .unwrap()
}

/// `POST /v1/locks/{resource}` with the JSON `body`.
pub(crate) async fn v1_post(c: &Client, s: &Served, resource: &str, body: Value) -> Response {
    c.post(s.at(&format!("/v1/locks/{resource}")))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// An RDLM lock's URL, from a `201`.
fn location(r: &Response) -> String {
    assert_eq!(r.status(), StatusCode::CREATED);
    r.headers()["location"].to_str().unwrap().to_owned()
}

async fn status_of(c: &Client, method: reqwest::Method, url: &str) -> StatusCode {
    c.request(method, url).send().await.unwrap().status()
}

/// `GET path`, as JSON.
pub(crate) async fn get_json(c: &Client, s: &Served, path: &str) -> Value {
    c.get(s.at(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /v1/locks/{resource}`.
async fn listed(c: &Client, s: &Served, resource: &str) -> Value {
    get_json(c, s, &format!("/v1/locks/{resource}")).await
}

/// `GET /v1/status/{lock}` until the record says `released`, within `limit`.
async fn released_within(c: &Client, s: &Served, lock: &str, limit: Duration) -> Value {
    let started = Instant::now();
    loop {
        let st: Value = get_json(c, s, &format!("/v1/status/{lock}")).await;
        if st["state"] == "released" {
            return st;
        }
        assert!(
            started.elapsed() < limit,
            "{lock} not released within {limit:?}: {st}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `resource` lists `n` locks (granted and waiting).
async fn wait_listed(c: &Client, s: &Served, resource: &str, n: usize) {
    let started = Instant::now();
    loop {
        let v = listed(c, s, resource).await;
        if v["locks"].as_array().unwrap().len() >= n {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{resource} never listed {n} locks: {v}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_hello_and_refusals() {
    let (_store, s, c) = serve_sqlite().await;
    let r = c.get(s.at("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("Welcome"));

    let post = |path: &str, body: &str| c.post(s.at(path)).body(body.to_owned()).send();
    for (body, says) in [
        ("", "empty body"),
        (&lock_body("t", 5.0, 10.0)[..10], "invalid json body"),
        ("title=t&wait=5", "invalid json body"),
        (r#"{"wait": 5, "lifetime": 10}"#, "title is missing"),
        (r#"{"title": "t", "lifetime": 10}"#, "wait is missing"),
        (r#"{"title": "t", "wait": 5}"#, "lifetime is missing"),
        (
            r#"{"title": "t", "wait": -1, "lifetime": 10}"#,
            "at least 0",
        ),
        (
            r#"{"title": "t", "wait": 31, "lifetime": 10}"#,
            "--max-wait",
        ),
        (
            r#"{"title": "t", "wait": 1, "lifetime": 61}"#,
            "--max-lifetime",
        ),
        (
            r#"{"title": "t", "wait": 1, "lifetime": 0}"#,
            "lifetime must be at least",
        ),
    ] {
        let r = post("/locks/resource1", body).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body:?}");
        let text = r.text().await.unwrap();
        assert!(text.contains(says), "{body:?}: {text}");
    }
    // RDLM's names are [a-zA-Z0-9]+: others match no route.
    let ok = lock_body("t", 1.0, 1.0);
    assert_eq!(
        post("/locks/a_b", &ok).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post("/locks/a%2Fb", &ok).await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(&format!("/locks/{}", "a".repeat(65)), &ok)
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    use reqwest::Method as M;
    for (m, path, want) in [
        (
            M::GET,
            "/locks/resource1/0123456789abcdef",
            StatusCode::NOT_FOUND,
        ),
        (
            M::DELETE,
            "/locks/resource1/0123456789abcdef",
            StatusCode::NOT_FOUND,
        ),
        (M::GET, "/locks/resource1/not-a-uid", StatusCode::NOT_FOUND),
        (M::DELETE, "/resources/resource2", StatusCode::NOT_FOUND),
        (M::GET, "/resources/resource2", StatusCode::OK),
        (M::GET, "/resources", StatusCode::OK),
        (M::DELETE, "/resources", StatusCode::NO_CONTENT),
        (M::GET, "/nothing/here", StatusCode::NOT_FOUND),
        (M::PUT, "/locks/resource1", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        assert_eq!(
            status_of(&c, m.clone(), &s.at(path)).await,
            want,
            "{m} {path}"
        );
    }
    let r = c.get(s.at("/resources/resource2")).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/hal+json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["name"], "resource2");
    assert_eq!(v["_links"]["self"]["href"], "/resources/resource2");
}

/// Each fresh resource is granted within `wait: 1` (a `201`), then freed.
async fn granted_with_wait_1(c: &Client, s: &Served, resources: &[&str]) {
    for resource in resources {
        let started = Instant::now();
        let r = rdlm_post(c, s, resource, 1.0, 10.0).await;
        eprintln!("{resource}: {} after {:?}", r.status(), started.elapsed());
        let url = location(&r);
        assert_eq!(
            status_of(c, reqwest::Method::DELETE, &url).await,
            StatusCode::NO_CONTENT
        );
    }
}

/// S4 refined, both sides: on an embedded store made moments ago a fresh
/// resource asked for with `wait: 1` gets a 408 that says why (the store
/// cannot prove what a file it replaced held); once the file is older than
/// W + G' (2.5 s at `--acquire-lease 2s`), a fresh resource is granted at
/// once, as RDLM itself grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_a_fresh_resource_is_granted_at_once_on_an_older_embedded_store() {
    let made = Instant::now();
    let (_store, s, c) = serve_sqlite().await;
    let r = rdlm_post(&c, &s, "young", 1.0, 10.0).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
    let body = r.text().await.unwrap();
    assert!(body.contains("the store was made moments ago"), "{body}");

    tokio::time::sleep(Duration::from_secs(3).saturating_sub(made.elapsed())).await;
    granted_with_wait_1(&c, &s, &["fresh1", "fresh2", "fresh3"]).await;
}

/// S4 refined on etcd, both sides: the first fresh resource of a prefix
/// gets a 408 with `wait: 1` that says why (nothing proves yet: its create
/// writes the anchor the later proofs count from); a few seconds on, fresh
/// resources are granted at once — but not one whose record was deleted by
/// hand since (its history shows the delete: the whole W + G' again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_a_fresh_resource_is_granted_at_once_on_etcd() {
    let store = Backend::etcd();
    let s = Served::on(&store).await;
    let c = client();
    let r = rdlm_post(&c, &s, "young", 1.0, 10.0).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
    let body = r.text().await.unwrap();
    assert!(body.contains("cannot prove"), "{body}");
    let Backend::Etcd(server) = &store else {
        unreachable!()
    };
    let put = server.etcdctl(&["put", "putex/lock.deleted", "by hand"]);
    assert!(put.status.success(), "{put:?}");
    let del = server.etcdctl(&["del", "putex/lock.deleted"]);
    assert!(del.status.success(), "{del:?}");

    // W + G' is 2.5 s at `--acquire-lease 2s`; the proof reads whole seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;
    granted_with_wait_1(&c, &s, &["fresh1", "fresh2", "fresh3"]).await;
    let r = rdlm_post(&c, &s, "deleted", 1.0, 10.0).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT, "deleted by hand");
}

/// RDLM's own Python client, rdlm-py 0.2.0 (`scripts/install-rdlm-py`),
/// against the gateway on an embedded store older than W + G' (2.5 s):
/// fresh resources granted with `wait: 1`, a held one refused after the
/// wait (`RDLMLockWaitExceededException`), a lock's details, a waiting
/// request deleted by an admin (`RDLMLockDeletedException`), the context
/// manager, the admin's deletes (`tests/clients/rdlm_py.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_py_client_works_against_putex_serve() {
    let pythonpath = rdlm_py();
    let made = Instant::now();
    let store = Backend::sqlite();
    let s = Served::start(store.open().await, "gw1", admin_only()).await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(made.elapsed())).await;
    let port = s.url.rsplit(':').next().unwrap().to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/rdlm_py.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["127.0.0.1", &port, "admin", "pw"])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .await
        .expect("run python3 (the test needs it, with rdlm-py: scripts/install-rdlm-py)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "rdlm-py: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("every check passed"), "{stdout}");
}

/// RDLM's model: locks are open, admin calls need `admin:pw` (HTTP Basic).
fn admin_only() -> HttpOptions {
    HttpOptions {
        auth: AuthSettings {
            token: None,
            admin: Some(AdminCredentials {
                user: "admin".into(),
                password: Secret::new("pw"),
            }),
        },
        ..HttpOptions::default()
    }
}

/// Where rdlm-py is: `$PUTEX_RDLM_PY`, else the repository's
/// `.tools/rdlm-py`; a missing one fails, saying how to install it.
fn rdlm_py() -> std::path::PathBuf {
    let dir = std::env::var_os("PUTEX_RDLM_PY").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/rdlm-py"),
        std::path::PathBuf::from,
    );
    assert!(
        dir.join("rdlmpy/client.py").is_file() && dir.join("requests").is_dir(),
        "rdlm-py is not installed in {}: run scripts/install-rdlm-py (or set PUTEX_RDLM_PY \
         to a directory holding rdlmpy and requests)",
        dir.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_lock_get_list_delete() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "resource1").await;

    // Integers and floats are both numbers of seconds.
    let r = c
        .post(s.at("/locks/resource1"))
        .body(r#"{"title": "test case", "wait": 5, "lifetime": 10.5}"#)
        .send()
        .await
        .unwrap();
    let url = location(&r);
    let header_token = r.headers()["x-putex-token"].to_str().unwrap().to_owned();
    assert!(r.text().await.unwrap().is_empty(), "201 has an empty body");
    let prefix = format!("{}/locks/resource1/", s.url);
    assert!(url.starts_with(&prefix), "{url}");
    let uid = &url[prefix.len()..];
    let (epoch, revision) = header_token.split_once(':').unwrap();
    assert!(epoch.parse::<u64>().is_ok() && revision.parse::<u64>().is_ok());

    let r = c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/hal+json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["uid"], uid);
    assert_eq!(v["title"], "test case");
    assert_eq!(v["wait"], 5);
    assert_eq!(v["lifetime"], 10.5);
    assert_eq!(v["active"], true);
    assert_eq!(v["token"], header_token.as_str());
    assert_eq!(
        v["_links"]["self"]["href"],
        format!("/locks/resource1/{uid}")
    );
    assert_eq!(v["_links"]["resource"]["href"], "/resources/resource1");
    // RDLM's times: "2013-01-22T23:01:16.771799", UTC, no zone.
    for k in ["active_since", "active_expires"] {
        let t = v[k].as_str().unwrap();
        assert_eq!(t.len(), 26, "{k}: {t}");
        assert_eq!(&t[10..11], "T");
        let z = humantime::parse_rfc3339(&format!("{t}Z")).unwrap();
        let off = z
            .duration_since(SystemTime::now())
            .unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(30), "{k} {t} is not UTC now");
    }

    let v: Value = get_json(&c, &s, "/resources").await;
    assert_eq!(v["_embedded"]["resources"][0]["name"], "resource1");
    assert_eq!(v["_links"]["self"]["href"], "/resources");
    let v: Value = get_json(&c, &s, "/resources/resource1").await;
    assert_eq!(v["_embedded"]["locks"][0]["uid"], uid);

    use reqwest::Method as M;
    assert_eq!(status_of(&c, M::DELETE, &url).await, StatusCode::NO_CONTENT);
    assert_eq!(status_of(&c, M::DELETE, &url).await, StatusCode::NOT_FOUND);
    assert_eq!(status_of(&c, M::GET, &url).await, StatusCode::NOT_FOUND);
    let other = url.replace("/resource1/", "/resource2/");
    assert_eq!(
        status_of(&c, M::DELETE, &other).await,
        StatusCode::NOT_FOUND
    );
    let v: Value = get_json(&c, &s, "/resources/resource1").await;
    assert!(v.get("_embedded").is_none(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_408_after_the_wait_and_404_after_the_lifetime() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "resource1").await;

    let first = location(&rdlm_post(&c, &s, "resource1", 5.0, 1.5).await);
    let started = Instant::now();
    let r = rdlm_post(&c, &s, "resource1", 1.0, 10.0).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_millis(2000),
        "408 after {took:?}, the wait was 1s"
    );
    // `wait: 0` on a held lock answers at once.
    let started = Instant::now();
    let r = rdlm_post(&c, &s, "resource1", 0.0, 10.0).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(900));

    // The lifetime runs out (with the grant deadline, 1 s: what the
    // answer may take to reach its client): GET says 404, and a waiter gets
    // the lock. (A waiter with the same lifetime: see the next test for a
    // longer one.)
    let second = rdlm_post(&c, &s, "resource1", 5.0, 1.5);
    let (second, ()) = tokio::join!(second, async {
        tokio::time::sleep(Duration::from_millis(2700)).await;
        assert_eq!(
            status_of(&c, reqwest::Method::GET, &first).await,
            StatusCode::NOT_FOUND,
            "the lock outlived its lifetime"
        );
    });
    let second = location(&second);
    assert_eq!(
        status_of(&c, reqwest::Method::GET, &second).await,
        StatusCode::OK
    );
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &first).await,
        StatusCode::NOT_FOUND
    );
}

/// RDLM's `test_expired_lock`: a lock with lifetime 1 s, then a request
/// waiting 5 s for a lifetime of 60 s gets it once the first expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_a_longer_waiter_gets_an_expired_lock_within_its_wait() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "resource1").await;
    let first = location(&rdlm_post(&c, &s, "resource1", 5.0, 1.0).await);
    let second = rdlm_post(&c, &s, "resource1", 5.0, 60.0).await;
    assert_eq!(
        second.status(),
        StatusCode::CREATED,
        "not granted within 5 s after a 1 s lock"
    );
    assert_eq!(
        status_of(&c, reqwest::Method::GET, &first).await,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_admin_deletes_give_waiters_409() {
    let (_store, s, c) = serve_sqlite().await;
    let s = Arc::new(s);
    tokio::join!(
        warm(s.gateway(), "resource1"),
        warm(s.gateway(), "resource2")
    );
    let held1 = location(&rdlm_post(&c, &s, "resource1", 5.0, 10.0).await);
    let held2 = location(&rdlm_post(&c, &s, "resource2", 5.0, 10.0).await);

    // DELETE /resources/{r}: the holder's lock is freed, the waiter 409.
    let waiter = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move { rdlm_post(&c, &s, "resource1", 20.0, 10.0).await.status() })
    };
    wait_listed(&c, &s, "resource1", 2).await;
    let v: Value = get_json(&c, &s, "/resources/resource1").await;
    let locks = v["_embedded"]["locks"].as_array().unwrap();
    assert_eq!(locks[0]["active"], true);
    assert_eq!(locks[1]["active"], false, "{v}");
    let started = Instant::now();
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &s.at("/resources/resource1")).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(waiter.await.unwrap(), StatusCode::CONFLICT);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        status_of(&c, reqwest::Method::GET, &held1).await,
        StatusCode::NOT_FOUND
    );
    // Freed at once: the record says `released` (the holder's, or that of
    // the cancelled waiter, which may have taken the freed lock before it
    // saw the cancel: it gives that unstarted tenure back with one CAS, S3,
    // before it answers 409).
    let st = released_within(&c, &s, "resource1", Duration::from_millis(500)).await;
    assert_eq!(st["holder"], "gw1");

    // DELETE /resources: everything, waiters 409.
    let waiter = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move { rdlm_post(&c, &s, "resource2", 20.0, 10.0).await.status() })
    };
    wait_listed(&c, &s, "resource2", 2).await;
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &s.at("/resources")).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(waiter.await.unwrap(), StatusCode::CONFLICT);
    assert_eq!(
        status_of(&c, reqwest::Method::GET, &held2).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &s.at("/resources/resource2")).await,
        StatusCode::NOT_FOUND
    );
}

/// RDLM clients ask for minutes of lifetime and seconds of wait on names
/// they have never used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdlm_first_use_of_a_name_is_granted_within_the_wait() {
    let (_store, s, c) = serve_sqlite().await;
    let r = rdlm_post(&c, &s, "fresh", 5.0, 60.0).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "a never-used name with lifetime 60 s and wait 5 s"
    );
}

on_stores!(async Backend, four_waiters_and_four_resources =>
    four_waiters_take_turns_and_four_resources_run_in_parallel: sqlite,
    four_waiters_take_turns_and_four_resources_run_in_parallel_etcd: etcd,
);

async fn four_waiters_and_four_resources(server: &Backend) {
    let s = Arc::new(Served::on(server).await);
    let c = client();

    // Four resources at once: all four held at the same time.
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (c, s) = (c.clone(), s.clone());
            tokio::spawn(async move {
                let url = location(&rdlm_post(&c, &s, &format!("par{i}"), 10.0, 2.0).await);
                let granted = Instant::now();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let released = Instant::now();
                assert_eq!(
                    status_of(&c, reqwest::Method::DELETE, &url).await,
                    StatusCode::NO_CONTENT
                );
                (granted, released)
            })
        })
        .collect();
    let mut spans = Vec::new();
    for t in tasks {
        spans.push(t.await.unwrap());
    }
    let last_grant = spans.iter().map(|s| s.0).max().unwrap();
    let first_release = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        last_grant < first_release,
        "four resources were not held at once"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    // Four waiters on one resource: each in turn, in arrival order.
    let holder = location(&rdlm_post(&c, &s, "par0", 5.0, 10.0).await);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (cw, sw, log) = (c.clone(), s.clone(), log.clone());
        waiters.push(tokio::spawn(async move {
            let (c, s) = (cw, sw);
            let r = c
                .post(s.at("/v1/locks/par0"))
                .body(lock_body(&format!("w{i}"), 20.0, 5.0))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
            let v: Value = r.json().await.unwrap();
            log.lock()
                .unwrap()
                .push(("grant", i, v["revision"].as_u64().unwrap()));
            tokio::time::sleep(Duration::from_millis(150)).await;
            log.lock().unwrap().push(("release", i, 0));
            let url = s.at(v["href"].as_str().unwrap());
            assert_eq!(
                status_of(&c, reqwest::Method::DELETE, &url).await,
                StatusCode::NO_CONTENT
            );
        }));
        wait_listed(&c, &s, "par0", i + 2).await;
    }
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &holder).await,
        StatusCode::NO_CONTENT
    );
    for w in waiters {
        w.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let kinds: Vec<_> = log.iter().map(|(k, i, _)| (*k, *i)).collect();
    assert_eq!(
        kinds,
        [
            ("grant", 0),
            ("release", 0),
            ("grant", 1),
            ("release", 1),
            ("grant", 2),
            ("release", 2),
            ("grant", 3),
            ("release", 3)
        ],
        "not one at a time in arrival order"
    );
    let revisions: Vec<u64> = log.iter().filter(|e| e.0 == "grant").map(|e| e.2).collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_lock_renew_list_status_release() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "db-backup").await;

    let r = v1_post(
        &c,
        &s,
        "db-backup",
        json!({"title": "nightly", "wait": 5, "lifetime": 5}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let header = r.headers()["x-putex-token"].to_str().unwrap().to_owned();
    let left_header = r.headers()["x-putex-lifetime-left"]
        .to_str()
        .unwrap()
        .to_owned();
    let loc = r.headers()["location"].to_str().unwrap().to_owned();
    let lock: Value = r.json().await.unwrap();
    let uid = lock["uid"].as_str().unwrap().to_owned();
    assert_eq!(loc, format!("{}/v1/locks/db-backup/{uid}", s.url));
    assert_eq!(lock["fencing_token"], header.as_str());
    assert_eq!(token_text(&lock["token"]), header);
    assert_eq!(
        lock["revision"].as_u64().map(|r| r.to_string()).as_deref(),
        lock["token"]["revision"].as_str()
    );
    assert_eq!(lock["active"], true);
    assert_eq!(lock["lifetime"], 5.0);
    assert!(lock["active_since"].as_str().unwrap().ends_with('Z'));
    // What is left: the lifetime and the 1 s grant deadline, less the time
    // the answer took to leave (at most half the deadline).
    let left = lock["lifetime_left"].as_f64().unwrap();
    assert!((5.5..=6.0).contains(&left), "{lock}");
    assert_eq!(left_header, format!("{left:.3}"));

    let got: Value = c.get(&loc).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["uid"], uid.as_str());
    assert_eq!(got["title"], "nightly");

    let renewed = c
        .post(format!("{loc}/renew"))
        .json(&json!({"lifetime": 8}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    assert!(renewed.headers().contains_key("x-putex-lifetime-left"));
    let renewed: Value = renewed.json().await.unwrap();
    assert_eq!(renewed["lifetime"], 8.0);
    let left = renewed["lifetime_left"].as_f64().unwrap();
    assert!((8.5..=9.0).contains(&left), "{renewed}");
    assert!(renewed["revision"].as_u64() > lock["revision"].as_u64());
    // An empty body keeps the lock's own lifetime.
    let again = c.post(format!("{loc}/renew")).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);

    let all: Value = get_json(&c, &s, "/v1/locks").await;
    assert_eq!(all["resources"][0]["resource"], "db-backup");
    assert_eq!(all["resources"][0]["locks"][0]["uid"], uid.as_str());

    // The lock record, as `putex status` sees it.
    let st: Value = get_json(&c, &s, "/v1/status/db-backup").await;
    assert_eq!(st["holder"], "gw1");
    assert_eq!(st["state"], "active");
    assert_eq!(st["instance"], uid.as_str());
    assert_eq!(
        st["revision"].as_u64().map(|r| r.to_string()).as_deref(),
        st["token"]["revision"].as_str()
    );
    assert_eq!(
        token_text(&st["token"]),
        st["fencing_token"].as_str().unwrap()
    );
    // The lifetime and the grant deadline (1 s).
    assert_eq!(st["lease_ms"], 9000);
    let all: Value = get_json(&c, &s, "/v1/status").await;
    assert!(all["locks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["lock"] == "db-backup"));
    let m = c
        .get(s.at("/v1/status/db-backup/members"))
        .send()
        .await
        .unwrap();
    assert_eq!(m.status(), StatusCode::OK);
    let m: Value = m.json().await.unwrap();
    assert_eq!(m["lock"], "db-backup");
    assert!(m["members"].is_array());

    let del = c.delete(&loc).send().await.unwrap();
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    for r in [
        c.delete(&loc).send().await.unwrap(),
        c.get(&loc).send().await.unwrap(),
        c.post(format!("{loc}/renew")).send().await.unwrap(),
    ] {
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "not_found", "{e}");
    }
    let st: Value = get_json(&c, &s, "/v1/status/db-backup").await;
    assert_eq!(st["state"], "released");
}

/// Operators read a granted lock's record with `putex status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_lock_shows_active_in_status() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "shown").await;
    let r = c
        .post(s.at("/v1/locks/shown"))
        .body(lock_body("t", 5.0, 5.0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let st: Value = get_json(&c, &s, "/v1/status/shown").await;
    assert_eq!(st["holder"], "gw1");
    assert_eq!(st["state"], "active", "{st}");
}

/// The web status page is served by `putex serve` too: the page, and its
/// data naming the HTTP lock's holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_status_page_is_served() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "paged").await;
    let r = c
        .post(s.at("/v1/locks/paged"))
        .body(lock_body("t", 5.0, 5.0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let page = c.get(s.at("/ui")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains("<title>putex status</title>"));
    let data: Value = get_json(&c, &s, "/ui/status.json").await;
    let lock = data["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["status"]["lock"] == "paged")
        .unwrap_or_else(|| panic!("{data}"));
    assert_eq!(lock["status"]["holder"], "gw1", "{data}");
    let timeline = lock["timeline"].as_array().unwrap();
    assert!(!timeline.is_empty(), "{data}");
    // Tokens as strings, so that the page's script keeps every digit.
    for row in timeline.iter().filter(|r| !r["token"].is_null()) {
        token_text(&row["token"]);
    }
    assert!(timeline.iter().any(|r| !r["token"].is_null()), "{data}");
}

/// `putex status` without a name lists every `lock.*` key; the gateway's
/// listings must not leave keys there that are no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn putex_status_of_all_locks_works_after_gateway_listings() {
    let (store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "listed").await;
    let r = c.get(s.at("/resources")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let out = putex()
        .args(["status", "-o", "json", "--store"])
        .arg(store.url())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "putex status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_errors_are_json_with_codes() {
    let (_store, s, c) = serve_sqlite().await;
    let s = Arc::new(s);
    let expect = |status: StatusCode, code: &'static str| {
        move |r: Response| async move {
            assert_eq!(r.status(), status);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], code, "{v}");
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
        }
    };
    let bad = expect(StatusCode::BAD_REQUEST, "invalid");
    for body in [
        "",
        "{",
        "[]",
        r#"{"lifetime": "soon"}"#,
        r#"{"lifetime": -1}"#,
        r#"{"lifetime": 1, "wait": 1e9}"#,
    ] {
        bad(c.post(s.at("/v1/locks/x")).body(body).send().await.unwrap()).await;
    }
    bad(v1_post(&c, &s, "bad.name", json!({"lifetime": 1})).await).await;
    bad(c.get(s.at("/v1/status/bad.name")).send().await.unwrap()).await;
    // A client of its own: the server answers before reading the whole
    // body and closes the connection, which a shared pool could reuse.
    expect(StatusCode::PAYLOAD_TOO_LARGE, "invalid")(
        client()
            .post(s.at("/v1/locks/x"))
            .body(vec![b' '; 200 * 1024])
            .send()
            .await
            .unwrap(),
    )
    .await;
    expect(StatusCode::NOT_FOUND, "not_found")(c.get(s.at("/v2/x")).send().await.unwrap()).await;
    expect(StatusCode::NOT_FOUND, "not_found")(
        c.delete(s.at("/v1/locks/nothing")).send().await.unwrap(),
    )
    .await;

    warm(s.gateway(), "v1err").await;
    let held = v1_post(&c, &s, "v1err", json!({"wait": 1, "lifetime": 10})).await;
    assert_eq!(held.status(), StatusCode::CREATED);
    expect(StatusCode::REQUEST_TIMEOUT, "timeout")(
        v1_post(&c, &s, "v1err", json!({"wait": 0, "lifetime": 1})).await,
    )
    .await;
    let waiter = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(
            async move { v1_post(&c, &s, "v1err", json!({"wait": 20, "lifetime": 1})).await },
        )
    };
    wait_listed(&c, &s, "v1err", 2).await;
    let r = c.delete(s.at("/v1/locks/v1err")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // At once, even before the cancelled waiter has left the line, nothing
    // is listed any more: neither the revoked lock nor the cancelled ticket.
    let v = listed(&c, &s, "v1err").await;
    assert_eq!(v["locks"].as_array().unwrap().len(), 0, "{v}");
    expect(StatusCode::CONFLICT, "cancelled")(waiter.await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_describes_both_apis() {
    let (_store, s, c) = serve_sqlite().await;
    let r = c.get(s.at("/openapi.json")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let doc: Value = r.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/locks/{resource}",
        "/resources",
        "/v1/locks/{resource}",
        "/v1/locks/{resource}/revoke",
        "/v1/locks/{resource}/force",
        "/health",
    ] {
        assert!(paths.contains_key(p), "{p}");
    }
    // Both admin calls are described, and told apart.
    for (p, says) in [
        ("/v1/locks/{resource}/revoke", "revoked"),
        ("/v1/locks/{resource}/force", "released"),
    ] {
        let op = &doc["paths"][p]["post"];
        assert!(op["description"].as_str().unwrap().contains(says), "{op}");
        assert!(op["responses"]["200"].is_object(), "{op}");
    }
    assert!(doc["paths"]["/v1/locks/{resource}/force"]["post"]["responses"]["409"].is_object());
    let created = &doc["paths"]["/v1/locks/{resource}"]["post"]["responses"]["201"];
    for header in ["X-Putex-Token", "X-Putex-Lifetime-Left"] {
        assert!(created["headers"].get(header).is_some(), "{created}");
    }
    for schema in [
        "LockView",
        "FencingToken",
        "ErrorBody",
        "HalLock",
        "AdminView",
    ] {
        assert!(
            doc["components"]["schemas"].get(schema).is_some(),
            "{schema}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_bearer_token_and_admin_basic() {
    let server = Backend::sqlite();
    let store = server.open().await;
    let both = HttpOptions {
        auth: AuthSettings {
            token: Some(Secret::new("tok-123")),
            admin: Some(AdminCredentials {
                user: "admin".into(),
                password: Secret::new("pw"),
            }),
        },
        ..HttpOptions::default()
    };
    let s = Served::start(store.clone(), "gw1", both).await;
    let c = client();
    let code = |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().status() };

    assert_eq!(code(c.get(s.at("/health"))).await, StatusCode::OK);
    let r = c.get(s.at("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unauthorized");
    for path in ["/", "/openapi.json", "/v1/locks", "/locks/x/abc"] {
        assert_eq!(
            code(c.get(s.at(path))).await,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        assert_eq!(
            code(c.get(s.at(path)).bearer_auth("tok-12")).await,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    assert_eq!(
        code(c.get(s.at("/")).bearer_auth("tok-123")).await,
        StatusCode::OK
    );
    assert_eq!(
        code(c.post(s.at("/locks/x")).body("")).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        code(c.post(s.at("/locks/x")).body("").bearer_auth("tok-123")).await,
        StatusCode::BAD_REQUEST
    );
    // Admin calls need the admin's Basic credentials (not the token).
    for admin in [
        c.delete(s.at("/resources")),
        c.get(s.at("/resources")),
        c.get(s.at("/resources/x")),
        c.delete(s.at("/resources/x")),
        c.delete(s.at("/v1/locks/x")),
        c.post(s.at("/v1/locks/x/revoke")),
        c.post(s.at("/v1/locks/x/force")),
    ] {
        let r = admin.try_clone().unwrap().send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers()["www-authenticate"],
            "Basic realm=\"putex admin\""
        );
        for wrong in [
            admin.try_clone().unwrap().bearer_auth("tok-123"),
            admin.try_clone().unwrap().basic_auth("admin", Some("pw2")),
            admin.try_clone().unwrap().basic_auth("root", Some("pw")),
        ] {
            assert_eq!(code(wrong).await, StatusCode::UNAUTHORIZED);
        }
        let ok = code(admin.basic_auth("admin", Some("pw"))).await;
        assert_ne!(ok, StatusCode::UNAUTHORIZED);
    }
    drop(s);

    // Token only: the admin calls take the token.
    let token_only = HttpOptions {
        auth: AuthSettings {
            token: Some(Secret::new("tok-123")),
            admin: None,
        },
        ..HttpOptions::default()
    };
    let s = Served::start(store.clone(), "gw1", token_only).await;
    assert_eq!(
        code(c.delete(s.at("/resources"))).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        code(c.delete(s.at("/resources")).bearer_auth("tok-123")).await,
        StatusCode::NO_CONTENT
    );
    drop(s);

    // Admin only (RDLM's model): locks are open, admin calls are not.
    let s = Served::start(store, "gw1", admin_only()).await;
    assert_eq!(code(c.get(s.at("/"))).await, StatusCode::OK);
    assert_eq!(code(c.get(s.at("/v1/locks"))).await, StatusCode::OK);
    assert_eq!(
        code(c.delete(s.at("/resources"))).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        code(c.delete(s.at("/resources")).basic_auth("admin", Some("pw"))).await,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let tls = TlsSettings::from_pem_files(&cert, &key).unwrap();
    assert!(TlsSettings::from_pem_files(&key, &key)
        .unwrap_err()
        .to_string()
        .contains("key.pem"));
    let store = Backend::sqlite();
    let s = Served::start(
        store.open().await,
        "gw1",
        HttpOptions {
            tls: Some(tls),
            ..HttpOptions::default()
        },
    )
    .await;
    assert!(s.url.starts_with("https://"));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let c = client_trusting(roots);
    let r = c.get(s.at("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let url = location(&rdlm_post(&c, &s, "tls", 5.0, 1.0).await);
    assert!(url.starts_with(&format!("{}/locks/tls/", s.url)), "{url}");
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &url).await,
        StatusCode::NO_CONTENT
    );
    // Plain HTTP, or a client that does not trust the certificate: no.
    let plain = s.url.replace("https://", "http://");
    assert!(client()
        .get(format!("{plain}/health"))
        .send()
        .await
        .is_err());
    assert!(client().get(s.at("/health")).send().await.is_err());
}

/// Writes a lock request on a raw connection, then closes it while the
/// request waits.
async fn post_and_hang_up(s: &Served, resource: &str, wait: f64, lifetime: f64) {
    let addr = s.url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = lock_body("gone", wait, lifetime);
    let req = format!(
        "POST /locks/{resource} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    // No answer while it waits.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut buf))
            .await
            .is_err(),
        "answered while the lock is held"
    );
    drop(tcp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_wait_never_holds_the_lock() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "gone").await;
    let holder = location(&rdlm_post(&c, &s, "gone", 5.0, 10.0).await);
    post_and_hang_up(&s, "gone", 20.0, 20.0).await;
    // The waiter is gone from the queue...
    let started = Instant::now();
    loop {
        let v: Value = get_json(&c, &s, "/v1/locks/gone").await;
        if v["locks"].as_array().unwrap().len() == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still queued: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...and does not get the lock when it is released: the next client does, at once.
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &holder).await,
        StatusCode::NO_CONTENT
    );
    let started = Instant::now();
    let next = rdlm_post(&c, &s, "gone", 3.0, 1.0).await;
    assert_eq!(
        next.status(),
        StatusCode::CREATED,
        "the gone client holds it"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_waiting_requests_and_stops_accepting() {
    let (_store, s, c) = serve_sqlite().await;
    warm(s.gateway(), "bye").await;
    let _held = location(&rdlm_post(&c, &s, "bye", 5.0, 10.0).await);
    let waiter = {
        let (c, url) = (c.clone(), s.at("/locks/bye"));
        tokio::spawn(async move {
            c.post(url)
                .body(lock_body("w", 20.0, 1.0))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    wait_listed(&c, &s, "bye", 2).await;
    let health = s.at("/health");
    let took = s.shutdown().await;
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert_eq!(waiter.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(c.get(health).send().await.is_err(), "still accepting");
}

on_stores!(async Backend, two_gateways_act_as_one_service =>
    two_gateways_on_one_nats_store_act_as_one_service: nats,
    two_gateways_on_one_etcd_store_act_as_one_service: etcd,
);

async fn two_gateways_act_as_one_service(server: &Backend) {
    let store = server.open().await;
    let g1 = Arc::new(Served::start(store.clone(), "gw1", HttpOptions::default()).await);
    let g2 = Arc::new(Served::start(server.open().await, "gw2", HttpOptions::default()).await);
    let c = client();
    warm(g1.gateway(), "shared").await;

    let on1 = location(&rdlm_post(&c, &g1, "shared", 5.0, 10.0).await);
    let on2 = on1.replace(&g1.url, &g2.url);
    let v: Value = c.get(&on2).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["active"], true, "gw2 does not see gw1's lock: {v}");
    assert_eq!(
        rdlm_post(&c, &g2, "shared", 1.0, 5.0).await.status(),
        StatusCode::REQUEST_TIMEOUT
    );
    let waiter = {
        let (c, g2) = (c.clone(), g2.clone());
        tokio::spawn(async move { location(&rdlm_post(&c, &g2, "shared", 20.0, 10.0).await) })
    };
    wait_listed(&c, &g1, "shared", 2).await;
    // Released through the other gateway: the waiter on gw2 gets it at once.
    let released = Instant::now();
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &on2).await,
        StatusCode::NO_CONTENT
    );
    let waited = waiter.await.unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    let st: Value = c
        .get(g1.at("/v1/status/shared"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(st["holder"], "gw2", "{st}");
    // An admin delete on gw1 revokes gw2's lock.
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &g1.at("/resources/shared")).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        status_of(&c, reqwest::Method::GET, &waited).await,
        StatusCode::NOT_FOUND
    );
}

/// `putex lock NAME --ttl 1s -- sh -c SCRIPT` on `url`, in `dir` (see
/// [`putex_sh`](crate::common::agent::putex_sh)).
fn putex_lock(
    url: &str,
    dir: &Path,
    name: &str,
    args: &[&str],
    script: &str,
) -> tokio::process::Command {
    crate::common::agent::putex_lock(dir, url, name, "1s", args, script).into()
}

/// `putex lock NAME --ttl 1s -- sh -c SCRIPT` on `server`'s store in `dir`
/// (with `$P` the putex binary), once SCRIPT runs: the process, and its
/// `PUTEX_TOKEN`.
pub(crate) async fn holding(
    server: &Backend,
    dir: &Path,
    name: &str,
    script: &str,
) -> (tokio::process::Child, String) {
    holding_for(server, dir, name, "1s", script).await
}

/// [`holding`] with a `--ttl` of the caller's.
pub(crate) async fn holding_for(
    server: &Backend,
    dir: &Path,
    name: &str,
    ttl: &str,
    script: &str,
) -> (tokio::process::Child, String) {
    let script =
        format!(r#"echo "$PUTEX_TOKEN" > "$D/token.tmp"; mv "$D/token.tmp" "$D/token"; {script}"#);
    let mut cmd: tokio::process::Command =
        crate::common::agent::putex_lock(dir, &server.url(), name, ttl, &[], &script).into();
    cmd.env("P", crate::common::agent::putex_bin());
    let cmd = cmd.spawn().unwrap();
    wait_file(&dir.join("token"), "putex lock never ran").await;
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    (cmd, token.trim().to_owned())
}

fn read_ns(path: &Path) -> Option<u128> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

on_stores!(async Backend, http_locks_and_putex_lock_exclude =>
    http_locks_and_putex_lock_exclude_each_other: nats,
    http_locks_and_putex_lock_exclude_each_other_on_etcd: etcd,
);

async fn http_locks_and_putex_lock_exclude(server: &Backend) {
    let s = Served::on(server).await;
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // putex lock holds: HTTP gets 408, then the lock once the command ends.
    let (mut cmd, _) = holding(server, d, "inter", r#"sleep 1.5; date +%s%N > "$D/ended""#).await;
    assert_eq!(
        rdlm_post(&c, &s, "inter", 0.0, 5.0).await.status(),
        StatusCode::REQUEST_TIMEOUT
    );
    let r = rdlm_post(&c, &s, "inter", 10.0, 5.0).await;
    let granted = wall_ns();
    let url = location(&r);
    let ended = read_ns(&d.join("ended")).expect("granted before the command ended");
    assert!(ended <= granted);
    assert!(
        Duration::from_nanos((granted - ended) as u64) < Duration::from_secs(2),
        "handover took {:?}",
        Duration::from_nanos((granted - ended) as u64)
    );
    assert_eq!(cmd.wait().await.unwrap().code(), Some(0));

    // HTTP holds: visible in `putex status`; `putex lock` waits for it.
    let st = crate::common::agent::status_json(&server.url(), "inter");
    assert_eq!(st["holder"], "gw1", "{st}");
    // `active` is pinned by `a_granted_lock_shows_active_in_status`.
    assert!(
        st["state"] == "active" || st["state"] == "confirming",
        "{st}"
    );
    assert!(url.ends_with(st["instance"].as_str().unwrap()));
    let code = putex_lock(&server.url(), d, "inter", &["--no-wait"], "true")
        .status()
        .await
        .unwrap()
        .code();
    assert_eq!(code, Some(75), "putex lock ran while HTTP held the lock");
    let http_revision: u64 = st["revision"].as_u64().unwrap();
    let mut cmd = putex_lock(
        &server.url(),
        d,
        "inter",
        &["--wait", "10s"],
        r#"date +%s%N > "$D/ran"; echo $PUTEX_REVISION > "$D/rev""#,
    )
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !d.join("ran").exists(),
        "putex lock ran while HTTP held the lock"
    );
    let released = wall_ns();
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &url).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(cmd.wait().await.unwrap().code(), Some(0));
    let ran = read_ns(&d.join("ran")).unwrap();
    assert!(ran >= released);
    assert!(Duration::from_nanos((ran - released) as u64) < Duration::from_secs(3));
    let rev: u64 = std::fs::read_to_string(d.join("rev"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(rev > http_revision, "fencing tokens go backwards");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_and_stops_on_sigterm() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use tokio::io::AsyncBufReadExt;

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut cmd = putex();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--node",
        "gw1",
        "--token-file",
    ])
    .arg(&token)
    .arg("--store")
    .arg(format!("sqlite://{}", dir.path().join("s.db").display()))
    .env("RUST_LOG", "info")
    .stdin(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut child = tokio::process::Command::from(cmd).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("listen=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("putex serve exited before listening");
    })
    .await
    .expect("putex serve listens");
    let c = client();
    let base = format!("http://{addr}");
    assert_eq!(
        c.get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        c.get(format!("{base}/")).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        c.get(format!("{base}/"))
            .bearer_auth("s3cret")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("putex serve stops on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    // Bad flags are usage errors that name the flag.
    let out = putex()
        .args(["serve", "--listen", "nowhere", "--node", "gw1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));
}

/// A token object of the JSON API as `EPOCH:REVISION`; its parts must be
/// strings (an epoch is above 2^53, beyond exact JavaScript numbers).
fn token_text(t: &Value) -> String {
    let part = |k: &str| {
        let p = t[k]
            .as_str()
            .unwrap_or_else(|| panic!("token {k} is no string: {t}"));
        assert!(p.parse::<u64>().is_ok(), "token {k} is no u64: {t}");
        p.to_owned()
    };
    format!("{}:{}", part("epoch"), part("revision"))
}

/// A `201`'s fencing token as `(epoch, revision)`, which orders tokens.
fn token_of(r: &Response) -> (u64, u64) {
    let t = r.headers()["x-putex-token"].to_str().unwrap();
    let (e, r) = t.split_once(':').unwrap();
    (e.parse().unwrap(), r.parse().unwrap())
}

/// RDLM's own test suite ends every case with `DELETE /resources` and
/// starts the next by locking the same names again, expecting a `201`
/// within a 5 s wait: an admin delete frees a lock granted over HTTP at
/// once, and the fencing token still goes up.
async fn rdlm_admin_deletes_free_http_locks_at_once(server: &Backend) {
    let s = Served::on(server).await;
    let c = client();
    tokio::join!(
        warm(s.gateway(), "resource1"),
        warm(s.gateway(), "resource2")
    );
    use reqwest::Method as M;

    // DELETE /resources/{r}, then the same name again at once.
    let a = rdlm_post(&c, &s, "resource1", 5.0, 60.0).await;
    let a_token = token_of(&a);
    let a = location(&a);
    let deleted = Instant::now();
    assert_eq!(
        status_of(&c, M::DELETE, &s.at("/resources/resource1")).await,
        StatusCode::NO_CONTENT
    );
    let b = rdlm_post(&c, &s, "resource1", 5.0, 60.0).await;
    let took = deleted.elapsed();
    assert_eq!(
        b.status(),
        StatusCode::CREATED,
        "not granted within 5 s of the admin delete ({took:?})"
    );
    assert!(
        took < Duration::from_secs(2),
        "granted {took:?} after the delete"
    );
    let b_token = token_of(&b);
    assert!(
        b_token > a_token,
        "fencing token {b_token:?} after {a_token:?}"
    );
    let b = location(&b);
    assert_eq!(status_of(&c, M::GET, &a).await, StatusCode::NOT_FOUND);
    assert_eq!(status_of(&c, M::DELETE, &a).await, StatusCode::NOT_FOUND);
    assert_eq!(status_of(&c, M::GET, &b).await, StatusCode::OK);

    // DELETE /resources: every resource, then both names again at once.
    let r2 = rdlm_post(&c, &s, "resource2", 5.0, 60.0).await;
    let r2_token = token_of(&r2);
    let r2 = location(&r2);
    let deleted = Instant::now();
    assert_eq!(
        status_of(&c, M::DELETE, &s.at("/resources")).await,
        StatusCode::NO_CONTENT
    );
    let (again1, again2) = tokio::join!(
        rdlm_post(&c, &s, "resource1", 5.0, 60.0),
        rdlm_post(&c, &s, "resource2", 5.0, 60.0)
    );
    let took = deleted.elapsed();
    assert_eq!(again1.status(), StatusCode::CREATED, "after {took:?}");
    assert_eq!(again2.status(), StatusCode::CREATED, "after {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "granted {took:?} after the delete"
    );
    assert!(token_of(&again1) > b_token);
    assert!(token_of(&again2) > r2_token);
    for gone in [&b, &r2] {
        assert_eq!(status_of(&c, M::GET, gone).await, StatusCode::NOT_FOUND);
    }
}

on_stores!(async Backend, rdlm_admin_deletes_free_http_locks_at_once =>
    rdlm_admin_deletes_free_http_locks_at_once_sqlite: sqlite,
    rdlm_admin_deletes_free_http_locks_at_once_nats: nats,
    rdlm_admin_deletes_free_http_locks_at_once_etcd: etcd,
);

/// A `201` that takes long to reach its client (a slow network, a slow
/// client socket): the client counts its lifetime from the moment it
/// receives it, so the next holder must not start before then + lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_201_slow_to_arrive_still_gets_its_whole_lifetime() {
    use crate::common::proxy::{Mode, Proxy};
    let store = Backend::sqlite();
    let s = Arc::new(
        Served::start_gateway(
            store.open().await,
            GatewayOptions {
                grant_deadline: Duration::from_secs(2),
                ..gateway_options("gw1")
            },
            HttpOptions::default(),
        )
        .await,
    );
    let c = client();
    warm(s.gateway(), "late201").await;
    // Every byte between the first client and the gateway takes 900 ms:
    // within half the 2 s grant deadline.
    let addr = s.url.trim_start_matches("http://").parse().unwrap();
    let proxy = Proxy::start(addr).await.unwrap();
    proxy.set(Mode::Jitter {
        min: Duration::from_millis(900),
        max: Duration::from_millis(900),
    });
    let first = {
        let url = format!("http://{}/locks/late201", proxy.addr());
        tokio::spawn(async move {
            let sent = Instant::now();
            let r = client()
                .post(url)
                .body(lock_body("far away", 5.0, 1.0))
                .send()
                .await
                .unwrap();
            (sent, Instant::now(), r)
        })
    };
    // The next client asks as soon as the first one is in line.
    wait_listed(&c, &s, "late201", 1).await;
    let second = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move {
            let r = rdlm_post(&c, &s, "late201", 10.0, 1.0).await;
            (Instant::now(), r)
        })
    };
    let (sent, received, first) = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let (granted, second) = second.await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    let lifetime = Duration::from_secs(1);
    assert!(
        granted >= received + lifetime,
        "the next holder got the lock {:?} after the first client received its 201 \
         (lifetime {lifetime:?})",
        granted - received
    );
    // What the 201 says is left of the lifetime.
    let left = first.headers()["x-putex-lifetime-left"]
        .to_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    let left = Duration::from_secs_f64(left);
    let deadline = Duration::from_secs(2);
    assert!(
        left >= lifetime + deadline / 2 && left <= lifetime + deadline,
        "{left:?} left"
    );
    // Counted from before the grant (the request), it ends before the next
    // holder starts; and it is not much shorter than the truth.
    assert!(granted >= sent + left, "{:?} < {left:?}", granted - sent);
    assert!(
        granted <= received + left + Duration::from_millis(1500),
        "{:?} after receipt, {left:?} said to be left",
        granted - received
    );
}

on_stores!(async Backend, grant_too_slow_is_given_back =>
    a_grant_too_slow_to_answer_is_given_back_to_the_next_waiter: nats,
    a_grant_too_slow_to_answer_is_given_back_to_the_next_waiter_on_etcd: etcd,
);

/// A gateway whose store is slow cannot answer within its grant deadline:
/// it gives the lock back, and the next waiter gets it at once rather than
/// after the lifetime.
async fn grant_too_slow_is_given_back(server: &Backend) {
    use crate::common::proxy::{Mode, Proxy};
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let fast = Arc::new(Served::start(server.open().await, "fast", HttpOptions::default()).await);
    let slow_store = AnyStore::open(&StoreUrl::parse(&server.url_via(proxy.addr())).unwrap())
        .await
        .unwrap();
    // A lease long enough for the agent's store calls to fit in their
    // deadlines through the slow link (R = 1 s: 400 ms each); a grant
    // deadline of 200 ms: the answer must leave within 100 ms of the
    // granting write.
    let slow = Arc::new(
        Served::start_gateway(
            slow_store,
            GatewayOptions {
                acquire_lease: Duration::from_secs(10),
                grant_deadline: Duration::from_millis(200),
                ..gateway_options("slow")
            },
            HttpOptions::default(),
        )
        .await,
    );
    let c = client();
    warm(fast.gateway(), "given").await;
    let held = location(&rdlm_post(&c, &fast, "given", 5.0, 30.0).await);
    // B waits on the slow gateway, C behind it on the fast one.
    let b = {
        let (c, slow) = (c.clone(), slow.clone());
        tokio::spawn(async move { rdlm_post(&c, &slow, "given", 20.0, 30.0).await })
    };
    wait_listed(&c, &fast, "given", 2).await;
    let next = {
        let (c, fast) = (c.clone(), fast.clone());
        tokio::spawn(async move {
            let r = rdlm_post(&c, &fast, "given", 25.0, 5.0).await;
            (Instant::now(), r)
        })
    };
    wait_listed(&c, &fast, "given", 3).await;
    // Each store call of the slow gateway now takes at least 240 ms: the
    // reply to its granting write comes too late to answer within 100 ms.
    proxy.set(Mode::Jitter {
        min: Duration::from_millis(120),
        max: Duration::from_millis(120),
    });
    let released = Instant::now();
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &held).await,
        StatusCode::NO_CONTENT
    );
    let b = b.await.unwrap();
    assert_eq!(
        b.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the slow gateway answered {} {:?}",
        b.status(),
        b.headers()
    );
    let (granted, next) = next.await.unwrap();
    assert_eq!(next.status(), StatusCode::CREATED);
    assert!(
        granted - released < Duration::from_secs(12),
        "the next waiter got the lock {:?} after the release (B's lifetime is 30 s)",
        granted - released
    );
}

/// Waits for `path` to exist.
async fn wait_file(path: &Path, what: &str) {
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_stores!(async Backend, http_release_and_renew_never_touch_a_holder =>
    http_release_and_renew_never_touch_a_putex_lock_holder: nats,
    http_release_and_renew_never_touch_a_putex_lock_holder_on_etcd: etcd,
);

/// `putex lock` holders are listed with their instance as the uid; an
/// HTTP release or renewal naming it must not touch their record: a
/// `released` record would let the next holder start at once while the
/// command still runs.
async fn http_release_and_renew_never_touch_a_holder(server: &Backend) {
    let s = Served::on(server).await;
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut cmd, _) = holding(server, d, "watched", r#"sleep 3; touch "$D/done""#).await;
    let v = listed(&c, &s, "watched").await;
    let uid = v["locks"][0]["uid"].as_str().unwrap().to_owned();
    let st = crate::common::agent::status_json(&server.url(), "watched");
    assert_eq!(st["instance"], uid.as_str(), "{st}");
    use reqwest::Method as M;
    for url in [
        s.at(&format!("/v1/locks/watched/{uid}")),
        s.at(&format!("/locks/watched/{uid}")),
    ] {
        assert_eq!(status_of(&c, M::DELETE, &url).await, StatusCode::NOT_FOUND);
    }
    let renew = s.at(&format!("/v1/locks/watched/{uid}/renew"));
    assert_eq!(status_of(&c, M::POST, &renew).await, StatusCode::NOT_FOUND);
    let after = crate::common::agent::status_json(&server.url(), "watched");
    assert!(
        after["state"] == "active" || after["state"] == "confirming",
        "{after}"
    );
    assert_eq!(after["instance"], uid.as_str(), "{after}");
    assert_eq!(
        cmd.wait().await.unwrap().code(),
        Some(0),
        "the lock was lost"
    );
    assert!(d.join("done").exists());
}

/// `/v1/`'s two admin calls on a lock granted over HTTP: `force` frees it
/// at once (the waiter gets it, with a higher fencing token); `revoke`
/// marks it `revoked`, and takers wait out its lifetime + D.
async fn v1_force_frees_and_revoke_revokes_an_http_lock(server: &Backend) {
    let s = Arc::new(Served::on(server).await);
    let c = client();
    warm(s.gateway(), "vforce").await;
    use reqwest::Method as M;
    let post = |path: &str| c.post(s.at(path)).send();

    let a = v1_post(&c, &s, "vforce", json!({"wait": 5, "lifetime": 60})).await;
    let a_token = token_of(&a);
    let a: Value = a.json().await.unwrap();
    let waiter = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move {
            let r = v1_post(&c, &s, "vforce", json!({"wait": 20, "lifetime": 5})).await;
            (Instant::now(), r)
        })
    };
    wait_listed(&c, &s, "vforce", 2).await;
    let forced = Instant::now();
    let r = post("/v1/locks/vforce/force").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["action"], "freed", "{v}");
    assert_eq!(v["holder"], "gw1");
    assert_eq!(v["instance"], a["uid"]);
    assert_eq!(v["fencing_token"], a["fencing_token"]);
    assert_eq!(
        token_text(&v["token"]),
        v["fencing_token"].as_str().unwrap()
    );
    // The waiter keeps its place and gets the lock at once.
    let (granted, b) = waiter.await.unwrap();
    assert_eq!(b.status(), StatusCode::CREATED);
    assert!(
        granted - forced < Duration::from_secs(2),
        "granted {:?} after the force",
        granted - forced
    );
    assert!(token_of(&b) > a_token);
    let b: Value = b.json().await.unwrap();
    let a_url = s.at(a["href"].as_str().unwrap());
    assert_eq!(status_of(&c, M::GET, &a_url).await, StatusCode::NOT_FOUND);
    assert_eq!(
        status_of(&c, M::DELETE, &a_url).await,
        StatusCode::NOT_FOUND
    );

    // Revoke: `revoked` (S7), not free: a short wait gets nothing.
    let r = post("/v1/locks/vforce/revoke").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["action"], "revoked", "{v}");
    assert_eq!(v["instance"], b["uid"]);
    let st: Value = get_json(&c, &s, "/v1/status/vforce").await;
    assert_eq!(st["state"], "revoked", "{st}");
    let r = v1_post(&c, &s, "vforce", json!({"wait": 1, "lifetime": 1})).await;
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);

    // Nothing holds it any more.
    for call in ["/v1/locks/vforce/force", "/v1/locks/vforce/revoke"] {
        let r = post(call).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{call}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "not_found", "{e}");
    }
}

on_stores!(async Backend, v1_force_frees_and_revoke_revokes_an_http_lock =>
    v1_force_frees_and_revoke_revokes_an_http_lock_sqlite: sqlite,
    v1_force_frees_and_revoke_revokes_an_http_lock_nats: nats,
    v1_force_frees_and_revoke_revokes_an_http_lock_etcd: etcd,
);

on_stores!(async Backend, admin_calls_revoke_a_holder_and_never_force_it =>
    admin_calls_revoke_a_putex_lock_holder_and_never_force_it: nats,
    admin_calls_revoke_a_putex_lock_holder_and_never_force_it_on_etcd: etcd,
);

/// A `putex lock` holder watches its record and may still be running:
/// `force` refuses it, and RDLM's admin delete revokes it (S7) rather than
/// freeing it — the command is stopped, and the next request waits W + G'.
async fn admin_calls_revoke_a_holder_and_never_force_it(server: &Backend) {
    let s = Served::on(server).await;
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut cmd, _) = holding(server, d, "agentheld", "sleep 30").await;

    let r = c
        .post(s.at("/v1/locks/agentheld/force"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "not_forceable", "{e}");
    let st = crate::common::agent::status_json(&server.url(), "agentheld");
    assert!(
        st["state"] == "active" || st["state"] == "confirming",
        "{st}"
    );

    let deleted = Instant::now();
    assert_eq!(
        status_of(&c, reqwest::Method::DELETE, &s.at("/resources/agentheld")).await,
        StatusCode::NO_CONTENT
    );
    let st = crate::common::agent::status_json(&server.url(), "agentheld");
    // Revoked — or already released by the holder, whose stop of a `sleep`
    // can be proven before `putex status` has even started.
    assert!(
        st["state"] == "revoked" || st["state"] == "released",
        "{st}"
    );
    // The holder learns it from its record, and its command is stopped.
    let code = tokio::time::timeout(Duration::from_secs(10), cmd.wait())
        .await
        .expect("putex lock kept running after the revoke")
        .unwrap()
        .code();
    assert_eq!(code, Some(76));
    let exited = Instant::now();
    // Free once the holder proved its stop (it writes `released` over the
    // revoked record before it exits, S7): no wait of W + G' (the advertised
    // --ttl is 1 s) — and only then, since it exited first.
    let r = rdlm_post(&c, &s, "agentheld", 10.0, 1.0).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    eprintln!(
        "revoked putex lock: exited {:?} after the delete, the next grant {:?} after that",
        exited.duration_since(deleted),
        exited.elapsed()
    );
    assert!(
        exited.elapsed() < Duration::from_millis(900),
        "granted {:?} after the revoked holder exited: it did not free the record",
        exited.elapsed()
    );
}
