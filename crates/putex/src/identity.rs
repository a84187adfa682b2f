//! Who and where this process is: the readers of the host's identity.
//!
//! Every lock holder names itself with a node id (default: the host name),
//! a machine id (S5: two machines must not share a node id), an instance id
//! (one per start, S5) and, for the host state file, the boot id (a tree
//! recorded before a reboot is gone). They are read here and nowhere else.

use std::sync::Mutex;

/// This host's name, the default node id.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `/etc/machine-id`, or a stand-in where there is none.
///
/// `PUTEX_MACHINE_ID`, when set and not empty, replaces it. It is a test
/// knob (the end-to-end tests run two "machines" on one host to check the
/// duplicate-node-id refusal, S5); never set it in production, where two
/// hosts must never share a machine id.
pub fn machine_id() -> String {
    if let Some(id) = std::env::var("PUTEX_MACHINE_ID")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
    {
        return id;
    }
    std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-machine".into())
}

/// A fresh random id for this start: the kernel's random UUID without its
/// dashes (32 hex digits), or `<pid>-<n>` where the kernel offers none
/// that reads as one.
pub fn instance_id() -> String {
    static FALLBACK: Mutex<u64> = Mutex::new(0);
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .ok()
        .map(|s| s.trim().replace('-', ""))
        .filter(|s| (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(|| {
            let mut n = FALLBACK.lock().expect("not poisoned");
            *n += 1;
            format!("{}-{}", std::process::id(), n)
        })
}

/// [`instance_id`] as a key token (a waiter's ticket, a history writer's
/// keys): alphanumerics, or digits and a dash, so always a name.
pub fn instance_name() -> crate::store::Name {
    crate::store::Name::new(instance_id()).expect("alphanumerics, or digits and a dash")
}
