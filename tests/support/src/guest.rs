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

/// Why a microVM cannot be booted here, if it cannot: QEMU, virtiofsd or
/// the kernel is missing.
pub fn unavailable() -> Option<String> {
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
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n{extra}",
            kernel.display().to_string(),
            VIRTIOFSD
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    f.add_flags(&["--config", &config.display().to_string()]);
    Ok(f)
}
