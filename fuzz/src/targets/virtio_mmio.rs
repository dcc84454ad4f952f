//! The builtin VMM's virtio-mmio transport
//! ([`agentvm::microvm::vmm::builtin::virtio::mmio::MmioTransport`]): every
//! register access is the guest's. An input is read with `arbitrary` as a
//! sequence of reads and writes of any width at any offset of the 4 KiB
//! window (mostly the registers, with values from a driver's bring-up,
//! addresses inside and outside guest memory and raw numbers), with a
//! queue laid out in memory and notifications served in between.
//!
//! The transport must never panic and must keep the device consistent
//! with the status register: the device runs only while `DRIVER_OK` is
//! set with `FEATURES_OK` and without `DEVICE_NEEDS_RESET`; a status of 0
//! stops it; the queue registers read back what the driver may have set;
//! `MagicValue`, `Version` and `DeviceID` never change.

use std::sync::{Arc, Mutex};

use agentvm::microvm::vmm::builtin::bus::BusDevice;
use agentvm::microvm::vmm::builtin::virtio::chain::DESC_F_WRITE;
use agentvm::microvm::vmm::builtin::virtio::mmio::{reg, MmioTransport, MAGIC, VERSION};
use agentvm::microvm::vmm::builtin::virtio::rng::{Pattern, Rng};
use agentvm::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use agentvm::microvm::vmm::builtin::virtio::{status, Interrupt, VirtioDevice, TYPE_RNG};
use arbitrary::{Arbitrary, Unstructured};
use vm_memory::GuestAddress;

const REGISTERS: [u64; 22] = [
    reg::MAGIC,
    reg::VERSION,
    reg::DEVICE_ID,
    reg::DEVICE_FEATURES,
    reg::DEVICE_FEATURES_SEL,
    reg::DRIVER_FEATURES,
    reg::DRIVER_FEATURES_SEL,
    reg::QUEUE_SEL,
    reg::QUEUE_NUM_MAX,
    reg::QUEUE_NUM,
    reg::QUEUE_READY,
    reg::QUEUE_NOTIFY,
    reg::INTERRUPT_STATUS,
    reg::INTERRUPT_ACK,
    reg::STATUS,
    reg::QUEUE_DESC_LOW,
    reg::QUEUE_DESC_HIGH,
    reg::QUEUE_DRIVER_LOW,
    reg::QUEUE_DRIVER_HIGH,
    reg::QUEUE_DEVICE_LOW,
    reg::QUEUE_DEVICE_HIGH,
    reg::CONFIG,
];

#[derive(Arbitrary, Debug)]
enum Value {
    /// A status a driver writes on its way up (and 0, the reset).
    Status(u8),
    /// One of the queue's real addresses, low or high half.
    QueueAddress(u8),
    Small(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug)]
enum Access {
    Read {
        register: u8,
        width: u8,
        offset: u16,
    },
    Write {
        register: u8,
        width: u8,
        offset: u16,
        value: Value,
    },
    /// The device's event loop serves the queue.
    Serve,
}

#[derive(Arbitrary, Debug)]
struct Input {
    bring_up: bool,
    accesses: Vec<Access>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

fn width(w: u8) -> usize {
    match w % 8 {
        0 => 1,
        1 => 2,
        2 => 8,
        _ => 4,
    }
}

pub fn run(data: &[u8]) {
    let Ok(Input { bring_up, accesses }) = Input::arbitrary_take_rest(Unstructured::new(data))
    else {
        return;
    };
    let Ok(mem) = memory(0x1_0000) else {
        panic!("guest memory");
    };
    let Ok(mut q) = GuestQueue::new(&mem, GuestAddress(0x1000), 16) else {
        panic!("the queue");
    };
    for i in 0..16u16 {
        if q.set_chain(i, &[(0x8000 + u64::from(i) * 64, 64, DESC_F_WRITE)])
            .is_err()
            || q.offer(i).is_err()
        {
            panic!("the chains");
        }
    }
    let addresses = [q.desc.0, q.avail.0, q.used.0];
    let Ok(rng) = Rng::new(Box::new(Pattern(0))) else {
        panic!("the device");
    };
    let rng = Arc::new(Mutex::new(rng));
    let Ok(interrupt) = Interrupt::new() else {
        panic!("an eventfd");
    };
    let mut t = MmioTransport::new(mem.clone(), rng.clone(), Arc::new(interrupt));
    if bring_up {
        // A driver's bring-up first, so that the accesses that follow meet
        // a running device as often as a fresh one.
        let w = |t: &mut MmioTransport, at: u64, v: u32| t.write(at, &v.to_le_bytes());
        let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        w(&mut t, reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 1);
        w(&mut t, reg::STATUS, ok);
        w(&mut t, reg::QUEUE_NUM, 16);
        w(&mut t, reg::QUEUE_DESC_LOW, q.desc.0 as u32);
        w(&mut t, reg::QUEUE_DRIVER_LOW, q.avail.0 as u32);
        w(&mut t, reg::QUEUE_DEVICE_LOW, q.used.0 as u32);
        w(&mut t, reg::QUEUE_READY, 1);
        w(&mut t, reg::STATUS, ok | status::DRIVER_OK);
        assert!(
            rng.lock().unwrap_or_else(|e| e.into_inner()).is_activated(),
            "a driver's bring-up did not activate the device"
        );
    }
    let lock = |r: &Arc<Mutex<Rng>>| r.lock().unwrap_or_else(|e| e.into_inner()).is_activated();
    for a in accesses.iter().take(512) {
        match a {
            Access::Read {
                register,
                width: w,
                offset,
            } => {
                let at = pick(*register, *offset);
                let mut buf = vec![0u8; width(*w)];
                t.read(at, &mut buf);
            }
            Access::Write {
                register,
                width: w,
                offset,
                value,
            } => {
                let at = pick(*register, *offset);
                let v = match value {
                    Value::Status(s) => [0, 1, 3, 0xb, 0xf, 0x8b, 0x4f][usize::from(*s) % 7],
                    Value::QueueAddress(i) => {
                        let a = addresses[usize::from(*i) % 3];
                        if i & 0x80 == 0 {
                            a as u32
                        } else {
                            (a >> 32) as u32
                        }
                    }
                    Value::Small(s) => u32::from(*s),
                    Value::Raw(r) => *r,
                };
                let bytes = v.to_le_bytes();
                let n = width(*w);
                let mut buf = vec![0u8; n];
                let k = n.min(4);
                buf[..k].copy_from_slice(&bytes[..k]);
                t.write(at, &buf);
            }
            Access::Serve => {
                if let Err(e) = rng
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .process_queue()
                {
                    panic!("serving the queue: {e}");
                }
            }
        }
        let s = t.status();
        let running = s & status::DRIVER_OK != 0
            && s & status::FEATURES_OK != 0
            && s & status::DEVICE_NEEDS_RESET == 0;
        assert_eq!(lock(&rng), running, "device activated with status {s:#x}");
        let mut word = [0u8; 4];
        for (r, want) in [
            (reg::MAGIC, MAGIC),
            (reg::VERSION, VERSION),
            (reg::DEVICE_ID, TYPE_RNG),
        ] {
            t.read(r, &mut word);
            assert_eq!(u32::from_le_bytes(word), want);
        }
    }
    let _ = rng.lock().map(|r| r.queue_events()[0].read());
}

/// A register (mostly) or any offset in the window.
fn pick(register: u8, offset: u16) -> u64 {
    match REGISTERS.get(usize::from(register % 32)) {
        Some(r) => *r,
        None => u64::from(offset) % 0x1000,
    }
}
