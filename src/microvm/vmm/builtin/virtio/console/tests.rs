//! virtio-console driven from the guest's side as Linux's
//! `virtio_console` driver drives it (drivers/char/virtio_console.c, 6.1):
//! the control handshake, port 1's bytes both ways through a socketpair,
//! flow control both ways, the host hanging up, and hostile chains on each
//! queue.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use super::control::event;
use super::queues::{CONTROL_RX, CONTROL_TX, COUNT, PORT0_TX, PORT1_RX, PORT1_TX};
use super::{Console, F_MULTIPORT, MAX_PORTS, QUEUE_SIZE, TYPE_CONSOLE};
use crate::microvm::vmm::builtin::virtio::chain::{DESC_F_NEXT, DESC_F_WRITE};
use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use crate::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1, INT_VRING};

const MEM: usize = 16 << 20;
const BUFS: u64 = 0x10_0000;
/// Where hostile chains are put: descriptors the driver's allocator below
/// never reaches in those tests, and a scratch buffer.
const HOSTILE: u16 = 100;
const SCRATCH: u64 = 0x8_0000;
const W: u16 = DESC_F_WRITE;
const NAME: &[u8] = crate::protocol::PORT_NAME.as_bytes();
/// `VIRTIO_CONSOLE_BAD_ID`, the id Linux sends `DEVICE_READY` with.
const BAD_ID: u32 = u32::MAX;

/// A control message as the wire has it.
fn ctl(id: u32, ev: u16, value: u16) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend_from_slice(&ev.to_le_bytes());
    v.extend_from_slice(&value.to_le_bytes());
    v
}

fn port_name() -> Vec<u8> {
    let mut v = ctl(1, event::PORT_NAME, 1);
    v.extend_from_slice(NAME);
    v
}

/// `len` bytes that tell their position apart.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i + seed) % 251) as u8).collect()
}

/// The guest driver's side of the six queues.
struct Driver<'a> {
    mem: &'a GuestMemoryMmap,
    qs: Vec<GuestQueue<'a>>,
    next_desc: Vec<u16>,
    seen: Vec<u16>,
    /// The writable buffers of each chain put on a queue, by head.
    writable: HashMap<(usize, u16), Vec<(u64, u32)>>,
    next_buf: u64,
}

