//! The builtin VMM's virtio-console device
//! ([`agentvm::microvm::vmm::builtin::virtio::console::Console`]) as a
//! hostile guest and a host socket drive it: port 1's data path both ways,
//! the control messages that open and close it, and the flow control
//! between them.
//!
//! An input is read with `arbitrary` as whether the guest first does the
//! handshake as Linux's driver does (control buffers, `DEVICE_READY`,
//! `PORT_READY`, `PORT_OPEN`), then up to 64 operations: descriptors
//! written on any of the six queues (queue size 16; addresses in the
//! buffers, at the end of memory or anywhere; lengths small, a page or
//! anything; any flags and `next`) and a head offered; a well-formed
//! transmit chain or receive buffer on port 1, notified; a control message
//! (any event, port and value near the edges, or raw bytes); a queue
//! notification; the host writing, reading, or hanging up; a socket event.
//!
//! Nothing may panic or run unbounded; each queue's used ring may not move
//! past what the guest offered; every byte the device says it gave the
//! host (`bytes_to_host`) reaches the host side, in one stream: what the
//! host reads at the end equals it while the host is connected, and never
//! exceeds it; the control answers are well-formed.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use agentvm::microvm::vmm::builtin::virtio::console::control::event;
use agentvm::microvm::vmm::builtin::virtio::console::{queues, Console, F_MULTIPORT};
use agentvm::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use agentvm::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1};
use arbitrary::{Arbitrary, Unstructured};
use vm_memory::{Bytes, GuestAddress};

const MEM: u64 = 0x4_0000;
const SIZE: u16 = 16;
/// Queue `i` at `i * 0x400`; buffers from `BUFS`.
const BUFS: u64 = 0x2000;
/// Where control messages are written (64 bytes per descriptor index).
const MSGS: u64 = 0x1800;
const W: u16 = 2;
const NEXT: u16 = 1;

#[derive(Arbitrary, Debug)]
struct Desc {
    index: u8,
    addr_kind: u8,
    addr: u32,
    len_kind: u8,
    len: u32,
    flags: u8,
    next: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Chain {
        queue: u8,
        descs: Vec<Desc>,
        head: u8,
    },
    Message {
        index: u8,
        event: u8,
        port: u8,
        value: u8,
        raw: Option<Vec<u8>>,
    },
    /// A well-formed transmit chain on port 1 (one buffer), notified.
    Send {
        index: u8,
        len: u16,
    },
    /// A well-formed receive buffer on port 1, notified.
    Post {
        index: u8,
        len: u16,
    },
    Notify(u8),
    HostWrite(u16),
    HostRead(u16),
    HostClose,
    Socket,
}

#[derive(Arbitrary, Debug)]
struct Case {
    handshake: bool,
    ops: Vec<Op>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

fn addr(d: &Desc) -> u64 {
    match d.addr_kind % 4 {
        0 | 1 => BUFS + u64::from(d.addr) % (MEM - BUFS),
        2 => MEM - u64::from(d.addr % 64),
        // Never over the rings: a buffer there would change what the
        // checks read back.
        _ => BUFS.saturating_add(u64::from(d.addr) << (d.addr_kind % 32)),
    }
}

fn len(d: &Desc) -> u32 {
    match d.len_kind % 4 {
        0 | 1 => d.len % 256,
        2 => d.len % 0x2000,
        _ => d.len,
    }
}

fn ctl(id: u32, ev: u16, value: u16) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend_from_slice(&ev.to_le_bytes());
    v.extend_from_slice(&value.to_le_bytes());
    v
}

struct Guest<'a> {
    qs: Vec<GuestQueue<'a>>,
    offered: Vec<u64>,
}

impl Guest<'_> {
    fn offer(&mut self, q: usize, head: u16) {
        if self.qs[q].offer(head).is_err() {
            panic!("the avail ring cannot be written");
        }
        self.offered[q] += 1;
    }

    fn desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        if self.qs[q].set_desc(i, addr, len, flags, next).is_err() {
            panic!("descriptor {i} cannot be written");
        }
    }
}

/// The guest sends `msg` on the control queue from descriptor `index`.
fn message(g: &mut Guest, mem: &vm_memory::GuestMemoryMmap, index: u16, msg: &[u8]) {
    let index = index % SIZE;
    let at = MSGS + 64 * u64::from(index % 8);
    let msg = &msg[..msg.len().min(64)];
    if mem.write_slice(msg, GuestAddress(at)).is_err() {
        panic!("message buffer");
    }
    g.desc(queues::CONTROL_TX, index, at, msg.len() as u32, 0, 0);
    g.offer(queues::CONTROL_TX, index);
}

fn process(c: &mut Console, q: usize) {
    if let Err(e) = c.process_queue(q) {
        panic!("serving queue {q}: {e}");
    }
}

fn socket(c: &mut Console) {
    if let Err(e) = c.process_socket() {
        panic!("serving the socket: {e}");
    }
}

/// Reads what the host side can, at most `max` bytes.
fn host_read(peer: &mut UnixStream, max: usize, total: &mut u64) -> usize {
    let mut buf = vec![0u8; max.max(1)];
    match peer.read(&mut buf) {
        Ok(n) => {
            *total += n as u64;
            n
        }
        Err(_) => 0,
    }
}

