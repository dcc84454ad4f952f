//! The ends of the sandbox's UDP flows. A UDP rule marks each flow it
//! allows ([`mark`]: the rule's index in the mark); the namespace counts
//! each flow's bytes and times it (`nf_conntrack_acct`,
//! `nf_conntrack_timestamp`), and when the kernel forgets a flow (no
//! packet for its timeout) it says so on the conntrack netlink group this
//! reads. Each marked flow becomes one audit line at its end, as a TCP
//! connection does at its close: destination, rule, bytes each way,
//! duration. When the daemon ends, the flows still open are dumped and
//! written with what they counted so far ([`flush`]).
//!
//! Both sockets are opened as root before the daemon's jail. Listening
//! needs nothing more once joined; the final dump needs `CAP_NET_ADMIN`
//! both in the opener and in the daemon when it asks, so a daemon with UDP
//! rules keeps that one capability (in the sandbox's namespace only). The
//! messages come from the kernel; they are still parsed with a bound check
//! on every attribute.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use netlink_sys::{constants::NETLINK_NETFILTER, Socket};

use crate::audit::{Event, Verdict};

use super::trail::Trail;
use super::Rule;

/// The high bits of the mark a UDP rule gives the flows it allows; the
/// low 16 are the rule's index.
pub const FLOW_MARK: u32 = 0x6f00_0000;
const FLOW_MARK_MASK: u32 = 0xffff_0000;

/// The mark of the flows rule `index` allows.
pub fn mark(index: usize) -> u32 {
    FLOW_MARK | (index as u32 & 0xffff)
}

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_MARK: u16 = 8;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
const CTA_TIMESTAMP: u16 = 20;
const CTA_TIMESTAMP_START: u16 = 1;
const CTA_TIMESTAMP_STOP: u16 = 2;

const UDP: u8 = 17;
/// UDP's header, counted in each packet beside the IP header.
const UDP_HEADER: u64 = 8;

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("egress flow accounting: {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ConntrackError {
    move |source| ConntrackError::Io { what, source }
}

/// The sockets: one on the destroy events, one for the final dump.
pub struct Sockets {
    events: Socket,
    dump: Socket,
}

/// Opens both (as root, before the jail).
pub fn open() -> Result<Sockets, ConntrackError> {
    let mut events = Socket::new(NETLINK_NETFILTER).map_err(io("open a conntrack socket"))?;
    events
        .bind_auto()
        .map_err(io("bind the conntrack socket"))?;
    events
        .add_membership(NFNLGRP_CONNTRACK_DESTROY)
        .map_err(io("listen for the ends of flows"))?;
    let mut dump = Socket::new(NETLINK_NETFILTER).map_err(io("open a conntrack socket"))?;
    dump.bind_auto().map_err(io("bind the conntrack socket"))?;
    Ok(Sockets { events, dump })
}

/// A marked flow, as the kernel reported it.
#[derive(Debug, PartialEq, Eq)]
pub struct Flow {
    pub rule: usize,
    pub dst: IpAddr,
    pub port: u16,
    /// Payload bytes (IP and UDP headers taken off) each way.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Start and, once it ended, stop, in ns of the realtime clock.
    pub start_ns: Option<u64>,
    pub stop_ns: Option<u64>,
}

/// Netlink attributes of `b`: (type without flags, value).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
        let kind = u16::from_ne_bytes([*b.get(2)?, *b.get(3)?]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = b.get((len + 3) & !3..).unwrap_or_default();
        Some((kind, value))
    })
}

