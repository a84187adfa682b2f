//! The etcd client the store speaks through: the generated v3 API
//! ([`super::api`]) over one tonic channel, with what etcd expects of a
//! client around it and nothing more.
//!
//! - **Endpoints**: one channel balanced over every member named in the
//!   store URL (tonic's `balance_list`: the member with the fewest calls in
//!   flight of two picked at random), `https` with the TLS settings when
//!   the URL asks for TLS.
//! - **Metadata**: every call carries `hasleader: true` (etcd then refuses
//!   it at once, "no leader", on a member cut off from its quorum) and,
//!   once signed in, the auth `token` (not `Authenticate` itself, which
//!   makes the token and must not fail for an expired one).
//! - **Signing in**: with a user and password, the client authenticates at
//!   [`Client::connect`] and again when etcd refuses a call with
//!   `Unauthenticated` (an expired token: unused for `--auth-token-ttl`,
//!   a member's restart, a JWT's end), then makes that call once more.
//!   etcd checks the token before it proposes anything, so the refused call
//!   was not applied. Concurrent refusals sign in once.
//!
//! Putex's own rules about calls (never repeating one etcd took, deadlines,
//! which errors are conflicts) are the store's (`super`), not this
//! module's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, GrpcMethod, Status};

use super::api::etcdserverpb as pb;
use super::api::mvccpb;
use pb::auth_client::AuthClient;
use pb::cluster_client::ClusterClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;
use pb::watch_client::WatchClient;

/// How to reach and sign in to the cluster.
#[derive(Clone)]
pub(super) struct Options {
    /// How long connecting to one member may take.
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive pings: how often, also while idle.
    pub keep_alive_interval: Duration,
    /// HTTP/2 keep-alive pings: how long an answer may take before the
    /// connection counts as broken.
    pub keep_alive_timeout: Duration,
    /// User and password, when etcd's auth is on.
    pub user: Option<(String, String)>,
    /// TLS settings; `None` for plain HTTP/2.
    pub tls: Option<ClientTlsConfig>,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The answer to the call: etcd's status, or tonic's on its behalf when
    /// the call did not get through (`Unavailable` with the transport's
    /// message, e.g. "tcp connect error").
    #[error("gRPC status {}: {}", .0.code(), .0.message())]
    Status(Status),
    /// An endpoint or the TLS settings cannot be used, or etcd gave a token
    /// that cannot travel as metadata.
    #[error("{0}")]
    Config(String),
    /// Something on this side ended the call (e.g. the task it ran on).
    #[error("{0}")]
    Internal(String),
}

type Service = InterceptedService<Channel, Metadata>;

/// A connection to an etcd cluster; clones share it.
#[derive(Clone)]
pub(crate) struct Client {
    service: Service,
    token: Token,
    user: Option<Arc<(String, String)>>,
    /// Held while signing in again, so concurrent refusals sign in once.
    signing_in: Arc<tokio::sync::Mutex<()>>,
}

type Token = Arc<RwLock<Option<AsciiMetadataValue>>>;

/// Adds the metadata every call carries.
#[derive(Clone)]
struct Metadata {
    token: Token,
}

impl tonic::service::Interceptor for Metadata {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let authenticate = request
            .extensions()
            .get::<GrpcMethod>()
            .is_some_and(|m| m.service() == "etcdserverpb.Auth" && m.method() == "Authenticate");
        let metadata = request.metadata_mut();
        metadata.insert("hasleader", AsciiMetadataValue::from_static("true"));
        if !authenticate {
            if let Some(token) = self.token.read().clone() {
                metadata.insert("token", token);
            }
        }
        Ok(request)
    }
}

impl Client {
    /// A channel over `endpoints` (`host:port`), signed in when `options`
    /// name a user. Only signing in talks to the cluster; members are
    /// connected to as calls need them.
    pub(super) async fn connect(endpoints: &[String], options: &Options) -> Result<Client, Error> {
        if endpoints.is_empty() {
            return Err(Error::Config("no etcd endpoints".into()));
        }
        let endpoints = endpoints
            .iter()
            .map(|e| endpoint(e, options))
            .collect::<Result<Vec<_>, _>>()?;
        let token = Token::default();
        let client = Client {
            service: InterceptedService::new(
                Channel::balance_list(endpoints.into_iter()),
                Metadata {
                    token: token.clone(),
                },
            ),
            token,
            user: options.user.clone().map(Arc::new),
            signing_in: Arc::default(),
        };
        client.refresh_token().await?;
        Ok(client)
    }

