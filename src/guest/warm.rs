//! Warming a pool VM before its container comes (`HostMessage::Warm`).
//!
//! A container's creation is the first time the guest runs most of the
//! agent's code: the container tier, libcontainer, libseccomp. The agent
//! runs from the share, so each first touch of that code is a page fault
//! read through virtio-fs, and under TCG each new block of it is also
//! translated before it runs. In a VM that just booted that is most of
//! `create`: measured under TCG, a pod's first container took 600 ms to
//! create and the next ones 150-160 ms.
//!
//! A pool VM has time for that before anyone asks (`microvm::pool`): its
//! keeper sends `Warm` after Hello, and the agent creates and deletes a
//! throwaway container through the same path a real one takes. Its spec
//! is the default one (`runc spec`'s namespaces, mounts, masked paths and
//! capabilities) with a cgroup namespace, as the host plans every
//! container's, and a small seccomp profile so that libseccomp's compiler
//! runs too; its rootfs is an empty directory of the guest's tmpfs, its
//! process a file that is never run (the container is deleted before
//! `start`). Nothing of it is left: its state, cgroup, bundle and rootfs
//! go with it, and its init is killed and reaped.
//!
//! The code it read stays in the guest's page cache (the agent does not
//! trim a VM that no container has asked for, `agent.rs`), and its
//! translations in QEMU's cache.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oci_spec::runtime::{
    Arch, LinuxNamespace, LinuxNamespaceType, LinuxSeccomp, LinuxSeccompAction, LinuxSyscall, Spec,
};

use super::stream::pipes;
use super::sys::SigchldUnblocked;
use super::AGENT_DIR;
use crate::bundle::{Bundle, BundleError};
use crate::container::create::CreateOptions;
use crate::container::ContainerError;
use crate::context::Context;

