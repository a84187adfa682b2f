//! Free loopback ports for servers that bind them later than the test
//! picks them (PostgreSQL nodes, nats-server routes, etcd, HTTP endpoints).
//!
//! A port picked here is bound only when its server starts, seconds later,
//! so a bind check alone cannot keep two test processes running side by
//! side (the suite, the PostgreSQL versions' runs, the chaos suite) from
//! picking the same one — seen: PostgreSQL 13's run and the suite's
//! cluster, one postmaster refused with "Address already in use". Ports
//! are therefore handed out in blocks, and a process holds each block it
//! uses by an advisory lock (`flock`) on a file named after the block in
//! a directory of the user's under `/tmp`, for as long as it lives: the
//! kernel lets the lock go when the process ends, however it ends. Other
//! processes skip a held block. Where that directory cannot be made, every
//! block counts as free and only the bind check remains.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// The ports handed out: below the kernel's ephemeral range
/// (`ip_local_port_range`, from 32768 by default), never from it — an
/// outgoing connection (a replica's WAL receiver, a client) may be given
/// an ephemeral port as its own source port in the meantime, and the
/// server's bind then fails for as long as that connection lives (seen: a
/// replica that could not start in 30 s).
const FIRST_PORT: u32 = 20_000;
const PORTS: u32 = 12_000;
/// Ports per block: one lock file (and one open file) per 40 ports used.
const BLOCK: u32 = 40;
const BLOCKS: u32 = PORTS / BLOCK;

/// This process's share of the ports.
struct Blocks {
    /// The block ports come from now, and its next port's offset.
    current: Option<(u32, u32)>,
    /// Where the search for the next block starts.
    cursor: u32,
    /// The blocks this process holds, with their locked files (kept open:
    /// closing one would let the lock go).
    held: Vec<(u32, Option<File>)>,
}

static BLOCKS_HELD: Mutex<Blocks> = Mutex::new(Blocks {
    current: None,
    cursor: u32::MAX,
    held: Vec::new(),
});

/// A free loopback port in 20000–31999 that no other test process of this
/// user has picked (see the module docs) and nothing listens on now.
pub fn free_port() -> u16 {
    let mut blocks = BLOCKS_HELD.lock().unwrap_or_else(|e| e.into_inner());
    if blocks.cursor == u32::MAX {
        // Processes start at different places, so that they seldom try
        // the same block first.
        blocks.cursor = std::process::id() % BLOCKS;
    }
    for _ in 0..PORTS {
        let (block, next) = match blocks.current {
            Some((block, next)) if next < BLOCK => (block, next),
            _ => (claim_block(&mut blocks), 0),
        };
        blocks.current = Some((block, next + 1));
        let port = u16::try_from(FIRST_PORT + block * BLOCK + next).expect("below 32000");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-31999")
}

/// The next block this process may take ports from: one it holds already
/// or one it can lock now, searching on from the cursor. When every other
/// block is held by another process, its own come round again.
fn claim_block(blocks: &mut Blocks) -> u32 {
    let dir = lock_dir();
    for i in 0..BLOCKS {
        let block = (blocks.cursor + i) % BLOCKS;
        if blocks.held.iter().any(|(b, _)| *b == block) {
            blocks.cursor = block + 1;
            return block;
        }
        let Some(dir) = &dir else {
            blocks.held.push((block, None));
            blocks.cursor = block + 1;
            return block;
        };
        let path = dir.join(format!("block-{block}"));
        let Ok(file) = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        if file.try_lock().is_ok() {
            blocks.held.push((block, Some(file)));
            blocks.cursor = block + 1;
            return block;
        }
    }
    // Every block is someone's: take the next of this process's own (or,
    // holding none, the next one at all, with the bind check alone).
    let block = blocks.cursor % BLOCKS;
    blocks.cursor = block + 1;
    block
}

/// `/tmp/putex-test-ports-UID`, made if missing; `None` if it cannot be.
fn lock_dir() -> Option<PathBuf> {
    let uid = nix::unistd::getuid();
    let dir = PathBuf::from(format!("/tmp/putex-test-ports-{uid}"));
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_in_range_and_their_blocks_are_held() {
        let ports: Vec<u16> = (0..100).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
        assert!(
            ports.iter().all(|p| (20_000..32_000).contains(p)),
            "{ports:?}"
        );
        // Another open file description of a held block's file cannot lock
        // it: another process would skip the block.
        let blocks = BLOCKS_HELD.lock().unwrap();
        let (block, file) = blocks.held.first().expect("a block held");
        if file.is_some() {
            let path = lock_dir().unwrap().join(format!("block-{block}"));
            let again = File::options().write(true).open(path).unwrap();
            assert!(again.try_lock().is_err(), "block {block} is not held");
        }
    }
}