    /// Signs in again (with a user; without one, nothing to do).
    pub(crate) async fn refresh_token(&self) -> Result<(), Error> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let request = pb::AuthenticateRequest {
            name: user.0.clone(),
            password: user.1.clone(),
        };
        let answer = AuthClient::new(self.service.clone())
            .authenticate(request)
            .await
            .map_err(Error::Status)?
            .into_inner();
        let token = AsciiMetadataValue::try_from(answer.token).map_err(|e| {
            Error::Config(format!("etcd gave an auth token that is not ASCII: {e}"))
        })?;
        *self.token.write() = Some(token);
        Ok(())
    }

    /// Makes a call; when etcd refused its token, signs in again (unless
    /// another call did meanwhile) and makes it once more.
    async fn call<T, F, Fut>(&self, mut send: F) -> Result<T, Error>
    where
        F: FnMut(Service) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let sent_with = self.token.read().clone();
        match send(self.service.clone()).await {
            Err(status) if self.user.is_some() && status.code() == Code::Unauthenticated => {
                {
                    let _one = self.signing_in.lock().await;
                    if *self.token.read() == sent_with {
                        self.refresh_token().await?;
                    }
                }
                send(self.service.clone()).await
            }
            other => other,
        }
        .map(tonic::Response::into_inner)
        .map_err(Error::Status)
    }

    /// `KV.Range`.
    pub(crate) async fn range(
        &self,
        request: pb::RangeRequest,
    ) -> Result<pb::RangeResponse, Error> {
        self.call(|s| {
            let request = request.clone();
            async move { KvClient::new(s).range(request).await }
        })
        .await
    }

    /// `KV.Put`.
    pub(crate) async fn put(&self, request: pb::PutRequest) -> Result<pb::PutResponse, Error> {
        self.call(|s| {
            let request = request.clone();
            async move { KvClient::new(s).put(request).await }
        })
        .await
    }

    /// `KV.Txn`.
    pub(crate) async fn txn(&self, request: pb::TxnRequest) -> Result<pb::TxnResponse, Error> {
        self.call(|s| {
            let request = request.clone();
            async move { KvClient::new(s).txn(request).await }
        })
        .await
    }

    /// `Watch.Watch` with one watch: what `request` asks for, on a stream
    /// of its own.
    pub(crate) async fn watch(
        &self,
        request: pb::WatchCreateRequest,
    ) -> Result<WatchStream, Error> {
        self.call(|s| {
            let request = request.clone();
            async move {
                // The request side stays open for as long as the stream
                // lives: closing it would end the watch.
                let (mut requests, receiver) = futures::channel::mpsc::channel(1);
                requests
                    .try_send(pb::WatchRequest {
                        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                            request,
                        )),
                    })
                    .map_err(|e| Status::internal(format!("the watch request: {e}")))?;
                let responses = WatchClient::new(s).watch(receiver).await?;
                Ok(responses.map(|responses| WatchStream {
                    _requests: requests,
                    responses,
                }))
            }
        })
        .await
    }

    /// `Lease.LeaseGrant`.
    pub(crate) async fn lease_grant(&self, ttl: i64) -> Result<pb::LeaseGrantResponse, Error> {
        self.call(|s| async move {
            LeaseClient::new(s)
                .lease_grant(pb::LeaseGrantRequest { ttl, id: 0 })
                .await
        })
        .await
    }

    /// `Lease.LeaseTimeToLive` (without the keys).
    pub(crate) async fn lease_time_to_live(
        &self,
        id: i64,
    ) -> Result<pb::LeaseTimeToLiveResponse, Error> {
        self.call(|s| async move {
            LeaseClient::new(s)
                .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: false })
                .await
        })
        .await
    }

    /// `Lease.LeaseRevoke`.
    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<pb::LeaseRevokeResponse, Error> {
        self.call(|s| async move {
            LeaseClient::new(s)
                .lease_revoke(pb::LeaseRevokeRequest { id })
                .await
        })
        .await
    }

    /// `Maintenance.Status` of whichever member the call reaches.
    pub(crate) async fn status(&self) -> Result<pb::StatusResponse, Error> {
        self.call(|s| async move { MaintenanceClient::new(s).status(pb::StatusRequest {}).await })
            .await
    }

    /// `Cluster.MemberList`.
    pub(crate) async fn member_list(&self) -> Result<pb::MemberListResponse, Error> {
        self.call(|s| async move {
            ClusterClient::new(s)
                .member_list(pb::MemberListRequest {
                    linearizable: false,
                })
                .await
        })
        .await
    }
}

/// The endpoint of one member.
fn endpoint(address: &str, options: &Options) -> Result<Endpoint, Error> {
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{address}");
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| Error::Config(format!("the etcd endpoint {url}: {e}")))?
        .connect_timeout(options.connect_timeout)
        .http2_keep_alive_interval(options.keep_alive_interval)
        .keep_alive_timeout(options.keep_alive_timeout)
        .keep_alive_while_idle(true);
    match &options.tls {
        None => Ok(endpoint),
        Some(tls) => endpoint
            .tls_config(tls.clone())
            .map_err(|e| Error::Config(format!("the TLS settings for {url}: {e}"))),
    }
}

/// The answers of one watch. Dropping it cancels the watch.
pub(crate) struct WatchStream {
    _requests: futures::channel::mpsc::Sender<pb::WatchRequest>,
    responses: tonic::Streaming<pb::WatchResponse>,
}

