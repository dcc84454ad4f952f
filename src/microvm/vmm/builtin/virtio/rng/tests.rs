//! virtio-rng driven from the guest's side: a driver's queue laid out in
//! guest memory ([`GuestQueue`]), normal, chained and hostile chains.

use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{Pattern, Rng, MAX_REQUEST, QUEUE_SIZE};
use crate::microvm::vmm::builtin::virtio::chain::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use crate::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, INT_VRING};

const MEM: usize = 4 << 20;
const QUEUE_AT: GuestAddress = GuestAddress(0x1000);
const BUF: u64 = 0x10_0000;
const W: u16 = DESC_F_WRITE;

struct Fixture {
    mem: GuestMemoryMmap,
    rng: Rng,
    interrupt: Arc<Interrupt>,
}

fn fixture() -> Fixture {
    let mem = memory(MEM).unwrap();
    let rng = Rng::new(Box::new(Pattern(7))).unwrap();
    Fixture {
        mem,
        rng,
        interrupt: Arc::new(Interrupt::new().unwrap()),
    }
}

impl Fixture {
    fn queue(&self) -> GuestQueue<'_> {
        GuestQueue::new(&self.mem, QUEUE_AT, QUEUE_SIZE).unwrap()
    }

    fn activate(&mut self, q: &GuestQueue) {
        self.rng
            .activate(
                self.mem.clone(),
                0,
                vec![q.device_queue().unwrap()],
                self.interrupt.clone(),
            )
            .unwrap();
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

/// What `Pattern(7)` writes first, `len` bytes of it.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| 7u8.wrapping_add(i as u8)).collect()
}

#[test]
fn one_buffer_is_filled_and_returned_with_its_length() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    let head = q.set_chain(0, &[(BUF, 64, W)]).unwrap();
    q.offer(head).unwrap();
    assert!(f.rng.process_queue().unwrap());
    assert_eq!(q.used_idx().unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, 64));
    assert_eq!(f.bytes(BUF, 64), pattern(64));
    // Nothing past the buffer was touched.
    assert_eq!(f.bytes(BUF + 64, 16), vec![0; 16]);
    assert_eq!(f.interrupt.status(), INT_VRING);
    assert_eq!(f.interrupt.eventfd().read().unwrap(), 1);
    assert_eq!((f.rng.metrics.chains(), f.rng.metrics.bad_chains()), (1, 0));
    assert_eq!(f.rng.metrics.bytes_written(), 64);
    // An empty ring: nothing done, no interrupt.
    assert!(!f.rng.process_queue().unwrap());
}

#[test]
fn a_chain_is_filled_across_its_buffers_in_order() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    // Out of order in memory, and a one-byte buffer in the middle.
    let head = q
        .set_chain(
            5,
            &[(BUF + 0x1000, 16, W), (BUF, 1, W), (BUF + 0x2000, 100, W)],
        )
        .unwrap();
    q.offer(head).unwrap();
    f.rng.process_queue().unwrap();
    assert_eq!(q.used_elem(0).unwrap(), (5, 117));
    let all = pattern(117);
    assert_eq!(f.bytes(BUF + 0x1000, 16), all[..16]);
    assert_eq!(f.bytes(BUF, 1), all[16..17]);
    assert_eq!(f.bytes(BUF + 0x2000, 100), all[17..]);
}

#[test]
fn a_huge_request_gets_at_most_max_request_bytes() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    let head = q.set_chain(0, &[(BUF, 2 << 20, W)]).unwrap();
    q.offer(head).unwrap();
    f.rng.process_queue().unwrap();
    assert_eq!(q.used_elem(0).unwrap(), (0, MAX_REQUEST));
    assert_eq!(f.bytes(BUF + u64::from(MAX_REQUEST), 8), vec![0; 8]);
}

