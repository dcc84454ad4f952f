//! `restore` in the container tier: CRIU brings back what `checkpoint`
//! saved, as runc 1.1 does it (libcontainer 0.7 has a dump but no restore).
//!
//! The steps, in runc's order:
//! - the container's state directory and its cgroup (from the spec, or
//!   runc's default path), with the spec's resources;
//! - `criu swrk` started and moved into that cgroup, which becomes the root
//!   of the checkpoint's cgroups (`cg_root`);
//! - the rootfs bind-mounted on `criu-root` in the state directory (CRIU
//!   wants a mount point whose parent is not overmounted), mount points
//!   made for the spec's mounts as `create` made them, each bind mount
//!   named as external with its source, and the stdio pipes the
//!   checkpoint recorded (`descriptors.json`) handed over as ours;
//! - at `setup-namespaces` the prestart and createRuntime hooks run, at
//!   `post-restore` the pid file is written, at `orphan-pts-master` a
//!   terminal's master goes to the console socket;
//! - the restored init is our child (`rst_sibling`): the caller waits for
//!   it or leaves it to its subreaper, as for `run`.
//!
//! Any failure removes the state directory, the cgroup and the mount.

use std::fs::File;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use libcgroups::common::{AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::{Container, ContainerStatus};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxNamespaceType, Spec};
use rust_criu::rust_criu_protobuf::rpc;

use super::criu::{self, Swrk};
use super::{cgroups, fixup, lc_error, ContainerError};
use crate::config::Isolation;
use crate::context::Context;
use crate::state::{process_start_time, Record};
use crate::tier::RestoreRequest;

/// CRIU's log, in the work directory (the image directory without one).
const LOG: &str = "restore.log";
/// The stdio the checkpoint saw, written by libcontainer's `checkpoint`.
const DESCRIPTORS: &str = "descriptors.json";
/// The rootfs's bind mount for CRIU, in the container's state directory.
const CRIU_ROOT: &str = "criu-root";

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot open the image directory {path}: {source}")]
    Images {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {message}")]
    Descriptors { path: PathBuf, message: String },
    #[error(
        "restore of a container with a terminal needs --console-socket or a foreground restore"
    )]
    NoConsoleSocket,
    #[error("--empty-ns {0}: only network is supported, as in runc")]
    EmptyNs(String),
    #[error("cannot prepare the restore: {what}: {source}")]
    Prepare {
        what: String,
        source: std::io::Error,
    },
    #[error("cgroup {path}: {message}")]
    Cgroup { path: PathBuf, message: String },
    /// CRIU's failure in runc's words, and where its log is.
    #[error("{message}\nlog file: {}", log.display())]
    Criu { message: String, log: PathBuf },
}

fn prepare(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::Prepare { what, source }
}

fn errno_io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// What was made, undone on failure (and the root mount in any case).
struct Made {
    dir: Option<PathBuf>,
    root_mount: Option<PathBuf>,
    cgroup: Option<AnyCgroupManager>,
    /// CRIU's work directory, where a CRIU that died mid-restore leaves
    /// its cgroup yard mounted.
    work: Option<PathBuf>,
}

