//! The device: its configuration space, its two queues, and each request
//! handed to the FUSE server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::passthrough::PassthroughFs;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::{queues, FsError, BUDGET, QUEUE_SIZE, REQUEST_QUEUES, TAG_LEN, TYPE_FS};
use crate::microvm::vmm::builtin::virtio::chain::Direction;
use crate::microvm::vmm::builtin::virtio::queue;
use crate::microvm::vmm::builtin::virtio::{
    ActivateError, Interrupt, VirtioDevice, F_VERSION_1, INT_VRING,
};

/// What the device counts (read by `events --stats` later).
#[derive(Debug, Default)]
pub struct FsMetrics {
    /// Requests the FUSE server answered (an error reply is an answer).
    pub requests: AtomicU64,
    /// Chains refused by the validator, completed with length 0.
    pub bad_chains: AtomicU64,
    /// Requests the server could not decode or answer (a malformed
    /// message), completed with length 0.
    pub failed: AtomicU64,
    /// Bytes of replies written into guest buffers.
    pub bytes_written: AtomicU64,
}

impl FsMetrics {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn bad_chains(&self) -> u64 {
        self.bad_chains.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
}

/// What the device runs with once the driver is ready.
struct Active {
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    interrupt: Arc<Interrupt>,
}

pub struct Fs {
    /// The configuration space: the tag, NUL-padded, then the number of
    /// request queues (little-endian).
    config: [u8; TAG_LEN + 4],
    server: Server<PassthroughFs>,
    pub(super) queue_events: [EventFd; queues::COUNT],
    active: Option<Active>,
    pub metrics: Arc<FsMetrics>,
}

impl Fs {
    /// A device that the guest mounts as `tag`, serving `fs`.
    pub fn new(tag: &str, fs: PassthroughFs) -> Result<Fs, FsError> {
        if tag.is_empty() || tag.len() > TAG_LEN || tag.contains('\0') {
            return Err(FsError::Tag(tag.to_string()));
        }
        let mut config = [0u8; TAG_LEN + 4];
        config[..tag.len()].copy_from_slice(tag.as_bytes());
        config[TAG_LEN..].copy_from_slice(&REQUEST_QUEUES.to_le_bytes());
        let event = || EventFd::new(libc::EFD_NONBLOCK).map_err(FsError::Event);
        Ok(Fs {
            config,
            server: Server::new(fs),
            queue_events: [event()?, event()?],
            active: None,
            metrics: Arc::new(FsMetrics::default()),
        })
    }

    /// Serves up to [`BUDGET`] requests of queue `index`, then interrupts
    /// the guest if it asked to be; with requests left, notifies its own
    /// queue event to come back after the event loop's other work.
    /// Returns whether the used ring changed.
    pub fn process_queue(&mut self, index: usize) -> Result<bool, FsError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(false);
        };
        let Some(q) = active.queues.get_mut(index) else {
            return Ok(false);
        };
        let mem = &active.mem;
        let mut used = false;
        let mut served = 0;
        while served < BUDGET {
            let Some((head, popped)) = queue::pop_chain(q, mem, Direction::ReadsMaybeWrites) else {
                break;
            };
            served += 1;
            let len = match popped {
                Ok((_, chain)) => serve(&self.server, mem, chain, &self.metrics),
                Err(e) => {
                    self.metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("virtio-fs: chain at head {head} refused: {e}");
                    0
                }
            };
            used |= queue::complete(q, mem, head, len)?;
        }
        if served == BUDGET {
            if let Some(evt) = self.queue_events.get(index) {
                evt.write(1).map_err(FsError::Event)?;
            }
        }
        if used && queue::needs_interrupt(q, mem)? {
            active
                .interrupt
                .trigger(INT_VRING)
                .map_err(FsError::Interrupt)?;
        }
        Ok(used)
    }
}

/// One request: the FUSE server reads it from the chain's readable
/// buffers and writes its reply into the writable ones. Returns the
/// reply's length, 0 for a request that could not be answered.
fn serve(
    server: &Server<PassthroughFs>,
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<&GuestMemoryMmap>,
    metrics: &FsMetrics,
) -> u32 {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        metrics.failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("virtio-fs: {what}: {e}");
        0
    };
    let reader = match Reader::from_descriptor_chain(mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => return failed("request buffers", &e),
    };
    let writer = match VirtioFsWriter::new(mem, chain) {
        Ok(w) => Writer::from(w),
        Err(e) => return failed("reply buffers", &e),
    };
    match server.handle_message(reader, writer, None, None) {
        Ok(n) => {
            metrics.requests.fetch_add(1, Ordering::Relaxed);
            // The reply fits the chain's writable buffers, whose total
            // the validator bounded to a u32.
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            metrics
                .bytes_written
                .fetch_add(u64::from(n), Ordering::Relaxed);
            n
        }
        Err(e) => failed("request", &e),
    }
}

impl VirtioDevice for Fs {
    fn device_type(&self) -> u32 {
        TYPE_FS
    }

    fn features(&self) -> u64 {
        F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; queues::COUNT]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = self.config.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Read-only (virtio 1.x, 5.11.4).
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        _features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
    ) -> Result<(), ActivateError> {
        if queues.len() != queues::COUNT {
            return Err(ActivateError::QueueCount {
                expected: queues::COUNT,
                got: queues.len(),
            });
        }
        self.active = Some(Active {
            mem,
            queues,
            interrupt,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        // The server's inodes and open files stay: a driver that resets
        // the device starts again with FUSE_INIT, which the server takes
        // as a new session.
        self.active = None;
    }
}
