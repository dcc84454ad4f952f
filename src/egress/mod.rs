//! The egress policy: where a sandbox may connect.
//!
//! Set by the global flag `--egress RULES`, the annotation
//! [`EGRESS_ANNOTATION`] and `[egress] policy` in the config file, in that
//! order of precedence; a config with `locked = true` lets the flag and the
//! annotation only narrow its policy. Values: `allow` (the default), `deny`,
//! or a comma-separated allowlist whose items are
//!
//! ```text
//!   CIDR[:PORT][/udp]        10.1.0.0/16, 192.0.2.7:53/udp (a bare address is /32 or /128)
//!   [IPV6][:PORT][/udp]      [2001:db8::1]:443, 2001:db8::/32
//!   NAME[:PORT][/udp]        pypi.org:443
//!   *.NAME[:PORT][/udp]      *.githubusercontent.com:443
//! ```
//!
//! An item allows TCP (UDP with `/udp`) to its destination, on every port
//! when it names none. Everything else the sandbox starts is refused; replies
//! to allowed connections pass. A malformed policy is an error naming the
//! rule.
//!
//! Enforcement lives outside the workload: for the microvm tier, nftables
//! rules in the container's network namespace on the host side of the
//! guest's NIC ([`ruleset`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

pub mod conntrack;
pub mod daemon;
pub mod jail;
pub mod nflog;
pub mod nft;
pub mod proxy;
pub mod resolver;
pub mod sock;
pub mod trail;

/// OCI annotation carrying a container's policy.
pub const EGRESS_ANNOTATION: &str = "io.agentvm.egress";
/// The nftables table agentvm owns in a container's network namespace.
pub const NFT_TABLE: &str = "agentvm";
/// Packet and connection mark of the namespace's own connections (the
/// resolver's), whose replies must not be routed to the guest.
pub const LOCAL_MARK: u32 = 0x6176;
/// The routing table that keeps the container's addresses local for
/// packets carrying [`LOCAL_MARK`], and its rule's priority.
pub const LOCAL_TABLE: u8 = 176;
pub const LOCAL_RULE_PRIORITY: u32 = 176;
/// Mark of the egress daemon's sockets to a resolver on the container
/// tier's workload loopback, which [`workload_dns_ruleset`] lets through.
pub const WORKLOAD_DNS_MARK: u32 = 0x6177;

/// The rules in the container tier's workload namespace when the policy
/// has names and the container's resolver is on its loopback (Docker's
/// embedded DNS): UDP queries to it go to the policy's resolver listening
/// at `port` on the same address instead (before Docker's own redirect),
/// TCP ones are refused; only the resolver's own sockets
/// ([`WORKLOAD_DNS_MARK`]) reach Docker's. A workload with `CAP_NET_ADMIN`
/// can delete these rules, and then resolve names the policy does not
/// allow — but not connect to them: the proxy in the router allows only
/// addresses the policy's resolvers answered.
pub fn workload_dns_ruleset(resolver: Ipv4Addr, port: u16) -> String {
    format!(
        "table inet {NFT_TABLE} {{\n\
         \x20 chain dns_redirect {{\n\
         \x20   type nat hook output priority -110; policy accept;\n\
         \x20   meta mark != {WORKLOAD_DNS_MARK} ip daddr {resolver} udp dport 53 dnat ip to {resolver}:{port}\n\
         \x20 }}\n\
         \x20 chain dns_tcp {{\n\
         \x20   type filter hook output priority 0; policy accept;\n\
         \x20   meta mark != {WORKLOAD_DNS_MARK} ip daddr {resolver} tcp dport 53 reject with tcp reset\n\
         \x20 }}\n\
         }}\n"
    )
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("egress rule {rule:?}: {why}")]
    BadRule { rule: String, why: String },
    #[error("egress policy is empty: use \"allow\", \"deny\" or a list of rules")]
    Empty,
    #[error(
        "egress policy {requested:?} ({source_name}) is wider than the policy the config file \
         locks ({locked:?}): it may only narrow it{detail}"
    )]
    Wider {
        requested: String,
        source_name: &'static str,
        locked: String,
        detail: String,
    },
    #[error("egress rule {rule:?}: {what} is not implemented yet")]
    Unsupported { rule: String, what: &'static str },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// Where a rule lets the sandbox connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An address block; the address has no bits beyond `prefix`.
    Net { addr: IpAddr, prefix: u8 },
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any name below this one (`*.example.com` → `example.com`), not the
    /// name itself.
    Below(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub target: Target,
    pub port: Option<u16>,
    pub proto: Proto,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Policy {
    #[default]
    Allow,
    Deny,
    List(Vec<Rule>),
}

/// Where the policy in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicySource {
    Flag,
    Annotation,
    ConfigFile,
    Default,
}

impl PolicySource {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicySource::Flag => "--egress flag",
            PolicySource::Annotation => "annotation io.agentvm.egress",
            PolicySource::ConfigFile => "config file",
            PolicySource::Default => "default",
        }
    }
}

