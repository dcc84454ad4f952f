//! The container's network namespace as the sandbox's router. Docker or
//! CNI fill the namespace with a veth; the sandbox — a microVM, or in the
//! container tier with an egress policy the workload's own namespace —
//! sits behind it on an interface of its own per veth: a tap that the VMM
//! serves ([`Sandbox::Taps`]) or a veth pair whose other end is in the
//! workload's namespace ([`Sandbox::Veths`]).
//!
//! Packets are *routed* through the namespace's own IP stack, never bridged
//! or redirected around it, so whatever the namespace enforces (the egress
//! policy's rules) sees every packet of the sandbox:
//! - the sandbox owns the interface's addresses and MAC: the namespace
//!   keeps the address on its veth (its source address for ARP and its own
//!   traffic) but drops it from the local table, routes it to the sandbox's
//!   interface as a host route, and answers ARP for it on the veth (a proxy
//!   neighbour);
//! - on the sandbox's interface, the namespace answers ARP for every other
//!   address (proxy ARP), so the sandbox keeps the routes `docker inspect`
//!   shows; strict reverse-path filtering drops whatever the sandbox sends
//!   from an address that is not its own.
//! - a resolver on a loopback address of the namespace (Docker's embedded
//!   DNS at 127.0.0.11) is reached by a microVM through a relay on
//!   [`DNS_RELAY`], an address of the tap that the guest's own relay on that
//!   loopback address forwards to.
//!
//! IPv6 is routed the same way, with [`crate::ndp::NdpProxy`] answering
//! neighbour solicitations on the sandbox's interface as proxy ARP does
//! for IPv4. Under a policy the service address has an IPv6 twin,
//! [`SERVICE6`], where the proxy and the resolver also listen.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use oci_spec::runtime::Spec;

use crate::egress::{LOCAL_MARK, LOCAL_RULE_PRIORITY, LOCAL_TABLE};
use crate::netlink::{
    self, Link, Netlink, NetlinkError, Route, RouteKind, TABLE_LOCAL, TABLE_MAIN,
};
use crate::protocol::{DnsRelay, Interface, IpNet, Network, Route as GuestRoute};

/// The namespace-side address of the DNS relay (on the first tap).
pub const DNS_RELAY: Ipv4Addr = Ipv4Addr::new(169, 254, 53, 53);
/// The service address's IPv6 twin (a unique local address of ours, on
/// the first sandbox interface), under a policy when the sandbox has IPv6.
pub const SERVICE6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd61, 0x7676, 0x6d00, 0, 0, 0, 0, 0x53);
/// Taps are named `avtap0`, `avtap1`… in the container's namespace.
pub const TAP_PREFIX: &str = "avtap";
/// The router's ends of the container tier's veth pairs: `avveth0`…
pub const VETH_PREFIX: &str = "avveth";

/// What the sandbox is reached through, one per interface of the namespace.
#[derive(Debug, Clone, Copy)]
pub enum Sandbox<'a> {
    /// A tap each (`avtap0`…), served by a VMM.
    Taps,
    /// Taps a VM booted before its container already serves (a pooled VM's,
    /// `microvm::pool`), moved into the namespace with these names: they
    /// are configured, none is made.
    MadeTaps,
    /// A veth pair each (`avveth0`…), whose other end is made in the
    /// namespace open as this descriptor with the interface's name, MAC
    /// and MTU: the container tier's workload namespace.
    Veths(BorrowedFd<'a>),
}

