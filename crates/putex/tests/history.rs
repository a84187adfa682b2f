//! `putex history`, `putex watch`, `putex completions` and `putex man` end
//! to end: transition records written by real agents (a crash failover on
//! a real nats-server, fast timing) and by `putex lock`, read back by the
//! built binary; the live view followed through a pipe; completions and
//! man pages generated from the CLI definition.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::common::agent::{
    dump, fast, hooks, putex, putex_json, start, starts, timing_slot, wait_for, Agent,
};
use crate::common::etcd_server::EtcdServer;
use crate::common::nats_server::NatsServer;

/// `putex history LOCK -o json` against `url`.
fn history_json(url: &str, lock: &str) -> Value {
    putex_json(&["history", lock, "--store", url])
}

fn activations(h: &Value) -> Vec<Value> {
    h["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["activation"] == true)
        .cloned()
        .collect()
}

/// A `putex watch` child whose stdout (a pipe) is collected by a thread.
struct Watch {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Watch {
    fn start(url: &str, lock: &str) -> Watch {
        let mut child = putex()
            .args(["watch", lock, "--store", url])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().unwrap();
        let sink = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Watch { child, out }
    }

    fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Whether a frame's lock row (`LOCK HOLDER STATE …`) shows `holder`
    /// active.
    fn shows_holder(&self, lock: &str, holder: &str) -> bool {
        self.text().lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 3 && cols[0] == lock && cols[1] == holder && cols[2] == "active"
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn history_and_watch_follow_a_crash_failover() {
    let server = NatsServer::start();
    let _slot = timing_slot();
    follow_a_crash_failover(&server.url, true);
}

/// On etcd the takeover waits for the store clock too (whole seconds).
#[test]
fn history_and_watch_follow_a_crash_failover_on_etcd() {
    let server = EtcdServer::start();
    let _slot = timing_slot();
    follow_a_crash_failover(&format!("etcd://{}", server.endpoint()), false);
}

/// `dated_epoch`: the store's epoch is a creation time in nanoseconds
/// (NATS), above 2^53 — the reason tokens are strings in JSON.
fn follow_a_crash_failover(url: &str, dated_epoch: bool) {
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("events");
    let flags = hooks(&ev);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agents: Vec<Agent> = ["h1", "h2"]
        .iter()
        .map(|n| start(fast(dir.path(), url, "hist", n, &flags)))
        .collect();
    let ctx = |agents: &[Agent]| dump(&agents.iter().collect::<Vec<_>>(), &ev);
    assert!(
        wait_for(Duration::from_secs(10), || !starts(&ev).is_empty()),
        "nobody activated\n{}",
        ctx(&agents)
    );
    let first = starts(&ev)[0].node.clone();

    // The live view shows the first holder.
    let mut watch = Watch::start(url, "hist");
    assert!(
        wait_for(Duration::from_secs(10), || watch
            .shows_holder("hist", &first)),
        "watch did not show {first}:\n{}",
        watch.text()
    );

    // Host crash of the active: the other one takes over.
    let i = agents.iter().position(|a| a.node() == first).unwrap();
    agents[i].crash();
    assert!(
        wait_for(Duration::from_secs(10), || starts(&ev).len() >= 2),
        "no takeover\n{}",
        ctx(&agents)
    );
    let second = starts(&ev)[1].node.clone();
    assert_ne!(second, first);

    // The watch redraws with the new holder, and SIGTERM ends it with 0.
    assert!(
        wait_for(Duration::from_secs(10), || watch
            .shows_holder("hist", &second)),
        "watch did not show {second} after the failover:\n{}",
        watch.text()
    );
    assert!(
        watch.text().contains("LAST TRANSITIONS") && watch.text().contains("→ active"),
        "{}",
        watch.text()
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let mut status = None;
    assert!(wait_for(Duration::from_secs(5), || {
        status = watch.child.try_wait().unwrap();
        status.is_some()
    }));
    assert_eq!(status.unwrap().code(), Some(0), "{}", watch.text());

    // History: both activations, in order, with reasons and a gap.
    let mut acts = Vec::new();
    assert!(
        wait_for(Duration::from_secs(5), || {
            acts = activations(&history_json(url, "hist"));
            acts.len() >= 2
        }),
        "{:#}\n{}",
        history_json(url, "hist"),
        ctx(&agents)
    );
    let h = history_json(url, "hist");
    assert_eq!(acts.len(), 2, "{h:#}");
    assert_eq!(acts[0]["node"], first.as_str(), "{h:#}");
    assert_eq!(acts[1]["node"], second.as_str(), "{h:#}");
    assert!(acts[0]["revision"].as_u64() < acts[1]["revision"].as_u64());
    for a in &acts {
        assert_eq!(a["to"], "active", "{a:#}");
        assert_eq!(a["reason_code"], "activated", "{a:#}");
        assert!(!a["reason"].as_str().unwrap().is_empty(), "{a:#}");
        assert_eq!(a["source"], "run", "{a:#}");
        // Tokens as strings: a NATS epoch is above 2^53.
        let part = |k: &str| -> u64 { a["token"][k].as_str().unwrap().parse().unwrap() };
        assert!(part("revision") > 0, "{a:#}");
        assert!(part("epoch") > 0, "{a:#}");
        if dated_epoch {
            assert!(part("epoch") > 1 << 53, "{a:#}");
        }
    }
    assert_eq!(acts[1]["previous_holder"], first.as_str(), "{h:#}");
    assert_eq!(acts[1]["acquired"], "acquired-stale", "{h:#}");
    // The crashed holder left no record: the gap runs from its last
    // renewal, at least the lease T = 300 ms.
    assert_eq!(acts[1]["no_holder_basis"], "last-renewal", "{h:#}");
    let gap = acts[1]["no_holder_ms"].as_u64().unwrap();
    assert!((300..5_000).contains(&gap), "gap {gap} ms\n{h:#}");
    let stale = h["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["reason_code"] == "acquired-stale")
        .expect("the takeover is recorded");
    assert_eq!(stale["node"], second.as_str());
    assert!(stale["stale"]["store_age_ms"].as_u64().unwrap() >= 300);

    // The table says the same for people.
    let out = putex()
        .args(["history", "hist", "--store", url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        table.contains("NO HOLDER") && table.contains(&format!("{first} → {second}")),
        "{table}"
    );
    let out = putex()
        .args(["history", "hist", "--store", url, "--limit", "1"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
}

#[test]
fn history_records_putex_lock_holders() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    for node in ["cron1", "cron2"] {
        let out = putex()
            .args(["lock", "nightly", "--ttl", "1s", "--store", &url])
            .args(["--node", node, "--", "true"])
            .env("PUTEX_KEEPER_DIR", dir.path().join("keepers"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let h = history_json(&url, "nightly");
    let acts = activations(&h);
    assert_eq!(acts.len(), 2, "{h:#}");
    assert_eq!(acts[0]["node"], "cron1");
    assert_eq!(acts[1]["node"], "cron2");
    assert_eq!(acts[1]["previous_holder"], "cron1", "{h:#}");
    assert_eq!(acts[1]["acquired"], "acquired-released", "{h:#}");
    assert_eq!(acts[1]["no_holder_basis"], "left", "{h:#}");
    let all = h["transitions"].as_array().unwrap();
    assert!(all.iter().all(|t| t["source"] == "lock"), "{h:#}");
    // cron1 released after its command: recorded, with the reason.
    assert!(
        all.iter()
            .any(|t| t["node"] == "cron1" && t["reason_code"] == "released"),
        "{h:#}"
    );
}

#[test]
fn history_cli_completions_and_man_pages() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = putex().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("lock") && text.contains("run") && text.contains("history"),
            "{shell}: {text}"
        );
    }
    let bad = putex().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));

    let out = putex().arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains(".TH"), "{page}");
    for word in ["lock", "run", "watch", "completions"] {
        assert!(page.contains(word), "{word} missing: {page}");
    }

    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("man1");
    let out = putex().args(["man", "--dir"]).arg(&man1).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in ["putex.1", "putex-run.1", "putex-lock.1", "putex-history.1"] {
        assert!(man1.join(page).exists(), "{page} not written");
    }
    assert!(!man1.join("putex-keeper.1").exists());
    let run = std::fs::read_to_string(man1.join("putex-run.1")).unwrap();
    assert!(run.contains("lock"), "{run}");
}
