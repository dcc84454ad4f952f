//! The VMM backend interface. The microvm tier describes the VM once
//! ([`VmConfig`]); a backend starts it and hands back its processes. The
//! guest (kernel, agent, protocol) and the share layout are the same for
//! every backend.

use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};

pub mod builtin;
pub mod choice;
pub mod jail;
pub mod qemu;
pub mod qmp;

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot set up {what}: {source}")]
    Setup {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot build the VMM's jail: {0}")]
    Jail(#[from] jail::JailError),
    #[error("cannot change the guest's RAM: {0}")]
    GuestRam(#[from] qmp::QmpError),
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// What the VMM's processes are called (the container id), so `ps`
    /// on the host tells which container they run.
    pub name: String,
    pub kernel: PathBuf,
    /// An initramfs to load beside the kernel; `None` when the guest's
    /// root is the virtio-fs share (the agent is in it: see
    /// `protocol::SHARE_INIT`), which the command line then names.
    pub initramfs: Option<PathBuf>,
    pub cmdline: String,
    pub vcpus: u32,
    /// The VM's RAM: the most the guest can ever use.
    pub memory_mib: u64,
    /// A balloon, so that the guest can be given less than `memory_mib`
    /// and more later ([`Vm::take_guest_ram`]); only where it is used
    /// (probing it costs every boot a little, and its free page
    /// reporting gave back nothing measurable from an idle guest).
    pub balloon: bool,
    /// Host directory exported to the guest with the tag
    /// `protocol::SHARE_TAG`.
    pub share_dir: PathBuf,
    /// Name of the unix socket in `run_dir` the supervisor listens on; the
    /// backend connects to it and hands the connection to the VMM, which
    /// joins it to the guest's control port.
    pub control_socket: PathBuf,
    /// Where the guest's serial console goes.
    pub console_log: PathBuf,
    /// A private directory for the backend's own sockets, logs and the
    /// VMM's jail root (socket names in it are short whatever its path:
    /// see `sock`).
    pub run_dir: PathBuf,
    pub kvm: bool,
    /// One virtio NIC per tap, in order.
    pub nics: Vec<super::net::Nic>,
    /// Who the jailed VMM runs as.
    pub vmm_user: jail::Identity,
}

/// How a part of a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    /// Which part: "qemu", "virtiofsd", a vCPU thread…
    pub part: &'static str,
    /// What ended it, as a person reads it ("exit status: 1", "signal: 9").
    pub how: String,
}

/// A running VM, whatever runs it. The supervisor starts it through a
/// [`Backend`], watches it, and stops it. Pause and resume freeze the VM's
/// host cgroup, which holds every backend's processes and threads, unless
/// the VMM pauses the guest itself ([`Vm::pauser`]).
pub trait Vm: Send {
    /// The first part of the VM that has ended, if any: the VM is lost.
    fn exited(&mut self) -> Option<Exited>;
    /// Stops the VM at once and waits until it is gone.
    fn kill(&mut self);
    /// Host processes that run the VM besides the supervisor (none for an
    /// in-process VMM): the only ones the jailed supervisor may signal.
    fn host_pids(&self) -> Vec<i32>;
    /// The host processes by name (`qemu`, `virtiofsd`, ...), as
    /// [`Vm::host_pids`].
    fn host_processes(&self) -> Vec<(&'static str, i32)> {
        self.host_pids().into_iter().map(|p| ("vmm", p)).collect()
    }
    /// The control of how much of its RAM the guest may use (a balloon
    /// holds the rest), handed out once; `None` where the VMM has none.
    fn take_guest_ram(&mut self) -> Option<Box<dyn GuestRam>>;
    /// What the VMM counts for this VM, readable from any thread while
    /// it runs; `None` from a VMM that counts nothing of its own (QEMU).
    fn counters(&self) -> Option<std::sync::Arc<dyn Counters>> {
        None
    }
    /// The VMM's own pause of the whole VM, where it has one (the builtin
    /// VMM parks its vCPUs), the base of a VM snapshot; a container's
    /// `pause` does not use it (the guest freezes the container's cgroup).
    fn pauser(&self) -> Option<std::sync::Arc<dyn Pauser>> {
        None
    }
}

/// The VMM's own counters of a running VM (`events --stats`, the boot
/// trace's first instruction).
pub trait Counters: Send + Sync {
    fn read(&self) -> crate::protocol::VmmCounters;
}

/// Stops the guest's vCPUs and lets them go on, the VMM's own way.
pub trait Pauser: Send + Sync {
    /// Returns once no vCPU runs guest code.
    fn pause(&self) -> Result<(), String>;
    fn resume(&self);
    fn paused(&self) -> bool;
}

/// Sets how much of the VM's RAM the guest may use: a balloon in the guest
/// holds the rest, which the host then does not back. A raise gives the
/// guest back what a lower target took (up to the VM's RAM).
pub trait GuestRam: Send {
    fn set_guest_ram(&mut self, mib: u64) -> Result<(), VmmError>;
    /// The connection behind it, for a pooled VM's keeper to hand over
    /// (`microvm::pool`); `None` when it cannot be.
    fn handover_fd(&self) -> Option<RawFd> {
        None
    }
}

impl GuestRam for qmp::Qmp {
    fn set_guest_ram(&mut self, mib: u64) -> Result<(), VmmError> {
        Ok(qmp::Qmp::set_guest_ram(self, mib)?)
    }

    fn handover_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.stream().as_raw_fd())
    }
}