impl Sandbox<'_> {
    /// The prefix of the sandbox-side interfaces' names in the router.
    pub fn prefix(&self) -> &'static str {
        match self {
            Sandbox::Taps | Sandbox::MadeTaps => TAP_PREFIX,
            Sandbox::Veths(_) => VETH_PREFIX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("microvm network: {0}")]
    Netlink(#[from] NetlinkError),
    #[error("microvm network: {0}")]
    Nft(#[from] crate::egress::nft::NftError),
    #[error("microvm network: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Io { what, source }
}

/// A NIC for the VMM: the tap's descriptor and the guest's MAC.
#[derive(Debug, Clone)]
pub struct Nic {
    pub tap: Arc<OwnedFd>,
    pub mac: [u8; 6],
}

/// The host-side DNS relay's sockets, in the container's namespace.
#[derive(Debug)]
pub struct HostDnsRelay {
    /// Bound to [`DNS_RELAY`]:53.
    pub listener: UdpSocket,
    /// The relay's own socket towards `upstream` (relay mode only).
    pub upstream_socket: Option<UdpSocket>,
    /// The container's resolver, if it has one.
    pub upstream: Option<SocketAddr>,
}

impl HostDnsRelay {
    /// Starts the plain relay (no egress policy) on a thread.
    pub fn spawn(self) {
        if let (Some(sock), Some(up)) = (self.upstream_socket, self.upstream) {
            std::thread::spawn(move || crate::dns_relay::run(vec![self.listener], sock, up));
        }
    }
}

/// How names are resolved for the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsMode {
    /// Not through the namespace (an egress policy without names).
    None,
    /// A plain relay to a loopback resolver of the namespace (no policy).
    Relay,
    /// The egress policy's resolver, for every query (names in the policy).
    Resolver,
}

/// What stays of [`Plumbed`] once the sandbox runs.
#[derive(Debug)]
pub struct Kept {
    pub dns: Option<HostDnsRelay>,
    pub ndp: Vec<crate::ndp::NdpProxy>,
    pub restore: Vec<Restore>,
}

/// An IPv6 link-local destination (`fe80::/10`), which is never routed.
fn is_link_local(addr: &IpAddr) -> bool {
    matches!(addr, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// Why the guest does not get namespace interface `link` (`addrs` being
/// the namespace's addresses), or `None` when it gets a NIC for it.
fn not_for_the_guest(link: &Link, addrs: &[netlink::Address]) -> Option<&'static str> {
    if link.mac.is_none() || !link.ether {
        return Some("not an Ethernet interface; the microVM does not get it");
    }
    let v4 = addrs
        .iter()
        .any(|a| a.index == link.index && a.global && a.addr.is_ipv4());
    if !v4 || !link.up {
        return Some("down or without an IPv4 address; the microVM does not get it");
    }
    None
}

/// How many NICs [`plumb`] would give the guest in the current network
/// namespace.
pub fn guest_nics() -> Result<usize, NetError> {
    let mut nl = Netlink::open()?;
    let links = nl.links()?;
    let addrs = nl.addresses()?;
    Ok(links
        .iter()
        .filter(|l| !l.loopback && !l.name.starts_with(TAP_PREFIX))
        .filter(|l| not_for_the_guest(l, &addrs).is_none())
        .count())
}

/// What [`plumb`] set up. Dropped before [`Plumbed::keep`], it puts the
/// namespace back as it was (boot failed).
#[derive(Debug, Default)]
pub struct Plumbed {
    pub nics: Vec<Nic>,
    pub guest: Network,
    pub dns: Option<HostDnsRelay>,
    pub warnings: Vec<String>,
    /// Local routes taken out of the namespace's local table, and proxy
    /// neighbours added, to put back if the VM never runs.
    restore: Vec<(u32, Route)>,
    /// IPv6 addresses taken off the namespace's links (link, address,
    /// prefix), the same.
    readd: Vec<(u32, IpAddr, u8)>,
    /// The same, by link name, for `delete` to put back in a namespace
    /// that outlives the container (CNI's).
    names: Vec<Restore>,
    /// The egress proxy's listener (a policy other than `allow`).
    pub proxy: Option<std::net::TcpListener>,
    /// Its IPv6 twin on [`SERVICE6`], and the resolver's (names in the
    /// policy), when the sandbox has IPv6.
    pub proxy6: Option<std::net::TcpListener>,
    pub dns6: Option<UdpSocket>,
    /// The container's IPv6 address the daemon's own IPv6 sockets leave
    /// from (see `egress::sock`).
    pub source6: Option<std::net::Ipv6Addr>,
    /// The egress rules' table is installed.
    nft: bool,
    /// Addresses the guest took over, by link index.
    owned: Vec<(u32, IpAddr)>,
    /// The rule keeping them local for the namespace's own connections.
    local_rule: bool,
    /// IPv6 neighbour answers on each sandbox interface with IPv6.
    pub ndp: Vec<crate::ndp::NdpProxy>,
    /// The first sandbox interface with IPv6, where [`SERVICE6`] goes.
    v6_side: Option<u32>,
}

/// The route keeping `addr` local in [`LOCAL_TABLE`] for marked packets.
fn local_route(link: u32, addr: IpAddr) -> Route {
    Route {
        table: LOCAL_TABLE,
        dst: addr,
        prefix: if addr.is_ipv4() { 32 } else { 128 },
        gateway: None,
        oif: Some(link),
        kind: RouteKind::Local,
    }
}

/// An address the guest took over from link `link` of the namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Restore {
    pub link: String,
    pub addr: IpAddr,
    /// Set when the address itself left the link (IPv6: the namespace
    /// would otherwise solicit its neighbours from the guest's address and
    /// their answers would go to the guest): put back with this prefix.
    #[serde(default)]
    pub prefix: Option<u8>,
}

