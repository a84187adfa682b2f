//! How putex names its records in a store.
//!
//! One bucket (NATS) or file (SQLite) holds every record. Keys are
//! dot-separated tokens, valid NATS KV keys (`[-/_=.a-zA-Z0-9]`, no empty
//! token), so the same layout works on every backend and any KV tool can
//! read it:
//!
//! | key | record |
//! |---|---|
//! | `lock.<name>` | the lock record of lock `<name>` |
//! | `member.<name>.<node>` | node `<node>`'s member record for lock `<name>` |
//! | `ctl.<name>` | the operator's standing requests for lock `<name>`: pause, switchover (`putex pause`, `putex switchover`) |
//! | `probe.<node>` | node `<node>`'s probe record (reads the store's clock, S1 b) |
//! | `sem.<name>` | the limit of `putex lock <name>` (`--limit N`, 1 for a plain lock), created once by the first client |
//! | `sem.<name>.<slot>` | slot `<slot>` (0..N−1) of semaphore `<name>`: an ordinary lock record |
//! | `queue.<name>.<instance>` | a waiter's ticket in lock `<name>`'s fair queue |
//! | `once.<name>` | the last recorded successful run of `putex lock <name> --once-per` |
//! | `grant.<resource>.<uid>` | an HTTP lock's title, wait, lifetime and grant time (`putex serve`) |
//! | `cancel.<resource>` | waiting HTTP requests that arrived before its revision were deleted by an administrator |
//! | `id.<pool>.meta` | identity pool `<pool>`'s range (`putex id`) |
//! | `id.<pool>.<n>` | id `<n>` (decimal) of pool `<pool>`: a lock record naming its claimer |
//! | `id.<pool>.name.<name>` | claim name `<name>`'s index record: which id it holds |
//! | `id.<pool>.scan` | a marker that `putex id` writes to read the pool consistently |
//! | `history.<name>.<node>-<instance>-<seq>` | a transition record of lock `<name>` ([`crate::observe::history`]) |
//! | `history.<name>.=scan` | a marker that `putex history` writes to read the records consistently |
//!
//! A name never contains a dot, so `<name>` is
//! exactly one token and a node id — which may be an FQDN such as
//! `db1.example.com` — always comes last: `member.pg.` selects every member
//! of lock `pg` and nothing else.

use std::fmt;

pub use super::names::{Name, NameError, NodeId, MAX_NAME_LEN, MAX_NODE_LEN};

/// The longest key putex accepts, in bytes ([`validate_key`]).
pub const MAX_KEY_LEN: usize = 512;

/// Prefix of every lock record; a watch filter for all locks.
pub const LOCK_PREFIX: &str = "lock.";
/// Prefix of every member record.
pub const MEMBER_PREFIX: &str = "member.";
/// Prefix of the operator's control records.
pub const CONTROL_PREFIX: &str = "ctl.";
/// Prefix of every probe record.
pub const PROBE_PREFIX: &str = "probe.";
/// Prefix of semaphore limit and slot records.
pub const SEM_PREFIX: &str = "sem.";
/// Prefix of the fair queues' tickets.
pub const QUEUE_PREFIX: &str = "queue.";
/// Prefix of the once-per-period records.
pub const ONCE_PREFIX: &str = "once.";
/// Prefix of the HTTP gateway's grant records.
pub const GRANT_PREFIX: &str = "grant.";
/// Prefix of the HTTP gateway's cancel records.
pub const CANCEL_PREFIX: &str = "cancel.";
/// Prefix of the identity pools' records.
pub const ID_PREFIX: &str = "id.";
/// Prefix of the transition records ([`crate::observe::history`]).
pub const HISTORY_PREFIX: &str = "history.";
/// The callers' own keys, written by guarded writes
/// (`crate::locks::guard`).
pub const KV_PREFIX: &str = "kv.";

/// The key of lock `name`'s record.
pub fn lock(name: &Name) -> String {
    format!("{LOCK_PREFIX}{name}")
}

/// The key of `node`'s member record for lock `name`.
pub fn member(name: &Name, node: &NodeId) -> String {
    format!("{MEMBER_PREFIX}{name}.{node}")
}

