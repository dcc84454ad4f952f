//! containerd's task service (`containerd.task.v2.Task`) over agentvm.
//!
//! Each container is created and started by the `agentvm` binary
//! ([`crate::runtime`]); the shim keeps what containerd asks about (pid,
//! status, exit status, stdio paths) and learns of exits from the shim
//! framework's reaper, since the container's init is re-parented to the
//! shim. The tier is picked by agentvm itself from the bundle's annotation
//! or its config file, exactly as under runc's shim.
//!
//! Methods not implemented yet answer UNIMPLEMENTED with the feature's
//! name, never a pretend success.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use containerd_shim::api::{
    ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse, DeleteRequest,
    DeleteResponse, Empty, KillRequest, PidsRequest, PidsResponse, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, Status, WaitRequest, WaitResponse,
};
use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};
use containerd_shim::protos::events::task::{TaskCreate, TaskDelete, TaskExit, TaskIO, TaskStart};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::{self, Code};
use containerd_shim::protos::types::task::ProcessInfo;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Context, ExitSignal, TtrpcContext, TtrpcResult};

use crate::runtime::{Agentvm, RuntimeError};
use crate::stdio::{self, StdioError};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("container {0} does not exist in this shim")]
    NotFound(String),
    #[error("process already finished: container {0} has exited")]
    Finished(String),
    #[error("container {0} already exists in this shim")]
    Exists(String),
    #[error("{what}: not implemented yet in the agentvm shim")]
    NotImplemented { what: String },
    #[error("container {id} is {state}: {why}")]
    State {
        id: String,
        state: &'static str,
        why: &'static str,
    },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Stdio(#[from] StdioError),
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
            TaskError::NotFound(_) | TaskError::Finished(_) => Code::NOT_FOUND,
            TaskError::Exists(_) => Code::ALREADY_EXISTS,
            TaskError::NotImplemented { .. } => Code::UNIMPLEMENTED,
            TaskError::State { .. } => Code::FAILED_PRECONDITION,
            TaskError::Stdio(StdioError::Terminal) => Code::UNIMPLEMENTED,
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

/// What the shim knows of one container.
struct Container {
    bundle: PathBuf,
    pid: u32,
    status: Status,
    stdin: String,
    stdout: String,
    stderr: String,
    /// Set once the init has exited: its status and when.
    exit: Option<(u32, Timestamp)>,
    /// Whether the shim mounted the rootfs (and so unmounts it).
    mounted_rootfs: bool,
}

struct Shared {
    containers: Mutex<HashMap<String, Container>>,
    /// Notified on every exit, for `wait`.
    exited: Condvar,
    publisher: RemotePublisher,
    namespace: String,
    /// Exits of pids no container had (yet): an init that dies between
    /// `agentvm create`'s return and the shim's record of it is found
    /// here. Locked after `containers`, never before.
    unclaimed: Mutex<VecDeque<(i32, i32)>>,
}

/// How many unclaimed exits are kept (most are the shim's own `agentvm`
/// commands).
const UNCLAIMED_EXITS: usize = 256;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Container>> {
        // A panic while holding the lock leaves plain data behind: keep it.
        self.containers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exit status of `pid` if it exited before a container claimed it.
    fn take_unclaimed(&self, pid: i32) -> Option<i32> {
        let mut unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = unclaimed.iter().position(|(p, _)| *p == pid)?;
        unclaimed.remove(at).map(|(_, code)| code)
    }

    fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
        {
            log::warn!("cannot publish {topic} to containerd: {e}");
        }
    }
}

pub struct Service {
    shared: Arc<Shared>,
    agentvm: Agentvm,
    exit: Arc<ExitSignal>,
}

