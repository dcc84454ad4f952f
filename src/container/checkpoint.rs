//! `checkpoint` in the container tier: CRIU's dump through our own RPC
//! client (`criu.rs`, shared with `restore`), as runc 1.1 drives it.
//!
//! What runc 1.1 does and this follows: a created or stopped container is
//! refused (`Container cannot be checkpointed in created state`); a paused
//! one is dumped from its frozen cgroup; the images (and CRIU's
//! `dump.log`) go to `--image-path`, with `descriptors.json` naming the
//! init's stdio for `restore`; without `--leave-running` (or `--pre-dump`)
//! CRIU kills the processes after the dump and the container is deleted;
//! a CRIU failure leaves the container as it was and reads `criu failed:
//! ...` with the log file's name.
//!
//! The options runc passes on: `--pre-dump` (memory only, after CRIU says
//! it can track memory changes: `CRIU is missing features` otherwise),
//! `--parent-path` (a previous dump's images, memory tracked against
//! them), `--page-server` (pages go to a `criu page-server`),
//! `--lazy-pages` with `--status-fd` (pages stay for a lazy restore to
//! fetch; `\0` on the descriptor once they can be), `--auto-dedup`,
//! `--empty-ns`.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use libcontainer::container::ContainerStatus;
use oci_spec::runtime::{LinuxNamespaceType, Spec};
use rust_criu::rust_criu_protobuf::rpc;

use super::criu::Swrk;
use super::{lc_error, load, status_str, ContainerError};
use crate::context::Context;
use crate::tier::CheckpointRequest;

/// CRIU's log, in the work directory (the image directory without one).
const LOG: &str = "dump.log";
/// The init's stdio at the dump, for `restore`.
const DESCRIPTORS: &str = "descriptors.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// runc's words (`checkpoint.go`), capital letter included.
    #[error("Container cannot be checkpointed in {0} state")]
    State(&'static str),
    #[error("checkpoint of container {0} under an egress policy is not supported yet: the router's namespaces would have to be in the images")]
    Egress(String),
    #[error("cannot prepare the checkpoint: {what}: {source}")]
    Prepare {
        what: String,
        source: std::io::Error,
    },
    /// runc's words when a feature check fails.
    #[error("CRIU is missing features")]
    MissingFeatures,
    /// runc's words for a `--status-fd` it cannot write to.
    #[error("invalid --status-fd argument {fd}: {why}")]
    StatusFd { fd: i32, why: String },
    /// `message` starts `criu failed: ` as runc's does.
    #[error("{message}\nlog file: {}", log.display())]
    Criu { message: String, log: PathBuf },
}

fn prepare(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Prepare { what, source }
}

/// Asks CRIU whether it has the `wanted` features (runc's
/// `checkCriuFeatures`, one request of its own).
fn check_features(wanted: &rpc::Criu_features) -> Result<(), CheckpointError> {
    let failed = |e: String| CheckpointError::Criu {
        message: format!("criu failed: feature check: {e}"),
        log: PathBuf::from("(none: the feature check writes no log)"),
    };
    let swrk = Swrk::start(Path::new("criu"), &[]).map_err(|e| failed(e.to_string()))?;
    let mut req = rpc::Criu_req::new();
    req.set_type(rpc::Criu_req_type::FEATURE_CHECK);
    req.features = protobuf::MessageField::some(wanted.clone());
    let resp = swrk
        .call(&req, |_, _| Ok(()))
        .map_err(|e| failed(e.to_string()))?;
    let have = resp.features.as_ref().cloned().unwrap_or_default();
    let missing =
        (wanted.mem_track() && !have.mem_track()) || (wanted.lazy_pages() && !have.lazy_pages());
    if missing {
        tracing::debug!(?wanted, ?have, "CRIU lacks a feature");
        return Err(CheckpointError::MissingFeatures);
    }
    Ok(())
}

/// The status descriptor must be open for writing (runc's check).
fn check_status_fd(fd: i32) -> Result<(), CheckpointError> {
    // SAFETY: F_GETFL on a descriptor number only reads its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(CheckpointError::StatusFd {
            fd,
            why: std::io::Error::last_os_error().to_string(),
        });
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(CheckpointError::StatusFd {
            fd,
            why: "not writable".into(),
        });
    }
    Ok(())
}

/// The init's stdio as `/proc/PID/fd/N` names it (`pipe:[123]`), as
/// runc records them.
fn stdio_names(pid: i32) -> Vec<String> {
    (0..3)
        .map(|n| {
            std::fs::read_link(format!("/proc/{pid}/fd/{n}"))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "/dev/null".into())
        })
        .collect()
}