/// Puts IPv6 address `addr`/`prefix` back on link `index`: first the
/// on-link route that stood in for the address's own, then the address
/// (whose own route comes back with it), then no more proxy answers.
fn give_back_v6(nl: &mut Netlink, index: u32, addr: IpAddr, prefix: u8) {
    let _ = nl.del_route(&on_link(index, addr, prefix));
    let _ = nl.add_address(index, addr, prefix);
    let _ = nl.del_proxy_neighbour(index, addr);
}

/// The on-link route of `addr`/`prefix` on link `index`.
fn on_link(index: u32, addr: IpAddr, prefix: u8) -> Route {
    Route {
        table: TABLE_MAIN,
        dst: netlink::network(addr, prefix),
        prefix,
        gateway: None,
        oif: Some(index),
        kind: RouteKind::Unicast,
    }
}

/// Gives the namespace at `netns` its addresses back (`delete`): each is
/// local again and no longer answered for by proxy. Best effort: the
/// namespace or its links may be gone already.
pub fn restore(netns: &Path, entries: &[Restore], egress_rules: bool) {
    let Ok(ns) = std::fs::File::open(netns) else {
        return;
    };
    let entries = entries.to_vec();
    let _ = std::thread::spawn(move || {
        if nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
            return;
        }
        if egress_rules {
            let _ = crate::egress::nft::remove();
        }
        let Ok(mut nl) = Netlink::open() else {
            return;
        };
        let (Ok(links), Ok(addrs)) = (nl.links(), nl.addresses()) else {
            return;
        };
        for e in &entries {
            let Some(link) = links.iter().find(|l| l.name == e.link) else {
                continue;
            };
            if let Some(prefix) = e.prefix {
                give_back_v6(&mut nl, link.index, e.addr, prefix);
                let _ = nl.del_route(&local_route(link.index, e.addr));
                continue;
            }
            if !addrs
                .iter()
                .any(|a| a.index == link.index && a.addr == e.addr)
            {
                continue;
            }
            let _ = nl.add_route(&Route {
                table: TABLE_LOCAL,
                dst: e.addr,
                prefix: if e.addr.is_ipv4() { 32 } else { 128 },
                gateway: None,
                oif: Some(link.index),
                kind: RouteKind::Local,
            });
            let _ = nl.del_proxy_neighbour(link.index, e.addr);
            let _ = nl.del_route(&local_route(link.index, e.addr));
        }
        for v6 in [false, true] {
            let _ = nl.del_rule(v6, LOCAL_MARK, LOCAL_TABLE.into(), LOCAL_RULE_PRIORITY);
        }
    })
    .join();
}

impl Plumbed {
    /// The VM runs: the plumbing stays for its life (the taps go with
    /// QEMU; the namespace goes with the container). Returns the host-side
    /// DNS relay to start.
    /// Installs the egress rules (removed again if boot fails).
    pub fn install_egress(&mut self, ruleset: &str) -> Result<(), NetError> {
        self.nft = true;
        crate::egress::nft::apply(ruleset).map_err(NetError::Nft)?;
        // Bytes and times per flow, for the audit lines of UDP flows
        // (conntrack is loaded now: the rules use it).
        for path in [
            "netfilter/nf_conntrack_acct",
            "netfilter/nf_conntrack_timestamp",
        ] {
            netlink::sysctl(path, "1").map_err(io(format!("set net.{path}")))?;
        }
        Ok(())
    }

