//! `exec` in the container tier.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{ContainerStatus, State};
use libcontainer::syscall::syscall::SyscallType;
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxSeccomp, Process, Spec};

use super::cgroups::{self, JoinCgroups};
use super::console::SizedExec;
use super::notify;
use super::overlay::Overlay;
use super::workload::{CapsAfterSeccomp, Workload};
use super::{lc_error, lsm, ContainerError};
use crate::context::Context;

#[derive(Default)]
pub struct ExecOptions {
    pub process: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
    pub detach: bool,
    pub cwd: Option<PathBuf>,
    pub env: HashMap<String, String>,
    pub user: Option<u32>,
    pub group: Option<u32>,
    pub additional_gids: Vec<u32>,
    pub caps: Vec<String>,
    pub no_new_privs: bool,
    pub preserve_fds: i32,
    pub args: Vec<String>,
    pub ignore_paused: bool,
    /// `exec --cgroup` values (see [`super::cgroups::parse_sub_cgroups`]).
    pub sub_cgroup: Vec<String>,
}

/// runc's refusal of an exec into a paused container.
pub const PAUSED: &str = "cannot exec in a paused container (use --ignore-paused to override)";
/// runc's refusal of an exec into a stopped container.
pub const STOPPED: &str = "cannot exec in a stopped container";

/// Starts a process in the container's namespaces; returns its pid.
pub fn exec(ctx: &Context, id: &str, opts: ExecOptions) -> Result<Pid, ContainerError> {
    let container = super::load(ctx, id)?;
    // As runc 1.1: a created container takes an exec (its init has made
    // the namespaces and waits for start); a paused one only with
    // --ignore-paused; a stopped one never.
    match container.status() {
        ContainerStatus::Running | ContainerStatus::Created => {}
        ContainerStatus::Paused if opts.ignore_paused => {}
        ContainerStatus::Paused => return Err(ContainerError::Status(PAUSED.into())),
        ContainerStatus::Stopped => return Err(ContainerError::Status(STOPPED.into())),
        ContainerStatus::Creating => {
            return Err(ContainerError::NotRunning {
                id: id.to_string(),
                status: super::status_str(ContainerStatus::Creating),
            })
        }
    }
    let process = match &opts.process {
        Some(path) => {
            let process = read_process(path)?;
            lsm::check_process(&process, lsm::selinux_enabled())?;
            Some((path, process))
        }
        None => None,
    };
    let config = container.bundle().join("config.json");
    let (spec, dropped_caps) = crate::bundle::Bundle::read_spec(&config)
        .map_err(|e| ContainerError::Libcontainer(e.to_string()))?;
    let seccomp = container_seccomp(&spec);
    // runc's order under a seccomp profile (see CapsAfterSeccomp): the
    // tenant reads a copy of the process with CAP_SYS_ADMIN kept.
    let mut caps_after_seccomp = None;
    let mut process_copy = None;
    if let (Some(_), Some((path, mut process))) = (&seccomp, process) {
        caps_after_seccomp = CapsAfterSeccomp::plan(&mut process);
        if caps_after_seccomp.is_some() {
            process_copy = Some(ScratchFile::write(path, &process)?);
        }
    }
    let process_path = process_copy
        .as_ref()
        .map(|c| c.0.clone())
        .or(opts.process.clone());
    let (notify, forward) = notify::prepare(seccomp.as_ref())?;
    let join_cgroups = if opts.sub_cgroup.is_empty() {
        JoinCgroups::default()
    } else {
        let paths = cgroups::parse_sub_cgroups(&opts.sub_cgroup)?;
        let init = container.pid().ok_or_else(|| {
            ContainerError::Libcontainer(format!("container {id} has no init pid"))
        })?;
        cgroups::open_sub_cgroups(init.as_raw(), &super::cgroup_path(&container)?, &paths)?
    };
    let overlay = config_overlay(ctx, id, &container, spec, !dropped_caps.is_empty())?;
    let through = overlay.as_ref().map(|o| o.bundle());
    let shadow = match (container.status(), through) {
        (ContainerStatus::Created, _) => Some(Shadow::new(ctx, id, true, through)?),
        (_, Some(_)) => Some(Shadow::new(ctx, id, false, through)?),
        _ => None,
    };
    let root = shadow
        .as_ref()
        .map_or(ctx.root.as_path(), |s| s.root.as_path());
    let builder = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_executor(SizedExec(Workload {
            seccomp,
            join_cgroups,
            notify,
            caps_after_seccomp,
        }))
        .with_root_path(root)
        .map_err(lc_error)?
        .with_pid_file(opts.pid_file.as_ref())
        .map_err(lc_error)?
        .with_console_socket(opts.console_socket.as_ref())
        .with_preserved_fds(opts.preserve_fds)
        .validate_id()
        .map_err(lc_error)?;
    let tenant = builder
        .as_tenant()
        .with_detach(opts.detach)
        .with_cwd(opts.cwd.as_ref())
        .with_env(opts.env)
        .with_process(process_path.as_ref())
        .with_no_new_privs(opts.no_new_privs)
        .with_capabilities(opts.caps)
        .with_container_args(opts.args)
        .with_additional_gids(opts.additional_gids)
        .with_user(opts.user)
        .with_group(opts.group)
        .with_ignore_paused(opts.ignore_paused);
    let pid = tenant.build().map_err(lc_error)?;
    drop(process_copy);
    if let Some(forward) = forward {
        // The builder (and the executor's end of the pair) is gone now, so
        // a process that died before its filter ends the wait.
        let mut state = serde_json::to_value(super::runc_state(&container))
            .map_err(|e| ContainerError::Libcontainer(e.to_string()))?;
        if let Some(o) = state.as_object_mut() {
            o.remove("rootfs");
            o.remove("created");
            o.remove("owner");
        }
        forward.forward(pid.as_raw(), state)?;
    }
    Ok(pid)
}

