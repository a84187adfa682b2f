//! An empty environment variable is not a value: every `PUTEX_*`,
//! `NATS_URL` and `NATS_CREDS` that is set but empty counts as unset, for
//! every subcommand — clap's `env` arguments included — checked against the
//! built binary.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::agent::putex;

/// `putex ARGS` with `vars` set, the default SQLite store under `state`
/// (`XDG_STATE_HOME`).
fn putex_with(state: &Path, vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c: Command = putex();
    c.env("XDG_STATE_HOME", state)
        .env("RUST_LOG", "warn")
        .envs(vars.iter().copied())
        .args(args)
        .stdin(Stdio::null());
    c.output().unwrap()
}

fn assert_ok(out: &Output, ctx: &str) {
    assert!(
        out.status.success(),
        "{ctx}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `putex lock` with every variable it reads empty (or blank): the default
/// store, node id and keeper directory, as if they were unset. CMD gets the
/// lock's own variables, and every unrelated variable as it was.
#[test]
fn env_empty_variables_are_unset_for_putex_lock() {
    // On tmpfs: fsync on a loaded disk can fail R >= 10 × p99 (R = 100 ms).
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let name = format!("envtest{}", std::process::id());
    let env_out = dir.path().join("env").display().to_string();
    let out = putex_with(
        dir.path(),
        &[
            ("PUTEX_STORE", ""),
            ("NATS_URL", ""),
            ("NATS_CREDS", ""),
            ("PUTEX_NODE", ""),
            ("PUTEX_KEEPER_DIR", " "),
            ("PUTEX_RENEW", ""),
            ("PUTEX_FAILURES", ""),
            ("PUTEX_MAX_DRIFT", ""),
            ("PUTEX_LOG_FORMAT", ""),
            ("UNRELATED_EMPTY", ""),
            ("ENV_OUT", &env_out),
        ],
        &[
            "lock",
            &name,
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            "env > \"$ENV_OUT\"",
        ],
    );
    // The blank PUTEX_KEEPER_DIR meant the default keeper directory: leave
    // nothing of this lock there.
    if let Ok(entries) = std::fs::read_dir(putex::supervision::keeper::default_keeper_dir()) {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .contains(&format!("-lock.{name}."))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    assert_ok(&out, "putex lock");
    assert!(
        dir.path().join("putex/store.db").exists(),
        "the default store"
    );
    let env = std::fs::read_to_string(&env_out).unwrap();
    let vars: Vec<&str> = env.lines().collect();
    assert!(
        vars.contains(&format!("PUTEX_LOCK={name}").as_str()),
        "{env}"
    );
    assert!(vars.contains(&"UNRELATED_EMPTY="), "{env}");
    for gone in ["PUTEX_STORE=", "NATS_URL=", "NATS_CREDS=", "PUTEX_RENEW="] {
        assert!(!vars.iter().any(|v| v.starts_with(gone)), "{gone} in {env}");
    }
}

/// `putex status`, `history` and `id` with one variable at a time empty
/// (`PUTEX_STORE`, `PUTEX_LOCK`, `NATS_URL`, `PUTEX_LOG_FORMAT`): the
/// default store, no `--lock` that conflicts with the NAME given, the
/// default log format.
#[test]
fn env_empty_variables_are_unset_for_status_history_and_id() {
    let dir = tempfile::tempdir().unwrap();
    for var in ["PUTEX_STORE", "PUTEX_LOCK", "NATS_URL", "PUTEX_LOG_FORMAT"] {
        for args in [
            &["status", "pg", "-o", "json"][..],
            &["status"],
            &["history", "pg"],
            &["id", "list", "workers"],
        ] {
            let out = putex_with(dir.path(), &[(var, "")], args);
            assert_ok(&out, &format!("{var}= putex {}", args.join(" ")));
        }
    }
    assert!(
        dir.path().join("putex/store.db").exists(),
        "the default store"
    );
}

/// An empty variable does not hide the config file's value below it
/// (flags > environment > file > defaults): `putex check` with
/// `PUTEX_STORE` empty uses the file's store; with `PUTEX_RENEW` empty too,
/// the file's R; and an empty `PUTEX_CONFIG` names no file.
#[test]
fn env_an_empty_variable_does_not_hide_the_config_file() {
    // `putex check` measures the store: on tmpfs, and with R = 700 ms (not
    // the default 1 s), a loaded disk's fsync does not fail the R >= 10 ×
    // p99 rule.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let db = dir.path().join("file.db");
    let config = dir.path().join("putex.toml");
    std::fs::write(
        &config,
        format!("store = \"sqlite://{}\"\nrenew = \"700ms\"\n", db.display()),
    )
    .unwrap();
    let config = config.display().to_string();
    let out = putex_with(
        dir.path(),
        &[("PUTEX_STORE", "")],
        &["check", "--config", &config],
    );
    assert_ok(&out, "PUTEX_STORE= putex check --config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("store sqlite://{}", db.display())),
        "{text}"
    );
    assert!(db.exists(), "the file's store was not opened");

    let out = putex_with(
        dir.path(),
        &[("PUTEX_STORE", ""), ("PUTEX_RENEW", "")],
        &["check", "--config", &config],
    );
    assert_ok(&out, "PUTEX_STORE= PUTEX_RENEW= putex check --config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("R = 700 ms"), "{text}");

    let out = putex_with(dir.path(), &[("PUTEX_CONFIG", "")], &["check"]);
    assert_ok(&out, "PUTEX_CONFIG= putex check");
}
