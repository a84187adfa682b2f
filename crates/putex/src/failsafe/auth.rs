//! Who wrote a failsafe ask or grant: the shared key and the HMAC-SHA-256
//! that signs them (F5 of `docs/failsafe-design.md`).
//!
//! During a store outage a failsafe holder keeps its licence on grants
//! alone: in every round it asks every other member of the lock directly,
//! over the agents' HTTP listeners, and extends by that round only when all
//! of them grant. A grant is worth a renewal seen through the store — the
//! member that gives it waits W again before it may take over — so it must
//! come from the member it names, for the holder and the round it names.
//! Whoever can reach an agent's port must not keep a dead holder's licence
//! running by forging grants, nor hold a member's takeover back by forging
//! asks.
//!
//! So every [`Ask`] and every [`Answer`] travels with an HMAC-SHA-256 under
//! a key all members share ([`FailsafeKey`], `--failsafe-key-file`). The MAC
//! covers every field: the lock; the holder's node, machine and instance;
//! the token; the round; the member's node and machine; and for an answer
//! the grant or refusal and its reason. Hence:
//!
//! - a grant counts only for the round and the member it names: change
//!   either, or anything else, and the MAC no longer matches;
//! - a replayed old grant names an old round, and extends nothing: the
//!   holder takes an answer only for the ask it sent in the current round
//!   (it compares the verified answer's [`Answer::ask`] with its own — this
//!   module says who wrote a message, not whether it was expected, and
//!   remembers nothing);
//! - a replayed ask makes a member grant again (when the holder it names
//!   is still the newest it has seen), which only delays that member's own
//!   takeover;
//! - an ask's MAC never verifies as an answer's, nor an answer's as an
//!   ask's: each is computed after a tag of its own, so a holder's signed
//!   ask cannot be sent back to it as a grant.
//!
//! The MAC is computed over a canonical encoding, not over the JSON on the
//! wire: the tag, then every field in a fixed order, each string as its
//! length (u64, big-endian) and its bytes, each integer as a big-endian
//! u64, a boolean as one byte, the optional reason as a presence byte and
//! the string. Two different messages never encode alike (`"db1" "m"` and
//! `"db" "1m"` differ in their lengths), and the JSON's spelling — field
//! order, escapes, whitespace — may change between versions without a
//! member of one version refusing the other's messages. Verification
//! compares in constant time ([`ring::hmac::verify`]): how long it takes
//! says nothing about how much of a forged MAC was right.
//!
//! The key is symmetric: any member can sign asks and answers alike. Its
//! holders are trusted, the network is not. Nothing is encrypted: asks and
//! answers carry nothing secret, and anyone on the path may read them.
//!
//! # The key file
//!
//! The same file on every member of a failsafe lock. Its bytes are the
//! key, used as they are (not decoded), except that whitespace at the end
//! — the newline an editor or `echo` adds — is trimmed, so that it does
//! not make two members' keys differ. At least [`MIN_KEY_BYTES`] (32) must
//! remain: `head -c 32 /dev/urandom | base64 > FILE` makes one (44
//! characters), to copy to every member. Like ssh with a private key,
//! [`FailsafeKey::from_file`] refuses a file its group or others may read
//! or write (`chmod 600 FILE`): a key others can read is no secret.
//! A key's `Debug` shows a [fingerprint](FailsafeKey::fingerprint), never
//! the secret; members whose fingerprints differ hold different files.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use ring::hmac;
use serde::{Deserialize, Serialize};

/// The fewest bytes a key may have (after trimming trailing whitespace):
/// HMAC-SHA-256's own length. A shorter key would be easier to guess than
/// the MAC it makes.
pub const MIN_KEY_BYTES: usize = 32;

