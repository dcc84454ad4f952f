//! The builtin VMM's descriptor-chain validator
//! ([`agentvm::microvm::vmm::builtin::virtio::chain::ValidChain`]) and the
//! virtio-rng device that serves chains through it: every descriptor, ring
//! entry and index is the guest's. An input is read with `arbitrary` as a
//! queue (size 1 to 256), its descriptor table (addresses inside the
//! buffers, at the end of memory, past it or near `u64::MAX`; lengths
//! small, huge or zero; any flags, `next` inside the table or not) and the
//! heads the guest made available (inside the queue or not).
//!
//! A chain the validator accepts must keep its promises: at most `size`
//! descriptors, no empty buffer, every buffer inside guest memory,
//! readable before writable and in the direction asked, lengths adding up
//! to what it reports. The device must complete every chain whose head is
//! inside the queue, with at most `MAX_REQUEST` bytes and no more than the
//! chain holds, length 0 for a refused one; count each chain once; and
//! write nothing outside the writable buffers of chains it accepted and the
//! used ring.

use std::sync::Arc;

use agentvm::microvm::vmm::builtin::virtio::chain::{Direction, ValidChain};
use agentvm::microvm::vmm::builtin::virtio::rng::{Pattern, Rng, MAX_REQUEST};
use agentvm::microvm::vmm::builtin::virtio::test_utils::{in_memory, memory, GuestQueue};
use agentvm::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice};
use arbitrary::{Arbitrary, Unstructured};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest memory: the queue in the first 16 KiB, buffers after it.
const MEM: u64 = 0x1_0000;
const QUEUE_END: u64 = 0x4000;

#[derive(Arbitrary, Debug)]
struct Desc {
    addr_kind: u8,
    addr: u64,
    len_kind: u8,
    len: u32,
    flags: u8,
    next_raw: bool,
    next: u16,
}

