//! The transport driven as Linux's virtio_mmio driver drives it.

use std::sync::{Arc, Mutex};

use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::microvm::vmm::builtin::virtio::chain::DESC_F_WRITE;
use crate::microvm::vmm::builtin::virtio::rng::{Pattern, Rng};
use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use crate::microvm::vmm::builtin::virtio::{INT_VRING, TYPE_RNG};

const QUEUE_AT: GuestAddress = GuestAddress(0x1000);

struct Fixture {
    mem: GuestMemoryMmap,
    rng: Arc<Mutex<Rng>>,
    interrupt: Arc<Interrupt>,
    t: MmioTransport,
}

fn fixture() -> Fixture {
    let mem = memory(1 << 20).unwrap();
    let rng = Arc::new(Mutex::new(Rng::new(Box::new(Pattern(0))).unwrap()));
    let interrupt = Arc::new(Interrupt::new().unwrap());
    let t = MmioTransport::new(mem.clone(), rng.clone(), interrupt.clone());
    Fixture {
        mem,
        rng,
        interrupt,
        t,
    }
}

fn r(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut data = [0u8; 4];
    t.read(offset, &mut data);
    u32::from_le_bytes(data)
}

fn w(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

/// The driver's probe and setup of queue 0 for `q`, up to DRIVER_OK.
fn bring_up(t: &mut MmioTransport, q: &GuestQueue) {
    w(t, reg::STATUS, status::ACKNOWLEDGE);
    w(t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(t, reg::DEVICE_FEATURES_SEL, 1);
    let high = r(t, reg::DEVICE_FEATURES);
    w(t, reg::DRIVER_FEATURES_SEL, 1);
    w(t, reg::DRIVER_FEATURES, high);
    w(t, reg::DRIVER_FEATURES_SEL, 0);
    w(t, reg::DRIVER_FEATURES, 0);
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    w(t, reg::STATUS, s);
    assert_eq!(r(t, reg::STATUS), s, "FEATURES_OK sticks");
    w(t, reg::QUEUE_SEL, 0);
    assert_eq!(r(t, reg::QUEUE_READY), 0);
    w(t, reg::QUEUE_NUM, u32::from(q.size));
    for (low, addr) in [
        (reg::QUEUE_DESC_LOW, q.desc.0),
        (reg::QUEUE_DRIVER_LOW, q.avail.0),
        (reg::QUEUE_DEVICE_LOW, q.used.0),
    ] {
        w(t, low, addr as u32);
        w(t, low + 4, (addr >> 32) as u32);
    }
    w(t, reg::QUEUE_READY, 1);
    w(t, reg::STATUS, s | status::DRIVER_OK);
}

#[test]
fn identification_registers() {
    let mut f = fixture();
    assert_eq!(r(&mut f.t, reg::MAGIC), 0x7472_6976);
    assert_eq!(r(&mut f.t, reg::VERSION), 2);
    assert_eq!(r(&mut f.t, reg::DEVICE_ID), TYPE_RNG);
    assert_eq!(r(&mut f.t, reg::VENDOR_ID), VENDOR);
    w(&mut f.t, reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(r(&mut f.t, reg::DEVICE_FEATURES), 1, "VIRTIO_F_VERSION_1");
    w(&mut f.t, reg::DEVICE_FEATURES_SEL, 7);
    assert_eq!(r(&mut f.t, reg::DEVICE_FEATURES), 0);
    w(&mut f.t, reg::QUEUE_SEL, 0);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM_MAX), 256);
    w(&mut f.t, reg::QUEUE_SEL, 1);
    assert_eq!(r(&mut f.t, reg::QUEUE_NUM_MAX), 0, "no second queue");
}

#[test]
fn a_driver_brings_the_device_up_and_a_notify_is_served() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let mut q = GuestQueue::new(&mem, QUEUE_AT, 16).unwrap();
    bring_up(&mut f.t, &q);
    assert_eq!(f.t.status() & status::DEVICE_NEEDS_RESET, 0);
    assert!(f.rng.lock().unwrap().is_activated());
    q.set_chain(0, &[(0x8000, 32, DESC_F_WRITE)]).unwrap();
    q.offer(0).unwrap();
    // No ioeventfd here: the transport passes the notify to the queue's
    // event, which the device's event handler would read.
    w(&mut f.t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(f.rng.lock().unwrap().queue_events()[0].read().unwrap(), 1);
    f.rng.lock().unwrap().process_queue().unwrap();
    assert_eq!(q.used_elem(0).unwrap(), (0, 32));
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), INT_VRING);
    w(&mut f.t, reg::INTERRUPT_ACK, INT_VRING);
    assert_eq!(r(&mut f.t, reg::INTERRUPT_STATUS), 0);
    // A notify of a queue the device does not have is ignored.
    let ignored = f.t.ignored;
    w(&mut f.t, reg::QUEUE_NOTIFY, 9);
    assert_eq!(f.t.ignored, ignored + 1);
    // Reset: the device stops, the registers clear.
    w(&mut f.t, reg::STATUS, 0);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    assert!(!f.rng.lock().unwrap().is_activated());
    assert_eq!(r(&mut f.t, reg::QUEUE_READY), 0);
    assert_eq!(f.interrupt.status(), 0);
}

