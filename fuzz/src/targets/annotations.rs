//! Annotation values: `io.agentvm.isolation` (the tier) and
//! `io.agentvm.egress` (the egress policy), which any user who can set an
//! annotation controls, and the locked policy of the config file they
//! may only narrow.
//!
//! An input is up to three values separated by a 0xff byte (which no
//! UTF-8 text holds): the egress value, the isolation value, and the
//! config file's locked policy. `generate` builds policies out of rules
//! with `arbitrary` — IPv4 and IPv6 blocks with odd prefixes and ports,
//! host names with odd labels and dots, wildcards, protocols — then
//! mutates the bytes. A policy that parses must print back to itself,
//! be within itself, print as nft-safe text, and a locked policy must
//! never let a wider one through.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use agentvm::config::{Config, Isolation, IsolationSource, ISOLATION_ANNOTATION};
use agentvm::egress::{ruleset, Policy, PolicySource, Target};
use arbitrary::{Arbitrary, Unstructured};

use super::values::Text;

const SEP: u8 = 0xff;

const DICT: &[&str] = &[
    ",", ":", "/", "/udp", "/tcp", "[", "]", "*.", ".", "..", "::", "/0", "/32", "/33", "/128",
    "/129", ":0", ":65535", ":65536", "allow", "deny", " ", "\t", "\u{a0}", "::ffff:", "%eth0",
];

/// Labels of host names: the valid ones first ([`VALID_LABELS`]).
const LABELS: &[&str] = &[
    "a",
    "pypi",
    "org",
    "com",
    "example",
    "1",
    "0",
    "255",
    "256",
    "_x",
    "xn--p1ai",
    "UPPER",
    "udp",
    "allow",
    "deny",
    "localhost",
    "0x7f",
    "012",
    "-a",
    "a-",
    "*",
    "",
    "é",
];
const VALID_LABELS: usize = 18;

#[derive(Arbitrary, Debug)]
enum Rule {
    V4 {
        addr: [u8; 4],
        masked: bool,
        prefix: Option<u8>,
        port: Option<u16>,
        udp: Option<bool>,
    },
    V6 {
        addr: [u8; 16],
        masked: bool,
        prefix: Option<u8>,
        port: Option<u16>,
        udp: Option<bool>,
    },
    Name {
        first: u8,
        labels: Vec<u8>,
        /// Past 253 bytes.
        many: bool,
        /// A label about 63 bytes long.
        long: Option<u8>,
        wildcard: bool,
        dots: u8,
        port: Option<u16>,
        udp: Option<bool>,
    },
    Odd(Odd),
}

/// A rule that is mostly not one.
#[derive(Arbitrary, Debug)]
enum Odd {
    Token(u8),
    Any(Text),
}

fn tail(port: Option<u16>, udp: Option<bool>) -> String {
    let mut s = port.map(|p| format!(":{p}")).unwrap_or_default();
    match udp {
        Some(true) => s.push_str("/udp"),
        Some(false) => s.push_str("/tcp"),
        None => {}
    }
    s
}

fn masked4(a: [u8; 4], prefix: u8) -> Ipv4Addr {
    let m = u32::MAX
        .checked_shl(32u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0);
    Ipv4Addr::from(u32::from_be_bytes(a) & m)
}

fn masked6(a: [u8; 16], prefix: u8) -> Ipv6Addr {
    let m = u128::MAX
        .checked_shl(128u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0);
    Ipv6Addr::from(u128::from_be_bytes(a) & m)
}

