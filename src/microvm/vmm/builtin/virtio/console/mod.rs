//! virtio-console with `VIRTIO_CONSOLE_F_MULTIPORT` (virtio 1.x, 5.3): the
//! control channel the guest agent speaks, as a named port.
//!
//! So far only the control-queue messages ([`control`]): their wire format,
//! the validation of what the guest sends and the encoding of what the
//! device sends. The device, its event handling and its host-side socket
//! are still to come (docs/builtin-vmm.md, "What is left").

pub mod control;

/// Device type of virtio-console (virtio 1.x, 5).
pub const TYPE_CONSOLE: u32 = 3;
/// `VIRTIO_CONSOLE_F_MULTIPORT`: ports beyond 0 and the control queues.
pub const F_MULTIPORT: u64 = 1 << 1;
/// Longest port name the device sends or accepts, in bytes. Linux's driver
/// takes any length; this bound keeps one control message in one small
/// buffer.
pub const MAX_NAME_LEN: usize = 64;
