//! A controllable TCP proxy for fault tests: it stands between a client (a
//! store handle, a putex agent) and its nats-server and, on command, loses,
//! holds, delays or resets the traffic of every connection through it.
//!
//! ```ignore
//! let proxy = Proxy::start(server_addr).await?;
//! let store = AnyStore::open(&StoreUrl::parse(&proxy.url())?).await?;
//! proxy.set(Mode::Blackhole); // the store hears nothing, and sees no error
//! proxy.set(Mode::Pass);      // new bytes flow again, on the same connection
//! ```
//!
//! A test that is not async starts one with [`Proxy::start_blocking`]: the
//! proxy then runs on a runtime of its own.
//!
//! How a mode applies:
//!
//! - Each direction of each connection reads whatever its sender writes, at
//!   once, in every mode (so nothing waits in kernel buffers to leak out
//!   later), and applies the mode current **when the proxy reads** a chunk:
//!   a byte written after [`Proxy::set`] returns is under the new mode.
//! - Bytes already accepted for delivery when the mode changes follow the
//!   new mode: a mode that drops a direction discards what is still queued
//!   (a [`Mode::Jitter`] backlog) or held; [`Mode::Hold`] takes the queue
//!   into its hold; leaving `Hold` for a mode that forwards delivers the
//!   held bytes, in order, before any newer ones.
//! - A peer's close (end of stream) travels like a byte: after the bytes
//!   before it, held in `Hold`, lost in `Blackhole`.
//! - An I/O error on either side (a peer's reset, a write to a closed peer)
//!   closes both sockets of that connection.
//! - Dropped bytes are dropped as chunks, wherever the mode change falls: a
//!   blackhole set in the middle of a protocol message leaves the receiver
//!   with half of it (a NATS server then closes the connection as a
//!   protocol error). Change modes while the line is idle to lose whole
//!   messages only.
//!
//! Dropping the [`Proxy`] closes its listener and every connection.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// What the proxy does to the traffic of its connections.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Forwards everything, both ways.
    Pass,
    /// Forwards nothing either way: every byte is read and discarded (lost,
    /// never delivered later). Peers see no error, only silence. New
    /// connections are accepted (and connected to the target), silent too.
    /// Back in `Pass`, existing connections carry new bytes again.
    Blackhole,
    /// Resets every connection (`SO_LINGER` 0: both peers get a TCP RST)
    /// and, while set, resets each new connection as soon as it is accepted.
    Reset,
    /// Forwards client→server bytes and drops server→client ones: the
    /// server acts on requests whose answers are lost.
    DropReplies,
    /// Holds every byte, both ways, and delivers them all, in order, when
    /// the mode goes back to one that forwards (delayed delivery: "hold the
    /// traffic for T, then release it").
    Hold,
    /// Delays every chunk by a random time in `[min, max]` (xorshift,
    /// seeded from the port), keeping the order of each direction.
    Jitter {
        /// The least delay.
        min: Duration,
        /// The greatest delay.
        max: Duration,
    },
    /// Cuts the client off: closes every connection (both sockets, without
    /// a reset) and, while set, holds each new connection open and silent
    /// without connecting it to the target; set to another mode, the proxy
    /// closes the held ones and forwards new connections again. (A host
    /// unplugged: what it had is gone, what it tries hangs.)
    Cut,
}

/// A TCP proxy on `127.0.0.1`, forwarding to one target. See the module
/// documentation.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
    /// The runtime of a [`Proxy::start_blocking`] proxy.
    runtime: Option<tokio::runtime::Runtime>,
}

/// Bytes written to the server and to the client, over all connections.
#[derive(Default)]
struct Counters {
    up: AtomicU64,
    down: AtomicU64,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `target`
    /// (e.g. `127.0.0.1:4222`), in [`Mode::Pass`].
    pub async fn start(target: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let counters = Arc::new(Counters::default());
        let seed = splitmix(u64::from(addr.port()));
        let accept = tokio::spawn(accept_loop(listener, target, rx, counters.clone(), seed));
        Ok(Proxy {
            addr,
            mode,
            counters,
            accept,
            runtime: None,
        })
    }

