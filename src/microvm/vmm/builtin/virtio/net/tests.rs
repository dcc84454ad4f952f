//! virtio-net driven from the guest's side, with a datagram socketpair as
//! the tap (one frame, header first, per read and write, as a tap with
//! `IFF_VNET_HDR` behaves): frames both ways, a guest that posts no
//! buffers, frames too big for its buffers, and hostile chains and
//! headers.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::microvm::vmm::builtin::jail::{jailed, Role};

use super::{queues, Net, NetMetrics, F_MAC, HDR_LEN, QUEUE_SIZE, TYPE_NET};
use crate::microvm::vmm::builtin::virtio::chain::{DESC_F_NEXT, DESC_F_WRITE};
use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use crate::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1, INT_VRING};

const MEM: usize = 4 << 20;
const RX_AT: GuestAddress = GuestAddress(0x1000);
const TX_AT: GuestAddress = GuestAddress(0x4000);
const BUF: u64 = 0x10_0000;
const W: u16 = DESC_F_WRITE;
const MAC: [u8; 6] = [0x02, 0xa6, 0x00, 0x00, 0x00, 0x07];

struct Fixture {
    mem: GuestMemoryMmap,
    net: Net,
    host: UnixDatagram,
    interrupt: Arc<Interrupt>,
}

fn fixture() -> Fixture {
    let (tap, host) = UnixDatagram::pair().unwrap();
    host.set_nonblocking(true).unwrap();
    let mut net = Net::new(OwnedFd::from(tap), MAC).unwrap();
    let mem = memory(MEM).unwrap();
    let interrupt = Arc::new(Interrupt::new().unwrap());
    let rx = GuestQueue::new(&mem, RX_AT, QUEUE_SIZE).unwrap();
    let tx = GuestQueue::new(&mem, TX_AT, QUEUE_SIZE).unwrap();
    net.activate(
        mem.clone(),
        F_VERSION_1 | F_MAC,
        vec![rx.device_queue().unwrap(), tx.device_queue().unwrap()],
        interrupt.clone(),
    )
    .unwrap();
    Fixture {
        mem,
        net,
        host,
        interrupt,
    }
}

/// A frame with its (offload-free) header: `len` bytes of payload
/// counting up from `seed`.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; HDR_LEN];
    v.extend((0..len).map(|i| seed.wrapping_add(i as u8)));
    v
}

impl Fixture {
    fn queue(&self, index: usize) -> GuestQueue<'_> {
        let at = if index == queues::RX { RX_AT } else { TX_AT };
        GuestQueue::attach(&self.mem, at, QUEUE_SIZE).unwrap()
    }

    /// The guest sends `bytes` in one chain split at `split`.
    fn send(&mut self, bytes: &[u8], split: usize) {
        self.mem.write_slice(bytes, GuestAddress(BUF)).unwrap();
        let mut q = self.queue(queues::TX);
        let head = if split == 0 || split >= bytes.len() {
            q.set_chain(0, &[(BUF, bytes.len() as u32, 0)]).unwrap()
        } else {
            q.set_chain(
                0,
                &[
                    (BUF, split as u32, 0),
                    (BUF + split as u64, (bytes.len() - split) as u32, 0),
                ],
            )
            .unwrap()
        };
        q.offer(head).unwrap();
        self.serve_queue(queues::TX);
    }

    /// The guest posts a receive buffer of `len` bytes at `addr`.
    fn post(&mut self, index: u16, addr: u64, len: u32) {
        let mut q = self.queue(queues::RX);
        q.set_desc(index, addr, len, W, 0).unwrap();
        q.offer(index).unwrap();
    }

    fn received(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 70_000];
        match self.host.recv(&mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(e) => panic!("nothing reached the tap: {e}"),
        }
    }

    fn nothing_received(&self) -> bool {
        let mut buf = [0u8; 16];
        self.host.recv(&mut buf).is_err()
    }

    /// Serves queue `index` as the VMM does: on a thread in the devices
    /// thread's jail.
    fn serve_queue(&mut self, index: usize) {
        let net = &mut self.net;
        jailed(Role::Devices, move || net.process_queue(index)).unwrap();
    }

    /// Reads the tap as the VMM does, jailed.
    fn serve_tap(&mut self) {
        let net = &mut self.net;
        jailed(Role::Devices, move || net.process_tap()).unwrap();
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    NetMetrics::get(c)
}

