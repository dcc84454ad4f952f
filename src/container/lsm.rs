//! SELinux labels: libcontainer 0.7 has no SELinux support and runs a
//! container that asks for a process label without it. Silently weaker
//! isolation is a security bug, so such a container is refused, as runc
//! refuses it on a host without SELinux:
//! - `process.selinuxLabel` (create and exec): refused on every host, with
//!   runc's reason where SELinux is off and ours where it is on;
//! - `linux.mountLabel`: refused where SELinux is off (runc fails to mount
//!   with it); where SELinux is on libcontainer passes it as `context=`.
//!
//! AppArmor needs nothing here: libcontainer refuses a profile when AppArmor
//! is off and applies it when it is on.

use std::path::Path;

use oci_spec::runtime::{Process, Spec};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LsmError {
    #[error("{field} is set but SELinux is disabled or not supported on this host")]
    SelinuxOff { field: &'static str },
    #[error(
        "process.selinuxLabel is set but agentvm's container tier cannot apply SELinux process \
         labels; remove it or use another runtime"
    )]
    ProcessLabelUnsupported,
}

/// Whether a selinuxfs is mounted at /sys/fs/selinux (how runc and
/// libselinux decide that SELinux is on).
pub fn selinux_enabled() -> bool {
    match nix::sys::statfs::statfs(Path::new("/sys/fs/selinux")) {
        Ok(s) => s.filesystem_type().0 == libc::SELINUX_MAGIC,
        Err(_) => false,
    }
}

/// Refuses a config whose labels would not be applied.
pub fn check_spec(spec: &Spec, selinux: bool) -> Result<(), LsmError> {
    if let Some(p) = spec.process() {
        check_process(p, selinux)?;
    }
    let mount_label = spec
        .linux()
        .as_ref()
        .and_then(|l| l.mount_label().as_deref());
    if !selinux && mount_label.is_some_and(|l| !l.is_empty()) {
        return Err(LsmError::SelinuxOff {
            field: "linux.mountLabel",
        });
    }
    Ok(())
}

/// Refuses a process (of the config or of `exec`) with a label.
pub fn check_process(process: &Process, selinux: bool) -> Result<(), LsmError> {
    let label = process.selinux_label().as_deref();
    match label {
        Some(l) if !l.is_empty() => match selinux {
            false => Err(LsmError::SelinuxOff {
                field: "process.selinuxLabel",
            }),
            true => Err(LsmError::ProcessLabelUnsupported),
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxBuilder, ProcessBuilder, SpecBuilder};

    use super::*;

    fn spec(label: Option<&str>, mount_label: Option<&str>) -> Spec {
        let mut p = ProcessBuilder::default().build().unwrap();
        p.set_selinux_label(label.map(str::to_string));
        let mut l = LinuxBuilder::default().build().unwrap();
        l.set_mount_label(mount_label.map(str::to_string));
        SpecBuilder::default().process(p).linux(l).build().unwrap()
    }

    #[test]
    fn no_labels_pass() {
        assert_eq!(check_spec(&spec(None, None), false), Ok(()));
        assert_eq!(check_spec(&spec(Some(""), Some("")), false), Ok(()));
        assert_eq!(check_spec(&spec(None, None), true), Ok(()));
    }

    #[test]
    fn process_label_is_refused_with_or_without_selinux() {
        let s = spec(Some("system_u:system_r:container_t:s0"), None);
        assert_eq!(
            check_spec(&s, false),
            Err(LsmError::SelinuxOff {
                field: "process.selinuxLabel"
            })
        );
        assert_eq!(check_spec(&s, true), Err(LsmError::ProcessLabelUnsupported));
        let msg = check_spec(&s, false).unwrap_err().to_string();
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn mount_label_is_refused_only_without_selinux() {
        let s = spec(None, Some("system_u:object_r:container_file_t:s0"));
        assert_eq!(
            check_spec(&s, false),
            Err(LsmError::SelinuxOff {
                field: "linux.mountLabel"
            })
        );
        assert_eq!(check_spec(&s, true), Ok(()));
    }

    #[test]
    fn this_host_is_detected_consistently() {
        // Whatever this host runs, the answer matches the enforce file's
        // presence, which only a mounted selinuxfs has.
        assert_eq!(
            selinux_enabled(),
            Path::new("/sys/fs/selinux/enforce").exists()
        );
    }
}
