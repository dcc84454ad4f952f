//! The qemu backend: Debian's `qemu-system-x86_64 -M microvm`, KVM where
//! the host has hardware virtualization and TCG elsewhere, with the share
//! served by one `virtiofsd` over vhost-user.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{die_with_parent, inherit_below, Backend, ProcessVm, Vm, VmConfig, VmmError};
use crate::protocol::{PORT_NAME, SHARE_TAG};

pub struct Qemu {
    pub qemu: PathBuf,
    pub virtiofsd: PathBuf,
}

/// virtiofsd's socket in the run directory.
const FS_SOCKET: &str = "virtiofsd.sock";
/// virtiofsd gets its listening socket as this fd.
const VIRTIOFSD_FD: i32 = 3;
/// QEMU gets NIC i's tap as fd NIC_FD_BASE + i.
const NIC_FD_BASE: i32 = 3;

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
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(config.run_dir.join("virtiofsd.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
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

    fn qemu_args(&self, config: &VmConfig, fs_socket: &Path) -> Vec<String> {
        let mem = config.memory_mib;
        let mut a: Vec<String> = Vec::new();
        let mut push = |s: &str| a.push(s.to_string());
        push("-M");
        push("microvm,acpi=off,memory-backend=mem,rtc=on");
        if config.kvm {
            push("-accel");
            push("kvm");
            push("-cpu");
            push("host,-arch-capabilities");
        } else {
            push("-accel");
            push("tcg");
            push("-cpu");
            push("max");
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
        push(&config.kernel.to_string_lossy());
        push("-initrd");
        push(&config.initramfs.to_string_lossy());
        push("-append");
        push(&config.cmdline);
        push("-chardev");
        push(&format!(
            "file,id=con,path={}",
            config.console_log.display()
        ));
        push("-serial");
        push("chardev:con");
        push("-chardev");
        push(&format!("socket,id=fs0,path={}", fs_socket.display()));
        push("-device");
        push(&format!("vhost-user-fs-device,chardev=fs0,tag={SHARE_TAG}"));
        push("-device");
        push("virtio-serial-device");
        push("-chardev");
        push(&format!(
            "socket,id=ctl,path={}",
            config.control_socket.display()
        ));
        push("-device");
        push(&format!("virtserialport,chardev=ctl,name={PORT_NAME}"));
        push("-device");
        push("virtio-rng-device");
        // vhost-net only where the device exists and with KVM: QEMU aborts
        // on vhost=on without it.
        let vhost = config.kvm && Path::new("/dev/vhost-net").exists();
        for (i, nic) in config.nics.iter().enumerate() {
            push("-netdev");
            push(&format!(
                "tap,id=net{i},fd={}{}",
                NIC_FD_BASE + i as i32,
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
}

impl Backend for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn launch(&self, config: &VmConfig) -> Result<Box<dyn Vm>, VmmError> {
        let fs_socket = PathBuf::from(FS_SOCKET);
        let (mut fs_cmd, listener) = self.virtiofsd(config)?;
        let virtiofsd = fs_cmd.spawn().map_err(|source| VmmError::Spawn {
            what: "virtiofsd",
            source,
        })?;
        drop(listener);
        let mut vm = ProcessVm {
            processes: vec![("virtiofsd", virtiofsd)],
        };
        let mut cmd = Command::new(&self.qemu);
        // Socket paths are names in run_dir (see `sock`).
        cmd.args(self.qemu_args(config, &fs_socket))
            .current_dir(&config.run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(config.run_dir.join("qemu.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        die_with_parent(&mut cmd);
        let taps: Vec<i32> = config.nics.iter().map(|n| n.tap.as_raw_fd()).collect();
        // SAFETY: runs between fork and exec; fcntl and dup2 are
        // async-signal-safe and the taps stay open until spawn returns
        // (`config` holds them).
        unsafe {
            cmd.pre_exec(move || {
                // First out of the way of the target numbers, then onto them.
                let mut high = Vec::with_capacity(taps.len());
                for fd in &taps {
                    let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 256);
                    if h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    high.push(h);
                }
                for (i, h) in high.iter().enumerate() {
                    if libc::dup2(*h, NIC_FD_BASE + i as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        inherit_below(&mut cmd, (NIC_FD_BASE as u32) + config.nics.len() as u32);
        match cmd.spawn() {
            Ok(child) => {
                vm.processes.insert(0, ("qemu", child));
                Ok(Box::new(vm))
            }
            Err(source) => {
                vm.kill();
                Err(VmmError::Spawn {
                    what: "qemu-system-x86_64",
                    source,
                })
            }
        }
    }
}