impl<'a> Driver<'a> {
    fn new(mem: &'a GuestMemoryMmap) -> Driver<'a> {
        let qs = (0..COUNT)
            .map(|i| GuestQueue::new(mem, GuestAddress(0x1000 + 0x2000 * i as u64), QUEUE_SIZE))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        Driver {
            mem,
            qs,
            next_desc: vec![0; COUNT],
            seen: vec![0; COUNT],
            writable: HashMap::new(),
            next_buf: BUFS,
        }
    }

    fn descs(&mut self, q: usize, n: usize) -> u16 {
        let n = n as u16;
        if self.next_desc[q] + n > HOSTILE {
            self.next_desc[q] = 0;
        }
        let first = self.next_desc[q];
        self.next_desc[q] += n;
        first
    }

    fn alloc(&mut self, len: u32) -> u64 {
        let at = self.next_buf;
        self.next_buf += (u64::from(len) + 0xfff) & !0xfff;
        assert!(self.next_buf < MEM as u64, "test memory exhausted");
        at
    }

    /// A chain of readable buffers holding `parts`, offered.
    fn send(&mut self, q: usize, parts: &[&[u8]]) -> u16 {
        let first = self.descs(q, parts.len());
        let mut bufs = Vec::new();
        for p in parts {
            let at = self.alloc(p.len() as u32);
            self.mem.write_slice(p, GuestAddress(at)).unwrap();
            bufs.push((at, p.len() as u32, 0));
        }
        let head = self.qs[q].set_chain(first, &bufs).unwrap();
        self.qs[q].offer(head).unwrap();
        head
    }

    /// A chain of writable buffers of `lens` bytes, offered.
    fn post(&mut self, q: usize, lens: &[u32]) -> u16 {
        let first = self.descs(q, lens.len());
        let mut bufs = Vec::new();
        for &len in lens {
            bufs.push((self.alloc(len), len, W));
        }
        let head = self.qs[q].set_chain(first, &bufs).unwrap();
        self.writable
            .insert((q, head), bufs.iter().map(|&(a, l, _)| (a, l)).collect());
        self.qs[q].offer(head).unwrap();
        head
    }

    /// Descriptors written as they are (index, addr, len, flags, next),
    /// the first offered.
    fn hostile(&mut self, q: usize, descs: &[(u16, u64, u32, u16, u16)]) {
        for &(i, addr, len, flags, next) in descs {
            self.qs[q].set_desc(i, addr, len, flags, next).unwrap();
        }
        self.qs[q].offer(descs[0].0).unwrap();
    }

    /// The used entries since the last call: (head, length).
    fn used(&mut self, q: usize) -> Vec<(u16, u32)> {
        let idx = self.qs[q].used_idx().unwrap();
        let mut out = Vec::new();
        while self.seen[q] != idx {
            let (head, len) = self.qs[q].used_elem(self.seen[q]).unwrap();
            out.push((head as u16, len));
            self.seen[q] = self.seen[q].wrapping_add(1);
        }
        out
    }

    /// The bytes of each receive chain used since the last call.
    fn received(&mut self, q: usize) -> Vec<Vec<u8>> {
        self.used(q)
            .into_iter()
            .map(|(head, len)| {
                let mut left = len as usize;
                let mut bytes = Vec::new();
                for &(addr, blen) in self.writable.get(&(q, head)).expect("a posted chain") {
                    let n = left.min(blen as usize);
                    let mut b = vec![0; n];
                    self.mem.read_slice(&mut b, GuestAddress(addr)).unwrap();
                    bytes.extend_from_slice(&b);
                    left -= n;
                }
                assert_eq!(left, 0, "used length past the chain");
                bytes
            })
            .collect()
    }
}

struct Setup<'a> {
    console: Console,
    peer: UnixStream,
    interrupt: Arc<Interrupt>,
    d: Driver<'a>,
}

fn setup(mem: &GuestMemoryMmap) -> Setup<'_> {
    let (ours, peer) = UnixStream::pair().unwrap();
    peer.set_nonblocking(true).unwrap();
    let d = Driver::new(mem);
    let mut console = Console::new(ours).unwrap();
    let interrupt = Arc::new(Interrupt::new().unwrap());
    console
        .activate(
            mem.clone(),
            F_VERSION_1 | F_MULTIPORT,
            d.qs.iter().map(|q| q.device_queue().unwrap()).collect(),
            interrupt.clone(),
        )
        .unwrap();
    Setup {
        console,
        peer,
        interrupt,
        d,
    }
}

impl Setup<'_> {
    /// The guest sends one control message and the device serves it.
    fn control(&mut self, msg: &[u8]) -> u16 {
        let head = self.d.send(CONTROL_TX, &[msg]);
        self.console.process_queue(CONTROL_TX).unwrap();
        head
    }

    /// The handshake, with `ctl_bufs` control and `rx_bufs` port-1
    /// receive buffers of a page posted, as Linux posts them; the guest
    /// opens the port if `open`.
    fn handshake(&mut self, ctl_bufs: usize, rx_bufs: usize, open: bool) {
        for _ in 0..ctl_bufs {
            self.d.post(CONTROL_RX, &[4096]);
        }
        self.control(&ctl(BAD_ID, event::DEVICE_READY, 1));
        for _ in 0..rx_bufs {
            self.d.post(PORT1_RX, &[4096]);
        }
        self.control(&ctl(1, event::PORT_READY, 1));
        if open {
            self.control(&ctl(1, event::PORT_OPEN, 1));
        }
        assert_eq!(
            self.d.received(CONTROL_RX),
            vec![
                ctl(1, event::DEVICE_ADD, 0),
                port_name(),
                ctl(1, event::PORT_OPEN, 1)
            ]
        );
        self.d.used(CONTROL_TX);
        assert_eq!(self.console.metrics.queues.bad_chains(), 0);
    }

    /// What the host side can read now.
    fn peer_read(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; 1 << 16];
        loop {
            match self.peer.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        out
    }
}

