//! The `container` tier: namespaces, cgroups, seccomp and capabilities on the
//! host kernel, through youki's `libcontainer`.
//!
//! libcontainer does the heavy lifting (clone, rootfs, seccomp, hooks at
//! create time); this module adds what runc users rely on and libcontainer
//! does differently: exact runc state output, pid-reuse detection, `kill`
//! that does not change state, `delete` that only warns on poststop hook
//! failures, foreground `run`/`exec` with signal forwarding and a real pty,
//! and what libcontainer 0.7 leaves out: mount flags and propagation
//! (`fixup`), `consoleSize` (`console`), a missing cwd (`cwd`), refusing
//! SELinux labels it cannot apply (`lsm`), multi-range id maps (`idmap`),
//! cgroup settings, runc's default cgroup and `exec --cgroup` as runc
//! applies them (`cgroups`), hooks that fail in runc's words (`hooks`),
//! through a config of ours that libcontainer reads (`overlay`).

use std::path::{Path, PathBuf};

use libcgroups::common::{AnyCgroupManager, CgroupConfig, CgroupManager};
use libcontainer::container::{Container, ContainerStatus};
use nix::unistd::Pid;

use crate::context::Context;
use crate::state::{self, Record};
use crate::tier::RuncState;

pub mod bindcheck;
pub mod binds;
pub mod cgroupns;
pub mod cgroups;
pub mod checkpoint;
pub mod console;
pub mod create;
mod criu;
pub mod cwd;
pub mod delete;
pub mod egress;
pub mod enosys;
pub mod exec;
pub mod fixup;
pub mod foreground;
pub mod hooks;
pub mod idmap;
pub mod lsm;
pub mod notify;
pub mod overlay;
pub mod restore;
mod runtime;
pub(crate) mod sys;
pub mod tty;
pub mod workload;