impl Rule {
    fn text(&self) -> String {
        match self {
            Rule::V4 {
                addr,
                masked,
                prefix,
                port,
                udp,
            } => {
                let p = prefix.map(|p| if *masked { p % 33 } else { p });
                let a = match p {
                    Some(p) if *masked => masked4(*addr, p),
                    _ => Ipv4Addr::from(*addr),
                };
                let p = p.map(|p| format!("/{p}")).unwrap_or_default();
                format!("{a}{p}{}", tail(*port, *udp))
            }
            Rule::V6 {
                addr,
                masked,
                prefix,
                port,
                udp,
            } => {
                let p = prefix.map(|p| if *masked { p % 129 } else { p });
                let a = match p {
                    Some(p) if *masked => masked6(*addr, p),
                    _ => Ipv6Addr::from(*addr),
                };
                let p = p.map(|p| format!("/{p}")).unwrap_or_default();
                match port {
                    Some(_) => format!("[{a}{p}]{}", tail(*port, *udp)),
                    None => format!("{a}{p}{}", tail(None, *udp)),
                }
            }
            Rule::Name {
                first,
                labels,
                many,
                long,
                wildcard,
                dots,
                port,
                udp,
            } => {
                let mut parts: Vec<String> = std::iter::once(first)
                    .chain(labels)
                    .take(if *many { 130 } else { 5 })
                    .map(|i| {
                        // Mostly valid labels, so that names get past the
                        // label checks.
                        let n = if *i < 224 { VALID_LABELS } else { LABELS.len() };
                        LABELS[usize::from(*i) % n].to_string()
                    })
                    .collect();
                if let Some(n) = long {
                    parts.push("x".repeat(56 + usize::from(*n % 16)));
                }
                let mut name = parts.join(".");
                if *wildcard {
                    name.insert_str(0, "*.");
                }
                name.push_str(&".".repeat(usize::from(dots % 4)));
                format!("{name}{}", tail(*port, *udp))
            }
            Rule::Odd(Odd::Token(i)) => DICT[usize::from(*i) % DICT.len()].to_string(),
            Rule::Odd(Odd::Any(t)) => t.string(),
        }
    }
}

/// A policy: mostly a list (`pick` of 32 and up), else a keyword.
#[derive(Arbitrary, Debug)]
struct PolicyIn {
    pick: u8,
    rules: Vec<Rule>,
    sep: u8,
}