    /// The sandbox's interfaces as the egress rules see them.
    pub fn sources(&self, sandbox: Sandbox<'_>) -> Vec<crate::egress::Source> {
        self.guest
            .interfaces
            .iter()
            .enumerate()
            .map(|(i, iface)| crate::egress::Source {
                side: format!("{}{i}", sandbox.prefix()),
                mac: iface.mac.clone(),
                addrs: iface.addresses.iter().map(|a| a.addr).collect(),
            })
            .collect()
    }

    /// The VM runs: the plumbing stays for its life. Returns what runs
    /// beside it (the DNS relay, the IPv6 neighbour answers) and what
    /// `delete` puts back.
    pub fn keep(mut self) -> Kept {
        self.restore.clear();
        self.readd.clear();
        self.nft = false;
        self.local_rule = false;
        Kept {
            dns: self.dns.take(),
            ndp: std::mem::take(&mut self.ndp),
            restore: std::mem::take(&mut self.names),
        }
    }
}

impl Drop for Plumbed {
    /// Puts the namespace back as it was (the taps go with their
    /// descriptors). Best effort.
    fn drop(&mut self) {
        if self.local_rule {
            if let Ok(mut nl) = Netlink::open() {
                for v6 in [false, true] {
                    let _ = nl.del_rule(v6, LOCAL_MARK, LOCAL_TABLE.into(), LOCAL_RULE_PRIORITY);
                }
                for (link, addr) in &self.owned {
                    let _ = nl.del_route(&local_route(*link, *addr));
                }
            }
        }
        if self.nft {
            let _ = crate::egress::nft::remove();
        }
        if self.restore.is_empty() && self.readd.is_empty() {
            return;
        }
        let Ok(mut nl) = Netlink::open() else {
            return;
        };
        for (link, route) in self.restore.drain(..) {
            let _ = nl.add_route(&route);
            let _ = nl.del_proxy_neighbour(link, route.dst);
        }
        for (link, addr, prefix) in self.readd.drain(..) {
            give_back_v6(&mut nl, link, addr, prefix);
        }
    }
}

