//! What the gateway reads: a lock as its client sees it, the locks and
//! waiters of a resource, the resources, the store's clock.

use super::*;

/// How many times a listing reads a lock record that keeps changing
/// around the look at its holder's ticket before it shows the last one.
const LISTING_LOOKS: u32 = 3;

impl Gateway {
    pub(super) async fn read_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        crate::store::read_prefix(&self.store, prefix, self.timeout()).await
    }

    /// The store's current time, by a probe write.
    pub(super) async fn store_now(&self) -> Result<StoreTime, StoreError> {
        let t = self.timeout();
        let key = keys::probe(&self.opts.node);
        self.store
            .put(&key, br#"{"v":1,"node":"gateway","write":"now"}"#, t)
            .await?;
        match self.store.get(&key, ReadMode::Leader, t).await? {
            Some(e) => Ok(e.time),
            None => Err(StoreError::unknown(
                crate::store::Op::Get,
                &key,
                "probe vanished",
            )),
        }
    }

    /// A store time as UTC: NATS times are the stream leader's clock; the
    /// embedded stores' are this boot's clock.
    pub(super) async fn wall(&self, t: StoreTime) -> SystemTime {
        match &self.store {
            AnyStore::Nats(_) => SystemTime::UNIX_EPOCH + Duration::from_nanos(t.nanos),
            // etcd's store time is a stopwatch on its leader: how long ago
            // is that stopwatch's own reading.
            AnyStore::Etcd(etcd) => SystemTime::now() - etcd.age(t).await.unwrap_or_default(),
            _ => {
                let now = clock::boot_time_now().as_nanos();
                SystemTime::now() - Duration::from_nanos(now.saturating_sub(t.nanos))
            }
        }
    }

    /// The lock record of `resource` if `uid` holds it and its advertised
    /// lease (`lifetime + D`) has not passed, with its entry and what is
    /// left of the lease.
    pub(super) async fn held(
        &self,
        resource: &Name,
        uid: &Name,
    ) -> Result<Option<(Entry, LockRecord, Duration)>, StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource);
        let Some(entry) = self.store.get(&key, ReadMode::Leader, t).await? else {
            return Ok(None);
        };
        let Some(rec) = holder_of(&entry).filter(|r| r.instance == uid.as_str()) else {
            return Ok(None);
        };
        let now = self.store_now().await?;
        Ok(lease_left(&entry, &rec, now).map(|left| (entry, rec, left)))
    }

    /// The lock `uid` on `resource`, if it is granted or waiting and not
    /// expired, released or revoked.
    pub async fn get(&self, resource: &Name, uid: &Name) -> Result<Option<LockInfo>, StoreError> {
        let t = self.timeout();
        if let Some((entry, rec, left)) = self.held(resource, uid).await? {
            return Ok(Some(
                self.granted_info(resource, uid, &entry, &rec, left).await?,
            ));
        }
        let ticket = self
            .store
            .get(&keys::ticket(resource, uid), ReadMode::Any, t)
            .await?
            .and_then(|e| TicketRecord::from_entry(&e));
        let Some(ticket) = ticket else {
            return Ok(None);
        };
        if ticket.arrival < self.cancelled_up_to(resource).await? {
            return Ok(None);
        }
        Ok(Some(waiting_info(resource, &ticket)))
    }

    /// The revision of the newest admin cancel of `resource`'s waiters
    /// (0 if none): a ticket that arrived before it is cancelled, also
    /// while its waiter has not yet left the line.
    pub(super) async fn cancelled_up_to(&self, resource: &Name) -> Result<u64, StoreError> {
        Ok(self
            .store
            .get(&keys::cancel(resource), ReadMode::Leader, self.timeout())
            .await?
            .map_or(0, |e| e.token.revision))
    }

    /// A held lock's description: its grant record's, with the token and
    /// the time of the lock record's last write (the grant or renewal).
    pub(super) async fn granted_info(
        &self,
        resource: &Name,
        uid: &str,
        entry: &Entry,
        rec: &LockRecord,
        left: Duration,
    ) -> Result<LockInfo, StoreError> {
        // A holder whose instance id is no name is no gateway lock: it has
        // no grant record (and must not fail the listing it is in).
        let grant = match Name::new(uid) {
            Ok(uid) => self
                .store
                .get(&keys::grant(resource, &uid), ReadMode::Any, self.timeout())
                .await?
                .and_then(|e| serde_json::from_slice::<GrantRecord>(&e.value).ok()),
            Err(_) => None,
        };
        let mut info = match grant {
            Some(mut g) if is_http_grant(rec) => {
                g.token = entry.token;
                g.since_ns = nanos_since_epoch(self.wall(entry.time).await);
                info_of(resource, uid, &g)
            }
            // Held by another kind of holder (`putex lock`, an agent), or a
            // gateway still acquiring it.
            _ => LockInfo {
                resource: resource.to_string(),
                uid: uid.to_owned(),
                title: format!("held by {} (putex)", rec.node),
                wait: Duration::ZERO,
                lifetime: rec.lease(),
                active: true,
                active_since: None,
                active_expires: None,
                token: None,
                lifetime_left: None,
            },
        };
        info.lifetime_left = Some(left);
        Ok(info)
    }

    /// The granted and waiting locks of `resource`.
    pub async fn locks(&self, resource: &Name) -> Result<Vec<LockInfo>, StoreError> {
        let t = self.timeout();
        let key = keys::lock(resource);
        let entry = self.store.get(&key, ReadMode::Leader, t).await?;
        let cancelled = self.cancelled_up_to(resource).await?;
        let mut out = Vec::new();
        if let Some((entry, rec)) = self.listed_holder(resource, entry, cancelled).await? {
            if let Some(left) = lease_left(&entry, &rec, self.store_now().await?) {
                let uid = rec.instance.clone();
                out.push(
                    self.granted_info(resource, &uid, &entry, &rec, left)
                        .await?,
                );
            }
        }
        let mut waiting: Vec<TicketRecord> = self
            .read_prefix(&keys::queue_of(resource))
            .await?
            .into_iter()
            .filter_map(|(_, e)| TicketRecord::from_entry(&e))
            .filter(|r| r.lifetime_ms.is_some() && r.arrival > cancelled)
            .collect();
        waiting.sort_by_key(|r| r.arrival);
        out.extend(waiting.iter().map(|r| waiting_info(resource, r)));
        Ok(out)
    }

    /// `resource`'s holder as a listing shows it, from `entry` (the lock
    /// record as read) and `cancelled` (the newest admin cancel's
    /// revision): `None` when nothing holds it, or when an HTTP request
    /// that an admin delete cancelled does — it took the lock as the
    /// delete freed it and gives it back without a grant (`acquire`).
    /// Only a holding written after a cancel, by a holder that is no HTTP
    /// grant, can be such a request's: its ticket says. A ticket gone
    /// may mean that the request gave the lock back and left the line
    /// since (it leaves only after its agent stopped), so the record is
    /// read again, up to [`LISTING_LOOKS`] times; unchanged, it is a
    /// `putex lock` or agent holder.
    async fn listed_holder(
        &self,
        resource: &Name,
        mut entry: Option<Entry>,
        cancelled: u64,
    ) -> Result<Option<(Entry, LockRecord)>, StoreError> {
        let (t, key) = (self.timeout(), keys::lock(resource));
        let mut looks = 0;
        loop {
            let Some((e, rec)) = entry.and_then(|e| holder_of(&e).map(|r| (e, r))) else {
                return Ok(None);
            };
            // No admin cancel yet, or a holding older than it: no
            // cancelled request's.
            if is_http_grant(&rec) || cancelled == 0 || e.token.revision < cancelled {
                return Ok(Some((e, rec)));
            }
            match self.http_ticket(resource, &rec).await? {
                Some(ticket) if ticket.arrival < cancelled => return Ok(None),
                Some(_) => return Ok(Some((e, rec))),
                None => {}
            }
            looks += 1;
            let again = self.store.get(&key, ReadMode::Leader, t).await?;
            if looks == LISTING_LOOKS || again.as_ref().is_some_and(|a| a.token == e.token) {
                return Ok(Some((e, rec)));
            }
            entry = again;
        }
    }

    /// The ticket of the HTTP request whose agent wrote `rec`, if it is
    /// one and is still in line.
    async fn http_ticket(
        &self,
        resource: &Name,
        rec: &LockRecord,
    ) -> Result<Option<TicketRecord>, StoreError> {
        let Ok(uid) = Name::new(&rec.instance) else {
            return Ok(None);
        };
        Ok(self
            .store
            .get(&keys::ticket(resource, &uid), ReadMode::Any, self.timeout())
            .await?
            .and_then(|e| TicketRecord::from_entry(&e))
            .filter(|t| t.lifetime_ms.is_some()))
    }

    /// The resources that have a granted or waiting lock.
    pub async fn resources(&self) -> Result<Vec<Name>, StoreError> {
        let now = self.store_now().await?;
        let mut names = std::collections::BTreeSet::new();
        for (key, entry) in self.read_prefix(keys::LOCK_PREFIX).await? {
            if let Some(rec) = holder_of(&entry) {
                if !expired(&entry, &rec, now) {
                    if let Ok(name) = Name::new(&key[keys::LOCK_PREFIX.len()..]) {
                        names.insert(name);
                    }
                }
            }
        }
        let mut cancelled = HashMap::new();
        for (key, entry) in self.read_prefix(keys::QUEUE_PREFIX).await? {
            let Some(ticket) = TicketRecord::from_entry(&entry) else {
                continue;
            };
            let Some(name) = key[keys::QUEUE_PREFIX.len()..]
                .split_once('.')
                .and_then(|(name, _)| Name::new(name).ok())
            else {
                continue;
            };
            if ticket.lifetime_ms.is_none() || names.contains(&name) {
                continue;
            }
            let up_to = match cancelled.get(&name) {
                Some(r) => *r,
                None => {
                    let r = self.cancelled_up_to(&name).await?;
                    cancelled.insert(name.clone(), r);
                    r
                }
            };
            if ticket.arrival > up_to {
                names.insert(name);
            }
        }
        Ok(names.into_iter().collect())
    }
}
