//! The device: six queues, the control handshake, and port 1's bytes to
//! and from the host socket.
//!
//! Flow control, both ways:
//! - guest → host: a transmit chain is written to the socket as it is; on
//!   `EAGAIN` the chain stays the device's (not returned to the guest), the
//!   unsent remainder is sent from guest memory once the socket is
//!   writable again (`EPOLLOUT`), and no further chain is taken meanwhile:
//!   a slow reader holds the guest back, nothing is lost or reordered;
//! - host → guest: the socket is read only while the guest has opened the
//!   port and posted receive buffers, never into a device-side buffer
//!   that could grow; with no buffer posted the socket is not watched for
//!   input until the guest notifies the receive queue.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use super::control::{self, ControlError, DeviceMessage, GuestMessage, HEADER_LEN};
use super::{
    queues, ConsoleError, AGENT_PORT, CHUNK, F_MULTIPORT, MAX_PENDING_CONTROL, MAX_PORTS,
    QUEUE_SIZE, TX_BUDGET, TYPE_CONSOLE,
};
use crate::microvm::vmm::builtin::virtio::chain::{ChainError, Direction, ValidChain};
use crate::microvm::vmm::builtin::virtio::queue::{self, QueueMetrics};
use crate::microvm::vmm::builtin::virtio::{
    ActivateError, Interrupt, VirtioDevice, F_VERSION_1, INT_VRING,
};

/// What the device counts.
#[derive(Debug, Default)]
pub struct ConsoleMetrics {
    /// Every queue's chains: served, refused (completed with length 0,
    /// control messages that do not parse included), and bytes written
    /// into guest buffers.
    pub queues: QueueMetrics,
    /// Port 1's bytes the host socket took.
    pub bytes_to_host: AtomicU64,
    /// Bytes the guest sent with no host connected, or on port 0 (never
    /// announced): completed and dropped.
    pub bytes_dropped: AtomicU64,
    /// Well-formed control messages about port 0, which the device never
    /// announced, and device messages dropped because the guest left more
    /// than [`MAX_PENDING_CONTROL`] of them waiting.
    pub control_ignored: AtomicU64,
}

impl ConsoleMetrics {
    pub fn bytes_to_host(&self) -> u64 {
        self.bytes_to_host.load(Ordering::Relaxed)
    }

    pub fn bytes_dropped(&self) -> u64 {
        self.bytes_dropped.load(Ordering::Relaxed)
    }

    pub fn control_ignored(&self) -> u64 {
        self.control_ignored.load(Ordering::Relaxed)
    }
}

/// Why one chain was completed with length 0.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("a receive buffer of {have} bytes cannot hold a control message of {need}")]
    TooSmall { need: usize, have: u32 },
}

/// What the device runs with once the driver is ready.
struct Active {
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    interrupt: Arc<Interrupt>,
}

impl Active {
    /// Interrupts the guest for queue `index` if it asked to be.
    fn signal(&mut self, index: usize) -> Result<(), ConsoleError> {
        if queue::needs_interrupt(&mut self.queues[index], &self.mem)? {
            self.interrupt
                .trigger(INT_VRING)
                .map_err(ConsoleError::Interrupt)?;
        }
        Ok(())
    }
}

/// A transmit chain the socket has not taken whole yet.
struct TxPending {
    chain: ValidChain,
    sent: u32,
}

/// How sending a transmit chain ended.
enum Sent {
    All,
    /// The socket is full (`EAGAIN`).
    Blocked,
    /// This notification's budget is spent.
    Budget,
    /// The host side is gone (`EPIPE`, `ECONNRESET`, …).
    HungUp(io::Error),
    Refused(ChainError),
}

pub struct Console {
    pub(super) queue_events: Vec<EventFd>,
    pub(super) stream: UnixStream,
    /// Socket events currently registered with the event loop.
    pub(super) registered: EventSet,
    name: &'static [u8],
    host_connected: bool,
    guest_connected: bool,
    active: Option<Active>,
    control_out: VecDeque<Vec<u8>>,
    tx: Option<TxPending>,
    tx_blocked: bool,
    /// A receive chain taken from the ring, waiting for the socket's bytes.
    rx: Option<ValidChain>,
    /// The receive ring was found empty; cleared by its notification.
    rx_starved: bool,
    pub metrics: Arc<ConsoleMetrics>,
    buf: Vec<u8>,
}

