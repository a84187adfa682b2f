//! `info` in a member record: the small JSON object a `putex run --info`
//! command prints (for PostgreSQL: role, timeline, LSNs, replication
//! state), for `putex status` (a column per field), `/v1/status` and the
//! web page.
//!
//! It is untrusted input, from the command where the agent reads it
//! ([`parse`]) and from any writer of the store where it is read back
//! ([`sanitize`]): at most [`INFO_MAX_BYTES`] of JSON, one object of at
//! most [`INFO_MAX_FIELDS`] fields, names of `A-Z a-z 0-9 _ -` up to
//! [`INFO_MAX_NAME`] characters, values strings (up to [`INFO_MAX_VALUE`]
//! characters, no control characters), numbers or booleans — kept as text;
//! `null` leaves the field out. Anything else refuses the whole output.

use std::collections::BTreeMap;

/// The most output `--info` may print.
pub const INFO_MAX_BYTES: usize = 4096;
/// The most fields its object may have.
pub const INFO_MAX_FIELDS: usize = 16;
/// The longest field name.
pub const INFO_MAX_NAME: usize = 32;
/// The longest value, in characters.
pub const INFO_MAX_VALUE: usize = 128;

/// What `--info` printed, checked as the module says.
pub fn parse(out: &[u8]) -> Result<BTreeMap<String, String>, String> {
    if out.len() > INFO_MAX_BYTES {
        return Err(format!(
            "printed {} bytes, more than {INFO_MAX_BYTES}",
            out.len()
        ));
    }
    let value: serde_json::Value =
        serde_json::from_slice(out).map_err(|e| format!("did not print JSON: {e}"))?;
    let serde_json::Value::Object(fields) = value else {
        return Err("printed JSON that is not an object".into());
    };
    if fields.len() > INFO_MAX_FIELDS {
        return Err(format!(
            "printed {} fields, more than {INFO_MAX_FIELDS}",
            fields.len()
        ));
    }
    let mut info = BTreeMap::new();
    for (name, value) in fields {
        if !valid_name(&name) {
            return Err(format!(
                "field name {name:?}: 1 to {INFO_MAX_NAME} characters from A-Z a-z 0-9 _ -"
            ));
        }
        let text = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => s,
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return Err(format!("field {name:?}: not a string, number or boolean")),
        };
        if !valid_value(&text) {
            return Err(format!(
                "field {name:?}: a value of at most {INFO_MAX_VALUE} characters, no control characters"
            ));
        }
        info.insert(name, text);
    }
    Ok(info)
}

/// `info` as read back from a member record someone wrote: only the
/// fields [`parse`] would have kept, at most [`INFO_MAX_FIELDS`] of them.
pub fn sanitize(info: BTreeMap<String, String>) -> BTreeMap<String, String> {
    info.into_iter()
        .filter(|(k, v)| valid_name(k) && valid_value(v))
        .take(INFO_MAX_FIELDS)
        .collect()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= INFO_MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn valid_value(value: &str) -> bool {
    value.chars().count() <= INFO_MAX_VALUE && !value.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_object_of_scalars_is_kept_as_text() {
        let info = parse(
            br#"{"role": "replica", "timeline": 2, "replay_lsn": "0/5000060", "streaming": true, "sync": null}"#,
        )
        .unwrap();
        assert_eq!(
            info.into_iter().collect::<Vec<_>>(),
            [
                ("replay_lsn".to_string(), "0/5000060".to_string()),
                ("role".into(), "replica".into()),
                ("streaming".into(), "true".into()),
                ("timeline".into(), "2".into()),
            ]
        );
        assert!(parse(b"{}").unwrap().is_empty());
    }

    #[test]
    fn anything_else_is_refused_whole() {
        let long = format!("{{\"a\": \"{}\"}}", "x".repeat(INFO_MAX_VALUE + 1));
        let many = format!(
            "{{{}}}",
            (0..=INFO_MAX_FIELDS)
                .map(|i| format!("\"f{i}\": 1"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let huge = format!("{{\"a\": \"{}\"}}", " ".repeat(INFO_MAX_BYTES));
        for (bad, why) in [
            ("", "did not print JSON"),
            ("role=primary", "did not print JSON"),
            ("[1, 2]", "not an object"),
            ("\"primary\"", "not an object"),
            (r#"{"a": {"b": 1}}"#, "not a string, number or boolean"),
            (r#"{"a": [1]}"#, "not a string, number or boolean"),
            (r#"{"bad name": 1}"#, "field name"),
            (r#"{"": 1}"#, "field name"),
            (r#"{"a": "line\nbreak"}"#, "no control characters"),
            (r#"{"a": "\u001b[31mred"}"#, "no control characters"),
            (long.as_str(), "at most"),
            (many.as_str(), "more than"),
            (huge.as_str(), "bytes, more than"),
        ] {
            let e = parse(bad.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_record_written_by_someone_else_keeps_only_valid_fields() {
        let read: BTreeMap<String, String> = [
            ("role", "primary"),
            ("evil\u{1b}", "x"),
            ("term", "\u{1b}]0;pwned\u{7}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            sanitize(read).into_iter().collect::<Vec<_>>(),
            [("role".to_string(), "primary".to_string())]
        );
    }
}
