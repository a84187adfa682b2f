//! Free loopback ports for servers that bind them later than the test
//! picks them (PostgreSQL nodes, nats-server routes, HTTP endpoints).

use std::net::TcpListener;

/// A free loopback port for a server that binds it much later (a node's
/// server starts when its agent activates or follows it). Taken below the
/// kernel's ephemeral range (`ip_local_port_range`, from 32768 by default),
/// never from it: an outgoing connection — a replica's WAL receiver, a
/// client — may be given an ephemeral port as its own source port in the
/// meantime, and the server's bind then fails for as long as that
/// connection lives (seen: a replica that could not start in 30 s).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Processes running tests side by side start at different places.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = std::process::id() % 1_000 * 12;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..12_000 {
        let port = 20_000 + (NEXT.fetch_add(1, Ordering::SeqCst) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000-31999")
}