/// Reads the namespace the calling thread is in and plumbs an interface
/// of the `sandbox`'s per interface. `resolv_conf` is the container's
/// resolver file.
///
/// `dns` says how the guest resolves names (see [`DnsMode`]); with
/// `egress` (a policy other than `allow`) the namespace also gets the
/// egress proxy's listener on the service address.
pub fn plumb(
    resolv_conf: Option<&str>,
    dns: DnsMode,
    egress: bool,
    sandbox: Sandbox<'_>,
) -> Result<Plumbed, NetError> {
    let mut nl = Netlink::open()?;
    let links = nl.links()?;
    let addrs = nl.addresses()?;
    let routes = nl.routes()?;
    let mut out = Plumbed::default();
    let candidates: Vec<&Link> = links
        .iter()
        .filter(|l| !l.loopback && !l.name.starts_with(sandbox.prefix()))
        .collect();
    for link in candidates {
        if let Some(why) = not_for_the_guest(link, &addrs) {
            out.warnings.push(format!("{}: {why}", link.name));
            continue;
        }
        let v4: Vec<_> = addrs
            .iter()
            .filter(|a| a.index == link.index && a.global && a.addr.is_ipv4())
            .copied()
            .collect();
        let v6: Vec<_> = addrs
            .iter()
            .filter(|a| a.index == link.index && a.global && a.addr.is_ipv6())
            .copied()
            .collect();
        let route_v6 = !v6.is_empty();
        let Some(mac) = link.mac else {
            continue;
        };
        let tap_name = format!("{}{}", sandbox.prefix(), out.guest.interfaces.len());
        let tap = match sandbox {
            Sandbox::Taps => Some(open_tap(&tap_name)?),
            Sandbox::MadeTaps => None,
            Sandbox::Veths(netns) => {
                nl.add_veth(&tap_name, &link.name, mac, link.mtu, netns.as_raw_fd())?;
                None
            }
        };
        let side = nl
            .links()?
            .into_iter()
            .find(|l| l.name == tap_name)
            .ok_or_else(|| NetError::Io {
                what: format!("find {tap_name}"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
        let tap_index = side.index;
        let mut sysctls = vec![
            ("ipv4/ip_forward".to_string(), "1"),
            (format!("ipv4/conf/{tap_name}/proxy_arp"), "1"),
            (format!("ipv4/conf/{tap_name}/rp_filter"), "1"),
            (format!("ipv4/conf/{tap_name}/send_redirects"), "0"),
            (format!("ipv4/neigh/{tap_name}/proxy_delay"), "0"),
            (format!("ipv4/neigh/{}/proxy_delay", link.name), "0"),
            (
                format!("ipv6/conf/{tap_name}/disable_ipv6"),
                if route_v6 { "0" } else { "1" },
            ),
        ];
        if route_v6 {
            sysctls.extend([
                ("ipv6/conf/all/forwarding".to_string(), "1"),
                (format!("ipv6/conf/{tap_name}/accept_ra"), "0"),
                (format!("ipv6/conf/{}/proxy_ndp", link.name), "1"),
            ]);
        }
        for (path, value) in &sysctls {
            netlink::sysctl(path, value).map_err(io(format!("set net.{path}")))?;
        }
        // Loose filtering on `all` would override the tap's strict one.
        if netlink::read_sysctl("ipv4/conf/all/rp_filter").is_ok_and(|v| v == "2") {
            netlink::sysctl("ipv4/conf/all/rp_filter", "1")
                .map_err(io("set net.ipv4.conf.all.rp_filter"))?;
        }
        nl.set_link(tap_index, None, None, Some(link.mtu), true)?;

        let mut guest_routes = Vec::new();
        // On-link routes first: a gateway must be reachable when its
        // route is added.
        let mut own: Vec<&Route> = routes
            .iter()
            .filter(|r| {
                r.table == TABLE_MAIN
                    && r.kind == RouteKind::Unicast
                    && r.oif == Some(link.index)
                    && (r.dst.is_ipv4() || (route_v6 && !is_link_local(&r.dst)))
            })
            .collect();
        own.sort_by_key(|r| r.gateway.is_some());
        for r in own {
            guest_routes.push(GuestRoute {
                dst: IpNet {
                    addr: r.dst,
                    prefix: r.prefix,
                },
                gateway: r.gateway,
            });
        }
        let routed: Vec<_> = v4
            .iter()
            .chain(v6.iter().filter(|_| route_v6))
            .copied()
            .collect();
        for a in &routed {
            let host = if a.addr.is_ipv4() { 32 } else { 128 };
            if a.addr.is_ipv6() {
                // The address leaves the link, and an on-link route stands
                // in for the one it took with it.
                match nl.del_address(link.index, a.addr, a.prefix) {
                    Ok(()) => {
                        out.readd.push((link.index, a.addr, a.prefix));
                        out.names.push(Restore {
                            link: link.name.clone(),
                            addr: a.addr,
                            prefix: Some(a.prefix),
                        });
                    }
                    Err(e) => e.unless(libc::EADDRNOTAVAIL)?,
                }
                nl.ensure_route(&on_link(link.index, a.addr, a.prefix))?;
            }
            let local = Route {
                table: TABLE_LOCAL,
                dst: a.addr,
                prefix: host,
                gateway: None,
                oif: Some(link.index),
                kind: RouteKind::Local,
            };
            // Already gone when a namespace that outlived a container is
            // used again (and with an IPv6 address that left the link).
            match nl.del_route(&local) {
                Ok(()) => {
                    out.restore.push((link.index, local));
                    out.names.push(Restore {
                        link: link.name.clone(),
                        addr: a.addr,
                        prefix: None,
                    });
                }
                Err(e) => e.unless(libc::ESRCH)?,
            }
            nl.add_route(&Route {
                table: TABLE_MAIN,
                dst: a.addr,
                prefix: host,
                gateway: None,
                oif: Some(tap_index),
                kind: RouteKind::Unicast,
            })?;
            nl.add_proxy_neighbour(link.index, a.addr)?;
            out.owned.push((link.index, a.addr));
            if a.addr.is_ipv6() && out.v6_side.is_none() {
                out.v6_side = Some(tap_index);
            }
            // The namespace never asks the guest who it is: its ARP request
            // would come from the guest's own address, which the guest
            // drops as a martian.
            nl.add_neighbour(tap_index, a.addr, mac)?;
        }
        out.guest.interfaces.push(Interface {
            name: link.name.clone(),
            mac: netlink::format_mac(&mac),
            boot_mac: None,
            mtu: link.mtu,
            addresses: routed
                .iter()
                .map(|a| IpNet {
                    addr: a.addr,
                    prefix: a.prefix,
                })
                .collect(),
            routes: guest_routes,
        });
        if route_v6 {
            let own = v6
                .iter()
                .filter_map(|a| match a.addr {
                    IpAddr::V6(v) => Some(v),
                    IpAddr::V4(_) => None,
                })
                .collect();
            let mac = side.mac.ok_or_else(|| NetError::Io {
                what: format!("read the MAC of {tap_name}"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
            out.ndp.push(
                crate::ndp::NdpProxy::open(tap_index, mac, own)
                    .map_err(io(format!("answer neighbour solicitations on {tap_name}")))?,
            );
        }
        if let Some(tap) = tap {
            out.nics.push(Nic {
                tap: Arc::new(tap),
                mac,
            });
        }
    }

    let servers = resolv_conf.map(nameservers).unwrap_or_default();
    let loopback_resolvers: Vec<IpAddr> = servers
        .iter()
        .copied()
        .filter(|ip| ip.is_ipv4() && ip.is_loopback())
        .collect();
    let upstream = match dns {
        DnsMode::None => None,
        DnsMode::Relay => loopback_resolvers.first().copied(),
        // Whatever the container's first resolver is.
        DnsMode::Resolver => Some(
            servers
                .first()
                .copied()
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        ),
    };
    let Some(iface) = out.guest.interfaces.first_mut() else {
        return Ok(out);
    };
    if upstream.is_none() && !egress {
        return Ok(out);
    }
    // The service address: the DNS relay's and the egress proxy's.
    let tap_index = nl
        .links()?
        .into_iter()
        .find(|l| l.name == format!("{}0", sandbox.prefix()))
        .map(|l| l.index)
        .unwrap_or(0);
    nl.add_address(tap_index, IpAddr::V4(DNS_RELAY), 32)?;
    if let Some(up) = upstream {
        let listener = UdpSocket::bind(SocketAddr::new(IpAddr::V4(DNS_RELAY), 53))
            .map_err(io(format!("bind {DNS_RELAY}:53")))?;
        // The relay thread runs jailed, where no socket can be opened.
        let upstream_socket = match dns {
            DnsMode::Relay => {
                Some(UdpSocket::bind(("0.0.0.0", 0)).map_err(io("bind the DNS relay's socket"))?)
            }
            _ => None,
        };
        iface.routes.insert(
            0,
            GuestRoute {
                dst: IpNet {
                    addr: IpAddr::V4(DNS_RELAY),
                    prefix: 32,
                },
                gateway: None,
            },
        );
        if !loopback_resolvers.is_empty() {
            iface_dns(&mut out.guest, &loopback_resolvers);
        }
        out.dns = Some(HostDnsRelay {
            listener,
            upstream_socket,
            upstream: (!up.is_unspecified()).then(|| SocketAddr::new(up, 53)),
        });
    }
    if egress {
        // The egress daemon's queries and connections leave from the
        // container's address: their replies are for the namespace, not
        // the guest.
        out.local_rule = true;
        for (link, addr) in out.owned.clone() {
            nl.add_route(&local_route(link, addr))?;
        }
        nl.add_rule(false, LOCAL_MARK, LOCAL_TABLE.into(), LOCAL_RULE_PRIORITY)?;
        let at = SocketAddr::new(IpAddr::V4(DNS_RELAY), crate::egress::proxy::PROXY_PORT);
        out.proxy = Some(
            std::net::TcpListener::bind(at)
                .map_err(io(format!("bind the egress proxy on {at}")))?,
        );
        if let Some(side) = out.v6_side {
            egress_v6(&mut nl, &mut out, side, dns == DnsMode::Resolver)?;
        }
    }
    Ok(out)
}

/// The policy's IPv6 half: [`SERVICE6`] on sandbox interface `side`, the
/// proxy's and the resolver's listeners there, and the rule keeping the
/// container's IPv6 addresses local for the daemon's own connections.
fn egress_v6(nl: &mut Netlink, out: &mut Plumbed, side: u32, names: bool) -> Result<(), NetError> {
    nl.add_rule(true, LOCAL_MARK, LOCAL_TABLE.into(), LOCAL_RULE_PRIORITY)?;
    out.source6 = out.owned.iter().find_map(|(_, a)| match a {
        IpAddr::V6(v) => Some(*v),
        IpAddr::V4(_) => None,
    });
    nl.add_address(side, IpAddr::V6(SERVICE6), 128)?;
    let at = SocketAddr::new(IpAddr::V6(SERVICE6), crate::egress::proxy::PROXY_PORT);
    out.proxy6 = Some(
        std::net::TcpListener::bind(at).map_err(io(format!("bind the egress proxy on {at}")))?,
    );
    if names {
        let at = SocketAddr::new(IpAddr::V6(SERVICE6), 53);
        out.dns6 = Some(UdpSocket::bind(at).map_err(io(format!("bind the resolver on {at}")))?);
    }
    Ok(())
}

/// The guest's resolvers on loopback, relayed to the service address.
fn iface_dns(guest: &mut Network, loopback: &[IpAddr]) {
    guest.dns = Some(DnsRelay {
        listen: loopback.to_vec(),
        upstream: SocketAddr::new(IpAddr::V4(DNS_RELAY), 53),
    });
}

/// How long the egress daemon lives.
#[derive(Debug, Clone, Copy)]
pub enum DaemonLife<'a> {
    /// Until its parent (the microVM's supervisor) closes this pipe's
    /// write end — it then writes what it still holds and ends — or dies.
    WithParent(BorrowedFd<'a>),
    /// Detached, in a session of its own, until the process this pidfd
    /// refers to (the container tier's init) exits.
    While(BorrowedFd<'a>),
}

/// `agentvm egress-daemon` for one sandbox, in the calling thread's
/// namespace, with the sockets it serves on, bound already.
pub struct EgressDaemon<'a> {
    pub policy: &'a str,
    pub id: &'a str,
    pub audit: &'a Path,
    /// The resolver's socket (names in the policy) and its upstream.
    pub dns: Option<HostDnsRelay>,
    pub proxy: std::net::TcpListener,
    /// Where `egress.log` goes.
    pub run_dir: &'a Path,
    pub life: DaemonLife<'a>,
    /// The container tier's second resolver socket, in the workload's
    /// namespace, and [`crate::egress::daemon::POOL_SIZE`] sockets there
    /// connected to the resolver on its loopback.
    pub workload_dns: Option<(UdpSocket, Vec<UdpSocket>)>,
    /// IPv6: the proxy's and resolver's listeners on [`SERVICE6`], the
    /// container's address the daemon's own sockets leave from, and the
    /// neighbour answers the daemon serves (the container tier's; a
    /// microVM's supervisor serves its own).
    pub proxy6: Option<std::net::TcpListener>,
    pub dns6: Option<UdpSocket>,
    pub source6: Option<std::net::Ipv6Addr>,
    pub ndp: Vec<crate::ndp::NdpProxy>,
}

impl EgressDaemon<'_> {
    /// Starts it; its log is `egress.log` in `run_dir`.
    pub fn spawn(self) -> Result<std::process::Child, NetError> {
        use crate::egress::daemon::{
            DNS6_FD, DNS_FD, FIRST_UNUSED_FD, MAX_NDP, NDP_FD, POOL_SIZE, PROXY6_FD, PROXY_FD,
            WATCH_FD, WORKLOAD_DNS_FD,
        };
        use std::os::unix::process::CommandExt;
        let exe = std::fs::read_link("/proc/self/exe").map_err(io("find the agentvm binary"))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("egress-daemon")
            .arg("--policy")
            .arg(self.policy)
            .arg("--id")
            .arg(self.id)
            .arg("--audit")
            .arg(self.audit)
            .arg("--own")
            .arg(DNS_RELAY.to_string());
        if let Some(up) = self.dns.as_ref().and_then(|d| d.upstream) {
            cmd.arg("--upstream").arg(up.to_string());
        }
        // (source descriptor, its number in the daemon)
        let mut fds = vec![(self.proxy.as_raw_fd(), PROXY_FD)];
        if let Some(d) = &self.dns {
            cmd.arg("--dns");
            fds.push((d.listener.as_raw_fd(), DNS_FD));
        }
        let (watch, detach) = match self.life {
            DaemonLife::WithParent(pipe) => (pipe, false),
            DaemonLife::While(pidfd) => (pidfd, true),
        };
        cmd.arg("--watch");
        fds.push((watch.as_raw_fd(), WATCH_FD));
        if detach {
            cmd.arg("--detached");
        }
        if let Some((listener, pool)) = &self.workload_dns {
            if pool.len() != POOL_SIZE as usize {
                return Err(io("pass the workload's resolver sockets")(
                    std::io::Error::from(std::io::ErrorKind::InvalidInput),
                ));
            }
            cmd.arg("--workload-dns");
            fds.push((listener.as_raw_fd(), WORKLOAD_DNS_FD));
            for (i, s) in pool.iter().enumerate() {
                fds.push((s.as_raw_fd(), WORKLOAD_DNS_FD + 1 + i as i32));
            }
        }
        if let Some(p) = &self.proxy6 {
            cmd.arg("--proxy6").arg("--own").arg(SERVICE6.to_string());
            fds.push((p.as_raw_fd(), PROXY6_FD));
        }
        if let Some(d) = &self.dns6 {
            cmd.arg("--dns6");
            fds.push((d.as_raw_fd(), DNS6_FD));
        }
        if let Some(s) = self.source6 {
            cmd.arg("--source6").arg(s.to_string());
        }
        if self.ndp.len() > MAX_NDP as usize {
            return Err(io("answer neighbour solicitations")(std::io::Error::other(
                format!("more than {MAX_NDP} interfaces with IPv6"),
            )));
        }
        for (i, n) in self.ndp.iter().enumerate() {
            cmd.arg("--ndp").arg(n.describe());
            fds.push((n.as_raw_fd(), NDP_FD + i as i32));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run_dir.join("egress.log"))
            .map_err(io("open egress.log"))?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        let mut high = vec![-1; fds.len()];
        // SAFETY: between fork and exec only fcntl, dup2 and setsid, which
        // are async-signal-safe, and writes into `high`, allocated before
        // the fork; the descriptors stay open until spawn returns (`self`
        // owns or borrows them).
        unsafe {
            cmd.pre_exec(move || {
                // Each source first above every target (a source may have
                // a target's number), then into place.
                for (slot, (from, _)) in high.iter_mut().zip(&fds) {
                    *slot = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, FIRST_UNUSED_FD);
                    if *slot < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (h, (_, to)) in high.iter().zip(&fds) {
                    if libc::dup2(*h, *to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if detach && libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        if !detach {
            crate::microvm::vmm::die_with_parent(&mut cmd);
        }
        crate::microvm::vmm::inherit_below(&mut cmd, FIRST_UNUSED_FD as u32);
        cmd.spawn().map_err(io("start the egress daemon"))
    }
}

/// The `nameserver` addresses of a resolv.conf.
pub fn nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
                .and_then(|w| w.parse().ok())
        })
        .collect()
}

/// The container's resolv.conf as the host sees it: the file bind-mounted
/// at /etc/resolv.conf (Docker, Podman), else the rootfs's own.
pub fn resolv_conf(spec: &Spec, rootfs: &Path) -> Option<String> {
    let mounted = spec.mounts().as_ref().and_then(|ms| {
        ms.iter()
            .rev()
            .find(|m| m.destination() == Path::new("/etc/resolv.conf"))
            .and_then(|m| m.source().clone())
    });
    let path = mounted.unwrap_or_else(|| rootfs.join("etc/resolv.conf"));
    std::fs::read_to_string(path).ok()
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `TUNSETIFF`: _IOW('T', 202, int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Creates tap `name` (gone when its last descriptor closes).
pub fn open_tap(name: &str) -> Result<OwnedFd, NetError> {
    let what = || format!("create tap {name} (/dev/net/tun)");
    let path = c"/dev/net/tun";
    // SAFETY: open(2) with a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io(what())(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _pad: [0; 22],
    };
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io(what())(std::io::Error::from(
            std::io::ErrorKind::InvalidInput,
        )));
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `req` is
    // laid out as (name, flags, padding to its full size).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) };
    if rc < 0 {
        return Err(io(what())(std::io::Error::last_os_error()));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_is_the_kernels_size() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
    }

    #[test]
    fn nameservers_are_read() {
        let text = "# generated\nsearch x\nnameserver 127.0.0.11\nnameserver  10.0.0.2 # c\n\
                    nameserver bogus\noptions ndots:0\n";
        assert_eq!(
            nameservers(text),
            vec![
                "127.0.0.11".parse::<IpAddr>().unwrap(),
                "10.0.0.2".parse().unwrap()
            ]
        );
    }
}
