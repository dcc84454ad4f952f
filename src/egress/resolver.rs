//! The policy's resolver: names are enforced by the runtime, not by trusting
//! the workload. Every DNS query the sandbox sends over UDP ends here (the
//! egress rules redirect port 53 to it); a query for a name no rule allows
//! is answered REFUSED, one for an allowed name is forwarded to the
//! container's own resolver, and the addresses in the answer are
//! remembered for the proxy ([`Resolved`]) and added to the nftables sets
//! of the UDP rules that allowed the name — for the answer's TTL — before
//! the answer goes back. A connection to an address no allowed name
//! resolved to stays refused, whatever name the workload claims for it.
//!
//! It runs in the egress daemon (`daemon.rs`) in the container's network
//! namespace, started by the supervisor before the guest boots; the daemon
//! keeps what it needs to add set elements, which the jailed supervisor
//! does not have.
//!
//! Both the sandbox's queries and the upstream's answers are untrusted: they
//! are parsed with hickory's decoder, bounded in size, and a malformed one is
//! dropped.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{Name, RData};

use super::proxy::Resolved;
use super::trail::Trail;
use super::{name_below, Rule, Target, NFT_TABLE};
use crate::audit::{Event, Verdict};

/// Largest datagram taken from either side.
pub const MAX_DATAGRAM: usize = 4096;
/// Queries forwarded at once; more are dropped (the client retries).
pub const MAX_IN_FLIGHT: usize = 64;
/// How long an upstream may take.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds on how long a resolved address stays allowed.
pub const MIN_TTL: u32 = 30;
pub const MAX_TTL: u32 = 86_400;

#[derive(Debug, thiserror::Error)]
pub enum ResolverError {
    #[error("egress resolver: {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("egress resolver: {0}")]
    Policy(#[from] super::PolicyError),
}

/// What to do with one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send these bytes back (FORMERR).
    Answer(Vec<u8>),
    /// Send this REFUSED back: no rule allows the name.
    Refused { reply: Vec<u8>, name: String },
    /// Forward it; the indexes of the rules that allow the name.
    Forward { name: String, rules: Vec<usize> },
    /// Not a query we answer at all.
    Drop,
}

/// The set holding the addresses rule `index` allows, per family.
pub fn set_name(index: usize, v6: bool) -> String {
    format!("r{index}_{}", if v6 { "v6" } else { "v4" })
}

/// The name of a query as rules spell names: its labels, lowercase, joined
/// by dots. `None` when a label holds a byte no rule can name: in the text
/// form a dot inside a label (`com\.pypi` of `com\.pypi.org`, a name
/// under `org`) would read as a label boundary and pass for a name below
/// `pypi.org` (found by the `egress_resolver` fuzz target).
fn rule_name(name: &Name) -> Option<String> {
    let mut labels = Vec::new();
    for label in name.iter() {
        if !label
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return None;
        }
        labels.push(std::str::from_utf8(label).ok()?.to_ascii_lowercase());
    }
    Some(labels.join("."))
}

fn reply_code(query: &Message, code: ResponseCode) -> Vec<u8> {
    let mut reply = Message::error_msg(query.metadata.id, query.metadata.op_code, code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.queries = query.queries.clone();
    reply.to_vec().unwrap_or_default()
}

/// The rules that allow `name`.
pub fn rules_for(rules: &[Rule], name: &str) -> Vec<usize> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| match &r.target {
            Target::Name(n) => n == name,
            Target::Below(b) => name_below(name, b),
            Target::Net { .. } => false,
        })
        .map(|(i, _)| i)
        .collect()
}

/// Decides what to do with a datagram from the sandbox.
pub fn decide(rules: &[Rule], datagram: &[u8]) -> Decision {
    if datagram.len() > MAX_DATAGRAM {
        return Decision::Drop;
    }
    let Ok(msg) = Message::from_vec(datagram) else {
        return Decision::Drop;
    };
    if msg.metadata.message_type != MessageType::Query {
        return Decision::Drop;
    }
    if msg.queries.len() != 1 {
        return Decision::Answer(reply_code(&msg, ResponseCode::FormErr));
    }
    let Some(q) = msg.queries.first() else {
        return Decision::Answer(reply_code(&msg, ResponseCode::FormErr));
    };
    let Some(name) = rule_name(&q.name) else {
        return Decision::Refused {
            reply: reply_code(&msg, ResponseCode::Refused),
            name: crate::audit::bounded(&q.name.to_string()),
        };
    };
    let allowed = rules_for(rules, &name);
    if allowed.is_empty() {
        return Decision::Refused {
            reply: reply_code(&msg, ResponseCode::Refused),
            name,
        };
    }
    Decision::Forward {
        name,
        rules: allowed,
    }
}

