//! The egress proxy's view of a connection: the first flight the sandbox
//! sends (a TLS ClientHello, possibly split over records, or an HTTP
//! request) read for a name, the judgement made from it, and the packet
//! headers the nftables log hands the daemon. All of it is the sandbox's.
//!
//! An input is either raw bytes or a structured ClientHello / request
//! built from `arbitrary` choices (names with odd bytes, lying lengths,
//! record splits, duplicate hosts). Properties: no panic on any prefix; a
//! name given back is one a rule could spell; a connection is allowed
//! only by an address rule or by an allowed name the destination
//! resolved from — never by a name that did not resolve to it.

use std::net::IpAddr;

use agentvm::audit::NameSource;
use agentvm::egress::nflog::parse_packet;
use agentvm::egress::proxy::{first_flight, judge, rule_name, FirstFlight, Judgement};
use agentvm::egress::{Policy, Rule};
use arbitrary::{Arbitrary, Unstructured};

const NAMES: &[&str] = &[
    "pypi.org",
    "files.pypi.org",
    "evil.example",
    "a.example.com",
    "PyPI.org.",
    "pypi.org\0.evil",
    "x..y",
    "",
];

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Hello {
        name: u8,
        junk: Vec<u8>,
        record: u8,
        lie_at: Option<(u16, u8)>,
        sid: u8,
        cut: u16,
    },
    Http {
        method: u8,
        target: u8,
        hosts: Vec<u8>,
        cut: u16,
    },
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

fn name_bytes(i: u8, junk: &[u8]) -> Vec<u8> {
    match NAMES.get(usize::from(i) % (NAMES.len() + 1)) {
        Some(n) => n.as_bytes().to_vec(),
        None => junk.iter().copied().take(300).collect(),
    }
}

fn hello(name: &[u8], record: usize, sid: u8) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([1u8; 32]);
    let sid = usize::from(sid % 33);
    body.push(sid as u8);
    body.extend(std::iter::repeat_n(2u8, sid));
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    let mut exts = vec![0, 10, 0, 2, 0, 29];
    let n = name.len() as u16;
    exts.extend([0, 0]);
    exts.extend((n + 5).to_be_bytes());
    exts.extend((n + 3).to_be_bytes());
    exts.push(0);
    exts.extend(n.to_be_bytes());
    exts.extend(name);
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut hs = vec![1];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut out = Vec::new();
    for chunk in hs.chunks(record.max(1)) {
        out.extend([0x16, 3, 1]);
        out.extend((chunk.len() as u16).to_be_bytes());
        out.extend(chunk);
    }
    out
}

fn bytes_of(input: Input) -> Vec<u8> {
    match input {
        Input::Raw(b) => b,
        Input::Hello {
            name,
            junk,
            record,
            lie_at,
            sid,
            cut,
        } => {
            let mut b = hello(&name_bytes(name, &junk), usize::from(record) + 1, sid);
            if let Some((at, v)) = lie_at {
                let len = b.len();
                if let Some(x) = b.get_mut(usize::from(at) % len.max(1)) {
                    *x = v;
                }
            }
            let keep = b.len().saturating_sub(usize::from(cut) % 8);
            b.truncate(keep);
            b
        }
        Input::Http {
            method,
            target,
            hosts,
            cut,
        } => {
            let m = ["GET", "POST", "CONNECT", "get", "G ET"][usize::from(method) % 5];
            let t = match target % 3 {
                0 => "/".to_string(),
                1 => format!("http://{}/x", NAMES[usize::from(target) % NAMES.len()]),
                _ => format!(
                    "https://u:p@{}:443/",
                    NAMES[usize::from(target) % NAMES.len()]
                ),
            };
            let mut s = format!("{m} {t} HTTP/1.1\r\n").into_bytes();
            for h in hosts.iter().take(4) {
                s.extend(b"Host: ");
                s.extend(name_bytes(*h, &[]));
                s.extend(b"\r\n");
            }
            s.extend(b"\r\n");
            let keep = s.len().saturating_sub(usize::from(cut) % 8);
            s.truncate(keep);
            s
        }
    }
}

fn rules() -> Vec<Rule> {
    match "pypi.org:443,*.example.com,10.0.0.0/8:22".parse::<Policy>() {
        Ok(Policy::List(r)) => r,
        _ => Vec::new(),
    }
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let bytes = bytes_of(input);
    let rules = rules();
    let dst: IpAddr = "192.0.2.10".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let resolved = vec!["pypi.org".to_string()];
    for cut in 0..=bytes.len().min(600) {
        for full in [false, true] {
            let got = first_flight(&bytes[..cut], full);
            if full {
                assert_ne!(
                    got,
                    FirstFlight::Incomplete,
                    "incomplete with no more to come"
                );
            }
            if let FirstFlight::Name(n, _) = &got {
                assert_eq!(
                    rule_name(n.as_bytes()).as_deref(),
                    Some(n.as_str()),
                    "{n:?}"
                );
            }
            match judge(&rules, dst, 443, &resolved, Some(&got)) {
                Judgement::Allow { name, .. } => {
                    // Only pypi.org resolved to dst; only it may be named.
                    if let Some((n, src)) = name {
                        assert!(
                            n == "pypi.org",
                            "allowed {n:?} ({src:?}) to an address it did not resolve to"
                        );
                        if matches!(got, FirstFlight::Name(..)) {
                            assert_ne!(src, NameSource::Dns);
                        }
                    }
                }
                Judgement::Deny { .. } => {}
                Judgement::NeedName => assert_eq!(
                    got,
                    FirstFlight::Incomplete,
                    "needs a name after the first flight was read"
                ),
            }
        }
    }
    let _ = parse_packet(&bytes);
}