impl Service {
    pub fn new(
        publisher: RemotePublisher,
        namespace: &str,
        agentvm: Agentvm,
        exit: Arc<ExitSignal>,
    ) -> Service {
        let shared = Arc::new(Shared {
            containers: Mutex::new(HashMap::new()),
            exited: Condvar::new(),
            publisher,
            namespace: namespace.to_string(),
            unclaimed: Mutex::new(VecDeque::new()),
        });
        watch_exits(Arc::clone(&shared));
        Service {
            shared,
            agentvm,
            exit,
        }
    }

    fn create_task(&self, req: &CreateTaskRequest) -> Result<u32, TaskError> {
        if self.shared.lock().contains_key(&req.id) {
            return Err(TaskError::Exists(req.id.clone()));
        }
        if !req.checkpoint.is_empty() || !req.parent_checkpoint.is_empty() {
            return Err(TaskError::NotImplemented {
                what: "create from a checkpoint".into(),
            });
        }
        let bundle = PathBuf::from(&req.bundle);
        let stdio = stdio::open(&stdio::Paths {
            stdin: &req.stdin,
            stdout: &req.stdout,
            stderr: &req.stderr,
            terminal: req.terminal,
        })?;
        let mounted_rootfs = mount_rootfs(req, &bundle)?;
        let created = self.agentvm.create(
            &req.id,
            &bundle,
            &bundle.join("init.pid"),
            &bundle.join("agentvm-log.json"),
            stdio,
        );
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                if mounted_rootfs {
                    unmount_rootfs(&bundle);
                }
                return Err(e.into());
            }
        };
        let pid = u32::try_from(pid).map_err(|_| RuntimeError::Output {
            command: "create".into(),
            what: "a pid file",
            detail: format!("negative pid {pid}"),
        })?;
        let mut containers = self.shared.lock();
        let early = i32::try_from(pid)
            .ok()
            .and_then(|p| self.shared.take_unclaimed(p))
            .map(|code| (exit_status(code), Timestamp::now()));
        let container = Container {
            bundle,
            pid,
            status: if early.is_some() {
                Status::STOPPED
            } else {
                Status::CREATED
            },
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            exit: early,
            mounted_rootfs,
        };
        let exit = container
            .exit
            .as_ref()
            .map(|(status, at)| task_exit(&req.id, pid, *status, at));
        containers.insert(req.id.clone(), container);
        drop(containers);
        if let Some(exit) = exit {
            self.shared.exited.notify_all();
            self.shared
                .publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(exit));
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
}