/// A namespace the spec joins by path, as CRIU's external resource
/// (`net[INODE]:extRootNetNS`, the key `restore` hands it back by).
fn external_namespace(
    spec: &Spec,
    typ: LinuxNamespaceType,
) -> Result<Option<String>, CheckpointError> {
    let Some(path) = super::restore::namespace_path(spec, typ) else {
        return Ok(None);
    };
    let (name, key) = match typ {
        LinuxNamespaceType::Network => ("net", "extRootNetNS"),
        LinuxNamespaceType::Pid => ("pid", "extRootPidNS"),
        _ => return Ok(None),
    };
    let meta =
        std::fs::metadata(&path).map_err(prepare(format!("namespace {}", path.display())))?;
    use std::os::unix::fs::MetadataExt;
    Ok(Some(format!("{name}[{}]:{key}", meta.ino())))
}

/// The spec's mounts CRIU is to leave to the restore: each bind mount by
/// its destination, and on a cgroup v1 host without a cgroup namespace
/// each hierarchy the cgroup mount binds.
fn external_mounts(spec: &Spec) -> Vec<String> {
    let mut out = Vec::new();
    for m in spec.mounts().iter().flatten() {
        if super::fixup::is_bind(m) {
            out.push(m.destination().to_string_lossy().into_owned());
        } else if m.typ().as_deref() == Some("cgroup") && super::cgroups::v1_host() {
            let points = libcgroups::v1::util::list_subsystem_mount_points().unwrap_or_default();
            out.extend(
                points
                    .into_iter()
                    .filter(|p| p.starts_with(libcgroups::common::DEFAULT_CGROUP_ROOT))
                    .map(|p| p.to_string_lossy().into_owned()),
            );
        }
    }
    out
}

/// The freezer cgroup CRIU dumps a paused container from.
fn freezer_dir(cgroup_path: &Path) -> Option<PathBuf> {
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    match libcgroups::common::get_cgroup_setup().ok()? {
        libcgroups::common::CgroupSetup::Unified => {
            Some(Path::new(libcgroups::common::DEFAULT_CGROUP_ROOT).join(rel))
        }
        _ => libcgroups::v1::util::get_subsystem_mount_point(
            &libcgroups::v1::ControllerType::Freezer,
        )
        .ok()
        .map(|m| m.join(rel)),
    }
}

