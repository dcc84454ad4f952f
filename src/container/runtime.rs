//! The container tier behind the [`crate::tier::Tier`] seam: each runc
//! command on libcontainer, with the runc behaviour libcontainer lacks.

use libcgroups::common::{CgroupManager, FreezerState};
use libcontainer::container::ContainerStatus;
use nix::errno::Errno;
use nix::unistd::Pid;
use oci_spec::runtime::LinuxResources;

use super::create::CreateOptions;
use super::exec::ExecOptions;
use super::tty::{ConsoleSocket, Relay};
use super::{cgroup_manager, foreground, lc_error, load, pids, status_str, ContainerError};
use crate::config::Isolation;
use crate::context::Context;
use crate::tier::{
    self, CheckpointRequest, CreateRequest, ExecRequest, OomWatch, ProcessTable, RestoreRequest,
    RuncState,
};

/// Containers on the host kernel: namespaces, cgroups, seccomp, capabilities.
pub struct Tier;

fn status_error(msg: String) -> tier::TierError {
    ContainerError::Status(msg).into()
}

impl tier::Tier for Tier {
    fn isolation(&self) -> Isolation {
        Isolation::Container
    }

    fn create(&self, ctx: &Context, req: &CreateRequest) -> tier::Result<()> {
        let opts = CreateOptions {
            egress: (!req.egress.is_allow()).then(|| (req.egress.clone(), ctx.config.audit.path())),
            pid_file: req.pid_file.map(Into::into),
            console_socket: req.console_socket.map(Into::into),
            preserve_fds: req.preserve_fds,
            no_pivot: req.no_pivot,
            detached: req.detached,
            ..Default::default()
        };
        super::create::create(ctx, req.id, req.bundle, opts)?;
        Ok(())
    }

    fn start(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        let mut container = load(ctx, id)?;
        if container.status() != ContainerStatus::Created {
            return Err(status_error(tier::cannot_start(status_str(
                container.status(),
            ))));
        }
        // poststart hooks are wrapped (see `hooks`): a failure's message
        // is runc's.
        let hook_errors = super::hooks::message_file(&ctx.root, id);
        let _ = std::fs::remove_file(&hook_errors);
        container
            .start()
            .map_err(|e| match super::hooks::take_message(&hook_errors) {
                Some(msg) => ContainerError::Hook(msg),
                None => lc_error(e),
            })?;
        Ok(())
    }

    fn state(&self, ctx: &Context, id: &str) -> tier::Result<RuncState> {
        Ok(super::runc_state(&load(ctx, id)?))
    }

