//! The hooks' guarded writes (`putex kv` inside a hook of `putex run`,
//! `docs/locks.md`, "Guarded writes"): the agent answers on a socket beside
//! its keeper's (`PUTEX_KV_SOCKET` in every hook's environment, the
//! deactivate hook's too) and makes each `put` or `delete` as a guarded
//! write of its tenure, while it is active or stepping down. The store
//! refuses the write once the lock record has moved on.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use putex_core::{Role, Token};

use super::state::AgentHost;
use crate::locks::guard::{Guard, Tenure};
use crate::locks::section::kv::KvHolder;
use crate::store::{keys, AnyStore};

/// The agent as a [`KvHolder`].
pub(super) struct AgentKv(pub(super) AgentHost);

impl KvHolder for AgentKv {
    fn store(&self) -> &AnyStore {
        &self.0.inner.store
    }

    fn guard(&self) -> Option<Guard> {
        let tenure = self.0.set(|st| {
            matches!(st.role, Some(Role::Active | Role::SteppingDown))
                .then_some(st.token)
                .flatten()
        })?;
        Some(Guard::of(
            self.0.inner.store.clone(),
            keys::lock(&self.0.inner.lock),
            tenure,
            Arc::new(AgentTenure(self.0.clone())),
            &self.0.inner.settings.timing,
        ))
    }
}

/// The agent's view of its tenure, for a [`Guard`].
struct AgentTenure(AgentHost);

impl Tenure for AgentTenure {
    fn newest(&self, tenure: Token) -> Option<Token> {
        self.0.set(|st| {
            let holding = matches!(st.role, Some(Role::Active | Role::SteppingDown))
                && st.token == Some(tenure);
            match st.record {
                Some((token, true))
                    if holding && token.epoch == tenure.epoch && token >= tenure =>
                {
                    Some(token)
                }
                _ => None,
            }
        })
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        // The agent's renewals land every R: look again shortly.
        tokio::time::sleep(Duration::from_millis(20)).boxed()
    }
}
