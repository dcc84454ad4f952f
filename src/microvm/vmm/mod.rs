//! The VMM backend interface. The microvm tier describes the VM once
//! ([`VmConfig`]); a backend starts it and hands back its processes. The
//! guest (kernel, agent, protocol) and the share layout are the same for
//! every backend.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};

pub mod qemu;

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
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub cmdline: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Host directory exported to the guest with the tag
    /// `protocol::SHARE_TAG`.
    pub share_dir: PathBuf,
    /// Name of the unix socket in `run_dir` the supervisor listens on; the
    /// VMM connects it to the guest's control port.
    pub control_socket: PathBuf,
    /// Where the guest's serial console goes.
    pub console_log: PathBuf,
    /// A private directory for the backend's own sockets; the VMM runs in
    /// it, so socket names are short whatever its path (see `sock`).
    pub run_dir: PathBuf,
    pub kvm: bool,
    /// One virtio NIC per tap, in order.
    pub nics: Vec<super::net::Nic>,
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
/// [`Backend`], watches it, and stops it; pause and resume freeze the VM's
/// host cgroup, which holds every backend's processes and threads, so they
/// need nothing from the backend.
pub trait Vm: Send {
    /// The first part of the VM that has ended, if any: the VM is lost.
    fn exited(&mut self) -> Option<Exited>;
    /// Stops the VM at once and waits until it is gone.
    fn kill(&mut self);
    /// Host processes that run the VM besides the supervisor (none for an
    /// in-process VMM): the only ones the jailed supervisor may signal.
    fn host_pids(&self) -> Vec<i32>;
}

/// A VMM implementation: boots a [`VmConfig`].
pub trait Backend {
    fn name(&self) -> &'static str;
    fn launch(&self, config: &VmConfig) -> Result<Box<dyn Vm>, VmmError>;
}

/// The backend that runs microVMs on this host. QEMU is the only one so
/// far; a VMM of our own plugs in here.
pub fn for_host(host: &crate::microvm::host::Host) -> Box<dyn Backend> {
    Box::new(qemu::Qemu {
        qemu: host.qemu.clone(),
        virtiofsd: host.virtiofsd.clone(),
    })
}

/// A VM made of helper processes (the VMM first), children of the
/// supervisor that die with it.
pub struct ProcessVm {
    pub processes: Vec<(&'static str, Child)>,
}

impl Vm for ProcessVm {
    fn exited(&mut self) -> Option<Exited> {
        for (name, child) in &mut self.processes {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Exited {
                    part: name,
                    how: status.to_string(),
                });
            }
        }
        None
    }

    fn kill(&mut self) {
        for (_, child) in &mut self.processes {
            let _ = child.kill();
        }
        for (_, child) in &mut self.processes {
            let _ = child.wait();
        }
    }

    fn host_pids(&self) -> Vec<i32> {
        self.processes.iter().map(|(_, c)| c.id() as i32).collect()
    }
}

/// Makes a helper process die with its supervisor, so a SIGKILLed
/// supervisor never leaves a VM behind.
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