fn bad(rule: &str, why: impl Into<String>) -> PolicyError {
    PolicyError::BadRule {
        rule: rule.to_string(),
        why: why.into(),
    }
}

fn parse_port(rule: &str, p: &str) -> Result<u16, PolicyError> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad(rule, format!("port {p:?} is not 1-65535"))),
        Ok(n) => Ok(n),
    }
}

/// `addr` with the bits beyond `prefix` cleared.
pub(crate) fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// `addr` if it has no bits beyond `prefix`.
fn network(addr: IpAddr, prefix: u8) -> Option<IpAddr> {
    (mask(addr, prefix) == addr).then_some(addr)
}

fn parse_net(rule: &str, text: &str) -> Result<Option<Target>, PolicyError> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return Ok(None);
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(bad(rule, format!("prefix /{p} is not 0-{max}"))),
        },
    };
    let addr = network(addr, prefix).ok_or_else(|| {
        bad(
            rule,
            format!("{addr} has bits set beyond /{prefix} (write the network address)"),
        )
    })?;
    Ok(Some(Target::Net { addr, prefix }))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl FromStr for Rule {
    type Err = PolicyError;

    fn from_str(item: &str) -> Result<Rule, PolicyError> {
        let rule = item;
        let (body, proto) = match item.strip_suffix("/udp") {
            Some(b) => (b, Proto::Udp),
            None => match item.strip_suffix("/tcp") {
                Some(b) => (b, Proto::Tcp),
                None => (item, Proto::Tcp),
            },
        };
        if body.is_empty() {
            return Err(bad(rule, "no destination"));
        }
        // [v6]:port or [v6/len]:port
        if let Some(rest) = body.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| bad(rule, "unclosed '['"))?;
            let port = match after {
                "" => None,
                p => Some(parse_port(
                    rule,
                    p.strip_prefix(':')
                        .ok_or_else(|| bad(rule, "expected ':PORT' after ']'"))?,
                )?),
            };
            let target = parse_net(rule, inner)?
                .filter(|t| matches!(t, Target::Net { addr, .. } if addr.is_ipv6()))
                .ok_or_else(|| bad(rule, format!("{inner:?} is not an IPv6 address")))?;
            return Ok(Rule {
                target,
                port,
                proto,
            });
        }
        // A bare IPv6 address or block (colons, no port).
        if body.matches(':').count() > 1 {
            let target = parse_net(rule, body)?.ok_or_else(|| {
                bad(
                    rule,
                    "not an address; an IPv6 address with a port is written [ADDR]:PORT",
                )
            })?;
            return Ok(Rule {
                target,
                port: None,
                proto,
            });
        }
        let (dest, port) = match body.rsplit_once(':') {
            Some((d, p)) => (d, Some(parse_port(rule, p)?)),
            None => (body, None),
        };
        if let Some(target) = parse_net(rule, dest)? {
            return Ok(Rule {
                target,
                port,
                proto,
            });
        }
        let lower = dest.trim_end_matches('.').to_ascii_lowercase();
        // `192.0.2.7.` is not a host name: it would print as the address,
        // which parses as another rule (found by the `annotations` fuzz
        // target).
        if lower.parse::<IpAddr>().is_ok() {
            return Err(bad(rule, "an address is written without a trailing dot"));
        }
        let target = match lower.strip_prefix("*.") {
            Some(below) if valid_name(below) => Target::Below(below.to_string()),
            Some(_) => return Err(bad(rule, "not a valid name after '*.'")),
            None if lower.contains('*') => {
                return Err(bad(rule, "'*' is only allowed as a leading '*.'"))
            }
            None if lower.contains('/') => return Err(bad(rule, "not an address block")),
            None if valid_name(&lower) => Target::Name(lower),
            None => return Err(bad(rule, "not an address, address block or host name")),
        };
        Ok(Rule {
            target,
            port,
            proto,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = |addr: &IpAddr, prefix: u8| prefix == if addr.is_ipv4() { 32 } else { 128 };
        match (&self.target, self.port) {
            (Target::Net { addr, prefix }, None) if full(addr, *prefix) => write!(f, "{addr}")?,
            (Target::Net { addr, prefix }, None) => write!(f, "{addr}/{prefix}")?,
            (Target::Net { addr, prefix }, Some(p)) => match (addr, full(addr, *prefix)) {
                (IpAddr::V6(_), true) => write!(f, "[{addr}]:{p}")?,
                (IpAddr::V6(_), false) => write!(f, "[{addr}/{prefix}]:{p}")?,
                (_, true) => write!(f, "{addr}:{p}")?,
                (_, false) => write!(f, "{addr}/{prefix}:{p}")?,
            },
            // A host called `allow` or `deny` keeps the dot that tells it
            // from the keyword (found by the `annotations` fuzz target).
            (Target::Name(n), None) if is_keyword(n) && self.proto == Proto::Tcp => {
                write!(f, "{n}.")?
            }
            (Target::Name(n), None) => write!(f, "{n}")?,
            (Target::Name(n), Some(p)) => write!(f, "{n}:{p}")?,
            (Target::Below(n), None) => write!(f, "*.{n}")?,
            (Target::Below(n), Some(p)) => write!(f, "*.{n}:{p}")?,
        }
        if self.proto == Proto::Udp {
            f.write_str("/udp")?;
        }
        Ok(())
    }
}