pub use runtime::Tier;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("{0}")]
    Libcontainer(String),
    #[error("container {id} is not running (status {status})")]
    NotRunning { id: String, status: &'static str },
    #[error("cgroup of container {id}: {message}")]
    Cgroup { id: String, message: String },
    #[error(transparent)]
    Lsm(#[from] lsm::LsmError),
    #[error(transparent)]
    Cwd(#[from] cwd::CwdError),
    #[error(transparent)]
    IdMap(#[from] idmap::IdMapError),
    #[error(transparent)]
    Fixup(#[from] fixup::FixupError),
    #[error(transparent)]
    CgroupNs(#[from] cgroupns::CgroupNsError),
    #[error(transparent)]
    Binds(#[from] binds::BindError),
    #[error(transparent)]
    Console(#[from] console::ConsoleError),
    #[error(transparent)]
    Cgroups(#[from] cgroups::CgroupError),
    #[error(transparent)]
    Notify(#[from] notify::NotifyError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Restore(#[from] restore::RestoreError),
    #[error("cannot read process file {path}: {message}")]
    ProcessFile { path: PathBuf, message: String },
    #[error(transparent)]
    Foreground(#[from] foreground::ForegroundError),
    #[error(transparent)]
    Tty(#[from] tty::TtyError),
    #[error(transparent)]
    Delete(#[from] delete::DeleteError),
    #[error(transparent)]
    Egress(#[from] egress::EgressError),
    #[error(transparent)]
    Overlay(#[from] overlay::OverlayError),
    /// A hook failed; runc's message (see `hooks`).
    #[error("{0}")]
    Hook(String),
    /// A command that needs another status than the container's.
    #[error("{0}")]
    Status(String),
    /// runc's words for a signal the kernel refuses (`kill ID 99`).
    #[error("unable to signal init: {0}")]
    SignalInit(String),
    #[error("cannot signal {target}: {errno}")]
    Signal {
        target: String,
        errno: nix::errno::Errno,
    },
    #[error("cannot change to the bundle directory {path}: {source}")]
    Chdir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// libcontainer's errors carry their cause chain as sources; flatten it into
/// one line because that is what the shim shows the user.
pub fn lc_error(err: impl std::error::Error) -> ContainerError {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !msg.contains(&next) {
            msg.push_str(": ");
            msg.push_str(&next);
        }
        source = s.source();
    }
    ContainerError::Libcontainer(runc_init_message(&runc_hook_message(&msg)))
}

/// libcontainer 0.7's words for an error of the container's init (the
/// process that becomes the workload: a mount, `chdir`, the executable's
/// lookup), in runc's: `unable to start container process: ...`. Callers
/// read what follows (Docker's exit codes 126 and 127 come from it).
fn runc_init_message(msg: &str) -> String {
    const LC: &str =
        "failed to create container: exec process failed with error error in executing process : ";
    const LC_INNER: &str = "exec process failed with error error in executing process : ";
    const RUNC: &str = "unable to start container process: ";
    msg.replace(LC, RUNC)
        .replace(LC_INNER, RUNC)
        // runc's console-socket refusals, with libcontainer's name for the
        // runtime in them ("cannot allocate tty if youki will detach ...").
        .replace(" if youki will ", " if agentvm will ")
}

/// libcontainer 0.7's words for a hook that exited non-zero (its
/// `HookError::NonZeroExitCode`, wrapped as "failed hooks ..." by its main
/// process), in runc's: `error running hook: exit status N`.
fn runc_hook_message(msg: &str) -> String {
    const LC: &str = "hook command exited with non-zero exit code: ";
    const RUNC: &str = "error running hook: exit status ";
    msg.replace(&format!("failed hooks {LC}"), RUNC)
        .replace(LC, RUNC)
}

/// runc's status strings.
pub fn status_str(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Creating => "creating",
        ContainerStatus::Created => "created",
        ContainerStatus::Running => "running",
        ContainerStatus::Stopped => "stopped",
        ContainerStatus::Paused => "paused",
    }
}

/// Loads a container and settles its status against reality: a pid that is
/// gone, a zombie, or a pid reused by another process means stopped.
/// libcontainer saves `state.json` in place (truncated, then written): a
/// read at that moment parses an empty or partial file although nothing is
/// wrong. Taken at its word, such a read made `agentvm events` end its OOM
/// watch as if the container had stopped, while `start` was running and
/// before the workload was killed over its limit (CRI's `OOMKilled` test
/// failed so under load). A file that does not parse is read again.
fn load_state(dir: PathBuf) -> Result<Container, libcontainer::error::LibcontainerError> {
    use libcontainer::container::state::StateError;
    use libcontainer::error::LibcontainerError;
    read_again(
        || Container::load(dir.clone()),
        |e| {
            matches!(
                e,
                LibcontainerError::State(StateError::ParseStateFile { .. })
            )
        },
    )
}

/// `read`, tried up to 10 times 50 ms apart while it fails with an error
/// `passing` says may pass; any other error at once.
fn read_again<T, E>(
    mut read: impl FnMut() -> Result<T, E>,
    passing: impl Fn(&E) -> bool,
) -> Result<T, E> {
    const TRIES: u32 = 10;
    let mut tries = 1;
    loop {
        match read() {
            Err(e) if tries < TRIES && passing(&e) => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

pub fn load(ctx: &Context, id: &str) -> Result<Container, ContainerError> {
    let dir = ctx.container_dir(id);
    if !dir.join("state.json").exists() {
        return Err(state::StateError::NotFound(id.to_string()).into());
    }
    let mut container = load_state(dir).map_err(lc_error)?;
    if let (
        Some(pid),
        Some(Record {
            init_start_time: Some(t),
            ..
        }),
    ) = (container.pid(), Record::load(&ctx.root, id)?)
    {
        if state::process_start_time(pid.as_raw()) != Some(t) {
            container.set_status(ContainerStatus::Stopped);
        }
    }
    if container.status() == ContainerStatus::Running
        || container.status() == ContainerStatus::Paused
    {
        // A frozen cgroup means paused, whoever froze it.
        if let Ok(true) = is_frozen(&container) {
            container.set_status(ContainerStatus::Paused);
        }
    }
    Ok(container)
}

fn is_frozen(container: &Container) -> Result<bool, ContainerError> {
    let cg = cgroup_path(container)?;
    let v1 = Path::new("/sys/fs/cgroup/freezer").join(cg.strip_prefix("/").unwrap_or(&cg));
    if let Ok(s) = std::fs::read_to_string(v1.join("freezer.state")) {
        return Ok(s.trim() == "FROZEN");
    }
    let v2 = Path::new("/sys/fs/cgroup").join(cg.strip_prefix("/").unwrap_or(&cg));
    if let Ok(s) = std::fs::read_to_string(v2.join("cgroup.freeze")) {
        return Ok(s.trim() == "1");
    }
    Ok(false)
}

/// The directory of the container's cgroup for one controller (`memory`,
/// `cpuset`): found from its running init's `/proc/PID/cgroup` (which also
/// names systemd's cgroups), else from the path libcontainer recorded; the v1
/// hierarchy of that controller when the host has one, else the unified one.
pub fn cgroup_dir(container: &Container, controller: &str) -> Option<PathBuf> {
    // A dead init's /proc entry (a zombie not reaped yet) shows the root
    // cgroup, not the container's.
    let live = container
        .pid()
        .filter(|pid| !state::process_gone(pid.as_raw()));
    let from_proc = live.and_then(|pid| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mut unified = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == controller) {
                return Some((true, PathBuf::from(path)));
            }
            if controllers.is_empty() {
                unified = Some((false, PathBuf::from(path)));
            }
        }
        unified
    });
    let (v1, path) = match from_proc {
        Some(found) => found,
        None => {
            let path = cgroup_path(container).ok()?;
            let v1 = Path::new("/sys/fs/cgroup").join(controller).is_dir();
            (v1, path)
        }
    };
    let rel = path.strip_prefix("/").unwrap_or(&path).to_path_buf();
    let base = if v1 {
        Path::new("/sys/fs/cgroup").join(controller)
    } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/unified")
    };
    let dir = base.join(rel);
    dir.is_dir().then_some(dir)
}

/// The container's cgroup path as libcontainer resolved it at create time.
pub fn cgroup_path(container: &Container) -> Result<PathBuf, ContainerError> {
    Ok(container.spec().map_err(lc_error)?.cgroup_path)
}

pub fn cgroup_manager(container: &Container) -> Result<AnyCgroupManager, ContainerError> {
    libcgroups::common::create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup_path(container)?,
        systemd_cgroup: container.systemd(),
        container_name: container.id().to_string(),
    })
    .map_err(|e| ContainerError::Cgroup {
        id: container.id().to_string(),
        message: e.to_string(),
    })
}

/// Applies new cgroup limits to a container (`update`), keeping the OOM
/// killer as `create` left it.
pub fn update(
    container: &Container,
    resources: &oci_spec::runtime::LinuxResources,
) -> Result<(), ContainerError> {
    cgroup_manager(container)?
        .apply(&libcgroups::common::ControllerOpt {
            resources,
            disable_oom_killer: cgroups::oom_killer_is_disabled(container),
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| ContainerError::Cgroup {
            id: container.id().to_string(),
            message: format!("cannot update: {e}"),
        })
}

/// Pids in the container's cgroup.
pub fn pids(container: &Container) -> Result<Vec<Pid>, ContainerError> {
    cgroup_manager(container)?
        .get_all_pids()
        .map_err(|e| ContainerError::Cgroup {
            id: container.id().to_string(),
            message: e.to_string(),
        })
}

pub fn runc_state(container: &Container) -> RuncState {
    let status = container.status();
    let pid = match status {
        ContainerStatus::Stopped => 0,
        _ => container.pid().map(|p| p.as_raw()).unwrap_or(0),
    };
    let bundle = container.bundle().clone();
    let rootfs = rootfs_of(&bundle);
    let created = container
        .created()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
        .unwrap_or_else(|| "0001-01-01T00:00:00Z".to_string());
    let annotations = container
        .state
        .annotations
        .clone()
        .filter(|a| !a.is_empty());
    RuncState {
        oci_version: oci_spec::runtime::VERSION.to_string(),
        id: container.id().to_string(),
        pid,
        status: status_str(status),
        bundle,
        rootfs,
        created,
        annotations,
        owner: String::new(),
    }
}

/// The rootfs a bundle's config.json names, resolved against the bundle.
fn rootfs_of(bundle: &Path) -> PathBuf {
    let root = crate::bundle::Bundle::read_spec(&bundle.join("config.json"))
        .ok()
        .and_then(|(s, _)| s.root().as_ref().map(|r| r.path().clone()));
    match root {
        Some(p) if p.is_absolute() => p,
        Some(p) => bundle.join(p),
        None => bundle.join("rootfs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_read_that_fails_for_a_moment_is_read_again() {
        // What read_again returns, and how many reads it made, for reads
        // whose n-th result `outcome(n)` gives.
        let run = |outcome: &dyn Fn(u32) -> Result<u32, &'static str>| {
            let mut calls = 0;
            let read = read_again(
                || {
                    calls += 1;
                    outcome(calls)
                },
                |e: &&str| *e == "being written",
            );
            (read, calls)
        };
        let ready_third = |n| if n < 3 { Err("being written") } else { Ok(n) };
        assert_eq!(run(&ready_third), (Ok(3), 3));
        assert_eq!(run(&|_| Err("being written")), (Err("being written"), 10));
        assert_eq!(
            run(&|_| Err("permission denied")),
            (Err("permission denied"), 1),
            "only a passing failure is read again"
        );
    }

    #[test]
    fn init_failures_in_runc_words() {
        assert_eq!(
            runc_init_message(
                "failed to create container: exec process failed with error error in executing \
                 process : exec: \"x\": executable file not found in $PATH"
            ),
            "unable to start container process: exec: \"x\": executable file not found in $PATH"
        );
        assert_eq!(
            runc_init_message(
                "cannot allocate tty if youki will detach without setting console socket"
            ),
            "cannot allocate tty if agentvm will detach without setting console socket"
        );
    }

    #[test]
    fn hook_failures_in_runc_words() {
        assert_eq!(
            runc_hook_message(
                "failed to create container: failed hooks hook command exited with non-zero exit code: 3"
            ),
            "failed to create container: error running hook: exit status 3"
        );
        assert_eq!(
            runc_hook_message("hook command exited with non-zero exit code: 4"),
            "error running hook: exit status 4"
        );
        assert_eq!(runc_hook_message("no such file"), "no such file");
    }
}
