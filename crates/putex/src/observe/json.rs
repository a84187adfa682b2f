//! Fencing tokens in the JSON putex emits: decimal strings.
//!
//! A token's epoch is its store's incarnation, the time the NATS bucket or
//! the SQLite file was created in nanoseconds: about 1.8 × 10^18, far above
//! 2^53, where JavaScript numbers (and jq before 1.7) stop being exact. As
//! a JSON number, epoch `1795591562840662982` reaches a web page as
//! `1795591562840663000`. So every token object in the JSON putex prints or
//! serves (`putex history -o json`, the `/v1/` API, `/ui/status.json`)
//! carries both of its parts as decimal strings:
//!
//! ```json
//! "token": {"epoch": "1795591562840662982", "revision": "213"}
//! ```
//!
//! Compare tokens as integers (BigInt in JavaScript), epoch first. A token
//! in the `EPOCH:REVISION` form (`fencing_token`, `putex status`, RDLM's
//! `token`, `X-Putex-Token`) was a string already.
//!
//! The records putex keeps in the store, and the core's own serde for
//! [`Token`], keep numbers, so older versions still read what newer ones
//! write. Readers go through [`token::deserialize`] (or
//! [`option_token::deserialize`], [`decimal::deserialize`]), which take
//! either form: a number or a decimal string.
//!
//! Use with serde's field attributes:
//!
//! ```
//! use putex::observe::json;
//! use putex::store::Token;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Out {
//!     #[serde(with = "json::token")]
//!     token: Token,
//!     #[serde(default, with = "json::option_token")]
//!     previous: Option<Token>,
//! }
//!
//! let out = Out { token: Token::new(1795591562840662982, 213), previous: None };
//! let text = serde_json::to_string(&out).unwrap();
//! assert_eq!(
//!     text,
//!     r#"{"token":{"epoch":"1795591562840662982","revision":"213"},"previous":null}"#
//! );
//! let old: Out = serde_json::from_str(r#"{"token":{"epoch":1795591562840662982,"revision":213}}"#).unwrap();
//! assert_eq!(old.token, out.token);
//! ```

use std::fmt;

use putex_core::Token;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A `u64` as a decimal string; read from a string or a number.
pub mod decimal {
    use super::*;

    /// Writes `v` as a decimal string, e.g. `"1795591562840662982"`.
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a non-negative integer given as a JSON number or as a string
    /// of decimal digits (no sign, no spaces, no fraction).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(DecimalVisitor)
    }

    struct DecimalVisitor;

    impl Visitor<'_> for DecimalVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a non-negative integer, as a number or a string of decimal digits")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(E::invalid_value(de::Unexpected::Str(v), &self));
            }
            v.parse()
                .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
}

/// A token's parts as they appear in JSON.
#[derive(Serialize, Deserialize)]
struct Parts {
    #[serde(with = "decimal")]
    epoch: u64,
    #[serde(with = "decimal")]
    revision: u64,
}

impl From<Token> for Parts {
    fn from(t: Token) -> Self {
        Parts {
            epoch: t.epoch,
            revision: t.revision,
        }
    }
}

impl From<Parts> for Token {
    fn from(p: Parts) -> Self {
        Token::new(p.epoch, p.revision)
    }
}

/// A [`Token`] as `{"epoch": "E", "revision": "R"}`; read with its parts
/// as strings or numbers.
pub mod token {
    use super::*;

    /// Writes `{"epoch": "E", "revision": "R"}`.
    pub fn serialize<S: Serializer>(t: &Token, s: S) -> Result<S::Ok, S::Error> {
        Parts::from(*t).serialize(s)
    }

    /// Reads `{"epoch": E, "revision": R}`, each part a number or a
    /// decimal string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        Parts::deserialize(d).map(Token::from)
    }
}

/// An optional [`Token`] as [`token`] writes it, or `null`. For a field
/// that may be missing, add `#[serde(default)]`.
pub mod option_token {
    use super::*;

    /// Writes `null` or `{"epoch": "E", "revision": "R"}`.
    pub fn serialize<S: Serializer>(t: &Option<Token>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_some(&Parts::from(*t)),
            None => s.serialize_none(),
        }
    }

    /// Reads `null` or a token with its parts as strings or numbers.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Token>, D::Error> {
        Ok(Option::<Parts>::deserialize(d)?.map(Token::from))
    }
}

/// What a read of a lock record shows, as `putex status`, the `/v1/` API
/// and the web page spell it: the holder's state as its record says
/// (`confirming`, `active`, `released`, `revoked`), or that there is no
/// record (`absent`) or none putex can read (`unreadable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    /// Taken; the holder waits out the fencing gap before it starts.
    Confirming,
    /// Held; the service may run.
    Active,
    /// Given back with proof that the service stopped: free at once.
    Released,
    /// Taken away by an administrator: free for a taker.
    Revoked,
    /// No record under the lock's key.
    Absent,
    /// A record that is not a putex lock record.
    Unreadable,
}