/// Whether `s` is `allow` or `deny`, in any case.
fn is_keyword(s: &str) -> bool {
    s.eq_ignore_ascii_case("allow") || s.eq_ignore_ascii_case("deny")
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Policy, PolicyError> {
        let text = text.trim();
        // The keywords in any case: `DENY` is not a host called `deny`.
        match text {
            "" => Err(PolicyError::Empty),
            t if t.eq_ignore_ascii_case("allow") => Ok(Policy::Allow),
            t if t.eq_ignore_ascii_case("deny") => Ok(Policy::Deny),
            list => {
                let mut rules = Vec::new();
                for item in list.split(',') {
                    let item = item.trim();
                    if item.is_empty() {
                        return Err(bad(list, "an empty item between commas"));
                    }
                    if is_keyword(item) {
                        return Err(bad(item, "allow and deny stand alone, not in a list"));
                    }
                    rules.push(item.parse::<Rule>()?);
                }
                Ok(Policy::List(rules))
            }
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Allow => f.write_str("allow"),
            Policy::Deny => f.write_str("deny"),
            Policy::List(rules) => {
                let items: Vec<String> = rules.iter().map(Rule::to_string).collect();
                f.write_str(&items.join(","))
            }
        }
    }
}

fn net_within(inner: (&IpAddr, u8), outer: (&IpAddr, u8)) -> bool {
    inner.0.is_ipv4() == outer.0.is_ipv4()
        && inner.1 >= outer.1
        && mask(*inner.0, outer.1) == *outer.0
}

pub(crate) fn name_below(name: &str, parent: &str) -> bool {
    name.len() > parent.len() + 1
        && name.ends_with(parent)
        && name.as_bytes()[name.len() - parent.len() - 1] == b'.'
}

impl Rule {
    /// Whether everything this rule allows, `outer` allows too.
    pub fn within(&self, outer: &Rule) -> bool {
        if self.proto != outer.proto {
            return false;
        }
        let ports = match (self.port, outer.port) {
            (_, None) => true,
            (Some(a), Some(b)) => a == b,
            (None, Some(_)) => false,
        };
        let targets = match (&self.target, &outer.target) {
            (Target::Net { addr: a, prefix: p }, Target::Net { addr: b, prefix: q }) => {
                net_within((a, *p), (b, *q))
            }
            (Target::Name(a), Target::Name(b)) => a == b,
            (Target::Name(a), Target::Below(b)) => name_below(a, b),
            (Target::Below(a), Target::Below(b)) => a == b || name_below(a, b),
            _ => false,
        };
        ports && targets
    }
}

