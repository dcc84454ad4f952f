//! The supervisor's own setup: its namespaces and cgroup (the ones the spec
//! asks for, so Docker's network hooks and `docker stats` keep their
//! meaning), and the share it exports to the guest.

use std::path::{Path, PathBuf};

use libcgroups::common::{CgroupConfig, CgroupManager, ControllerOpt};
use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::microvm::spec::{is_bind, Staged};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    MountPoint(#[from] crate::container::cwd::CwdError),
    #[error("cgroup {path}: {message}")]
    Cgroup { path: PathBuf, message: String },
    #[error(
        "the microvm tier cannot use the host's network (the spec names no network namespace of its own, \
         e.g. --network host): a microVM's NIC is routed through the container's own \
         network namespace; use --isolation=container for host networking"
    )]
    HostNetwork,
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> StageError {
    let what = what.into();
    move |source| StageError::Sys { what, source }
}

/// A mount namespace of our own, so the staging binds never show on the
/// host and vanish with the supervisor.
pub fn private_mounts() -> Result<(), StageError> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(sys("unshare mount namespace"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make / private"))
}

/// Joins or creates the network namespace the spec names. A microVM
/// cannot be given the host's own network (a spec without a network
/// namespace, `--network host`): its NICs are routed through a namespace of
/// the container's.
pub fn network(spec: &Spec) -> Result<(), StageError> {
    let ns = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|a| a.iter().find(|n| n.typ() == LinuxNamespaceType::Network));
    let Some(ns) = ns else {
        return Err(StageError::HostNetwork);
    };
    match ns.path() {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|source| StageError::Io {
                what: format!("open network namespace {}", path.display()),
                source,
            })?;
            // Docker's `--network host` names a bind of the host's own
            // namespace (/var/run/docker/netns/default).
            let ours = std::fs::metadata("/proc/self/ns/net").map_err(|source| StageError::Io {
                what: "stat /proc/self/ns/net".into(),
                source,
            })?;
            let theirs = f.metadata().map_err(|source| StageError::Io {
                what: format!("stat network namespace {}", path.display()),
                source,
            })?;
            use std::os::unix::fs::MetadataExt;
            if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
                return Err(StageError::HostNetwork);
            }
            setns(f, CloneFlags::CLONE_NEWNET).map_err(sys(format!("join {}", path.display())))?;
        }
        None => unshare(CloneFlags::CLONE_NEWNET).map_err(sys("unshare network namespace"))?,
    }
    Ok(())
}

/// The VM's host cgroup when the spec names none, where runc would put the
/// container: `id` below the caller's own cgroup (the container tier's
/// [`default_path`](crate::container::cgroups::default_path); the
/// supervisor is still in the cgroup it inherited from `create` when it
/// asks), or a scope in system.slice with `--systemd-cgroup`.
pub fn default_cgroup_path(id: &str, systemd: bool) -> PathBuf {
    if systemd {
        PathBuf::from(format!("system.slice:agentvm:{id}"))
    } else {
        crate::container::cgroups::default_path(id)
    }
}

