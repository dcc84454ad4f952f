//! IPv6's proxy ARP for a sandbox's tap. The namespace routes the guest's
//! IPv6 traffic as it routes its IPv4 (`router.rs`), and the guest keeps
//! the on-link routes Docker gives it, so it asks by neighbour
//! solicitation for the gateway and for every on-link peer. Linux answers
//! IPv4 ARP for every routed address with `proxy_arp`, but proxies IPv6
//! only for addresses listed one by one; this answers on the tap for any
//! global unicast address but the guest's own, with the tap's MAC, so the
//! guest's packets come to the namespace, which routes them.
//!
//! The frames are the guest's: each is parsed with a bound check on every
//! field, and at most one advertisement goes back per solicitation.

use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETH_P_IPV6: u16 = 0x86dd;
const ETH_HEADER: usize = 14;
const IPV6_HEADER: usize = 40;
const ICMPV6: u8 = 58;
const SOLICITATION: u8 = 135;
const ADVERTISEMENT: u8 = 136;
/// Type, code, checksum, reserved, target.
const NS_LEN: usize = 24;
/// The advertisement with its target link-layer address option.
const NA_LEN: usize = 32;

/// Answers solicitations on one tap.
#[derive(Debug)]
pub struct NdpProxy {
    sock: OwnedFd,
    mac: [u8; 6],
    own: Vec<Ipv6Addr>,
}

impl NdpProxy {
    /// A packet socket on the tap `index`, whose MAC is `mac`; `own` are
    /// the guest's addresses (never answered for: the guest's duplicate
    /// address detection must not see them taken).
    pub fn open(index: u32, mac: [u8; 6], own: Vec<Ipv6Addr>) -> std::io::Result<NdpProxy> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_IPV6.to_be()),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned, owned by nothing else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_IPV6.to_be();
        addr.sll_ifindex = index as i32;
        // SAFETY: bind reads a sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(NdpProxy { sock, mac, own })
    }

    /// What [`NdpProxy::adopt`] needs besides the socket, as text for
    /// another process's command line: `MAC=ADDR,ADDR…`.
    pub fn describe(&self) -> String {
        let own: Vec<String> = self.own.iter().map(|a| a.to_string()).collect();
        format!(
            "{}={}",
            crate::netlink::format_mac(&self.mac),
            own.join(",")
        )
    }

    /// The packet socket, to pass to another process.
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// An answerer on a socket another process opened with [`NdpProxy::open`]
    /// and described with [`NdpProxy::describe`].
    pub fn adopt(sock: OwnedFd, description: &str) -> Result<NdpProxy, String> {
        let bad = || format!("bad neighbour answerer description {description:?}");
        let (mac, own) = description.split_once('=').ok_or_else(bad)?;
        let parts: Vec<u8> = mac
            .split(':')
            .map(|b| u8::from_str_radix(b, 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let mac: [u8; 6] = parts.try_into().map_err(|_| bad())?;
        let own = own
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| a.parse())
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        Ok(NdpProxy { sock, mac, own })
    }

    /// Serves on a thread of its own until the socket fails (the tap gone).
    pub fn spawn(self) {
        std::thread::spawn(move || self.serve());
    }

    fn serve(&self) {
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: recv writes at most buf.len() bytes into buf.
            let n =
                unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let Some(reply) = answer(&buf[..n as usize], self.mac, &self.own) else {
                continue;
            };
            // SAFETY: send reads reply.len() bytes from reply.
            unsafe { libc::send(self.sock.as_raw_fd(), reply.as_ptr().cast(), reply.len(), 0) };
        }
    }
}

/// Whether the namespace answers for `addr`: global unicast, not the
/// guest's.
fn answered(addr: &Ipv6Addr, own: &[Ipv6Addr]) -> bool {
    let first = addr.segments()[0];
    !(addr.is_unspecified()
        || addr.is_loopback()
        || addr.is_multicast()
        || first & 0xffc0 == 0xfe80
        || own.contains(addr))
}