impl Policy {
    /// `requested` if it allows nothing `self` (a locked policy) does not;
    /// else an error naming what it would add.
    pub fn narrow(&self, requested: Policy, source: PolicySource) -> Result<Policy, PolicyError> {
        let wider = |detail: String| PolicyError::Wider {
            requested: requested.to_string(),
            source_name: source.as_str(),
            locked: self.to_string(),
            detail,
        };
        match (self, &requested) {
            (Policy::Allow, _) | (_, Policy::Deny) => Ok(requested),
            (_, Policy::Allow) => Err(wider(String::new())),
            (Policy::Deny, Policy::List(_)) => Err(wider(String::new())),
            (Policy::List(locked), Policy::List(rules)) => {
                for r in rules {
                    if !locked.iter().any(|l| r.within(l)) {
                        return Err(wider(format!(": {r} is not within it")));
                    }
                }
                Ok(requested)
            }
        }
    }

    /// The policy in force: flag, else annotation, else config file; a
    /// locked config file's policy can only be narrowed.
    pub fn select(
        flag: Option<&str>,
        annotation: Option<&str>,
        config: Option<&str>,
        locked: bool,
    ) -> Result<(Policy, PolicySource), PolicyError> {
        let base = match config {
            Some(text) => Some(text.parse::<Policy>()?),
            None => None,
        };
        let requested = match (flag, annotation) {
            (Some(f), _) => Some((f.parse::<Policy>()?, PolicySource::Flag)),
            (None, Some(a)) => Some((a.parse::<Policy>()?, PolicySource::Annotation)),
            (None, None) => None,
        };
        match (base, requested) {
            (Some(base), Some((req, src))) if locked => Ok((base.narrow(req, src)?, src)),
            (_, Some((req, src))) => Ok((req, src)),
            (Some(base), None) => Ok((base, PolicySource::ConfigFile)),
            (None, None) => Ok((Policy::Allow, PolicySource::Default)),
        }
    }

    /// Whether some rule names a host (enforced through the resolver).
    pub fn has_names(&self) -> bool {
        matches!(self, Policy::List(rules) if rules.iter().any(|r| !matches!(r.target, Target::Net { .. })))
    }

    pub fn is_allow(&self) -> bool {
        matches!(self, Policy::Allow)
    }
}

/// What the sandbox may send from on one interface of the namespace's
/// side (a guest's tap): anything else is spoofed, dropped and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The interface (`avtap0`).
    pub side: String,
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    pub addrs: Vec<IpAddr>,
}

/// The chains dropping (and logging) what comes from a sandbox interface
/// with a source MAC or address that is not the sandbox's. IPv6 may also
/// come from a link-local address (neighbour discovery, which only the
/// namespace sees: link-local sources are never forwarded) or from none
/// (duplicate address detection).
fn anti_spoof(sources: &[Source]) -> String {
    if sources.is_empty() {
        return String::new();
    }
    let mut rules = String::new();
    for s in sources {
        rules += &format!(
            "    iifname \"{}\" ether saddr != {} jump spoofed\n",
            s.side, s.mac
        );
        let v4: Vec<String> = s
            .addrs
            .iter()
            .filter(|a| a.is_ipv4())
            .map(|a| a.to_string())
            .collect();
        if !v4.is_empty() {
            rules += &format!(
                "    iifname \"{}\" meta nfproto ipv4 ip saddr != {{ {} }} jump spoofed\n",
                s.side,
                v4.join(", ")
            );
        }
        let v6: Vec<String> = s
            .addrs
            .iter()
            .filter(|a| a.is_ipv6())
            .map(|a| a.to_string())
            .chain(["fe80::/10".to_string(), "::".to_string()])
            .collect();
        rules += &format!(
            "    iifname \"{}\" meta nfproto ipv6 ip6 saddr != {{ {} }} jump spoofed\n",
            s.side,
            v6.join(", ")
        );
        // A link-local or no source is for the link alone: anything else
        // from one (but ICMPv6, whose neighbour probes may go to the
        // router's global address) would reach the proxy or resolver, which
        // the namespace delivers locally, from an address that is not the
        // sandbox's (a workload that dropped its global address).
        rules += &format!(
            "    iifname \"{}\" meta nfproto ipv6 ip6 saddr {{ fe80::/10, :: }} ip6 daddr != {{ fe80::/10, ff00::/8 }} meta l4proto != ipv6-icmp jump spoofed\n",
            s.side
        );
    }
    format!(
        "  chain spoof {{\n\
         \x20   type filter hook prerouting priority raw; policy accept;\n\
         {rules}\
         \x20 }}\n\
         \x20 chain spoofed {{\n\
         \x20   limit rate 200/second burst 100 packets log prefix \"{}\" group {}\n\
         \x20   drop\n\
         \x20 }}\n",
        nflog::prefix_spoofed(),
        nflog::GROUP
    )
}

