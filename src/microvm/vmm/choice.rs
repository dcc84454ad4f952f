//! Which VMM backend boots a container's microVM: `vmm = "auto" |
//! "builtin" | "qemu"` under `[microvm]` in the config file, or the
//! container's `io.agentvm.vmm` annotation (which wins).
//!
//! `auto` picks the builtin VMM only where the host has a standard
//! hardware KVM — `vmx` or `svm` in the CPU flags, `kvm_intel` or
//! `kvm_amd` loaded, and not `kvm_pvm`, whose `/dev/kvm` answers the same
//! ioctls but cannot run a standard guest kernel — and only once the
//! builtin VMM is complete ([`super::builtin::MISSING`] is empty);
//! otherwise QEMU. `builtin` where it cannot run is an error naming what
//! is missing, never a silent QEMU.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::Deserialize;

/// The annotation that picks the VMM of one container.
pub const VMM_ANNOTATION: &str = "io.agentvm.vmm";

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmmChoice {
    /// The builtin VMM where it can run, else QEMU.
    #[default]
    Auto,
    Builtin,
    Qemu,
}

impl VmmChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            VmmChoice::Auto => "auto",
            VmmChoice::Builtin => "builtin",
            VmmChoice::Qemu => "qemu",
        }
    }
}

impl fmt::Display for VmmChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for VmmChoice {
    type Err = ChoiceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(VmmChoice::Auto),
            "builtin" => Ok(VmmChoice::Builtin),
            "qemu" => Ok(VmmChoice::Qemu),
            other => Err(ChoiceError::Unknown(other.to_string())),
        }
    }
}

/// Where the choice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceSource {
    Annotation,
    ConfigFile,
    Default,
}

impl fmt::Display for ChoiceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChoiceSource::Annotation => "annotation io.agentvm.vmm",
            ChoiceSource::ConfigFile => "config file",
            ChoiceSource::Default => "default",
        })
    }
}

/// The backend that will run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Builtin,
    Qemu,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Builtin => "builtin",
            BackendKind::Qemu => "qemu",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    #[error("unknown vmm {0:?}: expected \"auto\", \"builtin\" or \"qemu\"")]
    Unknown(String),
    #[error("vmm \"builtin\" (from {from}) needs a standard hardware KVM: {why}")]
    NoHardwareKvm { from: ChoiceSource, why: String },
}

/// What the host offers a VMM of our own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKvm {
    /// `vmx` or `svm`, when the CPU flags have it.
    pub cpu_flag: Option<&'static str>,
    /// `kvm_intel` or `kvm_amd`, when loaded.
    pub module: Option<&'static str>,
    /// `kvm_pvm` is loaded: `/dev/kvm` may be the paravirtual one.
    pub pvm: bool,
    pub dev_kvm: bool,
}

impl HostKvm {
    /// Reads this host's CPU flags, loaded modules and `/dev/kvm`.
    pub fn probe() -> HostKvm {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
        let loaded = |name: &str| {
            Path::new("/sys/module").join(name).exists()
                || modules
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(name))
        };
        HostKvm::from_facts(&cpuinfo, loaded, Path::new("/dev/kvm").exists())
    }

    /// The same from given facts (tests).
    pub fn from_facts(cpuinfo: &str, loaded: impl Fn(&str) -> bool, dev_kvm: bool) -> HostKvm {
        let flags: Vec<&str> = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .flat_map(str::split_whitespace)
            .collect();
        let cpu_flag = ["vmx", "svm"].into_iter().find(|f| flags.contains(f));
        let module = ["kvm_intel", "kvm_amd"].into_iter().find(|m| loaded(m));
        HostKvm {
            cpu_flag,
            module,
            pvm: loaded("kvm_pvm"),
            dev_kvm,
        }
    }

    /// Whether a standard guest kernel can run under this `/dev/kvm`;
    /// the error says why not.
    pub fn standard(&self) -> Result<String, String> {
        if self.pvm {
            return Err(
                "/dev/kvm is kvm_pvm (paravirtual), which cannot run a standard guest kernel"
                    .to_string(),
            );
        }
        let Some(flag) = self.cpu_flag else {
            return Err("the CPU has no vmx/svm (no hardware virtualization)".to_string());
        };
        let Some(module) = self.module else {
            return Err(format!(
                "the CPU has {flag} but neither kvm_intel nor kvm_amd is loaded"
            ));
        };
        if !self.dev_kvm {
            return Err("/dev/kvm is missing".to_string());
        }
        Ok(format!("hardware KVM ({flag}, {module})"))
    }
}