fn find(b: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(b).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// (packets, bytes) of a counters attribute.
fn counters(v: &[u8]) -> (u64, u64) {
    (
        find(v, CTA_COUNTERS_PACKETS).and_then(be_u64).unwrap_or(0),
        find(v, CTA_COUNTERS_BYTES).and_then(be_u64).unwrap_or(0),
    )
}

/// The marked UDP flow an entry's attributes (after the nfgenmsg header)
/// describe, if it is one.
pub fn flow_of(attrs: &[u8]) -> Option<Flow> {
    let mark = find(attrs, CTA_MARK).and_then(be_u32)?;
    if mark & FLOW_MARK_MASK != FLOW_MARK {
        return None;
    }
    let orig = find(attrs, CTA_TUPLE_ORIG)?;
    let proto = find(orig, CTA_TUPLE_PROTO)?;
    if *find(proto, CTA_PROTO_NUM)?.first()? != UDP {
        return None;
    }
    let port = u16::from_be_bytes(find(proto, CTA_PROTO_DST_PORT)?.get(..2)?.try_into().ok()?);
    let ip = find(orig, CTA_TUPLE_IP)?;
    let (dst, ip_header) = if let Some(v) = find(ip, CTA_IP_V4_DST) {
        let o: [u8; 4] = v.get(..4)?.try_into().ok()?;
        (IpAddr::V4(Ipv4Addr::from(o)), 20)
    } else {
        let o: [u8; 16] = find(ip, CTA_IP_V6_DST)?.get(..16)?.try_into().ok()?;
        (IpAddr::V6(Ipv6Addr::from(o)), 40)
    };
    let payload = |(packets, bytes): (u64, u64)| {
        bytes.saturating_sub(packets.saturating_mul(ip_header + UDP_HEADER))
    };
    let stamps = find(attrs, CTA_TIMESTAMP);
    Some(Flow {
        rule: (mark & 0xffff) as usize,
        dst,
        port,
        bytes_out: payload(
            find(attrs, CTA_COUNTERS_ORIG)
                .map(counters)
                .unwrap_or((0, 0)),
        ),
        bytes_in: payload(
            find(attrs, CTA_COUNTERS_REPLY)
                .map(counters)
                .unwrap_or((0, 0)),
        ),
        start_ns: stamps
            .and_then(|s| find(s, CTA_TIMESTAMP_START))
            .and_then(be_u64),
        stop_ns: stamps
            .and_then(|s| find(s, CTA_TIMESTAMP_STOP))
            .and_then(be_u64),
    })
}

/// The audit line of `flow`; `now_ns` ends a flow still open.
pub fn event(rules: &[Rule], flow: Flow, now_ns: u64) -> Event {
    let duration_ms = match flow.start_ns {
        Some(start) => flow.stop_ns.unwrap_or(now_ns).saturating_sub(start) / 1_000_000,
        None => 0,
    };
    Event::Connection {
        verdict: Verdict::Allowed,
        rule: rules.get(flow.rule).map(|r| r.to_string()),
        reason: None,
        proto: "udp".to_string(),
        dst: flow.dst,
        port: flow.port,
        name: None,
        name_from: None,
        bytes_out: flow.bytes_out,
        bytes_in: flow.bytes_in,
        duration_ms,
        suppressed: 0,
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64
}

/// The conntrack entries of a buffer of netlink messages: (message type,
/// attributes), and whether the buffer ended a dump.
fn entries(buf: &[u8]) -> (Vec<(u16, &[u8])>, bool) {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if len < 16 || len > rest.len() {
            break;
        }
        if kind == NLMSG_DONE || kind == NLMSG_ERROR {
            return (out, true);
        }
        if kind >> 8 == NFNL_SUBSYS_CTNETLINK {
            // After the header, the 4-byte nfgenmsg.
            if let Some(attrs) = rest.get(20..len) {
                out.push((kind & 0xff, attrs));
            }
        }
        rest = rest.get((len + 3) & !3..).unwrap_or_default();
    }
    (out, false)
}

/// Writes a line for each marked flow the kernel forgets, until the
/// socket fails.
pub fn serve(sockets: &Sockets, rules: &[Rule], trail: &Trail) -> Result<(), ConntrackError> {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match sockets.events.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Events lost to a full buffer: those flows go unwritten.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
            Err(source) => {
                return Err(ConntrackError::Io {
                    what: "read the ends of flows",
                    source,
                })
            }
        };
        for (kind, attrs) in entries(&buf[..n]).0 {
            if kind != IPCTNL_MSG_CT_DELETE {
                continue;
            }
            if let Some(flow) = flow_of(attrs) {
                trail.record(event(rules, flow, now_ns()));
            }
        }
    }
}

