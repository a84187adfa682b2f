//! A client's own lock: giving it back and renewing it.

use super::*;

impl Gateway {
    /// Releases the granted lock `uid` (`released`, S3: the next waiter
    /// starts at once). `false` if it is not held (expired, released,
    /// revoked or unknown) or not an HTTP grant: a `putex lock` or agent
    /// holder, listed with its instance as the uid, is never released by
    /// its uid ([`is_http_grant`]).
    pub async fn release(&self, resource: &Name, uid: &Name) -> Result<bool, StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource);
        let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
            return Ok(false);
        };
        let Some(rec) =
            holder_of(&entry).filter(|r| r.instance == uid.as_str() && is_http_grant(r))
        else {
            return Ok(false);
        };
        let live = !expired(&entry, &rec, self.store_now().await?);
        // The client says it is done: that is the proof a release needs
        // (H6), also after the lifetime passed — the next waiter need not
        // wait out the staleness.
        let released = LockRecord {
            state: LockState::Released,
            write: format!("{uid}-release"),
            ..rec
        };
        let written = self
            .store
            .update(&key, &released.encode(), entry.token, t)
            .await;
        self.forget_grant(resource, uid).await;
        Ok(live && written.is_ok())
    }

    /// Gives back a lock that request `uid`'s agent took and activated but
    /// that was never granted (an admin delete cancelled the request as it
    /// freed the lock): its record becomes `released` (S3: the next waiter
    /// starts at once). The agent activated, so any fencing gap was paid,
    /// and the gateway started nothing under it — that is the proof a
    /// release needs (H6). Retried on a conflict, as the agent's last
    /// renewal may still land; a failure is logged and the lock expires
    /// after its lease.
    pub(super) async fn give_back_ungranted(&self, resource: &Name, uid: &Name) {
        if let Err(e) = self.try_give_back_ungranted(resource, uid).await {
            tracing::warn!(%resource, %uid, "giving back a cancelled request's lock failed (it expires after its lease): {e}");
        }
    }

    async fn try_give_back_ungranted(&self, resource: &Name, uid: &Name) -> Result<(), StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource);
        for _ in 0..3 {
            let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
                return Ok(());
            };
            let Some(rec) =
                holder_of(&entry).filter(|r| r.instance == uid.as_str() && !is_http_grant(r))
            else {
                return Ok(()); // not ours (any more): revoked, or taken over
            };
            let released = LockRecord {
                state: LockState::Released,
                write: format!("{uid}-cancelled"),
                ..rec
            };
            match self
                .store
                .update(&key, &released.encode(), entry.token, t)
                .await
            {
                Ok(token) => {
                    self.raise_highest(resource, token);
                    return Ok(());
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::conflict(crate::store::Op::Update, &key))
    }

    /// Extends the granted lock `uid` by a new lifetime from now (its own if
    /// `None`): its record is rewritten, advertising `lifetime + D` like a
    /// grant. `None` if it is not held. The [`Grant`] must be handed over
    /// like a new one; a renewal that is too late stays (its client counts
    /// from its previous answer, which ends earlier).
    pub async fn renew(
        &self,
        resource: &Name,
        uid: &Name,
        lifetime: Option<Duration>,
    ) -> Result<Option<Grant>, StoreError> {
        if let Some(l) = lifetime {
            if l < MIN_LIFETIME || l > self.opts.max_lifetime {
                return Err(StoreError::config(format!(
                    "lifetime must be between {:?} and {:?}",
                    MIN_LIFETIME, self.opts.max_lifetime
                )));
            }
        }
        let t = self.timeout();
        let Some((entry, rec, _)) = self.held(resource, uid).await? else {
            return Ok(None);
        };
        if !is_http_grant(&rec) {
            return Ok(None); // a `putex lock` or agent holder renews itself
        }
        let grant_key = keys::grant(resource, uid);
        let mut grant = self
            .store
            .get(&grant_key, ReadMode::Any, t)
            .await?
            .and_then(|e| serde_json::from_slice::<GrantRecord>(&e.value).ok())
            .unwrap_or(GrantRecord {
                v: 1,
                title: String::new(),
                wait_ms: 0,
                lifetime_ms: rec.lease_ms,
                deadline_ms: 0,
                since_ns: 0,
                token: entry.token,
            });
        let lifetime = lifetime.unwrap_or(Duration::from_millis(grant.lifetime_ms));
        let deadline = self.opts.grant_deadline;
        // The description first: nothing follows the renewing write.
        grant.lifetime_ms = ceil_millis(lifetime);
        grant.deadline_ms = ceil_millis(deadline);
        self.store
            .put(
                &grant_key,
                &serde_json::to_vec(&grant).expect("serialises"),
                t,
            )
            .await?;
        let renewed = LockRecord {
            state: LockState::Active,
            write: format!("{uid}-renew-{}", entry.token.revision),
            since: rec.since.or(Some(entry.token)),
            lease_ms: ceil_millis(lifetime + deadline),
            ..rec
        };
        let key = keys::lock(resource);
        let (sent, wall) = (clock::boot_time_now(), SystemTime::now());
        let token = match self
            .store
            .update(&key, &renewed.encode(), entry.token, t)
            .await
        {
            Ok(token) => token,
            Err(StoreError::Conflict { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.raise_highest(resource, token);
        grant.since_ns = nanos_since_epoch(wall);
        grant.token = token;
        Ok(Some(Grant {
            info: info_of(resource, uid, &grant),
            resource: resource.clone(),
            uid: uid.clone(),
            sent,
            deadline,
            give_back: None,
        }))
    }
}