#[test]
fn the_mac_is_in_the_configuration_space() {
    let f = fixture();
    assert_eq!(f.net.device_type(), TYPE_NET);
    assert_eq!(f.net.features(), F_VERSION_1 | F_MAC);
    assert_eq!(f.net.queue_max_sizes(), &[QUEUE_SIZE; 2]);
    let mut config = [0xffu8; 12];
    f.net.read_config(0, &mut config);
    assert_eq!(&config[..6], &MAC);
    assert_eq!(&config[6..], &[0; 6]);
    let mut tail = [0xffu8; 4];
    f.net.read_config(4, &mut tail);
    assert_eq!(tail, [MAC[4], MAC[5], 0, 0]);
    f.net.read_config(u64::MAX, &mut tail);
    assert_eq!(tail, [0; 4]);
}

#[test]
fn a_guest_frame_reaches_the_tap_whole() {
    let mut f = fixture();
    let out = frame(1500, 3);
    f.send(&out, 5);
    assert_eq!(f.received(), out);
    let q = f.queue(queues::TX);
    assert_eq!(q.used_idx().unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, 0));
    assert_eq!(get(&f.net.metrics.tx_frames), 1);
    assert_eq!(get(&f.net.metrics.tx_bytes), out.len() as u64);
    assert_eq!(f.interrupt.status(), INT_VRING);
}

#[test]
fn a_tap_frame_reaches_a_guest_buffer_with_one_buffer_in_its_header() {
    let mut f = fixture();
    f.post(0, BUF, 2048);
    let mut incoming = frame(1000, 9);
    // Whatever the tap says in num_buffers, the guest reads 1.
    incoming[10] = 7;
    f.host.send(&incoming).unwrap();
    f.serve_tap();
    let q = f.queue(queues::RX);
    assert_eq!(q.used_idx().unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, incoming.len() as u32));
    let got = f.bytes(BUF, incoming.len());
    assert_eq!(&got[10..12], &[1, 0]);
    assert_eq!(&got[12..], &incoming[12..]);
    assert_eq!(get(&f.net.metrics.rx_frames), 1);
    assert_eq!(f.interrupt.status(), INT_VRING);
}

#[test]
fn a_guest_without_buffers_holds_the_frame_and_the_tap_is_not_watched() {
    let mut f = fixture();
    assert_eq!(f.net.tap_interest(), EventSet::IN);
    f.host.send(&frame(100, 1)).unwrap();
    f.host.send(&frame(200, 2)).unwrap();
    f.serve_tap();
    assert_eq!(f.net.tap_interest(), EventSet::empty());
    assert_eq!(f.queue(queues::RX).used_idx().unwrap(), 0);
    // Buffers arrive: both frames, in order.
    f.post(0, BUF, 2048);
    f.post(1, BUF + 0x1000, 2048);
    f.serve_queue(queues::RX);
    let q = f.queue(queues::RX);
    assert_eq!(q.used_idx().unwrap(), 2);
    assert_eq!(q.used_elem(0).unwrap(), (0, 112));
    assert_eq!(q.used_elem(1).unwrap(), (1, 212));
    assert_eq!(f.bytes(BUF + 12, 3), vec![1, 2, 3]);
    assert_eq!(f.bytes(BUF + 0x1000 + 12, 3), vec![2, 3, 4]);
    assert_eq!(f.net.tap_interest(), EventSet::IN);
    // A reset device watches nothing.
    f.net.reset();
    assert_eq!(f.net.tap_interest(), EventSet::empty());
}

