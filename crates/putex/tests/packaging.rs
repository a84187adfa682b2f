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