const QUEUE_SIZES: [u16; queues::COUNT] = [QUEUE_SIZE; queues::COUNT];

impl Console {
    /// A console whose port 1, named [`crate::protocol::PORT_NAME`], is
    /// `stream`'s other end: connected (the host side is open from the
    /// start), made non-blocking here.
    pub fn new(stream: UnixStream) -> Result<Console, ConsoleError> {
        stream.set_nonblocking(true).map_err(ConsoleError::Socket)?;
        let queue_events = (0..queues::COUNT)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<io::Result<Vec<_>>>()
            .map_err(ConsoleError::Event)?;
        Ok(Console {
            queue_events,
            stream,
            registered: EventSet::empty(),
            name: crate::protocol::PORT_NAME.as_bytes(),
            host_connected: true,
            guest_connected: false,
            active: None,
            control_out: VecDeque::new(),
            tx: None,
            tx_blocked: false,
            rx: None,
            rx_starved: false,
            metrics: Arc::new(ConsoleMetrics::default()),
            buf: Vec::new(),
        })
    }

    /// Whether the host side of port 1 is connected (no hang-up seen).
    pub fn host_connected(&self) -> bool {
        self.host_connected
    }

    /// Whether an application in the guest has port 1 open.
    pub fn guest_connected(&self) -> bool {
        self.guest_connected
    }

    /// The socket events the device waits for now: input only while the
    /// guest has the port open and may have receive buffers, output only
    /// while a transmit chain waits for room.
    pub fn socket_interest(&self) -> EventSet {
        let mut set = EventSet::empty();
        if self.active.is_none() || !self.host_connected {
            return set;
        }
        if self.guest_connected && !self.rx_starved {
            set |= EventSet::IN;
        }
        if self.tx_blocked {
            set |= EventSet::OUT;
        }
        set
    }

    /// Serves queue `index` after the guest notified it.
    pub fn process_queue(&mut self, index: usize) -> Result<(), ConsoleError> {
        match index {
            queues::CONTROL_TX => self.process_control_tx()?,
            queues::PORT1_RX => {
                self.rx_starved = false;
                self.process_port_rx()?;
            }
            queues::PORT1_TX => self.process_port_tx()?,
            queues::PORT0_TX => self.process_port0_tx()?,
            // Control receive buffers are used below; port 0 never
            // receives anything.
            _ => {}
        }
        self.flush_control()
    }

    /// Serves the socket after the event loop reported an event on it
    /// (which one does not matter: a blocked transmit chain is retried,
    /// and reading tells input from a hang-up or an error).
    pub fn process_socket(&mut self) -> Result<(), ConsoleError> {
        if self.tx_blocked {
            self.tx_blocked = false;
            self.process_port_tx()?;
        }
        // Does nothing while the port is closed or no buffer is posted.
        self.process_port_rx()?;
        self.flush_control()
    }

    /// Queues a message for the guest's control receive queue.
    fn push_control(&mut self, msg: DeviceMessage<'_>) {
        let mut bytes = Vec::new();
        if let Err(e) = control::encode(&msg, &mut bytes) {
            tracing::error!("virtio-console: cannot encode {msg:?}: {e}");
            return;
        }
        if self.control_out.len() >= MAX_PENDING_CONTROL {
            self.metrics.control_ignored.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.control_out.push_back(bytes);
    }

    /// The driver's control messages (it busy-waits for each to be used).
    fn process_control_tx(&mut self) -> Result<(), ConsoleError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let metrics = &self.metrics.queues;
        let q = &mut active.queues[queues::CONTROL_TX];
        let mut used = false;
        let mut messages = Vec::new();
        for _ in 0..q.size() {
            let Some((head, chain)) = queue::pop(q, &active.mem, Direction::DeviceReads) else {
                break;
            };
            match chain
                .map_err(Refused::from)
                .and_then(|c| read_control(&c, &active.mem))
            {
                Ok(msg) => {
                    metrics.chains.fetch_add(1, Ordering::Relaxed);
                    messages.push(msg);
                }
                Err(e) => {
                    metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("virtio-console: control message at head {head} refused: {e}");
                }
            }
            used |= queue::complete(q, &active.mem, head, 0)?;
        }
        if used {
            active.signal(queues::CONTROL_TX)?;
        }
        for msg in messages {
            self.handle_control(msg)?;
        }
        Ok(())
    }