/// What an ask's canonical encoding starts with.
const ASK_TAG: &[u8] = b"putex failsafe v1 ask\0";
/// What an answer's canonical encoding starts with: not a prefix of
/// [`ASK_TAG`], nor the other way round.
const ANSWER_TAG: &[u8] = b"putex failsafe v1 answer\0";
/// What a key's fingerprint is the MAC of.
const FINGERPRINT_TAG: &[u8] = b"putex failsafe v1 fingerprint\0";

/// The length of a MAC in bytes (SHA-256's output); twice that in hex.
const MAC_BYTES: usize = 32;

/// The key every member of a failsafe lock shares (`--failsafe-key-file`):
/// it signs asks and answers and checks them.
#[derive(Clone)]
pub struct FailsafeKey {
    key: hmac::Key,
}

impl FailsafeKey {
    /// Reads the key from `path`: the file's bytes without trailing
    /// whitespace, at least [`MIN_KEY_BYTES`] of them. On Unix the file
    /// must be neither readable nor writable by its group or others.
    pub fn from_file(path: &Path) -> Result<FailsafeKey, KeyError> {
        let read_error = |source: io::Error| KeyError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        // The mode of the file opened, not of whatever the path names a
        // moment later.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = file.metadata().map_err(read_error)?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(KeyError::Permissions {
                    path: path.to_path_buf(),
                    mode: mode & 0o7777,
                });
            }
        }
        let mut secret = Vec::new();
        file.read_to_end(&mut secret).map_err(read_error)?;
        let secret = secret.trim_ascii_end();
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort {
                path: path.to_path_buf(),
                len: secret.len(),
            });
        }
        Ok(FailsafeKey::from_secret(secret))
    }

    /// A key of `secret`'s bytes, unchecked.
    fn from_secret(secret: &[u8]) -> FailsafeKey {
        FailsafeKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// Eight hex digits that tell keys apart without giving them away (the
    /// start of a MAC of a fixed tag): members with the same key file show
    /// the same fingerprint.
    pub fn fingerprint(&self) -> String {
        to_hex(&hmac::sign(&self.key, FINGERPRINT_TAG).as_ref()[..4])
    }

    /// Signs a holder's ask.
    pub fn sign_ask(&self, ask: &Ask) -> SignedAsk {
        SignedAsk {
            ask: ask.clone(),
            mac: self.mac(&ask.canonical()),
        }
    }

    /// The ask, when `signed`'s MAC is this key's for exactly these fields.
    pub fn verify_ask<'a>(&self, signed: &'a SignedAsk) -> Result<&'a Ask, AuthError> {
        self.verify(&signed.ask.canonical(), &signed.mac)?;
        Ok(&signed.ask)
    }

    /// Signs a member's answer.
    pub fn sign_answer(&self, answer: &Answer) -> SignedAnswer {
        SignedAnswer {
            answer: answer.clone(),
            mac: self.mac(&answer.canonical()),
        }
    }

    /// The answer, when `signed`'s MAC is this key's for exactly these
    /// fields. Whether it answers the ask the holder sent in this round is
    /// the holder's to check.
    pub fn verify_answer<'a>(&self, signed: &'a SignedAnswer) -> Result<&'a Answer, AuthError> {
        self.verify(&signed.answer.canonical(), &signed.mac)?;
        Ok(&signed.answer)
    }

    fn mac(&self, canonical: &[u8]) -> String {
        to_hex(hmac::sign(&self.key, canonical).as_ref())
    }

    fn verify(&self, canonical: &[u8], mac: &str) -> Result<(), AuthError> {
        let tag = from_hex(mac)
            .filter(|tag| tag.len() == MAC_BYTES)
            .ok_or(AuthError::MacEncoding)?;
        hmac::verify(&self.key, canonical, &tag).map_err(|_| AuthError::Mismatch)
    }
}

