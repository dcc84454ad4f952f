//! virtio devices on the virtio-mmio transport: the transport
//! ([`mmio`]), the chain validation every device uses ([`chain`]), queue
//! handling ([`queue`]), and one folder per device.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub mod chain;
pub mod console;
pub mod fs;
pub mod mmio;
pub mod net;
pub mod queue;
pub mod rng;
pub mod test_utils;

/// `VIRTIO_F_VERSION_1`: every device is a virtio 1.x device.
pub const F_VERSION_1: u64 = 1 << 32;
/// Device type of virtio-rng (virtio 1.x, 5).
pub const TYPE_RNG: u32 = 4;

/// Bits of the device status register (virtio 1.x, 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
    /// The bits a driver may set.
    pub const DRIVER_BITS: u32 = ACKNOWLEDGE | DRIVER | DRIVER_OK | FEATURES_OK | FAILED;
}

/// `VIRTIO_MMIO_INT_VRING`: a used ring was updated.
pub const INT_VRING: u32 = 1;
/// `VIRTIO_MMIO_INT_CONFIG`: the configuration changed.
pub const INT_CONFIG: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("queue {0} is not usable (not ready, or its rings are outside guest memory)")]
    BadQueue(usize),
    #[error("the device expects {expected} queues, the driver set up {got}")]
    QueueCount { expected: usize, got: usize },
    #[error("the driver did not accept {0}, which the device needs")]
    MissingFeature(&'static str),
    #[error("cannot set up the device's events: {0}")]
    Events(std::io::Error),
}

/// The device's line to the guest: the interrupt status register and the
/// eventfd that KVM turns into the device's interrupt (an irqfd).
#[derive(Debug)]
pub struct Interrupt {
    status: AtomicU32,
    evt: EventFd,
}

impl Interrupt {
    pub fn new() -> std::io::Result<Interrupt> {
        Ok(Interrupt {
            status: AtomicU32::new(0),
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// Sets `bits` in the status register and raises the interrupt.
    pub fn trigger(&self, bits: u32) -> std::io::Result<()> {
        self.status.fetch_or(bits, Ordering::SeqCst);
        self.evt.write(1)
    }

    /// What the guest reads from `InterruptStatus`.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// The guest's `InterruptACK`.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// The eventfd to register with KVM as the device's irqfd.
    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

/// What a device gives its transport.
pub trait VirtioDevice: Send {
    /// The virtio device type (virtio 1.x, 5).
    fn device_type(&self) -> u32;
    /// Feature bits offered, `VIRTIO_F_VERSION_1` included.
    fn features(&self) -> u64;
    /// Largest size of each queue; their number is the device's.
    fn queue_max_sizes(&self) -> &[u16];
    /// One eventfd per queue, written when the guest notifies it (by KVM
    /// itself when registered as an ioeventfd, else by the transport).
    fn queue_events(&self) -> &[EventFd];
    /// Reads the device-specific configuration space; what is outside it
    /// reads as zeros.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the configuration space; ignored where read-only.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver is ready (`DRIVER_OK`): serve these queues.
    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
    ) -> Result<(), ActivateError>;
    /// Whether [`VirtioDevice::activate`] succeeded and no reset came since.
    fn is_activated(&self) -> bool;
    /// The driver reset the device: drop its queues.
    fn reset(&mut self);
}
