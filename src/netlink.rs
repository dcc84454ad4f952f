//! A small synchronous rtnetlink client: what the microvm tier needs to read
//! a network namespace (links, addresses, routes) and to plumb a guest NIC
//! into it (taps up, host routes, local routes, proxy neighbours), and what
//! the guest agent needs to configure its interfaces. Messages are built and
//! parsed with `netlink-packet-route`; no `ip` subprocess is involved.
//!
//! One socket per [`Netlink`], bound in the network namespace of the thread
//! that opened it.

use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The kernel's local routing table.
pub const TABLE_LOCAL: u8 = 255;
/// The main routing table.
pub const TABLE_MAIN: u8 = 254;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("netlink {what}: {source}")]
    Kernel {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("netlink {what}: malformed reply: {detail}")]
    Malformed { what: &'static str, detail: String },
    #[error("cannot set net.{path}: {source}")]
    Sysctl {
        path: String,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, NetlinkError>;

impl NetlinkError {
    /// `Ok` when the kernel refused with `errno` (an entry that already
    /// exists, or is already gone), else this error.
    pub fn unless(self, errno: i32) -> Result<()> {
        match &self {
            NetlinkError::Kernel { source, .. } if source.raw_os_error() == Some(errno) => Ok(()),
            _ => Err(self),
        }
    }
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub up: bool,
    pub loopback: bool,
    pub ether: bool,
    /// `IFLA_IFALIAS`, if set.
    pub alias: Option<String>,
}

/// An address on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub addr: IpAddr,
    pub prefix: u8,
    /// Scope host (loopback) or link (IPv6 link-local) addresses are the
    /// namespace's own and never handed on.
    pub global: bool,
}

/// A unicast route of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub table: u8,
    pub dst: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub kind: RouteKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Unicast,
    Local,
    Other,
}

pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    /// Opens a route netlink socket in the calling thread's namespace.
    pub fn open() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends one request and collects what the kernel answers up to the
    /// ACK or the end of a dump.
    fn request(
        &mut self,
        what: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket
            .send(&buf, 0)
            .map_err(|source| NetlinkError::Kernel { what, source })?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .map_err(|source| NetlinkError::Kernel { what, source })?;
            let mut off = 0usize;
            while off < data.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(|e| NetlinkError::Malformed {
                        what,
                        detail: e.to_string(),
                    })?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(NetlinkError::Malformed {
                        what,
                        detail: "zero-length message".into(),
                    });
                }
                off += (len + 3) & !3;
                if msg.header.sequence_number != self.seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(out),
                        Some(code) => {
                            return Err(NetlinkError::Kernel {
                                what,
                                source: std::io::Error::from_raw_os_error(-code.get()),
                            })
                        }
                    },
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !dump {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    pub fn links(&mut self) -> Result<Vec<Link>> {
        let replies = self.request(
            "list links",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            })
            .collect())
    }

    pub fn addresses(&mut self) -> Result<Vec<Address>> {
        let replies = self.request(
            "list addresses",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => address_of(&a),
                _ => None,
            })
            .collect())
    }

    /// Unicast and local routes of every table, both families.
    pub fn routes(&mut self) -> Result<Vec<Route>> {
        let mut all = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            let replies = self.request(
                "list routes",
                RouteNetlinkMessage::GetRoute(msg),
                NLM_F_DUMP,
            )?;
            all.extend(replies.into_iter().filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => route_of(&r),
                _ => None,
            }));
        }
        Ok(all)
    }

    /// Sets a link up (and its MTU, name and MAC when given). The name and
    /// MAC of a link can only change while it is down.
    pub fn set_link(
        &mut self,
        index: u32,
        name: Option<&str>,
        mac: Option<[u8; 6]>,
        mtu: Option<u32>,
        up: bool,
    ) -> Result<()> {
        if name.is_some() || mac.is_some() {
            let mut msg = LinkMessage::default();
            msg.header.index = index;
            msg.header.change_mask = LinkFlags::Up;
            if let Some(n) = name {
                msg.attributes.push(LinkAttribute::IfName(n.to_string()));
            }
            if let Some(m) = mac {
                msg.attributes.push(LinkAttribute::Address(m.to_vec()));
            }
            self.request(
                "configure a link",
                RouteNetlinkMessage::SetLink(msg),
                NLM_F_ACK,
            )?;
        }
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.change_mask = LinkFlags::Up;
        if up {
            msg.header.flags = LinkFlags::Up;
        }
        if let Some(m) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(m));
        }
        self.request(
            "set a link up",
            RouteNetlinkMessage::SetLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Moves link `index` into the network namespace open as `netns`.
    pub fn move_link(&mut self, index: u32, netns: std::os::fd::RawFd) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::NetNsFd(netns));
        self.request(
            "move a link to another namespace",
            RouteNetlinkMessage::SetLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    pub fn del_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family_of(addr);
        msg.header.prefix_len = prefix;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Address(addr));
        self.request(
            "delete an address",
            RouteNetlinkMessage::DelAddress(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family_of(addr);
        msg.header.prefix_len = prefix;
        msg.header.index = index;
        msg.header.scope = match addr {
            IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => AddressScope::Link,
            _ => AddressScope::Universe,
        };
        msg.attributes.push(AddressAttribute::Address(addr));
        match addr {
            IpAddr::V4(_) => msg.attributes.push(AddressAttribute::Local(addr)),
            // Docker's and CNI's addresses are theirs already: no duplicate
            // address detection (it would hold the address back a second).
            IpAddr::V6(_) => msg
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad)),
        }
        self.request(
            "add an address",
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    fn route_message(route: &Route) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(route.dst);
        msg.header.destination_prefix_length = route.prefix;
        msg.header.table = route.table;
        msg.attributes
            .push(RouteAttribute::Table(u32::from(route.table)));
        msg.header.kind = match route.kind {
            RouteKind::Local => RouteType::Local,
            _ => RouteType::Unicast,
        };
        msg.header.protocol = match route.kind {
            RouteKind::Local => RouteProtocol::Kernel,
            _ => RouteProtocol::Boot,
        };
        msg.header.scope = match (route.kind, route.gateway) {
            (RouteKind::Local, _) => RouteScope::Host,
            (_, None) => RouteScope::Link,
            (_, Some(_)) => RouteScope::Universe,
        };
        if route.prefix > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(route.dst)));
        }
        if let Some(gw) = route.gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = route.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if route.kind == RouteKind::Local && route.dst.is_ipv4() {
            // As the kernel adds it with the address. (IPv6 has none: a
            // preferred source must be an address of the namespace, and
            // an IPv6 local route may be for one that is not, AnyIP.)
            msg.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(route.dst)));
        }
        msg
    }

    /// Adds (or replaces) a route.
    pub fn add_route(&mut self, route: &Route) -> Result<()> {
        let msg = Self::route_message(route);
        self.request(
            "add a route",
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Adds a route unless one to the same destination is there (the
    /// kernel's own for an address's subnet stays as the kernel made it).
    pub fn ensure_route(&mut self, route: &Route) -> Result<()> {
        let msg = Self::route_message(route);
        match self.request(
            "add a route",
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        ) {
            Ok(_) => Ok(()),
            Err(e) => e.unless(libc::EEXIST),
        }
    }

    pub fn del_route(&mut self, route: &Route) -> Result<()> {
        let mut msg = Self::route_message(route);
        // Match any protocol and scope, as `ip route del` does.
        msg.header.protocol = RouteProtocol::Unspec;
        msg.header.scope = RouteScope::NoWhere;
        self.request(
            "delete a route",
            RouteNetlinkMessage::DelRoute(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    fn rule_message(v6: bool, fwmark: u32, table: u32, priority: u32) -> RuleMessage {
        let mut msg = RuleMessage::default();
        msg.header.family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        msg.header.action = RuleAction::ToTable;
        msg.header.table = u8::try_from(table).unwrap_or(0);
        msg.attributes.push(RuleAttribute::Table(table));
        msg.attributes.push(RuleAttribute::FwMark(fwmark));
        msg.attributes.push(RuleAttribute::FwMask(u32::MAX));
        msg.attributes.push(RuleAttribute::Priority(priority));
        msg
    }

    /// A policy routing rule: packets marked `fwmark` look up `table`.
    pub fn add_rule(&mut self, v6: bool, fwmark: u32, table: u32, priority: u32) -> Result<()> {
        let msg = Self::rule_message(v6, fwmark, table, priority);
        self.request(
            "add a routing rule",
            RouteNetlinkMessage::NewRule(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
        .or_else(|e| e.unless(libc::EEXIST))
    }

    pub fn del_rule(&mut self, v6: bool, fwmark: u32, table: u32, priority: u32) -> Result<()> {
        let msg = Self::rule_message(v6, fwmark, table, priority);
        self.request(
            "delete a routing rule",
            RouteNetlinkMessage::DelRule(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Answers ARP (IPv4) or neighbour solicitations (IPv6) for `addr` on
    /// link `index` with that link's own MAC.
    pub fn add_proxy_neighbour(&mut self, index: u32, addr: IpAddr) -> Result<()> {
        let msg = proxy_neighbour(index, addr);
        self.request(
            "add a proxy neighbour",
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
        .or_else(|e| e.unless(libc::EEXIST))
    }

    /// A permanent neighbour entry: `addr` is at `mac` on link `index`.
    pub fn add_neighbour(&mut self, index: u32, addr: IpAddr, mac: [u8; 6]) -> Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(addr);
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.kind = RouteType::Unicast;
        msg.attributes
            .push(NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        self.request(
            "add a neighbour",
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Creates veth pair `name` (here, down) — `peer` with `mac` and `mtu`
    /// in the namespace open as `peer_netns` (down).
    pub fn add_veth(
        &mut self,
        name: &str,
        peer: &str,
        mac: [u8; 6],
        mtu: u32,
        peer_netns: std::os::fd::RawFd,
    ) -> Result<()> {
        let mut other = LinkMessage::default();
        other
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        other.attributes.push(LinkAttribute::Address(mac.to_vec()));
        other.attributes.push(LinkAttribute::Mtu(mtu));
        other.attributes.push(LinkAttribute::NetNsFd(peer_netns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(other))),
        ]));
        self.request(
            "create a veth pair",
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Sets link `index`'s alias (`IFLA_IFALIAS`).
    pub fn set_alias(&mut self, index: u32, alias: &str) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        self.request(
            "set a link's alias",
            RouteNetlinkMessage::SetLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Deletes link `index` (a veth takes its peer with it).
    pub fn del_link(&mut self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(
            "delete a link",
            RouteNetlinkMessage::DelLink(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    pub fn del_proxy_neighbour(&mut self, index: u32, addr: IpAddr) -> Result<()> {
        let msg = proxy_neighbour(index, addr);
        self.request(
            "delete a proxy neighbour",
            RouteNetlinkMessage::DelNeighbour(msg),
            NLM_F_ACK,
        )?;
        Ok(())
    }
}

/// Gives `link` an interface's name, MTU, addresses and routes (main
/// table), and sets it up. The link's MAC is the interface's already.
pub fn configure_interface(
    nl: &mut Netlink,
    link: &Link,
    iface: &crate::protocol::Interface,
) -> Result<()> {
    let rename = (link.name != iface.name).then_some(iface.name.as_str());
    nl.set_link(link.index, rename, None, Some(iface.mtu), true)?;
    // A link made in, or moved into, a namespace takes that namespace's
    // default IPv6 settings: Docker's namespaces disable IPv6 by default
    // and enable it on the interfaces that have it, and the kernel refuses
    // an IPv6 address on a link where it is off (EACCES).
    if iface.addresses.iter().any(|a| a.addr.is_ipv6()) {
        let path = format!("ipv6/conf/{}/disable_ipv6", iface.name);
        if read_sysctl(&path).is_ok_and(|v| v == "1") {
            sysctl(&path, "0").map_err(|source| NetlinkError::Sysctl {
                path: path.clone(),
                source,
            })?;
        }
    }
    for a in &iface.addresses {
        nl.add_address(link.index, a.addr, a.prefix)?;
    }
    for r in &iface.routes {
        // The kernel made the route of each address's own subnet.
        let own_subnet = r.gateway.is_none()
            && iface
                .addresses
                .iter()
                .any(|a| a.prefix == r.dst.prefix && network(a.addr, a.prefix) == r.dst.addr);
        if own_subnet {
            continue;
        }
        nl.ensure_route(&Route {
            table: TABLE_MAIN,
            dst: r.dst.addr,
            prefix: r.dst.prefix,
            gateway: r.gateway,
            oif: Some(link.index),
            kind: RouteKind::Unicast,
        })?;
    }
    Ok(())
}

fn proxy_neighbour(index: u32, addr: IpAddr) -> NeighbourMessage {
    {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(addr);
        msg.header.ifindex = index;
        msg.header.flags = NeighbourFlags::Proxy;
        msg.attributes
            .push(NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        msg
    }
}

fn family_of(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn link_of(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: l.header.flags.contains(LinkFlags::Up),
        loopback: l.header.flags.contains(LinkFlags::Loopback),
        ether: l.header.link_layer_type == LinkLayerType::Ether,
        alias: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::IfAlias(a) => link.alias = Some(a.clone()),
            LinkAttribute::Address(mac) => link.mac = <[u8; 6]>::try_from(mac.as_slice()).ok(),
            _ => {}
        }
    }
    link
}

fn address_of(a: &AddressMessage) -> Option<Address> {
    let addr = a.attributes.iter().find_map(|at| match at {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    })?;
    Some(Address {
        index: a.header.index,
        addr,
        prefix: a.header.prefix_len,
        global: a.header.scope == AddressScope::Universe,
    })
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn route_of(r: &RouteMessage) -> Option<Route> {
    let unspecified = match r.header.address_family {
        AddressFamily::Inet => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let mut route = Route {
        table: r.header.table,
        dst: unspecified,
        prefix: r.header.destination_prefix_length,
        gateway: None,
        oif: None,
        kind: match r.header.kind {
            RouteType::Unicast => RouteKind::Unicast,
            RouteType::Local => RouteKind::Local,
            _ => RouteKind::Other,
        },
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => route.dst = ip_of(d)?,
            RouteAttribute::Gateway(g) => route.gateway = ip_of(g),
            RouteAttribute::Oif(o) => route.oif = Some(*o),
            RouteAttribute::Table(t) => route.table = u8::try_from(*t).unwrap_or(0),
            _ => {}
        }
    }
    Some(route)
}

/// Writes a sysctl under `/proc/sys/net` of the calling thread's namespace,
/// e.g. `ipv4/conf/tap0/proxy_arp`.
pub fn sysctl(path: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/net/{path}"), value)
}

/// Reads one, trimmed.
pub fn read_sysctl(path: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/net/{path}")).map(|s| s.trim().to_string())
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The network `addr`/`prefix` is in (its host bits cleared).
pub fn network(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & mask).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & mask).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip() {
        let mac = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];
        assert_eq!(format_mac(&mac), "02:42:ac:11:00:02");
        assert_eq!(parse_mac("02:42:ac:11:00:02"), Some(mac));
        assert_eq!(parse_mac("02:42:ac:11:00"), None);
        assert_eq!(parse_mac("02:42:ac:11:00:02:03"), None);
        assert_eq!(parse_mac("2:42:ac:11:00:02"), None);
        assert_eq!(parse_mac("zz:42:ac:11:00:02"), None);
    }

    /// Reads this process's namespace: it always has a loopback link and
    /// its local routes.
    #[test]
    fn reads_links_addresses_and_routes() {
        let mut nl = match Netlink::open() {
            Ok(nl) => nl,
            Err(e) => {
                eprintln!("skipped: no route netlink socket here: {e}");
                return;
            }
        };
        let links = nl.links().expect("links");
        assert!(links.iter().any(|l| l.loopback), "{links:?}");
        let addrs = nl.addresses().expect("addresses");
        let routes = nl.routes().expect("routes");
        if addrs
            .iter()
            .any(|a| a.addr == IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
        {
            assert!(
                routes
                    .iter()
                    .any(|r| r.kind == RouteKind::Local && r.table == TABLE_LOCAL),
                "{routes:?}"
            );
        }
    }

    #[test]
    fn networks_clear_host_bits() {
        let n = |a: &str, p| network(a.parse().unwrap(), p).to_string();
        assert_eq!(n("10.231.0.2", 24), "10.231.0.0");
        assert_eq!(n("10.231.0.2", 0), "0.0.0.0");
        assert_eq!(n("10.231.0.2", 32), "10.231.0.2");
        assert_eq!(n("fd00:231::2", 64), "fd00:231::");
        assert_eq!(n("fd00:231::2", 128), "fd00:231::2");
        assert_eq!(n("fd00:231::2", 0), "::");
    }
}