/// A console in an event loop of its own, as the VMM runs it.
struct Looped<'a> {
    console: Arc<Mutex<Console>>,
    events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>,
    peer: UnixStream,
    d: Driver<'a>,
}

fn in_event_loop(s: Setup<'_>) -> Looped<'_> {
    let Setup {
        console, peer, d, ..
    } = s;
    let console = Arc::new(Mutex::new(console));
    let mut events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
        EventManager::new().unwrap();
    events.add_subscriber(console.clone());
    Looped {
        console,
        events,
        peer,
        d,
    }
}

impl Looped<'_> {
    /// The queue's notification, as KVM's ioeventfd writes it.
    fn notify(&self, queue: usize) {
        self.console.lock().unwrap().queue_events()[queue]
            .write(1)
            .unwrap();
    }

    fn registered(&self) -> EventSet {
        self.console.lock().unwrap().registered
    }
}
#[test]
fn the_handshake_goes_as_linuxs_driver_does_it() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    assert_eq!(s.console.device_type(), TYPE_CONSOLE);
    assert_ne!(s.console.features() & F_MULTIPORT, 0);
    assert_eq!(s.console.queue_max_sizes().len(), 6);
    // virtio_cread_feature(.., max_nr_ports): 4 bytes at offset 4.
    let mut cfg = [0xffu8; 4];
    s.console.read_config(4, &mut cfg);
    assert_eq!(u32::from_le_bytes(cfg), MAX_PORTS);
    s.console.read_config(0, &mut cfg);
    assert_eq!(cfg, [0; 4], "cols and rows");
    s.console.read_config(12, &mut cfg);
    assert_eq!(cfg, [0; 4], "past the configuration");

    // probe(): the control receive queue filled, then DEVICE_READY.
    for _ in 0..8 {
        s.d.post(CONTROL_RX, &[4096]);
    }
    let head = s.control(&ctl(BAD_ID, event::DEVICE_READY, 1));
    assert_eq!(s.d.used(CONTROL_TX), vec![(head, 0)], "the message is used");
    assert_eq!(s.d.received(CONTROL_RX), vec![ctl(1, event::DEVICE_ADD, 0)]);
    assert_eq!(s.interrupt.status(), INT_VRING);
    // Once for the control transmit queue, once for the receive queue.
    assert_eq!(s.interrupt.eventfd().read().unwrap(), 2);

    // add_port(1): its receive queue filled, then PORT_READY.
    for _ in 0..4 {
        s.d.post(PORT1_RX, &[4096]);
    }
    s.control(&ctl(1, event::PORT_READY, 1));
    assert_eq!(
        s.d.received(CONTROL_RX),
        vec![port_name(), ctl(1, event::PORT_OPEN, 1)]
    );
    // The port is not open in the guest yet: the socket is not read.
    assert!(!s.console.guest_connected());
    assert_eq!(s.console.socket_interest(), EventSet::empty());

    // port_fops_open(): PORT_OPEN 1; the device now waits for input.
    s.control(&ctl(1, event::PORT_OPEN, 1));
    assert!(s.console.guest_connected());
    assert_eq!(s.console.socket_interest(), EventSet::IN);
    assert_eq!(s.d.received(CONTROL_RX), Vec::<Vec<u8>>::new());
    // port_fops_release(): PORT_OPEN 0, noted; the socket is not read.
    s.control(&ctl(1, event::PORT_OPEN, 0));
    assert!(!s.console.guest_connected());
    assert_eq!(s.console.socket_interest(), EventSet::empty());
    assert_eq!(s.console.metrics.queues.bad_chains(), 0);
    assert_eq!(s.console.metrics.queues.chains(), 4 + 3);
}

