//! The container's network inside the VM. The host reads the interfaces of
//! the container's network namespace and sends them (`HostMessage::Network`);
//! here each virtio NIC, found by the MAC the VMM gave it, gets the name,
//! MTU, addresses and routes its host counterpart has, in the VM's own
//! network namespace, which the container then joins by path ([`VM_NETNS`])
//! — so the workload sees what `docker inspect` reports.
//!
//! The VM is the container's (its pod's) alone and the agent listens on no
//! network socket, so the container needs no namespace of its own inside
//! it: a new one cost a network namespace's setup and a move of each NIC,
//! 50 ms of a Docker container's boot under TCG (`guest network` in the
//! boot trace: 85-90 ms against 35-38 ms).
//!
//! What the guest configures here is only a convenience: the host side
//! routes only the container's addresses to the NIC, so a workload that
//! changes them cuts itself off.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;

use crate::netlink::{self, Netlink, NetlinkError};
use crate::protocol::{DnsRelay, Network};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("network: {0}")]
    Netlink(#[from] NetlinkError),
    #[error("network: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("network: {0}")]
    Invalid(String),
}

/// The VM's network namespace, the agent's (it is PID 1), which the
/// container joins.
pub const VM_NETNS: &str = "/proc/1/ns/net";

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

/// Configures the NICs (and the DNS relay when one is asked for) in the
/// VM's namespace. Returns the path the container joins it by.
pub fn configure(network: &Network) -> Result<PathBuf, NetError> {
    let macs = validate(network)?;
    let mut nl = Netlink::open()?;
    let links = nl.links()?;
    // `lo` is up since boot (`boot::setup`), in this same namespace.
    for (iface, mac) in network.interfaces.iter().zip(&macs) {
        // A pooled VM's NIC booted with a MAC of its own and takes the
        // container's.
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
        netlink::configure_interface(&mut nl, link, iface)?;
    }
    if let Some(dns) = &network.dns {
        start_dns_relay(dns)?;
    }
    Ok(PathBuf::from(VM_NETNS))
}

/// Sets the `net.*` sysctls of `spec` in the VM's namespace when the
/// container joins it, and takes them out of the spec: libcontainer (as
/// runc) refuses them in a namespace its own process is in, taking it for
/// the host's, and the agent is in the VM's. Written here, in the same
/// namespace, they are what the container would have set.
pub fn apply_net_sysctls(spec: &mut oci_spec::runtime::Spec) -> Result<(), NetError> {
    let Some(linux) = spec.linux_mut() else {
        return Ok(());
    };
    let joins_vm = linux.namespaces().as_ref().is_some_and(|nss| {
        nss.iter().any(|ns| {
            ns.typ() == oci_spec::runtime::LinuxNamespaceType::Network
                && ns.path().as_deref() == Some(std::path::Path::new(VM_NETNS))
        })
    });
    let Some(sysctls) = linux.sysctl_mut().as_mut().filter(|_| joins_vm) else {
        return Ok(());
    };
    let net: Vec<(String, String)> = sysctls
        .iter()
        .filter(|(k, _)| k.starts_with("net."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // All checked before any is written.
    if let Some((key, _)) = net.iter().find(|(key, _)| {
        !key.split('.')
            .all(|part| !part.is_empty() && !part.contains(['/', '\0']))
    }) {
        return Err(NetError::Invalid(format!("invalid sysctl {key:?}")));
    }
    for (key, value) in &net {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        std::fs::write(&path, value).map_err(io(format!("sysctl {key}")))?;
        sysctls.remove(key);
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

    fn spec_joining(path: &str, sysctls: &[(&str, &str)]) -> oci_spec::runtime::Spec {
        let mut spec = oci_spec::runtime::Spec::default();
        let mut linux = spec.linux().clone().unwrap_or_default();
        let mut ns = oci_spec::runtime::LinuxNamespace::default();
        ns.set_typ(oci_spec::runtime::LinuxNamespaceType::Network);
        ns.set_path(Some(path.into()));
        linux.set_namespaces(Some(vec![ns]));
        linux.set_sysctl(Some(
            sysctls
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        spec.set_linux(Some(linux));
        spec
    }

    fn sysctls(spec: &oci_spec::runtime::Spec) -> Vec<String> {
        let mut keys: Vec<String> = spec
            .linux()
            .as_ref()
            .and_then(|l| l.sysctl().clone())
            .unwrap_or_default()
            .into_keys()
            .collect();
        keys.sort();
        keys
    }

    /// Only a container that joins the VM's namespace has its sysctls
    /// taken out of its spec, and a name that would leave /proc/sys/net
    /// is refused before anything is written.
    #[test]
    fn net_sysctls_are_the_agent_s_only_in_the_vm_s_namespace() {
        let wanted = [
            ("net.ipv4.ip_unprivileged_port_start", "0"),
            ("kernel.shmmax", "1"),
        ];
        let mut other = spec_joining("/proc/7/ns/net", &wanted);
        apply_net_sysctls(&mut other).expect("nothing to do");
        assert_eq!(
            sysctls(&other),
            ["kernel.shmmax", "net.ipv4.ip_unprivileged_port_start"]
        );
        for bad in ["net.ipv4..x", "net.ipv4/../../kernel.x", "net.", "net.a\0b"] {
            let mut spec = spec_joining(VM_NETNS, &[(bad, "1"), ("kernel.shmmax", "1")]);
            let err = apply_net_sysctls(&mut spec).expect_err(bad);
            assert!(err.to_string().contains("invalid sysctl"), "{err}");
            assert_eq!(
                sysctls(&spec),
                ["kernel.shmmax", bad],
                "{bad}: spec changed"
            );
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
