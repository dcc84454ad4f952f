//! `agentvm check`: what this host can run, and why not.

use clap::Args;

use crate::cli::GlobalOpts;
use crate::config::Config;
use crate::microvm::host::{detect_accel, Host, HostVmm};

#[derive(Args, Debug)]
pub struct CheckArgs {}

pub fn run(global: &GlobalOpts, _args: &CheckArgs) -> anyhow::Result<u8> {
    let config = Config::load(global.config.as_deref())?;
    let (accel, why) = detect_accel();
    let mut text = String::new();
    text.push_str("container tier: available (namespaces, cgroups, seccomp, capabilities)\n");
    let ok = match Host::probe_default(&config) {
        Ok(h) => {
            let parts = match &h.vmm {
                HostVmm::Qemu { qemu, virtiofsd } => format!(
                    "  qemu: {}\n  virtiofsd: {}\n",
                    qemu.display(),
                    virtiofsd.display()
                ),
                HostVmm::Builtin => String::new(),
            };
            let vmm = match h.vmm {
                HostVmm::Qemu { .. } => "qemu",
                HostVmm::Builtin => "the builtin VMM",
            };
            text.push_str(&format!(
                "microvm tier: available with {vmm} ({}: {})\n  kernel: {}\n{parts}",
                h.accel.as_str(),
                h.accel_reason,
                h.kernel.display(),
            ));
            if let Some(agent) = &h.guest_agent {
                text.push_str(&format!("  guest agent: {}\n", agent.display()));
            }
            true
        }
        Err(e) => {
            text.push_str(&format!(
                "microvm tier: not available: {e}\n  accelerator would be {} ({why})\n",
                accel.as_str()
            ));
            false
        }
    };
    let (vmm, vmm_ok) = vmm_line(&config);
    text.push_str(&vmm);
    super::emit(&text)?;
    Ok(if ok && vmm_ok { 0 } else { 1 })
}

/// Which VMM backend a container that picks none would get, and why;
/// false when the configured choice cannot run here.
fn vmm_line(config: &Config) -> (String, bool) {
    use crate::microvm::vmm::{builtin, choice};
    let builtin_state = if builtin::complete() {
        "complete".to_string()
    } else {
        format!("not complete, lacks {}", builtin::MISSING.join(", "))
    };
    match choice::for_container(config.microvm.vmm, None) {
        Ok(d) => (
            format!(
                "vmm backend: {} ({}; requested {} from {})\n  builtin VMM: {builtin_state}\n",
                d.backend.as_str(),
                d.why,
                d.requested,
                d.source
            ),
            true,
        ),
        Err(e) => (format!("vmm backend: none: {e}\n"), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vmm_line_says_which_backend_and_fails_for_builtin_without_a_standard_kvm() {
        let qemu = Config::parse("[microvm]\nvmm = \"qemu\"\n").unwrap();
        let (text, ok) = vmm_line(&qemu);
        assert!(ok);
        assert!(
            text.starts_with("vmm backend: qemu (vmm = \"qemu\" (from config file)"),
            "{text}"
        );
        assert!(text.contains("builtin VMM: complete"), "{text}");
        let (text, ok) = vmm_line(&Config::default());
        assert!(ok, "{text}");
        assert!(text.contains("requested auto from default"), "{text}");
        let builtin = Config::parse("[microvm]\nvmm = \"builtin\"\n").unwrap();
        let (text, ok) = vmm_line(&builtin);
        let kvm = crate::microvm::vmm::choice::HostKvm::probe();
        assert_eq!(ok, kvm.standard().is_ok(), "{text}");
        if !ok {
            assert!(text.contains("needs a standard hardware KVM"), "{text}");
        }
    }
}
