//! What nftables reports of the sandbox's traffic it refuses. The egress
//! rules log each new flow they deny, and each packet from a source that is
//! not the sandbox's, to the netlink log group [`GROUP`] of the container's
//! namespace, with a prefix saying which ([`prefix_denied`],
//! [`prefix_spoofed`]); the egress daemon reads them here and turns them
//! into audit events. TCP connections are the proxy's to record, and the
//! UDP flows a rule allows are written at their end (`conntrack.rs`).
//!
//! Only the packet's first [`COPY_RANGE`] bytes are copied from the
//! kernel, and the packet is the sandbox's: its headers are parsed with a
//! bound check on every field.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    config_request, ConfigCmd, ConfigMode, PacketNla, ULogMessage,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{constants::NETLINK_NETFILTER, Socket};

use crate::audit::{Event, Verdict};

use super::trail::Trail;

/// The netlink log group of the egress rules (per network namespace).
pub const GROUP: u16 = 176;
/// Bytes of each packet copied: IP and transport headers.
pub const COPY_RANGE: u32 = 96;

/// The prefix of denials.
pub fn prefix_denied() -> &'static str {
    "agentvm deny"
}

/// The prefix of packets whose source address or MAC is not the
/// sandbox's.
pub fn prefix_spoofed() -> &'static str {
    "agentvm spoof"
}

#[derive(Debug, thiserror::Error)]
pub enum NflogError {
    #[error("egress log: {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("egress log: the kernel refused {what}: errno {code}")]
    Refused { what: &'static str, code: i32 },
}

/// One flow, as read from its first packet.
#[derive(Debug, PartialEq, Eq)]
pub struct Flow {
    pub proto: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
}

/// What the rules said of a logged packet.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Logged {
    Denied,
    /// A source address or MAC that is not the sandbox's.
    Spoofed,
}

/// The protocol, destination and destination port of an IP packet.
pub fn parse_packet(p: &[u8]) -> Option<Flow> {
    let (proto, src, dst, l4) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p.first()? & 0x0f) * 4;
            if ihl < 20 {
                return None;
            }
            let src = Ipv4Addr::new(*p.get(12)?, *p.get(13)?, *p.get(14)?, *p.get(15)?);
            let dst = Ipv4Addr::new(*p.get(16)?, *p.get(17)?, *p.get(18)?, *p.get(19)?);
            (
                *p.get(9)?,
                IpAddr::V4(src),
                IpAddr::V4(dst),
                p.get(ihl..).unwrap_or_default(),
            )
        }
        6 => {
            let src: [u8; 16] = p.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = p.get(24..40)?.try_into().ok()?;
            (
                *p.get(6)?,
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                p.get(40..).unwrap_or_default(),
            )
        }
        _ => return None,
    };
    let name = match proto {
        1 => "icmp".to_string(),
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        58 => "icmpv6".to_string(),
        132 => "sctp".to_string(),
        n => n.to_string(),
    };
    let port = match proto {
        6 | 17 | 132 => match l4.get(2..4) {
            Some(b) => u16::from_be_bytes([b[0], b[1]]),
            None => 0,
        },
        _ => 0,
    };
    Some(Flow {
        proto: name,
        src,
        dst,
        port,
    })
}

/// What a logged packet means.
pub fn parse_prefix(prefix: &[u8]) -> Option<Logged> {
    let p = std::str::from_utf8(prefix).ok()?.trim_end_matches('\0');
    if p == prefix_denied() {
        return Some(Logged::Denied);
    }
    if p == prefix_spoofed() {
        return Some(Logged::Spoofed);
    }
    None
}

/// What one logged packet says: the limiter's key, the verdict, and the
/// event (given the count of suppressed denials before it).
pub fn event(nlas: &[PacketNla]) -> Option<(String, Verdict, impl FnOnce(u64) -> Event)> {
    let mut prefix = None;
    let mut payload = None;
    for nla in nlas {
        match nla {
            PacketNla::Prefix(p) => prefix = Some(p.as_bytes()),
            PacketNla::Payload(p) => payload = Some(p.as_slice()),
            _ => {}
        }
    }
    let logged = parse_prefix(prefix?)?;
    let flow = parse_packet(payload?)?;
    let (verdict, rule, reason, key) = match logged {
        Logged::Denied => (
            Verdict::Denied,
            None,
            None,
            format!("deny {} {}:{}", flow.proto, flow.dst, flow.port),
        ),
        Logged::Spoofed => (
            Verdict::Denied,
            None,
            Some(format!(
                "source {} or its MAC is not the sandbox's",
                flow.src
            )),
            format!(
                "spoof {} {} {}:{}",
                flow.src, flow.proto, flow.dst, flow.port
            ),
        ),
    };
    let build = move |suppressed| Event::Connection {
        verdict,
        rule,
        reason,
        proto: flow.proto,
        dst: flow.dst,
        port: flow.port,
        name: None,
        name_from: None,
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: 0,
        suppressed,
    };
    Some((key, verdict, build))
}

