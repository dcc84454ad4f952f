//! What this host can run: the accelerator (KVM with hardware
//! virtualization, else TCG), and where the kernel, QEMU and virtiofsd are.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::microvm::vmm::choice::BackendKind;

/// Default guest kernel, installed by `make install` from kernels/.
pub const DEFAULT_KERNEL: &str = "/usr/local/share/agentvm/vmlinux";
/// Default virtiofsd, installed by scripts/install-virtiofsd.sh.
pub const DEFAULT_VIRTIOFSD: &str = "/usr/local/libexec/agentvm/virtiofsd";
pub const QEMU: &str = "qemu-system-x86_64";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// The accelerator and, in words, why.
pub fn detect_accel() -> (Accel, String) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let pvm = modules.lines().any(|l| l.starts_with("kvm_pvm "))
        || Path::new("/sys/module/kvm_pvm").exists();
    let kvm_dev = Path::new("/dev/kvm").exists();
    match (hw, pvm, kvm_dev) {
        (true, false, true) => (Accel::Kvm, "hardware virtualization and /dev/kvm".into()),
        (_, true, _) => (
            Accel::Tcg,
            "/dev/kvm is kvm_pvm (paravirtual), which cannot boot a standard guest kernel".into(),
        ),
        (false, _, _) => (
            Accel::Tcg,
            "the CPU has no vmx/svm (no hardware virtualization)".into(),
        ),
        (true, _, false) => (Accel::Tcg, "/dev/kvm is missing".into()),
    }
}

/// The guest kernel's command line for a VM on `accel`, before what says
/// where its root and init are (see [`share_root`]) and the VMM's devices.
/// Shared with the benchmark's raw QEMU floor, which boots the same kernel
/// the same way.
pub fn kernel_cmdline(accel: Accel) -> String {
    let mut cmdline = String::from("console=ttyS0 reboot=t panic=-1 quiet");
    if accel == Accel::Tcg {
        // Emulated vCPUs on a busy host miss the IO-APIC timer check's
        // window, and the kernel panics ("IO-APIC + timer doesn't work!"):
        // seen as an occasional "control channel closed" at create.
        cmdline.push_str(" no_timer_check");
        if let Some(khz) = tsc_khz() {
            cmdline.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
        }
        // TCG's local APIC has no TSC-deadline mode and no CPUID leaf with
        // its frequency, so the kernel calibrates its timer against the PIT
        // and then verifies it: two busy waits of 100 ms each (HZ/10
        // ticks), a third of the kernel's boot. The PIT is the tick device
        // instead (other vCPUs get the tick by broadcast). Under KVM the
        // timer has a TSC deadline and nothing is calibrated.
        cmdline.push_str(" noapictimer");
        // A kernel that finds one possible CPU rewrites every `lock`
        // prefix in its text to a no-op at boot (SMP alternatives). Each
        // rewrite lands on a page TCG may hold translated code for, which
        // it must throw away and translate again: 120 ms of the vCPU's
        // time at boot, measured on the QEMU floor (user CPU, medians of
        // 5 interleaved boots, 0.52 s without, 0.40 s with). TCG runs a
        // single vCPU's `lock` prefix as a plain access, so keeping them
        // costs nothing; under KVM the rewrite takes microseconds and the
        // prefix is a real cost, so it stays.
        cmdline.push_str(" noreplace-smp");
        // Free the kernel's init memory without filling it with a poison
        // byte first (our patch, kernels/patches/0002): every store to a
        // page TCG holds translated code for takes its slow path, and the
        // fill of .init.text cost 40 ms of the floor's boot (0.375 s
        // against 0.335 s, medians of 10 interleaved boots).
        cmdline.push_str(" noinitpoison");
    }
    cmdline
}

/// `AGENTVM_GUEST_LOG=FILTER` for the guest's kernel command line (the
/// kernel hands it to `/init` as an environment variable: the guest
/// agent's console log filter, `guest::console::LOG_ENV`) when the
/// supervisor was started with it set, for tracing a guest's boot and
/// `create`; nothing for a value that is empty or holds characters a
/// `tracing` filter does not need (a space would split the command line).
pub fn guest_log_param(value: Option<&str>) -> Option<String> {
    let value = value?;
    let ok = |c: char| c.is_ascii_alphanumeric() || "_=,:.-".contains(c);
    (!value.is_empty() && value.len() <= 200 && value.chars().all(ok))
        .then(|| format!("AGENTVM_GUEST_LOG={value}"))
}

/// Where a container's guest boots from: the virtio-fs share is its root
/// filesystem and the agent in it its init. No initramfs is loaded,
/// unpacked and kept in guest RAM: the kernel pages in the parts of the
/// agent it runs, through virtio-fs, from the host's page cache.
pub fn share_root() -> String {
    format!(
        "root={} rootfstype=virtiofs rw init=/{}",
        crate::protocol::SHARE_TAG,
        crate::protocol::SHARE_INIT
    )
}

