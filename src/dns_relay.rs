//! A UDP DNS relay: queries received on `listen` sockets go to `upstream`
//! from one socket, with their transaction id rewritten so the answers can
//! be matched back; answers go to whoever asked. It runs on both sides of a
//! microVM's NIC: in the guest, where a container's `resolv.conf` names a
//! loopback resolver (Docker's embedded DNS, 127.0.0.11), and in the
//! container's network namespace on the host, where that resolver is.
//!
//! What it receives is untrusted: datagrams shorter than a DNS header or
//! longer than [`MAX_DATAGRAM`] are dropped, answers are only accepted from
//! `upstream` and only for an id in flight, and at most [`MAX_IN_FLIGHT`]
//! queries wait at once (the oldest is forgotten first).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Bigger than any EDNS answer a resolver sends over UDP by default.
pub const MAX_DATAGRAM: usize = 4096;
pub const MAX_IN_FLIGHT: usize = 1024;
/// A query unanswered for this long is forgotten.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER: usize = 12;

struct Pending {
    client: SocketAddr,
    listener: usize,
    id: [u8; 2],
    sent: Instant,
}

/// The bookkeeping of a relay, apart from its sockets (tested on its own).
#[derive(Default)]
pub struct Table {
    next: u16,
    pending: HashMap<u16, Pending>,
}

impl Table {
    /// Records a query from `client` (arrived on listener `listener`) and
    /// rewrites its id; `None` drops it.
    pub fn outbound(
        &mut self,
        query: &mut [u8],
        client: SocketAddr,
        listener: usize,
        now: Instant,
    ) -> Option<()> {
        if query.len() < HEADER || query.len() > MAX_DATAGRAM {
            return None;
        }
        self.expire(now);
        if self.pending.len() >= MAX_IN_FLIGHT {
            let oldest = self
                .pending
                .iter()
                .min_by_key(|(_, p)| p.sent)
                .map(|(k, _)| *k)?;
            self.pending.remove(&oldest);
        }
        let mut id = self.next;
        while self.pending.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next = id.wrapping_add(1);
        let original = [query[0], query[1]];
        query[..2].copy_from_slice(&id.to_be_bytes());
        self.pending.insert(
            id,
            Pending {
                client,
                listener,
                id: original,
                sent: now,
            },
        );
        Some(())
    }

    /// Matches an answer to its query, restoring the id; the client and
    /// the listener to answer from, or `None` to drop it.
    pub fn inbound(&mut self, answer: &mut [u8]) -> Option<(SocketAddr, usize)> {
        if answer.len() < HEADER {
            return None;
        }
        let id = u16::from_be_bytes([answer[0], answer[1]]);
        let p = self.pending.remove(&id)?;
        answer[..2].copy_from_slice(&p.id);
        Some((p.client, p.listener))
    }

    fn expire(&mut self, now: Instant) {
        self.pending
            .retain(|_, p| now.duration_since(p.sent) < QUERY_TIMEOUT);
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

/// Relays until a socket fails; meant for a thread of its own.
pub fn run(listeners: Vec<UdpSocket>, upstream_socket: UdpSocket, upstream: SocketAddr) {
    let mut table = Table::default();
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| l.as_raw_fd())
        .chain(std::iter::once(upstream_socket.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let up = listeners.len();
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        for i in 0..fds.len() {
            if fds[i].revents == 0 {
                continue;
            }
            fds[i].revents = 0;
            if i == up {
                let Ok((n, from)) = upstream_socket.recv_from(&mut buf) else {
                    continue;
                };
                if from != upstream || n > MAX_DATAGRAM {
                    continue;
                }
                if let Some((client, l)) = table.inbound(&mut buf[..n]) {
                    let _ = listeners[l].send_to(&buf[..n], client);
                }
            } else {
                let Ok((n, client)) = listeners[i].recv_from(&mut buf) else {
                    continue;
                };
                if table
                    .outbound(&mut buf[..n], client, i, Instant::now())
                    .is_some()
                {
                    let _ = upstream_socket.send_to(&buf[..n], upstream);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn ids_are_rewritten_and_restored() {
        let mut t = Table::default();
        let now = Instant::now();
        let mut a = vec![0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7];
        let mut b = a.clone();
        t.outbound(&mut a, addr(1000), 0, now).unwrap();
        t.outbound(&mut b, addr(2000), 1, now).unwrap();
        assert_ne!(a[..2], b[..2], "two queries with one id get two ids");
        let (client, l) = t.inbound(&mut b).unwrap();
        assert_eq!((client, l), (addr(2000), 1));
        assert_eq!(b[..2], [0xab, 0xcd]);
        assert!(t.inbound(&mut b.clone()).is_none(), "answered once");
        let (client, _) = t.inbound(&mut a).unwrap();
        assert_eq!(client, addr(1000));
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn malformed_and_unasked_datagrams_are_dropped() {
        let mut t = Table::default();
        let now = Instant::now();
        assert!(t.outbound(&mut [0u8; 11], addr(1), 0, now).is_none());
        assert!(t
            .outbound(&mut vec![0u8; MAX_DATAGRAM + 1], addr(1), 0, now)
            .is_none());
        assert!(t.inbound(&mut [0u8; 5]).is_none());
        assert!(
            t.inbound(&mut [0u8; 12]).is_none(),
            "an answer nobody asked for"
        );
        let mut q = [0u8; 12];
        t.outbound(&mut q, addr(1), 0, now).unwrap();
        let mut answer = q;
        assert!(t.inbound(&mut answer).is_some());
        assert!(t.inbound(&mut q).is_none(), "an answer is taken once");
    }

    #[test]
    fn in_flight_queries_are_bounded_and_expire() {
        let mut t = Table::default();
        let now = Instant::now();
        for i in 0..(MAX_IN_FLIGHT + 10) {
            let mut q = [0u8; 12];
            t.outbound(&mut q, addr(i as u16), 0, now).unwrap();
        }
        assert_eq!(t.in_flight(), MAX_IN_FLIGHT);
        let mut q = [0u8; 12];
        t.outbound(
            &mut q,
            addr(1),
            0,
            now + QUERY_TIMEOUT + Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(t.in_flight(), 1);
    }

    /// A real round trip over loopback sockets.
    #[test]
    fn relays_over_udp() {
        let listener = UdpSocket::bind("127.0.0.1:0").unwrap();
        let relay_addr = listener.local_addr().unwrap();
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let server_addr = server.local_addr().unwrap();
        let up = UdpSocket::bind("127.0.0.1:0").unwrap();
        std::thread::spawn(move || run(vec![listener], up, server_addr));
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let query = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, b'q'];
        client.send_to(&query, relay_addr).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[2..n], &query[2..]);
        // A stranger's answer is ignored; the server's is relayed.
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(&buf[..n], from).unwrap();
        buf[n] = b'a';
        server.send_to(&buf[..n + 1], from).unwrap();
        let mut got = [0u8; 64];
        let (m, _) = client.recv_from(&mut got).unwrap();
        assert_eq!(&got[..2], &[0x12, 0x34]);
        assert_eq!(got[m - 1], b'a');
    }
}