#[test]
fn control_messages_wait_for_the_guests_buffers() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.control(&ctl(BAD_ID, event::DEVICE_READY, 1));
    s.control(&ctl(1, event::PORT_READY, 1));
    assert_eq!(s.d.used(CONTROL_RX), vec![]);
    // A buffer posted and notified: the oldest message first.
    s.d.post(CONTROL_RX, &[4096]);
    s.console.process_queue(CONTROL_RX).unwrap();
    assert_eq!(s.d.received(CONTROL_RX), vec![ctl(1, event::DEVICE_ADD, 0)]);
    s.d.post(CONTROL_RX, &[4096]);
    s.d.post(CONTROL_RX, &[4096]);
    s.console.process_queue(CONTROL_RX).unwrap();
    assert_eq!(
        s.d.received(CONTROL_RX),
        vec![port_name(), ctl(1, event::PORT_OPEN, 1)]
    );
    // A guest asking for answers without posting buffers cannot make the
    // device hold more than MAX_PENDING_CONTROL of them.
    for _ in 0..(super::MAX_PENDING_CONTROL + 10) {
        s.control(&ctl(BAD_ID, event::DEVICE_READY, 1));
    }
    assert_eq!(s.console.metrics.control_ignored(), 10);
}

#[test]
fn bytes_go_from_the_guest_to_the_host_in_order() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    let h1 = s.d.send(PORT1_TX, &[b"hello "]);
    // One write of the guest in three buffers.
    let h2 = s.d.send(PORT1_TX, &[b"wo", b"r", b"ld"]);
    s.console.process_queue(PORT1_TX).unwrap();
    assert_eq!(s.d.used(PORT1_TX), vec![(h1, 0), (h2, 0)]);
    assert_eq!(s.peer_read(), b"hello world");
    assert_eq!(s.console.metrics.bytes_to_host(), 11);
    assert_ne!(s.interrupt.status() & INT_VRING, 0);
}

#[test]
fn bytes_go_from_the_host_to_the_guest_across_buffers() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    let msg = pattern(10_000, 3);
    s.peer.write_all(&msg).unwrap();
    s.console.process_socket().unwrap();
    let got = s.d.received(PORT1_RX);
    assert_eq!(
        got.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![4096, 4096, 1808]
    );
    assert_eq!(got.concat(), msg);
    // One buffer left: 4096 of the next 5000 bytes, then the device stops
    // watching the socket until the guest posts more.
    let more = pattern(5000, 7);
    s.peer.write_all(&more).unwrap();
    s.console.process_socket().unwrap();
    assert_eq!(s.d.received(PORT1_RX), vec![more[..4096].to_vec()]);
    assert_eq!(s.console.socket_interest(), EventSet::empty());
    s.console.process_socket().unwrap();
    assert_eq!(s.d.used(PORT1_RX), vec![]);
    // A chain of two buffers takes the rest.
    s.d.post(PORT1_RX, &[100, 4096]);
    s.console.process_queue(PORT1_RX).unwrap();
    assert_eq!(s.d.received(PORT1_RX), vec![more[4096..].to_vec()]);
    // The ring is empty again: not watched.
    assert_eq!(s.console.socket_interest(), EventSet::empty());
    assert_eq!(
        s.console.metrics.queues.bytes_written(),
        15_000 + 3 * 8 + NAME.len() as u64
    );
}