pub fn checkpoint(ctx: &Context, id: &str, req: &CheckpointRequest) -> Result<(), ContainerError> {
    let mut container = load(ctx, id)?;
    let paused = match container.status() {
        ContainerStatus::Running => false,
        ContainerStatus::Paused => true,
        status => return Err(CheckpointError::State(status_str(status)).into()),
    };
    if super::egress::in_force(&container.root) {
        return Err(CheckpointError::Egress(id.to_string()).into());
    }
    if req.pre_dump {
        let mut f = rpc::Criu_features::new();
        f.set_mem_track(true);
        check_features(&f)?;
    }
    if req.lazy_pages {
        let mut f = rpc::Criu_features::new();
        f.set_lazy_pages(true);
        check_features(&f)?;
        if let Some(fd) = req.status_fd {
            check_status_fd(fd)?;
        }
    }
    let pid = container
        .pid()
        .ok_or_else(|| ContainerError::Libcontainer("the container has no init pid".into()))?
        .as_raw();
    let spec = Spec::load(container.bundle().join("config.json")).map_err(|e| {
        ContainerError::Libcontainer(format!("cannot read the container's config: {e}"))
    })?;
    let rootfs = {
        let root = spec
            .root()
            .as_ref()
            .map(|r| r.path().clone())
            .unwrap_or_default();
        match root.is_absolute() {
            true => root,
            false => container.bundle().join(root),
        }
    };

    let mkdir = |dir: &Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .and_then(|()| File::open(dir))
            .map_err(prepare(format!("directory {}", dir.display())))
    };
    let images = mkdir(&req.image_path)?;
    let work_dir = req.work_path.as_deref().map(mkdir).transpose()?;
    let log = req.work_path.as_ref().unwrap_or(&req.image_path).join(LOG);
    let names = serde_json::to_vec(&stdio_names(pid))
        .map_err(|e| ContainerError::Libcontainer(format!("cannot encode {DESCRIPTORS}: {e}")))?;
    let descriptors = req.image_path.join(DESCRIPTORS);
    std::fs::write(&descriptors, names).map_err(prepare(descriptors.display().to_string()))?;

    let mut opts = rpc::Criu_opts::new();
    opts.set_images_dir_fd(images.as_raw_fd());
    if let Some(w) = &work_dir {
        opts.set_work_dir_fd(w.as_raw_fd());
    }
    opts.set_log_level(4);
    opts.set_log_file(LOG.into());
    opts.set_root(rootfs.to_string_lossy().into_owned());
    opts.set_manage_cgroups(true);
    opts.set_manage_cgroups_mode(super::criu::cg_mode(req.cgroups_mode));
    opts.set_notify_scripts(true);
    opts.set_pid(pid);
    opts.set_shell_job(req.shell_job);
    opts.set_leave_running(req.leave_running);
    opts.set_tcp_established(req.tcp_established);
    opts.set_ext_unix_sk(req.ext_unix_sk);
    opts.set_file_locks(req.file_locks);
    opts.set_orphan_pts_master(true);
    opts.set_auto_dedup(req.auto_dedup);
    opts.set_lazy_pages(req.lazy_pages);
    if req.empty_ns != 0 {
        opts.set_empty_ns(req.empty_ns);
    }
    if let Some(parent) = &req.parent_path {
        opts.set_parent_img(parent.to_string_lossy().into_owned());
        opts.set_track_mem(true);
    }
    if let Some((address, port)) = &req.page_server {
        let mut ps = rpc::Criu_page_server_info::new();
        ps.set_address(address.clone());
        ps.set_port(*port);
        opts.ps = protobuf::MessageField::some(ps);
    }
    if paused {
        let cgroup = container.spec().map(|c| c.cgroup_path).map_err(lc_error)?;
        if let Some(dir) = freezer_dir(&cgroup) {
            opts.set_freeze_cgroup(dir.to_string_lossy().into_owned());
        }
    }
    for dest in external_mounts(&spec) {
        let mut m = rpc::Ext_mount_map::new();
        m.set_key(dest.clone());
        m.set_val(dest);
        opts.ext_mnt.push(m);
    }
    for typ in [LinuxNamespaceType::Network, LinuxNamespaceType::Pid] {
        if let Some(ext) = external_namespace(&spec, typ)? {
            opts.external.push(ext);
        }
    }
    let mut request = rpc::Criu_req::new();
    request.set_type(match req.pre_dump {
        true => rpc::Criu_req_type::PRE_DUMP,
        false => rpc::Criu_req_type::DUMP,
    });
    request.opts = protobuf::MessageField::some(opts);

    let mut keep = vec![images.as_raw_fd()];
    keep.extend(work_dir.as_ref().map(|w| w.as_raw_fd()));
    let failed = |message: String| CheckpointError::Criu {
        message: runc_words(&message),
        log: log.clone(),
    };
    let swrk = Swrk::start(Path::new("criu"), &keep).map_err(|e| failed(e.to_string()))?;
    let status_fd = req.status_fd.filter(|_| req.lazy_pages);
    swrk.call(&request, |notify, _| {
        if notify.script() == "status-ready" {
            if let Some(fd) = status_fd {
                // SAFETY: the descriptor was given to us on the command
                // line and checked writable; it is borrowed for the write.
                let fd = unsafe { BorrowedFd::borrow_raw(fd) };
                let mut f = File::from(fd.try_clone_to_owned().map_err(|e| e.to_string())?);
                f.write_all(&[0]).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })
    .map_err(|e| failed(e.to_string()))?;

    // As runc: unless told to keep it, the dumped container is gone.
    if !(req.leave_running || req.pre_dump) {
        container
            .set_status(ContainerStatus::Stopped)
            .save()
            .map_err(lc_error)?;
        container.delete(false).map_err(lc_error)?;
    }
    tracing::debug!(id, pre_dump = req.pre_dump, "checkpointed");
    Ok(())
}

/// A failed checkpoint's message as runc starts it: `criu failed: `.
fn runc_words(message: &str) -> String {
    match message.starts_with("criu failed: ") {
        true => message.to_string(),
        false => format!("criu failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::CgroupsMode;

    #[test]
    fn messages_in_runc_words() {
        assert_eq!(
            CheckpointError::State("created").to_string(),
            "Container cannot be checkpointed in created state"
        );
        assert_eq!(
            runc_words("criu failed: type \"DUMP\" errno 0"),
            "criu failed: type \"DUMP\" errno 0"
        );
        assert_eq!(
            runc_words("criu version 31600 is too old"),
            "criu failed: criu version 31600 is too old"
        );
        let e = CheckpointError::Criu {
            message: runc_words("x"),
            log: PathBuf::from("/i/dump.log"),
        };
        assert_eq!(e.to_string(), "criu failed: x\nlog file: /i/dump.log");
    }

    #[test]
    fn cgroups_modes_as_runc_names_them() {
        for (name, mode) in [
            ("soft", CgroupsMode::Soft),
            ("full", CgroupsMode::Full),
            ("strict", CgroupsMode::Strict),
            ("ignore", CgroupsMode::Ignore),
        ] {
            assert_eq!(name.parse::<CgroupsMode>(), Ok(mode));
        }
        assert!("props".parse::<CgroupsMode>().is_err());
        assert_eq!(
            crate::container::criu::cg_mode(CgroupsMode::Soft),
            rpc::Criu_cg_mode::SOFT
        );
    }
}