impl Made {
    fn unmount_root(&mut self) {
        if let Some(root) = self.root_mount.take() {
            let _ = umount2(&root, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(&root);
        }
    }

    fn keep(mut self) {
        self.unmount_root();
        self.dir = None;
        self.cgroup = None;
        self.work = None;
    }
}

/// Detaches what a CRIU that died left mounted in its work directory
/// `work`: its cgroup yard (`.criu.cgyard.XXXXXX`, a tmpfs with the
/// hierarchies below it), which CRIU removes itself when it ends normally.
fn unmount_cgroup_yards(work: &Path) {
    let Ok(work) = work.canonicalize() else {
        return;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let yards: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(super::cgroupns::unescape(p)))
        .filter(|p| {
            p.parent() == Some(work.as_path())
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".criu.cgyard."))
        })
        .collect();
    for yard in yards {
        match umount2(&yard, MntFlags::MNT_DETACH) {
            Ok(()) => {
                let _ = std::fs::remove_dir(&yard);
            }
            Err(nix::errno::Errno::EINVAL) => {} // the same yard, stacked, already gone
            Err(e) => tracing::warn!("cannot unmount CRIU's {}: {e}", yard.display()),
        }
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        self.unmount_root();
        if let Some(work) = self.work.take() {
            unmount_cgroup_yards(&work);
        }
        if let Some(cm) = self.cgroup.take() {
            if let Err(e) = cm.remove() {
                tracing::warn!("cannot remove the cgroup of a failed restore: {e}");
            }
        }
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Restores container `req.id` from `req.image_path`; returns its init's
/// pid, our child. The caller holds the root lock and has checked that
/// the id is free.
pub fn restore(ctx: &Context, req: &RestoreRequest) -> Result<Pid, ContainerError> {
    let empty_net = empty_namespaces(&req.empty_ns)?;
    let bundle = req.bundle;
    let spec = &bundle.spec;
    if bundle.terminal() && req.console_socket.is_none() {
        return Err(RestoreError::NoConsoleSocket.into());
    }
    let images = File::open(&req.image_path).map_err(|source| RestoreError::Images {
        path: req.image_path.clone(),
        source,
    })?;
    let stdio = descriptors(&req.image_path)?;
    let work = req.work_path.as_ref().unwrap_or(&req.image_path);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(work)
        .map_err(prepare(format!("work directory {}", work.display())))?;
    let work_dir =
        File::open(work).map_err(prepare(format!("work directory {}", work.display())))?;
    let log = work.join(LOG);

    let id = req.id;
    let dir = ctx.container_dir(id);
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(&dir)
        .map_err(prepare(format!("state directory {}", dir.display())))?;
    let mut made = Made {
        dir: Some(dir.clone()),
        root_mount: None,
        cgroup: None,
        work: Some(work.clone()),
    };

    // The cgroup as `create` names it.
    let mut spec = spec.clone();
    let cgroup_path = cgroups::resolve_path(&mut spec, id);
    if !ctx.systemd_cgroup {
        cgroups::refuse_frozen(&cgroup_path)?;
    }
    let cgroup_error = |message: String| RestoreError::Cgroup {
        path: cgroup_path.clone(),
        message,
    };
    let cm = libcgroups::common::create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup_path.clone(),
        systemd_cgroup: ctx.systemd_cgroup,
        container_name: id.to_string(),
    })
    .map_err(|e| cgroup_error(e.to_string()))?;

    // The namespaces the spec joins by path are the checkpoint's external
    // ones (libcontainer's dump names network and pid so).
    let mut externals: Vec<(String, File)> = Vec::new();
    for (typ, key) in [
        (LinuxNamespaceType::Network, "extRootNetNS"),
        (LinuxNamespaceType::Pid, "extRootPidNS"),
    ] {
        if let Some(path) = namespace_path(&spec, typ) {
            let f = File::open(&path).map_err(prepare(format!("namespace {}", path.display())))?;
            externals.push((key.to_string(), f));
        }
    }

    let mut keep = vec![images.as_raw_fd(), work_dir.as_raw_fd()];
    keep.extend(externals.iter().map(|(_, f)| f.as_raw_fd()));
    let swrk = Swrk::start(Path::new("criu"), &keep).map_err(|e| RestoreError::Criu {
        message: format!("criu failed: {e}"),
        log: log.clone(),
    })?;
    // CRIU restores into the container's cgroup: it goes there first.
    let criu_pid = Pid::from_raw(swrk.pid());
    let placed = cm
        .add_task(criu_pid)
        .map_err(|e| cgroup_error(e.to_string()))
        .and_then(|()| {
            let default = Default::default();
            let resources = spec
                .linux()
                .as_ref()
                .and_then(|l| l.resources().as_ref())
                .unwrap_or(&default);
            cm.apply(&ControllerOpt {
                resources,
                disable_oom_killer: cgroups::oom_killer_disabled(&spec),
                oom_score_adj: None,
                freezer_state: None,
            })
            .map_err(|e| cgroup_error(e.to_string()))
        });
    made.cgroup = Some(cm);
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{criu_pid}/cgroup"));
    let setup = placed.map_err(ContainerError::from).and_then(|()| {
        let proc_cgroup = proc_cgroup.map_err(prepare("the cgroups of criu"))?;
        // The rootfs, where CRIU wants it.
        let root = dir.join(CRIU_ROOT);
        std::fs::create_dir(&root).map_err(prepare(format!("{}", root.display())))?;
        mount(
            Some(&bundle.rootfs),
            &root,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| {
            prepare(format!("bind mount of the rootfs on {}", root.display()))(errno_io(e))
        })?;
        made.root_mount = Some(root.clone());
        make_mount_points(&spec, &bundle.rootfs)?;
        Ok((root, proc_cgroup))
    });
    let (root, proc_cgroup) = match setup {
        Ok(v) => v,
        Err(e) => {
            swrk.abandon();
            return Err(e);
        }
    };

    let mut opts = rpc::Criu_opts::new();
    opts.set_images_dir_fd(images.as_raw_fd());
    opts.set_work_dir_fd(work_dir.as_raw_fd());
    opts.set_log_level(4);
    opts.set_log_file(LOG.into());
    opts.set_evasive_devices(true);
    opts.set_rst_sibling(true);
    opts.set_root(root.to_string_lossy().into_owned());
    opts.set_manage_cgroups(true);
    opts.set_manage_cgroups_mode(criu::cg_mode(req.cgroups_mode));
    opts.set_notify_scripts(true);
    opts.set_shell_job(req.shell_job);
    opts.set_ext_unix_sk(req.ext_unix_sk);
    opts.set_tcp_established(req.tcp_established);
    opts.set_file_locks(req.file_locks);
    opts.set_orphan_pts_master(true);
    opts.set_auto_dedup(req.auto_dedup);
    // As runc: the pages come from `criu lazy-pages`, which the caller
    // started on the work directory (its socket is there).
    opts.set_lazy_pages(req.lazy_pages);
    // As runc: the restored processes' LSM profile and the mounts'
    // context, for Podman with SELinux or AppArmor.
    if let Some(profile) = &req.lsm_profile {
        opts.set_lsm_profile(profile.clone());
    }
    if let Some(context) = &req.lsm_mount_context {
        opts.set_lsm_mount_context(context.clone());
    }
    if empty_net {
        opts.set_empty_ns(libc::CLONE_NEWNET as u32);
    }
    let mut ext_mounts = external_mounts(&spec, &bundle.path);
    if has_cgroup_mount(&spec)
        && namespace_path(&spec, LinuxNamespaceType::Cgroup).is_none()
        && !has_namespace(&spec, LinuxNamespaceType::Cgroup)
    {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        ext_mounts.extend(criu::cgroup_v1_mounts(&mountinfo, &proc_cgroup));
    }
    for (key, val) in ext_mounts {
        let mut m = rpc::Ext_mount_map::new();
        m.set_key(key);
        m.set_val(val);
        opts.ext_mnt.push(m);
    }
    for (fd, key) in stdio
        .iter()
        .enumerate()
        .filter(|(_, k)| k.starts_with("pipe:"))
    {
        let mut i = rpc::Inherit_fd::new();
        i.set_key(key.clone());
        i.set_fd(fd as i32);
        opts.inherit_fd.push(i);
    }
    for (key, f) in &externals {
        let mut i = rpc::Inherit_fd::new();
        i.set_key(key.clone());
        i.set_fd(f.as_raw_fd());
        opts.inherit_fd.push(i);
    }
    for (ctrl, path) in criu::cgroup_roots(&proc_cgroup) {
        let mut r = rpc::Cgroup_root::new();
        if !ctrl.is_empty() {
            r.set_ctrl(ctrl);
        }
        r.set_path(path);
        opts.cg_root.push(r);
    }
    let mut request = rpc::Criu_req::new();
    request.set_type(rpc::Criu_req_type::RESTORE);
    request.opts = protobuf::MessageField::some(opts);

    // The container as the hooks see it while CRIU restores.
    let mut container = Container::new(id, ContainerStatus::Creating, None, &bundle.path, &dir)
        .map_err(lc_error)?;
    container
        .set_systemd(ctx.systemd_cgroup)
        .set_annotations(spec.annotations().clone())
        .set_creator(nix::unistd::geteuid().as_raw());
    container.save().map_err(lc_error)?;
    libcontainer::config::YoukiConfig::from_spec(&spec, id)
        .and_then(|c| c.save(&dir))
        .map_err(|e| {
            ContainerError::Libcontainer(format!("cannot save the container's config: {e}"))
        })?;

    let hooks = spec.hooks().clone();
    let mut restored: Option<i32> = None;
    let result = swrk.call(&request, |notify, fd| match notify.script() {
        "setup-namespaces" => {
            let pid = Pid::from_raw(notify.pid());
            for hooks in [
                hooks.as_ref().and_then(|h| h.prestart().as_ref()),
                hooks.as_ref().and_then(|h| h.create_runtime().as_ref()),
            ] {
                libcontainer::hooks::run_hooks(
                    hooks,
                    Some(&container.state),
                    Some(&bundle.path),
                    Some(pid),
                    None,
                )
                .map_err(|e| lc_error(e).to_string())?;
            }
            Ok(())
        }
        "post-restore" => {
            restored = Some(notify.pid());
            Ok(())
        }
        "orphan-pts-master" => match (fd, &req.console_socket) {
            (Some(master), Some(socket)) => send_master(socket, master),
            _ => Ok(()),
        },
        _ => Ok(()),
    });
    let resp = result.map_err(|e| RestoreError::Criu {
        message: e.to_string(),
        log: log.clone(),
    })?;
    let pid = restored
        .or(resp.restore.pid)
        .filter(|&p| p > 0)
        .ok_or_else(|| RestoreError::Criu {
            message: "criu failed: it did not give the restored pid".into(),
            log: log.clone(),
        })?;

    // As runc: the restored container was created now.
    container.state.created = Some(chrono::Utc::now());
    container
        .set_status(ContainerStatus::Running)
        .set_pid(pid)
        .save()
        .map_err(lc_error)?;
    Record {
        isolation: Isolation::Container,
        init_start_time: process_start_time(pid),
    }
    .save(&ctx.root, id)?;
    if let Some(path) = &req.pid_file {
        std::fs::write(path, pid.to_string()).map_err(|source| ContainerError::Write {
            path: path.clone(),
            source,
        })?;
    }
    made.keep();
    Ok(Pid::from_raw(pid))
}

