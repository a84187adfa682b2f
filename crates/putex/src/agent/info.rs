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
    let vars = host.env(None).vars(HookKind::Info);
    let out = super::member::command_stdout(cmd, &vars, timeout).await?;
    parse(&out).map_err(|why| format!("{cmd:?}: {why}"))
}