#[test]
fn host_bytes_wait_until_the_guest_opens_the_port() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, false);
    s.peer.write_all(b"early").unwrap();
    // Linux discards a closed port's input: the device must not read it.
    s.console.process_socket().unwrap();
    assert_eq!(s.d.used(PORT1_RX), vec![]);
    s.control(&ctl(1, event::PORT_OPEN, 1));
    assert_eq!(s.d.received(PORT1_RX), vec![b"early".to_vec()]);
    // Closed again: input stays in the socket.
    s.control(&ctl(1, event::PORT_OPEN, 0));
    s.peer.write_all(b"late").unwrap();
    s.console.process_socket().unwrap();
    assert_eq!(s.d.used(PORT1_RX), vec![]);
}

#[test]
fn a_slow_host_reader_holds_the_guest_back_and_loses_nothing() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    const CHAINS: usize = 16;
    const LEN: usize = 64 * 1024;
    let data = pattern(CHAINS * LEN, 11);
    let heads: Vec<u16> = data
        .chunks(LEN)
        .map(|c| s.d.send(PORT1_TX, &[&c[..1000], &c[1000..]]))
        .collect();
    s.console.process_queue(PORT1_TX).unwrap();
    let first = s.d.used(PORT1_TX);
    assert!(first.len() < CHAINS, "the socket never filled");
    assert!(s.console.socket_interest().contains(EventSet::OUT));
    let taken = s.console.metrics.bytes_to_host();
    assert!(taken < data.len() as u64);
    // Notifications while the socket is full take nothing more.
    for _ in 0..3 {
        s.console.process_queue(PORT1_TX).unwrap();
        assert_eq!(s.d.used(PORT1_TX), vec![]);
        assert_eq!(s.console.metrics.bytes_to_host(), taken);
    }
    // The host reads; each time the socket is writable the device goes on.
    let mut got = s.peer_read();
    let mut used = first;
    for _ in 0..1000 {
        if got.len() == data.len() {
            break;
        }
        s.console.process_socket().unwrap();
        used.extend(s.d.used(PORT1_TX));
        got.extend(s.peer_read());
    }
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes lost or reordered");
    assert_eq!(used, heads.iter().map(|&h| (h, 0)).collect::<Vec<_>>());
    assert!(!s.console.socket_interest().contains(EventSet::OUT));
    assert_eq!(s.console.metrics.bytes_dropped(), 0);
}

#[test]
fn a_host_hang_up_closes_the_port_in_the_guest() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    s.peer.write_all(b"bye").unwrap();
    s.peer.shutdown(std::net::Shutdown::Write).unwrap();
    s.console.process_socket().unwrap();
    // The bytes first, then PORT_OPEN 0.
    assert_eq!(s.d.received(PORT1_RX), vec![b"bye".to_vec()]);
    assert_eq!(s.d.received(CONTROL_RX), vec![ctl(1, event::PORT_OPEN, 0)]);
    assert!(!s.console.host_connected());
    assert_eq!(s.console.socket_interest(), EventSet::empty());
    // What the guest still sends is completed and dropped.
    let h = s.d.send(PORT1_TX, &[b"lost"]);
    s.console.process_queue(PORT1_TX).unwrap();
    assert_eq!(s.d.used(PORT1_TX), vec![(h, 0)]);
    assert_eq!(s.console.metrics.bytes_dropped(), 4);
    assert_eq!(s.peer_read(), b"");
    // A port set up again is not announced as open.
    s.control(&ctl(1, event::PORT_READY, 1));
    assert_eq!(s.d.received(CONTROL_RX), vec![port_name()]);
}

#[test]
fn a_host_gone_while_the_guest_sends_closes_the_port() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 0, true);
    let Setup { peer, .. } = &s;
    drop(peer.try_clone().unwrap());
    s.peer.shutdown(std::net::Shutdown::Both).unwrap();
    // EPIPE (no SIGPIPE: the test would die of it).
    let h = s.d.send(PORT1_TX, &[b"to nobody"]);
    s.console.process_queue(PORT1_TX).unwrap();
    assert_eq!(s.d.used(PORT1_TX), vec![(h, 0)]);
    assert_eq!(s.d.received(CONTROL_RX), vec![ctl(1, event::PORT_OPEN, 0)]);
    assert!(!s.console.host_connected());
}