/// `--empty-ns`: only `network` (runc's one choice); whether it was given.
fn empty_namespaces(names: &[String]) -> Result<bool, RestoreError> {
    let mut net = false;
    for n in names {
        match n.as_str() {
            "network" => net = true,
            other => return Err(RestoreError::EmptyNs(other.to_string())),
        }
    }
    Ok(net)
}

/// The init's stdio at the checkpoint: three names such as `pipe:[123]`.
fn descriptors(images: &Path) -> Result<Vec<String>, RestoreError> {
    let path = images.join(DESCRIPTORS);
    let text = std::fs::read(&path).map_err(|e| RestoreError::Descriptors {
        path: path.clone(),
        message: e.to_string(),
    })?;
    serde_json::from_slice(&text).map_err(|e| RestoreError::Descriptors {
        path,
        message: e.to_string(),
    })
}

/// The path of a namespace the spec joins.
pub(super) fn namespace_path(spec: &Spec, typ: LinuxNamespaceType) -> Option<PathBuf> {
    spec.linux()
        .as_ref()?
        .namespaces()
        .as_ref()?
        .iter()
        .find(|ns| ns.typ() == typ)?
        .path()
        .clone()
}

fn has_cgroup_mount(spec: &Spec) -> bool {
    spec.mounts()
        .iter()
        .flatten()
        .any(|m| m.typ().as_deref() == Some("cgroup"))
}