/// The supervisor's cgroup: created at the spec's cgroupsPath, with the
/// CPU and pids limits applied (the memory limit is the guest's RAM, not a
/// host limit on the VMM, which needs headroom beyond it).
pub fn cgroup(spec: &Spec, id: &str, systemd: bool) -> Result<PathBuf, StageError> {
    let linux = spec.linux().as_ref();
    let path = linux
        .and_then(|l| l.cgroups_path().clone())
        .unwrap_or_else(|| default_cgroup_path(id, systemd));
    let err = |message: String| StageError::Cgroup {
        path: path.clone(),
        message,
    };
    let cm = manager(&path, systemd, id)?;
    cm.add_task(Pid::this()).map_err(|e| err(e.to_string()))?;
    if let Some(full) = linux.and_then(|l| l.resources().as_ref()) {
        let r = crate::microvm::spec::host_limits(full);
        cm.apply(&ControllerOpt {
            resources: &r,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| err(e.to_string()))?;
    }
    Ok(path)
}

/// Moves process `pid` (all its threads) into the VM's cgroup `path`,
/// made by [`cgroup`] already.
pub fn join_cgroup(path: &Path, systemd: bool, id: &str, pid: i32) -> Result<(), StageError> {
    manager(path, systemd, id)?
        .add_task(Pid::from_raw(pid))
        .map_err(|e| StageError::Cgroup {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// The cgroup manager of the VM's cgroup `path`.
fn manager(
    path: &Path,
    systemd: bool,
    id: &str,
) -> Result<libcgroups::common::AnyCgroupManager, StageError> {
    libcgroups::common::create_cgroup_manager(CgroupConfig {
        cgroup_path: path.to_path_buf(),
        systemd_cgroup: systemd,
        container_name: id.to_string(),
    })
    .map_err(|e| StageError::Cgroup {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Makes the spec's mount points in a read-only rootfs on the host, as
/// runc does before it makes the root read-only: the guest cannot, since
/// the share is read-only already. A mount inside another mount's
/// destination (`/dev/pts` in `/dev`) is made by the guest in that mount.
pub fn mount_points(spec: &Spec, bundle: &Path, rootfs: &Path) -> Result<(), StageError> {
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    let dests: Vec<&Path> = mounts.iter().map(|m| m.destination().as_path()).collect();
    for m in mounts {
        let dest = m.destination();
        if dests.iter().any(|d| *d != dest && dest.starts_with(d)) {
            continue;
        }
        let file = is_bind(m)
            && m.source()
                .as_ref()
                .map(|src| bundle.join(src))
                .and_then(|src| std::fs::metadata(src).ok())
                .is_some_and(|md| !md.is_dir());
        crate::container::cwd::ensure_mount_point(rootfs, dest, file)?;
    }
    Ok(())
}

/// Bind-mounts each staged host path into `share` (inside our private
/// mount namespace); read-only entries are remounted read-only so the
/// file server, and so the guest, cannot write them.
pub fn share(share: &Path, staged: &[Staged]) -> Result<(), StageError> {
    std::fs::create_dir_all(share).map_err(|source| StageError::Io {
        what: format!("create {}", share.display()),
        source,
    })?;
    // The share is a mount of its own with shared propagation, made before
    // the file server starts: virtiofsd's sandbox makes its copy a slave
    // of it, so what a pod member's relay attaches below it later (in this
    // namespace, `microvm::pod`) reaches the guest through the file server
    // the VM already has. QEMU's jail makes its own copy private.
    mount(
        Some(share),
        share,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(sys(format!("bind {} onto itself", share.display())))?;
    mount(
        None::<&str>,
        share,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(sys(format!("make {} a shared mount", share.display())))?;
    for s in staged {
        let target = share.join(&s.name);
        let meta = std::fs::metadata(&s.source).map_err(|source| StageError::Io {
            what: format!("bind mount source {}", s.source.display()),
            source,
        })?;
        let made = if meta.is_dir() {
            std::fs::create_dir(&target)
        } else {
            std::fs::File::create(&target).map(|_| ())
        };
        made.map_err(|source| StageError::Io {
            what: format!("create {}", target.display()),
            source,
        })?;
        mount(
            Some(&s.source),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(sys(format!("bind {}", s.source.display())))?;
        if s.readonly {
            mount(
                None::<&str>,
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(sys(format!("remount {} read-only", target.display())))?;
        }
    }
    Ok(())
}

/// Puts the guest agent in the share, at `protocol::SHARE_INIT`: a
/// read-only bind of `agent` (a configured guest agent), or of agentvm's
/// own binary. The guest kernel runs it from there as its init. Read-only
/// and a mount point, so the guest can neither write nor replace the
/// host's file through the share.
pub fn agent(share: &Path, agent: Option<&Path>) -> Result<(), StageError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = share.join(crate::protocol::SHARE_BOOT_DIR);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .map_err(|source| StageError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
    let target = share.join(crate::protocol::SHARE_INIT);
    std::fs::File::create(&target).map_err(|source| StageError::Io {
        what: format!("create {}", target.display()),
        source,
    })?;
    // agentvm's own binary by its path: /proc/self/exe is a file of the
    // host's mount namespace, which this private one cannot bind from.
    let own;
    let source = match agent {
        Some(a) => a,
        None => {
            own = std::env::current_exe().map_err(|source| StageError::Io {
                what: "find agentvm's own binary".into(),
                source,
            })?;
            own.as_path()
        }
    };
    mount(
        Some(source),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(sys(format!("bind the guest agent {}", source.display())))?;
    mount(
        None::<&str>,
        &target,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(sys(format!("remount {} read-only", target.display())))
}
