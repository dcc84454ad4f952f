//! The qemu backend: Debian's `qemu-system-x86_64 -M microvm`, KVM where
//! the host has hardware virtualization and TCG elsewhere, with the share
//! served by one `virtiofsd` over vhost-user.
//!
//! QEMU parses every device access of the guest, so it runs jailed
//! (`jail`): its own mount namespace whose root holds only its binary,
//! libraries, firmware and the guest's images, an unprivileged uid of its
//! own, no capabilities, and its own seccomp filter (`-sandbox`). It opens
//! no host path of ours: the control and vhost-user sockets are connected
//! by the supervisor and the console log is opened by it, all passed as
//! descriptors with the taps.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::jail::{self, Tree};
use super::{
    die_with_parent, inherit_below, place_fds, Backend, Helper, ProcessVm, Vm, VmConfig, VmmError,
};
use crate::protocol::{PORT_NAME, SHARE_TAG};

pub struct Qemu {
    pub qemu: PathBuf,
    pub virtiofsd: PathBuf,
}

/// virtiofsd's socket in the run directory.
const FS_SOCKET: &str = "virtiofsd.sock";
/// TCG translation cache bound, in MiB (`-accel tcg,tb-size=`): see
/// [`accel_args`].
pub const TCG_TB_MIB: u32 = 64;
/// virtiofsd gets its listening socket as this fd.
const VIRTIOFSD_FD: i32 = 3;
/// QEMU's first passed descriptor: the taps (one per NIC, in order), then
/// the control socket, the vhost-user socket, the console log and QEMU's
/// end of the QMP socketpair.
const FIRST_FD: RawFd = 3;
/// QEMU's root directory, in the run directory (mounted in the
/// supervisor's namespace only).
const JAIL_DIR: &str = "qemu-root";
/// Where the guest's kernel and initramfs (when it has one) are in QEMU's jail.
const JAILED_KERNEL: &str = "/vm/kernel";
const JAILED_INITRAMFS: &str = "/vm/initramfs";
/// The `-add-fd` set holding the console log.
const CONSOLE_FDSET: u32 = 1;

/// The numbers QEMU gets its descriptors at.
struct QemuFds {
    taps: Vec<RawFd>,
    control: RawFd,
    fs: RawFd,
    console: RawFd,
    /// Where the VM has a balloon to set.
    qmp: Option<RawFd>,
}

impl QemuFds {
    fn new(n: usize, balloon: bool) -> QemuFds {
        let after = FIRST_FD + n as RawFd;
        QemuFds {
            taps: (FIRST_FD..after).collect(),
            control: after,
            fs: after + 1,
            console: after + 2,
            qmp: balloon.then_some(after + 3),
        }
    }

    fn end(&self) -> RawFd {
        self.qmp.unwrap_or(self.console) + 1
    }
}

/// The accelerator and CPU: KVM with the host's CPU, or TCG with its
/// translation cache bounded. TCG reserves 1 GiB for translated code by
/// default and keeps what it fills resident; a microVM's boot, `create`
/// and an idle workload fill about 42 MiB of it. Bounded at 64 MiB it never
/// flushes on that path, and a busy guest cannot grow it further (a full
/// cache is flushed and refilled, not an error). Smaller bounds cost cold
/// start: `run` of `/bin/true`, interleaved, medians of 8 (2026-12-05):
/// default 1101 ms, 64 MiB 1045, 48 MiB 932, 32 MiB 1111, 8 MiB (6
/// rounds) 2224 ms against 1126 for the default; again on 2026-12-06,
/// create + start + wait + delete of `/bin/true`, medians of 10: 64 MiB
/// 776 ms, 32 MiB 894 ms, 16 MiB 1065 ms (boot and `create` fill 38 MiB).
///
/// TCG's CPU is `max` without ERMS and FSRM. With them the guest kernel
/// and libc copy and clear memory with `rep movsb`/`rep stosb`, which TCG
/// runs one byte per loop of a translated block (4096 rounds to clear a
/// page); without them, with loops of 8- and 16-byte moves. Same test, medians
/// of 10: 878 ms with them, 839 ms without (the guest's kernel boot and
/// container creation both faster).
pub fn accel_args(kvm: bool) -> Vec<String> {
    let args = if kvm {
        ["-accel", "kvm", "-cpu", "host,-arch-capabilities"].map(String::from)
    } else {
        [
            "-accel".to_string(),
            format!("tcg,tb-size={TCG_TB_MIB}"),
            "-cpu".to_string(),
            "max,-erms,-fsrm".to_string(),
        ]
    };
    args.to_vec()
}

