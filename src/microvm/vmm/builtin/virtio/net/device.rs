//! The device: its MAC, its two queues, and frames between them and the
//! tap.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::{queues, NetError, BUDGET, F_MAC, HDR_LEN, MAX_FRAME, QUEUE_SIZE, TYPE_NET};
use crate::microvm::vmm::builtin::virtio::chain::Direction;
use crate::microvm::vmm::builtin::virtio::queue;
use crate::microvm::vmm::builtin::virtio::{
    ActivateError, Interrupt, VirtioDevice, F_VERSION_1, INT_VRING,
};

/// What the device counts (read by `events --stats` later).
#[derive(Debug, Default)]
pub struct NetMetrics {
    /// Frames given to the guest, and their bytes (headers included).
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames from the tap that no guest buffer could hold, or shorter
    /// than a header.
    pub rx_dropped: AtomicU64,
    /// Frames the guest sent to the tap, and their bytes.
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Frames from the guest not sent: shorter than a header, longer than
    /// [`MAX_FRAME`], asking for an offload never offered, or refused by
    /// the tap (full, or down).
    pub tx_dropped: AtomicU64,
    /// Chains refused by the validator, completed with length 0.
    pub bad_chains: AtomicU64,
}

fn count(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl NetMetrics {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// What the device runs with once the driver is ready.
struct Active {
    mem: GuestMemoryMmap,
    rx: Queue,
    tx: Queue,
    interrupt: Arc<Interrupt>,
}

pub struct Net {
    mac: [u8; 6],
    pub(super) tap: File,
    pub(super) queue_events: [EventFd; queues::COUNT],
    active: Option<Active>,
    /// A frame read from the tap that waits for a receive buffer: its
    /// length in `rx_buf`.
    pending: Option<usize>,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    pub metrics: Arc<NetMetrics>,
    /// What the tap is registered for in the event loop.
    pub(super) registered: EventSet,
}

impl Net {
    /// A NIC with `mac` on `tap`: a tap set up with [`super::tap::configure`],
    /// or any descriptor that reads and writes one frame, header first,
    /// per call (a datagram socket, in tests). Made non-blocking here.
    pub fn new(tap: OwnedFd, mac: [u8; 6]) -> Result<Net, NetError> {
        // SAFETY: F_GETFL on a descriptor we own; no memory is passed.
        let flags = unsafe { libc::fcntl(tap.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(NetError::Tap(std::io::Error::last_os_error()));
        }
        // SAFETY: F_SETFL on a descriptor we own, with an int argument.
        if unsafe { libc::fcntl(tap.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(NetError::Tap(std::io::Error::last_os_error()));
        }
        let event = || EventFd::new(libc::EFD_NONBLOCK).map_err(NetError::Event);
        Ok(Net {
            mac,
            tap: File::from(tap),
            queue_events: [event()?, event()?],
            active: None,
            pending: None,
            rx_buf: vec![0; MAX_FRAME],
            tx_buf: Vec::with_capacity(MAX_FRAME),
            metrics: Arc::new(NetMetrics::default()),
            registered: EventSet::empty(),
        })
    }

    /// What the tap should be watched for: readable, while the device runs
    /// and has no frame waiting for a buffer (a guest that posts no
    /// buffers leaves the frames in the tap's queue, where the kernel
    /// drops them when it is full, as a NIC would).
    pub fn tap_interest(&self) -> EventSet {
        if self.active.is_some() && self.pending.is_none() {
            EventSet::IN
        } else {
            EventSet::empty()
        }
    }

    /// A notification of queue `index`: the guest posted receive buffers
    /// or frames to send.
    pub fn process_queue(&mut self, index: usize) -> Result<(), NetError> {
        match index {
            queues::RX => self.receive(),
            queues::TX => self.transmit(),
            _ => Ok(()),
        }
    }

    /// The tap is readable.
    pub fn process_tap(&mut self) -> Result<(), NetError> {
        self.receive()
    }

    /// Moves frames from the tap into receive buffers while both have
    /// some, up to [`BUDGET`].
    fn receive(&mut self) -> Result<(), NetError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let mut used = false;
        for _ in 0..BUDGET {
            let len = match self.pending {
                Some(len) => len,
                None => match self.tap.read(&mut self.rx_buf) {
                    Ok(n) if n < HDR_LEN => {
                        count(&self.metrics.rx_dropped, 1);
                        continue;
                    }
                    Ok(n) => {
                        self.pending = Some(n);
                        n
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::debug!("virtio-net: reading the tap: {e}");
                        break;
                    }
                },
            };
            let Some((head, chain)) =
                queue::pop(&mut active.rx, &active.mem, Direction::DeviceWrites)
            else {
                // No buffer: the frame waits, the tap is not read.
                break;
            };
            let chain = match chain {
                Ok(c) => c,
                Err(e) => {
                    count(&self.metrics.bad_chains, 1);
                    tracing::debug!("virtio-net: receive chain at head {head} refused: {e}");
                    used |= queue::complete(&mut active.rx, &active.mem, head, 0)?;
                    continue;
                }
            };
            if (chain.writable_len() as usize) < len {
                // Too small for this frame: the frame is dropped, the
                // buffer kept for the next one.
                active.rx.go_to_previous_position();
                self.pending = None;
                count(&self.metrics.rx_dropped, 1);
                continue;
            }
            // One buffer per frame: num_buffers is 1.
            self.rx_buf[10..12].copy_from_slice(&1u16.to_le_bytes());
            let written = chain.writer(&active.mem).write(&self.rx_buf[..len]);
            self.pending = None;
            let n = match written {
                Ok(n) => {
                    count(&self.metrics.rx_frames, 1);
                    count(&self.metrics.rx_bytes, n as u64);
                    n as u32
                }
                Err(e) => {
                    count(&self.metrics.rx_dropped, 1);
                    tracing::debug!("virtio-net: receive chain at head {head}: {e}");
                    0
                }
            };
            used |= queue::complete(&mut active.rx, &active.mem, head, n)?;
        }
        if used && queue::needs_interrupt(&mut active.rx, &active.mem)? {
            active
                .interrupt
                .trigger(INT_VRING)
                .map_err(NetError::Interrupt)?;
        }
        Ok(())
    }

    /// Sends the guest's frames to the tap, up to [`BUDGET`]; with frames
    /// left, notifies its own queue event to come back.
    fn transmit(&mut self) -> Result<(), NetError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let mut used = false;
        let mut sent = 0;
        while sent < BUDGET {
            let Some((head, chain)) =
                queue::pop(&mut active.tx, &active.mem, Direction::DeviceReads)
            else {
                break;
            };
            sent += 1;
            match chain {
                Ok(c) => {
                    let len = c.readable_len() as usize;
                    if !(HDR_LEN..=MAX_FRAME).contains(&len) {
                        count(&self.metrics.tx_dropped, 1);
                    } else {
                        self.tx_buf.resize(len, 0);
                        match c.reader(&active.mem).read(&mut self.tx_buf) {
                            Ok(n) if n == len => send(&mut self.tap, &self.tx_buf, &self.metrics),
                            Ok(_) | Err(_) => count(&self.metrics.tx_dropped, 1),
                        }
                    }
                }
                Err(e) => {
                    count(&self.metrics.bad_chains, 1);
                    tracing::debug!("virtio-net: transmit chain at head {head} refused: {e}");
                }
            }
            // The device writes nothing into a transmit chain.
            used |= queue::complete(&mut active.tx, &active.mem, head, 0)?;
        }
        if sent == BUDGET {
            self.queue_events[queues::TX]
                .write(1)
                .map_err(NetError::Event)?;
        }
        if used && queue::needs_interrupt(&mut active.tx, &active.mem)? {
            active
                .interrupt
                .trigger(INT_VRING)
                .map_err(NetError::Interrupt)?;
        }
        Ok(())
    }
}

/// One frame, header first, to the tap; dropped if the header asks for an
/// offload (checksum, segmentation) that was never offered, or if the tap
/// refuses it.
fn send(tap: &mut File, frame: &[u8], metrics: &NetMetrics) {
    let (flags, gso_type) = (frame[0], frame[1]);
    if flags != 0 || gso_type != 0 {
        count(&metrics.tx_dropped, 1);
        return;
    }
    // A tap (or datagram socket) takes a frame whole or not at all.
    match tap.write(frame) {
        Ok(n) if n == frame.len() => {
            count(&metrics.tx_frames, 1);
            count(&metrics.tx_bytes, frame.len() as u64);
        }
        Ok(n) => {
            count(&metrics.tx_dropped, 1);
            tracing::debug!("virtio-net: the tap took {n} of {} bytes", frame.len());
        }
        Err(e) => {
            count(&metrics.tx_dropped, 1);
            tracing::debug!("virtio-net: writing the tap: {e}");
        }
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn features(&self) -> u64 {
        F_VERSION_1 | F_MAC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; queues::COUNT]
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // The MAC, then `status` and the rest, which no offered feature
        // makes valid: zeros.
        data.fill(0);
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = self.mac.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is the host's choice (VIRTIO_NET_F_CTRL_MAC_ADDR is not
        // offered; legacy writes to it are ignored).
    }

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        _features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
    ) -> Result<(), ActivateError> {
        let got = queues.len();
        let mut it = queues.into_iter();
        let (Some(rx), Some(tx), None) = (it.next(), it.next(), it.next()) else {
            return Err(ActivateError::QueueCount {
                expected: queues::COUNT,
                got,
            });
        };
        self.active = Some(Active {
            mem,
            rx,
            tx,
            interrupt,
        });
        Ok(())
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn reset(&mut self) {
        self.active = None;
        self.pending = None;
    }
}
