//! The DNS relay's table ([`agentvm::dns_relay::Table`]): on the host side
//! it takes queries the guest sends to the resolver relay and matches the
//! answers back, so every datagram in it is the guest's (or the network's).
//!
//! An input is read with `arbitrary` as a sequence of datagrams — queries
//! of any length and id from many clients, answers to ids in flight, to
//! ids answered already and to made-up ones — with time passing between
//! them. An answer must go back to the client that asked, with that
//! client's id, once; the table must stay bounded.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use agentvm::dns_relay::{Table, MAX_DATAGRAM, MAX_IN_FLIGHT, QUERY_TIMEOUT};
use arbitrary::{Arbitrary, Unstructured};

#[derive(Arbitrary, Debug)]
enum Op {
    Query {
        len: u16,
        id: u16,
        client: u16,
        listener: u8,
    },
    /// An answer to the `nth` id handed out, or to `id` when there is none.
    Answer {
        nth: u16,
        id: u16,
        len: u16,
    },
    /// Many queries at once (past the in-flight limit).
    Flood {
        count: u16,
        client: u16,
    },
    Wait {
        ms: u16,
        long: bool,
    },
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

/// A datagram of `len` bytes (at most a bit past the limit) starting with
/// `id`.
fn datagram(len: u16, id: u16) -> Vec<u8> {
    let len = usize::from(len) % (MAX_DATAGRAM + 64);
    let mut d = vec![0u8; len];
    for (i, b) in id.to_be_bytes().iter().enumerate() {
        if let Some(slot) = d.get_mut(i) {
            *slot = *b;
        }
    }
    d
}

/// What a query was, by the id it went upstream with.
struct Asked {
    original: [u8; 2],
    client: SocketAddr,
    listener: usize,
}

/// The queries relayed so far, as the test sees them.
#[derive(Default)]
struct Model {
    asked: HashMap<u16, Asked>,
    issued: Vec<u16>,
}

impl Model {
    fn query(
        &mut self,
        table: &mut Table,
        now: Instant,
        len: u16,
        id: u16,
        client: u16,
        listener: usize,
    ) {
        let mut d = datagram(len, id);
        let client = SocketAddr::from((Ipv4Addr::LOCALHOST, client));
        let sent = table.outbound(&mut d, client, listener, now).is_some();
        assert_eq!(
            sent,
            (12..=MAX_DATAGRAM).contains(&d.len()),
            "a {}-byte query {}",
            d.len(),
            if sent { "relayed" } else { "dropped" }
        );
        if sent {
            let upstream_id = u16::from_be_bytes([d[0], d[1]]);
            self.asked.insert(
                upstream_id,
                Asked {
                    original: id.to_be_bytes(),
                    client,
                    listener,
                },
            );
            self.issued.push(upstream_id);
        }
        assert!(table.in_flight() <= MAX_IN_FLIGHT);
    }

    fn answer(&mut self, table: &mut Table, nth: u16, id: u16, len: u16) {
        let id = match self.issued.len() {
            0 => id,
            n => self.issued[usize::from(nth) % n],
        };
        let mut d = datagram(len.saturating_add(12), id);
        if d.len() < 2 {
            return;
        }
        if let Some((client, listener)) = table.inbound(&mut d) {
            // An answer goes once, to who asked, with their id.
            let Some(a) = self.asked.remove(&id) else {
                panic!("an answer to id {id}, which is not in flight, went to {client}");
            };
            assert_eq!((client, listener), (a.client, a.listener));
            assert_eq!([d[0], d[1]], a.original, "the client's id is not restored");
        }
    }
}

pub fn run(data: &[u8]) {
    let u = Unstructured::new(data);
    let Ok(ops) = Vec::<Op>::arbitrary_take_rest(u) else {
        return;
    };
    let mut table = Table::default();
    let mut now = Instant::now();
    let mut model = Model::default();
    // Past the in-flight limit every query scans the table: a budget keeps
    // a case fast.
    let mut budget: u32 = 8 * MAX_IN_FLIGHT as u32;
    for op in ops.iter().take(5000) {
        match op {
            Op::Query {
                len,
                id,
                client,
                listener,
            } => model.query(&mut table, now, *len, *id, *client, usize::from(*listener)),
            Op::Flood { count, client } => {
                let n = (*count % 2048).min(budget.min(u32::from(u16::MAX)) as u16);
                budget -= u32::from(n);
                for i in 0..n {
                    model.query(&mut table, now, 40, i, *client, 0);
                }
            }
            Op::Answer { nth, id, len } => model.answer(&mut table, *nth, *id, *len),
            Op::Wait { ms, long } => {
                now += if *long {
                    QUERY_TIMEOUT
                } else {
                    Duration::from_millis(u64::from(*ms))
                };
            }
        }
    }
}
