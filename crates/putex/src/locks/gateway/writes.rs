//! Guarded writes for an HTTP client's lock (`docs/http.md`, "Guarded
//! writes"): the gateway makes them for the client that holds a grant, and
//! the store applies them only while the lock record is still that grant's.
//!
//! After a grant (or a renewal) the gateway writes nothing more to the lock
//! record, so the grant's record is the record at the grant's revision: a
//! write guarded by that revision lands only if no takeover, release,
//! revocation or renewal came between — the store decides, in one step of
//! its own. A renewal that races the write makes the store refuse it; the
//! gateway reads the record again and, if it is still the grant's, makes
//! the write again against the renewed revision.

use super::*;
use crate::locks::guard::{self, GuardError};
use crate::store::Write;

/// How often a write is made again after the grant's record moved under it
/// (a renewal of the same grant): more means renewals in a tight loop.
const RETRIES: usize = 3;

impl Gateway {
    /// Makes `writes` (the caller's keys, under [`keys::KV_PREFIX`]) if the
    /// lock `uid` on `resource` is a grant this service made, still held
    /// (its lifetime not passed) when the store commits them.
    pub async fn guarded(
        &self,
        resource: &Name,
        uid: &Name,
        writes: &[Write],
    ) -> Result<Token, GuardError> {
        let writes = guard::kv_writes(writes)?;
        let key = keys::lock(resource);
        for _ in 0..=RETRIES {
            let held = self
                .held(resource, uid)
                .await
                .map_err(GuardError::Unavailable)?;
            let Some((entry, _, _)) = held.filter(|(_, rec, _)| is_http_grant(rec)) else {
                return Err(GuardError::NotHeld);
            };
            match self
                .store
                .guarded(&key, entry.token, &writes, self.timeout())
                .await
            {
                Ok(token) => return Ok(token),
                Err(StoreError::Conflict { .. }) => continue,
                Err(e @ StoreError::Unknown { .. }) => return Err(GuardError::Unknown(e)),
                Err(e @ StoreError::Config { .. }) => return Err(GuardError::Invalid(e)),
            }
        }
        // Held by every read, refused by the store every time: said, as
        // `putex lock` says it (locks/section/kv.rs).
        tracing::warn!(
            resource = %resource,
            uid = %uid,
            "guarded write refused: the lock record moved on (another holder, a release or a revocation)"
        );
        Err(GuardError::NotHeld)
    }
}