/// vhost-net only where the device exists and with KVM: QEMU aborts on
/// vhost=on without it.
fn uses_vhost(config: &VmConfig) -> bool {
    config.kvm && Path::new("/dev/vhost-net").exists()
}

fn log_file(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

impl Qemu {
    /// The virtiofsd command and the listening socket it inherits; the
    /// caller keeps the listener open until the command is spawned.
    fn virtiofsd(&self, config: &VmConfig) -> Result<(Command, UnixListener), VmmError> {
        let listener =
            crate::microvm::sock::bind(&config.run_dir, FS_SOCKET).map_err(|source| {
                VmmError::Setup {
                    what: format!(
                        "virtiofsd socket {}",
                        config.run_dir.join(FS_SOCKET).display()
                    ),
                    source,
                }
            })?;
        let mut cmd = Command::new(&self.virtiofsd);
        cmd.arg("--fd")
            .arg(VIRTIOFSD_FD.to_string())
            .arg("--shared-dir")
            .arg(&config.share_dir)
            .args(["--cache", "auto", "--sandbox", "namespace"])
            .args(["--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Never the workload's stderr (the supervisor's, without a
            // terminal): its messages would land in `docker logs`.
            .stderr(log_file(&config.run_dir.join("virtiofsd.log")));
        let fd = listener.as_raw_fd();
        // SAFETY: runs between fork and exec; dup2 is async-signal-safe and
        // the listener's fd stays valid until spawn returns (the caller
        // holds the listener).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, VIRTIOFSD_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        die_with_parent(&mut cmd);
        inherit_below(&mut cmd, VIRTIOFSD_FD as u32 + 1);
        Ok((cmd, listener))
    }

    /// QEMU's root: its binary and libraries at their host paths, its
    /// accelerator module and firmware, the guest's kernel and initramfs,
    /// and the device nodes it opens. Built in the supervisor's private
    /// mount namespace under the run directory.
    fn jail(&self, config: &VmConfig) -> Result<PathBuf, VmmError> {
        let mut tree = Tree::create(&config.run_dir.join(JAIL_DIR))?;
        tree.bind(&self.qemu, true)?;
        for lib in jail::dependencies(&self.qemu)? {
            tree.bind(&lib, true)?;
        }
        // QEMU finds its modules and data relative to its own directory
        // (realpath of argv[0]: there is no /proc in the jail).
        let exe = std::fs::canonicalize(&self.qemu).map_err(|source| jail::JailError::Io {
            what: "resolve",
            path: self.qemu.clone(),
            source,
        })?;
        let prefix = exe
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"));
        if !config.kvm {
            // Debian builds TCG as a loadable module.
            let module = ["lib/x86_64-linux-gnu/qemu", "lib64/qemu", "lib/qemu"]
                .iter()
                .map(|d| prefix.join(d).join("accel-tcg-x86_64.so"))
                .find(|m| m.is_file());
            if let Some(module) = module {
                tree.bind(&module, true)?;
                for lib in jail::dependencies(&module)? {
                    tree.bind(&lib, true)?;
                }
            }
        }
        // Firmware: the microvm BIOS (qboot) and the PVH option ROM.
        let data = prefix.join("share/qemu");
        if data.is_dir() {
            tree.bind(&data, false)?;
        }
        tree.bind_as(&config.kernel, Path::new(JAILED_KERNEL))?;
        if let Some(initramfs) = &config.initramfs {
            tree.bind_as(initramfs, Path::new(JAILED_INITRAMFS))?;
        }
        for dev in ["/dev/null", "/dev/zero", "/dev/urandom"] {
            tree.device(Path::new(dev), 0o666, None)?;
        }
        if config.kvm {
            tree.device(Path::new("/dev/kvm"), 0o600, Some(config.vmm_user))?;
        }
        if uses_vhost(config) {
            tree.device(Path::new("/dev/vhost-net"), 0o600, Some(config.vmm_user))?;
        }
        Ok(tree.seal()?)
    }

    fn qemu_args(&self, config: &VmConfig, fds: &QemuFds) -> Vec<String> {
        let mem = config.memory_mib;
        let mut a: Vec<String> = Vec::new();
        let mut push = |s: &str| a.push(s.to_string());
        // The container's id, for `ps` on the host (a comma is doubled: it
        // separates QEMU's options).
        push("-name");
        push(&format!("guest=agentvm-{}", config.name.replace(',', ",,")));
        push("-M");
        push("microvm,acpi=off,memory-backend=mem,rtc=on");
        for arg in accel_args(config.kvm) {
            push(&arg);
        }
        push("-smp");
        push(&config.vcpus.to_string());
        push("-m");
        push(&format!("{mem}M"));
        push("-object");
        push(&format!("memory-backend-memfd,id=mem,size={mem}M,share=on"));
        for s in ["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"] {
            push(s);
        }
        push("-kernel");
        push(JAILED_KERNEL);
        if config.initramfs.is_some() {
            push("-initrd");
            push(JAILED_INITRAMFS);
        }
        push("-append");
        push(&config.cmdline);
        // The console log, opened by the supervisor: QEMU takes it from an
        // fd set, since it cannot open the file itself.
        push("-add-fd");
        push(&format!("fd={},set={CONSOLE_FDSET}", fds.console));
        push("-chardev");
        push(&format!("file,id=con,path=/dev/fdset/{CONSOLE_FDSET}"));
        push("-serial");
        push("chardev:con");
        push("-chardev");
        push(&format!("socket,id=fs0,fd={}", fds.fs));
        push("-device");
        push(&format!("vhost-user-fs-device,chardev=fs0,tag={SHARE_TAG}"));
        push("-device");
        push("virtio-serial-device");
        push("-chardev");
        push(&format!("socket,id=ctl,fd={}", fds.control));
        push("-device");
        push(&format!("virtserialport,chardev=ctl,name={PORT_NAME}"));
        push("-device");
        push("virtio-rng-device");
        // Every VM has a balloon with free page reporting: pages the guest
        // frees go back to the host (the agent lowers the kernel's reporting
        // threshold and gives back its page cache when idle: `guest::trim`).
        // Where the guest may use less than the VM's RAM (a limit below its
        // size: see `GuestRam`) the balloon also holds the rest; QMP, on a
        // socketpair, sets it.
        push("-device");
        push("virtio-balloon-device,free-page-reporting=on");
        if let Some(qmp) = fds.qmp {
            push("-chardev");
            push(&format!("socket,id=qmp,fd={qmp}"));
            push("-mon");
            push("chardev=qmp,mode=control");
        }
        let vhost = uses_vhost(config);
        for (i, nic) in config.nics.iter().enumerate() {
            push("-netdev");
            push(&format!(
                "tap,id=net{i},fd={}{}",
                fds.taps[i],
                if vhost { ",vhost=on" } else { "" }
            ));
            push("-device");
            push(&format!(
                "virtio-net-device,netdev=net{i},mac={}",
                crate::netlink::format_mac(&nic.mac)
            ));
        }
        // QEMU's own seccomp filter: no new processes, no privilege
        // changes, no obsolete system calls, no scheduler or resource
        // controls — a guest that takes over the emulator gets no further.
        push("-sandbox");
        push("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
        a
    }

    /// Builds QEMU's jail, connects the control socket, opens the console
    /// log and starts QEMU. The supervisor's copies of the descriptors
    /// close when this returns, so QEMU's are the only ones: its death is
    /// the channel's end.
    fn start_qemu(
        &self,
        config: &VmConfig,
        fs: &UnixStream,
    ) -> Result<(Helper, Option<super::qmp::Qmp>), VmmError> {
        let root = self.jail(config)?;
        let name = config.control_socket.to_string_lossy();
        let control = crate::microvm::sock::connect(&config.run_dir, &name).map_err(|source| {
            VmmError::Setup {
                what: format!("connect {}", config.run_dir.join(&*name).display()),
                source,
            }
        })?;
        let console = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&config.console_log)
            .map_err(|source| VmmError::Setup {
                what: format!("open {}", config.console_log.display()),
                source,
            })?;
        let qmp = if config.balloon {
            Some(UnixStream::pair().map_err(|source| VmmError::Setup {
                what: "the QMP socketpair".into(),
                source,
            })?)
        } else {
            None
        };
        let qemu_end = qmp.as_ref().map(|(_, theirs)| theirs);
        let qemu = self.spawn_qemu(config, &root, &control, fs, &console, qemu_end)?;
        Ok((qemu, qmp.map(|(ours, _)| super::qmp::Qmp::new(ours))))
    }

    /// Starts QEMU in its jail with `fds` (control, vhost-user, console,
    /// QMP) and the taps as its only descriptors besides stdio.
    fn spawn_qemu(
        &self,
        config: &VmConfig,
        root: &Path,
        control: &UnixStream,
        fs: &UnixStream,
        console: &std::fs::File,
        qmp: Option<&UnixStream>,
    ) -> Result<Helper, VmmError> {
        let fds = QemuFds::new(config.nics.len(), qmp.is_some());
        let log = config.run_dir.join("qemu.log");
        let mut cmd = Command::new(&self.qemu);
        cmd.args(self.qemu_args(config, &fds))
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&log));
        let mut passed: Vec<RawFd> = config.nics.iter().map(|n| n.tap.as_raw_fd()).collect();
        passed.extend([control.as_raw_fd(), fs.as_raw_fd(), console.as_raw_fd()]);
        passed.extend(qmp.map(|q| q.as_raw_fd()));
        place_fds(&mut cmd, passed, FIRST_FD);
        inherit_below(&mut cmd, fds.end() as u32);
        // The jail last but for the parent-death signal, which the change
        // of user would clear.
        jail::install(&mut cmd, root, config.vmm_user)?;
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|source| VmmError::Spawn {
            what: "qemu-system-x86_64 in its jail",
            source,
        })?;
        Ok(Helper {
            name: "qemu",
            child,
            log: Some(log),
        })
    }
}