/// The watch filter selecting every member record of lock `name`.
pub fn members_of(name: &Name) -> String {
    format!("{MEMBER_PREFIX}{name}.")
}

/// The key of semaphore `name`'s limit record.
pub fn semaphore(name: &Name) -> String {
    format!("{SEM_PREFIX}{name}")
}

/// The key of slot `slot` of semaphore `name`: an ordinary lock record.
pub fn slot(name: &Name, slot: u32) -> String {
    format!("{SEM_PREFIX}{name}.{slot}")
}

/// The key of waiter `instance`'s ticket in lock `name`'s queue.
pub fn ticket(name: &Name, instance: &Name) -> String {
    format!("{QUEUE_PREFIX}{name}.{instance}")
}

/// The watch filter selecting every ticket in lock `name`'s queue.
pub fn queue_of(name: &Name) -> String {
    format!("{QUEUE_PREFIX}{name}.")
}

/// The key of HTTP lock `uid`'s grant record on `resource` (`putex serve`).
pub fn grant(resource: &Name, uid: &Name) -> String {
    format!("{GRANT_PREFIX}{resource}.{uid}")
}

/// The key of `resource`'s cancel record: waiting HTTP requests that
/// arrived before its revision were deleted by an administrator.
pub fn cancel(resource: &Name) -> String {
    format!("{CANCEL_PREFIX}{resource}")
}

/// The key of lock `name`'s once-per-period record.
pub fn once(name: &Name) -> String {
    format!("{ONCE_PREFIX}{name}")
}

/// The key of id `n`'s record in identity pool `pool`.
pub fn id_record(pool: &Name, n: u64) -> String {
    format!("{ID_PREFIX}{pool}.{n}")
}

/// The key of claim name `name`'s index record in identity pool `pool`.
/// `name` is validated like a node id (it may be an FQDN) and comes last.
pub fn id_name(pool: &Name, name: &NodeId) -> String {
    format!("{ID_PREFIX}{pool}.name.{name}")
}

/// The key of identity pool `pool`'s meta record (its range).
pub fn id_meta(pool: &Name) -> String {
    format!("{ID_PREFIX}{pool}.meta")
}

/// The key of identity pool `pool`'s scan marker (see
/// [`snapshot_synced`](super::snapshot_synced)).
pub fn id_scan(pool: &Name) -> String {
    format!("{ID_PREFIX}{pool}.scan")
}

/// The watch filter selecting every record of identity pool `pool`.
pub fn id_pool(pool: &Name) -> String {
    format!("{ID_PREFIX}{pool}.")
}

/// The key of transition record `seq` of one writer (`node`, `instance`)
/// for lock `name`: `history.<name>.<node>-<instance>-<seq>`. Only the
/// first 8 characters of `instance` are used; `seq` is zero-padded to 8
/// digits, so that one writer's records sort in order (readers order by
/// store revision anyway).
pub fn history(name: &Name, node: &NodeId, instance: &Name, seq: u64) -> String {
    let instance: String = instance.chars().take(8).collect();
    format!("{HISTORY_PREFIX}{name}.{node}-{instance}-{seq:08}")
}

/// The watch filter selecting every transition record of lock `name`.
pub fn history_of(name: &Name) -> String {
    format!("{HISTORY_PREFIX}{name}.")
}

/// The key of lock `name`'s history scan marker (see
/// [`snapshot_synced`](super::snapshot_synced)): `=` is neither a name nor
/// a node character, so it is never a transition record's key.
pub fn history_scan(name: &Name) -> String {
    format!("{HISTORY_PREFIX}{name}.=scan")
}

/// The key of `node`'s probe record.
/// The key of lock `name`'s control record (`putex pause`, `putex switchover`).
pub fn control(name: &Name) -> String {
    format!("{CONTROL_PREFIX}{name}")
}

/// The key of node `node`'s probe record.
pub fn probe(node: &NodeId) -> String {
    format!("{PROBE_PREFIX}{node}")
}

