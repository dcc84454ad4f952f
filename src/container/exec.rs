//! `exec` in the container tier.

use std::collections::HashMap;
use std::path::PathBuf;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::ContainerStatus;
use libcontainer::syscall::syscall::SyscallType;
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, Process, Spec};

use super::console::SizedExec;
use super::workload::Workload;
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
    pub sub_cgroup: Option<String>,
}

/// Starts a process in the container's namespaces; returns its pid.
pub fn exec(ctx: &Context, id: &str, opts: ExecOptions) -> Result<Pid, ContainerError> {
    let container = super::load(ctx, id)?;
    let runnable = match container.status() {
        ContainerStatus::Running => true,
        ContainerStatus::Paused => opts.ignore_paused,
        _ => false,
    };
    if !runnable {
        return Err(ContainerError::NotRunning {
            id: id.to_string(),
            status: super::status_str(container.status()),
        });
    }
    if let Some(path) = &opts.process {
        lsm::check_process(&read_process(path)?, lsm::selinux_enabled())?;
    }
    let seccomp = container_seccomp(&container.bundle().join("config.json"))?;
    let builder = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_executor(SizedExec(Workload { seccomp }))
        .with_root_path(&ctx.root)
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
        .with_process(opts.process.as_ref())
        .with_no_new_privs(opts.no_new_privs)
        .with_capabilities(opts.caps)
        .with_container_args(opts.args)
        .with_additional_gids(opts.additional_gids)
        .with_user(opts.user)
        .with_group(opts.group)
        .with_ignore_paused(opts.ignore_paused)
        .with_sub_cgroup(opts.sub_cgroup);
    tenant.build().map_err(lc_error)
}

fn read_process(path: &std::path::Path) -> Result<Process, ContainerError> {
    let err = |message: String| ContainerError::ProcessFile {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| err(e.to_string()))
}

/// The seccomp profile the container was created with.
fn container_seccomp(config: &std::path::Path) -> Result<Option<LinuxSeccomp>, ContainerError> {
    let spec = Spec::load(config).map_err(lc_error)?;
    let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    if let Some(s) = &seccomp {
        let notifies = s
            .syscalls()
            .iter()
            .flatten()
            .any(|r| r.action() == LinuxSeccompAction::ScmpActNotify);
        if notifies {
            return Err(ContainerError::Libcontainer(
                "exec into a container whose seccomp profile uses SCMP_ACT_NOTIFY is not supported"
                    .into(),
            ));
        }
    }
    Ok(seccomp)
}