    /// [`Proxy::start`] for a test that is not async: the proxy runs on a
    /// runtime of its own (one worker), shut down with it.
    pub fn start_blocking(target: SocketAddr) -> io::Result<Proxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let mut proxy = runtime.block_on(Proxy::start(target))?;
        proxy.runtime = Some(runtime);
        Ok(proxy)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy as a NATS URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url_as("nats")
    }

    /// The proxy as a store URL of `scheme` (`nats`, `etcd`):
    /// `SCHEME://127.0.0.1:PORT`.
    pub fn url_as(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    /// Switches every connection, current and new, to `mode`. It applies to
    /// bytes the proxy reads from now on; a reset of existing connections
    /// follows within a scheduling round (new ones are refused at once).
    pub fn set(&self, mode: Mode) {
        if let Mode::Jitter { min, max } = mode {
            assert!(min <= max, "jitter: min {min:?} > max {max:?}");
        }
        self.mode.send_replace(mode);
    }

    /// Bytes forwarded so far, over all connections: (client→server,
    /// server→client). Counted when written to the receiving socket.
    pub fn forwarded(&self) -> (u64, u64) {
        (
            self.counters.up.load(Ordering::SeqCst),
            self.counters.down.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Proxy {
    /// Stops the listener and closes every connection (the connection tasks
    /// belong to the accept task; they also end when the mode channel does).
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: watch::Receiver<Mode>,
    counters: Arc<Counters>,
    seed: u64,
) {
    let mut conns = JoinSet::new();
    let mut n: u64 = 0;
    loop {
        let client = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of descriptors and the like: try again shortly.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        match *mode.borrow() {
            Mode::Reset => {
                let _ = client.set_zero_linger();
                continue; // dropped: RST
            }
            Mode::Cut => {
                conns.spawn(held(client, mode.clone()));
                continue;
            }
            _ => {}
        }
        n += 1;
        let seed = splitmix(seed ^ n);
        conns.spawn(connection(
            client,
            target,
            mode.clone(),
            counters.clone(),
            seed,
        ));
    }
}

/// A connection accepted in [`Mode::Cut`]: open and silent, never
/// connected to the target, closed once the mode is another (or the proxy
/// goes).
async fn held(client: TcpStream, mut mode: watch::Receiver<Mode>) {
    while *mode.borrow_and_update() == Mode::Cut {
        if mode.changed().await.is_err() {
            break;
        }
    }
    drop(client);
}

/// Why a connection's forwarding ended early.
enum End {
    /// [`Mode::Reset`]: reset both sockets.
    Reset,
    /// [`Mode::Cut`]: close both sockets.
    Cut,
    /// The proxy is gone.
    Closed,
    /// A read or write failed.
    Io,
}

impl From<io::Error> for End {
    fn from(_: io::Error) -> Self {
        End::Io
    }
}

async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    mode: watch::Receiver<Mode>,
    counters: Arc<Counters>,
    seed: u64,
) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let result = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let up = Pump::new(Dir::Up, mode.clone(), &counters.up, seed).run(cr, sw);
        let down = Pump::new(Dir::Down, mode, &counters.down, splitmix(seed)).run(sr, cw);
        tokio::try_join!(up, down)
    };
    if let Err(End::Reset) = result {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    // Both sockets close here: RST after a reset, FIN otherwise.
}

/// A direction of a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// What a mode means for one direction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Deliver after a delay in `[min, max]`.
    Forward(Duration, Duration),
    Drop,
    Hold,
    Reset,
    /// Close the connection.
    Cut,
}

fn effect(mode: Mode, dir: Dir) -> Effect {
    match mode {
        Mode::Pass => Effect::Forward(Duration::ZERO, Duration::ZERO),
        Mode::Jitter { min, max } => Effect::Forward(min, max),
        Mode::DropReplies if dir == Dir::Up => Effect::Forward(Duration::ZERO, Duration::ZERO),
        Mode::DropReplies | Mode::Blackhole => Effect::Drop,
        Mode::Hold => Effect::Hold,
        Mode::Reset => Effect::Reset,
        Mode::Cut => Effect::Cut,
    }
}

/// A chunk read from one peer, or its end of stream.
enum Item {
    Data(Vec<u8>),
    Eof,
}

/// One direction of one connection.
struct Pump<'a> {
    dir: Dir,
    mode: watch::Receiver<Mode>,
    effect: Effect,
    /// Accepted for delivery, each at its time (non-decreasing is not
    /// required: a chunk waits for the ones before it).
    queue: VecDeque<(Instant, Item)>,
    /// Kept by [`Mode::Hold`].
    held: VecDeque<Item>,
    forwarded: &'a AtomicU64,
    rng: u64,
}