/// The host TSC frequency in kHz, which a guest under TCG needs on its
/// command line (it has no other clock to calibrate against quickly).
pub fn tsc_khz() -> Option<u64> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0).round() as u64)
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "guest kernel {0} not found: build and install it with `make kernel` in agentvm's \
         source tree, or set `kernel` under [microvm] in /etc/agentvm/config.toml"
    )]
    Kernel(PathBuf),
    #[error("{QEMU} not found in PATH: install Debian's qemu-system-x86")]
    Qemu,
    #[error(
        "virtiofsd {0} not found: install it with `make virtiofsd` in agentvm's source tree, \
         or set `virtiofsd` under [microvm] in /etc/agentvm/config.toml"
    )]
    Virtiofsd(PathBuf),
    #[error("guest agent {path} (`guest_agent` under [microvm] in the config file) {why}")]
    GuestAgent { path: PathBuf, why: String },
}

/// The VMM a microVM is booted with, and what it needs of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostVmm {
    /// QEMU's microvm machine, its file system served by virtiofsd.
    Qemu { qemu: PathBuf, virtiofsd: PathBuf },
    /// The builtin VMM inside the supervisor: nothing to find.
    Builtin,
}

/// Everything the microvm tier needs, found.
#[derive(Debug, Clone)]
pub struct Host {
    pub accel: Accel,
    pub accel_reason: String,
    pub kernel: PathBuf,
    pub vmm: HostVmm,
    /// The guest's /init when it is not agentvm itself (`guest_agent`).
    pub guest_agent: Option<PathBuf>,
}

pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Host {
    /// Checks that a microVM can be started here with the `backend` VMM
    /// (QEMU needs its binary and virtiofsd, the builtin VMM neither); the
    /// error says what is missing and how to get it.
    pub fn probe(config: &Config, backend: BackendKind) -> Result<Host, HostError> {
        let guest_agent = config.microvm.guest_agent.clone();
        if let Some(path) = &guest_agent {
            check_guest_agent(path)?;
        }
        let kernel = config
            .microvm
            .kernel
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KERNEL));
        if !kernel.is_file() {
            return Err(HostError::Kernel(kernel));
        }
        let vmm = match backend {
            BackendKind::Builtin => HostVmm::Builtin,
            BackendKind::Qemu => {
                let qemu = find_in_path(QEMU).ok_or(HostError::Qemu)?;
                let virtiofsd = config
                    .microvm
                    .virtiofsd
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_VIRTIOFSD));
                if !virtiofsd.is_file() {
                    return Err(HostError::Virtiofsd(virtiofsd));
                }
                HostVmm::Qemu { qemu, virtiofsd }
            }
        };
        let (accel, accel_reason) = detect_accel();
        Ok(Host {
            accel,
            accel_reason,
            kernel,
            vmm,
            guest_agent,
        })
    }
}

impl Host {
    /// [`Host::probe`] for the backend a container that asks for none
    /// gets (`agentvm check`, `features`); QEMU when the configured choice
    /// cannot run here (which they report on their own line).
    pub fn probe_default(config: &Config) -> Result<Host, HostError> {
        let backend = crate::microvm::vmm::choice::for_container(config.microvm.vmm, None)
            .map_or(BackendKind::Qemu, |d| d.backend);
        Host::probe(config, backend)
    }

    /// The VMM in words, with the paths it runs.
    pub fn vmm_description(&self) -> String {
        match &self.vmm {
            HostVmm::Qemu { qemu, virtiofsd } => format!(
                "qemu microvm (qemu: {}, virtiofsd: {})",
                qemu.display(),
                virtiofsd.display()
            ),
            HostVmm::Builtin => "the builtin VMM (in the supervisor)".to_string(),
        }
    }
}

/// A configured guest agent must be a regular file (following symlinks):
/// it is bound read-only into the share as the guest's init.
fn check_guest_agent(path: &Path) -> Result<(), HostError> {
    let why = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => return Ok(()),
        Ok(_) => "is not a regular file".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
        Err(e) => format!("cannot be read: {e}"),
    };
    Err(HostError::GuestAgent {
        path: path.to_path_buf(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_filter_reaches_the_guest_command_line() {
        assert_eq!(
            guest_log_param(Some("debug,libcontainer=info")).as_deref(),
            Some("AGENTVM_GUEST_LOG=debug,libcontainer=info")
        );
        for bad in [None, Some(""), Some("debug init=/bin/sh"), Some("a\nb")] {
            assert_eq!(guest_log_param(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tcg_s_workarounds_stay_off_kvm_s_command_line() {
        let words = |accel| {
            kernel_cmdline(accel)
                .split(' ')
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let (tcg, kvm) = (words(Accel::Tcg), words(Accel::Kvm));
        for word in [
            "no_timer_check",
            "noapictimer",
            "noreplace-smp",
            "noinitpoison",
        ] {
            assert!(tcg.iter().any(|w| w == word), "{word} missing: {tcg:?}");
            assert!(!kvm.iter().any(|w| w == word), "{word} under KVM: {kvm:?}");
        }
        for cmdline in [&tcg, &kvm] {
            assert_eq!(
                cmdline[..4],
                ["console=ttyS0", "reboot=t", "panic=-1", "quiet"]
            );
        }
    }

    #[test]
    fn guest_agent_must_be_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent");
        std::fs::write(&file, b"\x7fELF").unwrap();
        assert!(check_guest_agent(&file).is_ok());
        let missing = dir.path().join("nope");
        let err = check_guest_agent(&missing).unwrap_err().to_string();
        assert!(err.contains("guest_agent"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        assert!(err.contains("does not exist"), "{err}");
        let err = check_guest_agent(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }
}