impl fmt::Debug for FailsafeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FailsafeKey(fingerprint {})", self.fingerprint())
    }
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be opened or read.
    #[error("failsafe key file {path}: {source}")]
    Read {
        /// The key file.
        path: PathBuf,
        /// The error opening or reading it gave.
        source: io::Error,
    },
    /// The file's group or others may read or write it.
    #[error(
        "failsafe key file {path}: permissions {mode:04o} are too open (its group or others \
         may read or write it); it must be readable by its owner only: `chmod 600 {path}`"
    )]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Fewer than [`MIN_KEY_BYTES`] bytes remain once trailing whitespace
    /// is trimmed.
    #[error(
        "failsafe key file {path} holds {len} bytes (trailing whitespace trimmed), and at \
         least {min} are needed: make one with `head -c 32 /dev/urandom | base64 > {path}` \
         and copy it to every member",
        min = MIN_KEY_BYTES
    )]
    TooShort {
        /// The key file.
        path: PathBuf,
        /// How many bytes it holds, trailing whitespace trimmed.
        len: usize,
    },
}

/// Why a signed ask or answer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The MAC is not 64 lowercase hex digits.
    #[error("the MAC is not an HMAC-SHA-256 in 64 lowercase hex digits")]
    MacEncoding,
    /// The MAC does not match the fields.
    #[error("not signed with this failsafe key, or altered")]
    Mismatch,
}

/// A member of a failsafe lock as F2's set names it: two standbys that
/// share a node name by mistake are still two members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Its node name.
    pub node: String,
    /// Its machine id.
    pub machine: String,
}

/// The holder that asks: a holder restarted is a new instance, which the
/// members refuse (F4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Its node name.
    pub node: String,
    /// Its machine id.
    pub machine: String,
    /// Its instance id (one per process).
    pub instance: String,
}

/// "Holder H asks member M for round R of lock L at token X."
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// The lock.
    pub lock: String,
    /// Who asks.
    pub holder: Holder,
    /// The holder's token, `EPOCH:REVISION` as putex prints tokens.
    pub token: String,
    /// The round a grant extends (F1's s), and no other.
    pub round: u64,
    /// The member asked: a grant counts from it alone.
    pub member: Peer,
}

/// A member's answer to an [`Ask`], which it repeats whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The ask answered.
    pub ask: Ask,
    /// Whether the member grants.
    pub granted: bool,
    /// Why it refuses (or anything it adds to a grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// An ask on the wire: its fields and `mac`, the HMAC-SHA-256 of them in
/// lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedAsk {
    /// The ask.
    #[serde(flatten)]
    pub ask: Ask,
    /// Its MAC, in lowercase hex.
    pub mac: String,
}

/// An answer on the wire: its fields and `mac`, the HMAC-SHA-256 of them
/// in lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedAnswer {
    /// The answer.
    #[serde(flatten)]
    pub answer: Answer,
    /// Its MAC, in lowercase hex.
    pub mac: String,
}

impl Ask {
    /// The bytes an ask's MAC is computed over.
    fn canonical(&self) -> Vec<u8> {
        let mut out = Canonical::new(ASK_TAG);
        self.encode(&mut out);
        out.0
    }

    /// The fields, without a tag: an answer repeats them.
    fn encode(&self, out: &mut Canonical) {
        out.str(&self.lock);
        out.str(&self.holder.node);
        out.str(&self.holder.machine);
        out.str(&self.holder.instance);
        out.str(&self.token);
        out.u64(self.round);
        out.str(&self.member.node);
        out.str(&self.member.machine);
    }
}

impl Answer {
    /// The bytes an answer's MAC is computed over.
    fn canonical(&self) -> Vec<u8> {
        let mut out = Canonical::new(ANSWER_TAG);
        self.ask.encode(&mut out);
        out.bool(self.granted);
        out.optional_str(self.why.as_deref());
        out.0
    }
}

/// The canonical encoding under construction.
struct Canonical(Vec<u8>);

impl Canonical {
    fn new(tag: &[u8]) -> Canonical {
        Canonical(tag.to_vec())
    }

