//! The virtio-mmio transport (virtio 1.x, 4.2.2), version 2 only: a
//! 4 KiB register window per device; the guest finds it through a
//! `virtio_mmio.device=4K@<base>:<irq>` entry on its command line.

use std::sync::{Arc, Mutex};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::{status, Interrupt, VirtioDevice, F_VERSION_1};
use crate::microvm::vmm::builtin::bus::BusDevice;

/// `"virt"`, little-endian.
pub const MAGIC: u32 = 0x7472_6976;
/// The register layout's version (2 = virtio 1.x, no legacy).
pub const VERSION: u32 = 2;
/// The vendor id: "AVM" in little-endian bytes (drivers do not read it).
pub const VENDOR: u32 = 0x004d_5641;
/// Size of one device's window.
pub const WINDOW: u64 = 0x1000;

/// Register offsets (virtio 1.x, table 4.1).
pub mod reg {
    pub const MAGIC: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;
}

/// One virtio device behind its register window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    mem: GuestMemoryMmap,
    interrupt: Arc<Interrupt>,
    queues: Vec<Queue>,
    queue_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    /// Accesses the transport ignored (wrong width, unknown register,
    /// write at the wrong time): a guest driver bug or a hostile guest.
    pub ignored: u64,
}

impl MmioTransport {
    pub fn new(
        mem: GuestMemoryMmap,
        device: Arc<Mutex<dyn VirtioDevice>>,
        interrupt: Arc<Interrupt>,
    ) -> MmioTransport {
        let queues = {
            let d = lock(&device);
            d.queue_max_sizes()
                .iter()
                .filter_map(|&max| Queue::new(max).ok())
                .collect()
        };
        MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            ignored: 0,
        }
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    fn device(&self) -> std::sync::MutexGuard<'_, dyn VirtioDevice + 'static> {
        lock(&self.device)
    }

