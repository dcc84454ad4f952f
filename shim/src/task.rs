//! containerd's task service (`containerd.task.v2.Task`) over agentvm.
//!
//! Each container is created and started by the `agentvm` binary
//! ([`crate::runtime`]), and so is each exec (`agentvm exec --detach`);
//! the shim keeps what containerd asks about (pids, statuses, exit
//! statuses, stdio paths, terminals) in [`crate::process`] and learns of
//! exits from the shim framework's reaper. The tier is picked by agentvm
//! itself from the bundle's annotation or its config file, exactly as
//! under runc's shim.
//!
//! What is not implemented (checkpoints) answers UNIMPLEMENTED with the
//! feature's name, never a pretend success.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
    DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, Status,
    UpdateTaskRequest, WaitRequest, WaitResponse,
};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskPaused, TaskResumed,
    TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::{self, Code};
use containerd_shim::protos::types::task::ProcessInfo;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{ExitSignal, TtrpcContext, TtrpcResult};

use crate::console::{Console, ConsoleError, ConsoleSocket};
use crate::metrics::{self, CgroupMode, MetricsError};
use crate::process::{self, Container, Exec, Process, Shared};
use crate::runtime::{Agentvm, CreateStdio, ProcessFiles, RuntimeError};
use crate::stdio::{self, StdioError};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("container {0} does not exist in this shim")]
    NotFound(String),
    #[error("exec process {exec_id} does not exist in container {id}")]
    ExecNotFound { id: String, exec_id: String },
    #[error("process already finished: {0} has exited")]
    Finished(String),
    #[error("{0} already exists in this shim")]
    Exists(String),
    #[error("{what}: not implemented yet in the agentvm shim")]
    NotImplemented { what: String },
    #[error("{what} is {state}: {why}")]
    State {
        what: String,
        state: &'static str,
        why: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot signal {what} (pid {pid}): {source}")]
    Signal {
        what: String,
        pid: u32,
        #[source]
        source: nix::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Stdio(#[from] StdioError),
    #[error(transparent)]
    Console(#[from] ConsoleError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Options(#[from] crate::options::OptionsError),
    #[error("cannot mount the rootfs {index} ({kind}) on {target}: {detail}")]
    Mount {
        index: usize,
        kind: String,
        target: PathBuf,
        detail: String,
    },
}

impl From<TaskError> for ttrpc::Error {
    fn from(e: TaskError) -> ttrpc::Error {
        let code = match &e {
            TaskError::NotFound(_) | TaskError::ExecNotFound { .. } | TaskError::Finished(_) => {
                Code::NOT_FOUND
            }
            TaskError::Exists(_) => Code::ALREADY_EXISTS,
            TaskError::NotImplemented { .. } => Code::UNIMPLEMENTED,
            TaskError::State { .. } => Code::FAILED_PRECONDITION,
            TaskError::Invalid(_) | TaskError::Options(_) => Code::INVALID_ARGUMENT,
            _ => Code::INTERNAL,
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
    }
}

fn not_implemented<T>(what: &str) -> TtrpcResult<T> {
    Err(TaskError::NotImplemented {
        what: what.to_string(),
    }
    .into())
}

/// How containerd names a process in messages: the container, or one of
/// its execs.
fn describe(id: &str, exec_id: &str) -> String {
    if exec_id.is_empty() {
        format!("container {id}")
    } else {
        format!("exec process {exec_id} of container {id}")
    }
}

pub struct Service {
    shared: Arc<Shared>,
    agentvm: Agentvm,
    exit: Arc<ExitSignal>,
    cgroup_mode: CgroupMode,
}

/// A process's stdio as agentvm is given it: the FIFOs, or (with a
/// terminal) nothing but a console socket to send the pty's master to.
struct Streams {
    stdio: CreateStdio,
    console_socket: Option<ConsoleSocket>,
}

impl Streams {
    fn open(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> Result<Streams, TaskError> {
        if terminal {
            return Ok(Streams {
                stdio: stdio::none(),
                console_socket: Some(ConsoleSocket::new()?),
            });
        }
        Ok(Streams {
            stdio: stdio::open(&stdio::Paths {
                stdin,
                stdout,
                stderr,
            })?,
            console_socket: None,
        })
    }

    /// Once agentvm has returned: the terminal it sent, copied to and from
    /// the FIFOs.
    fn console(
        socket: Option<&ConsoleSocket>,
        stdin: &str,
        stdout: &str,
    ) -> Result<Option<Arc<Console>>, TaskError> {
        let Some(socket) = socket else {
            return Ok(None);
        };
        let master = socket.receive()?;
        Ok(Some(Console::start(master, stdin, stdout)?))
    }
}

fn to_pid(pid: i32, command: &str) -> Result<u32, RuntimeError> {
    u32::try_from(pid).map_err(|_| RuntimeError::Output {
        command: command.into(),
        what: "a pid file",
        detail: format!("negative pid {pid}"),
    })
}

/// containerd checks exec ids (letters, digits, `._-`); they name files in
/// the bundle here, so they are checked again.
fn check_exec_id(exec_id: &str) -> Result<(), TaskError> {
    let fine = !exec_id.is_empty()
        && exec_id.len() <= 76
        && !exec_id.starts_with('.')
        && exec_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if fine {
        Ok(())
    } else {
        Err(TaskError::Invalid(format!(
            "invalid exec id {exec_id:?}: letters, digits, '.', '_' and '-' only"
        )))
    }
}

impl Service {
    pub fn new(
        publisher: RemotePublisher,
        namespace: &str,
        agentvm: Agentvm,
        exit: Arc<ExitSignal>,
    ) -> Service {
        let shared = Shared::new(publisher, namespace);
        process::watch_exits(Arc::clone(&shared));
        Service {
            shared,
            agentvm,
            exit,
            cgroup_mode: CgroupMode::of_host(),
        }
    }

    fn create_task(&self, req: &CreateTaskRequest) -> Result<u32, TaskError> {
        if self.shared.lock().contains_key(&req.id) {
            return Err(TaskError::Exists(format!("container {}", req.id)));
        }
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(TaskError::NotImplemented {
                what: "create from a checkpoint".into(),
            });
        }
        let bundle = PathBuf::from(&req.bundle);
        // The CRI handler's config file (its `ConfigPath` option), if any.
        let config = crate::options::config_path(req.options.as_ref())?;
        let streams = Streams::open(&req.stdin, &req.stdout, &req.stderr, req.terminal)?;
        let mounted_rootfs = mount_rootfs(req, &bundle)?;
        let undo_mount = || {
            if mounted_rootfs {
                unmount_rootfs(&bundle);
            }
        };
        let socket = streams.console_socket.as_ref();
        let created = self.agentvm.create(
            &req.id,
            &bundle,
            config.as_deref(),
            &ProcessFiles {
                pid_file: &bundle.join("init.pid"),
                log: &bundle.join("agentvm-log.json"),
                console_socket: socket.map(ConsoleSocket::path),
            },
            streams.stdio,
        );
        let pid = match created
            .map_err(TaskError::from)
            .and_then(|pid| Ok(to_pid(pid, "create")?))
        {
            Ok(pid) => pid,
            Err(e) => {
                undo_mount();
                return Err(e);
            }
        };
        let console = match Streams::console(socket, &req.stdin, &req.stdout) {
            Ok(console) => console,
            Err(e) => {
                // The container exists but its terminal is lost: remove it.
                let _ = self.agentvm.delete(&req.id, true);
                undo_mount();
                return Err(e);
            }
        };
        let mut init = Process::new(&req.stdin, &req.stdout, &req.stderr, req.terminal);
        init.pid = pid;
        init.console = console;
        // OOM kills from now on; a container is still usable without.
        let oom = crate::oom::watch(&self.agentvm, &self.shared, &req.id)
            .map_err(|e| log::warn!("container {}: OOM kills will not be reported: {e}", req.id))
            .ok();
        let early = {
            let mut containers = self.shared.lock();
            let early = self.shared.take_unclaimed(&mut containers, pid);
            containers.insert(
                req.id.clone(),
                Container {
                    bundle,
                    init,
                    execs: Default::default(),
                    mounted_rootfs,
                    oom,
                },
            );
            early
        };
        if let Some(code) = early {
            self.shared.process_exited(&req.id, "", code);
        }
        Ok(pid)
    }

    /// The container `id` must exist; `f` reads it under the lock.
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut Container) -> T) -> Result<T, TaskError> {
        let mut containers = self.shared.lock();
        let c = containers
            .get_mut(id)
            .ok_or_else(|| TaskError::NotFound(id.to_string()))?;
        Ok(f(c))
    }

    /// The process `exec_id` (empty: the init) of container `id` must
    /// exist; `f` reads it under the lock.
    fn with_process<T>(
        &self,
        id: &str,
        exec_id: &str,
        f: impl FnOnce(&mut Process) -> T,
    ) -> Result<T, TaskError> {
        let mut containers = self.shared.lock();
        let c = containers
            .get_mut(id)
            .ok_or_else(|| TaskError::NotFound(id.to_string()))?;
        let p = c
            .process_mut(exec_id)
            .ok_or_else(|| missing_exec(id, exec_id))?;
        Ok(f(p))
    }

    fn start_init(&self, id: &str) -> Result<u32, TaskError> {
        let (pid, status) = self.with(id, |c| (c.init.pid, c.init.status))?;
        if status != Status::CREATED {
            return Err(TaskError::State {
                what: describe(id, ""),
                state: status_name(status),
                why: "only a created container can be started",
            });
        }
        self.agentvm.start(id)?;
        // The init may have run and exited already: keep STOPPED then.
        self.with(id, |c| {
            if c.init.exit.is_none() && !c.init.exiting {
                c.init.status = Status::RUNNING;
            }
        })?;
        self.shared.publish(
            topics::TASK_START_EVENT_TOPIC,
            Box::new(TaskStart {
                container_id: id.to_string(),
                pid,
                ..Default::default()
            }),
        );
        Ok(pid)
    }

    /// `Exec`: recorded only; agentvm runs it at `Start`, as runc's shim.
    fn add_exec(&self, req: &ExecProcessRequest) -> Result<(), TaskError> {
        check_exec_id(&req.exec_id)?;
        let spec = req
            .spec
            .as_ref()
            .map(|any| any.value.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                TaskError::Invalid(format!("exec {}: no process spec given", req.exec_id))
            })?;
        let mut containers = self.shared.lock();
        let c = containers
            .get_mut(&req.id)
            .ok_or_else(|| TaskError::NotFound(req.id.clone()))?;
        if c.execs.contains_key(&req.exec_id) {
            return Err(TaskError::Exists(describe(&req.id, &req.exec_id)));
        }
        if c.init.exit.is_some() || c.init.exiting {
            return Err(TaskError::State {
                what: describe(&req.id, ""),
                state: "stopped",
                why: "cannot exec in a stopped container",
            });
        }
        c.execs.insert(
            req.exec_id.clone(),
            Exec {
                process: Process::new(&req.stdin, &req.stdout, &req.stderr, req.terminal),
                spec,
            },
        );
        Ok(())
    }

    /// `Start` of an exec: `agentvm exec --detach`, its stdio the FIFOs or
    /// a terminal.
    fn start_exec(&self, id: &str, exec_id: &str) -> Result<u32, TaskError> {
        let (bundle, spec, stdin, stdout, stderr, terminal) = {
            let mut containers = self.shared.lock();
            let c = containers
                .get_mut(id)
                .ok_or_else(|| TaskError::NotFound(id.to_string()))?;
            let bundle = c.bundle.clone();
            let e = c
                .execs
                .get_mut(exec_id)
                .ok_or_else(|| missing_exec(id, exec_id))?;
            let p = &e.process;
            if p.status != Status::CREATED || p.pid != 0 {
                return Err(TaskError::State {
                    what: describe(id, exec_id),
                    state: status_name(p.status),
                    why: "only a created exec process can be started",
                });
            }
            // Marked as being started, so that a second Start is refused.
            e.process.status = Status::UNKNOWN;
            let p = &e.process;
            (
                bundle,
                e.spec.clone(),
                p.stdin.clone(),
                p.stdout.clone(),
                p.stderr.clone(),
                p.terminal,
            )
        };
        let started = self.run_exec(
            id,
            exec_id,
            &bundle,
            &spec,
            (&stdin, &stdout, &stderr),
            terminal,
        );
        let (pid, console) = match started {
            Ok(v) => v,
            Err(e) => {
                let _ = self.with_process(id, exec_id, |p| p.status = Status::CREATED);
                return Err(e);
            }
        };
        let early = {
            let mut containers = self.shared.lock();
            let early = self.shared.take_unclaimed(&mut containers, pid);
            if let Some(p) = containers.get_mut(id).and_then(|c| c.process_mut(exec_id)) {
                p.pid = pid;
                p.status = Status::RUNNING;
                p.console = console;
            }
            early
        };
        if let Some(code) = early {
            self.shared.process_exited(id, exec_id, code);
        }
        self.shared.publish(
            topics::TASK_EXEC_STARTED_EVENT_TOPIC,
            Box::new(TaskExecStarted {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                pid,
                ..Default::default()
            }),
        );
        Ok(pid)
    }

    fn run_exec(
        &self,
        id: &str,
        exec_id: &str,
        bundle: &Path,
        spec: &[u8],
        (stdin, stdout, stderr): (&str, &str, &str),
        terminal: bool,
    ) -> Result<(u32, Option<Arc<Console>>), TaskError> {
        let process_file = bundle.join(format!("exec-{exec_id}.json"));
        std::fs::write(&process_file, spec).map_err(|source| TaskError::Write {
            path: process_file.clone(),
            source,
        })?;
        let streams = Streams::open(stdin, stdout, stderr, terminal)?;
        let socket = streams.console_socket.as_ref();
        let pid = self.agentvm.exec(
            id,
            &process_file,
            &ProcessFiles {
                pid_file: &bundle.join(format!("exec-{exec_id}.pid")),
                log: &bundle.join("agentvm-log.json"),
                console_socket: socket.map(ConsoleSocket::path),
            },
            streams.stdio,
        )?;
        let pid = to_pid(pid, "exec")?;
        match Streams::console(socket, stdin, stdout) {
            Ok(console) => Ok((pid, console)),
            Err(e) => {
                // Started without its terminal: end it rather than leave
                // it unreachable.
                if let Ok(p) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                Err(e)
            }
        }
    }

    fn kill_exec(&self, id: &str, exec_id: &str, signal: u32) -> Result<(), TaskError> {
        let (pid, exited) = self.with_process(id, exec_id, |p| (p.pid, p.exit.is_some()))?;
        if exited {
            return Err(TaskError::Finished(describe(id, exec_id)));
        }
        if pid == 0 {
            return Err(TaskError::State {
                what: describe(id, exec_id),
                state: "created",
                why: "it has not been started",
            });
        }
        let signal = i32::try_from(signal)
            .ok()
            .and_then(|s| nix::sys::signal::Signal::try_from(s).ok())
            .ok_or_else(|| TaskError::Invalid(format!("invalid signal {signal}")))?;
        let raw = i32::try_from(pid).map_err(|_| TaskError::Invalid(format!("pid {pid}")))?;
        // As runc's shim: an exec is signalled directly. In the microvm
        // tier the pid is the relay, which forwards catchable signals to
        // the guest process; SIGKILL ends the relay, and the supervisor
        // kills the guest process whose relay went away.
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal).map_err(|source| {
            TaskError::Signal {
                what: describe(id, exec_id),
                pid,
                source,
            }
        })
    }

    fn delete_exec(&self, id: &str, exec_id: &str) -> Result<DeleteResponse, TaskError> {
        let mut containers = self.shared.lock();
        let c = containers
            .get_mut(id)
            .ok_or_else(|| TaskError::NotFound(id.to_string()))?;
        let bundle = c.bundle.clone();
        let e = c
            .execs
            .get(exec_id)
            .ok_or_else(|| missing_exec(id, exec_id))?;
        let p = &e.process;
        if p.exit.is_none() && p.status != Status::CREATED {
            return Err(TaskError::State {
                what: describe(id, exec_id),
                state: status_name(p.status),
                why: "a running exec process cannot be deleted",
            });
        }
        let (status, at) = p.exit.clone().unwrap_or_else(|| (0, Timestamp::now()));
        let pid = p.pid;
        c.execs.remove(exec_id);
        drop(containers);
        for file in [
            format!("exec-{exec_id}.json"),
            format!("exec-{exec_id}.pid"),
        ] {
            let _ = std::fs::remove_file(bundle.join(file));
        }
        Ok(DeleteResponse {
            pid,
            exit_status: status,
            exited_at: MessageField::some(at),
            ..Default::default()
        })
    }

    fn set_paused(&self, id: &str, paused: bool) -> Result<(), TaskError> {
        let (want, verb) = if paused {
            (Status::RUNNING, "pause")
        } else {
            (Status::PAUSED, "resume")
        };
        let status = self.with(id, |c| c.init.status)?;
        if status != want {
            return Err(TaskError::State {
                what: describe(id, ""),
                state: status_name(status),
                why: if paused {
                    "only a running container can be paused"
                } else {
                    "only a paused container can be resumed"
                },
            });
        }
        if paused {
            self.agentvm.pause(id)?;
        } else {
            self.agentvm.resume(id)?;
        }
        self.with(id, |c| {
            if c.init.exit.is_none() && !c.init.exiting {
                c.init.status = if paused {
                    Status::PAUSED
                } else {
                    Status::RUNNING
                };
            }
        })?;
        log::info!("container {id}: {verb}d");
        if paused {
            self.shared.publish(
                topics::TASK_PAUSED_EVENT_TOPIC,
                Box::new(TaskPaused {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            );
        } else {
            self.shared.publish(
                topics::TASK_RESUMED_EVENT_TOPIC,
                Box::new(TaskResumed {
                    container_id: id.to_string(),
                    ..Default::default()
                }),
            );
        }
        Ok(())
    }
}

/// Mounts the snapshotter's mounts on `<bundle>/rootfs`, as runc's shim
/// does; false when there are none (the bundle's rootfs is used as is,
/// e.g. `ctr run --rootfs`).
fn mount_rootfs(req: &CreateTaskRequest, bundle: &Path) -> Result<bool, TaskError> {
    if req.rootfs.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    for (index, m) in req.rootfs.iter().enumerate() {
        let mounted = containerd_shim::mount::mount_rootfs(
            Some(&m.type_),
            Some(&m.source),
            &m.options,
            &target,
        );
        if let Err(e) = mounted {
            if index > 0 {
                unmount_rootfs(bundle);
            }
            return Err(TaskError::Mount {
                index,
                kind: m.type_.clone(),
                target,
                detail: e.to_string(),
            });
        }
    }
    Ok(true)
}

fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Err(e) = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH) {
        log::warn!("cannot unmount {}: {e}", target.display());
    }
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::CREATED => "created",
        Status::RUNNING => "running",
        Status::STOPPED => "stopped",
        Status::PAUSED => "paused",
        Status::PAUSING => "pausing",
        Status::UNKNOWN => "unknown",
    }
}

