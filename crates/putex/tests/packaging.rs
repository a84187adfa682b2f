//! The packaging's files agree with the code: the example configuration the
//! Debian package installs as `/etc/putex/pg.toml.example` parses as
//! `putex run`'s config file, and so does each of its commented-out
//! settings once uncommented. A key the code does not know (invented,
//! misspelt, or renamed since) fails here rather than on an operator's host.
//! `scripts/test-package` checks the installed package itself.

use putex::cli::config::FileConfig;

const EXAMPLE: &str = include_str!("../../../packaging/pg.toml.example");

/// The commented-out settings of `text` with their line numbers: lines
/// `# key = value` (a lower-case kebab key), without the `# `.
fn commented_settings(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let setting = line.strip_prefix("# ")?;
            let (key, _) = setting.split_once(" = ")?;
            let is_key = !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '-');
            is_key.then_some((i + 1, setting))
        })
        .collect()
}

#[test]
fn the_example_config_parses() {
    FileConfig::parse(EXAMPLE).unwrap_or_else(|e| panic!("packaging/pg.toml.example: {e}"));
}

#[test]
fn every_commented_setting_of_the_example_config_parses() {
    let settings = commented_settings(EXAMPLE);
    assert!(
        settings.len() >= 15,
        "too few commented settings found: {settings:?}"
    );
    for (line, setting) in settings {
        FileConfig::parse(setting)
            .unwrap_or_else(|e| panic!("packaging/pg.toml.example:{line}: {setting:?}: {e}"));
    }
}

#[test]
fn the_commented_settings_check_catches_an_unknown_key() {
    let settings = commented_settings("# A comment, e.g. x = 1.\n# renw = \"1s\"\n");
    assert_eq!(settings, [(2, "renw = \"1s\"")]);
    assert!(FileConfig::parse(settings[0].1).is_err());
}

/// The PostgreSQL recipe's rebuild (`putex-pg rejoin` when `pg_rewind`
/// cannot) never loses the node's old data. Found by running the installed
/// demo under load: the rebuild moved the data directory aside *before*
/// `pg_basebackup`, which failed; the next attempt removed
/// `PGDATA.putex-old` — the only copy of the old primary's data — first.
/// Now the backup goes beside the data directory and is swapped in only
/// once whole. Run against stub PostgreSQL programs: `pg_rewind` always
/// fails, `pg_basebackup` fails (leaving a partial copy) while a flag file
/// exists.
mod recipe_rebuild {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::Command;

    const RECIPE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/postgresql/putex-pg"
    );

    fn stub(bin: &Path, name: &str, body: &str) {
        let path = bin.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A node with whole data (`marker` inside), stub programs in `bin/`.
    fn node(dir: &Path, marker: &str) {
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).unwrap();
        let state = dir.display();
        // Not running until started; started means running.
        stub(
            &bin,
            "pg_ctl",
            &format!(
                r#"case "$1" in
status) [ -e {state}/running ] ;;
start) touch {state}/running ;;
*) exit 0 ;;
esac"#
            ),
        );
        stub(
            &bin,
            "psql",
            r#"q="$*"
case "$q" in *"-f -"*) q=$(cat) ;; esac
case "$q" in
*concat_ws*pg_ls_waldir*) echo 't|2|0/0|0/0|4242||' ;;
*pg_walfile_name*) echo '00000002|' ;;
*pg_is_in_recovery*) echo t ;;
*) ;;
esac"#,
        );
        stub(
            &bin,
            "pg_rewind",
            "echo 'pg_rewind: could not find common ancestor' >&2; exit 1",
        );
        // The recipe checks that every program it runs is there; these two
        // are not run in a rebuild and answer nothing.
        stub(&bin, "pg_controldata", "exit 1");
        stub(&bin, "postgres", "exit 1");
        stub(
            &bin,
            "pg_basebackup",
            &format!(
                r#"while [ $# -gt 0 ]; do [ "$1" = -D ] && d=$2; shift; done
mkdir -p "$d/global"
echo 16 > "$d/PG_VERSION"
if [ -e {state}/fail-basebackup ]; then echo 'pg_basebackup: connection lost' >&2; exit 1; fi
touch "$d/global/pg_control" "$d/backup_label"
echo from-the-holder > "$d/marker""#
            ),
        );
        let data = dir.join("data");
        fs::create_dir_all(data.join("global")).unwrap();
        fs::write(data.join("PG_VERSION"), "16\n").unwrap();
        fs::write(data.join("global/pg_control"), "").unwrap();
        fs::write(data.join("marker"), marker).unwrap();
    }

    fn rejoin(dir: &Path) -> (bool, String) {
        let _ = fs::remove_file(dir.join("running"));
        let out = Command::new("sh")
            .arg(RECIPE)
            .arg("rejoin")
            .env("PGDATA", dir.join("data"))
            .env("PGBIN", dir.join("bin"))
            .env("PUTEX_HOLDER", "db1")
            .env("PUTEX_HOLDER_ADDR", "127.0.0.1:1")
            .env("PUTEX_NODE", "db2")
            .env("FOLLOW_TIMEOUT", "2")
            .env("PROMOTE_TIMEOUT", "2")
            .output()
            .expect("sh");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn marker(path: &Path) -> String {
        fs::read_to_string(path.join("marker"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    #[test]
    fn a_failed_base_backup_changes_nothing_and_the_next_one_keeps_the_old_data() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        node(dir, "the old primary's data");
        fs::write(dir.join("fail-basebackup"), "").unwrap();
        for attempt in 1..=2 {
            let (ok, log) = rejoin(dir);
            assert!(!ok, "attempt {attempt}: a failed backup succeeded:\n{log}");
            assert!(log.contains("pg_basebackup failed"), "{log}");
            assert_eq!(
                marker(&dir.join("data")),
                "the old primary's data",
                "attempt {attempt} changed the data directory:\n{log}"
            );
        }
        fs::remove_file(dir.join("fail-basebackup")).unwrap();
        let (ok, log) = rejoin(dir);
        assert!(ok, "the rebuild failed:\n{log}");
        assert_eq!(marker(&dir.join("data")), "from-the-holder", "{log}");
        assert_eq!(
            marker(&dir.join("data.putex-old")),
            "the old primary's data",
            "the old data is gone:\n{log}"
        );
        assert!(!dir.join("data.putex-new").exists());
    }

    /// What an older recipe left behind (the data moved aside, a partial
    /// backup in its place) is kept: the next rebuild replaces the partial
    /// copy, never `PGDATA.putex-old`.
    #[test]
    fn an_unfinished_rebuild_of_an_older_recipe_keeps_its_old_data() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        node(dir, "the old primary's data");
        fs::rename(dir.join("data"), dir.join("data.putex-old")).unwrap();
        fs::create_dir_all(dir.join("data")).unwrap();
        fs::write(dir.join("data/PG_VERSION"), "16\n").unwrap();
        let (ok, log) = rejoin(dir);
        assert!(ok, "the rebuild failed:\n{log}");
        assert!(log.contains("keeping"), "{log}");
        assert_eq!(marker(&dir.join("data")), "from-the-holder", "{log}");
        assert_eq!(
            marker(&dir.join("data.putex-old")),
            "the old primary's data",
            "the only copy of the old data is gone:\n{log}"
        );
    }
}