#[test]
fn features_never_offered_keep_features_ok_off() {
    let mut f = fixture();
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut f.t, reg::DRIVER_FEATURES_SEL, 0);
    w(&mut f.t, reg::DRIVER_FEATURES, 1 << 28); // VIRTIO_RING_F_INDIRECT_DESC
    w(
        &mut f.t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    assert_eq!(r(&mut f.t, reg::STATUS) & status::FEATURES_OK, 0);
    // DRIVER_OK without FEATURES_OK does not activate the device.
    w(
        &mut f.t,
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::DRIVER_OK,
    );
    assert!(!f.rng.lock().unwrap().is_activated());
}

#[test]
fn driver_ok_after_failed_is_refused() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let _q = GuestQueue::new(&mem, QUEUE_AT, 16).unwrap();
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut f.t, reg::STATUS, s | status::FAILED);
    w(
        &mut f.t,
        reg::STATUS,
        s | status::FAILED | status::DRIVER_OK,
    );
    assert_eq!(r(&mut f.t, reg::STATUS), s | status::FAILED);
    assert!(!f.rng.lock().unwrap().is_activated());
}

#[test]
fn rings_outside_memory_ask_for_a_reset_instead_of_activating() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let q = GuestQueue::new(&mem, QUEUE_AT, 16).unwrap();
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    w(&mut f.t, reg::STATUS, s);
    w(&mut f.t, reg::QUEUE_NUM, 16);
    w(&mut f.t, reg::QUEUE_DESC_LOW, q.desc.0 as u32);
    w(&mut f.t, reg::QUEUE_DRIVER_LOW, q.avail.0 as u32);
    // The used ring at 4 GiB + 0x1000, far past the 1 MiB of memory.
    w(&mut f.t, reg::QUEUE_DEVICE_LOW, 0x1000);
    w(&mut f.t, reg::QUEUE_DEVICE_HIGH, 1);
    w(&mut f.t, reg::QUEUE_READY, 1);
    w(&mut f.t, reg::STATUS, s | status::DRIVER_OK);
    assert_ne!(r(&mut f.t, reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert!(!f.rng.lock().unwrap().is_activated());
}

#[test]
fn queue_registers_are_frozen_once_running() {
    let mut f = fixture();
    let mem = f.mem.clone();
    let q = GuestQueue::new(&mem, QUEUE_AT, 16).unwrap();
    bring_up(&mut f.t, &q);
    let ignored = f.t.ignored;
    w(&mut f.t, reg::QUEUE_DESC_LOW, 0xdead_0000);
    w(&mut f.t, reg::QUEUE_NUM, 2);
    assert_eq!(f.t.ignored, ignored + 2);
    // Clearing a status bit is not something a driver may do, nor
    // setting the device's own DEVICE_NEEDS_RESET.
    w(&mut f.t, reg::STATUS, status::ACKNOWLEDGE);
    assert_eq!(f.t.ignored, ignored + 3);
    let running = r(&mut f.t, reg::STATUS);
    w(&mut f.t, reg::STATUS, running | status::DEVICE_NEEDS_RESET);
    assert_eq!(r(&mut f.t, reg::STATUS), running);
    assert_eq!(f.t.ignored, ignored + 4);
    assert!(f.rng.lock().unwrap().is_activated());
}

#[test]
fn accesses_of_the_wrong_width_or_place_are_ignored() {
    let mut f = fixture();
    let mut two = [0xffu8; 2];
    f.t.read(reg::MAGIC, &mut two);
    assert_eq!(two, [0, 0]);
    let mut four = [0xffu8; 4];
    f.t.read(reg::MAGIC + 1, &mut four);
    assert_eq!(four, [0; 4]);
    f.t.write(reg::STATUS, &[1]);
    assert_eq!(r(&mut f.t, reg::STATUS), 0);
    assert_eq!(r(&mut f.t, 0x0c8), 0, "a hole in the register map");
    // Config space: virtio-rng has none; any width reads zeros.
    let mut eight = [0xffu8; 8];
    f.t.read(reg::CONFIG + 0x10, &mut eight);
    assert_eq!(eight, [0; 8]);
    assert!(f.t.ignored >= 4);
}