type Desc = (u16, u64, u32, u16, u16);

/// Chains every queue refuses, written for a queue whose buffers have
/// flags `good` (0 or WRITE).
fn hostile_chains(good: u16) -> Vec<(&'static str, Vec<Desc>)> {
    let bad = good ^ W;
    let end = MEM as u64;
    let h = HOSTILE;
    vec![
        ("the wrong direction", vec![(h, SCRATCH, 16, bad, 0)]),
        (
            "good then the wrong direction",
            vec![
                (h, SCRATCH, 8, good | DESC_F_NEXT, h + 1),
                (h + 1, SCRATCH + 8, 8, bad, 0),
            ],
        ),
        (
            "wholly outside memory",
            vec![(h, end + 0x1000, 16, good, 0)],
        ),
        ("past the end of memory", vec![(h, end - 8, 16, good, 0)]),
        (
            "an address that wraps",
            vec![(h, u64::MAX - 4, 16, good, 0)],
        ),
        (
            "a loop",
            vec![
                (h, SCRATCH, 8, good | DESC_F_NEXT, h + 1),
                (h + 1, SCRATCH + 8, 8, good | DESC_F_NEXT, h),
            ],
        ),
        ("zero length", vec![(h, SCRATCH, 0, good, 0)]),
        (
            "next outside the table",
            vec![(h, SCRATCH, 8, good | DESC_F_NEXT, QUEUE_SIZE + 3)],
        ),
    ]
}

#[test]
fn hostile_control_messages_are_completed_empty_and_counted() {
    let mut cases: Vec<(&str, Vec<Desc>, Vec<u8>)> = hostile_chains(0)
        .into_iter()
        .map(|(w, d)| (w, d, Vec::new()))
        .collect();
    let contents: Vec<(&str, Vec<u8>)> = vec![
        ("nine bytes", {
            let mut m = ctl(1, event::PORT_READY, 1);
            m.push(0);
            m
        }),
        ("a page", {
            let mut m = ctl(1, event::PORT_READY, 1);
            m.resize(4096, 0);
            m
        }),
        ("seven bytes", ctl(1, event::PORT_READY, 1)[..7].to_vec()),
        (
            "an event only the device sends",
            ctl(1, event::DEVICE_ADD, 0),
        ),
        ("an unknown event", ctl(1, 99, 1)),
        ("a port that does not exist", ctl(2, event::PORT_READY, 1)),
        ("port u32::MAX", ctl(u32::MAX, event::PORT_OPEN, 1)),
        ("a value of 2", ctl(1, event::PORT_OPEN, 2)),
    ];
    for (what, bytes) in contents {
        let len = bytes.len() as u32;
        cases.push((what, vec![(HOSTILE, SCRATCH, len, 0, 0)], bytes));
    }
    for (what, descs, bytes) in cases {
        let mem = memory(MEM).unwrap();
        let mut s = setup(&mem);
        s.handshake(8, 4, false);
        mem.write_slice(&bytes, GuestAddress(SCRATCH)).unwrap();
        s.d.hostile(CONTROL_TX, &descs);
        let good = s.d.send(CONTROL_TX, &[&ctl(1, event::PORT_OPEN, 1)]);
        s.console.process_queue(CONTROL_TX).unwrap();
        assert_eq!(
            s.d.used(CONTROL_TX),
            vec![(HOSTILE, 0), (good, 0)],
            "{what}: both completed"
        );
        assert_eq!(s.console.metrics.queues.bad_chains(), 1, "{what}");
        assert!(s.console.guest_connected(), "{what}: the next one served");
        assert_eq!(s.d.received(CONTROL_RX), Vec::<Vec<u8>>::new(), "{what}");
    }
}

