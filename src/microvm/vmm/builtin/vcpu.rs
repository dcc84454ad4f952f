//! A vCPU's run loop: its exits dispatched to the port-I/O and MMIO
//! buses, until the guest stops the VM.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use kvm_ioctls::{VcpuExit, VcpuFd};

use super::bus::Bus;

/// Why a vCPU stopped running the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The guest pulsed the reset line (i8042 0xfe, Linux's `reboot=k`):
    /// how the guest ends the VM.
    Reset,
    /// A triple fault: the guest crashed (or `reboot=t`).
    Shutdown,
    /// `hlt` with no in-kernel interrupt controller to wake it.
    Halted,
    /// A `KVM_EXIT_SYSTEM_EVENT` of this type (PSCI-style shutdown/reset).
    SystemEvent(u32),
    /// The VMM asked the vCPU to stop.
    Requested,
}

impl StopReason {
    fn code(self) -> u8 {
        match self {
            StopReason::Reset => 1,
            StopReason::Shutdown => 2,
            StopReason::Halted => 3,
            StopReason::SystemEvent(_) => 4,
            StopReason::Requested => 5,
        }
    }

    fn from_code(code: u8) -> Option<StopReason> {
        Some(match code {
            1 => StopReason::Reset,
            2 => StopReason::Shutdown,
            3 => StopReason::Halted,
            4 => StopReason::SystemEvent(0),
            5 => StopReason::Requested,
            _ => return None,
        })
    }
}

/// Set by a device (the reset line) or the VMM; every vCPU checks it
/// after each exit.
#[derive(Debug, Default)]
pub struct StopSignal(AtomicU8);

impl StopSignal {
    /// The first request wins.
    pub fn request(&self, why: StopReason) {
        let _ = self
            .0
            .compare_exchange(0, why.code(), Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn requested(&self) -> Option<StopReason> {
        StopReason::from_code(self.0.load(Ordering::SeqCst))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("vCPU {index}: KVM_RUN failed: {source}")]
    Run {
        index: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {index}: the guest could not be entered (hardware reason {reason:#x})")]
    FailEntry { index: u32, reason: u64 },
    #[error("vCPU {index}: KVM internal error")]
    Internal { index: u32 },
    #[error("vCPU {index}: unexpected exit {exit}")]
    Unexpected { index: u32, exit: String },
}

pub struct Vcpu {
    pub index: u32,
    pub fd: VcpuFd,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    stop: Arc<StopSignal>,
    park: Arc<super::park::Park>,
    /// The VM's counters, which every vCPU adds to.
    pub metrics: Arc<super::metrics::VmMetrics>,
}

impl Vcpu {
    pub fn new(
        index: u32,
        fd: VcpuFd,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        stop: Arc<StopSignal>,
        park: Arc<super::park::Park>,
        metrics: Arc<super::metrics::VmMetrics>,
    ) -> Vcpu {
        Vcpu {
            index,
            fd,
            pio,
            mmio,
            stop,
            park,
            metrics,
        }
    }

    /// Runs the guest until it stops the VM, the VMM asks (through the
    /// [`StopSignal`]), or KVM fails.
    pub fn run(&mut self) -> Result<StopReason, VcpuError> {
        let index = self.index;
        loop {
            if let Some(why) = self.stop.requested() {
                return Ok(why);
            }
            // Paused: no guest instruction until resumed (or stopped).
            self.park.wait_while_paused(&self.stop);
            if let Some(why) = self.stop.requested() {
                return Ok(why);
            }
            self.metrics.entering_guest();
            let exit = match self.fd.run() {
                Ok(exit) => exit,
                // A signal kicked the vCPU out: look at the stop signal.
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
                Err(source) => return Err(VcpuError::Run { index, source }),
            };
            self.metrics.count_exit();
            match exit {
                VcpuExit::IoIn(port, data) => {
                    self.metrics.count_pio();
                    self.pio.read(u64::from(port), data);
                }
                VcpuExit::IoOut(port, data) => {
                    self.metrics.count_pio();
                    self.pio.write(u64::from(port), data);
                }
                VcpuExit::MmioRead(addr, data) => {
                    self.metrics.count_mmio();
                    self.mmio.read(addr, data);
                }
                VcpuExit::MmioWrite(addr, data) => {
                    self.metrics.count_mmio();
                    self.mmio.write(addr, data);
                }
                VcpuExit::Hlt => return Ok(StopReason::Halted),
                VcpuExit::Shutdown => return Ok(StopReason::Shutdown),
                VcpuExit::SystemEvent(kind, _) => return Ok(StopReason::SystemEvent(kind)),
                VcpuExit::FailEntry(reason, _) => {
                    return Err(VcpuError::FailEntry { index, reason })
                }
                VcpuExit::InternalError => return Err(VcpuError::Internal { index }),
                VcpuExit::Intr => {}
                other => {
                    return Err(VcpuError::Unexpected {
                        index,
                        exit: format!("{other:?}"),
                    })
                }
            }
        }
    }
}