fn has_namespace(spec: &Spec, typ: LinuxNamespaceType) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|nss| nss.iter().any(|ns| ns.typ() == typ))
}

/// Each bind mount of the spec as CRIU's external mount: the destination
/// the checkpoint named it by, and the source to bind now (a relative
/// source is the bundle's, as at `create`).
fn external_mounts(spec: &Spec, bundle: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for m in spec.mounts().iter().flatten() {
        if !fixup::is_bind(m) {
            continue;
        }
        let Some(source) = m.source() else { continue };
        let source = match source.is_absolute() {
            true => source.clone(),
            false => bundle.join(source),
        };
        out.push((
            m.destination().to_string_lossy().into_owned(),
            source.to_string_lossy().into_owned(),
        ));
    }
    out
}

/// The mount points `create` made in the rootfs, made again where missing
/// (a fresh copy of the rootfs has none), except below a tmpfs mount,
/// whose content CRIU restores: directories, or an empty file for a bind
/// mount of a file.
fn make_mount_points(spec: &Spec, rootfs: &Path) -> Result<(), RestoreError> {
    let mounts: Vec<_> = spec.mounts().iter().flatten().collect();
    let tmpfs: Vec<&Path> = mounts
        .iter()
        .filter(|m| m.typ().as_deref() == Some("tmpfs"))
        .map(|m| m.destination().as_path())
        .collect();
    for m in &mounts {
        let dest = m.destination();
        if tmpfs.iter().any(|t| dest != *t && dest.starts_with(t)) {
            continue;
        }
        let Some(target) = inside(rootfs, dest) else {
            continue;
        };
        if std::fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        let file = fixup::is_bind(m)
            && m.source()
                .as_ref()
                .and_then(|s| std::fs::metadata(s).ok())
                .is_some_and(|md| !md.is_dir());
        let made = match file {
            true => target
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| File::create(&target).map(|_| ())),
            false => std::fs::create_dir_all(&target),
        };
        made.map_err(prepare(format!("mount point {}", target.display())))?;
    }
    Ok(())
}