/// The advertisement answering `frame`, if it is a neighbour solicitation
/// for an address the namespace answers for, from a guest address.
pub fn answer(frame: &[u8], mac: [u8; 6], own: &[Ipv6Addr]) -> Option<Vec<u8>> {
    let eth = frame.get(..ETH_HEADER)?;
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IPV6 {
        return None;
    }
    let ip = frame.get(ETH_HEADER..ETH_HEADER + IPV6_HEADER)?;
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    if ip[0] >> 4 != 6 || ip[6] != ICMPV6 || ip[7] != 255 || payload_len < NS_LEN {
        return None;
    }
    let icmp = frame.get(ETH_HEADER + IPV6_HEADER..ETH_HEADER + IPV6_HEADER + payload_len)?;
    if icmp[0] != SOLICITATION || icmp[1] != 0 {
        return None;
    }
    let octets =
        |b: &[u8]| -> Option<Ipv6Addr> { Some(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)) };
    let source = octets(&ip[8..24])?;
    let target = octets(&icmp[8..24])?;
    // Duplicate address detection (from ::) is the guest's own business.
    if source.is_unspecified() || !answered(&target, own) {
        return None;
    }
    let mut out = Vec::with_capacity(ETH_HEADER + IPV6_HEADER + NA_LEN);
    out.extend_from_slice(&eth[6..12]);
    out.extend_from_slice(&mac);
    out.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&(NA_LEN as u16).to_be_bytes());
    out.extend_from_slice(&[ICMPV6, 255]);
    out.extend_from_slice(&target.octets());
    out.extend_from_slice(&source.octets());
    let mut na = [0u8; NA_LEN];
    na[0] = ADVERTISEMENT;
    // Router and Solicited; not Override (a proxy's answer, RFC 4861 7.2.8).
    na[4] = 0xc0;
    na[8..24].copy_from_slice(&target.octets());
    // Target link-layer address option.
    na[24] = 2;
    na[25] = 1;
    na[26..32].copy_from_slice(&mac);
    let sum = checksum(&target, &source, &na);
    na[2..4].copy_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&na);
    Some(out)
}

/// The ICMPv6 checksum of `msg` between `src` and `dst`.
fn checksum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum = sum.wrapping_add(u32::from(word));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(msg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const TAP_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn solicitation(source: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let mut f = vec![0x33, 0x33, 0xff, 0, 0, 1];
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, NS_LEN as u8, ICMPV6, 255]);
        f.extend_from_slice(&source.octets());
        f.extend_from_slice(&"ff02::1:ff00:1".parse::<Ipv6Addr>().unwrap().octets());
        let mut ns = [0u8; NS_LEN];
        ns[0] = SOLICITATION;
        ns[8..24].copy_from_slice(&target.octets());
        f.extend_from_slice(&ns);
        f
    }

    fn addr(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn a_solicitation_for_the_gateway_is_answered_with_the_taps_mac() {
        let own = [addr("fd00::2")];
        let frame = solicitation(addr("fd00::2"), addr("fd00::1"));
        let na = answer(&frame, TAP_MAC, &own).expect("an answer");
        assert_eq!(&na[0..6], &GUEST_MAC);
        assert_eq!(&na[6..12], &TAP_MAC);
        let ip = &na[ETH_HEADER..ETH_HEADER + IPV6_HEADER];
        assert_eq!(&ip[8..24], &addr("fd00::1").octets());
        assert_eq!(&ip[24..40], &addr("fd00::2").octets());
        let icmp = &na[ETH_HEADER + IPV6_HEADER..];
        assert_eq!(icmp.len(), NA_LEN);
        assert_eq!(icmp[0], ADVERTISEMENT);
        assert_eq!(&icmp[8..24], &addr("fd00::1").octets());
        assert_eq!(&icmp[26..32], &TAP_MAC);
        // A correct checksum sums to zero with itself in place.
        let mut zeroed = icmp.to_vec();
        let sum = u16::from_be_bytes([icmp[2], icmp[3]]);
        zeroed[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(checksum(&addr("fd00::1"), &addr("fd00::2"), &zeroed), sum);
    }

    #[test]
    fn its_own_address_dad_link_local_and_multicast_are_not_answered() {
        let own = [addr("fd00::2")];
        for (source, target) in [
            ("fd00::2", "fd00::2"),
            ("::", "fd00::1"),
            ("fd00::2", "fe80::1"),
            ("fd00::2", "ff02::1"),
            ("fd00::2", "::1"),
        ] {
            let frame = solicitation(addr(source), addr(target));
            assert_eq!(
                answer(&frame, TAP_MAC, &own),
                None,
                "{source} asks {target}"
            );
        }
    }

    #[test]
    fn malformed_frames_are_dropped() {
        let own = [addr("fd00::2")];
        let good = solicitation(addr("fd00::2"), addr("fd00::1"));
        for cut in 0..good.len() {
            assert_eq!(answer(&good[..cut], TAP_MAC, &own), None, "cut at {cut}");
        }
        let mut hop = good.clone();
        hop[ETH_HEADER + 7] = 64;
        assert_eq!(answer(&hop, TAP_MAC, &own), None, "hop limit not 255");
        let mut long = good.clone();
        long[ETH_HEADER + 4] = 0xff;
        assert_eq!(answer(&long, TAP_MAC, &own), None, "payload past the frame");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut f = good.clone();
            for _ in 0..4 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed as usize) % f.len();
                f[i] = (seed >> 32) as u8;
            }
            let _ = answer(&f, TAP_MAC, &own);
        }
    }
}