impl RecordState {
    /// The name, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Confirming => "confirming",
            RecordState::Active => "active",
            RecordState::Released => "released",
            RecordState::Revoked => "revoked",
            RecordState::Absent => "absent",
            RecordState::Unreadable => "unreadable",
        }
    }

    /// Whether the record says somebody holds the lock (`confirming` or
    /// `active`).
    pub fn is_held(self) -> bool {
        matches!(self, RecordState::Confirming | RecordState::Active)
    }
}

impl From<putex_core::LockState> for RecordState {
    fn from(state: putex_core::LockState) -> RecordState {
        use putex_core::LockState;
        match state {
            LockState::Confirming => RecordState::Confirming,
            LockState::Active => RecordState::Active,
            LockState::Released => RecordState::Released,
            LockState::Revoked => RecordState::Revoked,
        }
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Out {
        #[serde(with = "token")]
        token: Token,
        #[serde(
            default,
            with = "option_token",
            skip_serializing_if = "Option::is_none"
        )]
        previous: Option<Token>,
        #[serde(with = "decimal")]
        epoch: u64,
    }

    /// Above 2^53, where an f64 (a JavaScript number) is no longer exact.
    const BIG: u64 = 1_795_591_562_840_662_982;

    #[test]
    fn tokens_above_2_pow_53_survive_the_text() {
        // What a JavaScript number would have made of it.
        assert_ne!(BIG as f64 as u64, BIG);
        let out = Out {
            token: Token::new(BIG, 213),
            previous: Some(Token::new(u64::MAX, u64::MAX)),
            epoch: BIG,
        };
        let text = serde_json::to_string(&out).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"token":{{"epoch":"{BIG}","revision":"213"}},"previous":{{"epoch":"{m}","revision":"{m}"}},"epoch":"{BIG}"}}"#,
                m = u64::MAX
            )
        );
        // No number in the text: a generic JSON reader (one that turns
        // every number into an f64) keeps every digit.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["token"]["epoch"], BIG.to_string());
        assert_eq!(v["previous"]["revision"], u64::MAX.to_string());
        assert_eq!(serde_json::from_str::<Out>(&text).unwrap(), out);
    }

    #[test]
    fn reads_numbers_and_strings() {
        let numbers = format!(r#"{{"token":{{"epoch":{BIG},"revision":213}},"epoch":{BIG}}}"#);
        let strings =
            format!(r#"{{"token":{{"epoch":"{BIG}","revision":"213"}},"epoch":"{BIG}"}}"#);
        let mixed = format!(
            r#"{{"token":{{"epoch":"{BIG}","revision":213}},"previous":{{"epoch":1,"revision":"2"}},"epoch":{BIG}}}"#
        );
        for text in [&numbers, &strings] {
            let got: Out = serde_json::from_str(text).unwrap();
            assert_eq!(
                got,
                Out {
                    token: Token::new(BIG, 213),
                    previous: None,
                    epoch: BIG
                },
                "{text}"
            );
        }
        let got: Out = serde_json::from_str(&mixed).unwrap();
        assert_eq!(got.previous, Some(Token::new(1, 2)));
        let null = r#"{"token":{"epoch":1,"revision":2},"previous":null,"epoch":3}"#;
        assert_eq!(serde_json::from_str::<Out>(null).unwrap().previous, None);
        // What the core's own serde reads and writes is still numbers.
        let core = serde_json::to_string(&Token::new(BIG, 213)).unwrap();
        assert_eq!(core, format!(r#"{{"epoch":{BIG},"revision":213}}"#));
        let via_helper: Token = token::deserialize(&mut serde_json::Deserializer::from_str(&core))
            .expect("the core's form reads");
        assert_eq!(via_helper, Token::new(BIG, 213));
    }

    #[test]
    fn refuses_what_is_no_token() {
        for bad in [
            r#"{"epoch":"-1","revision":"1"}"#,
            r#"{"epoch":-1,"revision":1}"#,
            r#"{"epoch":"+1","revision":"1"}"#,
            r#"{"epoch":" 1","revision":"1"}"#,
            r#"{"epoch":"","revision":"1"}"#,
            r#"{"epoch":"1.0","revision":"1"}"#,
            r#"{"epoch":1.5,"revision":1}"#,
            r#"{"epoch":"18446744073709551616","revision":"1"}"#,
            r#"{"epoch":"0x10","revision":"1"}"#,
            r#"{"epoch":"1"}"#,
            r#""1:2""#,
            r#"null"#,
        ] {
            let got = token::deserialize(&mut serde_json::Deserializer::from_str(bad));
            assert!(got.is_err(), "{bad} read as {got:?}");
        }
    }
}