/// `dest` under `rootfs`, refusing a path that leaves it: `..` in the
/// destination or a symlink on the way that points out. None where the
/// path cannot be followed (CRIU then reports the mount it cannot make).
fn inside(rootfs: &Path, dest: &Path) -> Option<PathBuf> {
    let mut at = rootfs.to_path_buf();
    for part in dest.components() {
        match part {
            std::path::Component::Normal(p) => {
                at.push(p);
                if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
                    return None;
                }
            }
            std::path::Component::ParentDir => return None,
            _ => {}
        }
    }
    Some(at)
}

/// Hands a restored terminal's master to the console socket, as `create`
/// does (runc's "orphan-pts-master").
fn send_master(socket: &Path, master: OwnedFd) -> Result<(), String> {
    let sock = UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot connect to the console socket {}: {e}",
            socket.display()
        )
    })?;
    let fds = [master.as_raw_fd()];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(b"/dev/ptmx")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("cannot send the terminal to {}: {e}", socket.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_criu_s_cgroup_yard_is_unmounted_and_nothing_else() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        use nix::mount::{mount, MsFlags};
        let work = tempfile::tempdir().unwrap();
        let yard = work.path().join(".criu.cgyard.Ab12Cd");
        let other = work.path().join("other");
        let tmpfs = |at: &Path| {
            std::fs::create_dir(at).unwrap();
            mount(
                Some("tmpfs"),
                at,
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        };
        tmpfs(&yard);
        tmpfs(&yard.join("memory"));
        tmpfs(&other);
        let mounted = |p: &Path| {
            let p = p.canonicalize().unwrap();
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .any(|m| Path::new(m) == p)
        };
        unmount_cgroup_yards(work.path());
        assert!(!yard.exists(), "the yard stays mounted or in place");
        assert!(mounted(&other), "another mount in the work directory went");
        umount2(&other, MntFlags::MNT_DETACH).unwrap();
    }

    #[test]
    fn only_the_network_namespace_can_be_left_empty() {
        assert_eq!(empty_namespaces(&[]).ok(), Some(false));
        assert_eq!(empty_namespaces(&["network".into()]).ok(), Some(true));
        assert_eq!(
            empty_namespaces(&["pid".into()])
                .err()
                .map(|e| e.to_string()),
            Some("--empty-ns pid: only network is supported, as in runc".into())
        );
    }

    #[test]
    fn mount_points_stay_in_the_rootfs() {
        let dir = std::env::temp_dir().join(format!("agentvm-restore-{}", std::process::id()));
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::os::unix::fs::symlink("/", rootfs.join("escape")).unwrap();
        assert_eq!(
            inside(&rootfs, Path::new("/data/x")),
            Some(rootfs.join("data/x"))
        );
        assert_eq!(inside(&rootfs, Path::new("/../etc")), None);
        assert_eq!(inside(&rootfs, Path::new("/escape/tmp")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