/// Writes a line for each marked flow still open (the daemon ends), with
/// what it counted so far. Best effort, for at most a second.
pub fn flush(sockets: &Sockets, rules: &[Rule], trail: &Trail) {
    let mut req = Vec::with_capacity(20);
    req.extend_from_slice(&20u32.to_ne_bytes());
    req.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET).to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req.extend_from_slice(&flags.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: every family, version 0, resource 0.
    req.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    if sockets.dump.send(&req, 0).is_err() {
        return;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let mut buf = vec![0u8; 1 << 16];
    let now = now_ns();
    while std::time::Instant::now() < deadline {
        let Ok(n) = sockets.dump.recv(&mut &mut buf[..], 0) else {
            return;
        };
        let (found, done) = entries(&buf[..n]);
        for (kind, attrs) in found {
            if kind != IPCTNL_MSG_CT_NEW {
                continue;
            }
            if let Some(flow) = flow_of(attrs) {
                trail.record(event(rules, flow, now));
            }
        }
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((value.len() + 4) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(kind | 0x8000, &parts.concat())
    }

    /// A destroyed UDP flow to 192.0.2.7:53 under rule 2: 3 packets, 120
    /// bytes out, 1 packet, 200 bytes in, 1.5 s.
    fn entry(mark_value: u32) -> Vec<u8> {
        [
            nested(
                CTA_TUPLE_ORIG,
                &[
                    nested(
                        CTA_TUPLE_IP,
                        &[nla(1, &[10, 0, 0, 2]), nla(CTA_IP_V4_DST, &[192, 0, 2, 7])],
                    ),
                    nested(
                        CTA_TUPLE_PROTO,
                        &[
                            nla(CTA_PROTO_NUM, &[UDP]),
                            nla(2, &4000u16.to_be_bytes()),
                            nla(CTA_PROTO_DST_PORT, &53u16.to_be_bytes()),
                        ],
                    ),
                ],
            ),
            nla(CTA_MARK, &mark_value.to_be_bytes()),
            nested(
                CTA_COUNTERS_ORIG,
                &[
                    nla(CTA_COUNTERS_PACKETS, &3u64.to_be_bytes()),
                    nla(CTA_COUNTERS_BYTES, &120u64.to_be_bytes()),
                ],
            ),
            nested(
                CTA_COUNTERS_REPLY,
                &[
                    nla(CTA_COUNTERS_PACKETS, &1u64.to_be_bytes()),
                    nla(CTA_COUNTERS_BYTES, &200u64.to_be_bytes()),
                ],
            ),
            nested(
                CTA_TIMESTAMP,
                &[
                    nla(CTA_TIMESTAMP_START, &1_000_000_000u64.to_be_bytes()),
                    nla(CTA_TIMESTAMP_STOP, &2_500_000_000u64.to_be_bytes()),
                ],
            ),
        ]
        .concat()
    }

    #[test]
    fn a_marked_flow_gives_its_rule_destination_payload_bytes_and_times() {
        let flow = flow_of(&entry(mark(2))).expect("a flow");
        assert_eq!(
            flow,
            Flow {
                rule: 2,
                dst: "192.0.2.7".parse().unwrap(),
                port: 53,
                bytes_out: 120 - 3 * 28,
                bytes_in: 200 - 28,
                start_ns: Some(1_000_000_000),
                stop_ns: Some(2_500_000_000),
            }
        );
        let rules: Vec<Rule> = match "10.0.0.1,10.0.0.2,192.0.2.0/24:53/udp".parse() {
            Ok(super::super::Policy::List(r)) => r,
            other => panic!("{other:?}"),
        };
        match event(&rules, flow, 0) {
            Event::Connection {
                rule, duration_ms, ..
            } => {
                assert_eq!(rule.as_deref(), Some("192.0.2.0/24:53/udp"));
                assert_eq!(duration_ms, 1500);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unmarked_or_foreign_entries_and_malformed_ones_are_skipped() {
        assert_eq!(flow_of(&entry(0)), None);
        assert_eq!(flow_of(&entry(super::super::LOCAL_MARK)), None);
        let good = entry(mark(0));
        for cut in 0..good.len() {
            let _ = flow_of(&good[..cut]);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut e = good.clone();
            for _ in 0..3 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed as usize) % e.len();
                e[i] = (seed >> 40) as u8;
            }
            let _ = flow_of(&e);
            let _ = entries(&e);
        }
    }
}
