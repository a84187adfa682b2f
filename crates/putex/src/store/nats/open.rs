//! Opening a NATS store: connecting, checking the server's version and
//! JetStream, and finding or creating the bucket — patiently while a fresh
//! cluster elects its meta leader, at once when the configuration is
//! refused.

use super::*;

impl NatsStore {
    /// Connects, checks the server, and finds or creates the bucket.
    pub async fn open(cfg: &NatsConfig) -> Result<NatsStore, StoreError> {
        match tokio::time::timeout(OPEN_TIMEOUT, Self::open_inner(cfg)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timed_out(
                Op::Open,
                &cfg.servers.join(","),
                OPEN_TIMEOUT,
            )),
        }
    }

    async fn open_inner(cfg: &NatsConfig) -> Result<NatsStore, StoreError> {
        let where_ = cfg.servers.join(",");
        let scheme = if cfg.tls.required { "tls" } else { "nats" };
        let addrs = cfg
            .servers
            .iter()
            .map(|s| {
                format!("{scheme}://{s}")
                    .parse::<ServerAddr>()
                    .map_err(|e| StoreError::config(format!("NATS server {s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let mut opts = match &cfg.auth {
            NatsAuth::None => async_nats::ConnectOptions::new(),
            NatsAuth::Creds(path) => async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    StoreError::config(format!("NATS credentials file {}: {e}", path.display()))
                })?,
            NatsAuth::Nkey(seed) => async_nats::ConnectOptions::with_nkey(seed.clone()),
            NatsAuth::UserPassword { user, password } => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(t) => async_nats::ConnectOptions::with_token(t.clone()),
        };
        // async-nats reads these files only while connecting, and its error
        // does not name the file: check them here.
        for (what, file) in [
            ("tls_ca", &cfg.tls.ca),
            ("tls_cert", &cfg.tls.cert),
            ("tls_key", &cfg.tls.key),
        ] {
            if let Some(path) = file {
                if let Err(e) = std::fs::File::open(path) {
                    return Err(StoreError::config(format!(
                        "NATS {what} file {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        if cfg.tls.required {
            opts = opts.require_tls(true);
        }
        if let Some(ca) = &cfg.tls.ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&cfg.tls.cert, &cfg.tls.key) {
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
        let epoch_stale = Arc::new(AtomicBool::new(false));
        let stale = epoch_stale.clone();
        // The first connection is the one `open` reads the epoch over.
        let connected_before = Arc::new(AtomicBool::new(false));
        let choice = Arc::new(stuck::ServerChoice::default());
        let arrived = choice.clone();
        let choose = choice.clone();
        opts = opts
            .name("putex")
            .connection_timeout(Duration::from_secs(5))
            .ping_interval(PING_INTERVAL)
            .reconnect_delay_callback(stuck::reconnect_delay)
            .reconnect_to_server_callback(move |servers, info| {
                std::future::ready(choose.pick(&servers, (&info.host, info.port)))
            })
            .event_callback(move |ev| {
                let stale = stale.clone();
                let connected_before = connected_before.clone();
                let arrived = arrived.clone();
                async move {
                    match ev {
                        async_nats::Event::Connected => {
                            arrived.connected();
                            if connected_before.swap(true, Ordering::SeqCst) {
                                stale.store(true, Ordering::SeqCst)
                            }
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!("NATS connection lost; reconnecting")
                        }
                        other => tracing::debug!(event = %other, "NATS event"),
                    }
                }
            });
        let client = opts.connect(addrs).await.map_err(|e| {
            use async_nats::ConnectErrorKind as K;
            match e.kind() {
                K::Authentication | K::AuthorizationViolation | K::Tls | K::ServerParse => {
                    StoreError::config(format!("NATS {where_}: {e}"))
                }
                K::Io if tls_refused(&e) => StoreError::config(format!(
                    "NATS {where_}: TLS handshake failed: {e}; check tls_ca (the CA that signed the server's certificate), and tls_cert and tls_key if the server verifies clients"
                )),
                _ => StoreError::unknown(Op::Open, &where_, format_args!("cannot connect: {e}")),
            }
        })?;

        let info = client.server_info();
        let version = parse_version(&info.version).ok_or_else(|| {
            StoreError::config(format!(
                "NATS {where_}: unreadable server version {:?}",
                info.version
            ))
        })?;
        if version < MIN_SERVER {
            return Err(StoreError::config(format!(
                "NATS {where_}: nats-server {} is too old; putex needs 2.11 or later (2.12.3+ or 2.11.12+ recommended)",
                info.version
            )));
        }
        if !has_durability_fix(version) {
            tracing::warn!(
                version = %info.version,
                "nats-server before 2.12.3 / 2.11.12 can lose acknowledged writes in a coordinated crash; upgrade"
            );
        }
        if !info.jetstream {
            return Err(StoreError::config(format!(
                "NATS {where_}: JetStream is not enabled on the server (start it with -js, or a jetstream block)"
            )));
        }

        let mut js = jetstream::new(client.clone());
        // Our own deadline governs each call; keep the library's out of the way.
        js.set_timeout(Duration::from_secs(60));
        let mut kv = Self::bucket_patiently(&js, cfg).await?;
        let stream_info = kv.stream.cached_info().clone();
        check_bucket(&cfg.bucket, cfg.replicas, &stream_info.config)?;
        let epoch = nanos!(stream_info.created);
        date_revisions(&mut kv, &cfg.bucket, &stream_info).await;
        let ttl_allowed = stream_info.config.allow_message_ttl;
        let subject_prefix = kv.put_prefix.clone().unwrap_or_else(|| kv.prefix.clone());
        // A bucket deleted and re-created under a live connection shows no
        // reconnect: re-read the epoch every EPOCH_RECHECK too, so that a
        // new bucket is recognised (S6) within seconds rather than taken
        // for a store that went backwards.
        let weak = Arc::downgrade(&epoch_stale);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EPOCH_RECHECK).await;
                match weak.upgrade() {
                    Some(stale) => stale.store(true, Ordering::SeqCst),
                    None => return,
                }
            }
        });
        let acks = super::acks::Acks::start(&client).await.map_err(|e| {
            StoreError::unknown(
                Op::Open,
                &where_,
                format_args!("cannot subscribe to the answers of writes: {e}"),
            )
        })?;
        let store = NatsStore {
            inner: Arc::new(Inner {
                client,
                js,
                kv,
                bucket: cfg.bucket.clone(),
                subject_prefix,
                epoch: AtomicU64::new(epoch),
                epoch_stale,
                hub: super::Hub::new(),
                admission: tokio::sync::Semaphore::new(super::CALLS_UNDER_WAY),
                starting: tokio::sync::Mutex::new(None),
                stuck: stuck::Stuck::default(),
                choice,
                echo: tokio::sync::Mutex::new(None),
                servers: cfg.servers.len(),
                ttl_allowed: AtomicBool::new(ttl_allowed),
                atomic_allowed: AtomicBool::new(stream_info.config.allow_atomic_publish),
                acks,
            }),
        };
        if !ttl_allowed {
            // Beside the open, not in its way: credentials that may not
            // update the stream get no answer at all (a permissions
            // violation), and every `putex lock` would wait for it.
            let weak = Arc::downgrade(&store.inner);
            let (js, bucket) = (store.inner.js.clone(), cfg.bucket.clone());
            tokio::spawn(async move {
                if allow_ttl(&js, &bucket, &stream_info).await {
                    if let Some(inner) = weak.upgrade() {
                        inner.ttl_allowed.store(true, Ordering::SeqCst);
                    }
                }
            });
        }
        Ok(store)
    }

    /// [`Self::bucket`], tried again while the answer is unknown (a request
    /// left unanswered, no meta leader yet, peers still joining); a refused
    /// configuration ends it at once. [`Self::open`]'s deadline bounds it.
    async fn bucket_patiently(
        js: &jetstream::Context,
        cfg: &NatsConfig,
    ) -> Result<kv::Store, StoreError> {
        let mut attempt = OPEN_ATTEMPT;
        loop {
            match tokio::time::timeout(attempt, Self::bucket(js, cfg)).await {
                Ok(Ok(kv)) => return Ok(kv),
                Ok(Err(e)) if !e.is_unknown() => return Err(e),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the bucket is not ready yet; trying again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {
                    tracing::debug!(after = ?attempt, "no answer about the bucket yet; asking again");
                    attempt = (attempt * 2).min(OPEN_ATTEMPT_MAX);
                }
            }
        }
    }

    async fn bucket(js: &jetstream::Context, cfg: &NatsConfig) -> Result<kv::Store, StoreError> {
        if let Ok(kv) = js.get_key_value(&cfg.bucket).await {
            return Ok(kv);
        }
        let config = kv::Config {
            bucket: cfg.bucket.clone(),
            description: "putex locks".into(),
            history: HISTORY,
            max_age: Duration::ZERO,
            storage: StorageType::File,
            num_replicas: cfg.replicas,
            ..Default::default()
        };
        match js.create_key_value(config).await {
            Ok(kv) => {
                tracing::info!(bucket = %cfg.bucket, replicas = cfg.replicas, "created the NATS KV bucket");
                Ok(kv)
            }
            // Someone else may have created it meanwhile.
            Err(create) => js.get_key_value(&cfg.bucket).await.map_err(|_| {
                let rejected = std::error::Error::source(&create)
                    .and_then(|s| s.downcast_ref::<jetstream::context::CreateStreamError>())
                    .and_then(|e| match e.kind() {
                        jetstream::context::CreateStreamErrorKind::JetStream(j) => Some(j),
                        _ => None,
                    });
                match rejected {
                    // The server refused the settings (e.g. 3 replicas on a
                    // server that is not clustered): retrying will not help.
                    // Others (no meta leader yet, peers still joining: 10008,
                    // 10023) pass while a cluster starts; those are unknown.
                    Some(j) if j.code() == 400 || CONFIG_REJECTIONS.contains(&j.error_code()) => {
                        StoreError::config(format!(
                            "NATS bucket {:?} cannot be created with {} replica(s): {j}",
                            cfg.bucket, cfg.replicas
                        ))
                    }
                    _ => StoreError::unknown(
                        Op::Open,
                        &cfg.bucket,
                        format_args!("cannot find or create the bucket: {create}"),
                    ),
                }
            }),
        }
    }
}

/// Makes a bucket that was never written count its revisions from its
/// creation time in microseconds ([`first_dated_revision`]; a purge up to
/// that sequence: the stream then counts on from there), so that they are
/// dated and a compare-and-swap needs one request, not two. A bucket
/// already written keeps its numbering, and its compare-and-swaps read the
/// epoch first. Best effort: a bucket the purge fails on stays undated,
/// which is only slower.
async fn date_revisions(kv: &mut kv::Store, bucket: &str, info: &jetstream::stream::Info) {
    let first = first_dated_revision(nanos!(info.created));
    let state = &info.state;
    if state.first_sequence >= first {
        return;
    }
    if state.last_sequence != 0 {
        tracing::info!(
            bucket,
            "the bucket's revisions are not dated (it was written before putex dated new buckets, or by another client first): each compare-and-swap reads the epoch first; re-create the bucket to save that request"
        );
        return;
    }
    // Purging a never-written stream up to a sequence only moves its first
    // sequence; processes opening it at once all purge up to the same one.
    match kv.stream.purge().sequence(first).await {
        Ok(_) => match kv.stream.info().await {
            Ok(i) if i.state.first_sequence >= first => {
                tracing::debug!(bucket, first, "dated the bucket's revisions")
            }
            Ok(_) => tracing::info!(
                bucket,
                "the server did not move the bucket's first revision; it stays undated"
            ),
            Err(e) => tracing::debug!(bucket, error = %e, "cannot confirm the dating"),
        },
        Err(e) => tracing::info!(bucket, error = %e, "cannot date the bucket's revisions"),
    }
}

/// The first nats-server with atomic batches.
const ATOMIC_BATCH_SERVER: (u64, u64, u64) = (2, 12, 0);

impl NatsStore {
    /// Makes the bucket take atomic batches (`allow_atomic` on its stream),
    /// once per handle; a server before 2.12, or credentials that may not
    /// update the stream, get an error that says so.
    pub(super) async fn allow_atomic(&self) -> Result<(), StoreError> {
        if self.inner.atomic_allowed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let version = self.inner.client.server_info().version;
        if parse_version(&version).is_some_and(|v| v < ATOMIC_BATCH_SERVER) {
            return Err(StoreError::config(format!(
                "a guarded batch needs nats-server 2.12 or later (atomic batch publish); this one is {version}: write one key at a time, or use etcd or the embedded store"
            )));
        }
        let stream = &self.inner.kv.stream_name;
        set_stream_flag(&self.inner.js, stream, "allow_atomic")
            .await
            .map_err(|e| {
                StoreError::config(format!(
                    "nothing written: cannot let the bucket take atomic batches (allow_atomic on stream {stream}; credentials that may not update it?): {e}"
                ))
            })?;
        tracing::info!(stream = %stream, "the bucket now takes atomic batches (guarded writes of several keys)");
        self.inner.atomic_allowed.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// Lets the bucket's stream take per-message TTLs (nats-server 2.11 and
/// later), so that the marker of a retired key expires and nothing of the
/// key is left ([`Store::retire`](crate::store::Store::retire)). False when
/// that cannot be done (credentials that may not update the stream): then a
/// retired key leaves a delete marker, as any delete does. Putex sets a TTL
/// on nothing but those markers.
async fn allow_ttl(js: &jetstream::Context, bucket: &str, info: &jetstream::stream::Info) -> bool {
    let update = set_stream_flag(js, &info.config.name, "allow_msg_ttl");
    match tokio::time::timeout(OPEN_ATTEMPT_MAX, update).await {
        Ok(Ok(())) => {
            tracing::info!(
                bucket,
                "the bucket now allows per-message TTLs: the markers of queue tickets and HTTP grants expire"
            );
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(
                bucket,
                error = %e,
                "cannot let the bucket take per-message TTLs: every queue ticket and HTTP grant leaves a delete marker, and each costs later waiters of its lock (allow_msg_ttl on the stream, or `nats kv compact` now and then)"
            );
            false
        }
        Err(_) => {
            tracing::warn!(
                bucket,
                "no answer to allowing per-message TTLs on the bucket (credentials that may not update the stream?): queue tickets and HTTP grants leave delete markers"
            );
            false
        }
    }
}

/// Sets `flag` to true in the configuration of `stream`: the configuration
/// as the server has it, with every field (this client may not know them
/// all, and an update sets each one), and the flag. `Err`: what the server
/// said instead.
pub(super) async fn set_stream_flag(
    js: &jetstream::Context,
    stream: &str,
    flag: &str,
) -> Result<(), String> {
    let info: serde_json::Value = js
        .request(format!("STREAM.INFO.{stream}"), &serde_json::json!({}))
        .await
        .map_err(|e| e.to_string())?;
    let mut config = info
        .get("config")
        .cloned()
        .ok_or_else(|| format!("no configuration in {info}"))?;
    if config.get(flag) == Some(&serde_json::Value::Bool(true)) {
        return Ok(());
    }
    config
        .as_object_mut()
        .ok_or("the configuration is no object")?
        .insert(flag.into(), true.into());
    let answer: serde_json::Value = js
        .request(format!("STREAM.UPDATE.{stream}"), &config)
        .await
        .map_err(|e| e.to_string())?;
    match answer.pointer(&format!("/config/{flag}")) {
        Some(serde_json::Value::Bool(true)) => Ok(()),
        _ => Err(answer
            .get("error")
            .map_or_else(|| answer.to_string(), ToString::to_string)),
    }
}

/// Parses `major.minor.patch[-suffix]`.
pub(super) fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim_start_matches('v').split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// Whether a server version has the fix for the lost-acknowledged-writes
/// bug Jepsen found in 2.12.1 (fixed in 2.12.3 and 2.11.12).
pub(super) fn has_durability_fix(v: (u64, u64, u64)) -> bool {
    v >= (2, 12, 3) || (v.0 == 2 && v.1 == 11 && v.2 >= 12)
}

/// Whether a connect error is a TLS handshake that failed on certificates
/// or protocol (an untrusted server certificate, a client certificate the
/// server wants or refuses): rustls errors reach async-nats as an I/O error
/// of kind `InvalidData` (tokio-rustls wraps them so) and are filed under
/// `Io`, like a lost connection; retrying will not change them.
fn tls_refused(e: &async_nats::ConnectError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData && io.get_ref().is_some())
}

/// Refuses or warns about a bucket unfit for locks.
fn check_bucket(
    bucket: &str,
    replicas: usize,
    c: &jetstream::stream::Config,
) -> Result<(), StoreError> {
    if !c.max_age.is_zero() {
        return Err(StoreError::config(format!(
            "NATS bucket {bucket:?} expires records after {:?}: a lock record must never expire. Use a bucket without a TTL (or let putex create one)",
            c.max_age
        )));
    }
    if c.max_messages_per_subject < 2 {
        tracing::warn!(
            bucket,
            history = c.max_messages_per_subject,
            "the bucket keeps no history; watchers may miss changes"
        );
    }
    if c.storage != StorageType::File {
        tracing::warn!(
            bucket,
            "the bucket is kept in memory: a server restart loses every lock record"
        );
    }
    if c.num_replicas < replicas {
        tracing::warn!(
            bucket,
            has = c.num_replicas,
            asked = replicas,
            "the bucket has fewer replicas than asked for"
        );
    }
    if c.num_replicas < 3 {
        tracing::info!(
            bucket,
            replicas = c.num_replicas,
            "the bucket is not replicated; production wants 3 or 5 replicas"
        );
    }
    Ok(())
}