fn no_exec(exec_id: &str, method: &str) -> TtrpcResult<()> {
    if exec_id.is_empty() {
        Ok(())
    } else {
        not_implemented(&format!("{method} of an exec process ({exec_id}): exec"))
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

/// A status as containerd reports it: the reaper's exit code, or 128 plus
/// the signal that killed the process.
fn exit_status(code: i32) -> u32 {
    u32::try_from(code).unwrap_or(255)
}

fn task_exit(id: &str, pid: u32, status: u32, at: &Timestamp) -> TaskExit {
    TaskExit {
        container_id: id.to_string(),
        id: id.to_string(),
        pid,
        exit_status: status,
        exited_at: MessageField::some(at.clone()),
        ..Default::default()
    }
}

/// Records each container init's exit (the framework's reaper reports
/// every child's), wakes `wait` and tells containerd.
fn watch_exits(shared: Arc<Shared>) {
    let subscription = match monitor_subscribe(Topic::Pid) {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot watch exits: {e}");
            return;
        }
    };
    std::thread::spawn(move || {
        for event in subscription.rx.iter() {
            let Subject::Pid(pid) = event.subject else {
                continue;
            };
            let mut exits = Vec::new();
            {
                let mut containers = shared.lock();
                for (id, c) in containers.iter_mut() {
                    if c.exit.is_none() && i64::from(c.pid) == i64::from(pid) {
                        let status = exit_status(event.exit_code);
                        let at = Timestamp::now();
                        exits.push(task_exit(id, c.pid, status, &at));
                        c.exit = Some((status, at));
                        c.status = Status::STOPPED;
                    }
                }
                if exits.is_empty() {
                    let mut unclaimed = shared
                        .unclaimed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if unclaimed.len() >= UNCLAIMED_EXITS {
                        unclaimed.pop_front();
                    }
                    unclaimed.push_back((pid, event.exit_code));
                }
            }
            if exits.is_empty() {
                continue;
            }
            shared.exited.notify_all();
            for exit in exits {
                shared.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(exit));
            }
        }
    });
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
        no_exec(&req.exec_id, "start")?;
        let (pid, status) = self.with(&req.id, |c| (c.pid, c.status))?;
        if status != Status::CREATED {
            return Err(TaskError::State {
                id: req.id,
                state: status_name(status),
                why: "only a created container can be started",
            }
            .into());
        }
        self.agentvm.start(&req.id).map_err(TaskError::from)?;
        // The init may have run and exited already: keep STOPPED then.
        self.with(&req.id, |c| {
            if c.exit.is_none() {
                c.status = Status::RUNNING;
            }
        })?;
        self.shared.publish(
            topics::TASK_START_EVENT_TOPIC,
            Box::new(TaskStart {
                container_id: req.id.clone(),
                pid,
                ..Default::default()
            }),
        );
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        no_exec(&req.exec_id, "state")?;
        let resp = self.with(&req.id, |c| StateResponse {
            id: req.id.clone(),
            bundle: c.bundle.to_string_lossy().into_owned(),
            pid: c.pid,
            status: c.status.into(),
            stdin: c.stdin.clone(),
            stdout: c.stdout.clone(),
            stderr: c.stderr.clone(),
            terminal: false,
            exit_status: c.exit.as_ref().map_or(0, |(s, _)| *s),
            exited_at: c.exit.as_ref().map_or(MessageField::none(), |(_, at)| {
                MessageField::some(at.clone())
            }),
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
        no_exec(&req.exec_id, "kill")?;
        let exited = self.with(&req.id, |c| c.exit.is_some())?;
        if exited {
            // As runc's shim: NOT_FOUND, which containerd's callers (CRI's
            // StopContainer) take as "already stopped".
            return Err(TaskError::Finished(req.id).into());
        }
        self.agentvm
            .kill(&req.id, req.signal, req.all)
            .map_err(TaskError::from)?;
        Ok(Empty::new())
    }

    fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        no_exec(&req.exec_id, "wait")?;
        let mut containers = self.shared.lock();
        loop {
            let c = containers
                .get(&req.id)
                .ok_or_else(|| TaskError::NotFound(req.id.clone()))?;
            if let Some((status, at)) = &c.exit {
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
        no_exec(&req.exec_id, "delete")?;
        let (pid, exit, bundle, mounted) = self.with(&req.id, |c| {
            (c.pid, c.exit.clone(), c.bundle.clone(), c.mounted_rootfs)
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
        let task_pid = self.with(&req.id, |c| c.pid)?;
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

    fn pause(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::PauseRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("pause")
    }

    fn resume(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::ResumeRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("resume")
    }

    fn exec(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::ExecProcessRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("exec")
    }

    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::ResizePtyRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("resize (terminals)")
    }

    fn close_io(
        &self,
        _ctx: &TtrpcContext,
        req: containerd_shim::api::CloseIORequest,
    ) -> TtrpcResult<Empty> {
        no_exec(&req.exec_id, "close-IO")?;
        self.with(&req.id, |_| ())?;
        // The stdin relay ends at the client's end of file on the FIFO,
        // which containerd's client closes before it sends CloseIO.
        Ok(Empty::new())
    }

    fn update(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::UpdateTaskRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("update (resource limits)")
    }

    fn stats(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::StatsRequest,
    ) -> TtrpcResult<containerd_shim::api::StatsResponse> {
        not_implemented("stats")
    }

    fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        _req: containerd_shim::api::CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        not_implemented("checkpoint")
    }
}
