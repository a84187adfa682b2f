//! The host side of a [`super::Lock`]'s agent: no hooks, no keeper; the
//! program is the service, so activation and loss are news in a
//! [`View`] that the lock, its guards and its loss signals read.

use futures::future::{self, BoxFuture, FutureExt};
use putex_core::{
    Event, HealthMode, Input, Instant, KeeperCommand, LockRecord, LockState, Reason, Role,
    StopKind, Token,
};
use tokio::sync::watch;

use super::Lost;
use crate::clock;
use crate::driver::{self, Host};
use crate::locks::guard::Tenure;
use crate::observe::metrics::Metrics;

/// What the driver has told us about the agent.
#[derive(Clone, Debug)]
pub(in crate::locks) struct View {
    pub(in crate::locks) role: Role,
    /// The fencing token of the current tenure, once active.
    pub(in crate::locks) held: Option<Token>,
    /// When the licence ends (boot time), as the agent last told its
    /// "keeper". Checked against the clock at each call, so a view the
    /// driver task had no chance to update (a busy runtime) never claims a
    /// lock past its licence (H1).
    pub(in crate::locks) licence_end: Option<Instant>,
    /// How the last tenure ended, and its token.
    pub(in crate::locks) ended: Option<(Token, Lost)>,
    /// Transitions into standby so far, and the reason of the last one.
    pub(in crate::locks) standbys: u64,
    pub(in crate::locks) last_standby: Option<Reason>,
    /// The lock record this agent wrote last, and whether it says the
    /// lock is held (confirming or active): what guarded writes compare
    /// against.
    pub(in crate::locks) record: Option<(Token, bool)>,
}

impl View {
    /// How the tenure of `token` ended, once it has: still held by the
    /// agent's word, it ended by the clock; otherwise as recorded when it
    /// ended, or (the lock taken again since, its record overwritten)
    /// released.
    pub(in crate::locks) fn how_ended(&self, token: Token) -> Lost {
        match &self.ended {
            _ if self.held == Some(token) => Lost::LicenceEnded,
            Some((t, how)) if *t == token => how.clone(),
            _ => Lost::Released,
        }
    }
}

/// The host side of a lock: no hooks, no keeper; activation and loss are
/// notifications.
pub(super) struct LockHost {
    pub(super) view: watch::Sender<View>,
    /// Into the agent: `Turn(false)` on activation, so that a lost lock is
    /// never taken again behind the program's back.
    pub(super) inputs: driver::InputSender,
    pub(super) metrics: Option<Metrics>,
}

impl Host for LockHost {
    fn health_check(&self, _mode: HealthMode, _deadline: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn fence(&self, _: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        future::ready(true).boxed()
    }

    fn activate(&self, token: Token, _: Option<String>, _: Instant) -> BoxFuture<'static, bool> {
        self.view.send_modify(|v| v.held = Some(token));
        future::ready(true).boxed()
    }

    fn stop(&self, _kind: StopKind, _deadline: Instant) -> BoxFuture<'static, bool> {
        // The program is the service: its loss was announced by the
        // transition before this stop; a graceful stop is its own release.
        future::ready(true).boxed()
    }

    fn keeper(&self, command: KeeperCommand) -> BoxFuture<'static, bool> {
        // No keeper process: the program is the service. Its deadline is
        // the licence end, which `token()` compares with the clock.
        self.view.send_modify(|v| {
            v.licence_end = match command {
                KeeperCommand::Arm(d) | KeeperCommand::Extend(d) => Some(d),
                KeeperCommand::Disarm => None,
            }
        });
        future::ready(true).boxed()
    }

    fn persist_highest(&self, _token: Token) {}

    fn event(&self, event: &Event) {
        if let Event::AbsentWait { wait, why } = event {
            // Never in silence (S4): `putex id` and library users see it.
            tracing::warn!(
                "taken; waiting {:.1} s before it is held: {}",
                wait.as_secs_f64(),
                why.explain()
            );
        }
        let Event::Transition {
            from,
            to,
            reason,
            token,
        } = event
        else {
            return;
        };
        tracing::debug!(%from, %to, ?reason, "lease transition");
        if let Some(metrics) = &self.metrics {
            metrics.transition(*to, token.map(|t| t.revision));
        }
        if *to == Role::Active {
            // The driver reads host inputs first: this reaches the agent
            // before anything that follows the activation.
            let _ = self.inputs.unbounded_send(Input::Turn(false));
        }
        self.view.send_modify(|v| {
            v.role = *to;
            let ended = v
                .held
                .take_if(|_| matches!(from, Role::Active | Role::SteppingDown));
            if let Some(token) = ended {
                v.ended = Some((
                    token,
                    match reason {
                        Reason::LicenceEnded => Lost::LicenceEnded,
                        Reason::Released | Reason::Shutdown | Reason::ReleaseRequested => {
                            Lost::Released
                        }
                        Reason::Lost(cause) => Lost::TakenOver(cause.clone()),
                        other => Lost::Ended(other.clone()),
                    },
                ));
            }
            if *to == Role::Standby {
                v.standbys += 1;
                v.last_standby = Some(reason.clone());
            }
        });
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    fn lock_written(&self, token: Token, value: &[u8]) {
        let held = serde_json::from_slice::<LockRecord>(value)
            .is_ok_and(|r| matches!(r.state, LockState::Confirming | LockState::Active));
        self.view.send_modify(|v| {
            if v.record.is_none_or(|(t, _)| t < token) {
                v.record = Some((token, held));
            }
        });
    }
}

/// A [`super::Lock`]'s view as a guard's [`Tenure`].
pub(super) struct LeaseTenure(pub(super) watch::Receiver<View>);

impl Tenure for LeaseTenure {
    fn newest(&self, tenure: Token) -> Option<Token> {
        let v = self.0.borrow();
        let live = v
            .licence_end
            .is_some_and(|end| clock::boot_time_now() < end);
        match v.record {
            Some((token, true))
                if live
                    && v.held == Some(tenure)
                    && token.epoch == tenure.epoch
                    && token.revision >= tenure.revision =>
            {
                Some(token)
            }
            _ => None,
        }
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        let mut view = self.0.clone();
        async move {
            // A change, or a short while: a change between the caller's
            // look and this clone is seen at the next look.
            let _ = tokio::time::timeout(crate::locks::guard::LOOK_AGAIN, view.changed()).await;
        }
        .boxed()
    }
}