/// Hostile chains: each is completed with length 0 and counted, writes
/// nothing, and the device goes on serving the next good chain.
#[test]
fn hostile_chains_are_completed_empty_and_counted() {
    let end = MEM as u64;
    // (what, descriptors as (index, addr, len, flags, next)).
    type Desc = (u16, u64, u32, u16, u16);
    let cases: Vec<(&str, Vec<Desc>)> = vec![
        (
            "a loop of two",
            vec![
                (0, BUF, 8, W | DESC_F_NEXT, 1),
                (1, BUF + 8, 8, W | DESC_F_NEXT, 0),
            ],
        ),
        (
            "a descriptor pointing at itself",
            vec![(0, BUF, 8, W | DESC_F_NEXT, 0)],
        ),
        (
            "next outside the table",
            vec![(0, BUF, 8, W | DESC_F_NEXT, QUEUE_SIZE + 3)],
        ),
        (
            "a buffer past the end of memory",
            vec![(0, end - 8, 16, W, 0)],
        ),
        (
            "a buffer wholly outside memory",
            vec![(0, end + 0x1000, 16, W, 0)],
        ),
        (
            "an address that wraps around",
            vec![(0, u64::MAX - 4, 16, W, 0)],
        ),
        ("a buffer the device would read", vec![(0, BUF, 16, 0, 0)]),
        (
            "readable after writable",
            vec![(0, BUF, 8, W | DESC_F_NEXT, 1), (1, BUF + 8, 8, 0, 0)],
        ),
        ("a zero-length buffer", vec![(0, BUF, 0, W, 0)]),
        (
            "a zero-length buffer after a good one",
            vec![(0, BUF, 8, W | DESC_F_NEXT, 1), (1, BUF + 8, 0, W, 0)],
        ),
        (
            "an indirect table (not offered)",
            vec![(0, BUF, 32, DESC_F_INDIRECT, 0)],
        ),
        ("u32::MAX bytes", vec![(0, 0, u32::MAX, W, 0)]),
    ];
    for (what, descs) in cases {
        let mut f = fixture();
        let mem = f.mem.clone();
        let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
        f.activate(&q);
        for &(i, addr, len, flags, next) in &descs {
            q.set_desc(i, addr, len, flags, next).unwrap();
        }
        q.offer(0).unwrap();
        let good = q.set_chain(10, &[(BUF + 0x1000, 32, W)]).unwrap();
        q.offer(good).unwrap();
        f.rng.process_queue().unwrap();
        assert_eq!(q.used_idx().unwrap(), 2, "{what}");
        assert_eq!(
            q.used_elem(0).unwrap(),
            (0, 0),
            "{what}: completed with length 0"
        );
        assert_eq!(f.bytes(BUF, 16), vec![0; 16], "{what}: nothing written");
        assert_eq!(
            q.used_elem(1).unwrap(),
            (10, 32),
            "{what}: the next chain is served"
        );
        assert_eq!(f.bytes(BUF + 0x1000, 32), pattern(32), "{what}");
        assert_eq!(f.rng.metrics.bad_chains(), 1, "{what}");
        assert_eq!(f.rng.metrics.chains(), 1, "{what}");
    }
}

#[test]
fn a_head_outside_the_queue_is_counted_and_not_returned() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    q.offer(QUEUE_SIZE + 44).unwrap();
    f.rng.process_queue().unwrap();
    assert_eq!(q.used_idx().unwrap(), 0);
    assert_eq!(f.rng.metrics.bad_chains(), 1);
}

#[test]
fn an_avail_index_far_ahead_is_not_served() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    // More chains "available" than the queue holds.
    q.set_avail_idx(QUEUE_SIZE + 1).unwrap();
    assert!(!f.rng.process_queue().unwrap());
    assert_eq!(q.used_idx().unwrap(), 0);
}

#[test]
fn a_full_ring_is_served_in_one_pass() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    for i in 0..QUEUE_SIZE {
        q.set_chain(i, &[(BUF + u64::from(i) * 16, 16, W)]).unwrap();
        q.offer(i).unwrap();
    }
    f.rng.process_queue().unwrap();
    assert_eq!(q.used_idx().unwrap(), QUEUE_SIZE);
    assert_eq!(f.rng.metrics.chains(), u64::from(QUEUE_SIZE));
}

#[test]
fn a_reset_device_serves_nothing() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    f.rng.reset();
    assert!(!f.rng.is_activated());
    q.set_chain(0, &[(BUF, 8, W)]).unwrap();
    q.offer(0).unwrap();
    assert!(!f.rng.process_queue().unwrap());
    assert_eq!(q.used_idx().unwrap(), 0);
}

#[test]
fn activation_wants_exactly_one_queue() {
    let mut f = fixture();
    let q = f.queue();
    let two = vec![q.device_queue().unwrap(), q.device_queue().unwrap()];
    assert!(f
        .rng
        .activate(f.mem.clone(), 0, two, f.interrupt.clone())
        .is_err());
    assert!(f
        .rng
        .activate(f.mem.clone(), 0, Vec::new(), f.interrupt.clone())
        .is_err());
    assert!(!f.rng.is_activated());
}

#[test]
fn the_event_loop_serves_a_notified_queue() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, QUEUE_SIZE).unwrap();
    f.activate(&q);
    q.set_chain(0, &[(BUF, 8, W)]).unwrap();
    q.offer(0).unwrap();
    let Fixture { rng, .. } = f;
    let rng = Arc::new(Mutex::new(rng));
    let mut events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
        EventManager::new().unwrap();
    events.add_subscriber(rng.clone());
    // The guest's notification, as KVM's ioeventfd would write it.
    rng.lock().unwrap().queue_events()[0].write(1).unwrap();
    assert_eq!(events.run_with_timeout(1000).unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, 8));
}