pub fn run(data: &[u8]) {
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let mem = match memory(MEM as usize) {
        Ok(m) => m,
        Err(e) => panic!("guest memory: {e}"),
    };
    let qs = (0..queues::COUNT)
        .map(|i| GuestQueue::new(&mem, GuestAddress(0x400 * i as u64), SIZE))
        .collect::<Result<Vec<_>, _>>();
    let Ok(qs) = qs else {
        panic!("the queues do not fit");
    };
    let mut g = Guest {
        qs,
        offered: vec![0; queues::COUNT],
    };
    let (ours, mut peer) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => panic!("socketpair: {e}"),
    };
    if let Err(e) = peer.set_nonblocking(true) {
        panic!("non-blocking: {e}");
    }
    let mut c = match Console::new(ours) {
        Ok(c) => c,
        Err(e) => panic!("the device: {e}"),
    };
    let device_queues = g.qs.iter().map(|q| q.device_queue()).collect();
    let Ok(device_queues) = device_queues else {
        panic!("the device's queues");
    };
    let interrupt = match Interrupt::new() {
        Ok(i) => Arc::new(i),
        Err(e) => panic!("an eventfd: {e}"),
    };
    if let Err(e) = c.activate(
        mem.clone(),
        F_VERSION_1 | F_MULTIPORT,
        device_queues,
        interrupt,
    ) {
        panic!("activation: {e}");
    }

    if case.handshake {
        for i in 0..8u16 {
            g.desc(
                queues::CONTROL_RX,
                i,
                BUFS + 0x100 * u64::from(i),
                0x100,
                W,
                0,
            );
            g.offer(queues::CONTROL_RX, i);
            g.desc(
                queues::PORT1_RX,
                i,
                BUFS + 0x1000 * u64::from(i + 1),
                0x1000,
                W,
                0,
            );
            g.offer(queues::PORT1_RX, i);
        }
        message(&mut g, &mem, 0, &ctl(u32::MAX, event::DEVICE_READY, 1));
        process(&mut c, queues::CONTROL_TX);
        message(&mut g, &mem, 1, &ctl(1, event::PORT_READY, 1));
        process(&mut c, queues::CONTROL_TX);
        message(&mut g, &mem, 2, &ctl(1, event::PORT_OPEN, 1));
        process(&mut c, queues::CONTROL_TX);
        assert!(c.guest_connected(), "the handshake opens the port");
    }

    let mut read: u64 = 0;
    let mut closed = false;
    for op in case.ops.into_iter().take(64) {
        match op {
            Op::Chain { queue, descs, head } => {
                let q = usize::from(queue) % queues::COUNT;
                for d in descs.iter().take(usize::from(SIZE)) {
                    let flags = u16::from(d.flags) & (W | NEXT | 4);
                    g.desc(
                        q,
                        u16::from(d.index) % SIZE,
                        addr(d),
                        len(d),
                        flags,
                        u16::from(d.next) % (SIZE + 2),
                    );
                }
                g.offer(q, u16::from(head) % SIZE);
            }
            Op::Message {
                index,
                event: ev,
                port,
                value,
                raw,
            } => {
                let msg = raw.unwrap_or_else(|| {
                    let id = if port >= 250 {
                        u32::MAX - u32::from(port - 250)
                    } else {
                        u32::from(port % 4)
                    };
                    ctl(id, u16::from(ev % 10), u16::from(value % 3))
                });
                message(&mut g, &mem, u16::from(index), &msg);
            }
            Op::Send { index, len } => {
                let i = u16::from(index) % SIZE;
                let at = BUFS + 0x1_0000 + 0x1000 * u64::from(i);
                let len = 1 + u32::from(len);
                let bytes: Vec<u8> = (0..len).map(|b| (b % 251) as u8).collect();
                if mem.write_slice(&bytes, GuestAddress(at)).is_err() {
                    panic!("a transmit buffer");
                }
                g.desc(queues::PORT1_TX, i, at, len, 0, 0);
                g.offer(queues::PORT1_TX, i);
                process(&mut c, queues::PORT1_TX);
            }
            Op::Post { index, len } => {
                let i = u16::from(index) % SIZE;
                let at = BUFS + 0x1000 * u64::from(i);
                g.desc(queues::PORT1_RX, i, at, 1 + u32::from(len) % 0x1000, W, 0);
                g.offer(queues::PORT1_RX, i);
                process(&mut c, queues::PORT1_RX);
            }
            Op::Notify(q) => process(&mut c, usize::from(q) % queues::COUNT),
            Op::HostWrite(n) => {
                if !closed {
                    let bytes: Vec<u8> = (0..usize::from(n)).map(|i| i as u8).collect();
                    match peer.write(&bytes) {
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => panic!("the host's write: {e}"),
                    }
                }
            }
            Op::HostRead(n) => {
                if !closed {
                    host_read(&mut peer, usize::from(n), &mut read);
                }
            }
            Op::HostClose => {
                closed = true;
                let _ = peer.shutdown(std::net::Shutdown::Both);
            }
            Op::Socket => socket(&mut c),
        }
        for (q, gq) in g.qs.iter().enumerate() {
            let Ok(used) = gq.used_idx() else {
                panic!("the used ring");
            };
            assert!(
                u64::from(used) <= g.offered[q],
                "queue {q}: {used} used of {} offered",
                g.offered[q]
            );
        }
    }
    // The host reads everything; the device goes on until it has nothing
    // more to send.
    if !closed {
        for _ in 0..64 {
            host_read(&mut peer, 1 << 16, &mut read);
            socket(&mut c);
        }
        while host_read(&mut peer, 1 << 16, &mut read) > 0 {}
        assert_eq!(
            read,
            c.metrics.bytes_to_host(),
            "what the device sent is what the host got"
        );
    } else {
        assert!(read <= c.metrics.bytes_to_host());
    }
}
