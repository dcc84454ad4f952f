//! The `microvm` tier: each container boots its own Linux kernel.
//!
//! `create` starts a per-container supervisor (`agentvm supervise`), which
//! is the container's pid: it boots the VM through a VMM backend and relays
//! between the host and the guest agent (the same binary, as /init). The
//! other commands talk to the supervisor over its socket.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use libcgroups::common::{CgroupManager, FreezerState};

use crate::bundle::Bundle;
use crate::config::Isolation;
use crate::context::Context;
use crate::state::Record;
use crate::tier::RuncState;

pub mod client;
pub mod exec;
pub mod host;
pub mod initramfs;
pub use crate::router as net;

pub mod pod;
pub mod pool;
mod runtime;
pub mod sock;
pub mod spec;
pub mod supervisor;
pub mod vmm;
pub mod vmstate;

use crate::protocol::{self, Reply};
use client::SupervisorRequest;
pub use runtime::Tier;
pub use supervisor::exit_like;
use vmstate::{Status, VmState};

#[derive(Debug, thiserror::Error)]
pub enum MicrovmError {
    #[error(transparent)]
    Host(#[from] host::HostError),
    #[error(transparent)]
    Vmm(#[from] vmm::choice::ChoiceError),
    #[error(transparent)]
    Cgroups(#[from] crate::container::cgroups::CgroupError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error(transparent)]
    Tty(#[from] supervisor::tty::TtyError),
    #[error(transparent)]
    Pod(#[from] pod::PodError),
    /// The command does not fit the container's status, or its options
    /// contradict each other; the message is runc's where runc has one.
    #[error("{0}")]
    Refused(String),
    /// The supervisor or the guest answered with an error.
    #[error("{0}")]
    Guest(String),
    #[error("the supervisor answered {what} with {reply}")]
    UnexpectedReply { what: &'static str, reply: String },
    /// The supervisor could not boot the VM; the message is its own.
    #[error("{0}")]
    Boot(String),
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cgroup of container {id}: cannot {what}: {message}")]
    Cgroup {
        id: String,
        what: &'static str,
        message: String,
    },
}

type Result<T> = std::result::Result<T, MicrovmError>;

fn refused(msg: impl Into<String>) -> MicrovmError {
    MicrovmError::Refused(msg.into())
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MicrovmError {
    let what = what.into();
    move |source| MicrovmError::Io { what, source }
}

fn cgroup_error(id: &str, what: &'static str) -> impl FnOnce(String) -> MicrovmError {
    let id = id.to_string();
    move |message| MicrovmError::Cgroup { id, what, message }
}

/// What `create` passes on.
pub struct CreateOptions<'a> {
    pub console_socket: Option<&'a Path>,
    pub pid_file: Option<&'a Path>,
    pub log: Option<&'a Path>,
    pub log_json: bool,
    pub egress: &'a crate::egress::Policy,
}

/// Creates the container: starts its supervisor and waits until the guest
/// has created the container (or failed to). The caller holds the root
/// lock and checked the id is free. On failure nothing is left behind.
pub fn create(ctx: &Context, id: &str, bundle: &Bundle, opts: CreateOptions) -> Result<()> {
    // A further container of a CRI pod runs in its sandbox's VM, and one
    // that joins another microVM container's namespaces (Docker's
    // `--network container:X`) in that container's.
    if let Some(sandbox) = pod::sandbox_of(&bundle.spec)? {
        return create_member(ctx, id, bundle, opts, &sandbox);
    }
    if let Some(joined) = pod::joined_container(&ctx.root, &bundle.spec) {
        tracing::debug!("container {id} joins the namespaces of {joined}: it runs in its microVM");
        return create_member(ctx, id, bundle, opts, &joined);
    }
    // Fail before creating anything when the host cannot run a microVM,
    // or not with the VMM asked for.
    let vmm =
        vmm::choice::for_container(ctx.config.microvm.vmm, bundle.spec.annotations().as_ref())?;
    tracing::debug!("container {id}: vmm {} ({})", vmm.backend.as_str(), vmm.why);
    if vmm.backend == vmm::choice::BackendKind::Builtin && !vmm::builtin::complete() {
        tracing::warn!(
            "container {id}: the builtin VMM is not complete: it lacks {}",
            vmm::builtin::MISSING.join(", ")
        );
    }
    host::Host::probe(&ctx.config, vmm.backend)?;
    let terminal = bundle.terminal();
    if terminal && opts.console_socket.is_none() {
        return Err(refused(
            "cannot allocate tty if agentvm will detach without setting console socket",
        ));
    }
    if !terminal && opts.console_socket.is_some() {
        return Err(refused(
            "cannot use console socket if agentvm will not detach or allocate tty",
        ));
    }
    // As runc and the container tier: a cgroup that exists frozen would
    // freeze the supervisor (and the command) before the VM starts; one
    // that holds processes is taken with runc's warning.
    if !ctx.systemd_cgroup {
        let path = bundle
            .spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().clone())
            .unwrap_or_else(|| supervisor::stage::default_cgroup_path(id, false));
        crate::container::cgroups::refuse_frozen(&path)?;
        crate::container::cgroups::warn_if_populated(&path);
    }
    // The supervisor runs prestart and createRuntime hooks in the directory
    // it inherits: the bundle, as in runc.
    std::env::set_current_dir(&bundle.path).map_err(io_error(format!(
        "change to the bundle directory {}",
        bundle.path.display()
    )))?;
    let dir = ctx.container_dir(id);
    std::fs::create_dir(&dir).map_err(io_error(format!("create {}", dir.display())))?;
    let result = start_supervisor(ctx, id, bundle, &dir, &opts, None);
    if result.is_err() {
        let _ = destroy(ctx, id);
    }
    result
}

/// Creates a further container of a CRI pod in the VM of its sandbox
/// `sandbox`: its relay (`pod`) is the container's pid.
fn create_member(
    ctx: &Context,
    id: &str,
    bundle: &Bundle,
    opts: CreateOptions,
    sandbox: &str,
) -> Result<()> {
    let sandbox_state = pod::sandbox_state(&ctx.root, id, sandbox)?;
    let terminal = bundle
        .spec
        .process()
        .as_ref()
        .and_then(|p| p.terminal())
        .unwrap_or(false);
    if terminal && opts.console_socket.is_none() {
        return Err(refused(
            "cannot allocate tty if agentvm will detach without setting console socket",
        ));
    }
    if !terminal && opts.console_socket.is_some() {
        return Err(refused(
            "cannot use console socket if agentvm will not detach or allocate tty",
        ));
    }
    // The pod's network is the sandbox's, and so is its egress policy.
    if opts.egress.to_string() != sandbox_state.egress {
        return Err(refused(format!(
            "egress policy {} differs from pod sandbox {}'s ({}): a pod's containers share              its network and its policy",
            opts.egress, sandbox, sandbox_state.egress
        )));
    }
    std::env::set_current_dir(&bundle.path).map_err(io_error(format!(
        "change to the bundle directory {}",
        bundle.path.display()
    )))?;
    let dir = ctx.container_dir(id);
    std::fs::create_dir(&dir).map_err(io_error(format!("create {}", dir.display())))?;
    let result = start_supervisor(ctx, id, bundle, &dir, &opts, Some(&sandbox_state));
    if result.is_err() {
        let _ = destroy(ctx, id);
    }
    result
}

/// Starts `agentvm supervise <id>`: the VM's supervisor, or with `pod` a
/// member's relay into that sandbox's VM.
fn start_supervisor(
    ctx: &Context,
    id: &str,
    bundle: &Bundle,
    dir: &Path,
    opts: &CreateOptions,
    pod: Option<&VmState>,
) -> Result<()> {
    Record {
        isolation: Isolation::Microvm,
        init_start_time: None,
    }
    .save(&ctx.root, id)?;
    let state = VmState {
        id: id.to_string(),
        bundle: bundle
            .path
            .canonicalize()
            .unwrap_or_else(|_| bundle.path.clone()),
        rootfs: bundle.rootfs.clone(),
        status: Status::Creating,
        supervisor_pid: None,
        supervisor_start_time: None,
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        annotations: bundle.spec.annotations().clone().unwrap_or_default(),
        cgroup_path: PathBuf::new(),
        exit_status: None,
        oom_kills: None,
        accel: String::new(),
        vmm: String::new(),
        paused: false,
        vcpus: 0,
        memory_mib: 0,
        systemd_cgroup: ctx.systemd_cgroup,
        netns: None,
        net_restore: Vec::new(),
        egress: opts.egress.to_string(),
        boot: Vec::new(),
        first_instruction_us: None,
        first_instruction_steps: Vec::new(),
        pod_sandbox: pod.map(|p| p.id.clone()),
    };
    let state = match pod {
        // The VM is the sandbox's: what sizes it is recorded for `update`.
        Some(p) => VmState {
            accel: p.accel.clone(),
            vmm: p.vmm.clone(),
            vcpus: p.vcpus,
            memory_mib: p.memory_mib,
            ..state
        },
        None => state,
    };
    state.save(dir)?;

    let (mut sync_read, sync_write) = std::io::pipe().map_err(io_error("create a pipe"))?;
    let exe = std::fs::read_link("/proc/self/exe").map_err(io_error("find the agentvm binary"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--root").arg(&ctx.root);
    if let Some(cfg) = &ctx.config_path {
        cmd.arg("--config").arg(cfg);
    }
    match opts.log {
        Some(log) => cmd.arg("--log").arg(log),
        None => cmd.arg("--log").arg(dir.join("supervisor.log")),
    };
    if opts.log_json {
        cmd.arg("--log-format").arg("json");
    }
    cmd.arg("supervise").arg(id);
    if let Some(sock) = opts.console_socket {
        cmd.arg("--console-socket").arg(sock);
        // With a terminal the workload's stdio is the pty, as with runc,
        // whose init swaps its stdio for the pty: a caller that reads our
        // output until EOF (containerd's shim does) must not wait on the
        // supervisor.
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    }
    let fd = sync_write.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls: setsid
    // (the supervisor leads its own session, as runc's init does) and dup2.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::dup2(fd, supervisor::SYNC_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(io_error("start the supervisor"))?;
    drop(sync_write);
    drop(cmd);
    let mut answer = String::new();
    let _ = sync_read.read_to_string(&mut answer);
    // "ok\n", or "error MESSAGE\n" with the message as it is (a hook's
    // output in it keeps its newlines, as runc prints them).
    let answer = answer.strip_suffix('\n').unwrap_or(&answer);
    if answer.trim() != "ok" {
        let _ = child.kill();
        let _ = child.wait();
        let message = answer
            .strip_prefix("error ")
            .map(str::to_string)
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(dir.join("supervisor.log")).unwrap_or_default();
                format!(
                    "the supervisor died while booting the VM{}",
                    log.lines()
                        .last()
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default()
                )
            });
        return Err(MicrovmError::Boot(message));
    }
    if let Some(pid_file) = opts.pid_file {
        write_pid_file(pid_file, child.id())?;
    }
    Ok(())
}

fn write_pid_file(path: &Path, pid: u32) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, pid.to_string())
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(io_error(format!("write pid file {}", path.display())))
}

fn load(ctx: &Context, id: &str) -> Result<VmState> {
    Ok(VmState::load(&ctx.container_dir(id))?)
}

fn status_name(s: Status, paused: bool) -> &'static str {
    match s {
        Status::Creating => "creating",
        Status::Created => "created",
        Status::Running if paused => "paused",
        Status::Running => "running",
        Status::Stopped => "stopped",
    }
}

/// `state`, in runc's shape; the pid is the supervisor's.
pub fn state(ctx: &Context, id: &str) -> Result<RuncState> {
    let s = load(ctx, id)?;
    let status = s.effective_status();
    Ok(RuncState {
        oci_version: oci_spec::runtime::VERSION.to_string(),
        id: s.id.clone(),
        pid: match status {
            Status::Stopped => 0,
            _ => s.supervisor_pid.unwrap_or(0),
        },
        status: status_name(status, s.paused),
        bundle: s.bundle.clone(),
        rootfs: s.rootfs.clone(),
        created: s.created.clone(),
        annotations: Some(s.annotations.clone()).filter(|a| !a.is_empty()),
        owner: String::new(),
    })
}

/// Where a request about container `s` goes: its own supervisor, or for a
/// pod member its sandbox's, wrapped as a `Member` request.
pub(crate) fn route(
    ctx: &Context,
    s: &VmState,
    req: SupervisorRequest,
) -> (PathBuf, String, SupervisorRequest) {
    match &s.pod_sandbox {
        None => (ctx.container_dir(&s.id), s.id.clone(), req),
        Some(sandbox) => (
            ctx.container_dir(sandbox),
            sandbox.clone(),
            SupervisorRequest::Member {
                id: s.id.clone(),
                request: Box::new(req),
            },
        ),
    }
}

fn ask(ctx: &Context, id: &str, req: SupervisorRequest) -> Result<Reply> {
    let s = load(ctx, id)?;
    let (dir, target, req) = route(ctx, &s, req);
    let (_, reply) = client::request(&dir, &target, &req, Duration::from_secs(60))?;
    match reply {
        Reply::Error { message } => Err(MicrovmError::Guest(message)),
        r => Ok(r),
    }
}

pub fn start(ctx: &Context, id: &str) -> Result<()> {
    let s = load(ctx, id)?;
    let status = s.effective_status();
    if status != Status::Created {
        return Err(refused(crate::tier::cannot_start(status_name(
            status, s.paused,
        ))));
    }
    ask(ctx, id, SupervisorRequest::Start)?;
    let mut s = load(ctx, id)?;
    // A member's state is the CLI's to keep (its relay records its end).
    if s.pod_sandbox.is_some() && s.status == Status::Created {
        s.status = Status::Running;
        s.save(&ctx.container_dir(id))?;
    }
    // A failing poststart hook fails `start` with runc's message, and the
    // workload is killed, as runc 1.1 terminates it (the container tier's
    // libcontainer fails `start` the same way).
    match s.spec() {
        Ok(spec) => {
            if let Err(e) = supervisor::run_hooks_public(&spec, &s, &["poststart"]) {
                if let Err(k) = kill(ctx, id, libc::SIGKILL, false) {
                    tracing::warn!("container {id}: after a failing poststart hook: {k}");
                }
                return Err(refused(e));
            }
        }
        Err(e) => tracing::warn!("container {id}: cannot run poststart hooks: {e}"),
    }
    Ok(())
}

pub fn kill(ctx: &Context, id: &str, signal: i32, all: bool) -> Result<()> {
    let s = load(ctx, id)?;
    let status = s.effective_status();
    if matches!(status, Status::Stopped | Status::Creating) {
        // runc's words, which containerd's shim matches (checkKillError).
        return Err(refused("container not running".to_string()));
    }
    // As runc, whose kill(2) refuses a number past the last signal.
    if !(0..=libc::SIGRTMAX()).contains(&signal) {
        return Err(refused(
            "unable to signal init: invalid argument".to_string(),
        ));
    }
    let pid = s
        .supervisor_pid
        .ok_or_else(|| refused(format!("container {id} has no supervisor")))?;
    if s.pod_sandbox.is_some() && signal != 0 {
        return kill_member(ctx, &s, pid, signal, all);
    }
    if signal == libc::SIGKILL || signal == 0 {
        // SIGKILL ends the supervisor, and with it the VM, at once (a
        // paused container too, as SIGKILL ends a frozen process); 0 asks
        // whether the supervisor (the container's pid) is there.
        // SAFETY: kill(2) with a pid we recorded and verified alive.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            return Err(refused(format!(
                "cannot signal container {id}: {}",
                std::io::Error::last_os_error()
            )));
        }
        return Ok(());
    }
    ask(ctx, id, SupervisorRequest::Signal { signal, all })?;
    Ok(())
}

