//! Grant records whose lock has ended.
//!
//! A grant record (`grant.<resource>.<uid>`) is removed when its client
//! releases the lock or an administrator ends it. A client that lets its
//! lifetime run out — RDLM's contract allows it, and a client that crashed
//! does it — releases nothing, so its grant record would stay in the store
//! for good: one record per such grant, without end. `putex serve` runs
//! [`Gateway::forget_ended_grants`] every [`TIDY_EVERY`]; several gateways
//! on one store may all run it (every removal is a compare-and-swap).
//!
//! A grant record is written only while the lock record names its uid as
//! the holder, and a uid is never used for another request: once the lock
//! record names another holder, is released, revoked, absent or past its
//! lifetime, the grant can never be read again (every reader asks the lock
//! record first) and is removed.

use super::*;

/// How often `putex serve` removes the grant records of ended locks.
pub const TIDY_EVERY: Duration = Duration::from_secs(60);

impl Gateway {
    /// Removes the grant records of locks that have ended (taken over,
    /// released, revoked or past their lifetime) and returns how many.
    /// A record that cannot be read as a grant key is left alone.
    pub async fn forget_ended_grants(&self) -> Result<usize, StoreError> {
        let grants = self.read_prefix(keys::GRANT_PREFIX).await?;
        if grants.is_empty() {
            return Ok(0);
        }
        let t = self.timeout();
        let now = self.store_now().await?;
        // The live holder of each resource that has grant records.
        let mut holders: HashMap<String, Option<String>> = HashMap::new();
        let mut forgotten = 0;
        for (key, grant) in grants {
            let Some((resource, uid)) = key[keys::GRANT_PREFIX.len()..].split_once('.') else {
                continue;
            };
            let Ok(resource) = Name::new(resource) else {
                continue;
            };
            let holder = match holders.get(resource.as_str()) {
                Some(holder) => holder.clone(),
                None => {
                    let holder = self
                        .store
                        .get(&keys::lock(&resource), ReadMode::Leader, t)
                        .await?
                        .and_then(|entry| {
                            holder_of(&entry)
                                .filter(|rec| !expired(&entry, rec, now))
                                .map(|rec| rec.instance)
                        });
                    holders.insert(resource.to_string(), holder.clone());
                    holder
                }
            };
            if holder.as_deref() == Some(uid) {
                continue;
            }
            if self.store.retire(&key, grant.token, t).await.is_ok() {
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }
}