/// A key the stores refuse, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    key: String,
    problem: &'static str,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid store key {:?}: {}; keys are dot-separated non-empty tokens of A-Z a-z 0-9 - _ / = (for example \"lock.pg\")",
            self.key, self.problem
        )
    }
}

impl std::error::Error for KeyError {}

/// Checks a store key: what NATS KV accepts, on every backend alike.
pub fn validate_key(key: &str) -> Result<(), KeyError> {
    let err = |problem| {
        Err(KeyError {
            key: key.to_owned(),
            problem,
        })
    };
    if key.is_empty() {
        return err("it is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return err("it is too long");
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c))
    {
        return err("it has a character outside A-Z a-z 0-9 - / _ = .");
    }
    if key.split('.').any(str::is_empty) {
        return err("it has an empty token (a leading, trailing or double dot)");
    }
    Ok(())
}

/// Checks a watch filter: `""` (everything), a key, or a key prefix ending
/// in one `.`.
pub fn validate_filter(filter: &str) -> Result<(), KeyError> {
    match filter.strip_suffix('.') {
        None if filter.is_empty() => Ok(()),
        None => validate_key(filter),
        Some(stem) => validate_key(stem).map_err(|e| KeyError {
            key: filter.to_owned(),
            ..e
        }),
    }
}

/// Whether `key` is selected by a (valid) watch `filter`.
pub fn filter_matches(filter: &str, key: &str) -> bool {
    if filter.is_empty() {
        true
    } else if filter.ends_with('.') {
        key.starts_with(filter) && key.len() > filter.len()
    } else {
        key == filter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        s.parse().unwrap()
    }

    fn node(s: &str) -> NodeId {
        s.parse().unwrap()
    }

    #[test]
    fn layout() {
        assert_eq!(lock(&name("pg")), "lock.pg");
        assert_eq!(
            member(&name("pg"), &node("db1.example.com")),
            "member.pg.db1.example.com"
        );
        assert_eq!(probe(&node("db1.example.com")), "probe.db1.example.com");
        let f = members_of(&name("pg"));
        assert!(filter_matches(&f, "member.pg.db1.example.com"));
        assert!(!filter_matches(&f, "member.pgx.db1"));
        assert!(!filter_matches(&f, "member.pg."));
        for k in ["lock.pg", "member.pg.db1.example.com", "probe.a"] {
            validate_key(k).unwrap();
        }
        assert_eq!(id_record(&name("web"), 7), "id.web.7");
        assert_eq!(
            id_name(&name("web"), &node("web1.example.com")),
            "id.web.name.web1.example.com"
        );
        assert!(filter_matches(
            &id_pool(&name("web")),
            "id.web.name.web1.example.com"
        ));
        assert!(!filter_matches(&id_pool(&name("web")), "id.webx.7"));
    }

    #[test]
    fn history_layout() {
        let k = history(
            &name("pg"),
            &node("db1.example.com"),
            &name("0123456789abcdef"),
            7,
        );
        assert_eq!(k, "history.pg.db1.example.com-01234567-00000007");
        validate_key(&k).unwrap();
        let f = history_of(&name("pg"));
        let scan = history_scan(&name("pg"));
        validate_key(&scan).unwrap();
        assert!(filter_matches(&f, &k) && filter_matches(&f, &scan));
        assert!(!filter_matches(&f, "history.pgx.a-0-00000001"));
        // The marker can never be a record's key: `=` is no node character.
        assert!(NodeId::new("=scan").is_err());
    }

    #[test]
    fn keys_and_filters() {
        for bad in ["", ".a", "a.", "a..b", "a b", "a*", "a>", "ä"] {
            assert!(validate_key(bad).is_err(), "{bad:?}");
        }
        for ok in ["", "lock.", "lock.pg", "member.pg."] {
            validate_filter(ok).unwrap();
        }
        for bad in ["..", ".", "lock..", "a*."] {
            assert!(validate_filter(bad).is_err(), "{bad:?}");
        }
        assert!(filter_matches("", "x"));
        assert!(filter_matches("lock.pg", "lock.pg"));
        assert!(!filter_matches("lock.pg", "lock.pg2"));
    }
}
