//! virtio-net (virtio 1.x, 5.1): the guest's NIC on a tap the supervisor
//! opened in the container's network namespace (issue 9's routing puts the
//! guest's packets through that namespace's IP stack).
//!
//! - `device.rs`: [`Net`], a receive and a transmit queue, the MAC in the
//!   configuration space; frames move between guest buffers and the tap
//!   whole, each with the 12-byte `virtio_net_hdr_v1` that the tap also
//!   speaks (`IFF_VNET_HDR`, [`tap::configure`]);
//! - `event_handler.rs`: the device in the VMM's event loop (the queues'
//!   eventfds and the tap, read only while a frame can go somewhere).
//!
//! No offloads are offered (no checksum, TSO or mergeable buffers): every
//! frame fits the MTU and carries its own checksum, so the tap is told to
//! hand us nothing else. A frame from the guest whose header asks for an
//! offload it was never offered is dropped and counted. No control queue:
//! the MAC is fixed, the link always up.

mod device;
mod event_handler;
pub mod tap;
#[cfg(test)]
mod tests;

pub use device::{Net, NetMetrics};

/// Device type of virtio-net (virtio 1.x, 5).
pub const TYPE_NET: u32 = 1;
/// `VIRTIO_NET_F_MAC`: the configuration space holds the MAC.
pub const F_MAC: u64 = 1 << 5;
/// `struct virtio_net_hdr_v1`: every frame starts with it (virtio 1.x
/// always carries `num_buffers`).
pub const HDR_LEN: usize = 12;
/// Entries of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Queue indexes (virtio 1.x, 5.1.2: receiveq1, transmitq1).
pub mod queues {
    pub const RX: usize = 0;
    pub const TX: usize = 1;
    pub const COUNT: usize = 2;
}
/// The largest frame moved either way, header included: an Ethernet frame
/// of up to 64 KiB (more than any MTU a tap has without offloads).
pub const MAX_FRAME: usize = HDR_LEN + 65_550;
/// Most frames moved per event each way before the device yields to the
/// event loop (it comes back through its own queue event or the tap).
pub const BUDGET: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot create a queue's event: {0}")]
    Event(#[source] std::io::Error),
    #[error("cannot make the tap non-blocking: {0}")]
    Tap(#[source] std::io::Error),
    #[error(transparent)]
    Queue(#[from] super::queue::QueueError),
    #[error("cannot raise the device's interrupt: {0}")]
    Interrupt(#[source] std::io::Error),
}