#[test]
fn a_frame_too_big_for_the_buffer_is_dropped_and_the_buffer_kept() {
    let mut f = fixture();
    f.post(0, BUF, 512);
    f.host.send(&frame(1000, 1)).unwrap();
    f.host.send(&frame(100, 5)).unwrap();
    // Shorter than a header: dropped too.
    f.host.send(&[1, 2, 3]).unwrap();
    f.serve_tap();
    let q = f.queue(queues::RX);
    assert_eq!(q.used_idx().unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, 112));
    assert_eq!(f.bytes(BUF + 12, 2), vec![5, 6]);
    assert_eq!(get(&f.net.metrics.rx_dropped), 2);
}

#[test]
fn hostile_transmit_chains_and_headers_send_nothing_and_are_counted() {
    let mut f = fixture();
    // Shorter than the header.
    f.send(&[0u8; 5], 0);
    // A header asking for a checksum offload, and one for TSO, neither
    // offered.
    let mut csum = frame(100, 0);
    csum[0] = 1;
    f.send(&csum, 0);
    let mut gso = frame(100, 0);
    gso[1] = 1;
    f.send(&gso, 0);
    assert!(f.nothing_received());
    assert_eq!(get(&f.net.metrics.tx_dropped), 3);
    // A writable buffer on the transmit queue, a loop, a buffer outside
    // memory: refused by the validator.
    let mut q = f.queue(queues::TX);
    q.set_desc(0, BUF, 64, W, 0).unwrap();
    q.offer(0).unwrap();
    q.set_desc(1, BUF, 64, DESC_F_NEXT, 1).unwrap();
    q.offer(1).unwrap();
    q.set_desc(2, MEM as u64 - 8, 64, 0, 0).unwrap();
    q.offer(2).unwrap();
    f.serve_queue(queues::TX);
    assert_eq!(get(&f.net.metrics.bad_chains), 3);
    assert!(f.nothing_received());
    let q = f.queue(queues::TX);
    assert_eq!(q.used_idx().unwrap(), 6, "every chain is returned");
    // After all that, a good frame still goes out.
    let good = frame(60, 4);
    f.send(&good, 0);
    assert_eq!(f.received(), good);
}

#[test]
fn hostile_receive_chains_are_counted_and_the_frame_waits_for_a_good_one() {
    let mut f = fixture();
    let mut q = f.queue(queues::RX);
    // A readable buffer where the device must write, and one past memory.
    q.set_desc(0, BUF, 2048, 0, 0).unwrap();
    q.offer(0).unwrap();
    q.set_desc(1, MEM as u64 - 16, 2048, W, 0).unwrap();
    q.offer(1).unwrap();
    f.host.send(&frame(100, 1)).unwrap();
    f.serve_tap();
    assert_eq!(get(&f.net.metrics.bad_chains), 2);
    let q = f.queue(queues::RX);
    assert_eq!(q.used_elem(0).unwrap(), (0, 0));
    assert_eq!(q.used_elem(1).unwrap(), (1, 0));
    f.post(2, BUF, 2048);
    f.serve_queue(queues::RX);
    assert_eq!(f.queue(queues::RX).used_elem(2).unwrap(), (2, 112));
}

#[test]
fn activation_wants_two_queues() {
    let (tap, _host) = UnixDatagram::pair().unwrap();
    let mut net = Net::new(OwnedFd::from(tap), MAC).unwrap();
    let mem = memory(MEM).unwrap();
    let q = GuestQueue::new(&mem, RX_AT, QUEUE_SIZE).unwrap();
    let interrupt = Arc::new(Interrupt::new().unwrap());
    assert!(net
        .activate(mem.clone(), 0, vec![q.device_queue().unwrap()], interrupt)
        .is_err());
    assert!(!net.is_activated());
    assert_eq!(net.tap_interest(), EventSet::empty());
    // Nothing is served before activation.
    jailed(Role::Devices, || {
        net.process_queue(queues::TX).unwrap();
        net.process_tap().unwrap();
    });
}
