//! The egress policy's resolver (`egress::resolver`): every DNS query the
//! sandbox sends goes through [`decide`], which forwards it only for a name
//! a rule allows, and every upstream answer through [`answers`], whose
//! addresses become nftables set elements. Both are hostile bytes.
//!
//! An input is read with `arbitrary`: a policy, a query built with hickory
//! (labels from the policy's names, wildcards, upper case, labels holding a
//! dot, a NUL, a space or a backslash, several questions, a response in
//! place of a query) or raw bytes, maybe mutated; and an upstream answer
//! with A and AAAA records of any TTL, to the right id or another. A
//! forwarded query must name, label by label, what the rules it is
//! forwarded for allow; a refusal must be a well-formed reply to that
//! query; addresses come only from a response to the query's id, with TTLs
//! in bounds, and print as one nft element each.

use std::net::{Ipv4Addr, Ipv6Addr};

use agentvm::egress::resolver::{answers, decide, set_elements, Decision, MAX_TTL, MIN_TTL};
use agentvm::egress::{Policy, Rule, Target};
use arbitrary::{Arbitrary, Unstructured};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

const POLICIES: &[&str] = &[
    "pypi.org:443,*.example.com,10.0.0.0/8",
    "*.pypi.org",
    "pypi.org,*.a.b.c",
    "*.githubusercontent.com:443/udp,example.com",
    "10.0.0.0/8",
];

const LABELS: &[&str] = &[
    "pypi",
    "org",
    "example",
    "com",
    "a",
    "b",
    "c",
    "x",
    "PyPI",
    "EXAMPLE",
    "*",
    "evil",
    "x.pypi",
    "com.pypi",
    "a.b",
    "b.c",
    "xn--p1ai",
    "-",
    "_x",
    "a b",
    "\\",
    "\0",
    ".",
    "githubusercontent",
];

#[derive(Arbitrary, Debug)]
enum LabelIn {
    Pick(u8),
    Bytes(Vec<u8>),
}

impl LabelIn {
    fn bytes(&self) -> Vec<u8> {
        match self {
            LabelIn::Pick(i) => LABELS[usize::from(*i) % LABELS.len()].as_bytes().to_vec(),
            LabelIn::Bytes(b) => b.clone(),
        }
    }
}

fn name(labels: &[LabelIn]) -> Name {
    let labels: Vec<Vec<u8>> = labels.iter().take(130).map(LabelIn::bytes).collect();
    Name::from_labels(labels).unwrap_or_else(|_| Name::root())
}

/// The policies' own names, for queries that get past the filter.
const SUFFIXES: &[&str] = &[
    "pypi.org",
    "example.com",
    "a.b.c",
    "b.c",
    "githubusercontent.com",
    "org",
    "",
];

/// A question name: a few labels, then (mostly) a name a policy allows.
#[derive(Arbitrary, Debug)]
struct NameIn {
    prefix: Vec<LabelIn>,
    suffix: u8,
    upper: bool,
}

impl NameIn {
    fn name(&self) -> Name {
        let mut labels: Vec<Vec<u8>> = self.prefix.iter().take(4).map(LabelIn::bytes).collect();
        let suffix = SUFFIXES[usize::from(self.suffix) % SUFFIXES.len()];
        labels.extend(
            suffix
                .split('.')
                .filter(|l| !l.is_empty())
                .map(|l| l.as_bytes().to_vec()),
        );
        if self.upper {
            for l in &mut labels {
                l.make_ascii_uppercase();
            }
        }
        Name::from_labels(labels).unwrap_or_else(|_| Name::root())
    }
}

