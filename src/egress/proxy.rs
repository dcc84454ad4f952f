//! The policy's transparent TCP proxy. Every TCP connection the sandbox
//! opens is redirected here (nftables DNAT in the container's namespace;
//! the original destination comes back from `SO_ORIGINAL_DST`), judged, and
//! either refused with a reset or connected from the namespace and relayed
//! with `splice(2)`, so the bytes never cross user space.
//!
//! A destination is allowed by an address rule (`10.0.0.0/8:443`), or by a
//! name rule when the resolver saw an allowed name resolve to that address
//! (see [`Resolved`]). For the latter the proxy reads the connection's
//! first flight without consuming it — a TLS ClientHello's server name or
//! an HTTP request's host — and connects only when that name is allowed
//! *and* is one of the names the address resolved from: a forged SNI or
//! Host towards another address is refused, whatever the workload claims.
//! A connection whose client says nothing in [`NAME_WAIT`] (protocols where
//! the server speaks first) or whose first flight names nothing is judged
//! by the names the address resolved from alone.
//!
//! Everything the sandbox sends is untrusted: the first flight is parsed
//! with bounds on every length, no more than [`FIRST_FLIGHT`] bytes are
//! looked at, and connections at once are bounded ([`MAX_CONNECTIONS`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::audit::{bounded, Event, NameSource, Verdict};

use super::trail::Trail;
use super::{Proto, Rule, Target};

/// Where the proxy listens, on the service address of the guest's tap.
pub const PROXY_PORT: u16 = 15001;
/// Connections relayed at once; more are refused.
pub const MAX_CONNECTIONS: usize = 512;
/// Most bytes of a first flight looked at for a name.
pub const FIRST_FLIGHT: usize = 16 * 1024;
/// How long a client may take to say something before the connection is
/// judged without a name.
pub const NAME_WAIT: Duration = Duration::from_millis(1500);
/// How long the destination may take to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Names remembered per address, and addresses remembered in all.
const NAMES_PER_ADDRESS: usize = 16;
const MAX_ADDRESSES: usize = 65_536;

/// The names the resolver saw resolve to each address, until their TTL.
#[derive(Default)]
pub struct Resolved {
    by_addr: Mutex<HashMap<IpAddr, Vec<(String, Instant)>>>,
}

impl Resolved {
    /// Remembers that `name` resolved to `addrs` (each with its TTL, s).
    pub fn remember(&self, name: &str, addrs: &[(IpAddr, u32)], now: Instant) {
        let Ok(mut map) = self.by_addr.lock() else {
            return;
        };
        if map.len() + addrs.len() > MAX_ADDRESSES {
            map.retain(|_, names| {
                names.retain(|(_, until)| *until > now);
                !names.is_empty()
            });
        }
        for (ip, ttl) in addrs {
            if map.len() >= MAX_ADDRESSES && !map.contains_key(ip) {
                break;
            }
            let until = now + Duration::from_secs(u64::from(*ttl));
            let names = map.entry(*ip).or_default();
            names.retain(|(n, u)| n != name && *u > now);
            if names.len() >= NAMES_PER_ADDRESS {
                names.remove(0);
            }
            names.push((name.to_string(), until));
        }
    }