    fn u64(&mut self, n: u64) {
        self.0.extend_from_slice(&n.to_be_bytes());
    }

    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn bool(&mut self, b: bool) {
        self.0.push(u8::from(b));
    }

    fn optional_str(&mut self, s: Option<&str>) {
        self.bool(s.is_some());
        if let Some(s) = s {
            self.str(s);
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        hex.push(char::from(DIGITS[usize::from(b >> 4)]));
        hex.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    hex
}

/// The bytes of lowercase hex; `None` for anything else.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let hex = hex.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> FailsafeKey {
        FailsafeKey::from_secret(&[seed; MIN_KEY_BYTES])
    }

    fn ask() -> Ask {
        Ask {
            lock: "pg".into(),
            holder: Holder {
                node: "db1".into(),
                machine: "m1".into(),
                instance: "i1".into(),
            },
            token: "3:1042".into(),
            round: 7,
            member: Peer {
                node: "db2".into(),
                machine: "m2".into(),
            },
        }
    }

    fn answer(granted: bool, why: Option<&str>) -> Answer {
        Answer {
            ask: ask(),
            granted,
            why: why.map(str::to_string),
        }
    }

    /// A named change to a message.
    type Change<T> = (&'static str, fn(&mut T));

    /// One change to each field of an ask, nested ones included.
    fn ask_changes() -> Vec<Change<Ask>> {
        vec![
            ("lock", |a| a.lock.push('x')),
            ("holder.node", |a| a.holder.node = "db3".into()),
            ("holder.machine", |a| a.holder.machine = "m9".into()),
            ("holder.instance", |a| a.holder.instance = "i2".into()),
            ("token", |a| a.token = "3:1043".into()),
            ("round", |a| a.round += 1),
            ("member.node", |a| a.member.node = "db3".into()),
            ("member.machine", |a| a.member.machine = "m3".into()),
        ]
    }

    #[test]
    fn an_ask_round_trips() {
        let k = key(1);
        let signed = k.sign_ask(&ask());
        assert_eq!(signed.mac.len(), 2 * MAC_BYTES);
        assert!(signed
            .mac
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_eq!(k.verify_ask(&signed), Ok(&ask()));
    }

    #[test]
    fn an_answer_round_trips() {
        let k = key(1);
        for a in [answer(true, None), answer(false, Some("holding it myself"))] {
            let signed = k.sign_answer(&a);
            assert_eq!(k.verify_answer(&signed), Ok(&a));
        }
    }

    #[test]
    fn changing_any_field_of_an_ask_breaks_its_mac() {
        let k = key(1);
        let signed = k.sign_ask(&ask());
        for (field, change) in ask_changes() {
            let mut altered = signed.clone();
            change(&mut altered.ask);
            assert_ne!(altered.ask, ask(), "{field}: no change");
            assert_eq!(k.verify_ask(&altered), Err(AuthError::Mismatch), "{field}");
        }
    }

    #[test]
    fn changing_any_field_of_an_answer_breaks_its_mac() {
        let k = key(1);
        let cases: Vec<(Answer, Change<Answer>)> = vec![
            (answer(true, None), ("granted", |a| a.granted = false)),
            (answer(false, Some("no")), ("refused", |a| a.granted = true)),
            (
                answer(true, None),
                ("why added", |a| a.why = Some("x".into())),
            ),
            (
                answer(true, None),
                ("why empty", |a| a.why = Some(String::new())),
            ),
            (
                answer(false, Some("no")),
                ("why changed", |a| a.why = Some("na".into())),
            ),
            (answer(false, Some("no")), ("why removed", |a| a.why = None)),
        ];
        for (original, (what, change)) in cases {
            let mut altered = k.sign_answer(&original);
            change(&mut altered.answer);
            assert_ne!(altered.answer, original, "{what}: no change");
            assert_eq!(
                k.verify_answer(&altered),
                Err(AuthError::Mismatch),
                "{what}"
            );
        }
        let signed = k.sign_answer(&answer(true, None));
        for (field, change) in ask_changes() {
            let mut altered = signed.clone();
            change(&mut altered.answer.ask);
            assert_eq!(
                k.verify_answer(&altered),
                Err(AuthError::Mismatch),
                "ask.{field}"
            );
        }
    }

    #[test]
    fn lengths_keep_neighbouring_fields_apart() {
        let k = key(1);
        let signed = k.sign_ask(&ask());
        let mut moved = signed.clone();
        // "db1" "m1" becomes "db" "1m1": the same bytes in a row.
        moved.ask.holder.node = "db".into();
        moved.ask.holder.machine = "1m1".into();
        assert_eq!(k.verify_ask(&moved), Err(AuthError::Mismatch));
        assert_ne!(k.sign_ask(&moved.ask).mac, signed.mac);
    }

    #[test]
    fn an_ask_mac_is_no_answer_mac_nor_the_other_way_round() {
        let k = key(1);
        let signed_ask = k.sign_ask(&ask());
        for a in [answer(true, None), answer(false, None)] {
            let forged = SignedAnswer {
                answer: a.clone(),
                mac: signed_ask.mac.clone(),
            };
            assert_eq!(k.verify_answer(&forged), Err(AuthError::Mismatch));
            let forged = SignedAsk {
                ask: ask(),
                mac: k.sign_answer(&a).mac,
            };
            assert_eq!(k.verify_ask(&forged), Err(AuthError::Mismatch));
        }
    }

    #[test]
    fn another_key_is_refused() {
        let signed_ask = key(1).sign_ask(&ask());
        let signed_answer = key(1).sign_answer(&answer(true, None));
        assert_eq!(key(2).verify_ask(&signed_ask), Err(AuthError::Mismatch));
        assert_eq!(
            key(2).verify_answer(&signed_answer),
            Err(AuthError::Mismatch)
        );
        assert_ne!(key(1).fingerprint(), key(2).fingerprint());
    }

    #[test]
    fn a_mac_that_is_not_lowercase_hex_is_an_encoding_error() {
        let k = key(1);
        let good = k.sign_ask(&ask()).mac;
        for bad in [
            String::new(),
            "zz".to_string(),
            good.to_uppercase(),
            good[1..].to_string(),
            good[2..].to_string(),
            format!("{good}00"),
            format!("{}g", &good[1..]),
            format!(" {}", &good[1..]),
        ] {
            let signed = SignedAsk {
                ask: ask(),
                mac: bad.clone(),
            };
            assert_eq!(
                k.verify_ask(&signed),
                Err(AuthError::MacEncoding),
                "{bad:?}"
            );
            let signed = SignedAnswer {
                answer: answer(true, None),
                mac: bad.clone(),
            };
            assert_eq!(
                k.verify_answer(&signed),
                Err(AuthError::MacEncoding),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)), Some(bytes));
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    #[test]
    fn signed_messages_survive_json() {
        let k = key(1);
        let signed = k.sign_ask(&ask());
        let json = serde_json::to_string(&signed).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        // Flattened: the ask's fields beside the MAC.
        assert_eq!(value["lock"], "pg");
        assert_eq!(value["round"], 7);
        assert_eq!(value["member"]["machine"], "m2");
        assert_eq!(value["mac"], signed.mac.as_str());
        let back: SignedAsk = serde_json::from_str(&json).unwrap();
        assert_eq!(k.verify_ask(&back), Ok(&ask()));

        for a in [answer(true, None), answer(false, Some("a newer holder"))] {
            let signed = k.sign_answer(&a);
            let json = serde_json::to_string(&signed).unwrap();
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(value["granted"], a.granted);
            assert_eq!(value["ask"]["holder"]["instance"], "i1");
            assert_eq!(value["mac"], signed.mac.as_str());
            let back: SignedAnswer = serde_json::from_str(&json).unwrap();
            assert_eq!(k.verify_answer(&back), Ok(&a));
        }
    }

    // The key file.

    /// Writes `contents` to a file of mode `mode` in `dir`.
    fn key_file(dir: &tempfile::TempDir, name: &str, contents: &[u8], mode: u32) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        #[cfg(not(unix))]
        let _ = mode;
        path
    }

    const SECRET: &[u8] = b"hW4pR9vXq2LmZ8sT1nB6yK3cF7gJ0dUaE5oQiV+w/2M=";

    #[test]
    fn a_missing_key_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let err = FailsafeKey::from_file(&path).unwrap_err();
        assert!(matches!(err, KeyError::Read { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("No such file"), "{message}");
    }

    #[test]
    fn a_short_key_is_refused_with_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_file(&dir, "short", b"0123456789012345678901234567890\n", 0o600);
        let err = FailsafeKey::from_file(&path).unwrap_err();
        assert!(matches!(err, KeyError::TooShort { len: 31, .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("holds 31 bytes"), "{message}");
        assert!(message.contains("at least 32"), "{message}");
        assert!(message.contains("head -c 32 /dev/urandom"), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_may_read_or_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_file(&dir, "open", SECRET, 0o644);
        let err = FailsafeKey::from_file(&path).unwrap_err();
        assert!(
            matches!(err, KeyError::Permissions { mode: 0o644, .. }),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("0644"), "{message}");
        assert!(message.contains("chmod 600"), "{message}");
        for mode in [0o640, 0o620, 0o604, 0o602, 0o660] {
            let path = key_file(&dir, &format!("mode-{mode:o}"), SECRET, mode);
            let err = FailsafeKey::from_file(&path).unwrap_err();
            assert!(matches!(err, KeyError::Permissions { .. }), "{mode:o}");
        }
        for mode in [0o600, 0o400] {
            let path = key_file(&dir, &format!("mode-{mode:o}"), SECRET, mode);
            FailsafeKey::from_file(&path).unwrap();
        }
    }

    #[test]
    fn a_private_key_file_is_read_and_its_trailing_whitespace_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let bare = FailsafeKey::from_file(&key_file(&dir, "bare", SECRET, 0o600)).unwrap();
        let with_newline = [SECRET, b"\n"].concat();
        let with_newline =
            FailsafeKey::from_file(&key_file(&dir, "newline", &with_newline, 0o600)).unwrap();
        let with_crlf = [SECRET, b" \t\r\n"].concat();
        let with_crlf = FailsafeKey::from_file(&key_file(&dir, "crlf", &with_crlf, 0o600)).unwrap();
        let signed = bare.sign_ask(&ask());
        assert_eq!(with_newline.sign_ask(&ask()), signed);
        assert_eq!(with_crlf.sign_ask(&ask()), signed);
        assert_eq!(with_newline.verify_ask(&signed), Ok(&ask()));
        assert_eq!(bare.fingerprint(), with_newline.fingerprint());
        assert_eq!(
            bare.sign_ask(&ask()),
            FailsafeKey::from_secret(SECRET).sign_ask(&ask())
        );
        // Exactly 32 bytes will do.
        let path = key_file(&dir, "exact", &SECRET[..MIN_KEY_BYTES], 0o600);
        FailsafeKey::from_file(&path).unwrap();
    }

    #[test]
    fn debug_shows_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let k = FailsafeKey::from_file(&key_file(&dir, "k", SECRET, 0o600)).unwrap();
        let debug = format!("{k:?}");
        assert_eq!(
            debug,
            format!("FailsafeKey(fingerprint {})", k.fingerprint())
        );
        assert_eq!(k.fingerprint().len(), 8);
        let secret = std::str::from_utf8(SECRET).unwrap();
        assert!(!debug.contains(&secret[..8]), "{debug}");
    }
}
