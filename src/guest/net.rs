//! The container's network inside the VM. The host reads the interfaces of
//! the container's network namespace and sends them (`HostMessage::Network`);
//! here each virtio NIC, found by the MAC the VMM gave it, moves into a new
//! network namespace held at [`NETNS`], gets the name, MTU, addresses and
//! routes its host counterpart has, and the container joins that namespace
//! by path — so the workload sees what `docker inspect` reports, in a
//! namespace of its own as under runc.
//!
//! The guest is the container's alone, but what it configures here is only
//! a convenience: the host side routes only the container's addresses to the
//! NIC, so a workload that changes them cuts itself off.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use super::AGENT_DIR;
use crate::netlink::{self, Netlink, NetlinkError};
use crate::protocol::{DnsRelay, Network};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network: {0}")]
    Netlink(#[from] NetlinkError),
    #[error("network: {what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("network: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("network: {0}")]
    Invalid(String),
}

/// The container's network namespace in the guest.
pub fn netns_path() -> PathBuf {
    Path::new(AGENT_DIR).join("netns")
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> NetError {
    let what = what.into();
    move |source| NetError::Sys { what, source }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Io { what, source }
}

/// Checks what the host sent before anything is changed.
fn validate(network: &Network) -> Result<Vec<[u8; 6]>, NetError> {
    let mut macs = Vec::new();
    for i in &network.interfaces {
        if i.name.is_empty() || i.name.len() > 15 || i.name.contains(['/', ' ', '\0']) {
            return Err(NetError::Invalid(format!(
                "bad interface name {:?}",
                i.name
            )));
        }
        let mac = netlink::parse_mac(&i.mac)
            .ok_or_else(|| NetError::Invalid(format!("bad MAC {:?}", i.mac)))?;
        if let Some(b) = &i.boot_mac {
            netlink::parse_mac(b)
                .ok_or_else(|| NetError::Invalid(format!("bad boot MAC {b:?}")))?;
        }
        if !(68..=65535).contains(&i.mtu) {
            return Err(NetError::Invalid(format!("bad MTU {}", i.mtu)));
        }
        let bad = |p: u8, a: IpAddr| p > if a.is_ipv4() { 32 } else { 128 };
        for a in &i.addresses {
            if bad(a.prefix, a.addr) {
                return Err(NetError::Invalid(format!("bad prefix /{}", a.prefix)));
            }
        }
        for r in &i.routes {
            if bad(r.dst.prefix, r.dst.addr) {
                return Err(NetError::Invalid(format!("bad route /{}", r.dst.prefix)));
            }
        }
        macs.push(mac);
    }
    Ok(macs)
}

/// Creates the container's namespace with its NICs configured, and the DNS
/// relay in it when one is asked for. Returns the namespace's path.
pub fn configure(network: &Network) -> Result<PathBuf, NetError> {
    let macs = validate(network)?;
    let path = netns_path();
    std::fs::File::create(&path).map_err(io(format!("create {}", path.display())))?;
    // A thread of its own enters the new namespace, so the agent stays in
    // the VM's first one (where the NICs appear).
    let holder = path.clone();
    std::thread::spawn(move || -> Result<(), NetError> {
        unshare(CloneFlags::CLONE_NEWNET).map_err(sys("unshare a network namespace"))?;
        mount(
            Some("/proc/thread-self/ns/net"),
            &holder,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys(format!("bind {}", holder.display())))
    })
    .join()
    .map_err(|_| NetError::Invalid("namespace thread panicked".into()))??;
    let ns = std::fs::File::open(&path).map_err(io(format!("open {}", path.display())))?;

    let mut nl = Netlink::open()?;
    let links = nl.links()?;
    for (iface, mac) in network.interfaces.iter().zip(&macs) {
        // Validated above.
        let boot = iface.boot_mac.as_deref().and_then(netlink::parse_mac);
        let find = boot.as_ref().unwrap_or(mac);
        let link = links
            .iter()
            .find(|l| l.mac.as_ref() == Some(find))
            .ok_or_else(|| {
                NetError::Invalid(format!(
                    "no NIC with MAC {} for {}",
                    netlink::format_mac(find),
                    iface.name
                ))
            })?;
        if boot.is_some() {
            nl.set_link(link.index, None, Some(*mac), None, false)?;
        }
        nl.move_link(link.index, ns.as_raw_fd())?;
    }

    let network = network.clone();
    std::thread::spawn(move || -> Result<(), NetError> {
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(sys("enter the container's namespace"))?;
        configure_inside(&network, &macs)
    })
    .join()
    .map_err(|_| NetError::Invalid("network thread panicked".into()))??;
    Ok(path)
}

/// Runs in the container's namespace.
fn configure_inside(network: &Network, macs: &[[u8; 6]]) -> Result<(), NetError> {
    let mut nl = Netlink::open()?;
    let links = nl.links()?;
    if let Some(lo) = links.iter().find(|l| l.loopback) {
        nl.set_link(lo.index, None, None, None, true)?;
    }
    for (iface, mac) in network.interfaces.iter().zip(macs) {
        let link = links
            .iter()
            .find(|l| l.mac.as_ref() == Some(mac))
            .ok_or_else(|| NetError::Invalid(format!("NIC {} did not move", iface.mac)))?;
        netlink::configure_interface(&mut nl, link, iface)?;
    }
    if let Some(dns) = &network.dns {
        start_dns_relay(dns)?;
    }
    Ok(())
}

/// Listens on port 53 of each loopback address the container's resolver
/// names and relays to the host side.
fn start_dns_relay(dns: &DnsRelay) -> Result<(), NetError> {
    if !dns.upstream.ip().is_ipv4() && !dns.upstream.ip().is_ipv6() {
        return Err(NetError::Invalid("bad DNS upstream".into()));
    }
    let mut listeners = Vec::new();
    for ip in &dns.listen {
        if !ip.is_loopback() {
            return Err(NetError::Invalid(format!(
                "DNS relay on {ip}: only loopback addresses are relayed"
            )));
        }
        let addr = SocketAddr::new(*ip, 53);
        listeners.push(UdpSocket::bind(addr).map_err(io(format!("bind {addr}")))?);
    }
    let any: SocketAddr = if dns.upstream.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let up = UdpSocket::bind(any).map_err(io("bind the DNS relay's socket"))?;
    let upstream = dns.upstream;
    std::thread::spawn(move || crate::dns_relay::run(listeners, up, upstream));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Interface, IpNet};

    fn iface() -> Interface {
        Interface {
            name: "eth0".into(),
            mac: "02:42:ac:11:00:02".into(),
            boot_mac: None,
            mtu: 1500,
            addresses: vec![IpNet {
                addr: "172.17.0.2".parse().unwrap(),
                prefix: 16,
            }],
            routes: vec![],
        }
    }

    #[test]
    fn what_the_host_sends_is_checked() {
        let ok = Network {
            interfaces: vec![iface()],
            dns: None,
        };
        assert!(validate(&ok).is_ok());
        for bad in [
            Interface {
                name: "../x".into(),
                ..iface()
            },
            Interface {
                name: "a-name-too-long-for-linux".into(),
                ..iface()
            },
            Interface {
                mac: "02:42".into(),
                ..iface()
            },
            Interface { mtu: 10, ..iface() },
            Interface {
                boot_mac: Some("02:42".into()),
                ..iface()
            },
            Interface {
                addresses: vec![IpNet {
                    addr: "172.17.0.2".parse().unwrap(),
                    prefix: 33,
                }],
                ..iface()
            },
        ] {
            let n = Network {
                interfaces: vec![bad.clone()],
                dns: None,
            };
            assert!(validate(&n).is_err(), "{bad:?}");
        }
    }
}
