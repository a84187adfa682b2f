//! Acquiring for an HTTP client: the request's ticket in the fair queue,
//! an agent that takes the lock by the core's rules, and the grant.

use super::*;

impl Gateway {
    /// Waits up to `req.wait` for the lock, grants it for `req.lifetime`
    /// and hands it over at once ([`Gateway::acquire_grant`], then
    /// [`Grant::hand_over`]).
    pub async fn acquire(&self, req: AcquireRequest) -> Result<LockInfo, AcquireError> {
        self.acquire_grant(req).await?.hand_over()
    }

    /// Waits up to `req.wait` for the lock and grants it for
    /// `req.lifetime`: the [`Grant`] must then be handed over within half
    /// the grant deadline ([`Grant::hand_over`]), at the last moment before
    /// the answer leaves; one that is not is given back. Cancel-safe:
    /// dropping the future (a client that disconnects) abandons the
    /// request, and a lock granted at that moment is released at once — a
    /// disconnected client never holds a lock.
    pub async fn acquire_grant(&self, req: AcquireRequest) -> Result<Grant, AcquireError> {
        if req.lifetime < MIN_LIFETIME || req.lifetime > self.opts.max_lifetime {
            return Err(AcquireError::Invalid(format!(
                "lifetime must be between {:?} and {:?}",
                MIN_LIFETIME, self.opts.max_lifetime
            )));
        }
        if req.wait > self.opts.max_wait {
            return Err(AcquireError::Invalid(format!(
                "wait must be at most {:?}",
                self.opts.max_wait
            )));
        }
        // Acquired with a short lease (the waits of S1/S4 use it against
        // records that advertise less), granted with the lifetime: the
        // grant's write advertises it to every taker.
        let timing = timing_for(
            req.lifetime.min(self.opts.acquire_lease),
            self.opts.max_drift,
        )
        .map_err(AcquireError::Invalid)?;
        // The work runs in a task of its own; this future only waits for
        // it. Dropping this future drops `reply`'s receiver: the task then
        // stops waiting, or drops the grant it could not deliver, which
        // gives the lock back.
        let (reply, result) = oneshot::channel();
        let (cancel, cancelled) = oneshot::channel::<()>();
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = this.acquire_task(req, timing, cancelled).await;
            let _ = reply.send(outcome);
        });
        let _cancel_on_drop = cancel;
        result.await.unwrap_or_else(|_| {
            Err(AcquireError::Store(StoreError::config(
                "gateway task failed",
            )))
        })
    }

    pub(super) async fn acquire_task(
        &self,
        req: AcquireRequest,
        timing: Timing,
        mut cancelled: oneshot::Receiver<()>,
    ) -> Result<Grant, AcquireError> {
        // A short wait is "only if free now": a live holder answers at
        // once; a free lock still gets the round trips it takes.
        if req.wait < MIN_WAIT {
            let key = keys::lock(&req.resource);
            if let Some(entry) = self
                .store
                .get(&key, ReadMode::Leader, self.timeout())
                .await?
            {
                if let Some(rec) = holder_of(&entry) {
                    if !expired(&entry, &rec, self.store_now().await?) {
                        return Err(AcquireError::Timeout);
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + req.wait.max(MIN_WAIT);
        let uid = crate::identity::instance_name();
        let ticket = Ticket::join(
            self.store.clone(),
            Waiter {
                name: req.resource.clone(),
                node: self.opts.node.clone(),
                instance: uid.clone(),
                renew: timing.renew(),
                store_timeout: timing.store_timeout(),
                title: Some(req.title.clone()),
                asked: Some((req.wait, req.lifetime)),
                patience: req.wait.max(MIN_WAIT),
            },
        )
        .await?;
        let mut turn = ticket.turn();
        let arrival = ticket.arrival();
        let cancel_key = keys::cancel(&req.resource);
        let mut cancel_watch = self
            .store
            .watch(&cancel_key, None, self.timeout())
            .await
            .ok();

        let mut agent = Agent::new(
            AgentConfig {
                highest_token: self.highest(&req.resource),
                store_clock_step: self.store.clock_step(),
                ..AgentConfig::new(
                    Identity {
                        node: self.opts.node.to_string(),
                        machine: crate::identity::machine_id(),
                        instance: uid.to_string(),
                    },
                    timing.clone(),
                )
            },
            clock::boot_time_now(),
        );
        agent.handle(clock::boot_time_now(), Input::Turn(false));
        let (granted_tx, mut granted) = mpsc::unbounded_channel();
        let (role_tx, role) = tokio::sync::watch::channel(Role::Starting);
        let (absent_tx, absent) = tokio::sync::watch::channel(None);
        let host = Arc::new(GatewayHost {
            resource: req.resource.clone(),
            highest: self.highest.clone(),
            granted: granted_tx,
            role: role_tx,
            absent: absent_tx,
            history: crate::observe::history::HistoryWriter::spawn(
                self.store.clone(),
                crate::observe::history::WriterConfig::new(
                    &req.resource,
                    &self.opts.node,
                    &uid,
                    "serve",
                    self.timeout(),
                ),
            ),
        });
        let (inputs, rx) = driver::input_channel();
        let lock_key = keys::lock(&req.resource);
        let probe = keys::probe(&self.opts.node);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let mut driver = tokio::spawn(driver::run_with_inputs(
            agent,
            self.store.clone(),
            Keys {
                lock: lock_key,
                probe,
            },
            host,
            async move {
                let _ = stop_rx.await;
            },
            rx,
        ));
        let _ = inputs.unbounded_send(Input::Turn(*turn.borrow()));
        // Whether the driver's task ended by itself (its agent exited): a
        // finished task must not be awaited again.
        let mut driver_ended = false;
        let outcome = loop {
            tokio::select! {
                changed = turn.changed() => {
                    if changed.is_ok() {
                        let _ = inputs.unbounded_send(Input::Turn(*turn.borrow_and_update()));
                    }
                }
                token = granted.recv() => {
                    let Some(token) = token else { break Err(AcquireError::Timeout) };
                    // Granted: the client holds it from here without
                    // renewals; the agent stops writing.
                    driver.abort();
                    break Ok(token);
                }
                ev = next_cancel(&mut cancel_watch) => {
                    match ev {
                        Some(revision) if revision > arrival => break Err(AcquireError::Cancelled),
                        Some(_) => {}
                        None => cancel_watch = None,
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    // Never in silence: a fresh name's wait says why (S4).
                    break Err(match *absent.borrow() {
                        Some((wait, why)) => AcquireError::TimeoutInAbsentWait {
                            wait_s: wait.as_secs_f64(),
                            why: why.explain(),
                        },
                        None => AcquireError::Timeout,
                    });
                }
                _ = &mut cancelled => break Err(AcquireError::Timeout),
                _ = &mut driver => {
                    driver_ended = true;
                    break Err(AcquireError::Timeout);
                }
            }
        };
        match outcome {
            Ok(_) => {
                // An admin delete cancels the waiters before it frees the
                // holder: a lock taken since was freed by that delete, and
                // this request was cancelled by it. Give it back ungranted
                // before leaving the line: while the ticket stands,
                // listings know the lock for a cancelled request's and
                // leave it out. (A failed read cancels nothing: the grant
                // reports it.)
                if self.cancelled_up_to(&req.resource).await.unwrap_or(0) > arrival {
                    self.give_back_ungranted(&req.resource, &uid).await;
                    ticket.leave().await;
                    return Err(AcquireError::Cancelled);
                }
                ticket.leave().await;
                self.grant(&req, &uid).await
            }
            Err(e) => {
                // Out of line at once: a request cancelled by an admin
                // delete must not take the lock the same delete frees
                // next (the agent only acquires on its turn).
                let _ = inputs.unbounded_send(Input::Turn(false));
                let settling = *role.borrow() == Role::Confirming;
                let cancelled = matches!(e, AcquireError::Cancelled);
                // A cancelled request keeps its ticket until its agent has
                // stopped (and given back a lock it took as the delete
                // freed it): listings know the lock it holds meanwhile for
                // a cancelled request's and leave it out; nobody else could
                // take it before anyway.
                let ticket = if cancelled {
                    Some(ticket)
                } else {
                    ticket.leave().await;
                    None
                };
                if driver_ended {
                    // Its agent exited: nothing of this request holds or
                    // writes anything any more.
                } else if settling {
                    // Taking the lock over (its fencing gap): leaving now
                    // would leave a `confirming` record that every taker
                    // must wait out (H6 allows no release from it). Finish
                    // in the background instead — activate, grant nothing,
                    // release, then leave the line — so that the lock is
                    // free for the next request. A tenure that ends without
                    // activating (lost to a revoke or another holder) has
                    // nothing to give back: it stops too, rather than run
                    // on as a standby nobody asked for.
                    let mut role = role;
                    let finish = tokio::spawn(async move {
                        tokio::select! {
                            _ = granted.recv() => {}
                            _ = role.wait_for(|r| *r != Role::Confirming) => {}
                        }
                        let _ = stop_tx.send(());
                        let _ = driver.await;
                        if let Some(ticket) = ticket {
                            ticket.leave().await;
                        }
                    });
                    if cancelled {
                        // An admin delete freed the lock and cancelled this
                        // request, which took it meanwhile: answer once it
                        // is free again, so that whoever hears the `409`
                        // finds it free. Over a release there is no gap to
                        // wait out (S3): a few round trips; a takeover's
                        // gap goes on in the background past the bound.
                        let _ = tokio::time::timeout(self.timeout(), finish).await;
                    }
                    return Err(e);
                } else {
                    let _ = stop_tx.send(());
                    if tokio::time::timeout(timing.lease(), &mut driver)
                        .await
                        .is_err()
                    {
                        driver.abort();
                    }
                }
                if let Some(ticket) = ticket {
                    ticket.leave().await;
                }
                Err(e)
            }
        }
    }

    /// Grants the lock: its description (the grant record), then one more
    /// write of its record — `active`, advertising `lifetime + D`, so the
    /// licence runs that long from it. Nothing follows that write: the
    /// [`Grant`] counts from its send and is ready when its reply arrives.
    pub(super) async fn grant(
        &self,
        req: &AcquireRequest,
        uid: &Name,
    ) -> Result<Grant, AcquireError> {
        let t = self.timeout();
        let key = keys::lock(&req.resource);
        let grant_key = keys::grant(&req.resource, uid);
        let deadline = self.opts.grant_deadline;
        let mut grant = GrantRecord {
            v: 1,
            title: req.title.clone(),
            wait_ms: ceil_millis(req.wait),
            lifetime_ms: ceil_millis(req.lifetime),
            deadline_ms: ceil_millis(deadline),
            since_ns: 0,
            token: Token::new(0, 0),
        };
        let mut described = false;
        let mut written = None;
        // The agent's last renewal may still land: retry on our own record.
        for _ in 0..3 {
            let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
                break;
            };
            let Some(rec) = holder_of(&entry).filter(|r| r.instance == uid.as_str()) else {
                break;
            };
            if !described {
                grant.token = entry.token;
                grant.since_ns = nanos_since_epoch(SystemTime::now());
                self.store
                    .put(
                        &grant_key,
                        &serde_json::to_vec(&grant).expect("serialises"),
                        t,
                    )
                    .await?;
                described = true;
            }
            let granted = LockRecord {
                state: LockState::Active,
                write: format!("{uid}-grant"),
                // The grant goes on with the holding its agent began.
                since: rec.since.or(Some(entry.token)),
                lease_ms: ceil_millis(req.lifetime + deadline).max(rec.lease_ms),
                ..rec
            };
            let (sent, wall) = (clock::boot_time_now(), SystemTime::now());
            match self
                .store
                .update(&key, &granted.encode(), entry.token, t)
                .await
            {
                Ok(token) => {
                    written = Some((token, sent, wall));
                    break;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // Lost between activation and grant: nothing was granted.
        let Some((token, sent, wall)) = written else {
            if described {
                self.forget_grant(&req.resource, uid).await;
            }
            return Err(AcquireError::Timeout);
        };
        self.raise_highest(&req.resource, token);
        grant.token = token;
        grant.since_ns = nanos_since_epoch(wall);
        Ok(Grant {
            info: info_of(&req.resource, uid, &grant),
            resource: req.resource.clone(),
            uid: uid.clone(),
            sent,
            deadline,
            give_back: Some(self.clone()),
        })
    }

    /// Deletes the grant record of `uid` on `resource`, if any (best effort:
    /// a stale one describes no lock, since the lock record decides).
    pub(super) async fn forget_grant(&self, resource: &Name, uid: &Name) {
        let t = self.timeout();
        let key = keys::grant(resource, uid);
        if let Ok(Some(g)) = self.store.get(&key, ReadMode::Any, t).await {
            let _ = self.store.retire(&key, g.token, t).await;
        }
    }
}

/// The agent's host while a request waits: nothing runs, activation is
/// the grant.
struct GatewayHost {
    resource: Name,
    /// The gateway's highest tokens per resource, raised here (S6).
    highest: Arc<parking_lot::Mutex<HashMap<Name, Token>>>,
    granted: mpsc::UnboundedSender<Token>,
    role: tokio::sync::watch::Sender<Role>,
    /// The absent-record wait the tenure owes, once it owes one (S4, S6).
    absent: tokio::sync::watch::Sender<Option<(Duration, AbsentWhy)>>,
    /// Transition records for `putex history` (the acquisition; the
    /// client's release is no transition of this agent).
    history: crate::observe::history::HistoryWriter,
}

impl Host for GatewayHost {
    fn health_check(&self, _: HealthMode, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(&self, token: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        let _ = self.granted.send(token);
        future::ready(true).boxed()
    }

    fn stop(&self, _: StopKind, _: Instant) -> BoxFuture<'static, bool> {
        // The HTTP client is the service; nothing runs here.
        future::ready(true).boxed()
    }

    fn keeper(&self, _: KeeperCommand) -> BoxFuture<'static, bool> {
        // No keeper: the HTTP client is the service.
        future::ready(true).boxed()
    }

    fn persist_highest(&self, token: Token) {
        raise(&self.highest, &self.resource, token);
    }

    fn event(&self, event: &Event) {
        if let Event::AbsentWait { wait, why } = event {
            tracing::info!(
                resource = %self.resource,
                "taken; waiting {:.1} s before granting: {}",
                wait.as_secs_f64(),
                why.explain()
            );
            self.absent.send_replace(Some((*wait, *why)));
        }
        if let Event::Transition {
            from,
            to,
            reason,
            token,
        } = event
        {
            tracing::debug!(%from, %to, %reason, "gateway lock transition");
            self.history.transition(*from, *to, reason, *token);
            self.role.send_replace(*to);
        }
    }
}
