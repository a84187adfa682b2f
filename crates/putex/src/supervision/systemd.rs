//! systemd integration for `Type=notify` units: `READY=1`, `STATUS=`,
//! `WATCHDOG=1` and `STOPPING=1` on `$NOTIFY_SOCKET`.
//!
//! The agent says `READY=1` once the store answered and its state machine
//! made its first decision (it left `starting`), `STATUS=<role>` on every
//! transition, and `STOPPING=1` when asked to stop. With `WatchdogSec=` set
//! ( `$WATCHDOG_USEC`), it pings `WATCHDOG=1` twice per interval — but only
//! while the state machine keeps going round its loop
//! ([`crate::observe::metrics::Metrics::since_progress`]): a wedged agent stops
//! pinging and systemd restarts it (its keeper, outside the agent, keeps the
//! licence deadline meanwhile).
//!
//! Without `$NOTIFY_SOCKET` every call is a no-op.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends one notification (`READY=1`, `STATUS=…`); errors are logged at
/// debug level and otherwise ignored, as sd_notify(3) does.
pub fn notify(state: &str) {
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET").filter(|p| !p.is_empty()) {
        notify_to(&path, state);
    }
}

/// Sends `state` to the notify socket at `path` (`@name`: abstract).
pub fn notify_to(path: &std::ffi::OsStr, state: &str) {
    let result = UnixDatagram::unbound().and_then(|sock| {
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        } else {
            sock.send_to(state.as_bytes(), path)
        }
    });
    if let Err(e) = result {
        tracing::debug!(error = %e, state, "sd_notify failed");
    }
}

/// The watchdog interval systemd asked for (`$WATCHDOG_USEC`, for this
/// process if `$WATCHDOG_PID` names one).
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Pings the watchdog every half interval while `progressing` says the
/// state machine is alive; runs until dropped.
pub async fn watchdog(interval: Duration, progressing: impl Fn() -> bool) {
    let mut tick = tokio::time::interval(interval / 2);
    loop {
        tick.tick().await;
        if progressing() {
            notify("WATCHDOG=1");
        } else {
            tracing::error!("the state machine made no progress: not pinging the watchdog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifies_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        notify_to(path.as_os_str(), "READY=1");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
