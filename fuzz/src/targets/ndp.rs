//! The IPv6 neighbour answers on a microVM's tap ([`agentvm::ndp::answer`]):
//! every frame is the guest's. Inputs are Ethernet frames, most of them
//! neighbour solicitations with fields chosen at random, the rest any
//! bytes. An answer must be an advertisement of the target asked for, from
//! the tap's MAC to the asker, never for the guest's own address, never
//! for a link-local, multicast or unspecified target, and never for
//! duplicate address detection (an unspecified source).

use std::net::Ipv6Addr;

use agentvm::ndp::answer;
use arbitrary::{Arbitrary, Unstructured};

const TAP_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const OWN: &str = "fd00::2";

#[derive(Arbitrary, Debug)]
struct Solicitation {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    ethertype_ipv6: bool,
    version: u8,
    payload_len: u16,
    next_header_icmp: bool,
    hop_limit: u8,
    source: [u8; 16],
    /// 0: the guest's own address, 1: a peer, 2: link-local, else random.
    target_kind: u8,
    target: [u8; 16],
    icmp_type: u8,
    trailer: Vec<u8>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    if u.arbitrary::<u8>()? < 32 {
        return super::raw(u);
    }
    let s = Solicitation::arbitrary(u)?;
    let target: Ipv6Addr = match s.target_kind % 4 {
        0 => OWN.parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
        1 => "fd00::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
        2 => "fe80::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED),
        _ => Ipv6Addr::from(s.target),
    };
    let mut f = Vec::new();
    f.extend_from_slice(&s.dst_mac);
    f.extend_from_slice(&s.src_mac);
    f.extend_from_slice(if s.ethertype_ipv6 {
        &[0x86, 0xdd]
    } else {
        &[0x08, 0x00]
    });
    f.extend_from_slice(&[0x60 | (s.version & 0x0f), 0, 0, 0]);
    f.extend_from_slice(&(s.payload_len % 64).to_be_bytes());
    f.push(if s.next_header_icmp { 58 } else { 17 });
    f.push(s.hop_limit);
    f.extend_from_slice(&s.source);
    f.extend_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 1]);
    f.extend_from_slice(&[
        if s.icmp_type < 200 { 135 } else { s.icmp_type },
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    f.extend_from_slice(&target.octets());
    f.extend_from_slice(&s.trailer);
    Ok(f)
}

pub fn run(frame: &[u8]) {
    let own: Vec<Ipv6Addr> = OWN.parse().into_iter().collect();
    let Some(na) = answer(frame, TAP_MAC, &own) else {
        return;
    };
    assert_eq!(na.len(), 14 + 40 + 32, "an advertisement's length");
    assert_eq!(&na[6..12], &TAP_MAC, "from the tap's MAC");
    assert_eq!(&na[0..6], &frame[6..12], "to the asker's MAC");
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&na[62..78]).unwrap_or([0; 16]));
    let asked = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[62..78]).unwrap_or([0; 16]));
    assert_eq!(target, asked, "the target asked for");
    assert!(!own.contains(&target), "never the guest's own address");
    assert!(
        !target.is_multicast()
            && !target.is_unspecified()
            && target.segments()[0] & 0xffc0 != 0xfe80,
        "a global unicast target: {target}"
    );
    let source = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[22..38]).unwrap_or([0; 16]));
    assert!(
        !source.is_unspecified(),
        "not for duplicate address detection"
    );
}