/// libcontainer's tenant builder joins only a running (or paused) container.
/// For a created one it is pointed at a state root of its own, under the
/// container's directory, holding a copy of the container's state that says
/// running and of libcontainer's config; the copy goes when the exec has
/// started (the tenant reads it only while it builds the process).
struct Shadow {
    root: PathBuf,
}

impl Shadow {
    /// `running`: the copy says running; `bundle`: the bundle path the
    /// copy gives (where the tenant reads the config).
    fn new(
        ctx: &Context,
        id: &str,
        running: bool,
        bundle: Option<&Path>,
    ) -> Result<Shadow, ContainerError> {
        let real = ctx.container_dir(id);
        let shadow = Shadow {
            root: real.join(format!(".exec-root-{}", std::process::id())),
        };
        let dir = shadow.root.join(id);
        std::fs::create_dir_all(&dir).map_err(|source| ContainerError::Write {
            path: dir.clone(),
            source,
        })?;
        let mut state = State::load(&real).map_err(lc_error)?;
        if running {
            state.status = ContainerStatus::Running;
        }
        if let Some(b) = bundle {
            state.bundle = b.to_path_buf();
        }
        state.save(&dir).map_err(lc_error)?;
        let config = real.join(YOUKI_CONFIG);
        std::fs::copy(&config, dir.join(YOUKI_CONFIG)).map_err(|source| ContainerError::Write {
            path: dir.join(YOUKI_CONFIG),
            source,
        })?;
        Ok(shadow)
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            tracing::warn!("cannot remove {}: {e}", self.root.display());
        }
    }
}

/// The config libcontainer's tenant builder reads instead of the
/// bundle's (see `overlay`), when that one would mislead it: it takes the
/// cgroup from the bundle's config, where a missing cgroupsPath means its
/// own `:youki:ID`, not the cgroup `create` recorded (runc's, see
/// `cgroups::default_path`); and it refuses a config with a capability
/// name runc ignores (`edited`: `spec` has them left out).
fn config_overlay(
    ctx: &Context,
    id: &str,
    container: &libcontainer::container::Container,
    mut spec: Spec,
    edited: bool,
) -> Result<Option<Overlay>, ContainerError> {
    let mut changed = edited;
    if !container.systemd() {
        let recorded = super::cgroup_path(container)?;
        if let Some(linux) = spec.linux_mut() {
            if linux.cgroups_path().is_none()
                && recorded != libcontainer::utils::get_cgroup_path(&None, id)
            {
                linux.set_cgroups_path(Some(recorded));
                changed = true;
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    let json = serde_json::to_vec(&spec)
        .map_err(|e| ContainerError::Libcontainer(format!("cannot encode the config: {e}")))?;
    let scratch = ctx
        .root
        .join(format!(".{id}.exec-config-{}.json", std::process::id()));
    match Overlay::install(container.bundle(), &json, &scratch) {
        Ok(o) => Ok(Some(o)),
        Err(e) => {
            tracing::warn!("container {id}: {e}; libcontainer reads the bundle's config");
            Ok(None)
        }
    }
}

/// libcontainer's copy of the container's config in its state directory.
const YOUKI_CONFIG: &str = "youki_config.json";

/// A copy of the `--process` file beside it, removed when dropped.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn write(beside: &Path, process: &Process) -> Result<ScratchFile, ContainerError> {
        let mut name = beside.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{}.caps", std::process::id()));
        let path = beside.with_file_name(name);
        let err = |source: std::io::Error| ContainerError::Write {
            path: path.clone(),
            source,
        };
        let json = serde_json::to_vec(process).map_err(|e| err(e.into()))?;
        std::fs::write(&path, json).map_err(err)?;
        Ok(ScratchFile(path))
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn read_process(path: &std::path::Path) -> Result<Process, ContainerError> {
    let err = |message: String| ContainerError::ProcessFile {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| err(e.to_string()))
}

/// The seccomp profile the container was created with, with runc's ENOSYS
/// rule ([`super::enosys`]).
fn container_seccomp(spec: &Spec) -> Option<LinuxSeccomp> {
    let mut seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    if let Some(s) = seccomp.as_mut() {
        super::enosys::add_rule(s);
    }
    seccomp
}
