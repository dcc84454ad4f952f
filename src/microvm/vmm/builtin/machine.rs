//! A whole VM built from the microvm tier's [`VmConfig`]: memfd memory of
//! `memory_mib`, the kernel and initramfs with the command line and the
//! devices' `virtio_mmio.device=` entries, `vcpus` vCPUs and the MP table
//! that tells the guest about them and the IO-APIC, the reset line,
//! virtio-rng, the agent's control port (virtio-console) when given its
//! host socket, the share (virtio-fs, tag [`crate::protocol::SHARE_TAG`])
//! when given its directory, one virtio-net per NIC given, and the serial
//! port only when asked for.
//! [`Machine::run`] runs it until the guest stops it: one thread per vCPU,
//! one for the devices' event loop and one for virtio-fs's (a slow host
//! file system must not hold up the control channel); the first vCPU to
//! stop stops the others, kicking them out of `KVM_RUN` with a signal.
//! With [`Options::jail`], each of those threads enters its jail
//! ([`super::jail`]) as it starts, and the thread that runs the machine
//! enters its own once it has started them.
//!
//! [`super::backend`] puts it behind the backend seam
//! ([`crate::microvm::vmm::Backend`]).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::Kvm;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::boot::{self, BootError};
use super::jail::{self, JailError, Role};
use super::legacy::i8042::{self, I8042};
use super::legacy::serial::{self, SerialPort};
use super::memory::{self, MemoryError};
use super::metrics::{MachineCounters, VmMetrics};
use super::mptable::{self, MpTableError};
use super::vcpu::{StopReason, StopSignal, Vcpu, VcpuError};
use super::virtio::console::{Console, ConsoleError};
use super::virtio::fs::{self as virtio_fs, Fs, FsError};
use super::virtio::net::{Net, NetError};
use super::virtio::rng::{Rng, RngError, Urandom};
use super::vm::{Vm, VmError};
use crate::microvm::vmm::VmConfig;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Rng(#[from] RngError),
    #[error("virtio-console: {0}")]
    Console(#[from] ConsoleError),
    #[error("virtio-fs: {0}")]
    Fs(#[from] FsError),
    #[error("virtio-net: {0}")]
    Net(#[from] NetError),
    #[error(transparent)]
    MpTable(#[from] MpTableError),
    #[error("cannot open /dev/kvm: {0}")]
    Kvm(#[source] kvm_ioctls::Error),
    #[error("cannot set up the serial port: {0}")]
    Serial(#[source] std::io::Error),
    #[error("a VM needs at least one vCPU")]
    NoVcpus,
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the signal that stops vCPUs: {0}")]
    Signal(#[source] vmm_sys_util::errno::Error),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    #[error("cannot jail the VMM's {role} thread: {source}")]
    Jail {
        role: &'static str,
        #[source]
        source: JailError,
    },
}

/// Jails the calling thread as `role`.
fn enter_jail(role: Role) -> Result<(), MachineError> {
    jail::enter(role).map_err(|source| MachineError::Jail {
        role: role.name(),
        source,
    })
}

/// Choices beyond the [`VmConfig`].
#[derive(Default)]
pub struct Options {
    /// Where the guest's serial console goes; `None` (the default) leaves
    /// the serial port out: each of its bytes would be a VM exit.
    pub serial: Option<File>,
    /// The entropy source of virtio-rng; `None` opens `/dev/urandom`.
    pub entropy: Option<Box<dyn super::virtio::rng::EntropySource>>,
    /// The host's end of the agent's control port: a virtio-console whose
    /// port 1 is [`crate::protocol::PORT_NAME`] in the guest. `None`
    /// leaves the device out.
    pub control: Option<std::os::unix::net::UnixStream>,
    /// The directory the guest mounts as [`crate::protocol::SHARE_TAG`]
    /// (its root, when booted from the share); `None` leaves virtio-fs
    /// out.
    pub share: Option<std::path::PathBuf>,
    /// The guest's NICs, in order (`eth0` first): each a virtio-net on
    /// its descriptor.
    pub nics: Vec<NicPort>,
    /// Whether each thread of the running machine jails itself
    /// ([`super::jail`]); the supervisor's VMs always do.
    pub jail: bool,
}

/// One NIC: the descriptor its frames go through (a tap set up with
/// [`super::virtio::net::tap::configure`], or a datagram socket that
/// carries the same header-first frames) and the guest's MAC.
pub struct NicPort {
    pub fd: std::os::fd::OwnedFd,
    pub mac: [u8; 6],
}

/// The virtio-mmio slot of the first NIC (after virtio-rng, the control
/// port and the share).
const FIRST_NIC_SLOT: u32 = 3;

pub struct Machine {
    pub vm: Vm,
    /// The memfd behind guest memory.
    pub memfd: File,
    pub vcpus: Vec<Vcpu>,
    pub rng: Arc<Mutex<Rng>>,
    pub console: Option<Arc<Mutex<Console>>>,
    pub fs: Option<Arc<Mutex<Fs>>>,
    pub nics: Vec<Arc<Mutex<Net>>>,
    pub serial: Option<Arc<Mutex<SerialPort<File>>>>,
    /// The command line the kernel was given.
    pub cmdline: String,
    /// Whether [`Machine::run`]'s threads jail themselves.
    pub jail: bool,
    /// The VM's and its devices' counters, readable while it runs.
    pub counters: MachineCounters,
}

/// A device's lock while the machine is built (no thread runs yet, so
/// none can have poisoned it).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Builds the VM that `config` describes.
pub fn build(config: &VmConfig, options: Options) -> Result<Machine, MachineError> {
    if config.vcpus == 0 {
        return Err(MachineError::NoVcpus);
    }
    let created = std::time::Instant::now();
    let kvm = Kvm::new().map_err(MachineError::Kvm)?;
    let memory = memory::create(config.memory_mib)?;
    let mut vm = Vm::new(kvm, memory.guest, true)?;
    // Timed from before /dev/kvm was opened (the vCPUs, made below, share it).
    vm.metrics = Arc::new(VmMetrics::new(created));
    vm.metrics.step("KVM VM and guest memory");
    vm.pio
        .insert(
            Arc::new(Mutex::new(I8042::new(vm.stop.clone()))),
            i8042::BASE,
            i8042::LEN,
        )
        .map_err(VmError::from)?;
    let serial = match options.serial {
        Some(out) => {
            let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Serial)?;
            vm.fd
                .register_irqfd(&irq, serial::IRQ)
                .map_err(|e| MachineError::Serial(std::io::Error::from_raw_os_error(e.errno())))?;
            let port = Arc::new(Mutex::new(SerialPort::new(irq, out)));
            vm.pio
                .insert(port.clone(), serial::BASE, serial::LEN)
                .map_err(VmError::from)?;
            Some(port)
        }
        None => None,
    };
    let entropy = match options.entropy {
        Some(e) => e,
        None => Box::new(Urandom::open()?),
    };
    let rng = Arc::new(Mutex::new(Rng::new(entropy)?));
    let (entry, _) = vm.add_virtio(0, rng.clone())?;
    let mut cmdline = format!("{} {entry}", config.cmdline.trim());
    let console = match options.control {
        Some(stream) => {
            let console = Arc::new(Mutex::new(Console::new(stream)?));
            let (entry, _) = vm.add_virtio(1, console.clone())?;
            cmdline.push(' ');
            cmdline.push_str(&entry);
            Some(console)
        }
        None => None,
    };
    let fs = match options.share {
        Some(dir) => {
            let fs = Fs::new(
                crate::protocol::SHARE_TAG,
                virtio_fs::sandbox::passthrough(&dir)?,
            )?;
            let fs = Arc::new(Mutex::new(fs));
            let (entry, _) = vm.add_virtio(2, fs.clone())?;
            cmdline.push(' ');
            cmdline.push_str(&entry);
            Some(fs)
        }
        None => None,
    };
    let mut nics = Vec::new();
    for (slot, port) in (FIRST_NIC_SLOT..).zip(options.nics) {
        let net = Arc::new(Mutex::new(Net::new(port.fd, port.mac)?));
        let (entry, _) = vm.add_virtio(slot, net.clone())?;
        cmdline.push(' ');
        cmdline.push_str(&entry);
        nics.push(net);
    }
    vm.metrics.step("devices");
    let initramfs = config.initramfs.as_deref();
    let start = boot::load(
        &vm.memory,
        &config.kernel,
        initramfs,
        &boot::cmdline(&cmdline)?,
    )?;
    mptable::write(&vm.memory, config.vcpus)?;
    vm.metrics.step("kernel loaded");
    let vcpus = (0..config.vcpus)
        .map(|i| vm.create_vcpu(i, (i == 0).then_some(start)))
        .collect::<Result<Vec<_>, _>>()?;
    vm.metrics.step("vCPUs");
    let counters = MachineCounters {
        vm: vm.metrics.clone(),
        rng: lock(&rng).metrics.clone(),
        console: console.as_ref().map(|c| lock(c).metrics.clone()),
        fs: fs.as_ref().map(|f| lock(f).metrics.clone()),
        nics: nics.iter().map(|n| lock(n).metrics.clone()).collect(),
    };
    Ok(Machine {
        counters,
        vm,
        memfd: memory.memfd,
        vcpus,
        rng,
        console,
        fs,
        nics,
        serial,
        cmdline,
        jail: options.jail,
    })
}

/// A vCPU's thread, and whether its run has returned.
type VcpuThread = (
    JoinHandle<Result<StopReason, MachineError>>,
    Arc<AtomicBool>,
);

/// The signal that kicks a vCPU thread out of `KVM_RUN`; its handler does
/// nothing (the interrupted ioctl returns `EINTR`, and the run loop looks
/// at the stop signal).
pub(crate) fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the kick signal's handler (process-wide, idempotent).
pub(crate) fn install_kick() -> Result<(), MachineError> {
    register_signal_handler(kick_signal(), on_kick).map_err(MachineError::Signal)
}

impl Machine {
    /// Runs the VM until the guest stops it (or a vCPU fails); returns why.
    pub fn run(self) -> Result<StopReason, MachineError> {
        install_kick()?;
        let Machine {
            vm,
            vcpus,
            rng,
            console,
            fs,
            nics,
            jail,
            ..
        } = self;
        let role = |r: Role| jail.then(|| (r, vm.stop.clone()));
        let devices_done = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        let mut devices: Vec<Subscriber> = vec![rng];
        if let Some(console) = console {
            devices.push(console);
        }
        for nic in nics {
            devices.push(nic);
        }
        loops.push(event_loop(
            "vmm-devices",
            devices,
            devices_done.clone(),
            role(Role::Devices),
        )?);
        if let Some(fs) = fs {
            match event_loop("vmm-fs", vec![fs], devices_done.clone(), role(Role::Fs)) {
                Ok(handle) => loops.push(handle),
                Err(e) => {
                    devices_done.store(true, Ordering::SeqCst);
                    for handle in loops {
                        let _ = handle.join();
                    }
                    return Err(e);
                }
            }
        }
        vm.metrics.step("device threads");
        let mut threads: Vec<VcpuThread> = Vec::new();
        for mut vcpu in vcpus {
            let stop = vm.stop.clone();
            let finished = Arc::new(AtomicBool::new(false));
            let done = finished.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{}", vcpu.index))
                .spawn(move || {
                    let result = match jail {
                        true => enter_jail(Role::Vcpu),
                        false => Ok(()),
                    }
                    .and_then(|()| vcpu.run().map_err(MachineError::Vcpu));
                    // The first vCPU to stop stops the VM.
                    stop.request(match &result {
                        Ok(why) => *why,
                        Err(_) => StopReason::Requested,
                    });
                    done.store(true, Ordering::SeqCst);
                    result
                });
            match spawned {
                Ok(handle) => {
                    use std::os::unix::thread::JoinHandleExt;
                    vm.park.register(handle.as_pthread_t());
                    threads.push((handle, finished));
                }
                Err(source) => {
                    vm.stop.request(StopReason::Requested);
                    vm.park.forget_threads();
                    kick_all(&threads);
                    devices_done.store(true, Ordering::SeqCst);
                    for handle in loops {
                        let _ = handle.join();
                    }
                    return Err(MachineError::Thread {
                        what: "vCPU",
                        source,
                    });
                }
            }
        }
        // Every thread is started: this one only waits, kicks and joins
        // from here on.
        let jailed = match jail {
            true => enter_jail(Role::Runner),
            false => Ok(()),
        };
        if jailed.is_err() {
            vm.stop.request(StopReason::Requested);
        }
        // Wait for the first stop, then kick every vCPU still in KVM_RUN
        // until all have returned (a kick that lands just before KVM_RUN
        // is lost, so it is repeated).
        while vm.stop.requested().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Not to be kicked by a pause once joined.
        vm.park.forget_threads();
        kick_all(&threads);
        let mut first_error = jailed.err();
        for (handle, _) in threads {
            match handle.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(MachineError::Panicked("vCPU"));
                }
            }
        }
        devices_done.store(true, Ordering::SeqCst);
        for handle in loops {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(MachineError::Panicked("device event loop"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(vm.stop.requested().unwrap_or(StopReason::Requested))
    }
}

/// A device in an event loop.
type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// Starts a thread named `name` running an event loop over `devices`
/// until `done`, jailed as `role` once the devices are in the loop.
fn event_loop(
    name: &'static str,
    devices: Vec<Subscriber>,
    done: Arc<AtomicBool>,
    jail: Option<(Role, Arc<StopSignal>)>,
) -> Result<JoinHandle<Result<(), MachineError>>, MachineError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || -> Result<(), MachineError> {
            let mut events: EventManager<Subscriber> =
                EventManager::new().map_err(|e| MachineError::Thread {
                    what: "device event loop",
                    source: std::io::Error::other(format!("{e:?}")),
                })?;
            for device in devices {
                events.add_subscriber(device);
            }
            if let Some((role, stop)) = jail {
                if let Err(e) = enter_jail(role) {
                    // The VM cannot run with its devices unserved.
                    stop.request(StopReason::Requested);
                    return Err(e);
                }
            }
            while !done.load(Ordering::SeqCst) {
                let _ = events.run_with_timeout(100);
            }
            Ok(())
        })
        .map_err(|source| MachineError::Thread {
            what: "device event loop",
            source,
        })
}

/// Kicks each vCPU thread that has not finished, until all have.
fn kick_all<T>(threads: &[(JoinHandle<T>, Arc<AtomicBool>)]) {
    loop {
        let mut running = false;
        for (handle, finished) in threads {
            if !finished.load(Ordering::SeqCst) {
                running = true;
                let _ = handle.kill(kick_signal());
            }
        }
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