impl containerd_shim::Task for Service {
    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        let pid = self.create_task(&req)?;
        self.shared.publish(
            topics::TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                pid,
                ..Default::default()
            }),
        );
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        let pid = if req.exec_id.is_empty() {
            self.start_init(&req.id)?
        } else {
            self.start_exec(&req.id, &req.exec_id)?
        };
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        let bundle = self.with(&req.id, |c| c.bundle.to_string_lossy().into_owned())?;
        let resp = self.with_process(&req.id, &req.exec_id, |p| StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            bundle,
            pid: p.pid,
            // Being started: not running yet.
            status: if p.status == Status::UNKNOWN {
                Status::CREATED
            } else {
                p.status
            }
            .into(),
            stdin: p.stdin.clone(),
            stdout: p.stdout.clone(),
            stderr: p.stderr.clone(),
            terminal: p.terminal,
            exit_status: p.exit.as_ref().map_or(0, |(s, _)| *s),
            exited_at: p.exit.as_ref().map_or(MessageField::none(), |(_, at)| {
                MessageField::some(at.clone())
            }),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })?;
        Ok(resp)
    }

    fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        self.with(&req.id, |_| ())?;
        let pids = self.agentvm.pids(&req.id).map_err(TaskError::from)?;
        Ok(PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| ProcessInfo {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        if !req.exec_id.is_empty() {
            self.kill_exec(&req.id, &req.exec_id, req.signal)?;
            return Ok(Empty::new());
        }
        let exited = self.with(&req.id, |c| c.init.exit.is_some())?;
        if exited {
            // As runc's shim: NOT_FOUND, which containerd's callers (CRI's
            // StopContainer) take as "already stopped".
            return Err(TaskError::Finished(describe(&req.id, "")).into());
        }
        self.agentvm
            .kill(&req.id, req.signal, req.all)
            .map_err(TaskError::from)?;
        Ok(Empty::new())
    }

    fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        let mut containers = self.shared.lock();
        loop {
            let c = containers
                .get(&req.id)
                .ok_or_else(|| TaskError::NotFound(req.id.clone()))?;
            let p = c
                .process(&req.exec_id)
                .ok_or_else(|| missing_exec(&req.id, &req.exec_id))?;
            if let Some((status, at)) = &p.exit {
                return Ok(WaitResponse {
                    exit_status: *status,
                    exited_at: MessageField::some(at.clone()),
                    ..Default::default()
                });
            }
            containers = self
                .shared
                .exited
                .wait(containers)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        if !req.exec_id.is_empty() {
            return Ok(self.delete_exec(&req.id, &req.exec_id)?);
        }
        let (pid, exit, bundle, mounted) = self.with(&req.id, |c| {
            (
                c.init.pid,
                c.init.exit.clone(),
                c.bundle.clone(),
                c.mounted_rootfs,
            )
        })?;
        // containerd deletes a created (never started) task too: agentvm
        // kills its init then.
        self.agentvm
            .delete(&req.id, exit.is_none())
            .map_err(TaskError::from)?;
        if mounted {
            unmount_rootfs(&bundle);
        }
        self.shared.lock().remove(&req.id);
        let (exit_status, exited_at) = exit.unwrap_or_else(|| (128 + 9, Timestamp::now()));
        self.shared.publish(
            topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: req.id.clone(),
                id: req.id.clone(),
                pid,
                exit_status,
                exited_at: MessageField::some(exited_at.clone()),
                ..Default::default()
            }),
        );
        Ok(DeleteResponse {
            pid,
            exit_status,
            exited_at: MessageField::some(exited_at),
            ..Default::default()
        })
    }

    fn connect(&self, _ctx: &TtrpcContext, req: ConnectRequest) -> TtrpcResult<ConnectResponse> {
        let task_pid = self.with(&req.id, |c| c.init.pid)?;
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        // One shim may serve several containers (a pod): it stays while
        // any is left.
        if self.shared.lock().is_empty() {
            self.exit.signal();
        }
        Ok(Empty::new())
    }

    fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        self.set_paused(&req.id, true)?;
        Ok(Empty::new())
    }

    fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        self.set_paused(&req.id, false)?;
        Ok(Empty::new())
    }

    fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        self.add_exec(&req)?;
        self.shared.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(Empty::new())
    }

    fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        let console = self.with_process(&req.id, &req.exec_id, |p| p.console.clone())?;
        let console = console.ok_or_else(|| TaskError::State {
            what: describe(&req.id, &req.exec_id),
            state: "without a terminal",
            why: "only a terminal can be resized",
        })?;
        console
            .resize(req.width, req.height)
            .map_err(TaskError::from)?;
        Ok(Empty::new())
    }

    fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        self.with_process(&req.id, &req.exec_id, |_| ())?;
        // The stdin relay ends at the client's end of file on the FIFO,
        // which containerd's client closes before it sends CloseIO.
        Ok(Empty::new())
    }

    fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        self.with(&req.id, |_| ())?;
        // containerd packs the OCI LinuxResources as JSON in the Any
        // (typeurl's JSON encoding of a non-protobuf type).
        let resources = req
            .resources
            .as_ref()
            .filter(|any| !any.value.is_empty())
            .ok_or_else(|| {
                TaskError::Invalid(format!("update of {}: no resources given", req.id))
            })?;
        if !resources.type_url.ends_with("LinuxResources") {
            return Err(TaskError::Invalid(format!(
                "update of {}: resources of type {:?}, expected the OCI LinuxResources",
                req.id, resources.type_url
            ))
            .into());
        }
        self.agentvm
            .update(&req.id, &resources.value)
            .map_err(TaskError::from)?;
        Ok(Empty::new())
    }

    fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        self.with(&req.id, |_| ())?;
        let output = self.agentvm.stats(&req.id).map_err(TaskError::from)?;
        let stats =
            metrics::from_events_output(&output, self.cgroup_mode).map_err(TaskError::from)?;
        Ok(StatsResponse {
            stats: MessageField::some(stats),
            ..Default::default()
        })
    }

    fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("checkpoint")
    }
}

/// The error for an exec id the container does not have.
fn missing_exec(id: &str, exec_id: &str) -> TaskError {
    TaskError::ExecNotFound {
        id: id.to_string(),
        exec_id: exec_id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_ids_that_cannot_name_a_file() {
        for good in ["e1", "exec-7", "a.b_c"] {
            assert!(check_exec_id(good).is_ok(), "{good}");
        }
        for bad in ["", "../x", "a/b", ".hidden", "sp ace", &"x".repeat(77)] {
            assert!(check_exec_id(bad).is_err(), "{bad}");
        }
    }
}