#[derive(Arbitrary, Debug)]
enum QueryIn {
    Built {
        id: u16,
        first: NameIn,
        /// More questions (a query has one).
        more: Option<Vec<NameIn>>,
        rtype: u16,
        response: bool,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct ReplyIn {
    same_id: bool,
    id: u16,
    response: bool,
    records: Vec<(Vec<LabelIn>, u32, bool, u128)>,
    cut: Option<u16>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    policy: u8,
    query: QueryIn,
    mutate: bool,
    reply: Option<ReplyIn>,
}

fn query_bytes(q: &QueryIn) -> Vec<u8> {
    match q {
        QueryIn::Built {
            id,
            first,
            more,
            rtype,
            response,
        } => {
            let mut m = if *response {
                Message::response(*id, OpCode::Query)
            } else {
                let mut m = Message::query();
                m.metadata.id = *id;
                m
            };
            let names = std::iter::once(first).chain(more.iter().flatten().take(2));
            for n in names {
                m.queries
                    .push(Query::query(n.name(), RecordType::from(*rtype)));
            }
            m.to_vec().unwrap_or_default()
        }
        QueryIn::Raw(b) => b.clone(),
    }
}

fn reply_bytes(r: &ReplyIn, query_id: u16) -> (Vec<u8>, u16) {
    let id = if r.same_id { query_id } else { r.id };
    let mut m = if r.response {
        Message::response(id, OpCode::Query)
    } else {
        let mut m = Message::query();
        m.metadata.id = id;
        m
    };
    for (labels, ttl, v6, addr) in r.records.iter().take(20) {
        let data = if *v6 {
            RData::AAAA(AAAA(Ipv6Addr::from(*addr)))
        } else {
            RData::A(A(Ipv4Addr::from(*addr as u32)))
        };
        m.answers.push(Record::from_rdata(name(labels), *ttl, data));
    }
    let mut bytes = m.to_vec().unwrap_or_default();
    if let Some(cut) = r.cut {
        bytes.truncate(usize::from(cut));
    }
    (bytes, query_id)
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let text = POLICIES[usize::from(input.policy) % POLICIES.len()];
    let rules = match text.parse::<Policy>() {
        Ok(Policy::List(r)) => r,
        Ok(_) => Vec::new(),
        Err(e) => panic!("policy {text:?}: {e}"),
    };
    let mut datagram = query_bytes(&input.query);
    if input.mutate {
        let _ = crate::mutate::mutate(&mut u, &mut datagram, &[".", "\\", "*"], &[]);
    }
    check_decision(&rules, &datagram);
    if let Some(r) = &input.reply {
        let query_id = datagram
            .get(..2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        let (bytes, id) = reply_bytes(r, query_id);
        check_answers(&bytes, id);
    }
}

/// The labels of a name as a rule spells them: lowercase, split on dots.
fn rule_labels(name: &str) -> Vec<Vec<u8>> {
    name.split('.').map(|l| l.as_bytes().to_vec()).collect()
}

fn check_decision(rules: &[Rule], datagram: &[u8]) {
    let parsed = Message::from_vec(datagram).ok();
    match decide(rules, datagram) {
        Decision::Drop => {}
        Decision::Answer(bytes) | Decision::Refused { reply: bytes, .. } => {
            let Some(q) = parsed else {
                panic!("an answer to bytes that are not a message")
            };
            let reply = match Message::from_vec(&bytes) {
                Ok(m) => m,
                Err(e) => panic!("the resolver's reply does not decode: {e}"),
            };
            assert_eq!(reply.metadata.id, q.metadata.id, "a reply to another id");
            assert_eq!(reply.metadata.message_type, MessageType::Response);
            assert!(matches!(
                reply.metadata.response_code,
                ResponseCode::FormErr | ResponseCode::Refused
            ));
        }
        Decision::Forward { name, rules: which } => {
            let Some(q) = parsed else {
                panic!("forwarded bytes that are not a message")
            };
            assert_eq!(q.metadata.message_type, MessageType::Query);
            assert_eq!(
                q.queries.len(),
                1,
                "forwarded {} questions",
                q.queries.len()
            );
            assert!(!which.is_empty(), "forwarded for no rule");
            // What goes upstream is the name on the wire, label by label.
            let labels: Vec<Vec<u8>> = q.queries[0]
                .name
                .iter()
                .map(<[u8]>::to_ascii_lowercase)
                .collect();
            for i in which {
                let Some(rule) = rules.get(i) else {
                    panic!("rule {i} of {}", rules.len())
                };
                let ok = match &rule.target {
                    Target::Name(n) => labels == rule_labels(n),
                    Target::Below(b) => {
                        let parent = rule_labels(b);
                        labels.len() > parent.len() && labels.ends_with(&parent)
                    }
                    Target::Net { .. } => false,
                };
                assert!(
                    ok,
                    "{name:?} (labels {:?}) forwarded for rule {rule}",
                    labels
                        .iter()
                        .map(|l| String::from_utf8_lossy(l).into_owned())
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

fn check_answers(reply: &[u8], id: u16) {
    let Some(addrs) = answers(reply, id) else {
        return;
    };
    let m = match Message::from_vec(reply) {
        Ok(m) => m,
        Err(e) => panic!("addresses taken from a reply that does not decode: {e}"),
    };
    assert_eq!(
        m.metadata.id, id,
        "addresses from the answer to another query"
    );
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert!(addrs.len() <= m.answers.len());
    for (_, ttl) in &addrs {
        assert!((MIN_TTL..=MAX_TTL).contains(ttl), "ttl {ttl}");
    }
    let rules = match "a.example:53/udp,b.example:443".parse::<Policy>() {
        Ok(Policy::List(r)) => r,
        _ => Vec::new(),
    };
    // Rule 0 has sets (UDP), rule 1 not (TCP: the proxy's), 7 is none.
    let elements = set_elements(&rules, &[0, 1, 7], &addrs);
    assert_eq!(elements.lines().count(), addrs.len());
    for line in elements.lines() {
        assert!(
            line.starts_with("add element inet agentvm r")
                && line.matches('{').count() == 1
                && !line.contains(';'),
            "{line:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_get_each_decision() {
        let t = crate::targets::find("egress_resolver").unwrap();
        let mut counts = [0usize; 4];
        for case in 0..3000 {
            let data = crate::driver::input_for(t, 1, case);
            let mut u = Unstructured::new(&data);
            let Ok(input) = Input::arbitrary(&mut u) else {
                counts[3] += 1;
                continue;
            };
            let rules = match POLICIES[usize::from(input.policy) % POLICIES.len()].parse::<Policy>()
            {
                Ok(Policy::List(r)) => r,
                _ => Vec::new(),
            };
            let i = match decide(&rules, &query_bytes(&input.query)) {
                Decision::Drop => 0,
                Decision::Answer(_) | Decision::Refused { .. } => 1,
                Decision::Forward { .. } => 2,
            };
            counts[i] += 1;
        }
        // Dropped, answered, forwarded, not an input.
        assert!(counts[1] > 300 && counts[2] > 100, "{counts:?}");
    }
}
