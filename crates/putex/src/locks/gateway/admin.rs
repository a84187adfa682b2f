//! Administrative calls that end a holder: revoke (S7), force (frees an
//! HTTP grant at once) and RDLM's delete (cancels the waiters first).

use super::*;

impl Gateway {
    /// Admin: revokes `resource`'s holder, whatever it is (S7): its record
    /// becomes `revoked`, keeping its identity and advertised timing. A
    /// `putex lock` or agent holder sees it and stops at once; takers wait
    /// W + G' of what the record advertises (for an HTTP grant, whose
    /// client cannot be told: `lifetime + D`). Waiting requests keep their
    /// place. `None` when nothing holds it.
    pub async fn revoke(&self, resource: &Name) -> Result<Option<Ended>, StoreError> {
        self.end_holder(resource, Admin::Revoke).await
    }

    /// Admin: frees `resource` at once if an HTTP grant holds it: its
    /// record becomes `released`, so the next acquirer starts at once
    /// (S3), with a higher fencing token. The HTTP client is not told: its
    /// fencing token is what protects the resource from it. A `putex lock`
    /// or agent holder, which may still be running, is left alone
    /// ([`AdminAction::Refused`]: revoke it). Waiting requests keep their
    /// place. `None` when nothing holds it.
    pub async fn force(&self, resource: &Name) -> Result<Option<Ended>, StoreError> {
        self.end_holder(resource, Admin::Force).await
    }

    /// Admin, RDLM's delete of every lock on `resource`: waiting requests
    /// end with [`AcquireError::Cancelled`], then an HTTP grant is freed at
    /// once ([`Gateway::force`]) and any other holder is revoked
    /// ([`Gateway::revoke`]). `false` when it had neither.
    pub async fn delete(&self, resource: &Name) -> Result<bool, StoreError> {
        let mut had = false;
        // Cancel first: a waiter must not take a freed lock that the same
        // delete is about to cancel its request for.
        let waiting = self.read_prefix(&keys::queue_of(resource)).await?;
        if !waiting.is_empty() {
            let marker = br#"{"v":1,"cancelled":"admin"}"#;
            self.store
                .put(&keys::cancel(resource), marker, self.timeout())
                .await?;
            had = true;
        }
        Ok(self.end_holder(resource, Admin::Delete).await?.is_some() || had)
    }

    /// [`Gateway::delete`] on every resource.
    pub async fn delete_all(&self) -> Result<(), StoreError> {
        for r in self.resources().await? {
            self.delete(&r).await?;
        }
        Ok(())
    }

    /// Ends `resource`'s live holder as `how` says: a compare-and-swap on
    /// the revision it judged, so a holder that changed meanwhile (a
    /// renewal, a takeover) is judged again.
    async fn end_holder(&self, resource: &Name, how: Admin) -> Result<Option<Ended>, StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource);
        for _ in 0..5 {
            let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
                return Ok(None);
            };
            let Some(rec) = holder_of(&entry) else {
                return Ok(None);
            };
            if expired(&entry, &rec, self.store_now().await?) {
                return Ok(None);
            }
            let http = is_http_grant(&rec);
            let (action, state, write) = match (how, http) {
                (Admin::Force | Admin::Delete, true) => {
                    (AdminAction::Freed, LockState::Released, "forced")
                }
                (Admin::Force, false) => {
                    return Ok(Some(Ended::of(AdminAction::Refused, &rec, entry.token)))
                }
                (Admin::Revoke | Admin::Delete, _) => {
                    (AdminAction::Revoked, LockState::Revoked, "revoked")
                }
            };
            // S7 (and a freed grant too): keep the holder's identity and
            // advertised timing; a revoke keeps a failsafe set too (F2),
            // a release drops it.
            let ended = Ended::of(action, &rec, entry.token);
            let failsafe = match state {
                LockState::Released => None,
                _ => rec.failsafe.clone(),
            };
            let written = LockRecord {
                state,
                write: format!("{}-{write}", crate::identity::instance_id()),
                failsafe,
                ..rec
            };
            match self
                .store
                .update(&key, &written.encode(), entry.token, t)
                .await
            {
                Ok(token) => {
                    self.raise_highest(resource, token);
                    tracing::warn!(%resource, holder = %ended.node, instance = %ended.instance,
                        token = %ended.token, action = ?ended.action, "admin: the lock's holder was ended");
                    // A freed HTTP grant's uid is a name; its grant record goes too.
                    if let (AdminAction::Freed, Ok(uid)) = (action, Name::new(&*ended.instance)) {
                        self.forget_grant(resource, &uid).await;
                    }
                    return Ok(Some(ended));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::conflict(crate::store::Op::Update, &key))
    }
}

/// Which administrative call ends a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admin {
    /// [`Gateway::revoke`].
    Revoke,
    /// [`Gateway::force`].
    Force,
    /// [`Gateway::delete`] (RDLM's): force an HTTP grant, revoke the rest.
    Delete,
}

/// What an administrative call did to a resource's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAction {
    /// An HTTP grant, freed at once: its record is `released` (S3).
    Freed,
    /// Revoked (S7): its record is `revoked`; takers wait W + G'.
    Revoked,
    /// Not done: `force` on a `putex lock` or agent holder, which watches
    /// its record and may still be running (revoke it instead).
    Refused,
}

/// The holder an administrative call ended (or refused to end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// What the call did to the holder: freed, revoked, or refused.
    pub action: AdminAction,
    /// The holder's node id (the gateway's `--node` for an HTTP grant).
    pub node: String,
    /// Its instance id (an HTTP lock's uid).
    pub instance: String,
    /// Its fencing token: from now on the protected resource should refuse
    /// it (every later holder's token is higher).
    pub token: Token,
}

impl Ended {
    fn of(action: AdminAction, rec: &LockRecord, token: Token) -> Ended {
        Ended {
            action,
            node: rec.node.clone(),
            instance: rec.instance.clone(),
            token,
        }
    }
}