/// A signal for a pod member goes to its processes in the guest; SIGKILL
/// kills its relay when the guest cannot be asked (the sandbox's
/// supervisor then kills what is left of the member).
fn kill_member(ctx: &Context, s: &VmState, relay: i32, signal: i32, all: bool) -> Result<()> {
    let asked = ask(ctx, &s.id, SupervisorRequest::Signal { signal, all });
    match asked {
        Ok(_) => Ok(()),
        Err(e) if signal == libc::SIGKILL => {
            tracing::debug!("container {}: {e}; killing its relay", s.id);
            // SAFETY: kill(2) on the member's relay, verified alive by
            // effective_status.
            unsafe { libc::kill(relay, libc::SIGKILL) };
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `ps --format json`: the container's processes on the host — the
/// supervisor, the VMM and the file server, all in the container's cgroup —
/// which is what the shim and `docker top` look up in the host's process
/// table; guest pids would name unrelated host processes there. The table
/// lists the guest's processes (`guest_processes`).
pub fn ps(ctx: &Context, id: &str) -> Result<Vec<i32>> {
    let s = load(ctx, id)?;
    // A pod member's host process is its relay; its processes are the
    // guest's.
    if s.pod_sandbox.is_some() {
        return Ok(match s.supervisor_pid {
            Some(pid) if s.supervisor_alive() => vec![pid],
            _ => Vec::new(),
        });
    }
    if s.cgroup_path.as_os_str().is_empty() {
        return Ok(Vec::new());
    }
    let cm = s
        .cgroup_manager()
        .map_err(|e| cgroup_error(id, "open")(e.to_string()))?;
    let mut pids: Vec<i32> = cm
        .get_all_pids()
        .map_err(|e| cgroup_error(id, "list its processes")(e.to_string()))?
        .into_iter()
        .map(|p| p.as_raw())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// `update`: the container's cgroup limits inside the guest change; what
/// sizes the VM itself (vCPUs, RAM) is fixed at boot and refused.
pub fn update(
    ctx: &Context,
    id: &str,
    resources: &oci_spec::runtime::LinuxResources,
) -> Result<()> {
    let s = load(ctx, id)?;
    let status = s.effective_status();
    // As runc: a paused container's limits change too (its frozen cgroup
    // is the guest's).
    if status != Status::Running {
        return Err(refused(format!(
            "cannot update container {id}: it is {}, not running",
            status_name(status, s.paused)
        )));
    }
    spec::check_update(resources, s.vcpus, s.memory_mib).map_err(refused)?;
    ask(
        ctx,
        id,
        SupervisorRequest::Update {
            resources: Box::new(resources.clone()),
        },
    )?;
    // A pod member has no host cgroup of its own: the VM's is the pod's.
    if s.pod_sandbox.is_some() {
        return Ok(());
    }
    // The VM's own host cgroup follows for what it carries (CPU, pids).
    let cm = s
        .cgroup_manager()
        .map_err(|e| cgroup_error(id, "open")(e.to_string()))?;
    cm.apply(&libcgroups::common::ControllerOpt {
        resources: &spec::host_limits(resources),
        disable_oom_killer: false,
        oom_score_adj: None,
        freezer_state: None,
    })
    .map_err(|e| cgroup_error(id, "update the VM's limits")(e.to_string()))?;
    Ok(())
}

/// The container's processes as the guest sees them (guest pids).
pub fn guest_processes(ctx: &Context, id: &str) -> Result<Vec<protocol::GuestProcess>> {
    match ask(ctx, id, SupervisorRequest::Ps)? {
        Reply::Pids { processes, .. } => Ok(processes),
        other => Err(MicrovmError::UnexpectedReply {
            what: "ps",
            reply: format!("{other:?}"),
        }),
    }
}

/// The container's resource use as the guest measures it, and what the
/// VMM counts for the VM (where it counts).
pub fn stats(
    ctx: &Context,
    id: &str,
) -> Result<(protocol::GuestStats, Option<protocol::VmmCounters>)> {
    match ask(ctx, id, SupervisorRequest::Stats)? {
        Reply::Stats { stats, vmm } => Ok((stats, vmm)),
        other => Err(MicrovmError::UnexpectedReply {
            what: "stats",
            reply: format!("{other:?}"),
        }),
    }
}

/// `pause` and `resume`: the guest freezes and thaws the container's
/// cgroup there.
pub fn set_paused(ctx: &Context, id: &str, paused: bool) -> Result<()> {
    let dir = ctx.container_dir(id);
    let mut s = load(ctx, id)?;
    let status = s.effective_status();
    let running = status == Status::Running;
    if paused && (!running || s.paused) {
        return Err(refused(crate::tier::NOT_RUNNING));
    }
    if !paused && (!running || !s.paused) {
        return Err(refused(crate::tier::NOT_PAUSED));
    }
    // As runc freezes the container's cgroup, the guest freezes the
    // container's (a pod member's alone): the VM runs on and answers ps,
    // stats and update while the workload is frozen.
    let request = match paused {
        true => SupervisorRequest::Pause,
        false => SupervisorRequest::Resume,
    };
    ask(ctx, id, request)?;
    s.paused = paused;
    s.save(&dir)?;
    Ok(())
}

pub fn delete(ctx: &Context, id: &str, force: bool) -> Result<()> {
    let s = load(ctx, id)?;
    let status = s.effective_status();
    if matches!(status, Status::Running) && !force {
        return Err(refused(format!(
            "cannot delete container {id} that is not stopped: {}",
            status_name(status, s.paused)
        )));
    }
    destroy(ctx, id)
}

/// Stops whatever runs for the container and removes every trace of it:
/// processes, cgroup, state. Used by delete and by a failed create.
fn destroy(ctx: &Context, id: &str) -> Result<()> {
    let dir = ctx.container_dir(id);
    let state = VmState::load(&dir).ok();
    if let Some(s) = state.as_ref().filter(|s| s.pod_sandbox.is_some()) {
        destroy_member(ctx, s);
    } else if let Some(s) = &state {
        if s.supervisor_alive() {
            if let Some(pid) = s.supervisor_pid {
                // SAFETY: kill(2) on the verified supervisor pid.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // The VMM and file server die with the supervisor (PDEATHSIG);
        // wait until the cgroup is empty so it can be removed.
        if !s.cgroup_path.as_os_str().is_empty() {
            if let Ok(cm) = s.cgroup_manager() {
                let _ = cm.freeze(FreezerState::Thawed);
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let pids = cm.get_all_pids().unwrap_or_default();
                    // `run` is a subreaper: the VMM and file server may be
                    // our own zombies by now. Reap them; zombies of others
                    // are gone as far as we are concerned.
                    for p in &pids {
                        let _ =
                            nix::sys::wait::waitpid(*p, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
                    }
                    let alive: Vec<_> = pids
                        .into_iter()
                        .filter(|p| !crate::state::process_gone(p.as_raw()))
                        .collect();
                    if alive.is_empty() || Instant::now() > deadline {
                        break;
                    }
                    for p in alive {
                        // SAFETY: kill(2) on a pid from the container's cgroup.
                        unsafe { libc::kill(p.as_raw(), libc::SIGKILL) };
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let deadline = Instant::now() + Duration::from_secs(2);
                while cm.remove().is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        // The VM is gone: a namespace that outlives it gets its
        // addresses back.
        let rules = s.egress != "allow";
        if let (Some(ns), true) = (&s.netns, rules || !s.net_restore.is_empty()) {
            net::restore(ns, &s.net_restore, rules);
        }
        if s.supervisor_pid.is_some() {
            let hooks = s
                .spec()
                .map_err(|e| e.to_string())
                .and_then(|spec| supervisor::run_hooks_public(&spec, s, &["poststop"]));
            // As runc: `error running hook #N: ...` at level error.
            if let Err(e) = hooks {
                tracing::error!("{e}");
            }
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io_error(format!("remove {}", dir.display())))?;
    }
    Ok(())
}

/// A pod member's part of `destroy`: the guest removes its container
/// (killing what is left of it), its relay ends (SIGKILLed after 10 s), its
/// mounts leave the sandbox's share, poststop hooks run.
fn destroy_member(ctx: &Context, s: &VmState) {
    let id = &s.id;
    let sandbox = s
        .pod_sandbox
        .as_deref()
        .and_then(|sb| VmState::load(&ctx.container_dir(sb)).ok())
        .filter(|sb| sb.supervisor_alive());
    if let Some(sb) = &sandbox {
        let asked = client::request(
            &ctx.container_dir(&sb.id),
            &sb.id,
            &SupervisorRequest::DeleteMember { id: id.clone() },
            Duration::from_secs(30),
        );
        match asked {
            Ok((_, Reply::Ok)) => {}
            Ok((_, other)) => tracing::debug!("container {id}: delete in the guest: {other:?}"),
            Err(e) => tracing::debug!("container {id}: delete in the guest: {e}"),
        }
    }
    if let Some(relay) = s.supervisor_pid.filter(|_| s.supervisor_alive()) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !crate::state::process_gone(relay) && Instant::now() < deadline {
            let _ = nix::sys::wait::waitpid(
                nix::unistd::Pid::from_raw(relay),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if !crate::state::process_gone(relay) {
            // SAFETY: kill(2) on the member's relay, verified alive above.
            unsafe { libc::kill(relay, libc::SIGKILL) };
        }
    }
    // A relay that was killed left its mounts in the sandbox's share.
    if let Some(sb) = &sandbox {
        detach_in_sandbox(ctx, sb, id);
    }
    if s.supervisor_pid.is_some() {
        let hooks = s
            .spec()
            .map_err(|e| e.to_string())
            .and_then(|spec| supervisor::run_hooks_public(&spec, s, &["poststop"]));
        if let Err(e) = hooks {
            tracing::error!("{e}");
        }
    }
}

/// Detaches member `id`'s mounts from the sandbox's share, in a child that
/// enters the sandbox's mount namespace (this process keeps the host's).
fn detach_in_sandbox(ctx: &Context, sandbox: &VmState, id: &str) {
    let root = ctx.container_dir(&sandbox.id).join("share");
    // SAFETY: the CLI is single-threaded here (no thread has been started),
    // so the child may run arbitrary code after fork; it only enters a
    // namespace, unmounts and exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = match pod::enter_sandbox_mounts(sandbox) {
                Ok(()) => {
                    pod::detach(&root, id);
                    0
                }
                Err(_) => 1,
            };
            // SAFETY: _exit ends the forked child without running the
            // parent's atexit handlers or destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
        }
        Err(e) => tracing::debug!("container {id}: cannot fork to detach its mounts: {e}"),
    }
}
