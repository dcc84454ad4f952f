//! virtio-console with `VIRTIO_CONSOLE_F_MULTIPORT` (virtio 1.x, 5.3): the
//! control channel the guest agent speaks, as a named port.
//!
//! - [`control`]: the control-queue messages, their wire format, the
//!   validation of what the guest sends and the encoding of what the
//!   device sends;
//! - `device.rs`: [`Console`], six queues (port 0 receive/transmit,
//!   control receive/transmit, port 1 receive/transmit), the handshake
//!   Linux's `virtio_console` driver does, and port 1's bytes to and from
//!   a connected unix socket with flow control both ways;
//! - `event_handler.rs`: the device in the VMM's event loop (the queues'
//!   eventfds and the socket).
//!
//! Port 0 exists (its queues are part of the layout) but is never
//! announced, as with QEMU's `virtio-serial-device` whose port 0 is
//! reserved for a console: the guest sees one port, 1, named
//! [`crate::protocol::PORT_NAME`].

pub mod control;
mod device;
mod event_handler;
#[cfg(test)]
mod tests;

pub use device::{Console, ConsoleMetrics};

/// Device type of virtio-console (virtio 1.x, 5).
pub const TYPE_CONSOLE: u32 = 3;
/// `VIRTIO_CONSOLE_F_MULTIPORT`: ports beyond 0 and the control queues.
pub const F_MULTIPORT: u64 = 1 << 1;
/// Longest port name the device sends or accepts, in bytes. Linux's driver
/// takes any length; this bound keeps one control message in one small
/// buffer.
pub const MAX_NAME_LEN: usize = 64;
/// Ports the device has (`max_nr_ports` in its configuration space).
pub const MAX_PORTS: u32 = 2;
/// The port whose bytes are the agent's control channel.
pub const AGENT_PORT: u32 = 1;
/// Entries of each queue.
pub const QUEUE_SIZE: u16 = 128;
/// Queue indexes (virtio 1.x, 5.3.2): port 0, control, then port 1.
pub mod queues {
    pub const PORT0_RX: usize = 0;
    pub const PORT0_TX: usize = 1;
    pub const CONTROL_RX: usize = 2;
    pub const CONTROL_TX: usize = 3;
    pub const PORT1_RX: usize = 4;
    pub const PORT1_TX: usize = 5;
    pub const COUNT: usize = 6;
}
/// Most bytes moved between the socket and guest memory at once.
pub const CHUNK: usize = 64 * 1024;
/// Most bytes sent to the host per notification before the device yields
/// to the event loop (and comes back through its own queue event).
pub const TX_BUDGET: usize = 1 << 20;
/// Most control messages waiting for the guest's receive buffers; a guest
/// that asks for answers without posting buffers cannot grow this.
pub const MAX_PENDING_CONTROL: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot create a queue's event: {0}")]
    Event(#[source] std::io::Error),
    #[error("cannot make the host socket non-blocking: {0}")]
    Socket(#[source] std::io::Error),
    #[error(transparent)]
    Queue(#[from] super::queue::QueueError),
    #[error("cannot raise the device's interrupt: {0}")]
    Interrupt(#[source] std::io::Error),
}
