//! virtio-fs (virtio 1.x, 5.11): the guest's root filesystem and the
//! container's mounts, served in process by `fuse-backend-rs`'s
//! passthrough file system over the directory the supervisor shares.
//!
//! - `device.rs`: [`Fs`], two queues (high priority, where Linux sends
//!   `FORGET`s, and one request queue), the configuration space (the tag
//!   the guest mounts and the number of request queues), each chain
//!   validated by [`super::chain`] before `fuse-backend-rs` reads the
//!   request from it and writes the reply into it;
//! - `event_handler.rs`: the device in an event loop of its own (a slow
//!   host file system must not hold up the control channel);
//! - [`sandbox`]: what the guest may reach — the passthrough file system's
//!   configuration, and why a guest cannot leave its share.
//!
//! No DAX window and no notification queue are offered: every byte goes
//! through the queues, as with virtiofsd under QEMU (`--cache auto`).

mod device;
mod event_handler;
pub mod sandbox;
#[cfg(test)]
mod tests;

pub use device::{Fs, FsMetrics};

/// Device type of virtio-fs (virtio 1.x, 5).
pub const TYPE_FS: u32 = 26;
/// Bytes of the tag in the configuration space (NUL-padded, not
/// NUL-terminated when it is this long).
pub const TAG_LEN: usize = 36;
/// Request queues besides the high-priority one.
pub const REQUEST_QUEUES: u32 = 1;
/// Entries of each queue (Linux's driver uses what the device offers).
pub const QUEUE_SIZE: u16 = 256;
/// Queue indexes (virtio 1.x, 5.11.2).
pub mod queues {
    pub const HIPRIO: usize = 0;
    pub const REQUEST: usize = 1;
    pub const COUNT: usize = 2;
}
/// Most chains served per queue notification before the device yields to
/// its event loop (and comes back through its own queue event): a guest
/// that refills the ring as fast as it is served cannot hold the thread.
pub const BUDGET: usize = QUEUE_SIZE as usize;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("the virtio-fs tag {0:?} is empty, longer than 36 bytes or holds a NUL")]
    Tag(String),
    #[error("the shared directory {path}: {source}")]
    Share {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create a queue's event: {0}")]
    Event(#[source] std::io::Error),
    #[error(transparent)]
    Queue(#[from] super::queue::QueueError),
    #[error("cannot raise the device's interrupt: {0}")]
    Interrupt(#[source] std::io::Error),
}