    fn handle_control(&mut self, msg: GuestMessage) -> Result<(), ConsoleError> {
        match msg {
            GuestMessage::DeviceReady { ok: true } => {
                self.push_control(DeviceMessage::DeviceAdd { id: AGENT_PORT });
            }
            GuestMessage::DeviceReady { ok: false } => {
                tracing::warn!("virtio-console: the guest's driver failed to set up the device");
            }
            GuestMessage::PortReady {
                id: AGENT_PORT,
                ok: true,
            } => {
                self.push_control(DeviceMessage::PortName {
                    id: AGENT_PORT,
                    name: self.name,
                });
                if self.host_connected {
                    self.push_control(DeviceMessage::PortOpen {
                        id: AGENT_PORT,
                        open: true,
                    });
                }
            }
            GuestMessage::PortReady {
                id: AGENT_PORT,
                ok: false,
            } => {
                tracing::warn!("virtio-console: the guest's driver failed to set up port 1");
            }
            GuestMessage::PortOpen {
                id: AGENT_PORT,
                open,
            } => {
                tracing::debug!(
                    "virtio-console: the guest {} port 1",
                    if open { "opened" } else { "closed" }
                );
                self.guest_connected = open;
                if open {
                    self.rx_starved = false;
                    self.process_port_rx()?;
                }
            }
            other => {
                self.metrics.control_ignored.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("virtio-console: {other:?} names a port never announced");
            }
        }
        Ok(())
    }