    /// The names `ip` resolved from that have not expired.
    pub fn names_of(&self, ip: IpAddr, now: Instant) -> Vec<String> {
        let Ok(map) = self.by_addr.lock() else {
            return Vec::new();
        };
        map.get(&ip)
            .map(|names| {
                names
                    .iter()
                    .filter(|(_, until)| *until > now)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What the first bytes of a connection say about its destination.
#[derive(Debug, PartialEq, Eq)]
pub enum FirstFlight {
    /// Not enough bytes yet to tell.
    Incomplete,
    /// A TLS ClientHello's server name or an HTTP request's host.
    Name(String, NameSource),
    /// An HTTP request naming two different hosts.
    Ambiguous(String, String),
    /// Neither TLS nor HTTP, or one that names no host.
    Nameless,
}

/// A name as rules spell them: lowercase ASCII letters, digits, `-`, `_`,
/// dot-separated, no trailing dot. `None` for anything else.
pub fn rule_name(raw: &[u8]) -> Option<String> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    if raw.is_empty() || raw.len() > 253 {
        return None;
    }
    let ok = raw.split(|b| *b == b'.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    });
    if !ok {
        return None;
    }
    Some(String::from_utf8_lossy(raw).to_ascii_lowercase())
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

/// Reads a TLS ClientHello's server name from `buf`, the start of a
/// connection. The handshake message may span several records; their
/// payloads are joined before parsing (a name in a second record is still
/// found).
fn tls_server_name(buf: &[u8], full: bool) -> FirstFlight {
    let more = |full: bool| {
        if full {
            FirstFlight::Nameless
        } else {
            FirstFlight::Incomplete
        }
    };
    // Join handshake records until the ClientHello is whole.
    let mut hs = Vec::new();
    let mut at = 0;
    let needed = loop {
        if buf.len() < at + 5 {
            return more(full);
        }
        if buf[at] != 0x16 {
            return FirstFlight::Nameless;
        }
        let Some(len) = be16(buf, at + 3) else {
            return more(full);
        };
        if len == 0 || len > 16_384 + 2048 {
            return FirstFlight::Nameless;
        }
        let Some(payload) = buf.get(at + 5..at + 5 + len) else {
            return more(full);
        };
        hs.extend_from_slice(payload);
        at += 5 + len;
        if hs.len() >= 4 {
            if hs[0] != 1 {
                return FirstFlight::Nameless;
            }
            let body = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
            if hs.len() >= 4 + body {
                break body;
            }
            if 4 + body > FIRST_FLIGHT {
                return FirstFlight::Nameless;
            }
        }
    };
    let hello = &hs[4..4 + needed];
    sni_of_hello(hello).map_or(FirstFlight::Nameless, |n| {
        FirstFlight::Name(n, NameSource::Sni)
    })
}

/// The host_name of a ClientHello body's server_name extension.
fn sni_of_hello(h: &[u8]) -> Option<String> {
    // version (2), random (32)
    let mut at = 34;
    let sid = usize::from(*h.get(at)?);
    at += 1 + sid;
    let suites = be16(h, at)?;
    at += 2 + suites;
    let comp = usize::from(*h.get(at)?);
    at += 1 + comp;
    let ext_len = be16(h, at)?;
    at += 2;
    let exts = h.get(at..at + ext_len)?;
    let mut e = 0;
    while e + 4 <= exts.len() {
        let ty = be16(exts, e)?;
        let len = be16(exts, e + 2)?;
        let data = exts.get(e + 4..e + 4 + len)?;
        if ty == 0 {
            let list = be16(data, 0)?;
            let list = data.get(2..2 + list)?;
            let mut i = 0;
            while i + 3 <= list.len() {
                let kind = list[i];
                let n = be16(list, i + 1)?;
                let name = list.get(i + 3..i + 3 + n)?;
                if kind == 0 {
                    return rule_name(name);
                }
                i += 3 + n;
            }
            return None;
        }
        e += 4 + len;
    }
    None
}

/// The host of an HTTP/1.x request: the request target's authority in
/// absolute form (which a server prefers to Host), else the Host header.
fn http_host(buf: &[u8], full: bool) -> FirstFlight {
    let method_end = buf.iter().position(|b| *b == b' ');
    match method_end {
        Some(0) => return FirstFlight::Nameless,
        Some(n) if n > 16 || !buf[..n].iter().all(|b| b.is_ascii_uppercase()) => {
            return FirstFlight::Nameless
        }
        None if buf.len() > 16 || !buf.iter().all(|b| b.is_ascii_uppercase()) => {
            return FirstFlight::Nameless
        }
        None => {
            return if full {
                FirstFlight::Nameless
            } else {
                FirstFlight::Incomplete
            }
        }
        Some(_) => {}
    }
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if full {
            FirstFlight::Nameless
        } else {
            FirstFlight::Incomplete
        };
    };
    let head = &buf[..end];
    let mut lines = head.split(|b| *b == b'\n');
    let request = lines.next().unwrap_or_default();
    let host_of = |authority: &[u8]| -> Option<String> {
        let authority = authority.trim_ascii();
        // userinfo@host:port
        let authority = match authority.iter().rposition(|b| *b == b'@') {
            Some(i) => &authority[i + 1..],
            None => authority,
        };
        let host = match authority.iter().rposition(|b| *b == b':') {
            Some(i) if authority[i + 1..].iter().all(u8::is_ascii_digit) => &authority[..i],
            _ => authority,
        };
        rule_name(host)
    };
    let mut target_host = None;
    let mut parts = request.split(|b| *b == b' ');
    let _method = parts.next();
    if let Some(target) = parts.next() {
        let lower = target.to_ascii_lowercase();
        for scheme in [&b"http://"[..], b"https://"] {
            if let Some(rest) = lower.strip_prefix(scheme) {
                let end = rest
                    .iter()
                    .position(|b| matches!(b, b'/' | b'?' | b'#'))
                    .unwrap_or(rest.len());
                target_host = Some(host_of(&rest[..end]));
            }
        }
    }
    let mut hosts = Vec::new();
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(colon) = line.iter().position(|b| *b == b':') {
            if line[..colon].trim_ascii().eq_ignore_ascii_case(b"host") {
                hosts.push(host_of(&line[colon + 1..]));
            }
        }
    }
    let mut named: Vec<Option<String>> = Vec::new();
    named.extend(target_host);
    named.extend(hosts);
    let mut names = named.iter();
    let Some(first) = names.next() else {
        return FirstFlight::Nameless;
    };
    for other in names {
        if other != first {
            return FirstFlight::Ambiguous(
                first.clone().unwrap_or_else(|| "?".into()),
                other.clone().unwrap_or_else(|| "?".into()),
            );
        }
    }
    match first {
        Some(n) => FirstFlight::Name(n.clone(), NameSource::Host),
        // A host that is no name (an address, or garbage).
        None => FirstFlight::Nameless,
    }
}

/// What the first bytes of a connection name. `full` when no more bytes
/// will be looked at (the buffer is full or the client went quiet).
pub fn first_flight(buf: &[u8], full: bool) -> FirstFlight {
    match buf.first() {
        None if full => FirstFlight::Nameless,
        None => FirstFlight::Incomplete,
        Some(0x16) => tls_server_name(buf, full),
        Some(_) => http_host(buf, full),
    }
}

/// The proxy's judgement of one connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Judgement {
    Allow {
        rule: usize,
        name: Option<(String, NameSource)>,
    },
    Deny {
        reason: String,
        name: Option<(String, NameSource)>,
    },
    /// Only a name rule can allow it: read the first flight.
    NeedName,
}

fn port_ok(r: &Rule, port: u16) -> bool {
    r.proto == Proto::Tcp && r.port.is_none_or(|p| p == port)
}

/// Judges a TCP connection to `dst`:`port`. `resolved` are the names the
/// address resolved from; `claimed` is `None` before the first flight was
/// read, then what it named.
pub fn judge(
    rules: &[Rule],
    dst: IpAddr,
    port: u16,
    resolved: &[String],
    claimed: Option<&FirstFlight>,
) -> Judgement {
    let dns_name = resolved.first().map(|n| (n.clone(), NameSource::Dns));
    for (i, r) in rules.iter().enumerate() {
        if let Target::Net { addr, prefix } = &r.target {
            if port_ok(r, port)
                && super::mask(dst, *prefix) == *addr
                && dst.is_ipv4() == addr.is_ipv4()
            {
                let name = match claimed {
                    Some(FirstFlight::Name(n, s)) => Some((n.clone(), *s)),
                    _ => dns_name,
                };
                return Judgement::Allow { rule: i, name };
            }
        }
    }
    // Name rules that allow this port, and the resolved names they allow.
    let allowing = |name: &str| -> Option<usize> {
        super::resolver::rules_for(rules, name)
            .into_iter()
            .find(|&i| port_ok(&rules[i], port))
    };
    let candidates: Vec<(usize, &String)> = resolved
        .iter()
        .filter_map(|n| allowing(n).map(|i| (i, n)))
        .collect();
    let Some(&(first_rule, first_name)) = candidates.first() else {
        let reason = if resolved.is_empty() {
            "no rule allows this destination".to_string()
        } else {
            format!("no rule allows port {port} of {}", resolved.join(", "))
        };
        return Judgement::Deny {
            reason,
            name: dns_name,
        };
    };
    match claimed {
        None | Some(FirstFlight::Incomplete) => Judgement::NeedName,
        Some(FirstFlight::Nameless) => Judgement::Allow {
            rule: first_rule,
            name: Some((first_name.clone(), NameSource::Dns)),
        },
        Some(FirstFlight::Ambiguous(a, b)) => Judgement::Deny {
            reason: format!("the request names two hosts, {a} and {b}"),
            name: Some((a.clone(), NameSource::Host)),
        },
        Some(FirstFlight::Name(name, source)) => {
            let named = Some((name.clone(), *source));
            match allowing(name) {
                None => Judgement::Deny {
                    reason: format!("{name} is not allowed"),
                    name: named,
                },
                Some(_) if !resolved.iter().any(|n| n == name) => Judgement::Deny {
                    reason: format!("{name} did not resolve to {dst}"),
                    name: named,
                },
                Some(rule) => Judgement::Allow { rule, name: named },
            }
        }
    }
}

/// Reads the first flight of `client` without consuming it, until it
/// names something, [`FIRST_FLIGHT`] bytes, or [`NAME_WAIT`].
fn peek_first_flight(client: &TcpStream) -> FirstFlight {
    let deadline = Instant::now() + NAME_WAIT;
    let mut buf = vec![0u8; FIRST_FLIGHT];
    let mut last_len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return first_flight(&buf[..last_len], true);
        }
        let mut pfd = [nix::poll::PollFd::new(
            client.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(ms)) {
            Ok(0) => return first_flight(&buf[..last_len], true),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return FirstFlight::Nameless,
        }
        let n = match client.peek(&mut buf) {
            // Readable with nothing to read: the client closed its side.
            Ok(0) => return first_flight(&[], true),
            Ok(n) => n,
            Err(_) => return FirstFlight::Nameless,
        };
        // Bytes already peeked keep the socket readable: poll cannot say
        // when more arrive, so an incomplete flight with nothing new waits
        // a moment. Only a full buffer or the deadline ends it unfinished
        // (a ClientHello in two segments must not pass for nameless).
        let nothing_new = n == last_len;
        last_len = n;
        match first_flight(&buf[..n], n == buf.len()) {
            FirstFlight::Incomplete => {
                if nothing_new {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            other => return other,
        }
    }
}

/// Copies `from` to `to` through a pipe with `splice(2)` until `from` ends;
/// the bytes copied, and whether it ended cleanly.
fn pump(from: &TcpStream, to: &TcpStream) -> (u64, io::Result<()>) {
    use nix::fcntl::{splice, SpliceFFlags};
    let (r, w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return (0, Err(e.into())),
    };
    // Not SPLICE_F_MORE: on a TCP socket it corks the write, and a
    // request-response exchange then waits for the 200 ms cork timer.
    let flags = SpliceFFlags::SPLICE_F_MOVE;
    let mut total = 0u64;
    loop {
        let n = match splice(from, None, &w, None, 1 << 16, flags) {
            Ok(0) => return (total, Ok(())),
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return (total, Err(e.into())),
        };
        let mut left = n;
        while left > 0 {
            match splice(&r, None, to, None, left, flags) {
                Ok(0) => return (total, Err(io::ErrorKind::WriteZero.into())),
                Ok(m) => {
                    left -= m;
                    total += m as u64;
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return (total, Err(e.into())),
            }
        }
    }
}

/// Closes `s` with a reset, as a refused connection.
fn reset(s: TcpStream) {
    let _ = nix::sys::socket::setsockopt(
        &s,
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
    drop(s);
}

/// The destination the sandbox asked for.
fn original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    if s.local_addr()?.is_ipv6() {
        let sa = getsockopt(s, sockopt::Ip6tOriginalDst)?;
        let ip = std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr);
        return Ok(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sa.sin6_port)));
    }
    let sa = getsockopt(s, sockopt::OriginalDst)?;
    let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
    Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
}

/// Addresses the proxy never connects to, whatever the rules: the
/// namespace's own services and non-unicast.
fn forbidden(dst: IpAddr, own: &[IpAddr]) -> bool {
    own.contains(&dst)
        || dst.is_loopback()
        || dst.is_unspecified()
        || dst.is_multicast()
        || dst == IpAddr::V4(Ipv4Addr::BROADCAST)
}

/// One connection's audit line, filled in as the connection goes.
struct Line {
    dst: SocketAddr,
    name: Option<(String, NameSource)>,
    verdict: Verdict,
    rule: Option<String>,
    reason: Option<String>,
    bytes_out: u64,
    bytes_in: u64,
    duration_ms: u64,
    suppressed: u64,
}

impl Line {
    fn new(dst: SocketAddr, name: Option<(String, NameSource)>, verdict: Verdict) -> Line {
        Line {
            dst,
            name,
            verdict,
            rule: None,
            reason: None,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0,
            suppressed: 0,
        }
    }

