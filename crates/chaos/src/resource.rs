//! The fenced resource the harness owns, and the service that writes to it.
//!
//! The resource is a TCP service on `127.0.0.1`: one connection per running
//! service. It stands for whatever a real deployment protects (a database
//! primary, a queue consumer): it accepts writes tagged with a fencing token
//! and rejects any token lower than the highest it has accepted, as
//! `docs/safety.md` §6 asks of a protected resource.
//!
//! The protocol is lines of text, service → resource:
//!
//! ```text
//! start NODE EPOCH:REVISION PID     the service started (also a fenced write)
//! w EPOCH:REVISION SEQ              one fenced write, every ~50 ms
//! ```
//!
//! and the end of the connection, which the kernel delivers when the service
//! process dies however it dies (SIGKILL included). So the harness's own
//! clock sees every start and every stop: a service "runs" from its `start`
//! line to its connection's end. A frozen service (SIGSTOP) keeps its
//! connection open, so it counts as running, which is what it is to a
//! resource that cannot tell a slow holder from a dead one.
//!
//! **One clock, one thread.** A single thread polls the listener and every
//! connection, and stamps everything that one `poll(2)` returned with the
//! same instant. Events that the kernel had queued before that return share
//! a stamp, so a stop that happened before a start can never be stamped
//! after it (which on a busy machine two tokio tasks could do): the overlap
//! checker needs no tolerance against the harness's own scheduling.
//!
//! **Fencing.** A write (or a start) is accepted if its token is above the
//! highest accepted so far, or equal to it and from the same connection (the
//! tenure that set it). Anything else is rejected and logged with the
//! highest token at the time.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// A fencing token `(epoch, revision)`, compared as a pair.
pub type Tok = (u64, u64);

/// Parses `EPOCH:REVISION`.
pub fn parse_token(s: &str) -> Option<Tok> {
    let (e, r) = s.split_once(':')?;
    Some((e.parse().ok()?, r.parse().ok()?))
}

/// Shows a token as `EPOCH:REVISION` with the epoch shortened to its last
/// six digits (epochs are creation times in nanoseconds).
pub fn show_token(t: Tok) -> String {
    format!("…{:06}:{}", t.0 % 1_000_000, t.1)
}

/// What happened, on the harness clock.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    /// A service connected and said `start`.
    Start {
        /// Its node (`PUTEX_NODE`).
        node: String,
        /// Its fencing token.
        token: Tok,
        /// Its process id.
        pid: i32,
        /// Whether the resource accepted the start as a write.
        accepted: bool,
    },
    /// A fenced write.
    Write {
        /// The token it carried.
        token: Tok,
        /// Accepted, or rejected as stale.
        accepted: bool,
        /// The highest accepted token when it arrived.
        highest: Option<Tok>,
    },
    /// The service's connection ended: it stopped (or died).
    Stop,
    /// A fault the harness injected (or ended), for the report and the
    /// failover timer.
    Fault {
        /// What, e.g. `crash n2`.
        text: String,
    },
}

/// One event: the harness-clock instant, the connection (0 for faults) and
/// what happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Nanoseconds on the harness clock.
    pub at: u64,
    /// The connection it belongs to (services); 0 for harness events.
    pub conn: u64,
    /// What happened.
    pub what: What,
}

