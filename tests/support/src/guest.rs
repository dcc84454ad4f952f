//! What booting a microVM in the tests needs: the kernel that
//! kernels/build.sh built (cached per machine; `make kernel`) and virtiofsd.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where scripts/install-virtiofsd.sh (`make virtiofsd`) puts virtiofsd.
pub const VIRTIOFSD: &str = "/usr/local/libexec/agentvm/virtiofsd";

/// $AGENTVM_KERNEL, else what kernels/build.sh prints (a cache hit once
/// the kernel was built on this machine).
pub fn kernel() -> Result<PathBuf, String> {
    if let Ok(k) = std::env::var("AGENTVM_KERNEL") {
        if !Path::new(&k).is_file() {
            return Err(format!("AGENTVM_KERNEL={k} is not a file"));
        }
        return Ok(PathBuf::from(k));
    }
    // Only a cached kernel: building one takes minutes, `make kernel` does.
    let out = Command::new(super::repo_root().join("kernels/build.sh"))
        .arg("--print-key")
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run kernels/build.sh: {e}"))?;
    let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || key.is_empty() {
        return Err(format!(
            "kernels/build.sh --print-key failed ({}): are the kernel build packages installed? (make deps)",
            out.status
        ));
    }
    let cache = std::env::var("AGENTVM_KERNEL_CACHE")
        .unwrap_or_else(|_| "/var/cache/agentvm/kernels".to_string());
    let vmlinux = Path::new(&cache).join(key).join("vmlinux");
    if !vmlinux.is_file() {
        return Err(format!(
            "the guest kernel is not built ({} missing): run `make kernel`",
            vmlinux.display()
        ));
    }
    Ok(vmlinux)
}

/// The VMM backend the microvm tests ask for: `$AGENTVM_TEST_VMM`
/// (`builtin` or `qemu`), written as `vmm` in the tests' config file;
/// `None` leaves agentvm's own choice (`auto`).
pub fn vmm() -> Option<String> {
    std::env::var("AGENTVM_TEST_VMM")
        .ok()
        .filter(|v| !v.is_empty())
}

/// Whether the tests run the builtin VMM (`AGENTVM_TEST_VMM=builtin`,
/// which `make test-builtin` sets inside its test host).
pub fn builtin() -> bool {
    vmm().as_deref() == Some("builtin")
}

/// The `[microvm]` lines naming the VMM the tests ask for, if any.
pub fn vmm_config_line() -> String {
    vmm().map(|v| format!("vmm = {v:?}\n")).unwrap_or_default()
}

/// Why the builtin VMM cannot run here: it needs a standard hardware KVM
/// (these machines' `/dev/kvm` is `kvm_pvm`, on which a Linux guest cannot
/// boot; `make test-builtin` runs these tests inside its test host).
fn builtin_unavailable() -> Option<String> {
    if !Path::new("/dev/kvm").exists() {
        return Some("the builtin VMM needs /dev/kvm".into());
    }
    let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
    if loaded("kvm_pvm") || !(loaded("kvm_intel") || loaded("kvm_amd")) {
        return Some(
            "the builtin VMM needs a standard hardware KVM (kvm_intel or kvm_amd, not kvm_pvm); \
             make test-builtin runs these tests inside its test host"
                .into(),
        );
    }
    None
}

/// Why a microVM cannot be booted here, if it cannot: QEMU, virtiofsd or
/// the kernel is missing (for the builtin VMM: a standard KVM or the
/// kernel).
pub fn unavailable() -> Option<String> {
    if builtin() {
        return builtin_unavailable().or_else(|| kernel().err());
    }
    if Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_err()
    {
        return Some("qemu-system-x86_64 not found (Debian package qemu-system-x86)".into());
    }
    if !Path::new(VIRTIOFSD).exists() {
        return Some(format!(
            "{VIRTIOFSD} not found (make virtiofsd installs it)"
        ));
    }
    kernel().err()
}

/// A fixture whose commands run the microvm tier (`--isolation=microvm`)
/// with a config file (`--config`) naming this machine's kernel and
/// virtiofsd, plus `extra` lines under `[microvm]`. `Err(why)` when a
/// microVM cannot be booted here.
pub fn microvm_fixture(extra: &str) -> Result<super::bundle::Fixture, String> {
    if let Some(why) = super::host_unsuitable(&[]) {
        return Err(why);
    }
    if let Some(why) = unavailable() {
        return Err(why);
    }
    let kernel = kernel()?;
    let mut f = super::bundle::Fixture::with_flags(&["--isolation=microvm"]);
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n{}{extra}",
            kernel.display().to_string(),
            VIRTIOFSD,
            vmm_config_line()
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    f.add_flags(&["--config", &config.display().to_string()]);
    Ok(f)
}

/// MemTotal in the guest of container `id`, in MiB, and the container's
/// memory.max (`exec` in it: its /sys/fs/cgroup must be mounted).
pub fn guest_memory(f: &super::bundle::Fixture, id: &str) -> (u64, String) {
    let out = f
        .agentvm(&[
            "exec",
            id,
            "sh",
            "-c",
            "grep MemTotal /proc/meminfo; cat /sys/fs/cgroup/memory.max",
        ])
        .ok();
    let mut lines = out.stdout.lines();
    let total = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no MemTotal: {out}"));
    (total / 1024, lines.next().unwrap_or_default().to_string())
}

/// Waits until the guest's RAM is `want` (MiB, within what its kernel
/// keeps for itself): the balloon moves in the background.
#[track_caller]
pub fn wait_for_guest_ram(f: &super::bundle::Fixture, id: &str, want: u64) -> (u64, String) {
    let mut last = (0, String::new());
    let settled = super::wait_for(30, || {
        last = guest_memory(f, id);
        (last.0 <= want && last.0 + 48 >= want).then_some(())
    });
    assert!(
        settled.is_some(),
        "the guest has {} MiB, not about {want} MiB",
        last.0
    );
    last
}
