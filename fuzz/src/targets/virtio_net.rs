//! The builtin VMM's virtio-net device
//! ([`agentvm::microvm::vmm::builtin::virtio::net::Net`]) as a hostile
//! guest and the network drive it, with a datagram socketpair as its tap.
//!
//! An input is read with `arbitrary` as up to 64 steps: a transmit chain
//! (one or two readable buffers holding a header whose flags and GSO type
//! are mostly 0 and a frame of 0 to 2 KiB, or raw descriptors: any
//! address, length, flags and `next`), a receive buffer (a length from a
//! few bytes to a page, writable or not, inside memory or past it), a
//! frame from the network (0 to 2 KiB, sometimes shorter than a header),
//! (the device woken as the event loop would), a queue notification or a
//! tap event.
//!
//! Nothing may panic; each queue's used ring may not move past what the
//! guest offered; every frame the device counts as sent reached the tap
//! whole and with no offload asked for; no receive buffer is given more
//! than it holds; frames given to the guest plus frames dropped plus the
//! one waiting never exceed what the network sent.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use agentvm::microvm::vmm::builtin::virtio::net::{queues, Net, NetMetrics, HDR_LEN};
use agentvm::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use agentvm::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1};
use arbitrary::{Arbitrary, Unstructured};
use vm_memory::{Bytes, GuestAddress};

const MEM: u64 = 0x4_0000;
const SIZE: u16 = 16;
const RX_AT: u64 = 0x0;
const TX_AT: u64 = 0x400;
/// Buffers from here.
const BUFS: u64 = 0x1000;
const W: u16 = 2;
const NEXT: u16 = 1;

#[derive(Arbitrary, Debug)]
struct RawDesc {
    addr: u32,
    len: u16,
    flags: u8,
    next: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Send {
        offload: Option<(u8, u8)>,
        len: u16,
        split: Option<u8>,
    },
    RawTx(Vec<RawDesc>),
    Post {
        len: u16,
        readable: bool,
        past_memory: bool,
    },
    Network(u16),
    Notify(bool),
    Tap,
}