/// The backend, and in words why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub backend: BackendKind,
    pub requested: VmmChoice,
    pub source: ChoiceSource,
    pub why: String,
}

/// What the container (annotation) or the config file asks for.
pub fn requested(
    config: Option<VmmChoice>,
    annotations: Option<&HashMap<String, String>>,
) -> Result<(VmmChoice, ChoiceSource), ChoiceError> {
    if let Some(v) = annotations.and_then(|a| a.get(VMM_ANNOTATION)) {
        return Ok((v.parse()?, ChoiceSource::Annotation));
    }
    Ok(match config {
        Some(c) => (c, ChoiceSource::ConfigFile),
        None => (VmmChoice::Auto, ChoiceSource::Default),
    })
}

/// Picks the backend for `requested` on `host`, the builtin VMM lacking
/// `missing`.
pub fn decide(
    requested: VmmChoice,
    source: ChoiceSource,
    host: &HostKvm,
    missing: &[&'static str],
) -> Result<Decision, ChoiceError> {
    let decision = |backend, why: String| Decision {
        backend,
        requested,
        source,
        why,
    };
    let incomplete = || {
        format!(
            "the builtin VMM is not complete (it lacks {})",
            missing.join(", ")
        )
    };
    match requested {
        VmmChoice::Qemu => Ok(decision(
            BackendKind::Qemu,
            format!("vmm = \"qemu\" (from {source})"),
        )),
        // Asked for by name, an incomplete builtin VMM runs, and says what
        // it lacks (`create` logs it as a warning); `auto` never picks it.
        VmmChoice::Builtin => match host.standard() {
            Ok(kvm) if missing.is_empty() => Ok(decision(
                BackendKind::Builtin,
                format!("vmm = \"builtin\" (from {source}), {kvm}"),
            )),
            Ok(kvm) => Ok(decision(
                BackendKind::Builtin,
                format!("vmm = \"builtin\" (from {source}), {kvm}; {}", incomplete()),
            )),
            Err(why) => Err(ChoiceError::NoHardwareKvm { from: source, why }),
        },
        VmmChoice::Auto => match (host.standard(), missing.is_empty()) {
            (Ok(kvm), true) => Ok(decision(BackendKind::Builtin, format!("auto: {kvm}"))),
            (Ok(kvm), false) => Ok(decision(
                BackendKind::Qemu,
                format!("auto: {kvm}, but {}", incomplete()),
            )),
            (Err(why), _) => Ok(decision(BackendKind::Qemu, format!("auto: {why}"))),
        },
    }
}

/// The decision for a container on this host.
pub fn for_container(
    config: Option<VmmChoice>,
    annotations: Option<&HashMap<String, String>>,
) -> Result<Decision, ChoiceError> {
    let (choice, source) = requested(config, annotations)?;
    decide(choice, source, &HostKvm::probe(), super::builtin::MISSING)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTEL: &str = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr vmx ept\n";
    const PVM_GUEST: &str = "processor\t: 0\nflags\t\t: fpu vme hypervisor lm\n";

    fn host(cpuinfo: &str, modules: &[&str]) -> HostKvm {
        HostKvm::from_facts(cpuinfo, |m| modules.contains(&m), true)
    }

    #[test]
    fn a_standard_kvm_needs_the_flag_the_module_and_no_pvm() {
        assert_eq!(
            host(INTEL, &["kvm", "kvm_intel"]).standard(),
            Ok("hardware KVM (vmx, kvm_intel)".to_string())
        );
        let svm = "flags : fpu svm npt\n";
        assert!(host(svm, &["kvm_amd"]).standard().is_ok());
        // These machines: no flag, kvm_pvm loaded.
        let err = host(PVM_GUEST, &["kvm", "kvm_pvm"]).standard().unwrap_err();
        assert!(err.contains("kvm_pvm"), "{err}");
        // kvm_pvm next to kvm_intel: /dev/kvm may be either.
        assert!(host(INTEL, &["kvm_intel", "kvm_pvm"]).standard().is_err());
        let err = host(INTEL, &["kvm"]).standard().unwrap_err();
        assert!(err.contains("neither kvm_intel nor kvm_amd"), "{err}");
        assert!(host(PVM_GUEST, &["kvm_intel"])
            .standard()
            .unwrap_err()
            .contains("no vmx/svm"));
        let no_dev = HostKvm::from_facts(INTEL, |m| m == "kvm_intel", false);
        assert_eq!(no_dev.standard(), Err("/dev/kvm is missing".to_string()));
        // "vmx" only counts on the flags line.
        assert!(host("model name : vmx svm\n", &["kvm_intel"])
            .standard()
            .is_err());
    }

    #[test]
    fn auto_picks_builtin_only_when_complete_on_hardware_kvm() {
        let hw = host(INTEL, &["kvm_intel"]);
        let pvm = host(PVM_GUEST, &["kvm_pvm"]);
        let d = decide(VmmChoice::Auto, ChoiceSource::Default, &hw, &[]).unwrap();
        assert_eq!(d.backend, BackendKind::Builtin);
        let d = decide(VmmChoice::Auto, ChoiceSource::Default, &hw, &["virtio-fs"]).unwrap();
        assert_eq!(d.backend, BackendKind::Qemu);
        assert!(d.why.contains("lacks virtio-fs"), "{}", d.why);
        let d = decide(VmmChoice::Auto, ChoiceSource::Default, &pvm, &[]).unwrap();
        assert_eq!(d.backend, BackendKind::Qemu);
        assert!(d.why.contains("kvm_pvm"), "{}", d.why);
        let d = decide(VmmChoice::Qemu, ChoiceSource::ConfigFile, &hw, &[]).unwrap();
        assert_eq!(d.backend, BackendKind::Qemu);
    }

    #[test]
    fn builtin_by_name_runs_incomplete_saying_what_it_lacks_and_needs_a_standard_kvm() {
        let hw = host(INTEL, &["kvm_intel"]);
        let d = decide(
            VmmChoice::Builtin,
            ChoiceSource::Annotation,
            &hw,
            &["virtio-fs", "virtio-net"],
        )
        .unwrap();
        assert_eq!(d.backend, BackendKind::Builtin);
        assert!(
            d.why
                .ends_with("the builtin VMM is not complete (it lacks virtio-fs, virtio-net)"),
            "{}",
            d.why
        );
        let pvm = host(PVM_GUEST, &["kvm_pvm"]);
        let err = decide(VmmChoice::Builtin, ChoiceSource::ConfigFile, &pvm, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs a standard hardware KVM"), "{err}");
        assert!(!err.contains('\n'));
        // Today's builtin VMM is complete: auto picks it on a standard
        // KVM, and QEMU on kvm_pvm.
        assert!(super::super::builtin::complete());
        let today = |host| {
            decide(
                VmmChoice::Auto,
                ChoiceSource::Default,
                host,
                super::super::builtin::MISSING,
            )
            .unwrap()
            .backend
        };
        assert_eq!(today(&hw), BackendKind::Builtin);
        assert_eq!(today(&pvm), BackendKind::Qemu);
    }

    #[test]
    fn the_annotation_beats_the_config_file_and_bad_values_are_errors() {
        let ann = |v: &str| HashMap::from([(VMM_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(
            requested(Some(VmmChoice::Builtin), Some(&ann("qemu"))).unwrap(),
            (VmmChoice::Qemu, ChoiceSource::Annotation)
        );
        assert_eq!(
            requested(Some(VmmChoice::Builtin), None).unwrap(),
            (VmmChoice::Builtin, ChoiceSource::ConfigFile)
        );
        assert_eq!(
            requested(None, Some(&HashMap::new())).unwrap(),
            (VmmChoice::Auto, ChoiceSource::Default)
        );
        let err = requested(None, Some(&ann("firecracker"))).unwrap_err();
        assert!(
            err.to_string().contains("unknown vmm \"firecracker\""),
            "{err}"
        );
        assert!(requested(None, Some(&ann("QEMU"))).is_err());
    }
}
