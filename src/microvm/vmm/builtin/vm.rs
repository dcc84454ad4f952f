//! A KVM virtual machine: guest memory registered with KVM, the
//! interrupt controller, the buses and the devices on them.

use std::sync::{Arc, Mutex};

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{IoEventAddress, Kvm, VmFd};
use vm_memory::{Address, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use super::bus::{Bus, BusError};
use super::cpu::{self, CpuError};
use super::layout;
use super::vcpu::{StopSignal, Vcpu};
use super::virtio::mmio::{reg, MmioTransport, WINDOW};
use super::virtio::{Interrupt, VirtioDevice};

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("cannot open /dev/kvm: {0}")]
    Open(#[source] kvm_ioctls::Error),
    #[error("cannot {what}: {source}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot create the interrupt of a virtio device: {0}")]
    Interrupt(#[source] std::io::Error),
    #[error("no virtio-mmio slot {0}: at most 19 devices")]
    NoSlot(u32),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Cpu(#[from] CpuError),
}

fn kvm_error(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

pub struct Vm {
    pub kvm: Kvm,
    pub fd: VmFd,
    pub memory: GuestMemoryMmap,
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub stop: Arc<StopSignal>,
    /// Where the vCPUs park while the VM is paused.
    pub park: Arc<super::park::Park>,
    /// What the VM counts (its vCPUs' exits, its first instruction).
    pub metrics: Arc<super::metrics::VmMetrics>,
    /// Kept alive for as long as KVM holds them as irqfds.
    interrupts: Vec<Arc<Interrupt>>,
    irqchip: bool,
}

impl Vm {
    /// A VM over `memory`; with `irqchip`, KVM's own PIC, IO-APIC and PIT
    /// (what a Linux guest needs; tests of bare guest programs go without,
    /// so that `hlt` exits).
    pub fn new(kvm: Kvm, memory: GuestMemoryMmap, irqchip: bool) -> Result<Vm, VmError> {
        let metrics = Arc::new(super::metrics::VmMetrics::default());
        let fd = kvm.create_vm().map_err(kvm_error("create a VM"))?;
        fd.set_tss_address(layout::KVM_TSS as usize)
            .map_err(kvm_error("set the TSS address"))?;
        if irqchip {
            fd.create_irq_chip()
                .map_err(kvm_error("create the interrupt controller"))?;
            let pit = kvm_pit_config {
                flags: KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            fd.create_pit2(pit).map_err(kvm_error("create the PIT"))?;
        }
        for (slot, region) in memory.iter().enumerate() {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|_| VmError::Kvm {
                    what: "find guest memory's host mapping",
                    source: kvm_ioctls::Error::new(libc::EFAULT),
                })?;
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: region.start_addr().raw_value(),
                memory_size: region.len(),
                userspace_addr: host as u64,
                flags: 0,
            };
            // SAFETY: the region is a live mapping of `region.len()` bytes
            // owned by `memory`, which the Vm keeps (and so outlives the VM
            // fd's use of it: the fd is dropped with the Vm, fields in
            // order, before the memory).
            unsafe { fd.set_user_memory_region(r) }.map_err(kvm_error("register guest memory"))?;
        }
        Ok(Vm {
            kvm,
            fd,
            memory,
            pio: Arc::new(Bus::new()),
            mmio: Arc::new(Bus::new()),
            stop: Arc::new(StopSignal::default()),
            park: Arc::default(),
            metrics,
            interrupts: Vec::new(),
            irqchip,
        })
    }

    /// Puts `device` in virtio-mmio slot `n` with its interrupt and queue
    /// notifications wired through KVM (irqfd, ioeventfds: a notification
    /// never leaves the kernel on its way to the device's event loop).
    /// Returns the `virtio_mmio.device=` entry for the command line, and
    /// the transport.
    pub fn add_virtio(
        &mut self,
        n: u32,
        device: Arc<Mutex<dyn VirtioDevice>>,
    ) -> Result<(String, Arc<Mutex<MmioTransport>>), VmError> {
        let (base, irq, entry) = layout::virtio_slot(n).ok_or(VmError::NoSlot(n))?;
        let interrupt = Arc::new(Interrupt::new().map_err(VmError::Interrupt)?);
        if self.irqchip {
            self.fd
                .register_irqfd(interrupt.eventfd(), irq)
                .map_err(kvm_error("register a device's irqfd"))?;
        }
        {
            let d = device.lock().unwrap_or_else(|e| e.into_inner());
            for (i, evt) in d.queue_events().iter().enumerate() {
                self.fd
                    .register_ioevent(
                        evt,
                        &IoEventAddress::Mmio(base + reg::QUEUE_NOTIFY),
                        i as u32,
                    )
                    .map_err(kvm_error("register a queue's ioeventfd"))?;
            }
        }
        let transport = Arc::new(Mutex::new(MmioTransport::new(
            self.memory.clone(),
            device,
            interrupt.clone(),
        )));
        self.mmio.insert(transport.clone(), base, WINDOW)?;
        self.interrupts.push(interrupt);
        Ok((entry, transport))
    }

    /// Creates vCPU `index`; with `entry`, set up for the PVH entry point.
    pub fn create_vcpu(
        &self,
        index: u32,
        entry: Option<super::boot::Entry>,
    ) -> Result<Vcpu, VmError> {
        let fd = self
            .fd
            .create_vcpu(u64::from(index))
            .map_err(kvm_error("create a vCPU"))?;
        // Every vCPU of a Linux guest gets CPUID and its LAPIC; only the
        // first enters the kernel, the others wait for the kernel's
        // INIT/SIPI inside KVM.
        if self.irqchip || entry.is_some() {
            cpu::setup_cpuid(&self.kvm, &fd, index)?;
        }
        if self.irqchip {
            cpu::setup_lapic(&fd, index)?;
        }
        if let Some(entry) = entry {
            cpu::write_gdt(&self.memory)?;
            cpu::setup_pvh(&fd, index, entry)?;
        }
        Ok(Vcpu::new(
            index,
            fd,
            self.pio.clone(),
            self.mmio.clone(),
            self.stop.clone(),
            self.park.clone(),
            self.metrics.clone(),
        ))
    }
}
