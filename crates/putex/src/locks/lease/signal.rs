//! The end of one tenure as a value any number of tasks can hold.

use std::fmt;

use putex_core::Token;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::host::View;
use super::Lost;
use crate::clock;
use crate::store::Name;

/// The end of one tenure, as a value: clone it into every task that must
/// stop when the lease is lost, and await [`LossSignal::lost`] there (or
/// hand out [`LossSignal::cancellation`]). Unlike [`Lease::lost`](super::Lease::lost) it needs
/// no exclusive borrow, and it stays tied to its tenure: a [`Lock`](super::Lock) taken
/// again later does not revive it.
#[derive(Clone)]
pub struct LossSignal {
    pub(super) name: Name,
    pub(super) token: Token,
    pub(super) view: watch::Receiver<View>,
}

impl LossSignal {
    /// The tenure's fencing token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Whether the tenure has ended (by the agent's word, or by the clock:
    /// its licence end has passed).
    pub fn is_lost(&self) -> bool {
        let v = self.view.borrow();
        v.held != Some(self.token)
            || v.licence_end
                .is_none_or(|end| clock::boot_time_now() >= end)
    }

    /// Completes when the tenure has ended — at once if it has — with how
    /// it ended; from then on stop acting on the protected resource.
    pub async fn lost(&self) -> Lost {
        let mut view = self.view.clone();
        loop {
            let end = {
                let v = view.borrow_and_update();
                if v.held != Some(self.token) {
                    return v.how_ended(self.token);
                }
                v.licence_end
            };
            // The licence end by the clock, whether or not the agent has
            // had a chance to notice it yet.
            let Some(end) = end.filter(|e| clock::boot_time_now() < *e) else {
                return Lost::LicenceEnded;
            };
            tokio::select! {
                changed = view.changed() => {
                    if changed.is_err() {
                        return Lost::LicenceEnded;
                    }
                }
                () = tokio::time::sleep(clock::until(end)) => {}
            }
        }
    }

    /// A [`CancellationToken`] cancelled when the tenure ends (by a task
    /// that awaits [`LossSignal::lost`]; needs a Tokio runtime). Its child
    /// tokens, select arms and `run_until_cancelled` then stop work the
    /// usual tokio-util way.
    pub fn cancellation(&self) -> CancellationToken {
        let token = CancellationToken::new();
        let signal = self.clone();
        let cancel = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = signal.lost() => cancel.cancel(),
                () = cancel.cancelled() => {}
            }
        });
        token
    }
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("name", &self.name.as_str())
            .field("token", &self.token.to_string())
            .field("lost", &self.is_lost())
            .finish()
    }
}
