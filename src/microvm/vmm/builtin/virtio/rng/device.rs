//! The device: its queue, served from an [`EntropySource`].

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::{RngError, MAX_REQUEST, QUEUE_SIZE};
use crate::microvm::vmm::builtin::virtio::chain::{ChainError, Direction};
use crate::microvm::vmm::builtin::virtio::queue::{self, QueueMetrics};
use crate::microvm::vmm::builtin::virtio::{
    ActivateError, Interrupt, VirtioDevice, F_VERSION_1, INT_VRING, TYPE_RNG,
};

/// Where random bytes come from.
pub trait EntropySource: Send {
    /// Fills `buf` entirely.
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()>;
}

/// The host's `/dev/urandom`, opened once (before the VMM is jailed).
pub struct Urandom(File);

impl Urandom {
    pub const PATH: &'static str = "/dev/urandom";

    pub fn open() -> Result<Urandom, RngError> {
        File::open(Self::PATH)
            .map(Urandom)
            .map_err(|source| RngError::Open {
                path: Self::PATH,
                source,
            })
    }
}

impl EntropySource for Urandom {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact(buf)
    }
}

/// Deterministic bytes (`seed`, `seed + 1`, … wrapping) for tests and fuzz
/// targets, which must tell what the device wrote.
pub struct Pattern(pub u8);

impl EntropySource for Pattern {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        for b in buf {
            *b = self.0;
            self.0 = self.0.wrapping_add(1);
        }
        Ok(())
    }
}

/// What the device runs with once the driver is ready.
struct Active {
    mem: GuestMemoryMmap,
    queue: Queue,
    interrupt: Arc<Interrupt>,
}

pub struct Rng {
    source: Box<dyn EntropySource>,
    pub(super) queue_events: [EventFd; 1],
    active: Option<Active>,
    pub metrics: Arc<QueueMetrics>,
    buf: Vec<u8>,
}

impl Rng {
    pub fn new(source: Box<dyn EntropySource>) -> Result<Rng, RngError> {
        Ok(Rng {
            source,
            queue_events: [EventFd::new(libc::EFD_NONBLOCK).map_err(RngError::Event)?],
            active: None,
            metrics: Arc::new(QueueMetrics::default()),
            buf: Vec::new(),
        })
    }

    /// Serves every request on the queue, then interrupts the guest if it
    /// asked to be. Returns whether the used ring changed.
    pub fn process_queue(&mut self) -> Result<bool, RngError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(false);
        };
        let source = &mut self.source;
        let buf = &mut self.buf;
        let used = queue::drain(
            &mut active.queue,
            &active.mem,
            Direction::DeviceWrites,
            &self.metrics,
            |chain| {
                let n = chain.writable_len().min(MAX_REQUEST) as usize;
                buf.resize(n, 0);
                // An entropy source that fails serves nothing: length 0,
                // which the guest's driver takes as "try again".
                if source.fill(&mut buf[..n]).is_err() {
                    return Ok(0);
                }
                let mut w = chain.writer(&active.mem);
                let written = w.write(&buf[..n])?;
                u32::try_from(written).map_err(|_| ChainError::TotalTooLong)
            },
        )?;
        if used && queue::needs_interrupt(&mut active.queue, &active.mem)? {
            active
                .interrupt
                .trigger(INT_VRING)
                .map_err(RngError::Interrupt)?;
        }
        Ok(used)
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }

    fn features(&self) -> u64 {
        F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // virtio-rng has no configuration space.
        data.fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        _features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
    ) -> Result<(), ActivateError> {
        let got = queues.len();
        let Some(queue) = queues.into_iter().next().filter(|_| got == 1) else {
            return Err(ActivateError::QueueCount { expected: 1, got });
        };
        self.active = Some(Active {
            mem,
            queue,
            interrupt,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
    }
}