/// What woke a pump.
enum Event {
    ModeChanged(bool),
    Due,
    Read(io::Result<usize>),
}

impl<'a> Pump<'a> {
    fn new(dir: Dir, mode: watch::Receiver<Mode>, forwarded: &'a AtomicU64, seed: u64) -> Self {
        Pump {
            dir,
            mode,
            effect: Effect::Forward(Duration::ZERO, Duration::ZERO),
            queue: VecDeque::new(),
            held: VecDeque::new(),
            forwarded,
            rng: seed | 1,
        }
    }

    async fn run(mut self, mut src: ReadHalf<'_>, mut dst: WriteHalf<'_>) -> Result<(), End> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut src_done = false;
        loop {
            self.sync()?;
            // What is due goes out now: through the timer, a chunk without
            // delay would wait for the next tick, a millisecond or more each
            // way, and `Pass` would slow every round trip by several.
            while self
                .queue
                .front()
                .is_some_and(|(t, _)| *t <= Instant::now())
            {
                if let Some((_, item)) = self.queue.pop_front() {
                    self.deliver(item, &mut dst).await?;
                }
            }
            if src_done && self.queue.is_empty() && self.held.is_empty() {
                return Ok(());
            }
            let due = self.queue.front().map(|(t, _)| *t);
            let event = tokio::select! {
                biased;
                r = self.mode.changed() => Event::ModeChanged(r.is_ok()),
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => Event::Due,
                r = src.read(&mut buf), if !src_done => Event::Read(r),
            };
            match event {
                Event::ModeChanged(true) => {} // applied by sync
                Event::ModeChanged(false) => return Err(End::Closed),
                Event::Due => {
                    if let Some((_, item)) = self.queue.pop_front() {
                        self.deliver(item, &mut dst).await?;
                    }
                }
                Event::Read(r) => {
                    let item = match r? {
                        0 => {
                            src_done = true;
                            Item::Eof
                        }
                        n => Item::Data(buf[..n].to_vec()),
                    };
                    // The mode at the time of arrival.
                    self.sync()?;
                    match self.effect {
                        Effect::Forward(..) => self.enqueue(item),
                        Effect::Hold => self.held.push_back(item),
                        Effect::Drop | Effect::Reset | Effect::Cut => {}
                    }
                }
            }
        }
    }

    /// Writes a chunk (or the end of stream) to the receiving peer.
    async fn deliver(&self, item: Item, dst: &mut WriteHalf<'_>) -> io::Result<()> {
        match item {
            Item::Data(bytes) => {
                dst.write_all(&bytes).await?;
                self.forwarded
                    .fetch_add(bytes.len() as u64, Ordering::SeqCst);
            }
            Item::Eof => dst.shutdown().await?,
        }
        Ok(())
    }

    /// Applies a mode change to what is queued and held.
    fn sync(&mut self) -> Result<(), End> {
        let new = effect(*self.mode.borrow_and_update(), self.dir);
        if new == self.effect {
            return Ok(());
        }
        let old = std::mem::replace(&mut self.effect, new);
        match new {
            Effect::Reset => return Err(End::Reset),
            Effect::Cut => return Err(End::Cut),
            Effect::Drop => {
                self.queue.clear();
                self.held.clear();
            }
            Effect::Hold => {
                // What was queued came first.
                let mut held: VecDeque<Item> = self.queue.drain(..).map(|(_, i)| i).collect();
                held.append(&mut self.held);
                self.held = held;
            }
            // From one forwarding mode to another, the queue keeps its
            // times; new chunks get the new delays.
            Effect::Forward(..) if matches!(old, Effect::Forward(..)) => {}
            Effect::Forward(..) => {
                for item in std::mem::take(&mut self.held) {
                    self.enqueue(item);
                }
            }
        }
        Ok(())
    }

    /// Queues a chunk for delivery after this mode's delay. A chunk queued
    /// behind a later one waits for it, which keeps its delay within
    /// `[min, max]` all the same (the one before it arrived earlier).
    fn enqueue(&mut self, item: Item) {
        let Effect::Forward(min, max) = self.effect else {
            return;
        };
        let span = u64::try_from((max - min).as_nanos()).unwrap_or(u64::MAX);
        let extra = if span == 0 {
            0
        } else {
            self.next_random() % span.saturating_add(1)
        };
        let at = Instant::now() + min + Duration::from_nanos(extra);
        self.queue.push_back((at, item));
    }

    /// xorshift64.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}