    fn reason(mut self, reason: String) -> Line {
        self.reason = Some(reason);
        self
    }

    fn event(self) -> Event {
        Event::Connection {
            verdict: self.verdict,
            rule: self.rule,
            reason: self.reason,
            proto: "tcp".into(),
            dst: self.dst.ip(),
            port: self.dst.port(),
            name: self.name.as_ref().map(|(n, _)| bounded(n)),
            name_from: self.name.map(|(_, s)| s),
            bytes_out: self.bytes_out,
            bytes_in: self.bytes_in,
            duration_ms: self.duration_ms,
            suppressed: self.suppressed,
        }
    }
}

/// The proxy: accepts on `listener` and handles each connection on its
/// own thread. `own` are the namespace's service addresses.
pub struct Proxy {
    pub rules: Arc<Vec<Rule>>,
    pub resolved: Arc<Resolved>,
    pub trail: Arc<Trail>,
    pub own: Vec<IpAddr>,
    /// With names in the policy: DNS over TCP (any connection to port 53)
    /// is served by the policy's resolver, with this upstream.
    pub dns: Option<(super::resolver::Shared, Option<SocketAddr>)>,
    /// Connections being relayed, across every listener this proxy serves
    /// (IPv4 and IPv6): at most [`MAX_CONNECTIONS`].
    pub active: AtomicUsize,
}

impl Proxy {
    pub fn serve(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        loop {
            let (client, _) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let dst = match original_dst(&client) {
                Ok(d) => d,
                Err(_) => {
                    reset(client);
                    continue;
                }
            };
            if self.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                self.active.fetch_sub(1, Ordering::SeqCst);
                self.deny(dst, None, "too many connections at once".into());
                reset(client);
                continue;
            }
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("proxy".into())
                .stack_size(128 * 1024)
                .spawn(move || {
                    me.handle(client, dst);
                    me.active.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                self.active.fetch_sub(1, Ordering::SeqCst);
                self.deny(dst, None, "cannot start a thread".into());
            }
        }
    }