/// The recorded history of one run: shared by the resource thread and the
/// scenario that injects faults.
#[derive(Clone)]
pub struct History {
    base: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History {
            base: Instant::now(),
            events: Arc::default(),
        }
    }

    /// The harness clock: nanoseconds since the history began.
    pub fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    /// Records a harness event now and returns its instant.
    pub fn fault(&self, text: impl Into<String>) -> u64 {
        let at = self.now();
        self.push(Event {
            at,
            conn: 0,
            what: What::Fault { text: text.into() },
        });
        at
    }

    /// Everything so far, in the order recorded (non-decreasing `at` for
    /// the resource's own events).
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Services running now: (connection, node, token, pid), oldest first.
    pub fn running(&self) -> Vec<(u64, String, Tok, i32)> {
        let mut open: Vec<(u64, String, Tok, i32)> = Vec::new();
        for e in self.events() {
            match e.what {
                What::Start {
                    node, token, pid, ..
                } => open.push((e.conn, node, token, pid)),
                What::Stop => open.retain(|(c, ..)| *c != e.conn),
                _ => {}
            }
        }
        open
    }

    /// Waits until the `n`-th start (1-based) and returns (instant, node).
    pub fn wait_start(&self, n: usize, within: Duration) -> Option<(u64, String)> {
        let until = Instant::now() + within;
        loop {
            let found = self
                .events()
                .into_iter()
                .filter_map(|e| match e.what {
                    What::Start { node, .. } => Some((e.at, node)),
                    _ => None,
                })
                .nth(n - 1);
            if found.is_some() {
                return found;
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The fenced resource: a listener and the thread that serves it.
pub struct Resource {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Resource {
    /// Listens on `127.0.0.1:0` and records into `history`.
    pub fn start(history: History) -> std::io::Result<Resource> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("resource".into())
            .spawn(move || serve(listener, history, flag))?;
        Ok(Resource {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where services connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Conn {
    id: u64,
    stream: TcpStream,
    buf: Vec<u8>,
    started: bool,
}

/// The fencing state: the highest accepted token and the connection that
/// set it.
#[derive(Default)]
struct Fence {
    highest: Option<(Tok, u64)>,
}

impl Fence {
    fn offer(&mut self, token: Tok, conn: u64) -> (bool, Option<Tok>) {
        let before = self.highest.map(|(t, _)| t);
        let ok = match self.highest {
            None => true,
            Some((t, c)) => token > t || (token == t && c == conn),
        };
        if ok {
            self.highest = Some((token, conn));
        }
        (ok, before)
    }
}

fn serve(listener: TcpListener, history: History, stop: Arc<AtomicBool>) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut next_id = 1u64;
    let mut fence = Fence::default();
    let mut tokens: HashMap<u64, Tok> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let ready: Vec<bool> = {
            let mut fds = Vec::with_capacity(conns.len() + 1);
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            for c in &conns {
                fds.push(PollFd::new(c.stream.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::from(20u16)) {
                Ok(0) => continue,
                Ok(_) => fds
                    .iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect(),
                Err(_) => continue,
            }
        };
        // One instant for everything this poll returned.
        let at = history.now();
        let mut closed = Vec::new();
        for (i, c) in conns.iter_mut().enumerate() {
            if !ready[i + 1] {
                continue;
            }
            let mut chunk = [0u8; 4096];
            let mut eof = false;
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        eof = true;
                        break;
                    }
                }
            }
            while let Some(nl) = c.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = c.buf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line);
                if let Some(what) = handle_line(line.trim(), c, &mut fence, &mut tokens) {
                    history.push(Event {
                        at,
                        conn: c.id,
                        what,
                    });
                }
            }
            if eof {
                closed.push(c.id);
                if c.started {
                    history.push(Event {
                        at,
                        conn: c.id,
                        what: What::Stop,
                    });
                }
            }
        }
        conns.retain(|c| !closed.contains(&c.id));
        if ready[0] {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if stream.set_nonblocking(true).is_ok() {
                            conns.push(Conn {
                                id: next_id,
                                stream,
                                buf: Vec::new(),
                                started: false,
                            });
                            next_id += 1;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
    }
}

fn handle_line(
    line: &str,
    c: &mut Conn,
    fence: &mut Fence,
    tokens: &mut HashMap<u64, Tok>,
) -> Option<What> {
    let mut it = line.split_whitespace();
    match it.next()? {
        "start" if !c.started => {
            let node = it.next()?.to_owned();
            let token = parse_token(it.next()?)?;
            let pid = it.next()?.parse().ok()?;
            c.started = true;
            tokens.insert(c.id, token);
            let (accepted, _) = fence.offer(token, c.id);
            Some(What::Start {
                node,
                token,
                pid,
                accepted,
            })
        }
        "w" if c.started => {
            let token = parse_token(it.next()?)?;
            let (accepted, highest) = fence.offer(token, c.id);
            Some(What::Write {
                token,
                accepted,
                highest,
            })
        }
        _ => None,
    }
}

/// The service: `chaos service ADDR [--every D] [--for D]`, run as the
/// agent's child (child mode) or as `putex lock`'s CMD. It reads
/// `PUTEX_NODE` and `PUTEX_TOKEN`, says `start`, then writes every `every`
/// until killed (or for `run_for`, then exits 0).
///
/// With `kv` (the `putex` binary), every write is also made in the store
/// itself as a guarded write of the tenure (`putex kv put`, through the
/// `putex lock` that runs this service), under a key of its own:
/// [`GUARDED_PREFIX`]`<revision>.<node>.<seq>` (`<revision>` of the token).
/// A refused write is said on stderr; the next one is tried all the same.
pub fn service(addr: &str, every: Duration, run_for: Option<Duration>, kv: Option<&Path>) -> i32 {
    let node = std::env::var("PUTEX_NODE").unwrap_or_else(|_| "?".into());
    let Some(token) = std::env::var("PUTEX_TOKEN")
        .ok()
        .filter(|t| parse_token(t).is_some())
    else {
        eprintln!("chaos service: no PUTEX_TOKEN in the environment");
        return 2;
    };
    let Ok(mut s) = TcpStream::connect(addr) else {
        eprintln!("chaos service: cannot reach the resource at {addr}");
        return 3;
    };
    let _ = s.set_nodelay(true);
    let started = Instant::now();
    if writeln!(s, "start {node} {token} {}", std::process::id()).is_err() {
        return 3;
    }
    let mut seq = 0u64;
    loop {
        std::thread::sleep(every);
        seq += 1;
        if writeln!(s, "w {token} {seq}").is_err() {
            return 3;
        }
        if let Some(putex) = kv {
            guarded_put(putex, &node, &token, seq);
        }
        if run_for.is_some_and(|d| started.elapsed() >= d) {
            return 0;
        }
    }
}

/// Where the services' guarded writes go in the store (`putex kv` keys).
pub const GUARDED_PREFIX: &str = "chaos.w.";

/// One guarded write of the service: `putex kv put`, its value the token.
fn guarded_put(putex: &Path, node: &str, token: &str, seq: u64) {
    let revision = token.split_once(':').map_or(token, |(_, r)| r);
    let key = format!("{GUARDED_PREFIX}{revision}.{node}.{seq}");
    match std::process::Command::new(putex)
        .args(["kv", "put", &key, token])
        .stdin(std::process::Stdio::null())
        .status()
    {
        Ok(st) if st.success() => {}
        Ok(st) => eprintln!("chaos service: putex kv put {key}: {st}"),
        Err(e) => eprintln!("chaos service: putex kv put {key}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_accepts_higher_and_own_equal_rejects_lower_and_foreign_equal() {
        let mut f = Fence::default();
        assert_eq!(f.offer((1, 5), 1), (true, None));
        assert_eq!(f.offer((1, 5), 1), (true, Some((1, 5))));
        assert_eq!(f.offer((1, 5), 2), (false, Some((1, 5))));
        assert_eq!(f.offer((1, 4), 3), (false, Some((1, 5))));
        assert_eq!(
            f.offer((2, 1), 3),
            (true, Some((1, 5))),
            "a new epoch is higher"
        );
        assert_eq!(f.offer((1, 9), 1), (false, Some((2, 1))));
    }

    #[test]
    fn resource_records_start_writes_and_stop_on_one_clock() {
        let h = History::new();
        let r = Resource::start(h.clone()).unwrap();
        let mut a = TcpStream::connect(r.addr()).unwrap();
        writeln!(a, "start n1 7:10 42").unwrap();
        writeln!(a, "w 7:10 1").unwrap();
        assert!(h.wait_start(1, Duration::from_secs(2)).is_some());
        let mut b = TcpStream::connect(r.addr()).unwrap();
        writeln!(b, "start n2 7:11 43").unwrap();
        assert!(h.wait_start(2, Duration::from_secs(2)).is_some());
        writeln!(a, "w 7:10 2").unwrap();
        drop(a);
        let until = Instant::now() + Duration::from_secs(2);
        while h.running().len() != 1 {
            assert!(Instant::now() < until, "{:?}", h.events());
            std::thread::sleep(Duration::from_millis(5));
        }
        let ev = h.events();
        let writes: Vec<bool> = ev
            .iter()
            .filter_map(|e| match e.what {
                What::Write { accepted, .. } => Some(accepted),
                _ => None,
            })
            .collect();
        assert_eq!(writes, vec![true, false], "{ev:?}");
        assert_eq!(h.running()[0].1, "n2");
    }
}