impl Backend for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn launch(&self, config: &VmConfig) -> Result<Box<dyn Vm>, VmmError> {
        let (mut fs_cmd, listener) = self.virtiofsd(config)?;
        // QEMU's end of the vhost-user socket, connected here: virtiofsd
        // accepts it once it runs.
        let fs = crate::microvm::sock::connect(&config.run_dir, FS_SOCKET).map_err(|source| {
            VmmError::Setup {
                what: format!("connect {}", config.run_dir.join(FS_SOCKET).display()),
                source,
            }
        })?;
        let virtiofsd = fs_cmd.spawn().map_err(|source| VmmError::Spawn {
            what: "virtiofsd",
            source,
        })?;
        drop(listener);
        let mut vm = ProcessVm {
            processes: vec![Helper {
                name: "virtiofsd",
                child: virtiofsd,
                log: Some(config.run_dir.join("virtiofsd.log")),
            }],
            guest_ram: None,
        };
        // The jail is built while virtiofsd starts.
        match self.start_qemu(config, &fs) {
            Ok((qemu, qmp)) => {
                vm.processes.insert(0, qemu);
                vm.guest_ram = qmp.map(|q| Box::new(q) as Box<dyn super::GuestRam>);
                Ok(Box::new(vm))
            }
            Err(e) => {
                vm.kill();
                Err(e)
            }
        }
    }
}