impl PolicyIn {
    fn text(&self) -> String {
        const KEYWORDS: &[&str] = &["allow", "deny", " allow\n", "\tdeny ", "DENY", "Allow"];
        if self.pick < 32 {
            return KEYWORDS[usize::from(self.pick) % KEYWORDS.len()].to_string();
        }
        let sep = [",", ", ", " ,", ",,"][usize::from(self.sep) % 4];
        // A few rules: one bad rule refuses the whole list.
        self.rules
            .iter()
            .take(4)
            .map(Rule::text)
            .collect::<Vec<_>>()
            .join(sep)
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    egress: PolicyIn,
    isolation: Option<Text>,
    locked: Option<PolicyIn>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let input = Input::arbitrary(u)?;
    let mut out = input.egress.text().into_bytes();
    out.push(SEP);
    out.extend_from_slice(
        input
            .isolation
            .map_or_else(|| "microvm".to_string(), |t| t.string())
            .as_bytes(),
    );
    if let Some(l) = input.locked {
        out.push(SEP);
        out.extend_from_slice(l.text().as_bytes());
    }
    if u.ratio(1, 3)? {
        crate::mutate::mutate(u, &mut out, DICT, &[])?;
    }
    Ok(out)
}

pub fn run(data: &[u8]) {
    let mut parts = data.split(|b| *b == SEP).map(String::from_utf8_lossy);
    let egress = parts.next().unwrap_or_default();
    let isolation = parts.next().unwrap_or_default();
    let locked = parts.next();
    check_isolation(&isolation);
    check_policy(&egress);
    if let Some(locked) = locked {
        check_locked(&egress, &locked);
    }
}

fn check_isolation(value: &str) {
    let ann = HashMap::from([(ISOLATION_ANNOTATION.to_string(), value.to_string())]);
    match Config::default().select_isolation(None, Some(&ann)) {
        Ok((tier, source)) => {
            assert_eq!(tier.as_str(), value, "{value:?} picks {tier}");
            assert_eq!(source, IsolationSource::Annotation);
        }
        Err(e) => {
            assert!(
                value != "microvm" && value != "container",
                "{value:?} refused"
            );
            assert!(e.to_string().contains("unknown isolation"), "{e}");
        }
    }
    // The flag wins over any annotation, even a bad one.
    let flag = Config::default().select_isolation(Some(Isolation::Container), Some(&ann));
    assert!(matches!(
        flag,
        Ok((Isolation::Container, IsolationSource::Flag))
    ));
}

fn check_policy(text: &str) {
    let policy = match text.parse::<Policy>() {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    // Display is what the state file, the logs and `narrow`'s errors show,
    // and what a locked policy is compared in: it must mean the same.
    let shown = policy.to_string();
    match shown.parse::<Policy>() {
        Ok(back) => assert_eq!(
            back, policy,
            "{text:?} shows as {shown:?}, which parses to another policy"
        ),
        Err(e) => panic!("{text:?} shows as {shown:?}, which does not parse: {e}"),
    }
    assert!(
        policy
            .narrow(policy.clone(), PolicySource::Annotation)
            .is_ok(),
        "{shown:?} is wider than itself"
    );
    assert!(policy.narrow(Policy::Deny, PolicySource::Flag).is_ok());
    let _ = policy.has_names();
    if let Policy::List(rules) = &policy {
        for r in rules {
            let s = r.to_string();
            // Rules are pasted into nft comments: nothing that ends one.
            assert!(
                !s.contains(|c: char| c == '"'
                    || c == '\\'
                    || c == ';'
                    || c.is_whitespace()
                    || c.is_control()),
                "rule {s:?} is not nft-safe"
            );
        }
    }
    if let Some(rs) = ruleset(
        &policy,
        "avtap",
        std::net::Ipv4Addr::new(169, 254, 53, 53),
        Some(agentvm::router::SERVICE6),
        &[],
    ) {
        // TCP rules are the proxy's; one accept line per UDP address
        // rule, one per family per UDP name rule.
        let want: usize = match &policy {
            Policy::List(rules) => rules
                .iter()
                .filter(|r| r.proto == agentvm::egress::Proto::Udp)
                .map(|r| match r.target {
                    Target::Net { .. } => 1,
                    _ => 2,
                })
                .sum(),
            _ => 0,
        };
        let accepts = rs
            .lines()
            .filter(|l| l.contains(" accept comment "))
            .count();
        assert_eq!(accepts, want, "accept lines for {shown:?}");
    }
}

fn check_locked(requested: &str, locked: &str) {
    let Ok((got, _)) = Policy::select(None, Some(requested), Some(locked), true) else {
        return;
    };
    let base = match locked.parse::<Policy>() {
        Ok(b) => b,
        Err(e) => panic!("select accepted locked policy {locked:?} that does not parse: {e}"),
    };
    match (&base, &got) {
        (Policy::Allow, _) | (_, Policy::Deny) => {}
        (Policy::List(outer), Policy::List(inner)) => {
            for r in inner {
                assert!(
                    outer.iter().any(|o| r.within(o)),
                    "locked {base} let {r} through"
                );
            }
        }
        _ => panic!("locked {base} let {got} through"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_policies_parse_and_many_do_not() {
        let t = crate::targets::find("annotations").unwrap();
        let mut lists = 0;
        let mut errors = 0;
        for case in 0..2000 {
            let input = crate::driver::input_for(t, 1, case);
            let egress = input.split(|b| *b == SEP).next().unwrap_or_default();
            match String::from_utf8_lossy(egress).parse::<Policy>() {
                Ok(Policy::List(_)) => lists += 1,
                Ok(_) => {}
                Err(_) => errors += 1,
            }
        }
        assert!(
            lists > 200 && errors > 200,
            "{lists} lists, {errors} errors"
        );
    }
}