impl WatchStream {
    /// The next answer; `None` when etcd ended the stream.
    pub(crate) async fn message(&mut self) -> Result<Option<pb::WatchResponse>, Error> {
        self.responses.message().await.map_err(Error::Status)
    }
}

/// A transaction's compare: `key`'s create revision equals `revision`
/// (0: the key does not exist).
pub(crate) fn create_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> pb::Compare {
    compare(
        key,
        pb::compare::CompareTarget::Create,
        pb::compare::TargetUnion::CreateRevision(revision),
    )
}

/// A transaction's compare: `key`'s last write was at `revision`.
pub(crate) fn mod_revision_is(key: impl Into<Vec<u8>>, revision: i64) -> pb::Compare {
    compare(
        key,
        pb::compare::CompareTarget::Mod,
        pb::compare::TargetUnion::ModRevision(revision),
    )
}

/// A transaction's compare: `key`'s value is `value`.
pub(crate) fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> pb::Compare {
    compare(
        key,
        pb::compare::CompareTarget::Value,
        pb::compare::TargetUnion::Value(value.into()),
    )
}

fn compare(
    key: impl Into<Vec<u8>>,
    target: pb::compare::CompareTarget,
    value: pb::compare::TargetUnion,
) -> pb::Compare {
    pb::Compare {
        result: pb::compare::CompareResult::Equal.into(),
        target: target.into(),
        key: key.into(),
        range_end: Vec::new(),
        target_union: Some(value),
    }
}

/// A transaction's operation: put `value` at `key`, bound to `lease` (0:
/// none).
pub(crate) fn put_op(
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
    lease: i64,
) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        })),
    }
}

/// A transaction's operation: read `key`.
pub(crate) fn get_op(key: impl Into<Vec<u8>>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key: key.into(),
            ..Default::default()
        })),
    }
}

/// A transaction's operation: delete `key`.
pub(crate) fn delete_op(key: impl Into<Vec<u8>>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key: key.into(),
                ..Default::default()
            },
        )),
    }
}

/// A transaction: `when` every compare holds, `then`, else `otherwise`.
pub(crate) fn txn(
    when: impl Into<Vec<pb::Compare>>,
    then: impl Into<Vec<pb::RequestOp>>,
    otherwise: impl Into<Vec<pb::RequestOp>>,
) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: when.into(),
        success: then.into(),
        failure: otherwise.into(),
    }
}

/// The range answers of a transaction's operations (its `get_op`s).
pub(crate) fn ranges(resp: &pb::TxnResponse) -> impl Iterator<Item = &pb::RangeResponse> {
    resp.responses.iter().filter_map(|r| match &r.response {
        Some(pb::response_op::Response::ResponseRange(range)) => Some(range),
        _ => None,
    })
}

/// Whether a watch event deleted its key.
pub(crate) fn is_delete(event: &mvccpb::Event) -> bool {
    event.r#type() == mvccpb::event::EventType::Delete
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    fn metadata_of(service: &'static str, method: &'static str) -> tonic::metadata::MetadataMap {
        let mut interceptor = Metadata {
            token: Arc::new(RwLock::new(Some(AsciiMetadataValue::from_static("t0k")))),
        };
        let mut request = tonic::Request::new(());
        request
            .extensions_mut()
            .insert(GrpcMethod::new(service, method));
        interceptor.call(request).unwrap().into_parts().0
    }

    /// Every call requires a leader; the token goes with every call but
    /// the one that makes it.
    #[test]
    fn calls_carry_hasleader_and_the_token_but_authenticate_no_token() {
        for (service, method) in [
            ("etcdserverpb.KV", "Txn"),
            ("etcdserverpb.Watch", "Watch"),
            ("etcdserverpb.Lease", "LeaseTimeToLive"),
            ("etcdserverpb.Cluster", "MemberList"),
            ("etcdserverpb.Maintenance", "Status"),
        ] {
            let m = metadata_of(service, method);
            assert_eq!(m.get("hasleader").unwrap(), "true", "{method}");
            assert_eq!(m.get("token").unwrap(), "t0k", "{method}");
        }
        let m = metadata_of("etcdserverpb.Auth", "Authenticate");
        assert_eq!(m.get("hasleader").unwrap(), "true");
        assert!(m.get("token").is_none());
    }

    #[test]
    fn endpoints_are_http_or_https_with_tls() {
        let mut options = Options {
            connect_timeout: Duration::from_secs(1),
            keep_alive_interval: Duration::from_secs(1),
            keep_alive_timeout: Duration::from_secs(1),
            user: None,
            tls: None,
        };
        assert_eq!(
            endpoint("a:2379", &options).unwrap().uri().to_string(),
            "http://a:2379/"
        );
        options.tls = Some(ClientTlsConfig::new());
        assert_eq!(
            endpoint("a:2379", &options).unwrap().uri().to_string(),
            "https://a:2379/"
        );
        assert!(matches!(endpoint("a b", &options), Err(Error::Config(_))));
    }
}