/// The throwaway container's id in the guest's container tier: not a
/// name the host ever gives a container of the VM (`container`,
/// `member-N`).
pub const WARM_ID: &str = "warm-up";
/// Its cgroup, beside the one a container gets ([`super::GUEST_CGROUP`]).
const WARM_CGROUP: &str = "/agentvm-warm-up";
/// Its process: an empty file with the execute bit, which the container
/// tier finds (as it checks a real one) and nothing runs.
const WARM_PROCESS: &str = "/warm-up";
/// The system calls its profile refuses (any will do: they only make
/// libseccomp compile rules).
const REFUSED: [&str; 3] = ["add_key", "keyctl", "request_key"];

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("warm-up: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("warm-up: cannot create stdio pipes: {0}")]
    Pipes(nix::errno::Errno),
    #[error("warm-up: {0}")]
    Bundle(#[from] BundleError),
    #[error("warm-up: {0}")]
    Tier(#[from] ContainerError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WarmError {
    let what = what.into();
    move |source| WarmError::Io { what, source }
}

/// The warm-up's directory: its bundle, and its rootfs below.
fn dir() -> PathBuf {
    Path::new(AGENT_DIR).join(WARM_ID)
}

/// Creates and deletes the throwaway container; returns how long that
/// took. Whatever happens, nothing of it is left behind.
pub fn warm(ctx: &Context) -> Result<Duration, WarmError> {
    let started = Instant::now();
    let result = create_and_delete(ctx);
    // The container tier removed its own state; the bundle is ours.
    let _ = std::fs::remove_dir_all(dir());
    result.map(|()| started.elapsed())
}

fn create_and_delete(ctx: &Context) -> Result<(), WarmError> {
    let bundle_dir = dir();
    let rootfs = bundle_dir.join("rootfs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&rootfs)
        .map_err(io(format!("cannot create {}", rootfs.display())))?;
    let process = rootfs.join(WARM_PROCESS.trim_start_matches('/'));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&process)
        .map_err(io(format!("cannot create {}", process.display())))?;
    let spec = warm_spec(&rootfs);
    let config = bundle_dir.join("config.json");
    let text = serde_json::to_vec(&spec).map_err(|e| WarmError::Io {
        what: "cannot encode the spec".into(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&config, text).map_err(io(format!("cannot write {}", config.display())))?;
    let bundle = Bundle::with_spec(&bundle_dir, spec)?;
    // As a container's: pipes for its stdio (dropped with it).
    let (child, _parent) = pipes().map_err(WarmError::Pipes)?;
    let opts = CreateOptions {
        detached: true,
        fresh_cgroup: true,
        enosys_added: true,
        stdin: Some(child.stdin),
        stdout: Some(child.stdout),
        stderr: Some(child.stderr),
        ..Default::default()
    };
    let created = {
        let _unblocked = SigchldUnblocked::new().map_err(WarmError::Pipes)?;
        crate::container::create::create(ctx, WARM_ID, &bundle, opts)
    };
    // The container tier works in the bundle; the bundle goes.
    let _ = std::env::set_current_dir(AGENT_DIR);
    let mut container = created?;
    // Its init, killed here, is the agent's child: the agent's loop reaps
    // it with the VM's other orphans.
    crate::container::delete::delete(&mut container, true)?;
    Ok(())
}

/// The default spec, as the host would plan it for the guest, on
/// `rootfs`, with a seccomp profile.
pub fn warm_spec(rootfs: &Path) -> Spec {
    let mut spec = Spec::default();
    let mut root = spec.root().clone().unwrap_or_default();
    root.set_path(rootfs.to_path_buf());
    root.set_readonly(Some(true));
    spec.set_root(Some(root));
    let mut process = spec.process().clone().unwrap_or_default();
    process.set_args(Some(vec![WARM_PROCESS.to_string()]));
    process.set_terminal(Some(false));
    // The filter is loaded at create (the init waits for `start` under
    // it), so that this run reaches the code that loads it.
    process.set_no_new_privileges(Some(true));
    spec.set_process(Some(process));
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    if !namespaces
        .iter()
        .any(|n| n.typ() == LinuxNamespaceType::Cgroup)
    {
        let mut ns = LinuxNamespace::default();
        ns.set_typ(LinuxNamespaceType::Cgroup);
        namespaces.push(ns);
    }
    linux.set_namespaces(Some(namespaces));
    linux.set_cgroups_path(Some(PathBuf::from(WARM_CGROUP)));
    let mut rule = LinuxSyscall::default();
    rule.set_names(REFUSED.iter().map(|s| s.to_string()).collect());
    rule.set_action(LinuxSeccompAction::ScmpActErrno);
    rule.set_errno_ret(Some(libc::EPERM as u32));
    let mut seccomp = LinuxSeccomp::default();
    seccomp.set_default_action(LinuxSeccompAction::ScmpActAllow);
    seccomp.set_architectures(Some(vec![Arch::ScmpArchX86_64]));
    seccomp.set_syscalls(Some(vec![rule]));
    linux.set_seccomp(Some(seccomp));
    spec.set_linux(Some(linux));
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_container_is_a_default_one_of_its_own() {
        let spec = warm_spec(Path::new("/run/agentvm/warm-up/rootfs"));
        let root = spec.root().as_ref().unwrap();
        assert_eq!(root.path(), Path::new("/run/agentvm/warm-up/rootfs"));
        assert_eq!(root.readonly(), Some(true));
        let process = spec.process().as_ref().unwrap();
        assert_eq!(
            process.args().as_deref(),
            Some(&[WARM_PROCESS.to_string()][..])
        );
        assert_eq!(process.no_new_privileges(), Some(true));
        let linux = spec.linux().as_ref().unwrap();
        // Never the cgroup a container of the VM gets.
        assert_ne!(
            linux.cgroups_path().as_deref(),
            Some(Path::new(super::super::GUEST_CGROUP))
        );
        let types: Vec<LinuxNamespaceType> = linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .map(|n| n.typ())
            .collect();
        for t in [
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Mount,
            LinuxNamespaceType::Network,
            LinuxNamespaceType::Cgroup,
        ] {
            assert!(types.contains(&t), "{t:?} missing from {types:?}");
        }
        // No namespace of the guest's own is joined.
        assert!(linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .all(|n| n.path().is_none()));
        let seccomp = linux.seccomp().as_ref().unwrap();
        assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActAllow);
        assert!(!seccomp.syscalls().as_ref().unwrap().is_empty());
        // Its id is none the host gives a container of the VM.
        assert_ne!(WARM_ID, super::super::CONTAINER_ID);
        assert!(!WARM_ID.starts_with("member-"));
    }
}
