//! Shutdown: the first signal asks for a graceful stop, a second one aborts.
//!
//! One [`Shutdown`] is made per command. Long-running parts take it (or one
//! of its tokens) and watch [`Shutdown::graceful`]: stop taking new work,
//! finish or hand over what runs (the agent releases its lock, `putex serve`
//! ends its long polls). [`Shutdown::aborted`] means the operator does not
//! want to wait: stop now, as safely as an emergency stop allows.
//!
//! [`Shutdown::on_signals`] connects both to SIGTERM and SIGINT; tests and
//! programs that embed putex cancel the tokens themselves.

use std::io;

use tokio_util::sync::CancellationToken;

/// The two stages of a shutdown, as cancellation tokens.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    graceful: CancellationToken,
    abort: CancellationToken,
}

impl Shutdown {
    /// A shutdown nobody has asked for yet.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Asks for a graceful stop.
    pub fn request(&self) {
        self.graceful.cancel();
    }

    /// Asks to stop at once (this also counts as a graceful request).
    pub fn abort(&self) {
        self.graceful.cancel();
        self.abort.cancel();
    }

    /// Cancelled when a graceful stop was asked for.
    pub fn graceful(&self) -> &CancellationToken {
        &self.graceful
    }

    /// Cancelled when the operator asked to stop at once.
    pub fn aborted(&self) -> &CancellationToken {
        &self.abort
    }

    /// Whether an abort was asked for.
    pub fn is_aborted(&self) -> bool {
        self.abort.is_cancelled()
    }

    /// Connects SIGTERM and SIGINT: the first one asks for a graceful stop,
    /// the next one aborts. The handlers are installed before this returns,
    /// so no signal after it is missed.
    pub fn on_signals(&self) -> io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        tokio::spawn(async move {
            let mut next = async || {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            };
            next().await;
            this.request();
            next().await;
            this.abort();
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abort_is_also_a_graceful_request() {
        let s = Shutdown::new();
        assert!(!s.graceful().is_cancelled());
        s.request();
        assert!(s.graceful().is_cancelled() && !s.is_aborted());
        let s = Shutdown::new();
        s.abort();
        assert!(s.graceful().is_cancelled() && s.is_aborted());
    }
}