#[test]
fn hostile_chains_on_the_ports_queues_are_completed_empty_and_counted() {
    for (what, descs) in hostile_chains(0) {
        let mem = memory(MEM).unwrap();
        let mut s = setup(&mem);
        s.handshake(8, 4, true);
        s.d.hostile(PORT1_TX, &descs);
        let good = s.d.send(PORT1_TX, &[b"ok"]);
        s.console.process_queue(PORT1_TX).unwrap();
        assert_eq!(
            s.d.used(PORT1_TX),
            vec![(HOSTILE, 0), (good, 0)],
            "tx: {what}"
        );
        assert_eq!(s.peer_read(), b"ok", "tx: {what}: nothing else sent");
        assert_eq!(s.console.metrics.queues.bad_chains(), 1, "tx: {what}");
    }
    for (what, descs) in hostile_chains(W) {
        let mem = memory(MEM).unwrap();
        let mut s = setup(&mem);
        s.handshake(8, 0, true);
        s.d.hostile(PORT1_RX, &descs);
        let good = s.d.post(PORT1_RX, &[64]);
        s.peer.write_all(b"ok").unwrap();
        s.console.process_queue(PORT1_RX).unwrap();
        assert_eq!(
            s.d.used(PORT1_RX),
            vec![(HOSTILE, 0), (good, 2)],
            "rx: {what}"
        );
        assert_eq!(s.console.metrics.queues.bad_chains(), 1, "rx: {what}");
        let mut scratch = [0u8; 16];
        mem.read_slice(&mut scratch, GuestAddress(SCRATCH)).unwrap();
        assert_eq!(scratch, [0; 16], "rx: {what}: nothing written");
    }
    let mut cases = hostile_chains(W);
    cases.push(("too small for a message", vec![(HOSTILE, SCRATCH, 7, W, 0)]));
    for (what, descs) in cases {
        let mem = memory(MEM).unwrap();
        let mut s = setup(&mem);
        // Exactly the buffers the handshake uses: the ring is then empty.
        s.handshake(3, 0, false);
        s.d.hostile(CONTROL_RX, &descs);
        s.d.post(CONTROL_RX, &[4096]);
        s.control(&ctl(1, event::PORT_READY, 1));
        let used = s.d.used(CONTROL_RX);
        assert_eq!(used.len(), 2, "control rx: {what}");
        assert_eq!(used[0], (HOSTILE, 0), "control rx: {what}");
        assert_eq!(
            s.console.metrics.queues.bad_chains(),
            1,
            "control rx: {what}"
        );
        let mut scratch = [0u8; 16];
        mem.read_slice(&mut scratch, GuestAddress(SCRATCH)).unwrap();
        assert_eq!(scratch, [0; 16], "control rx: {what}: nothing written");
        // The next buffer got the message the hostile one did not.
        s.d.post(CONTROL_RX, &[4096]);
        s.console.process_queue(CONTROL_RX).unwrap();
        assert_eq!(s.d.received(CONTROL_RX), vec![ctl(1, event::PORT_OPEN, 1)]);
    }
}

#[test]
fn port_0_is_never_announced_and_takes_nothing() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    let h = s.d.send(PORT0_TX, &[b"port zero"]);
    s.console.process_queue(PORT0_TX).unwrap();
    assert_eq!(s.d.used(PORT0_TX), vec![(h, 0)]);
    assert_eq!(s.peer_read(), b"");
    assert_eq!(s.console.metrics.bytes_dropped(), 9);
    s.control(&ctl(0, event::PORT_READY, 1));
    s.control(&ctl(0, event::PORT_OPEN, 1));
    assert_eq!(s.d.received(CONTROL_RX), Vec::<Vec<u8>>::new());
    assert_eq!(s.console.metrics.control_ignored(), 2);
}

