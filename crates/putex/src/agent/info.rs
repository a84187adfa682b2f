//! `--info CMD`: runs the command and keeps the small JSON object it
//! prints (for PostgreSQL: role, timeline, LSNs, replication state) for
//! the member record, checked as [`crate::report::info`] says. Operators'
//! eyes only: nothing putex decides reads it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::state::AgentHost;
use crate::report::info::parse;
use crate::supervision::hooks::HookKind;

/// Runs `--info` every 3 R (the member record's cadence), each run given up
/// to R (at least a second), and keeps what it printed for the member
/// record; a failed run or bad output clears it (and is logged once until
/// a run succeeds again).
pub(super) async fn info_feed(host: AgentHost) {
    let Some(cmd) = host.inner.settings.operator.info.clone() else {
        return;
    };
    let renew = host.inner.settings.timing.renew();
    let every = renew * 3;
    let timeout = renew.max(Duration::from_secs(1));
    let mut warned = false;
    loop {
        let info = match run_info(&cmd, &host, timeout).await {
            Ok(info) => {
                warned = false;
                info
            }
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, "--info failed; the member record shows no info");
                    warned = true;
                }
                BTreeMap::new()
            }
        };
        let changed = host.set(|st| std::mem::replace(&mut st.info, info.clone()) != info);
        if changed {
            host.inner.member_dirty.notify_one();
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs `--info` once, with the hooks' environment.
async fn run_info(
    cmd: &str,
    host: &AgentHost,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, String> {
    let mut command = tokio::process::Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(cmd)
        .arg("putex-hook")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in host.env(None).vars(HookKind::Info) {
        command.env(k, v);
    }
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("{cmd:?} took longer than {timeout:?}"))?
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} exited with {}", out.status));
    }
    parse(&out.stdout).map_err(|why| format!("{cmd:?}: {why}"))
}
