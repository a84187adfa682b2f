//! The web status page in a real browser: headless Chromium loads the
//! agent's `/ui`, runs its script, and the rendered page shows the holder
//! and the failover timeline — before and after a failover.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent_http::{http_get, two_agents_with_http_flags};
use crate::common::agent::serial;
use crate::common::nats_server::NatsServer;

/// `$PUTEX_CHROMIUM`, else chromium on PATH; a missing browser fails the
/// test with how to install it.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("PUTEX_CHROMIUM").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let p = dir.join(name);
                if p.is_file() {
                    return p;
                }
            }
        }
    }
    panic!(
        "no Chromium found for the web status page test: run scripts/install-chromium \
         (apt-get install chromium), or set PUTEX_CHROMIUM"
    );
}

/// The DOM of `url` after its scripts ran, as headless Chromium renders it.
fn render(url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .output()
        .expect("start chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Renders until `pred` holds (the page refreshes every second).
fn render_until(url: &str, within: Duration, pred: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + within;
    loop {
        let dom = render(url);
        if pred(&dom) || Instant::now() > until {
            return dom;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn timeline_activations(dom: &str, node: &str) -> usize {
    let Some(timeline) = dom.split("class=\"timeline\"").nth(1) else {
        return 0;
    };
    timeline
        .split("<tr>")
        .filter(|row| row.contains(&format!("<td>{node}</td>")) && row.contains("→ active"))
        .count()
}

#[test]
fn web_status_page_shows_the_holder_and_the_failover_in_chromium() {
    let _serial = serial();
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    // R = 300 ms (T = 900 ms): headless Chromium takes both cores for a
    // moment each time it renders, which must not starve the holder into
    // a failover the test did not ask for (with R = 100 ms it did once).
    let (ports, mut agents, active) = two_agents_with_http_flags(
        dir.path(),
        &server.url,
        "site",
        ["web-a", "web-b"],
        &["--renew", "300ms"],
    );
    let (holder, other) = (
        agents[active].node().to_owned(),
        agents[1 - active].node().to_owned(),
    );
    let url = format!("http://127.0.0.1:{}/ui", ports[1 - active]);
    let dom = render_until(&url, Duration::from_secs(10), |d| {
        d.contains(&format!("<span class=\"holder\">{holder}</span>"))
            && timeline_activations(d, &holder) >= 1
    });
    assert!(
        dom.contains(&format!("<span class=\"holder\">{holder}</span>")),
        "the page does not show the holder {holder}:\n{dom}"
    );
    assert!(dom.contains("class=\"token\""), "{dom}");
    assert_eq!(timeline_activations(&dom, &holder), 1, "{dom}");
    // The page's data carries the activation's token as strings (a NATS
    // epoch is above 2^53), and the page shows every digit of it.
    let (code, body) = http_get(ports[1 - active], "/ui/status.json").unwrap();
    assert_eq!(code, 200, "{body}");
    let data: serde_json::Value = serde_json::from_str(&body).unwrap();
    let timeline = data["locks"][0]["timeline"].as_array().unwrap();
    let activation = timeline
        .iter()
        .find(|r| r["activation"] == true && r["node"] == holder.as_str())
        .unwrap_or_else(|| panic!("no activation of {holder} in {body}"));
    let (epoch, revision) = (
        activation["token"]["epoch"]
            .as_str()
            .expect("epoch is a string"),
        activation["token"]["revision"]
            .as_str()
            .expect("revision is a string"),
    );
    assert!(epoch.parse::<u64>().unwrap() > 1 << 53, "{body}");
    assert!(
        dom.contains(&format!("<td>{epoch}:{revision}</td>")),
        "the timeline does not show {epoch}:{revision} exactly:\n{dom}"
    );
    assert_eq!(timeline_activations(&dom, &other), 0, "{dom}");

    // Failover: the page now shows the new holder and a new timeline entry.
    agents[active].crash();
    let dom = render_until(&url, Duration::from_secs(15), |d| {
        d.contains(&format!("<span class=\"holder\">{other}</span>"))
            && timeline_activations(d, &other) >= 1
    });
    assert!(
        dom.contains(&format!("<span class=\"holder\">{other}</span>")),
        "the page does not show the new holder {other}:\n{dom}"
    );
    let timeline = dom.split("class=\"timeline\"").nth(1).unwrap_or_default();
    assert_eq!(timeline_activations(&dom, &other), 1, "{timeline}");
    assert_eq!(timeline_activations(&dom, &holder), 1, "{timeline}");
    agents[1 - active].stop_cleanly();
}
