//! The floor under the microvm tier: plain `qemu-system-x86_64 -M microvm`
//! booting the same kernel, with the machine, accelerator, CPU, memory and
//! kernel command line agentvm's qemu backend uses
//! (src/microvm/vmm/qemu.rs, src/microvm/supervisor/mod.rs), to an
//! initramfs whose `/init` is static busybox running `reboot -f`. What one
//! round measures is QEMU's start to QEMU's exit; the microvm tier's round
//! minus this is what agentvm adds over the raw boot (its supervisor,
//! virtiofsd, the devices, the guest agent and the OCI lifecycle).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentvm::microvm::host::{kernel_cmdline, Accel};
use agentvm::microvm::initramfs::Cpio;

use crate::error::BenchError;
use crate::oci::Phases;
use crate::reaper::{children_cpu, PidFd};

/// The row of the floor in the tables.
pub const NAME: &str = "qemu floor (boot+poweroff)";
/// The busybox the initramfs is made of (Debian's busybox-static).
const BUSYBOX: &str = "/bin/busybox";
/// What the microvm tier gives a container without limits
/// (src/microvm/spec.rs: DEFAULT_MEMORY_MIB, `default_vcpus` 1).
const MEMORY_MIB: u64 = 512;
const VCPUS: u32 = 1;
/// How long one boot may take before it is called hung.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// A prepared floor measurement: the QEMU command line and its files.
pub struct Floor {
    qemu: PathBuf,
    args: Vec<String>,
    console: PathBuf,
    stderr: PathBuf,
}

/// Whether an ELF file asks for a program interpreter (is dynamically
/// linked): a PT_INTERP program header.
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    const PT_INTERP: u32 = 3;
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        usize::try_from(phoff)
            .ok()
            .and_then(|off| u32_at(off + i * usize::from(phentsize)))
            == Some(PT_INTERP)
    })
}

impl Floor {
    /// Builds the busybox initramfs in `dir` and the QEMU command line for
    /// `kernel`; `kvm` picks the accelerator as agentvm does. `Err` is why
    /// the floor cannot be measured here.
    pub fn prepare(dir: &Path, kernel: &Path, kvm: bool) -> Result<Floor, String> {
        let qemu = crate::common::find_in_path("qemu-system-x86_64")
            .ok_or("qemu-system-x86_64 not found (Debian package qemu-system-x86)")?;
        let busybox = std::fs::read(BUSYBOX)
            .map_err(|e| format!("cannot read {BUSYBOX} ({e}): install Debian's busybox-static"))?;
        if !busybox.starts_with(b"\x7fELF") || has_interpreter(&busybox) {
            return Err(format!(
                "{BUSYBOX} is not a static ELF binary: install busybox-static, not busybox"
            ));
        }
        let mut cpio = Cpio::default();
        for d in ["bin", "dev", "proc", "sys"] {
            cpio.dir(d);
        }
        cpio.char_dev("dev/console", 0o600, 5, 1);
        cpio.file("bin/busybox", 0o755, &busybox);
        cpio.file(
            "init",
            0o755,
            b"#!/bin/busybox sh\nexec /bin/busybox reboot -f\n",
        );
        let initramfs = dir.join("qemu-floor.cpio");
        std::fs::write(&initramfs, cpio.finish())
            .map_err(|e| format!("cannot write {}: {e}", initramfs.display()))?;

        // As the supervisor boots the guest.
        let cmdline = format!(
            "{} rdinit=/init",
            kernel_cmdline(if kvm { Accel::Kvm } else { Accel::Tcg })
        );
        let console = dir.join("qemu-floor.console");
        let mem = MEMORY_MIB;
        let mut args: Vec<String> = vec![
            "-M".into(),
            "microvm,acpi=off,memory-backend=mem,rtc=on".into(),
        ];
        args.extend(agentvm::microvm::vmm::qemu::accel_args(kvm));
        args.extend([
            "-smp".into(),
            VCPUS.to_string(),
            "-m".into(),
            format!("{mem}M"),
            "-object".into(),
            format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
        ]);
        args.extend(
            ["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"].map(String::from),
        );
        args.extend([
            "-kernel".into(),
            kernel.display().to_string(),
            "-initrd".into(),
            initramfs.display().to_string(),
            "-append".into(),
            cmdline,
            "-chardev".into(),
            format!("file,id=con,path={}", console.display()),
            "-serial".into(),
            "chardev:con".into(),
        ]);
        Ok(Floor {
            qemu,
            args,
            console,
            stderr: dir.join("qemu-floor.log"),
        })
    }

    /// The QEMU command line, for the report.
    pub fn command_line(&self) -> String {
        let quote = |a: &String| {
            if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.clone()
            }
        };
        std::iter::once(self.qemu.display().to_string())
            .chain(self.args.iter().map(quote))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One boot: QEMU's start to its exit after the guest's `reboot -f`.
    /// Only `total` and `cpu` of the result are meaningful.
    pub fn round(&self) -> Result<Phases, BenchError> {
        let stderr = File::create(&self.stderr).map_err(|source| BenchError::File {
            what: "cannot create",
            path: self.stderr.clone(),
            source,
        })?;
        let mut cmd = Command::new(&self.qemu);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let command = format!("{cmd:?}");
        let cpu0 = children_cpu();
        let t0 = Instant::now();
        let mut child = cmd.spawn().map_err(|source| BenchError::Spawn {
            command: command.clone(),
            source,
        })?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        let exited = PidFd::open(pid).and_then(|fd| fd.wait_exit(BOOT_TIMEOUT));
        if !matches!(exited, Ok(Some(()))) {
            let _ = child.kill();
            let _ = child.wait();
            exited?;
            return Err(BenchError::Hung {
                id: NAME.to_string(),
                secs: BOOT_TIMEOUT.as_secs(),
            });
        }
        let status = child.wait().map_err(|source| BenchError::Sys {
            what: format!("waitpid({pid})"),
            source,
        })?;
        let total = t0.elapsed();
        let cpu = children_cpu().saturating_sub(cpu0);
        if !status.success() {
            return Err(BenchError::Failed {
                command,
                status,
                output: format!(
                    "{}\n--- guest console ---\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default(),
                    std::fs::read_to_string(&self.console).unwrap_or_default()
                ),
            });
        }
        Ok(Phases {
            total,
            cpu,
            ..Phases::default()
        })
    }
}

/// The first line of `qemu-system-x86_64 --version`.
pub fn version() -> String {
    match Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string(),
        Ok(o) => format!("unknown (--version exited with {})", o.status),
        Err(e) => format!("unknown ({e})"),
    }
}