    /// Writes waiting control messages into the guest's control receive
    /// buffers, one message per buffer.
    fn flush_control(&mut self) -> Result<(), ConsoleError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let metrics = &self.metrics.queues;
        let q = &mut active.queues[queues::CONTROL_RX];
        let mut used = false;
        for _ in 0..q.size() {
            let Some(msg) = self.control_out.front() else {
                break;
            };
            let Some((head, chain)) = queue::pop(q, &active.mem, Direction::DeviceWrites) else {
                break;
            };
            let result = chain.map_err(Refused::from).and_then(|c| {
                if (c.writable_len() as usize) < msg.len() {
                    return Err(Refused::TooSmall {
                        need: msg.len(),
                        have: c.writable_len(),
                    });
                }
                Ok(c.writer(&active.mem).write(msg)?)
            });
            let len = match result {
                Ok(n) => {
                    metrics.chains.fetch_add(1, Ordering::Relaxed);
                    metrics.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
                    self.control_out.pop_front();
                    n as u32
                }
                Err(e) => {
                    metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("virtio-console: control buffer at head {head} refused: {e}");
                    0
                }
            };
            used |= queue::complete(q, &active.mem, head, len)?;
        }
        if used {
            active.signal(queues::CONTROL_RX)?;
        }
        Ok(())
    }

    /// Port 1's transmit queue: the guest's bytes to the socket.
    fn process_port_tx(&mut self) -> Result<(), ConsoleError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        self.tx_blocked = false;
        let metrics = &self.metrics;
        let mut used = false;
        let mut budget = TX_BUDGET;
        let mut hung_up = false;
        let size = active.queues[queues::PORT1_TX].size();
        for _ in 0..size {
            let q = &mut active.queues[queues::PORT1_TX];
            if self.tx.is_none() {
                let Some((head, chain)) = queue::pop(q, &active.mem, Direction::DeviceReads) else {
                    break;
                };
                match chain {
                    Err(e) => {
                        metrics.queues.bad_chains.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("virtio-console: port 1 chain at head {head} refused: {e}");
                        used |= queue::complete(q, &active.mem, head, 0)?;
                        continue;
                    }
                    Ok(c) if !self.host_connected => {
                        metrics.queues.chains.fetch_add(1, Ordering::Relaxed);
                        metrics
                            .bytes_dropped
                            .fetch_add(u64::from(c.readable_len()), Ordering::Relaxed);
                        used |= queue::complete(q, &active.mem, head, 0)?;
                        continue;
                    }
                    Ok(chain) => self.tx = Some(TxPending { chain, sent: 0 }),
                }
            }
            let Some(pending) = self.tx.as_mut() else {
                break;
            };
            let sent = send_chain(
                &self.stream,
                &active.mem,
                pending,
                &mut self.buf,
                &mut budget,
                metrics,
            );
            let head = pending.chain.head;
            match sent {
                Sent::All => {
                    metrics.queues.chains.fetch_add(1, Ordering::Relaxed);
                    self.tx = None;
                    used |= queue::complete(q, &active.mem, head, 0)?;
                }
                Sent::Blocked => {
                    self.tx_blocked = true;
                    break;
                }
                Sent::Budget => {
                    // Come back through the event loop, after the others.
                    if let Err(e) = self.queue_events[queues::PORT1_TX].write(1) {
                        tracing::error!("virtio-console: cannot re-arm port 1's queue: {e}");
                    }
                    break;
                }
                Sent::HungUp(e) => {
                    tracing::debug!("virtio-console: the host side of port 1 is gone: {e}");
                    hung_up = true;
                    break;
                }
                Sent::Refused(e) => {
                    metrics.queues.bad_chains.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("virtio-console: port 1 chain at head {head} refused: {e}");
                    self.tx = None;
                    used |= queue::complete(q, &active.mem, head, 0)?;
                }
            }
        }
        if used {
            active.signal(queues::PORT1_TX)?;
        }
        if hung_up {
            self.hang_up()?;
        }
        Ok(())
    }

    /// Port 1's receive queue: the socket's bytes into the guest's buffers.
    fn process_port_rx(&mut self) -> Result<(), ConsoleError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        if !self.host_connected || !self.guest_connected {
            return Ok(());
        }
        let metrics = &self.metrics.queues;
        let mut used = false;
        let mut hung_up = false;
        let q = &mut active.queues[queues::PORT1_RX];
        for _ in 0..q.size() {
            if self.rx.is_none() {
                match queue::pop(q, &active.mem, Direction::DeviceWrites) {
                    None => {
                        self.rx_starved = true;
                        break;
                    }
                    Some((head, Err(e))) => {
                        metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            "virtio-console: port 1 buffer at head {head} refused: {e}"
                        );
                        used |= queue::complete(q, &active.mem, head, 0)?;
                        continue;
                    }
                    Some((_, Ok(chain))) => self.rx = Some(chain),
                }
            }
            let Some(chain) = self.rx.as_ref() else {
                break;
            };
            let want = (chain.writable_len() as usize).min(CHUNK);
            self.buf.resize(want, 0);
            match (&self.stream).read(&mut self.buf[..want]) {
                Ok(0) => {
                    hung_up = true;
                    break;
                }
                Ok(n) => {
                    let head = chain.head;
                    let len = match chain.writer(&active.mem).write(&self.buf[..n]) {
                        Ok(w) => {
                            metrics.chains.fetch_add(1, Ordering::Relaxed);
                            metrics.bytes_written.fetch_add(w as u64, Ordering::Relaxed);
                            w as u32
                        }
                        Err(e) => {
                            metrics.bad_chains.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!("virtio-console: port 1 buffer at head {head}: {e}");
                            0
                        }
                    };
                    self.rx = None;
                    used |= queue::complete(q, &active.mem, head, len)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("virtio-console: cannot read the host side of port 1: {e}");
                    hung_up = true;
                    break;
                }
            }
        }
        if used {
            active.signal(queues::PORT1_RX)?;
        }
        if hung_up {
            self.hang_up()?;
        }
        Ok(())
    }

    /// Port 0 is never announced: what a guest sends there is dropped.
    fn process_port0_tx(&mut self) -> Result<(), ConsoleError> {
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let metrics = &self.metrics;
        let used = queue::drain(
            &mut active.queues[queues::PORT0_TX],
            &active.mem,
            Direction::DeviceReads,
            &metrics.queues,
            |chain| {
                metrics
                    .bytes_dropped
                    .fetch_add(u64::from(chain.readable_len()), Ordering::Relaxed);
                Ok(0)
            },
        )?;
        if used {
            active.signal(queues::PORT0_TX)?;
        }
        Ok(())
    }

    /// The host side of port 1 hung up: what the guest was sending is
    /// dropped, and the guest told (`PORT_OPEN` 0: its reads then end).
    fn hang_up(&mut self) -> Result<(), ConsoleError> {
        if !self.host_connected {
            return Ok(());
        }
        self.host_connected = false;
        self.tx_blocked = false;
        if let (Some(pending), Some(active)) = (self.tx.take(), self.active.as_mut()) {
            self.metrics.bytes_dropped.fetch_add(
                u64::from(pending.chain.readable_len() - pending.sent),
                Ordering::Relaxed,
            );
            if queue::complete(
                &mut active.queues[queues::PORT1_TX],
                &active.mem,
                pending.chain.head,
                0,
            )? {
                active.signal(queues::PORT1_TX)?;
            }
        }
        self.push_control(DeviceMessage::PortOpen {
            id: AGENT_PORT,
            open: false,
        });
        Ok(())
    }
}