#[derive(Arbitrary, Debug)]
struct Case {
    ops: Vec<Op>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

fn get(c: &AtomicU64) -> u64 {
    NetMetrics::get(c)
}

pub fn run(data: &[u8]) {
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let Ok((tap, host)) = UnixDatagram::pair() else {
        panic!("a socketpair");
    };
    if host.set_nonblocking(true).is_err() {
        panic!("a non-blocking socket");
    }
    let mut net = match Net::new(OwnedFd::from(tap), [2, 0, 0, 0, 0, 1]) {
        Ok(n) => n,
        Err(e) => panic!("the device: {e}"),
    };
    let mem = match memory(MEM as usize) {
        Ok(m) => m,
        Err(e) => panic!("guest memory: {e}"),
    };
    let (Ok(mut rx), Ok(mut tx)) = (
        GuestQueue::new(&mem, GuestAddress(RX_AT), SIZE),
        GuestQueue::new(&mem, GuestAddress(TX_AT), SIZE),
    ) else {
        panic!("the queues do not fit");
    };
    let (Ok(r), Ok(t), Ok(interrupt)) = (rx.device_queue(), tx.device_queue(), Interrupt::new())
    else {
        panic!("the device's queues");
    };
    if let Err(e) = net.activate(mem.clone(), F_VERSION_1, vec![r, t], Arc::new(interrupt)) {
        panic!("activation: {e}");
    }
    let (mut rx_offered, mut tx_offered) = (0u16, 0u16);
    let mut rx_slot = 0u16;
    // Receive buffers the guest posted: (head, room).
    let mut posted: Vec<(u16, u32)> = Vec::new();
    let mut from_network = 0u64;
    let mut sent_ok = 0u64;
    let mut buf = vec![0u8; 70_000];
    for op in case.ops.iter().take(64) {
        match op {
            Op::Send {
                offload,
                len,
                split,
            } => {
                let mut frame = vec![0u8; HDR_LEN + usize::from(*len % 2048)];
                if let Some((flags, gso)) = offload {
                    frame[0] = *flags;
                    frame[1] = *gso;
                }
                for (i, b) in frame.iter_mut().enumerate().skip(HDR_LEN) {
                    *b = i as u8;
                }
                if mem.write_slice(&frame, GuestAddress(BUFS)).is_err() {
                    panic!("the frame does not fit");
                }
                let at = split.map(|s| usize::from(s) % frame.len()).unwrap_or(0);
                let bufs: Vec<(u64, u32, u16)> = if at == 0 {
                    vec![(BUFS, frame.len() as u32, 0)]
                } else {
                    vec![
                        (BUFS, at as u32, 0),
                        (BUFS + at as u64, (frame.len() - at) as u32, 0),
                    ]
                };
                if tx.set_chain(0, &bufs).and_then(|h| tx.offer(h)).is_err() {
                    panic!("the transmit ring");
                }
                tx_offered += 1;
                let ok_before = get(&net.metrics.tx_frames);
                if let Err(e) = net.process_queue(queues::TX) {
                    panic!("transmit: {e}");
                }
                if get(&net.metrics.tx_frames) > ok_before {
                    sent_ok += 1;
                    match host.recv(&mut buf) {
                        Ok(n) => assert_eq!(&buf[..n], &frame[..], "the tap got another frame"),
                        Err(e) => panic!("a frame counted as sent is not on the tap: {e}"),
                    }
                    assert!(frame[0] == 0 && frame[1] == 0, "an offload reached the tap");
                }
            }
            Op::RawTx(descs) => {
                for (i, d) in descs.iter().take(4).enumerate() {
                    let addr = BUFS + u64::from(d.addr) % (MEM + 0x100 - BUFS);
                    let more = if i + 1 < descs.len().min(4) { NEXT } else { 0 };
                    let flags = (u16::from(d.flags) & (W | 4)) | more;
                    if tx
                        .set_desc(
                            i as u16,
                            addr,
                            u32::from(d.len),
                            flags,
                            u16::from(d.next) % SIZE,
                        )
                        .is_err()
                    {
                        panic!("a descriptor");
                    }
                }
                if tx.offer(0).is_err() {
                    panic!("the transmit ring");
                }
                tx_offered += 1;
                let ok_before = get(&net.metrics.tx_frames);
                if let Err(e) = net.process_queue(queues::TX) {
                    panic!("transmit: {e}");
                }
                if get(&net.metrics.tx_frames) > ok_before {
                    sent_ok += 1;
                    match host.recv(&mut buf) {
                        Ok(n) => assert!(buf[0] == 0 && buf[1] == 0 && n >= HDR_LEN),
                        Err(e) => panic!("a frame counted as sent is not on the tap: {e}"),
                    }
                }
            }
            Op::Post {
                len,
                readable,
                past_memory,
            } => {
                // Receive buffers in slots of 8 KiB after the transmit area.
                let slot = rx_slot % SIZE;
                rx_slot = rx_slot.wrapping_add(1);
                let addr = if *past_memory {
                    MEM - 16
                } else {
                    0x2_0000 + u64::from(slot) * 0x2000
                };
                let room = u32::from(*len % 0x2000).max(1);
                let flags = if *readable { 0 } else { W };
                if rx.set_desc(slot, addr, room, flags, 0).is_err() || rx.offer(slot).is_err() {
                    panic!("the receive ring");
                }
                rx_offered += 1;
                posted.push((slot, room));
            }
            Op::Network(len) => {
                // A frame arrives and the event loop wakes the device.
                let frame = vec![0x5au8; usize::from(*len % 2048)];
                if host.send(&frame).is_ok() {
                    from_network += 1;
                }
                if let Err(e) = net.process_tap() {
                    panic!("the tap: {e}");
                }
            }
            Op::Notify(rx_queue) => {
                let q = if *rx_queue { queues::RX } else { queues::TX };
                if let Err(e) = net.process_queue(q) {
                    panic!("queue {q}: {e}");
                }
            }
            Op::Tap => {
                if let Err(e) = net.process_tap() {
                    panic!("the tap: {e}");
                }
            }
        }
        let (Ok(rx_used), Ok(tx_used)) = (rx.used_idx(), tx.used_idx()) else {
            panic!("the used rings");
        };
        assert!(rx_used <= rx_offered, "receive ring past what was offered");
        assert!(tx_used <= tx_offered, "transmit ring past what was offered");
        for i in 0..rx_used {
            let Ok((head, len)) = rx.used_elem(i) else {
                panic!("a used element");
            };
            if let Some((_, room)) = posted.iter().rev().find(|(h, _)| u32::from(*h) == head) {
                assert!(len <= *room, "{len} bytes into a buffer of {room}");
            }
        }
        let delivered = get(&net.metrics.rx_frames) + get(&net.metrics.rx_dropped);
        assert!(
            delivered <= from_network,
            "{delivered} frames given or dropped of {from_network} sent"
        );
        assert_eq!(get(&net.metrics.tx_frames), sent_ok);
    }
}