#[test]
fn the_event_loop_serves_the_queues_and_the_socket() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    let mut l = in_event_loop(s);
    assert_eq!(l.registered(), EventSet::IN);
    // Host to guest: the socket's input.
    l.peer.write_all(b"ping").unwrap();
    assert_eq!(l.events.run_with_timeout(1000).unwrap(), 1);
    assert_eq!(l.d.received(PORT1_RX), vec![b"ping".to_vec()]);
    // Guest to host: the queue's notification.
    l.d.send(PORT1_TX, &[b"pong"]);
    l.notify(PORT1_TX);
    assert_eq!(l.events.run_with_timeout(1000).unwrap(), 1);
    let mut buf = [0u8; 4];
    l.peer.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong");
    // The guest closes the port: the socket is no longer watched, and
    // input waits in it.
    l.d.send(CONTROL_TX, &[&ctl(1, event::PORT_OPEN, 0)]);
    l.notify(CONTROL_TX);
    assert_eq!(l.events.run_with_timeout(1000).unwrap(), 1);
    assert_eq!(l.registered(), EventSet::empty());
    l.peer.write_all(b"waits").unwrap();
    assert_eq!(l.events.run_with_timeout(50).unwrap(), 0);
}

#[test]
fn activation_wants_multiport_and_six_queues_and_a_reset_stops_all() {
    let mem = memory(MEM).unwrap();
    let (ours, _peer) = UnixStream::pair().unwrap();
    let mut c = Console::new(ours).unwrap();
    let d = Driver::new(&mem);
    let irq = Arc::new(Interrupt::new().unwrap());
    let qs = || {
        d.qs.iter()
            .map(|q| q.device_queue().unwrap())
            .collect::<Vec<_>>()
    };
    assert!(c
        .activate(mem.clone(), F_VERSION_1, qs(), irq.clone())
        .is_err());
    let mut five = qs();
    five.pop();
    assert!(c
        .activate(mem.clone(), F_VERSION_1 | F_MULTIPORT, five, irq.clone())
        .is_err());
    assert!(!c.is_activated());
    let mut s = setup(&mem);
    s.handshake(8, 4, true);
    s.console.reset();
    assert!(!s.console.is_activated() && !s.console.guest_connected());
    assert_eq!(s.console.socket_interest(), EventSet::empty());
    s.d.send(PORT1_TX, &[b"x"]);
    s.console.process_queue(PORT1_TX).unwrap();
    s.console.process_socket().unwrap();
    assert_eq!(s.d.used(PORT1_TX), vec![]);
}

#[test]
fn the_event_loop_waits_for_a_full_socket_to_drain() {
    let mem = memory(MEM).unwrap();
    let mut s = setup(&mem);
    s.handshake(8, 0, true);
    // No receive buffers: the socket is watched for output only.
    let mut l = in_event_loop(s);
    assert_eq!(l.registered(), EventSet::empty());
    let data = pattern(16 * 64 * 1024, 5);
    for c in data.chunks(64 * 1024) {
        l.d.send(PORT1_TX, &[c]);
    }
    l.notify(PORT1_TX);
    assert_eq!(l.events.run_with_timeout(1000).unwrap(), 1);
    assert_eq!(l.registered(), EventSet::OUT);
    assert!(l.d.used(PORT1_TX).len() < 16);
    // Nobody reads: the loop has nothing to do.
    assert_eq!(l.events.run_with_timeout(50).unwrap(), 0);
    // The host reads; EPOLLOUT brings the device back each time.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..10_000 {
        if got.len() == data.len() {
            break;
        }
        match l.peer.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        l.events.run_with_timeout(10).unwrap();
    }
    assert!(got == data, "bytes lost or reordered");
    l.d.used(PORT1_TX);
    assert_eq!(l.d.qs[PORT1_TX].used_idx().unwrap(), 16);
    assert_eq!(l.registered(), EventSet::empty());
}