fn send(socket: &Socket, msg: NetlinkMessage<NetfilterMessage>) -> Result<(), NflogError> {
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    socket.send(&buf, 0).map_err(|source| NflogError::Io {
        what: "send a config request",
        source,
    })?;
    Ok(())
}

fn ack(socket: &Socket, what: &'static str) -> Result<(), NflogError> {
    let mut buf = vec![0u8; 8192];
    let n = socket
        .recv(&mut &mut buf[..], 0)
        .map_err(|source| NflogError::Io { what, source })?;
    if let Ok(msg) = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[..n]) {
        if let NetlinkPayload::Error(e) = msg.payload {
            if let Some(code) = e.code {
                return Err(NflogError::Refused {
                    what,
                    code: code.get(),
                });
            }
        }
    }
    Ok(())
}

/// Binds to [`GROUP`] in the calling thread's network namespace.
pub fn open() -> Result<Socket, NflogError> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|source| NflogError::Io {
        what: "open a netfilter socket",
        source,
    })?;
    socket.bind_auto().map_err(|source| NflogError::Io {
        what: "bind the netfilter socket",
        source,
    })?;
    for family in [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6] {
        send(
            &socket,
            config_request(
                family,
                GROUP,
                vec![
                    ConfigCmd::Bind.into(),
                    ConfigMode::new_packet(COPY_RANGE).into(),
                ],
            ),
        )?;
        match ack(&socket, "bind the log group") {
            // The group is bound once for all families.
            Err(NflogError::Refused { code, .. }) if code == -libc::EBUSY => {}
            other => other?,
        }
    }
    Ok(socket)
}

/// Reads logged packets until the socket fails, recording each.
pub fn serve(socket: Socket, trail: &Trail) -> Result<(), NflogError> {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The kernel dropped messages for a slow reader: go on.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
            Err(source) => {
                return Err(NflogError::Io {
                    what: "receive",
                    source,
                })
            }
        };
        let mut at = 0;
        while at < n {
            let Ok(msg) = NetlinkMessage::<NetfilterMessage>::deserialize(&buf[at..n]) else {
                break;
            };
            let len = msg.header.length as usize;
            if let NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
                ..
            }) = &msg.payload
            {
                // Only refusals are logged: rate-limited per destination.
                if let Some((key, _, build)) = event(nlas) {
                    trail.limited(&key, build);
                }
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_give_protocol_destination_and_port() {
        let mut udp = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 17, 0, 0];
        udp.extend([10, 0, 0, 2, 192, 0, 2, 7]);
        udp.extend([0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        assert_eq!(
            parse_packet(&udp),
            Some(Flow {
                proto: "udp".into(),
                src: "10.0.0.2".parse().unwrap(),
                dst: "192.0.2.7".parse().unwrap(),
                port: 53
            })
        );
        // Truncated anywhere: no panic; a header without ports gives 0.
        for cut in 0..udp.len() {
            let _ = parse_packet(&udp[..cut]);
        }
        assert_eq!(parse_packet(&udp[..20]).map(|f| f.port), Some(0));
        let mut icmp = udp.clone();
        icmp[9] = 1;
        assert_eq!(
            parse_packet(&icmp).map(|f| (f.proto, f.port)),
            Some(("icmp".into(), 0))
        );
        // A header length below the minimum.
        let mut bad = udp.clone();
        bad[0] = 0x41;
        assert_eq!(parse_packet(&bad), None);
        assert_eq!(parse_packet(&[0x75]), None);
    }

    #[test]
    fn prefixes_name_the_verdict_and_rule() {
        assert_eq!(parse_prefix(b"agentvm deny\0"), Some(Logged::Denied));
        assert_eq!(parse_prefix(b"agentvm spoof\0"), Some(Logged::Spoofed));
        assert_eq!(parse_prefix(b"agentvm allow x"), None);
        assert_eq!(parse_prefix(b"something else"), None);
    }
}