/// Reads one control message out of a validated chain.
fn read_control(chain: &ValidChain, mem: &GuestMemoryMmap) -> Result<GuestMessage, Refused> {
    let len = chain.readable_len() as usize;
    if len > HEADER_LEN {
        return Err(ControlError::TooLong(len).into());
    }
    let mut bytes = [0u8; HEADER_LEN];
    let n = chain.reader(mem).read(&mut bytes)?;
    Ok(control::parse_guest(&bytes[..n], MAX_PORTS)?)
}

/// Sends what is left of `pending` to the socket, from guest memory, in
/// chunks of at most [`CHUNK`] bytes and `budget` bytes in all.
fn send_chain(
    stream: &UnixStream,
    mem: &GuestMemoryMmap,
    pending: &mut TxPending,
    buf: &mut Vec<u8>,
    budget: &mut usize,
    metrics: &ConsoleMetrics,
) -> Sent {
    let total = pending.chain.readable_len();
    while pending.sent < total {
        if *budget == 0 {
            return Sent::Budget;
        }
        let want = ((total - pending.sent) as usize).min(CHUNK).min(*budget);
        buf.resize(want, 0);
        let mut reader = pending.chain.reader(mem);
        reader.skip(pending.sent);
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => {
                return Sent::Refused(ChainError::ShortRead {
                    need: want,
                    have: 0,
                })
            }
            Ok(n) => n,
            Err(e) => return Sent::Refused(e),
        };
        match send(stream, &buf[..n]) {
            Ok(0) => return Sent::HungUp(io::ErrorKind::WriteZero.into()),
            Ok(k) => {
                // `k <= n <= CHUNK`, which fits a u32.
                pending.sent += k as u32;
                *budget = budget.saturating_sub(k);
                metrics.bytes_to_host.fetch_add(k as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Sent::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Sent::HungUp(e),
        }
    }
    Sent::All
}

/// `send(2)` without `SIGPIPE` (a host side that hung up is an error
/// here, not a signal to the whole VMM) and without blocking.
fn send(stream: &UnixStream, data: &[u8]) -> io::Result<usize> {
    // SAFETY: `data` is a live slice of `data.len()` bytes that send(2)
    // only reads, and the descriptor is `stream`'s, open while it is
    // borrowed.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        TYPE_CONSOLE
    }

    fn features(&self) -> u64 {
        F_VERSION_1 | F_MULTIPORT
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_events
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_console_config: le16 cols, le16 rows (meaningful
        // only with VIRTIO_CONSOLE_F_SIZE, not offered), le32
        // max_nr_ports, le32 emerg_wr (write-only, not offered).
        let mut config = [0u8; 12];
        config[4..8].copy_from_slice(&MAX_PORTS.to_le_bytes());
        data.fill(0);
        if let Some(src) = usize::try_from(offset).ok().and_then(|o| config.get(o..)) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(
        &mut self,
        mem: GuestMemoryMmap,
        features: u64,
        queues: Vec<Queue>,
        interrupt: Arc<Interrupt>,
    ) -> Result<(), ActivateError> {
        // Without MULTIPORT a driver sets up two queues; this device has
        // no port-0-only mode.
        if features & F_MULTIPORT == 0 {
            return Err(ActivateError::MissingFeature("VIRTIO_CONSOLE_F_MULTIPORT"));
        }
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
        self.active = None;
        self.guest_connected = false;
        self.control_out.clear();
        self.tx = None;
        self.tx_blocked = false;
        self.rx = None;
        self.rx_starved = false;
    }
}