    fn deny(&self, dst: SocketAddr, name: Option<(String, NameSource)>, reason: String) {
        // Per destination and claimed name: each forged name is seen once.
        let key = match &name {
            Some((n, source)) => format!("tcp {dst} {n} {source:?}"),
            None => format!("tcp {dst}"),
        };
        self.trail.limited(&key, |suppressed| {
            let mut ev = Line::new(dst, name, Verdict::Denied).reason(reason);
            ev.suppressed = suppressed;
            ev.event()
        });
    }

    fn handle(&self, client: TcpStream, dst: SocketAddr) {
        let started = Instant::now();
        if let (53, Some((shared, upstream))) = (dst.port(), &self.dns) {
            return super::resolver::serve_tcp(shared, client, *upstream);
        }
        if forbidden(dst.ip(), &self.own) {
            self.deny(dst, None, "the namespace's own address".into());
            return reset(client);
        }
        let resolved = self.resolved.names_of(dst.ip(), started);
        let mut judgement = judge(&self.rules, dst.ip(), dst.port(), &resolved, None);
        if judgement == Judgement::NeedName {
            let flight = peek_first_flight(&client);
            judgement = judge(&self.rules, dst.ip(), dst.port(), &resolved, Some(&flight));
        }
        let (rule, name) = match judgement {
            Judgement::Allow { rule, name } => (rule, name),
            Judgement::Deny { reason, name } => {
                self.deny(dst, name, reason);
                return reset(client);
            }
            Judgement::NeedName => {
                self.deny(dst, None, "no name".into());
                return reset(client);
            }
        };
        let rule_text = self.rules.get(rule).map(|r| r.to_string());
        let upstream = match super::sock::connect_tcp(&dst, CONNECT_TIMEOUT) {
            Ok(u) => u,
            Err(e) => {
                let mut ev = Line::new(dst, name, Verdict::Allowed).reason(format!("connect: {e}"));
                ev.rule = rule_text;
                ev.duration_ms = started.elapsed().as_millis() as u64;
                self.trail.record(ev.event());
                return reset(client);
            }
        };
        let (bytes_out, bytes_in) = relay(client, upstream);
        let mut ev = Line::new(dst, name, Verdict::Allowed);
        ev.rule = rule_text;
        ev.bytes_out = bytes_out;
        ev.bytes_in = bytes_in;
        ev.duration_ms = started.elapsed().as_millis() as u64;
        self.trail.record(ev.event());
    }
}

/// Relays both ways until both ends are done; (client→upstream,
/// upstream→client) bytes. An end that closes its sending side has that
/// passed on (half-close); an error on either side ends both.
fn relay(client: TcpStream, upstream: TcpStream) -> (u64, u64) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (c, u) = (Arc::new(client), Arc::new(upstream));
    let one_way = |from: &TcpStream, to: &TcpStream| -> u64 {
        let (n, r) = pump(from, to);
        if r.is_ok() {
            let _ = to.shutdown(Shutdown::Write);
        } else {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        }
        n
    };
    let (c2, u2) = (c.clone(), u.clone());
    let Ok(out) = std::thread::Builder::new()
        .name("proxy-out".into())
        .stack_size(64 * 1024)
        .spawn(move || one_way(&c2, &u2))
    else {
        let _ = c.shutdown(Shutdown::Both);
        let _ = u.shutdown(Shutdown::Both);
        return (0, 0);
    };
    let bytes_in = one_way(&u, &c);
    (out.join().unwrap_or(0), bytes_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A ClientHello naming `sni` (none when `None`), in records of at
    /// most `record` bytes of handshake each.
    fn client_hello(sni: Option<&str>, record: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]); // random
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut exts = Vec::new();
        // An extension before server_name (supported_versions).
        exts.extend([0, 43, 0, 3, 2, 3, 4]);
        if let Some(name) = sni {
            let n = name.len() as u16;
            exts.extend([0, 0]);
            exts.extend((n + 5).to_be_bytes());
            exts.extend((n + 3).to_be_bytes());
            exts.push(0);
            exts.extend(n.to_be_bytes());
            exts.extend(name.as_bytes());
        }
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut hs = vec![1];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut out = Vec::new();
        for chunk in hs.chunks(record) {
            out.extend([0x16, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    fn rules(text: &str) -> Vec<Rule> {
        match text.parse::<super::super::Policy>().unwrap() {
            super::super::Policy::List(r) => r,
            _ => Vec::new(),
        }
    }

    #[test]
    fn tls_server_names_are_read_whole_or_split() {
        let hello = client_hello(Some("Files.PyPI.org"), 1 << 14);
        assert_eq!(
            first_flight(&hello, false),
            FirstFlight::Name("files.pypi.org".into(), NameSource::Sni)
        );
        // Split over records of 7 bytes: the name is in a later record.
        let split = client_hello(Some("evil.example"), 7);
        assert_eq!(
            first_flight(&split, false),
            FirstFlight::Name("evil.example".into(), NameSource::Sni)
        );
        for cut in 0..hello.len() {
            assert_eq!(
                first_flight(&hello[..cut], false),
                FirstFlight::Incomplete,
                "{cut}"
            );
            assert_ne!(
                first_flight(&hello[..cut], true),
                FirstFlight::Incomplete,
                "{cut}"
            );
        }
        assert_eq!(
            first_flight(&client_hello(None, 1 << 14), false),
            FirstFlight::Nameless
        );
        // A name no rule could spell is no name.
        assert_eq!(
            first_flight(&client_hello(Some("a..b"), 1 << 14), false),
            FirstFlight::Nameless
        );
        assert_eq!(
            first_flight(&client_hello(Some("evil.com\0.pypi.org"), 1 << 14), false),
            FirstFlight::Nameless
        );
        // Lengths that point past the data.
        let mut lying = hello.clone();
        let at = lying.len() - 20;
        lying[at] = 0xff;
        let _ = first_flight(&lying, true);
    }

    #[test]
    fn http_hosts_and_absolute_targets() {
        let get = |s: &str| first_flight(s.as_bytes(), false);
        assert_eq!(
            get("GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: Example.COM:8080\r\n\r\n"),
            FirstFlight::Name("example.com".into(), NameSource::Host)
        );
        assert_eq!(
            get("GET / HTTP/1.1\r\nHost: example.com"),
            FirstFlight::Incomplete
        );
        assert_eq!(get("GE"), FirstFlight::Incomplete);
        assert_eq!(
            get("GET http://evil.example/x HTTP/1.1\r\n\r\n"),
            FirstFlight::Name("evil.example".into(), NameSource::Host)
        );
        assert_eq!(
            get("GET http://evil.example/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n"),
            FirstFlight::Ambiguous("evil.example".into(), "pypi.org".into())
        );
        assert_eq!(
            get("GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.example\r\n\r\n"),
            FirstFlight::Ambiguous("pypi.org".into(), "evil.example".into())
        );
        assert_eq!(
            get("GET / HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n"),
            FirstFlight::Name("192.0.2.1".into(), NameSource::Host)
        );
        assert_eq!(get("SSH-2.0-OpenSSH_9.2\r\n"), FirstFlight::Nameless);
        assert_eq!(get("\x00\x01binary"), FirstFlight::Nameless);
        assert_eq!(get("GET / HTTP/1.0\r\n\r\n"), FirstFlight::Nameless);
    }

    #[test]
    fn judgements() {
        let r = rules("pypi.org:443,*.example.com,10.0.0.0/8:22,192.0.2.7:53/udp");
        let pypi: IpAddr = "192.0.2.10".parse().unwrap();
        let resolved = vec!["pypi.org".to_string()];
        // An address rule needs no name.
        assert!(matches!(
            judge(&r, "10.1.2.3".parse().unwrap(), 22, &[], None),
            Judgement::Allow { rule: 2, .. }
        ));
        // ... and covers only its port and protocol.
        assert!(matches!(
            judge(&r, "10.1.2.3".parse().unwrap(), 23, &[], None),
            Judgement::Deny { .. }
        ));
        assert!(matches!(
            judge(&r, "192.0.2.7".parse().unwrap(), 53, &[], None),
            Judgement::Deny { .. }
        ));
        // An address no allowed name resolved to.
        assert!(matches!(
            judge(&r, pypi, 443, &[], None),
            Judgement::Deny { .. }
        ));
        // Resolved from an allowed name: look at the first flight.
        assert_eq!(judge(&r, pypi, 443, &resolved, None), Judgement::NeedName);
        assert!(
            matches!(judge(&r, pypi, 80, &resolved, None), Judgement::Deny { .. }),
            "pypi.org only on 443"
        );
        let sni = |n: &str| FirstFlight::Name(n.into(), NameSource::Sni);
        assert_eq!(
            judge(&r, pypi, 443, &resolved, Some(&sni("pypi.org"))),
            Judgement::Allow {
                rule: 0,
                name: Some(("pypi.org".into(), NameSource::Sni))
            }
        );
        // A forged name: not allowed, or allowed but not this address's.
        match judge(&r, pypi, 443, &resolved, Some(&sni("evil.example"))) {
            Judgement::Deny { reason, .. } => assert!(reason.contains("not allowed"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let both = vec!["pypi.org".to_string()];
        match judge(&r, pypi, 443, &both, Some(&sni("a.example.com"))) {
            Judgement::Deny { reason, .. } => {
                assert!(reason.contains("did not resolve"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // A client that names nothing: the resolved name decides.
        assert_eq!(
            judge(&r, pypi, 443, &resolved, Some(&FirstFlight::Nameless)),
            Judgement::Allow {
                rule: 0,
                name: Some(("pypi.org".into(), NameSource::Dns))
            }
        );
        assert!(matches!(
            judge(
                &r,
                pypi,
                443,
                &resolved,
                Some(&FirstFlight::Ambiguous("pypi.org".into(), "x".into()))
            ),
            Judgement::Deny { .. }
        ));
        // deny: nothing at all.
        assert!(matches!(
            judge(&[], pypi, 443, &resolved, None),
            Judgement::Deny { .. }
        ));
    }

    #[test]
    fn resolved_names_expire_and_are_bounded() {
        let r = Resolved::default();
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        r.remember("a.example", &[(ip, 30)], t0);
        r.remember("b.example", &[(ip, 60)], t0);
        assert_eq!(r.names_of(ip, t0), vec!["a.example", "b.example"]);
        assert_eq!(
            r.names_of(ip, t0 + Duration::from_secs(45)),
            vec!["b.example"]
        );
        for i in 0..100 {
            r.remember(&format!("n{i}.example"), &[(ip, 60)], t0);
        }
        assert_eq!(r.names_of(ip, t0).len(), NAMES_PER_ADDRESS);
    }

    #[test]
    fn relays_both_ways_with_half_close_and_counts() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let server_addr = server.local_addr().unwrap();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        // The server: reads everything, then answers its length.
        let srv = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(format!("{}", got.len()).as_bytes()).unwrap();
        });
        let relayed = std::thread::spawn(move || {
            let (client, _) = front.accept().unwrap();
            let upstream = TcpStream::connect(server_addr).unwrap();
            relay(client, upstream)
        });
        let mut c = TcpStream::connect(front_addr).unwrap();
        let data = vec![0x5au8; 3 << 20];
        c.write_all(&data).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, (3 << 20).to_string());
        srv.join().unwrap();
        assert_eq!(relayed.join().unwrap(), (3 << 20, answer.len() as u64));
    }

    /// A ClientHello that arrives in two pieces is still read whole: the
    /// name in its second piece decides, not "nothing named".
    #[test]
    fn a_first_flight_in_two_pieces_is_waited_for() {
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = front.local_addr().unwrap();
        let hello = client_hello(Some("evil.example"), 1 << 14);
        let (a, b) = hello.split_at(hello.len() / 2);
        let (a, b) = (a.to_vec(), b.to_vec());
        let sender = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&a).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            c.write_all(&b).unwrap();
            c
        });
        let (server, _) = front.accept().unwrap();
        assert_eq!(
            peek_first_flight(&server),
            FirstFlight::Name("evil.example".into(), NameSource::Sni)
        );
        drop(sender.join().unwrap());
        // A client that closes without a word names nothing, at once.
        let quiet = std::thread::spawn(move || drop(TcpStream::connect(addr).unwrap()));
        let (server, _) = front.accept().unwrap();
        quiet.join().unwrap();
        let started = Instant::now();
        assert_eq!(peek_first_flight(&server), FirstFlight::Nameless);
        assert!(started.elapsed() < NAME_WAIT, "{:?}", started.elapsed());
    }

    #[test]
    fn own_and_special_addresses_are_never_destinations() {
        let own: IpAddr = "169.254.53.53".parse().unwrap();
        for d in [
            "169.254.53.53",
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(forbidden(d.parse().unwrap(), &[own]), "{d}");
        }
        assert!(!forbidden("192.0.2.1".parse().unwrap(), &[own]));
    }
}