    fn kill(&self, ctx: &Context, id: &str, signal: i32, all: bool) -> tier::Result<()> {
        let container = load(ctx, id)?;
        let status = container.status();
        if all {
            // As runc: --all also reaches leftovers of a stopped container.
            let cm = cgroup_manager(&container)?;
            let frozen = cm.freeze(FreezerState::Frozen).is_ok();
            for pid in pids(&container)? {
                match crate::signal::send(pid, signal) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(errno) => {
                        return Err(ContainerError::Signal {
                            target: format!("process {pid}"),
                            errno,
                        }
                        .into())
                    }
                }
            }
            // Leave a paused container frozen, unless it is being killed.
            if frozen && (status != ContainerStatus::Paused || signal == libc::SIGKILL) {
                let _ = cm.freeze(FreezerState::Thawed);
            }
            return Ok(());
        }
        if matches!(status, ContainerStatus::Stopped | ContainerStatus::Creating) {
            // runc's words, which containerd's shim matches (checkKillError).
            return Err(status_error("container not running".into()));
        }
        let pid = container
            .pid()
            .ok_or_else(|| status_error(format!("container {id} has no init process")))?;
        match crate::signal::send(pid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(errno) => {
                return Err(ContainerError::SignalInit(super::hooks::go_errno(errno)).into())
            }
        }
        // A frozen task cannot act on SIGKILL: thaw so it dies (runc does too).
        if status == ContainerStatus::Paused && signal == libc::SIGKILL {
            let _ = cgroup_manager(&container)?.freeze(FreezerState::Thawed);
        }
        Ok(())
    }

    fn delete(&self, ctx: &Context, id: &str, force: bool) -> tier::Result<()> {
        let mut container = load(ctx, id)?;
        super::delete::delete(&mut container, force)?;
        Ok(())
    }

    fn checkpoint(&self, ctx: &Context, id: &str, req: &CheckpointRequest) -> tier::Result<()> {
        super::checkpoint::checkpoint(ctx, id, req)?;
        Ok(())
    }

    fn restore(&self, ctx: &Context, req: &RestoreRequest) -> tier::Result<Pid> {
        Ok(super::restore::restore(ctx, req)?)
    }

    fn pause(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        let mut c = load(ctx, id)?;
        if c.status() != ContainerStatus::Running {
            return Err(status_error(tier::NOT_RUNNING.into()));
        }
        c.pause().map_err(lc_error)?;
        Ok(())
    }

    fn resume(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        let mut c = load(ctx, id)?;
        if c.status() != ContainerStatus::Paused {
            return Err(status_error(tier::NOT_PAUSED.into()));
        }
        c.resume().map_err(lc_error)?;
        Ok(())
    }

    fn host_pids(&self, ctx: &Context, id: &str) -> tier::Result<Vec<i32>> {
        Ok(pids(&load(ctx, id)?)?.iter().map(|p| p.as_raw()).collect())
    }

    fn process_table(&self, ctx: &Context, id: &str, _: &[String]) -> tier::Result<ProcessTable> {
        Ok(ProcessTable::Host(self.host_pids(ctx, id)?))
    }

    fn stats(&self, ctx: &Context, id: &str) -> tier::Result<Option<crate::events::Stats>> {
        let container = load(ctx, id)?;
        if container.status() == ContainerStatus::Stopped {
            return Ok(None);
        }
        let stats = cgroup_manager(&container)?
            .stats()
            .map_err(|e| ContainerError::Cgroup {
                id: id.to_string(),
                message: format!("cannot read stats: {e}"),
            })?;
        let cpuset = match super::cgroup_dir(&container, "cpuset") {
            Some(dir) => crate::events::read_cpuset(&dir),
            None => Default::default(),
        };
        Ok(Some(crate::events::Stats::from_cgroup(&stats, cpuset)))
    }

    fn oom_watch(&self, ctx: &Context, id: &str) -> tier::Result<Box<dyn OomWatch>> {
        let container = load(ctx, id)?;
        let dir =
            super::cgroup_dir(&container, "memory").ok_or_else(|| ContainerError::Cgroup {
                id: id.to_string(),
                message: "no memory cgroup to count OOM kills in".into(),
            })?;
        let file = ["memory.events", "memory.oom_control"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists())
            .ok_or_else(|| ContainerError::Cgroup {
                id: id.to_string(),
                message: format!("{} has no OOM kill count", dir.display()),
            })?;
        Ok(Box::new(OomFile {
            id: id.to_string(),
            file,
        }))
    }

    fn update(&self, ctx: &Context, id: &str, resources: &LinuxResources) -> tier::Result<()> {
        super::update(&load(ctx, id)?, resources)?;
        Ok(())
    }

    fn exec(&self, ctx: &Context, req: &ExecRequest) -> tier::Result<u8> {
        let dir = ctx.container_dir(req.id);
        if !dir.join("state.json").exists() {
            return Err(crate::state::StateError::NotFound(req.id.to_string()).into());
        }
        // libcontainer reads the process from a file: write it next to the
        // container's state, and remove it whatever happens.
        let path = dir.join(format!(".exec-{}.json", std::process::id()));
        let data = serde_json::to_vec(req.process).map_err(|e| ContainerError::Write {
            path: path.clone(),
            source: e.into(),
        })?;
        std::fs::write(&path, data).map_err(|source| ContainerError::Write {
            path: path.clone(),
            source,
        })?;
        let result = exec_process(ctx, req, &path).map_err(Into::into);
        let _ = std::fs::remove_file(&path);
        result
    }

    fn init_pid(&self, ctx: &Context, id: &str) -> tier::Result<Pid> {
        let container = load(ctx, id)?;
        container
            .pid()
            .ok_or_else(|| status_error(format!("container {id} has no init pid")))
    }
}

/// The `oom_kill` line of the container's memory cgroup: `memory.events`
/// (v2) or `memory.oom_control` (v1). The cgroup outlives the container's
/// processes until `delete`, so a killed init's count is still read.
struct OomFile {
    id: String,
    file: std::path::PathBuf,
}

impl OomWatch for OomFile {
    fn kills(&mut self, _ctx: &Context) -> tier::Result<u64> {
        let err = |message: String| ContainerError::Cgroup {
            id: self.id.clone(),
            message,
        };
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| err(format!("cannot read {}: {e}", self.file.display())))?;
        Ok(crate::events::oom_kill_count(&text)
            .ok_or_else(|| err(format!("{} has no oom_kill line", self.file.display())))?)
    }
}

fn exec_process(
    ctx: &Context,
    req: &ExecRequest,
    process_path: &std::path::Path,
) -> Result<u8, ContainerError> {
    let terminal = req.process.terminal().unwrap_or(false);
    let own_socket = if terminal && !req.detach && req.console_socket.is_none() {
        Some(ConsoleSocket::bind(&ctx.root, req.id)?)
    } else {
        None
    };
    if !req.detach {
        foreground::become_subreaper()?;
    }
    let opts = ExecOptions {
        process: Some(process_path.to_path_buf()),
        console_socket: match &own_socket {
            Some(s) => Some(s.path().to_path_buf()),
            None => req.console_socket.map(Into::into),
        },
        pid_file: req.pid_file.map(Into::into),
        detach: req.detach || own_socket.is_some(),
        preserve_fds: req.preserve_fds,
        ignore_paused: req.ignore_paused,
        sub_cgroup: req.cgroup.to_vec(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let pid = super::exec::exec(ctx, req.id, opts)?;
    let audit = |exit: Option<u8>, duration| {
        crate::audit::exec::append_or_warn(
            &ctx.config.audit.path(),
            req.id,
            crate::audit::exec::event(req.process, exit.map(i32::from), None, duration),
        )
    };
    if req.detach {
        // The process is the caller's now (runc parity: the pid is the
        // process): its end is not ours to see.
        audit(None, None);
        return Ok(0);
    }
    let relay = match &own_socket {
        Some(s) => Some(Relay::new(s.receive_master()?)),
        None => None,
    };
    drop(own_socket);
    let code = foreground::wait(pid, relay)?;
    audit(Some(code), Some(started.elapsed()));
    Ok(code)
}