    fn offered(&self) -> u64 {
        self.device().features() | F_VERSION_1
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may change only while the driver sets the device up
    /// (features accepted, not yet running) and the queue is not ready.
    fn queue_setup_allowed(&self) -> bool {
        self.status & status::FEATURES_OK != 0
            && self.status & (status::DRIVER_OK | status::FAILED) == 0
    }

    fn reset(&mut self) {
        self.device().reset();
        for q in &mut self.queues {
            q.reset();
        }
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt.ack(u32::MAX);
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // The driver only ever sets bits (virtio 1.x, 3.1.1), and only its
        // own: DEVICE_NEEDS_RESET is the device's (found by the
        // virtio_mmio fuzz target: a guest could set it on a running
        // device), and DRIVER_OK after FAILED is refused.
        let new = value & !self.status;
        if value & self.status != self.status
            || new & !status::DRIVER_BITS != 0
            || (new & status::DRIVER_OK != 0 && value & status::FAILED != 0)
        {
            self.ignored += 1;
            return;
        }
        let mut value = value;
        if new & status::FEATURES_OK != 0 && self.driver_features & !self.offered() != 0 {
            // Features we never offered: FEATURES_OK does not stick.
            value &= !status::FEATURES_OK;
        }
        if new & status::DRIVER_OK != 0 {
            if value & status::FEATURES_OK == 0 {
                self.ignored += 1;
                return;
            }
            // The device gets copies; the transport keeps its registers.
            let queues: Vec<Queue> = self
                .queues
                .iter()
                .filter_map(|q| Queue::try_from(q.state()).ok())
                .collect();
            if queues.len() != self.queues.len() {
                value |= status::DEVICE_NEEDS_RESET;
            } else if let Some(i) = queues.iter().position(|q| !q.is_valid(&self.mem)) {
                tracing::debug!("virtio-mmio: queue {i} unusable at DRIVER_OK");
                value |= status::DEVICE_NEEDS_RESET;
            } else {
                let mem = self.mem.clone();
                let features = self.driver_features;
                let interrupt = self.interrupt.clone();
                if let Err(e) = self.device().activate(mem, features, queues, interrupt) {
                    tracing::debug!("virtio-mmio: cannot activate the device: {e}");
                    value |= status::DEVICE_NEEDS_RESET;
                }
            }
        }
        self.status = value;
    }

    fn read_register(&mut self, offset: u64) -> u32 {
        match offset {
            reg::MAGIC => MAGIC,
            reg::VERSION => VERSION,
            reg::DEVICE_ID => self.device().device_type(),
            reg::VENDOR_ID => VENDOR,
            reg::DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered() as u32,
                1 => (self.offered() >> 32) as u32,
                _ => 0,
            },
            reg::QUEUE_NUM_MAX => self.selected().map_or(0, |q| u32::from(q.max_size())),
            reg::QUEUE_READY => self.selected().map_or(0, |q| u32::from(q.ready())),
            reg::INTERRUPT_STATUS => self.interrupt.status(),
            reg::STATUS => self.status,
            reg::CONFIG_GENERATION => 0,
            _ => {
                self.ignored += 1;
                0
            }
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        let setup = self.queue_setup_allowed();
        match offset {
            reg::DEVICE_FEATURES_SEL => self.device_features_sel = value,
            reg::DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            reg::DRIVER_FEATURES
                if self.status & status::DRIVER != 0 && self.status & status::FEATURES_OK == 0 =>
            {
                match self.driver_features_sel {
                    0 => {
                        self.driver_features =
                            (self.driver_features & !0xffff_ffff) | u64::from(value)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                    }
                    _ => self.ignored += 1,
                }
            }
            reg::QUEUE_SEL => self.queue_sel = value,
            reg::QUEUE_NUM if setup => match self.selected() {
                Some(q) => q.set_size(value as u16),
                None => self.ignored += 1,
            },
            reg::QUEUE_READY if setup => match self.selected() {
                Some(q) => q.set_ready(value == 1),
                None => self.ignored += 1,
            },
            reg::QUEUE_DESC_LOW
            | reg::QUEUE_DESC_HIGH
            | reg::QUEUE_DRIVER_LOW
            | reg::QUEUE_DRIVER_HIGH
            | reg::QUEUE_DEVICE_LOW
            | reg::QUEUE_DEVICE_HIGH
                if setup =>
            {
                let (lo, hi) = if offset & 4 == 0 {
                    (Some(value), None)
                } else {
                    (None, Some(value))
                };
                match self.selected() {
                    Some(q) if !q.ready() => match offset & !4 {
                        reg::QUEUE_DESC_LOW => q.set_desc_table_address(lo, hi),
                        reg::QUEUE_DRIVER_LOW => q.set_avail_ring_address(lo, hi),
                        _ => q.set_used_ring_address(lo, hi),
                    },
                    _ => self.ignored += 1,
                }
            }
            reg::QUEUE_NOTIFY => self.notify(value),
            reg::INTERRUPT_ACK => self.interrupt.ack(value),
            reg::STATUS => self.set_status(value),
            _ => self.ignored += 1,
        }
    }

    /// A notification that reached us (no ioeventfd caught it): passed on
    /// to the device's queue event, which its event handler serves.
    fn notify(&mut self, queue: u32) {
        let device = self.device();
        if !device.is_activated() {
            drop(device);
            self.ignored += 1;
            return;
        }
        match device.queue_events().get(queue as usize) {
            Some(evt) => {
                if let Err(e) = evt.write(1) {
                    tracing::debug!("virtio-mmio: cannot signal queue {queue}: {e}");
                }
            }
            None => {
                drop(device);
                self.ignored += 1;
            }
        }
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= reg::CONFIG {
            self.device().read_config(offset - reg::CONFIG, data);
            return;
        }
        // Registers are 32 bits wide and read whole (4.2.2.2).
        if data.len() != 4 || !offset.is_multiple_of(4) {
            self.ignored += 1;
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_register(offset).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= reg::CONFIG {
            self.device().write_config(offset - reg::CONFIG, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.ignored += 1;
            return;
        };
        if !offset.is_multiple_of(4) {
            self.ignored += 1;
            return;
        }
        self.write_register(offset, u32::from_le_bytes(bytes));
    }
}

/// Locks a device; a device whose lock was poisoned (a panic while it was
/// held, which `panic = "abort"` makes impossible in release) is used
/// as it is.
fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[path = "mmio_tests.rs"]
mod tests;
