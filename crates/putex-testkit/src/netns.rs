//! A small network of Linux network namespaces for fault tests that a TCP
//! proxy cannot make: one namespace per host (an etcd member, a NATS
//! server), joined by a
//! bridge in a namespace of its own, and the test's own namespace on the
//! same bridge, so the test and the processes it starts there (agents,
//! clients) reach every host by its address. A host can then be cut off
//! from the other hosts while the test's namespace still reaches it — an
//! etcd member or a NATS server that lost its peers but not its clients.
//!
//! The addresses are in 198.18.0.0/15, the range RFC 2544 sets aside for
//! benchmark tests (never routed on a real network), one /24 per network.
//! Nothing outside the namespaces changes except one veth interface in the
//! test's namespace, which goes away with the bridge's namespace. Needs
//! root and `ip` (iproute2); [`Lan::create`] says why it cannot when it
//! cannot, and [`Lan::unavailable`] says it before anything is created.
//! Dropped, the namespaces are deleted (and every interface in them).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The namespaces of one network: `hosts` hosts and the bridge.
pub struct Lan {
    prefix: String,
    subnet: u8,
    hosts: usize,
    created: Vec<String>,
}

/// Runs `ip ARGS…`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (install iproute2)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))
    }
}

impl Lan {
    /// Why no network can be created here (not root, no `ip`), if so.
    pub fn unavailable() -> Option<String> {
        if !nix::unistd::geteuid().is_root() {
            return Some("network namespaces need root".into());
        }
        match Command::new("ip").arg("-V").output() {
            Ok(o) if o.status.success() => None,
            _ => Some("network namespaces need `ip` (Debian package iproute2)".into()),
        }
    }

    /// Creates a network of `hosts` hosts (at most 50): namespace `i`
    /// holds address [`Lan::addr`]`(i)`, the test's namespace 198.18.S.200.
    pub fn create(hosts: usize) -> Result<Lan, String> {
        assert!((1..=50).contains(&hosts), "1 to 50 hosts");
        if let Some(why) = Lan::unavailable() {
            return Err(why);
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // A subnet per network of this process, varied by the pid so that
        // two test processes at once rarely pick the same one.
        let subnet = u8::try_from((std::process::id().wrapping_mul(7).wrapping_add(n)) % 250)
            .expect("below 250");
        let mut lan = Lan {
            prefix: format!("ptx{}-{n}", std::process::id()),
            subnet,
            hosts,
            created: Vec::new(),
        };
        lan.build()?;
        Ok(lan)
    }

    fn build(&mut self) -> Result<(), String> {
        let sw = format!("{}-sw", self.prefix);
        ip(&["netns", "add", &sw])?;
        self.created.push(sw.clone());
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        // Interface names are at most 15 bytes: a short tag per network.
        let tag = format!("{:x}", self.subnet);
        for i in 0..self.hosts {
            let ns = self.ns(i);
            ip(&["netns", "add", &ns])?;
            self.created.push(ns.clone());
            let (inner, port) = (format!("ph{tag}h{i}"), format!("ps{tag}h{i}"));
            ip(&[
                "link", "add", &inner, "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        // The test's own namespace on the bridge too.
        let (inner, port) = (format!("ph{tag}t"), format!("ps{tag}t"));
        ip(&[
            "link", "add", &inner, "type", "veth", "peer", "name", &port, "netns", &sw,
        ])?;
        ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
        let addr = format!("198.18.{}.200/24", self.subnet);
        ip(&["addr", "add", &addr, "dev", &inner])?;
        ip(&["link", "set", &inner, "up"])?;
        Ok(())
    }

    /// Host `i`'s namespace (for `ip netns exec`).
    pub fn ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("198.18.{}.{}", self.subnet, i + 1)
    }

    /// Cuts hosts `a` and `b` off from each other, both ways (a blackhole
    /// route in each for the other's address); the test's namespace still
    /// reaches both.
    pub fn cut(&self, a: usize, b: usize) -> Result<(), String> {
        self.route("add", a, b)?;
        self.route("add", b, a)
    }

    /// Undoes [`Lan::cut`].
    pub fn heal(&self, a: usize, b: usize) -> Result<(), String> {
        self.route("del", a, b)?;
        self.route("del", b, a)
    }

    /// Cuts host `i` off from every other host.
    pub fn isolate(&self, i: usize) -> Result<(), String> {
        (0..self.hosts)
            .filter(|j| *j != i)
            .try_for_each(|j| self.cut(i, j))
    }

    /// Undoes [`Lan::isolate`].
    pub fn rejoin(&self, i: usize) -> Result<(), String> {
        (0..self.hosts)
            .filter(|j| *j != i)
            .try_for_each(|j| self.heal(i, j))
    }

    fn route(&self, op: &str, from: usize, to: usize) -> Result<(), String> {
        let dest = format!("{}/32", self.addr(to));
        ip(&["-n", &self.ns(from), "route", op, "blackhole", &dest])
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // Deleting a namespace deletes its interfaces, and a veth pair goes
        // with either end: the test namespace's interface goes with the
        // bridge's namespace.
        for ns in self.created.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A command running `bin`, in network namespace `netns` if given: `ip
/// netns exec` execs it there, so the child is `bin` itself.
pub(crate) fn command_in(bin: &std::path::Path, netns: Option<&str>) -> std::process::Command {
    match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => std::process::Command::new(bin),
    }
}
