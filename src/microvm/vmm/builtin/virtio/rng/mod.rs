//! virtio-rng (virtio 1.x, 5.4): one queue of buffers the device fills
//! with random bytes from the host.

mod device;
mod event_handler;
#[cfg(test)]
mod tests;

pub use device::{EntropySource, Pattern, Rng, Urandom};

/// Entries of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Most bytes served per request: a guest asking for 4 GiB gets this.
pub const MAX_REQUEST: u32 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RngError {
    #[error("cannot open the host's entropy source {path}: {source}")]
    Open {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the queue's event: {0}")]
    Event(#[source] std::io::Error),
    #[error(transparent)]
    Queue(#[from] super::queue::QueueError),
    #[error("cannot raise the device's interrupt: {0}")]
    Interrupt(#[source] std::io::Error),
}
