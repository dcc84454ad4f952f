//! Queue handling shared by the devices: the rings are read and written
//! through `virtio-queue`; every chain goes through [`ValidChain::parse`]
//! before a device sees it, and a bad chain is completed with length 0 and
//! counted.

use std::sync::atomic::{AtomicU64, Ordering};

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemory};

use super::chain::{ChainError, Direction, ValidChain};

/// Errors of the rings themselves (the chains' are [`ChainError`]).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot update the used ring: {0}")]
    Used(virtio_queue::Error),
    #[error("cannot read the avail ring's event suppression: {0}")]
    Notification(virtio_queue::Error),
}

/// What a device counts about its queues (read by `events --stats` later).
#[derive(Debug, Default)]
pub struct QueueMetrics {
    /// Chains that passed validation and were served.
    pub chains: AtomicU64,
    /// Chains refused by the validator, completed with length 0.
    pub bad_chains: AtomicU64,
    /// Bytes written into guest buffers.
    pub bytes_written: AtomicU64,
}

impl QueueMetrics {
    pub fn chains(&self) -> u64 {
        self.chains.load(Ordering::Relaxed)
    }

    pub fn bad_chains(&self) -> u64 {
        self.bad_chains.load(Ordering::Relaxed)
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }
}

/// The next chain the guest made available, validated: `None` when the
/// ring is empty (or unusable), `Some(Err)` for a chain that was refused;
/// the caller completes it with length 0 ([`complete`]).
pub fn pop<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    direction: Direction,
) -> Option<(u16, Result<ValidChain, ChainError>)> {
    pop_chain(queue, mem, direction).map(|(head, popped)| (head, popped.map(|(valid, _)| valid)))
}

/// A validated chain and `virtio-queue`'s walk of it.
pub type Walked<'m, M> = (ValidChain, DescriptorChain<&'m M>);

/// Like [`pop`], keeping `virtio-queue`'s walk of the chain as well, for a
/// device whose library reads requests from one (virtio-fs and
/// `fuse-backend-rs`). The chain is validated here first; the library
/// walks the descriptor table again, with bounds of its own (at most the
/// queue's size of descriptors, each inside guest memory), so a guest that
/// rewrites its table in between gains nothing beyond what a valid chain
/// would reach.
pub fn pop_chain<'m, M: GuestMemory>(
    queue: &mut Queue,
    mem: &'m M,
    direction: Direction,
) -> Option<(u16, Result<Walked<'m, M>, ChainError>)> {
    let chain = queue.pop_descriptor_chain(mem)?;
    let head = chain.head_index();
    let table = GuestAddress(queue.desc_table());
    Some((
        head,
        ValidChain::parse(mem, table, queue.size(), head, direction).map(|valid| (valid, chain)),
    ))
}

/// Puts `head` on the used ring with `len` bytes written. A head outside
/// the queue (the guest wrote garbage into its avail ring) names no chain
/// the used ring could return: it is dropped, and `false` returned.
pub fn complete<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    head: u16,
    len: u32,
) -> Result<bool, QueueError> {
    if head >= queue.size() {
        return Ok(false);
    }
    queue.add_used(mem, head, len).map_err(QueueError::Used)?;
    Ok(true)
}

/// Whether the guest asked to be interrupted now (event index or the
/// avail ring's flag).
pub fn needs_interrupt<M: GuestMemory>(queue: &mut Queue, mem: &M) -> Result<bool, QueueError> {
    queue
        .needs_notification(mem)
        .map_err(QueueError::Notification)
}

/// Serves every available chain with `serve`, which returns the bytes it
/// wrote; refused chains are completed with 0 and counted. Returns
/// whether any chain was completed.
pub fn drain<M, F>(
    queue: &mut Queue,
    mem: &M,
    direction: Direction,
    metrics: &QueueMetrics,
    mut serve: F,
) -> Result<bool, QueueError>
where
    M: GuestMemory,
    F: FnMut(&ValidChain) -> Result<u32, ChainError>,
{
    let mut used = false;
    // At most one pass over the ring per call: a guest that refills the
    // ring as fast as we serve it cannot hold this thread forever.
    for _ in 0..queue.size() {
        let Some((head, chain)) = pop(queue, mem, direction) else {
            break;
        };
        let len = match chain.and_then(|c| serve(&c)) {
            Ok(len) => {
                metrics.chains.fetch_add(1, Ordering::Relaxed);
                metrics
                    .bytes_written
                    .fetch_add(u64::from(len), Ordering::Relaxed);
                len
            }
            Err(e) => {
                metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("virtio: chain at head {head} refused: {e}");
                0
            }
        };
        used |= complete(queue, mem, head, len)?;
    }
    Ok(used)
}