/// splitmix64's finaliser: spreads a small seed over all the bits.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    use putex::store::{AnyStore, ReadMode, Store, StoreError, StoreUrl};

    use crate::nats_server::NatsServer;

    /// Long enough to be sure nothing comes on loopback.
    const QUIET: Duration = Duration::from_millis(200);
    /// Long enough for anything expected to come.
    const SOON: Duration = Duration::from_secs(2);

    /// A proxy to a listener the test holds: [`connect`] gives both ends.
    async fn setup() -> (Proxy, TcpListener) {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Proxy::start(target.local_addr().unwrap()).await.unwrap();
        (proxy, target)
    }

    /// A connection through the proxy: (client end, server end).
    async fn connect(proxy: &Proxy, target: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(proxy.addr()).await.unwrap();
        let (server, _) = tokio::time::timeout(SOON, target.accept())
            .await
            .expect("the proxy connects to the target")
            .unwrap();
        (client, server)
    }

    /// Reads exactly `n` bytes within [`SOON`].
    async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        tokio::time::timeout(SOON, s.read_exact(&mut buf))
            .await
            .expect("bytes within 2 s")
            .unwrap();
        buf
    }

    /// Nothing arrives for [`QUIET`] (no bytes, no end, no error).
    async fn silent(s: &mut TcpStream) {
        let mut buf = [0; 64];
        if let Ok(r) = tokio::time::timeout(QUIET, s.read(&mut buf)).await {
            panic!(
                "expected silence, got {r:?} {:?}",
                &buf[..*r.as_ref().unwrap_or(&0)]
            );
        }
    }

    /// The connection ends (end of stream or error) within [`SOON`].
    async fn ends(s: &mut TcpStream) -> io::Result<usize> {
        let mut buf = [0; 64];
        let r = tokio::time::timeout(SOON, s.read(&mut buf))
            .await
            .expect("the connection ends within 2 s");
        assert!(!matches!(r, Ok(n) if n > 0), "got bytes: {r:?}");
        r
    }

    #[tokio::test]
    async fn proxy_pass_forwards_both_ways_and_drop_closes() {
        let (proxy, target) = setup().await;
        assert_eq!(
            proxy.url(),
            format!("nats://127.0.0.1:{}", proxy.addr().port())
        );
        let (mut c, mut s) = connect(&proxy, &target).await;
        c.write_all(b"hello").await.unwrap();
        assert_eq!(read_n(&mut s, 5).await, b"hello");
        s.write_all(b"world!").await.unwrap();
        assert_eq!(read_n(&mut c, 6).await, b"world!");
        assert_eq!(proxy.forwarded(), (5, 6));

        // A close travels like a byte: half-closed, the other way still works.
        c.shutdown().await.unwrap();
        assert_eq!(ends(&mut s).await.unwrap(), 0);
        s.write_all(b"late").await.unwrap();
        assert_eq!(read_n(&mut c, 4).await, b"late");

        let (mut c2, mut s2) = connect(&proxy, &target).await;
        let addr = proxy.addr();
        drop(proxy);
        ends(&mut c2).await.ok();
        ends(&mut s2).await.ok();
        ends(&mut c).await.ok();
        // The listener is gone too.
        let deadline = Instant::now() + SOON;
        while TcpStream::connect(addr).await.is_ok() {
            assert!(Instant::now() < deadline, "still accepting after drop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn proxy_blackhole_loses_bytes_and_pass_resumes() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        c.write_all(b"a").await.unwrap();
        assert_eq!(read_n(&mut s, 1).await, b"a");

        proxy.set(Mode::Blackhole);
        c.write_all(b"lost-up").await.unwrap();
        s.write_all(b"lost-down").await.unwrap();
        silent(&mut s).await;
        silent(&mut c).await;
        // A new connection is accepted, and silent too.
        let (mut c2, mut s2) = connect(&proxy, &target).await;
        c2.write_all(b"x").await.unwrap();
        silent(&mut s2).await;
        assert_eq!(proxy.forwarded(), (1, 0));

        // Back to pass: the same connections carry new bytes, and only those.
        proxy.set(Mode::Pass);
        c.write_all(b"b").await.unwrap();
        assert_eq!(read_n(&mut s, 1).await, b"b");
        s.write_all(b"c").await.unwrap();
        assert_eq!(read_n(&mut c, 1).await, b"c");
        c2.write_all(b"y").await.unwrap();
        assert_eq!(read_n(&mut s2, 1).await, b"y");
        silent(&mut s).await;
        silent(&mut c).await;
        assert_eq!(proxy.forwarded(), (3, 1));
    }

    #[tokio::test]
    async fn proxy_hold_delivers_later_in_order() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        proxy.set(Mode::Hold);
        let held_at = Instant::now();
        for chunk in [&b"one"[..], b"two", b"three"] {
            c.write_all(chunk).await.unwrap();
            s.write_all(chunk).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        c.shutdown().await.unwrap(); // the close is held as well
        silent(&mut s).await;
        silent(&mut c).await;
        assert_eq!(proxy.forwarded(), (0, 0));

        proxy.set(Mode::Pass);
        assert_eq!(read_n(&mut s, 11).await, b"onetwothree");
        assert_eq!(ends(&mut s).await.unwrap(), 0, "then the held close");
        assert_eq!(read_n(&mut c, 11).await, b"onetwothree");
        assert!(held_at.elapsed() >= QUIET);
        s.write_all(b"after").await.unwrap();
        assert_eq!(read_n(&mut c, 5).await, b"after");
        assert_eq!(proxy.forwarded(), (11, 16));
    }

    #[tokio::test]
    async fn proxy_reset_resets_and_refuses_while_set() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        c.write_all(b"a").await.unwrap();
        assert_eq!(read_n(&mut s, 1).await, b"a");

        proxy.set(Mode::Reset);
        let e = ends(&mut c).await.expect_err("the client gets a reset");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        let e = ends(&mut s).await.expect_err("the server gets a reset");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");

        // New connections are reset at once and never reach the target.
        let mut c2 = TcpStream::connect(proxy.addr()).await.unwrap();
        let e = ends(&mut c2).await.expect_err("reset");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
        assert!(
            tokio::time::timeout(QUIET, target.accept()).await.is_err(),
            "reached the target"
        );

        proxy.set(Mode::Pass);
        let (mut c3, mut s3) = connect(&proxy, &target).await;
        c3.write_all(b"b").await.unwrap();
        assert_eq!(read_n(&mut s3, 1).await, b"b");
    }

    #[tokio::test]
    async fn proxy_drop_replies_is_one_way() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        proxy.set(Mode::DropReplies);
        c.write_all(b"req").await.unwrap();
        assert_eq!(read_n(&mut s, 3).await, b"req");
        s.write_all(b"rep").await.unwrap();
        silent(&mut c).await;
        assert_eq!(proxy.forwarded(), (3, 0));

        proxy.set(Mode::Pass);
        s.write_all(b"x").await.unwrap();
        assert_eq!(read_n(&mut c, 1).await, b"x");
        silent(&mut c).await;
    }

    #[tokio::test]
    async fn proxy_jitter_delays_within_bounds_in_order() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        let (min, max) = (Duration::from_millis(20), Duration::from_millis(60));
        proxy.set(Mode::Jitter { min, max });
        let sent = Instant::now();
        c.write_all(b"0").await.unwrap();
        assert_eq!(read_n(&mut s, 1).await, b"0");
        let took = sent.elapsed();
        assert!(took >= min, "{took:?}");
        assert!(took < max + Duration::from_secs(1), "{took:?}");

        let mut want = Vec::new();
        for i in 0..20u8 {
            let chunk = [b'a' + i; 3];
            c.write_all(&chunk).await.unwrap();
            want.extend_from_slice(&chunk);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(read_n(&mut s, want.len()).await, want);
        proxy.set(Mode::Pass);
        s.write_all(b"back").await.unwrap();
        assert_eq!(read_n(&mut c, 4).await, b"back");
    }

    #[tokio::test]
    async fn proxy_cut_closes_and_holds_new_connections_until_another_mode() {
        let (proxy, target) = setup().await;
        let (mut c, mut s) = connect(&proxy, &target).await;
        c.write_all(b"a").await.unwrap();
        assert_eq!(read_n(&mut s, 1).await, b"a");

        proxy.set(Mode::Cut);
        // Closed at both ends, without a reset.
        assert_eq!(ends(&mut c).await.unwrap(), 0);
        assert_eq!(ends(&mut s).await.unwrap(), 0);
        // A new connection is accepted, hears nothing and never reaches
        // the target.
        let mut c2 = TcpStream::connect(proxy.addr()).await.unwrap();
        c2.write_all(b"x").await.unwrap();
        silent(&mut c2).await;
        assert!(
            tokio::time::timeout(QUIET, target.accept()).await.is_err(),
            "reached the target"
        );

        // Another mode: the held connection is closed, new ones forwarded.
        proxy.set(Mode::Pass);
        let _ = ends(&mut c2).await;
        let (mut c3, mut s3) = connect(&proxy, &target).await;
        c3.write_all(b"b").await.unwrap();
        assert_eq!(read_n(&mut s3, 1).await, b"b");
    }

    /// Started outside any runtime: it forwards on its own.
    #[test]
    fn proxy_start_blocking_needs_no_runtime_of_the_callers() {
        use std::io::{Read, Write};
        let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy::start_blocking(target.local_addr().unwrap()).unwrap();
        assert_eq!(
            proxy.url_as("etcd"),
            format!("etcd://127.0.0.1:{}", proxy.addr().port())
        );
        let mut c = std::net::TcpStream::connect(proxy.addr()).unwrap();
        let (mut s, _) = target.accept().unwrap();
        s.set_read_timeout(Some(SOON)).unwrap();
        c.write_all(b"hi").unwrap();
        let mut buf = [0; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    /// A store through the proxy: a blackhole makes calls unknown (and the
    /// client sees no error), back in pass the store works again; a reset
    /// makes the client reconnect once the proxy lets it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxy_cuts_a_nats_store_off() {
        let server = NatsServer::start();
        let target: SocketAddr = format!("127.0.0.1:{}", server.port()).parse().unwrap();
        let proxy = Proxy::start(target).await.unwrap();
        let store = AnyStore::open(&StoreUrl::parse(&proxy.url()).unwrap())
            .await
            .unwrap();
        let t = Duration::from_secs(2);
        store.put("probe.p1", b"one", t).await.unwrap();
        let short = Duration::from_millis(300);
        // A new bucket is made to allow per-message TTLs beside the open
        // (two requests of the handle's own): only once that is done is
        // the handle idle, and a blackhole the only reason nothing passes.
        let AnyStore::Nats(nats) = &store else {
            unreachable!("a NATS URL")
        };
        let idle_by = Instant::now() + Duration::from_secs(5);
        while !nats.retires_leave_nothing() && Instant::now() < idle_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            nats.retires_leave_nothing(),
            "the bucket never allowed TTLs"
        );

        proxy.set(Mode::Blackhole);
        let before = proxy.forwarded();
        match store.get("probe.p1", ReadMode::Leader, short).await {
            Err(StoreError::Unknown { .. }) => {}
            other => panic!("a get through a blackhole: {other:?}"),
        }
        assert_eq!(proxy.forwarded(), before, "nothing passed");

        proxy.set(Mode::Pass);
        let back = works_again(&store, "probe.p1", b"one").await;
        eprintln!("proxy: the store works again {back:?} after the blackhole");

        proxy.set(Mode::Reset);
        match store.get("probe.p1", ReadMode::Leader, short).await {
            Err(StoreError::Unknown { .. }) => {}
            other => panic!("a get through a reset: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.set(Mode::Pass);
        let back = works_again(&store, "probe.p1", b"one").await;
        eprintln!("proxy: the store works again {back:?} after the reset");
        store.put("probe.p1", b"two", t).await.unwrap();
    }

    /// Polls `get` until it answers `value` (within 5 s); returns how long.
    async fn works_again(store: &AnyStore, key: &str, value: &[u8]) -> Duration {
        let start = Instant::now();
        loop {
            match store
                .get(key, ReadMode::Leader, Duration::from_millis(300))
                .await
            {
                Ok(Some(e)) => {
                    assert_eq!(e.value, value);
                    return start.elapsed();
                }
                Ok(None) => panic!("{key} is gone"),
                Err(e) => {
                    assert!(e.is_unknown(), "{e}");
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "still failing: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