/// The addresses of an upstream answer to `id`, each with its TTL clamped
/// to [`MIN_TTL`]..=[`MAX_TTL`]; `None` when it is not a well-formed
/// answer to that query.
pub fn answers(reply: &[u8], id: u16) -> Option<Vec<(IpAddr, u32)>> {
    if reply.len() > MAX_DATAGRAM {
        return None;
    }
    let msg = Message::from_vec(reply).ok()?;
    if msg.metadata.id != id || msg.metadata.message_type != MessageType::Response {
        return None;
    }
    Some(
        msg.answers
            .iter()
            .filter_map(|r| {
                let ip = match &r.data {
                    RData::A(a) => IpAddr::V4(a.0),
                    RData::AAAA(a) => IpAddr::V6(a.0),
                    _ => return None,
                };
                Some((ip, r.ttl.clamp(MIN_TTL, MAX_TTL)))
            })
            .collect(),
    )
}

/// Whether rule `r` has address sets (names are enforced in nftables only
/// for UDP; TCP goes through the proxy, which asks [`Resolved`]).
pub fn has_sets(r: &Rule) -> bool {
    r.proto == super::Proto::Udp && !matches!(r.target, Target::Net { .. })
}

/// The nft commands adding `addrs` to the sets of `rules` (those that
/// have sets, see [`has_sets`]).
pub fn set_elements(all: &[Rule], rules: &[usize], addrs: &[(IpAddr, u32)]) -> String {
    let mut out = String::new();
    for &i in rules {
        if !all.get(i).is_some_and(has_sets) {
            continue;
        }
        for (ip, ttl) in addrs {
            out += &format!(
                "add element inet {NFT_TABLE} {} {{ {ip} timeout {ttl}s }}\n",
                set_name(i, ip.is_ipv6())
            );
        }
    }
    out
}

/// Installs nft set elements (`nft -f -` in production).
pub type AddElements = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the resolver shares with the rest of the egress daemon.
#[derive(Clone)]
pub struct Shared {
    pub rules: Arc<Vec<Rule>>,
    /// The names each address resolved from, for the proxy.
    pub resolved: Arc<Resolved>,
    pub trail: Arc<Trail>,
    pub add: AddElements,
}

/// Where allowed queries go.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A resolver the daemon's namespace reaches: a socket of its own per
    /// query.
    At(SocketAddr),
    /// A resolver only another namespace reaches — Docker's embedded DNS,
    /// on loopback in the container tier's workload namespace — through
    /// sockets opened there, connected to it, for the daemon.
    Pool(Arc<SocketPool>),
}

/// Connected UDP sockets lent to one query at a time.
#[derive(Debug)]
pub struct SocketPool {
    free: Mutex<Vec<UdpSocket>>,
    returned: Condvar,
}

impl SocketPool {
    pub fn new(sockets: Vec<UdpSocket>) -> SocketPool {
        SocketPool {
            free: Mutex::new(sockets),
            returned: Condvar::new(),
        }
    }

    /// A socket, waiting up to `wait` for one; what a late answer to its
    /// last query left in it is dropped first.
    fn take(self: &Arc<Self>, wait: Duration) -> Option<Lent> {
        let deadline = Instant::now() + wait;
        let mut free = self.free.lock().ok()?;
        loop {
            if let Some(sock) = free.pop() {
                drop(free);
                drain(&sock);
                return Some(Lent {
                    sock: Some(sock),
                    pool: self.clone(),
                });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            free = self.returned.wait_timeout(free, left).ok()?.0;
        }
    }
}

fn drain(sock: &UdpSocket) {
    let mut buf = [0u8; 512];
    if sock.set_nonblocking(true).is_ok() {
        while sock.recv(&mut buf).is_ok() {}
        let _ = sock.set_nonblocking(false);
    }
}

/// A pool's socket, back in the pool when dropped.
struct Lent {
    sock: Option<UdpSocket>,
    pool: Arc<SocketPool>,
}

impl std::ops::Deref for Lent {
    type Target = UdpSocket;
    fn deref(&self) -> &UdpSocket {
        // Only `drop` takes it out.
        self.sock.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(sock), Ok(mut free)) = (self.sock.take(), self.pool.free.lock()) {
            free.push(sock);
            self.pool.returned.notify_one();
        }
    }
}

