//! Names checked once, where they enter: the command line, an HTTP request,
//! [`LeaseOptions::new`](crate::LeaseOptions::new) for a program.
//!
//! A [`Name`] is one token of a store key (`[A-Za-z0-9_-]{1,64}`): a lock,
//! semaphore, identity pool or HTTP resource, and the tokens putex makes up
//! itself (a waiter's instance, an HTTP lock's id). A [`NodeId`] may also be
//! a dotted DNS name (`db1.example.com`), so it always comes last in a key.
//! Holding one proves the check passed, so the key builders in
//! [`keys`](super::keys) cannot fail and check nothing again.
//!
//! ```
//! use putex::store::{Name, NodeId, keys};
//!
//! let lock: Name = "nightly-report".parse()?;
//! let node: NodeId = "db1.example.com".parse()?;
//! assert_eq!(keys::member(&lock, &node), "member.nightly-report.db1.example.com");
//! assert!("a.b".parse::<Name>().is_err());
//! # Ok::<(), putex::store::NameError>(())
//! ```

use std::fmt;
use std::str::FromStr;

/// The longest lock, pool or semaphore name.
pub const MAX_NAME_LEN: usize = 64;
/// The longest node id (the longest DNS name).
pub const MAX_NODE_LEN: usize = 253;

/// A name or node id that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {problem}; {rule} (for example {example:?})")]
pub struct NameError {
    what: &'static str,
    value: String,
    problem: String,
    rule: &'static str,
    example: &'static str,
}

impl NameError {
    /// The text that was refused, as given.
    pub fn value(&self) -> &str {
        &self.value
    }
}

const NAME_RULE: &str = "names are 1 to 64 characters from A-Z a-z 0-9 _ -";
const NODE_RULE: &str =
    "node ids are 1 to 253 characters from A-Z a-z 0-9 _ - and dots between non-empty labels";

/// A lock, semaphore, identity pool or HTTP resource name (one key token):
/// 1 to 64 characters from `A-Z a-z 0-9 _ -`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Checks `name` against the rule above; the error names the problem
    /// and gives an example of a valid name.
    pub fn new(name: impl Into<String>) -> Result<Name, NameError> {
        let name = name.into();
        check_name(&name)?;
        Ok(Name(name))
    }

    /// The checked name, ready to be a token of a store key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A node id: name characters and dots between non-empty labels, 1 to 253
/// characters, so that FQDNs work.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    /// Checks `node` against the rule above; the error names the problem
    /// and gives an example of a valid node id.
    pub fn new(node: impl Into<String>) -> Result<NodeId, NameError> {
        let node = node.into();
        check_node(&node)?;
        Ok(NodeId(node))
    }

    /// The checked node id; it may contain dots (an FQDN), so in a key
    /// it comes last.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! text_like {
    ($t:ty) => {
        impl FromStr for $t {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                <$t>::new(s)
            }
        }
        impl TryFrom<String> for $t {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                <$t>::new(s)
            }
        }
        impl TryFrom<&str> for $t {
            type Error = NameError;
            fn try_from(s: &str) -> Result<Self, NameError> {
                <$t>::new(s)
            }
        }
        /// As the text's: `"pg"`, so that messages quote a name as before.
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
        impl From<$t> for String {
            fn from(n: $t) -> String {
                n.0
            }
        }
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$t>::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

text_like!(Name);
text_like!(NodeId);

fn check_name(name: &str) -> Result<(), NameError> {
    let err = |problem: String| NameError {
        what: "name",
        value: name.to_owned(),
        problem,
        rule: NAME_RULE,
        example: "nightly-report",
    };
    if name.is_empty() {
        return Err(err("it is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(err(format!("it is {} bytes long", name.len())));
    }
    if let Some(c) = name.chars().find(|c| !is_name_char(*c)) {
        return Err(err(format!("{c:?} is not allowed")));
    }
    Ok(())
}

fn check_node(node: &str) -> Result<(), NameError> {
    let err = |problem: String| NameError {
        what: "node id",
        value: node.to_owned(),
        problem,
        rule: NODE_RULE,
        example: "db1.example.com",
    };
    if node.is_empty() {
        return Err(err("it is empty".into()));
    }
    if node.len() > MAX_NODE_LEN {
        return Err(err(format!("it is {} bytes long", node.len())));
    }
    if let Some(c) = node.chars().find(|c| !is_name_char(*c) && *c != '.') {
        return Err(err(format!("{c:?} is not allowed")));
    }
    if node.split('.').any(str::is_empty) {
        return Err(err(
            "it has an empty label (a leading, trailing or double dot)".into(),
        ));
    }
    Ok(())
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "pg", "nightly-report", "A_b-9", &"x".repeat(64)] {
            Name::new(ok).unwrap();
        }
        for bad in ["", "a.b", "a b", "ü", "a/b", &"x".repeat(65)] {
            let e = Name::new(bad).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("1 to 64 characters"), "{msg}");
            assert!(msg.contains("nightly-report"), "{msg}");
            assert_eq!(e.value(), bad);
        }
    }

    #[test]
    fn nodes_may_be_fqdns() {
        for ok in ["db1", "db1.example.com", "host_1-a"] {
            NodeId::new(ok).unwrap();
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a*b", "a>b", "=scan"] {
            assert!(NodeId::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn deserializing_checks_too() {
        let n: Name = serde_json::from_str("\"pg\"").unwrap();
        assert_eq!(n, "pg");
        assert!(serde_json::from_str::<Name>("\"a.b\"").is_err());
        assert!(serde_json::from_str::<NodeId>("\"a..b\"").is_err());
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"pg\"");
    }

    #[test]
    fn messages_quote_a_name_as_they_quote_text() {
        let n = Name::new("pg").unwrap();
        assert_eq!(format!("lock {n:?}"), "lock \"pg\"");
        assert_eq!(format!("{n}"), "pg");
        assert_eq!(
            format!("{:?}", NodeId::new("db1.example.com").unwrap()),
            "\"db1.example.com\""
        );
    }
}