/// The nftables ruleset (for `nft -f -`) that enforces `policy` on what
/// enters the namespace from the sandbox's side (`side_prefix*`: the
/// guest's taps). `None` for `allow`.
///
/// - Every new TCP connection goes to the egress proxy on `service`
///   (`proxy.rs`), which judges it, records it, and relays it.
/// - With names in the policy, every DNS query over UDP goes to the
///   resolver on `service`, whichever server the sandbox asked.
/// - Other forwarded traffic is checked against the UDP rules here; each
///   new flow they allow, and every denied packet (within a rate), is
///   logged to the daemon (`nflog.rs`).
/// - Replies to connections made from outside pass (published ports).
/// - A packet from a sandbox interface whose source MAC or address is not
///   in `sources` is dropped before anything else sees it, and logged.
/// - IPv6 goes the same ways to `service6`, where the proxy and resolver
///   also listen, when the sandbox has IPv6 (else its interfaces have
///   IPv6 off). ICMPv6 to the namespace itself is neighbour discovery,
///   echo and errors only.
/// - The daemon's own connections leave from the container's address,
///   which the namespace routes to the sandbox: they are marked, and their
///   replies are delivered locally (see `LOCAL_MARK`).
pub fn ruleset(
    policy: &Policy,
    side_prefix: &str,
    service: Ipv4Addr,
    service6: Option<Ipv6Addr>,
    sources: &[Source],
) -> Option<String> {
    let rules = match policy {
        Policy::Allow => return None,
        Policy::Deny => &[][..],
        Policy::List(rules) => rules.as_slice(),
    };
    let group = nflog::GROUP;
    let port_of = proxy::PROXY_PORT;
    let mut allow = String::new();
    let mut sets = String::new();
    for (i, r) in rules.iter().enumerate() {
        // TCP is the proxy's.
        if r.proto != Proto::Udp {
            continue;
        }
        let port = r
            .port
            .map(|p| format!(" udp dport {p}"))
            .unwrap_or_else(|| " meta l4proto udp".to_string());
        // Marked, so that the flow's end is written with its bytes.
        let log = format!("ct mark set {:#x}", conntrack::mark(i));
        match &r.target {
            Target::Net { addr, prefix } => {
                let family = if addr.is_ipv4() { "ip" } else { "ip6" };
                allow += &format!(
                    "    {family} daddr {addr}/{prefix}{port} counter {log} accept comment \"{r}\"\n"
                );
            }
            // Addresses the resolver saw this rule's names resolve to.
            Target::Name(_) | Target::Below(_) => {
                for (family, v6, ty) in [("ip", false, "ipv4_addr"), ("ip6", true, "ipv6_addr")] {
                    let set = resolver::set_name(i, v6);
                    sets += &format!("  set {set} {{ type {ty}; flags timeout; }}\n");
                    allow += &format!(
                        "    {family} daddr @{set}{port} counter {log} accept comment \"{r}\"\n"
                    );
                }
            }
        }
    }
    let (mut dns_nat, mut dns_in) = if policy.has_names() {
        (
            format!(
                "    iifname \"{side_prefix}*\" meta nfproto ipv4 udp dport 53 dnat ip to {service}:53\n"
            ),
            format!("    ip daddr {service} udp dport 53 accept\n"),
        )
    } else {
        (String::new(), String::new())
    };
    let mut tcp_nat = format!(
        "    iifname \"{side_prefix}*\" meta nfproto ipv4 meta l4proto tcp dnat ip to {service}:{port_of}\n"
    );
    let mut to_proxy = format!("    ip daddr {service} tcp dport {port_of} accept\n");
    if let Some(s6) = service6 {
        if policy.has_names() {
            dns_nat += &format!(
                "    iifname \"{side_prefix}*\" meta nfproto ipv6 udp dport 53 dnat ip6 to [{s6}]:53\n"
            );
            dns_in += &format!("    ip6 daddr {s6} udp dport 53 accept\n");
        }
        tcp_nat += &format!(
            "    iifname \"{side_prefix}*\" meta nfproto ipv6 meta l4proto tcp dnat ip6 to [{s6}]:{port_of}\n"
        );
        to_proxy += &format!("    ip6 daddr {s6} tcp dport {port_of} accept\n");
    }
    let spoof = anti_spoof(sources);
    let deny_log = format!(
        "    limit rate 200/second burst 100 packets log prefix \"{}\" group {group}\n",
        nflog::prefix_denied()
    );
    Some(format!(
        "table inet {NFT_TABLE}\n\
         delete table inet {NFT_TABLE}\n\
         table inet {NFT_TABLE} {{\n\
         \x20 chain forward {{\n\
         \x20   type filter hook forward priority filter - 10; policy accept;\n\
         \x20   iifname \"{side_prefix}*\" jump egress\n\
         \x20 }}\n\
         \x20 chain egress {{\n\
         \x20   ct state established,related accept\n\
         {allow}\
         \x20   counter name denied\n\
         {deny_log}\
         \x20   meta l4proto tcp reject with tcp reset\n\
         \x20   reject with icmpx admin-prohibited\n\
         \x20 }}\n\
         \x20 chain input {{\n\
         \x20   type filter hook input priority filter - 10; policy accept;\n\
         \x20   iifname \"{side_prefix}*\" jump from_sandbox\n\
         \x20 }}\n\
         \x20 chain from_sandbox {{\n\
         \x20   ct state established,related accept\n\
         \x20   meta l4proto icmp accept\n\
         \x20   icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, echo-request, destination-unreachable, packet-too-big, time-exceeded, parameter-problem }} accept\n\
         {dns_in}\
         {to_proxy}\
         \x20   counter name denied\n\
         {deny_log}\
         \x20   drop\n\
         \x20 }}\n\
         \x20 chain to_daemon {{\n\
         \x20   type nat hook prerouting priority dstnat; policy accept;\n\
         {dns_nat}\
         {tcp_nat}\
         \x20 }}\n\
         \x20 chain own_out {{\n\
         \x20   type filter hook output priority mangle; policy accept;\n\
         \x20   ct state new ct mark set {LOCAL_MARK}\n\
         \x20 }}\n\
         \x20 chain own_in {{\n\
         \x20   type filter hook prerouting priority mangle; policy accept;\n\
         \x20   ct mark {LOCAL_MARK} meta mark set {LOCAL_MARK}\n\
         \x20 }}\n\
         {spoof}\
         \x20 counter denied {{ }}\n\
         {sets}\
         }}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Policy {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(p("allow"), Policy::Allow);
        assert_eq!(p(" deny "), Policy::Deny);
        let text = "pypi.org:443,*.githubusercontent.com:443,10.1.0.0/16,192.0.2.7:53/udp,\
                    [2001:db8::1]:443,2001:db8::/32,198.51.100.1";
        let Policy::List(rules) = p(text) else {
            panic!("a list")
        };
        assert_eq!(rules.len(), 7);
        assert_eq!(rules[0].target, Target::Name("pypi.org".into()));
        assert_eq!(rules[0].port, Some(443));
        assert_eq!(
            rules[1].target,
            Target::Below("githubusercontent.com".into())
        );
        assert_eq!(
            rules[2].target,
            Target::Net {
                addr: "10.1.0.0".parse().unwrap(),
                prefix: 16
            }
        );
        assert_eq!(rules[2].port, None);
        assert_eq!((rules[3].port, rules[3].proto), (Some(53), Proto::Udp));
        assert_eq!(
            rules[4].target,
            Target::Net {
                addr: "2001:db8::1".parse().unwrap(),
                prefix: 128
            }
        );
        assert_eq!(rules[6].to_string(), "198.51.100.1");
        // Display round-trips.
        assert_eq!(p(&p(text).to_string()), p(text));
        assert_eq!(p("PyPI.org.").to_string(), "pypi.org");
    }

    #[test]
    fn malformed_rules_are_named() {
        for (bad, needle) in [
            ("", "empty"),
            ("a,,b", "empty item"),
            ("10.0.0.0/33", "prefix"),
            ("10.0.0.1/8", "bits set"),
            ("10.0.0.1:0", "port"),
            ("10.0.0.1:70000", "port"),
            ("host:http", "port"),
            ("2001:db8::1:99999", "not an address"),
            ("[2001:db8::1", "unclosed"),
            ("[10.0.0.1]:80", "not an IPv6"),
            ("[2001:db8::1]443", "':PORT'"),
            ("foo*.com", "'*'"),
            ("*.", "'*.'"),
            ("exa mple.com", "not an address"),
            ("-bad.com", "not an address"),
            ("allow,10.0.0.1", "stand alone"),
            ("/udp", "no destination"),
            ("192.0.2.7.", "without a trailing dot"),
            ("192.0.2.7..:443/udp", "without a trailing dot"),
        ] {
            let err = bad.parse::<Policy>().unwrap_err().to_string();
            assert!(err.contains(needle), "{bad:?}: {err}");
            if !bad.is_empty() && bad != "a,,b" {
                assert!(err.contains("egress rule"), "{bad:?}: {err}");
            }
        }
    }

    #[test]
    fn keywords_in_any_case_are_keywords_and_hosts_so_named_keep_their_dot() {
        assert_eq!(p("DENY"), Policy::Deny);
        assert_eq!(p(" Allow "), Policy::Allow);
        assert!("10.0.0.1,Deny".parse::<Policy>().is_err());
        // A host named `deny` is written with its trailing dot, and shown so.
        let host = p("deny.");
        assert_eq!(
            host,
            Policy::List(vec![Rule {
                target: Target::Name("deny".into()),
                port: None,
                proto: Proto::Tcp,
            }])
        );
        assert_eq!(host.to_string(), "deny.");
        assert_eq!(p(&host.to_string()), host);
        assert_eq!(p("allow.:443").to_string(), "allow:443");
    }

    #[test]
    fn narrowing_a_locked_policy() {
        let locked = p("10.0.0.0/8,*.example.com:443,pypi.org:443");
        let src = PolicySource::Flag;
        assert!(locked.narrow(p("10.1.0.0/16:80"), src).is_ok());
        assert!(locked.narrow(p("a.example.com:443"), src).is_ok());
        assert!(locked.narrow(p("*.b.example.com:443"), src).is_ok());
        assert!(locked.narrow(p("deny"), src).is_ok());
        let err = locked.narrow(p("allow"), src).unwrap_err().to_string();
        assert!(err.contains("wider"), "{err}");
        let err = locked
            .narrow(p("10.0.0.0/8,11.0.0.1"), src)
            .unwrap_err()
            .to_string();
        assert!(err.contains("11.0.0.1 is not within"), "{err}");
        assert!(locked.narrow(p("example.com:443"), src).is_err());
        assert!(locked.narrow(p("pypi.org"), src).is_err(), "any port");
        assert!(locked.narrow(p("10.0.0.1/udp"), src).is_err(), "udp");
        assert!(p("deny").narrow(p("10.0.0.1"), src).is_err());
        assert!(p("allow").narrow(p("allow"), src).is_ok());
    }

    #[test]
    fn precedence_flag_annotation_config() {
        let sel = |f, a, c, l| Policy::select(f, a, c, l);
        assert_eq!(
            sel(None, None, None, false).unwrap(),
            (Policy::Allow, PolicySource::Default)
        );
        assert_eq!(
            sel(None, None, Some("deny"), false).unwrap(),
            (Policy::Deny, PolicySource::ConfigFile)
        );
        assert_eq!(
            sel(None, Some("10.0.0.1"), Some("deny"), false).unwrap().1,
            PolicySource::Annotation
        );
        assert_eq!(
            sel(Some("allow"), Some("deny"), Some("deny"), false)
                .unwrap()
                .1,
            PolicySource::Flag
        );
        // Locked: the flag may not widen the file's policy.
        assert!(sel(Some("allow"), None, Some("deny"), true).is_err());
        assert!(sel(None, Some("10.0.0.1"), Some("deny"), true).is_err());
        assert_eq!(
            sel(Some("10.0.0.1:443"), None, Some("10.0.0.0/8"), true)
                .unwrap()
                .0,
            p("10.0.0.1:443")
        );
        // A bad value is an error wherever it comes from.
        assert!(sel(Some("nope:x"), None, None, false).is_err());
        assert!(sel(None, None, Some("10.0.0.1/99"), false).is_err());
    }

    #[test]
    fn names_get_sets_and_dns_is_redirected() {
        assert!(p("10.0.0.0/8,x.example:1").has_names());
        assert!(!p("10.0.0.0/8").has_names());
        let svc: Ipv4Addr = "169.254.53.53".parse().unwrap();
        let r = ruleset(
            &p("10.0.0.0/8,pypi.org:443,*.ntp.example:123/udp"),
            "avtap",
            svc,
            Some("fd61:7676:6d00::53".parse().unwrap()),
            &[],
        )
        .unwrap();
        assert!(
            r.contains("meta nfproto ipv6 udp dport 53 dnat ip6 to [fd61:7676:6d00::53]:53"),
            "{r}"
        );
        assert!(
            r.contains("meta nfproto ipv6 meta l4proto tcp dnat ip6 to [fd61:7676:6d00::53]:15001"),
            "{r}"
        );
        assert!(
            r.contains("ip6 daddr fd61:7676:6d00::53 tcp dport 15001 accept"),
            "{r}"
        );
        // TCP names are the proxy's: no sets for them.
        assert!(!r.contains("r1_v4"), "{r}");
        assert!(
            r.contains("set r2_v4 { type ipv4_addr; flags timeout; }"),
            "{r}"
        );
        assert!(
            r.contains("ip daddr @r2_v4 udp dport 123 counter ct mark set 0x6f000002 accept"),
            "{r}"
        );
        assert!(r.contains("ip6 daddr @r2_v6 udp dport 123"), "{r}");
        assert!(
            r.contains("udp dport 53 dnat ip to 169.254.53.53:53"),
            "{r}"
        );
        assert!(
            r.contains("meta l4proto tcp dnat ip to 169.254.53.53:15001"),
            "{r}"
        );
        let no_names = ruleset(&p("10.0.0.0/8"), "avtap", svc, None, &[]).unwrap();
        assert!(!no_names.contains("udp dport 53 dnat"), "{no_names}");
        assert!(
            no_names.contains("tcp dnat ip to 169.254.53.53:15001"),
            "{no_names}"
        );
    }

    #[test]
    fn ruleset_lists_the_allowed_destinations() {
        let svc: Ipv4Addr = "169.254.53.53".parse().unwrap();
        assert!(ruleset(&Policy::Allow, "avtap", svc, None, &[]).is_none());
        let r = ruleset(
            &p("10.1.0.0/16,192.0.2.7:53/udp,[2001:db8::1]:443,x.example"),
            "avtap",
            svc,
            None,
            &[],
        )
        .unwrap();
        // TCP rules are judged by the proxy, not listed here.
        assert!(!r.contains("10.1.0.0/16"), "{r}");
        assert!(
            r.contains("ip daddr 192.0.2.7/32 udp dport 53 counter ct mark set 0x6f000001 accept"),
            "{r}"
        );
        assert!(
            r.contains("ip daddr 169.254.53.53 udp dport 53 accept"),
            "{r}"
        );
        assert!(
            r.contains("ip daddr 169.254.53.53 tcp dport 15001 accept"),
            "{r}"
        );
        assert!(r.contains("iifname \"avtap*\" jump egress"), "{r}");
        assert!(r.contains("log prefix \"agentvm deny\" group 176"), "{r}");
        let deny = ruleset(
            &Policy::Deny,
            "avtap",
            svc,
            None,
            &[Source {
                side: "avtap0".into(),
                mac: "02:42:ac:11:00:02".into(),
                addrs: vec!["172.17.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            }],
        )
        .unwrap();
        assert!(
            deny.contains("iifname \"avtap0\" ether saddr != 02:42:ac:11:00:02 jump spoofed"),
            "{deny}"
        );
        assert!(
            deny.contains(
                "iifname \"avtap0\" meta nfproto ipv4 ip saddr != { 172.17.0.2 } jump spoofed"
            ),
            "{deny}"
        );
        assert!(
            deny.contains(
                "iifname \"avtap0\" meta nfproto ipv6 ip6 saddr != { fd00::2, fe80::/10, :: } jump spoofed"
            ),
            "{deny}"
        );
        assert!(
            deny.contains(
                "iifname \"avtap0\" meta nfproto ipv6 ip6 saddr { fe80::/10, :: } ip6 daddr != { fe80::/10, ff00::/8 } meta l4proto != ipv6-icmp jump spoofed"
            ),
            "{deny}"
        );
        // Without IPv6 plumbed, nothing of the proxy's listens on IPv6.
        assert!(!deny.contains("dnat ip6"), "{deny}");
        assert!(
            deny.contains("log prefix \"agentvm spoof\" group 176"),
            "{deny}"
        );
        assert!(!deny.contains("daddr @"), "{deny}");
        assert!(!deny.contains("udp dport 53 dnat"), "{deny}");
    }
}