/// A socket connected to `upstream` for one query.
fn upstream_socket(upstream: &Upstream) -> Option<Box<dyn std::ops::Deref<Target = UdpSocket>>> {
    match upstream {
        Upstream::At(addr) => Some(Box::new(Box::new(super::sock::connect_udp(addr).ok()?))),
        Upstream::Pool(pool) => Some(Box::new(pool.take(UPSTREAM_TIMEOUT)?)),
    }
}

/// The resolver's loop: queries on `listener`, answers from `upstream`.
pub fn serve(
    shared: Shared,
    listener: UdpSocket,
    upstream: Option<Upstream>,
) -> Result<(), ResolverError> {
    let rules = shared.rules.clone();
    let listener = Arc::new(listener);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let (n, client) = listener
            .recv_from(&mut buf)
            .map_err(|source| ResolverError::Io {
                what: "receive a query",
                source,
            })?;
        let query = buf[..n].to_vec();
        match decide(&rules, &query) {
            Decision::Drop => {}
            Decision::Answer(bytes) => {
                let _ = listener.send_to(&bytes, client);
            }
            Decision::Refused { reply, name } => {
                let _ = listener.send_to(&reply, client);
                refused(&shared, name);
            }
            Decision::Forward { name, rules: which } => {
                let Some(upstream) = upstream.clone() else {
                    if let Ok(msg) = Message::from_vec(&query) {
                        let _ = listener.send_to(&reply_code(&msg, ResponseCode::ServFail), client);
                    }
                    continue;
                };
                if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (listener, in_flight, shared) =
                    (listener.clone(), in_flight.clone(), shared.clone());
                std::thread::spawn(move || {
                    forward(&query, &name, &which, &upstream, client, &listener, &shared);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
    }
}

/// The trail's line for a name no rule allows (rate-limited per name).
fn refused(shared: &Shared, name: String) {
    shared
        .trail
        .limited(&format!("dns {name}"), |_| Event::Dns {
            verdict: Verdict::Denied,
            name,
            rule: None,
            addresses: Vec::new(),
        });
}

fn forward(
    query: &[u8],
    name: &str,
    rules: &[usize],
    upstream: &Upstream,
    client: SocketAddr,
    listener: &UdpSocket,
    shared: &Shared,
) {
    let id = u16::from_be_bytes([query[0], query[1]]);
    let Some(sock) = upstream_socket(upstream) else {
        return;
    };
    if sock.set_read_timeout(Some(UPSTREAM_TIMEOUT)).is_err() || sock.send(query).is_err() {
        return;
    }
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let Ok(n) = sock.recv(&mut buf) else {
            return;
        };
        if !allow_answer(shared, name, rules, &buf[..n], id) {
            continue;
        }
        let _ = listener.send_to(&buf[..n], client);
        return;
    }
}

/// Takes in `answer` to query `id` for the allowed `name` (the indexes of
/// the rules that allow it): its addresses are remembered for the proxy
/// and added to the UDP rules' sets, and the answer is in the trail —
/// before it goes back to the sandbox. False when it is not an answer to
/// that query.
fn allow_answer(shared: &Shared, name: &str, rules: &[usize], answer: &[u8], id: u16) -> bool {
    let Some(addrs) = answers(answer, id) else {
        return false;
    };
    shared.resolved.remember(name, &addrs, Instant::now());
    let elements = set_elements(&shared.rules, rules, &addrs);
    if !elements.is_empty() && !(shared.add)(&elements) {
        tracing::warn!("egress resolver: cannot allow the addresses of {name}");
    }
    let rule = rules
        .first()
        .and_then(|&i| shared.rules.get(i))
        .map(|r| r.to_string());
    let addresses: Vec<IpAddr> = addrs.iter().map(|(ip, _)| *ip).collect();
    shared
        .trail
        .limited(&format!("dns-allowed {name}"), |_| Event::Dns {
            verdict: Verdict::Allowed,
            name: name.to_string(),
            rule,
            addresses,
        });
    true
}

/// Largest DNS message taken over TCP, either way.
pub const MAX_TCP_MESSAGE: usize = 65_535;
/// Queries served on one TCP connection.
const MAX_TCP_QUERIES: usize = 16;
/// How long a TCP client may take to send its next query.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// Reads one length-prefixed DNS message of at most `max` bytes; `None`
/// at the end of the stream or on anything else.
fn read_message(s: &mut impl std::io::Read, max: usize) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).ok()?;
    let len = usize::from(u16::from_be_bytes(len));
    if len < 12 || len > max {
        return None;
    }
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).ok()?;
    Some(msg)
}