/// A VMM implementation: boots a [`VmConfig`].
pub trait Backend {
    fn name(&self) -> &'static str;
    fn launch(&self, config: &VmConfig) -> Result<Box<dyn Vm>, VmmError>;
}

/// The backend `create` chose for a container ([`choice::for_container`],
/// which refuses the builtin VMM while it is incomplete), as the host was
/// probed for it.
pub fn for_host(host: &crate::microvm::host::Host) -> Box<dyn Backend> {
    use crate::microvm::host::HostVmm;
    match &host.vmm {
        HostVmm::Builtin => Box::new(builtin::backend::Builtin),
        HostVmm::Qemu { qemu, virtiofsd } => Box::new(qemu::Qemu {
            qemu: qemu.clone(),
            virtiofsd: virtiofsd.clone(),
        }),
    }
}

/// One helper process of a VM: what it is, the child, and the file its
/// stderr goes to.
pub struct Helper {
    pub name: &'static str,
    pub child: Child,
    pub log: Option<PathBuf>,
}

/// A VM made of helper processes (the VMM first), children of the
/// supervisor that die with it.
pub struct ProcessVm {
    pub processes: Vec<Helper>,
    /// The VMM's control of the guest's RAM, until taken.
    pub guest_ram: Option<Box<dyn GuestRam>>,
}

/// The last `window` bytes of a log that the guest (or a VMM echoing it)
/// writes into, with every character but newlines and printable ASCII
/// blanked, for quoting in an error.
pub(crate) fn printable_tail(path: &std::path::Path, window: usize) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let start = bytes.len().saturating_sub(window);
    Some(
        String::from_utf8_lossy(&bytes[start..])
            .chars()
            .map(|c| {
                if c == '\n' || (' '..='~').contains(&c) {
                    c
                } else {
                    ' '
                }
            })
            .collect(),
    )
}

/// Most bytes of a helper's log quoted when it ends.
const LOG_TAIL: usize = 300;

/// The last non-empty line of a helper's log, printable ASCII only and
/// bounded (a VMM may echo what the guest made it say).
fn last_line(path: &std::path::Path) -> Option<String> {
    let text = printable_tail(path, 8 * 1024)?;
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let cut = line.len().saturating_sub(LOG_TAIL);
    Some(line[cut..].to_string())
}

impl Vm for ProcessVm {
    fn exited(&mut self) -> Option<Exited> {
        for h in &mut self.processes {
            if let Ok(Some(status)) = h.child.try_wait() {
                let said = h.log.as_deref().and_then(last_line);
                return Some(Exited {
                    part: h.name,
                    how: match said {
                        Some(line) => format!("{status}: {line}"),
                        None => status.to_string(),
                    },
                });
            }
        }
        None
    }

    fn kill(&mut self) {
        for h in &mut self.processes {
            let _ = h.child.kill();
        }
        for h in &mut self.processes {
            let _ = h.child.wait();
        }
    }

    fn host_pids(&self) -> Vec<i32> {
        self.processes.iter().map(|h| h.child.id() as i32).collect()
    }

    fn host_processes(&self) -> Vec<(&'static str, i32)> {
        self.processes
            .iter()
            .map(|h| (h.name, h.child.id() as i32))
            .collect()
    }

    fn take_guest_ram(&mut self) -> Option<Box<dyn GuestRam>> {
        self.guest_ram.take()
    }
}

/// Makes a helper process die with its supervisor, so a SIGKILLed
/// supervisor never leaves a VM behind. A change of uid clears the
/// setting: register this after [`jail::install`].
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls
    // prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may already be gone.
            if libc::getppid() == 1 {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Puts the descriptors `fds` at `first`, `first` + 1, … in the child,
/// whatever their numbers in the parent (they stay open in the parent;
/// the caller keeps them until the spawn returns).
pub fn place_fds(cmd: &mut Command, fds: Vec<RawFd>, first: RawFd) {
    // SAFETY: runs between fork and exec; fcntl and dup2 are
    // async-signal-safe, the vector was built before the fork and is only
    // read, and the descriptors are open (the caller holds them).
    unsafe {
        cmd.pre_exec(move || {
            // First out of the way of the target numbers, then onto them.
            // The high copies are close-on-exec.
            let mut high = [0 as RawFd; 64];
            if fds.len() > high.len() {
                return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
            }
            for (i, fd) in fds.iter().enumerate() {
                let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 256);
                if h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                high[i] = h;
            }
            for (i, h) in high[..fds.len()].iter().enumerate() {
                if libc::dup2(*h, first + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Lets a helper process inherit no descriptor from `first` up: they are
/// all marked close-on-exec just before the exec (descriptors opened
/// without O_CLOEXEC by a library would otherwise leak into the VMM).
pub fn inherit_below(cmd: &mut Command, first: u32) {
    // SAFETY: the closure runs between fork and exec and only makes the
    // close_range system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let rc = libc::syscall(
                libc::SYS_close_range,
                first,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