#[derive(Arbitrary, Debug)]
struct Case {
    size_log2: u8,
    descs: Vec<Desc>,
    heads: Vec<(bool, u16)>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

fn addr(d: &Desc) -> u64 {
    match d.addr_kind % 5 {
        0 | 1 => QUEUE_END + d.addr % (MEM - QUEUE_END),
        2 => MEM - (d.addr % 64),
        3 => u64::MAX - (d.addr % 64),
        _ => d.addr,
    }
}

fn len(d: &Desc) -> u32 {
    match d.len_kind % 5 {
        0 | 1 => d.len % 256,
        2 => d.len % 0x2000,
        3 => u32::MAX - (d.len % 64),
        _ => d.len,
    }
}

fn bytes(mem: &GuestMemoryMmap) -> Vec<u8> {
    let mut v = vec![0u8; MEM as usize];
    if let Err(e) = mem.read_slice(&mut v, GuestAddress(0)) {
        panic!("reading guest memory: {e}");
    }
    v
}

/// Checks the promises of an accepted chain.
fn check_chain(c: &ValidChain, size: u16, direction: Direction, mem: &GuestMemoryMmap) {
    let segments = c.readable().len() + c.writable().len();
    assert!(
        segments >= 1 && segments <= usize::from(size),
        "{segments} descriptors"
    );
    let mut total = 0u64;
    for s in c.readable().iter().chain(c.writable()) {
        assert!(s.len > 0, "an empty buffer");
        assert!(
            in_memory(mem, s.addr.0, u64::from(s.len)),
            "{s:?} outside memory"
        );
        total += u64::from(s.len);
    }
    assert!(total <= u64::from(u32::MAX), "{total} bytes");
    let r: u64 = c.readable().iter().map(|s| u64::from(s.len)).sum();
    assert_eq!(r, u64::from(c.readable_len()));
    assert_eq!(total - r, u64::from(c.writable_len()));
    match direction {
        Direction::DeviceWrites => assert!(c.readable().is_empty()),
        Direction::DeviceReads => assert!(c.writable().is_empty()),
        Direction::Both => assert!(!c.readable().is_empty() && !c.writable().is_empty()),
        Direction::ReadsMaybeWrites => assert!(!c.readable().is_empty()),
    }
}

pub fn run(data: &[u8]) {
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let size: u16 = 1 << (case.size_log2 % 9);
    let mem = match memory(MEM as usize) {
        Ok(m) => m,
        Err(e) => panic!("guest memory: {e}"),
    };
    let Ok(mut q) = GuestQueue::new(&mem, GuestAddress(0), size) else {
        panic!("a queue of {size} does not fit");
    };
    for (i, d) in case.descs.iter().take(usize::from(size)).enumerate() {
        let next = if d.next_raw { d.next } else { d.next % size };
        if q.set_desc(i as u16, addr(d), len(d), u16::from(d.flags & 7), next)
            .is_err()
        {
            panic!("descriptor {i} cannot be written");
        }
    }
    let heads: Vec<u16> = case
        .heads
        .iter()
        .take(usize::from(size))
        .map(|&(raw, h)| if raw { h } else { h % size })
        .collect();
    for &h in &heads {
        if q.offer(h).is_err() {
            panic!("the avail ring cannot be written");
        }
    }

    // The validator alone, in every direction.
    let mut expected = Vec::new();
    for &h in &heads {
        for d in [
            Direction::DeviceReads,
            Direction::DeviceWrites,
            Direction::Both,
            Direction::ReadsMaybeWrites,
        ] {
            let parsed = ValidChain::parse(&mem, q.desc, size, h, d);
            if let Ok(c) = &parsed {
                check_chain(c, size, d, &mem);
            }
            if d == Direction::DeviceWrites {
                expected.push(parsed.ok());
            }
        }
    }
    // A buffer over the rings or the table changes what later chains say:
    // then only "no panic" is checked.
    let strict = expected
        .iter()
        .flatten()
        .all(|c| c.writable().iter().all(|s| s.addr.0 >= QUEUE_END));

    // The device.
    let before = bytes(&mem);
    let Ok(mut rng) = Rng::new(Box::new(Pattern(1))) else {
        panic!("the device");
    };
    let Ok(queue) = q.device_queue() else {
        panic!("the device's queue");
    };
    let Ok(interrupt) = Interrupt::new() else {
        panic!("an eventfd");
    };
    if let Err(e) = rng.activate(mem.clone(), 0, vec![queue], Arc::new(interrupt)) {
        panic!("activation: {e}");
    }
    if let Err(e) = rng.process_queue() {
        panic!("serving the queue: {e}");
    }
    let served = rng.metrics.chains() + rng.metrics.bad_chains();
    assert_eq!(served, heads.len() as u64, "each chain counted once");
    if !strict {
        return;
    }
    let in_queue: Vec<&Option<ValidChain>> = heads
        .iter()
        .zip(&expected)
        .filter(|(h, _)| **h < size)
        .map(|(_, e)| e)
        .collect();
    let Ok(used) = q.used_idx() else {
        panic!("the used ring");
    };
    assert_eq!(
        usize::from(used),
        in_queue.len(),
        "heads inside the queue all completed"
    );
    for (i, want) in in_queue.iter().enumerate() {
        let Ok((_, got)) = q.used_elem(i as u16) else {
            panic!("used element {i}");
        };
        match want {
            Some(c) => assert!(
                got <= c.writable_len().min(MAX_REQUEST),
                "{got} bytes written"
            ),
            None => assert_eq!(got, 0, "a refused chain completed with {got} bytes"),
        }
    }
    let after = bytes(&mem);
    let used_ring = q.used.0..q.used.0 + 6 + 8 * u64::from(size);
    for (at, (b, a)) in before.iter().zip(&after).enumerate() {
        if b == a {
            continue;
        }
        let at = at as u64;
        let allowed = used_ring.contains(&at)
            || expected.iter().flatten().any(|c| {
                c.writable()
                    .iter()
                    .any(|s| (s.addr.0..s.addr.0 + u64::from(s.len)).contains(&at))
            });
        assert!(allowed, "byte {at:#x} written outside the chains' buffers");
    }
}