fn write_message(s: &mut impl std::io::Write, msg: &[u8]) -> bool {
    let Ok(len) = u16::try_from(msg.len()) else {
        return false;
    };
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(msg);
    s.write_all(&out).is_ok()
}

/// DNS over TCP from the sandbox (the proxy hands over a connection to
/// port 53 when the policy has names), judged as UDP queries are: a name no
/// rule allows is answered REFUSED, an allowed one is asked of `upstream`
/// over TCP (a client turns to TCP when an answer is too large for UDP)
/// and its answer taken in before it goes back.
pub fn serve_tcp(shared: &Shared, mut client: std::net::TcpStream, upstream: Option<SocketAddr>) {
    use std::net::TcpStream;
    if client.set_read_timeout(Some(TCP_IDLE)).is_err() {
        return;
    }
    let mut up: Option<TcpStream> = None;
    for _ in 0..MAX_TCP_QUERIES {
        let Some(query) = read_message(&mut client, MAX_DATAGRAM) else {
            return;
        };
        let reply = match decide(&shared.rules, &query) {
            Decision::Drop => return,
            Decision::Answer(bytes) => bytes,
            Decision::Refused { reply, name } => {
                refused(shared, name);
                reply
            }
            Decision::Forward { name, rules } => {
                let id = u16::from_be_bytes([query[0], query[1]]);
                let asked = upstream.and_then(|addr| {
                    if up.is_none() {
                        let s = super::sock::connect_tcp(&addr, UPSTREAM_TIMEOUT).ok()?;
                        s.set_read_timeout(Some(UPSTREAM_TIMEOUT)).ok()?;
                        up = Some(s);
                    }
                    let s = up.as_mut()?;
                    if !write_message(s, &query) {
                        return None;
                    }
                    let answer = read_message(s, MAX_TCP_MESSAGE)?;
                    allow_answer(shared, &name, &rules, &answer, id).then_some(answer)
                });
                match asked {
                    Some(answer) => answer,
                    None => {
                        up = None;
                        match Message::from_vec(&query) {
                            Ok(msg) => reply_code(&msg, ResponseCode::ServFail),
                            Err(_) => return,
                        }
                    }
                }
            }
        };
        if !write_message(&mut client, &reply) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Policy;
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA};
    use hickory_proto::rr::{Record, RecordType};
    use std::str::FromStr;

    fn rules(text: &str) -> Vec<Rule> {
        match text.parse::<Policy>().unwrap() {
            Policy::List(r) => r,
            _ => Vec::new(),
        }
    }

    fn query(name: &str, id: u16) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = id;
        m.queries
            .push(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    fn rcode(bytes: &[u8]) -> ResponseCode {
        Message::from_vec(bytes).unwrap().metadata.response_code
    }

    #[test]
    fn only_allowed_names_are_forwarded() {
        let r = rules("pypi.org:443,*.example.com,10.0.0.0/8");
        match decide(&r, &query("PyPI.org.", 7)) {
            Decision::Forward { name, rules } => {
                assert_eq!(name, "pypi.org");
                assert_eq!(rules, vec![0]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(&r, &query("a.b.example.com", 1)),
            Decision::Forward { .. }
        ));
        for denied in [
            "example.com",
            "evil.com",
            "pypi.org.evil.com",
            "xexample.com",
        ] {
            match decide(&r, &query(denied, 9)) {
                Decision::Refused { reply, .. } => {
                    assert_eq!(rcode(&reply), ResponseCode::Refused, "{denied}")
                }
                other => panic!("{denied}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_dot_inside_a_label_is_not_a_label_boundary() {
        let r = rules("*.pypi.org,pypi.org");
        let cases: [&[&[u8]]; 4] = [
            &[b"com.pypi", b"org"],
            &[b"pypi.org"],
            &[b"x", b"a\\", b"pypi", b"org"],
            &[b"x\0", b"pypi", b"org"],
        ];
        for labels in cases {
            let mut m = Message::query();
            m.queries.push(Query::query(
                Name::from_labels(labels.iter().map(|l| l.to_vec())).unwrap(),
                RecordType::A,
            ));
            match decide(&r, &m.to_vec().unwrap()) {
                Decision::Refused { reply, .. } => {
                    assert_eq!(rcode(&reply), ResponseCode::Refused, "{labels:?}")
                }
                other => panic!("{labels:?}: {other:?}"),
            }
        }
        assert!(matches!(
            decide(&r, &query("Files.PyPI.org.", 3)),
            Decision::Forward { .. }
        ));
    }

    #[test]
    fn malformed_queries_are_dropped_or_refused() {
        let r = rules("pypi.org");
        assert_eq!(decide(&r, b""), Decision::Drop);
        assert_eq!(decide(&r, &[0u8; 5]), Decision::Drop);
        assert_eq!(decide(&r, &vec![0u8; MAX_DATAGRAM + 1]), Decision::Drop);
        // A response is not a query.
        let mut resp = Message::response(3, OpCode::Query);
        resp.queries.push(Query::query(
            Name::from_str("pypi.org").unwrap(),
            RecordType::A,
        ));
        assert_eq!(decide(&r, &resp.to_vec().unwrap()), Decision::Drop);
        // Two questions in one query.
        let mut two = Message::query();
        for n in ["pypi.org", "evil.com"] {
            two.queries
                .push(Query::query(Name::from_str(n).unwrap(), RecordType::A));
        }
        match decide(&r, &two.to_vec().unwrap()) {
            Decision::Answer(b) => assert_eq!(rcode(&b), ResponseCode::FormErr),
            other => panic!("{other:?}"),
        }
        // Truncated bytes of a valid query.
        let q = query("pypi.org", 1);
        for cut in 1..q.len() {
            let _ = decide(&r, &q[..cut]);
        }
    }

    #[test]
    fn answers_give_addresses_with_bounded_ttls() {
        let mut m = Message::response(42, OpCode::Query);
        let name = Name::from_str("pypi.org.").unwrap();
        m.answers.push(Record::from_rdata(
            name.clone(),
            1,
            RData::A(A("192.0.2.1".parse().unwrap())),
        ));
        m.answers.push(Record::from_rdata(
            name,
            10_000_000,
            RData::AAAA(AAAA("2001:db8::1".parse().unwrap())),
        ));
        let bytes = m.to_vec().unwrap();
        assert_eq!(
            answers(&bytes, 42).unwrap(),
            vec![
                ("192.0.2.1".parse().unwrap(), MIN_TTL),
                ("2001:db8::1".parse().unwrap(), MAX_TTL)
            ]
        );
        assert!(answers(&bytes, 43).is_none(), "another query's answer");
        assert!(answers(&query("pypi.org", 42), 42).is_none(), "a query");
        assert!(answers(&bytes[..bytes.len() - 3], 42).is_none());
        let r = rules("10.0.0.0/8,pypi.org:443,*.ntp.example:123/udp");
        let els = set_elements(&r, &[1, 2], &answers(&bytes, 42).unwrap());
        assert!(els.contains("add element inet agentvm r2_v4 { 192.0.2.1 timeout 30s }"));
        assert!(els.contains("r2_v6 { 2001:db8::1 timeout 86400s }"));
        // TCP names are the proxy's: no sets.
        assert!(!els.contains("r1_"), "{els}");
    }

    /// A real round trip: an upstream that answers everything, the
    /// resolver between, what it asked to allow, what it remembered for
    /// the proxy, and what it recorded.
    #[test]
    fn resolves_through_upstream_and_allows_what_it_answered() {
        let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up_addr = upstream.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = upstream.recv_from(&mut buf) {
                upstream.send_to(&answer_a(&buf[..n]), from).unwrap();
            }
        });
        let listener = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let added = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = added.clone();
        let shared = Shared {
            rules: Arc::new(rules("pypi.org:443,pypi.org:53/udp")),
            resolved: Arc::new(Resolved::default()),
            trail: Arc::new(Trail::memory("c")),
            add: Arc::new(move |s: &str| {
                sink.lock().unwrap().push_str(s);
                true
            }),
        };
        let (resolved, trail) = (shared.resolved.clone(), shared.trail.clone());
        std::thread::spawn(move || serve(shared, listener, Some(Upstream::At(up_addr))));
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 512];
        client.send_to(&query("evil.com", 5), addr).unwrap();
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(rcode(&buf[..n]), ResponseCode::Refused);
        client.send_to(&query("pypi.org", 6), addr).unwrap();
        let n = client.recv(&mut buf).unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.metadata.id, 6);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            added.lock().unwrap().trim(),
            "add element inet agentvm r1_v4 { 192.0.2.9 timeout 300s }"
        );
        assert_eq!(
            resolved.names_of("192.0.2.9".parse().unwrap(), Instant::now()),
            vec!["pypi.org"]
        );
        let events = trail.events();
        assert!(
            matches!(&events[0], Event::Dns { verdict: Verdict::Denied, name, .. } if name == "evil.com"),
            "{events:?}"
        );
        assert!(
            matches!(&events[1], Event::Dns { verdict: Verdict::Allowed, name, addresses, .. }
                if name == "pypi.org" && addresses.len() == 1),
            "{events:?}"
        );
    }

    /// An answer to `query` naming 192.0.2.9.
    fn answer_a(query: &[u8]) -> Vec<u8> {
        let q = Message::from_vec(query).unwrap();
        let mut a = Message::response(q.metadata.id, OpCode::Query);
        a.queries = q.queries.clone();
        a.answers.push(Record::from_rdata(
            q.queries[0].name.clone(),
            300,
            RData::A(A("192.0.2.9".parse().unwrap())),
        ));
        a.to_vec().unwrap()
    }

    #[test]
    fn dns_over_tcp_is_judged_and_answered_over_tcp() {
        use std::net::{TcpListener, TcpStream};
        let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
        let up_addr = upstream.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut s in upstream.incoming().flatten() {
                while let Some(q) = read_message(&mut s, MAX_TCP_MESSAGE) {
                    write_message(&mut s, &answer_a(&q));
                }
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared {
            rules: Arc::new(rules("pypi.org:443")),
            resolved: Arc::new(Resolved::default()),
            trail: Arc::new(Trail::memory("c")),
            add: Arc::new(|_: &str| true),
        };
        let (resolved, trail) = (shared.resolved.clone(), shared.trail.clone());
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                serve_tcp(&shared, c, Some(up_addr));
            }
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Two queries on one connection: refused, then answered.
        assert!(write_message(&mut c, &query("evil.com", 5)));
        let r = read_message(&mut c, MAX_TCP_MESSAGE).unwrap();
        assert_eq!(rcode(&r), ResponseCode::Refused);
        assert!(write_message(&mut c, &query("pypi.org", 6)));
        let r = read_message(&mut c, MAX_TCP_MESSAGE).unwrap();
        let m = Message::from_vec(&r).unwrap();
        assert_eq!((m.metadata.id, m.answers.len()), (6, 1));
        assert_eq!(
            resolved.names_of("192.0.2.9".parse().unwrap(), Instant::now()),
            vec!["pypi.org"]
        );
        assert_eq!(trail.events().len(), 2, "{:?}", trail.events());
        // A length below a header's, or one past the limit, ends it.
        use std::io::{Read, Write};
        c.write_all(&[0, 3, 1, 2, 3]).unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&[0xff, 0xff]).unwrap();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
    }
}
