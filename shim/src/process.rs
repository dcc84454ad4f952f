//! What the shim knows of its containers and their processes (the init
//! and each exec), and how their exits are learnt: the shim framework's
//! reaper reports every child's exit, the containers' processes being
//! re-parented to the shim, a subreaper.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use containerd_shim::api::Status;
use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};
use containerd_shim::protos::events::task::TaskExit;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::protos::topics;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::Context;

use crate::console::Console;

/// How many unclaimed exits are kept (most are the shim's own `agentvm`
/// commands).
const UNCLAIMED_EXITS: usize = 256;

/// How long an exit waits for its terminal's output to be copied before
/// it is reported anyway (a background process may keep the terminal).
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// How long an init's exit waits for the OOM watch's last look.
const OOM_DRAIN: Duration = Duration::from_secs(3);

/// One process: a container's init or an exec.
pub struct Process {
    /// Its host pid; 0 for an exec not started yet.
    pub pid: u32,
    pub status: Status,
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
    /// Set once it has exited: its status and when.
    pub exit: Option<(u32, Timestamp)>,
    /// Its terminal, when it has one.
    pub console: Option<Arc<Console>>,
    /// Its exit was seen and waits for the terminal's output to drain.
    pub exiting: bool,
}

impl Process {
    pub fn new(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> Process {
        Process {
            pid: 0,
            status: Status::CREATED,
            stdin: stdin.to_string(),
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
            terminal,
            exit: None,
            console: None,
            exiting: false,
        }
    }

    /// Started and not (known to be) ended.
    pub fn is_live(&self) -> bool {
        self.pid != 0 && self.exit.is_none() && !self.exiting
    }
}

/// An exec: its process and its OCI `Process` (JSON) from containerd.
pub struct Exec {
    pub process: Process,
    pub spec: Vec<u8>,
}

/// What the shim knows of one container.
pub struct Container {
    pub bundle: PathBuf,
    pub init: Process,
    pub execs: HashMap<String, Exec>,
    /// Whether the shim mounted the rootfs (and so unmounts it).
    pub mounted_rootfs: bool,
    /// The watch for OOM kills, if it could be started.
    pub oom: Option<Arc<crate::oom::Watch>>,
}

impl Container {
    /// The init (`exec_id` empty) or the exec `exec_id`.
    pub fn process(&self, exec_id: &str) -> Option<&Process> {
        if exec_id.is_empty() {
            Some(&self.init)
        } else {
            self.execs.get(exec_id).map(|e| &e.process)
        }
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Option<&mut Process> {
        if exec_id.is_empty() {
            Some(&mut self.init)
        } else {
            self.execs.get_mut(exec_id).map(|e| &mut e.process)
        }
    }
}

pub type Containers = HashMap<String, Container>;

pub struct Shared {
    containers: Mutex<Containers>,
    /// Notified on every exit, for `wait`.
    pub exited: Condvar,
    publisher: RemotePublisher,
    namespace: String,
    /// Exits of pids no process had (yet): a process that dies between
    /// agentvm's return and the shim's record of its pid is found here.
    /// Locked after `containers`, never before.
    unclaimed: Mutex<VecDeque<(i32, i32)>>,
}

impl Shared {
    pub fn new(publisher: RemotePublisher, namespace: &str) -> Arc<Shared> {
        Arc::new(Shared {
            containers: Mutex::new(HashMap::new()),
            exited: Condvar::new(),
            publisher,
            namespace: namespace.to_string(),
            unclaimed: Mutex::new(VecDeque::new()),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Containers> {
        // A panic while holding the lock leaves plain data behind: keep it.
        self.containers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exit status of `pid` if it exited before a process claimed it.
    /// Called with the containers' lock held (the guard proves it), so
    /// that the reaper's thread cannot file the exit in between.
    pub fn take_unclaimed(&self, _held: &mut Containers, pid: u32) -> Option<i32> {
        let pid = i32::try_from(pid).ok()?;
        let mut unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = unclaimed.iter().position(|(p, _)| *p == pid)?;
        unclaimed.remove(at).map(|(_, code)| code)
    }

    pub fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
        {
            log::warn!("cannot publish {topic} to containerd: {e}");
        }
    }

    /// The process `exec_id` (empty: the init) of container `id` exited
    /// with `code`. With a terminal, the exit is reported once its output
    /// has been copied (so that a client that sees the exit has all of
    /// it); an init's exit, once the OOM watch has had its last look (so
    /// that an OOM kill is reported before the exit it caused). Otherwise
    /// at once.
    pub fn process_exited(self: &Arc<Self>, id: &str, exec_id: &str, code: i32) {
        let (console, oom) = {
            let mut containers = self.lock();
            let Some(c) = containers.get_mut(id) else {
                return;
            };
            let oom = if exec_id.is_empty() {
                c.oom.clone()
            } else {
                None
            };
            let Some(p) = c.process_mut(exec_id) else {
                return;
            };
            if p.exit.is_some() || p.exiting {
                return;
            }
            p.exiting = p.console.is_some() || oom.is_some();
            (p.console.clone(), oom)
        };
        if console.is_none() && oom.is_none() {
            return self.record_exit(id, exec_id, code);
        }
        let shared = Arc::clone(self);
        let (id, exec_id) = (id.to_string(), exec_id.to_string());
        std::thread::spawn(move || {
            if let Some(console) = console {
                console.wait_output(OUTPUT_DRAIN);
            }
            if let Some(oom) = oom {
                oom.wake();
                oom.wait(OOM_DRAIN);
            }
            shared.record_exit(&id, &exec_id, code);
        });
    }

    fn record_exit(&self, id: &str, exec_id: &str, code: i32) {
        let status = exit_status(code);
        let at = Timestamp::now();
        let pid = {
            let mut containers = self.lock();
            let Some(p) = containers.get_mut(id).and_then(|c| c.process_mut(exec_id)) else {
                return;
            };
            if p.exit.is_some() {
                return;
            }
            p.exit = Some((status, at.clone()));
            p.exiting = false;
            p.status = Status::STOPPED;
            p.pid
        };
        self.exited.notify_all();
        let process_id = if exec_id.is_empty() { id } else { exec_id };
        self.publish(
            topics::TASK_EXIT_EVENT_TOPIC,
            Box::new(task_exit(id, process_id, pid, status, &at)),
        );
    }
}

/// A status as containerd reports it: the reaper's exit code, or 128 plus
/// the signal that killed the process.
pub fn exit_status(code: i32) -> u32 {
    u32::try_from(code).unwrap_or(255)
}

pub fn task_exit(container_id: &str, id: &str, pid: u32, status: u32, at: &Timestamp) -> TaskExit {
    TaskExit {
        container_id: container_id.to_string(),
        id: id.to_string(),
        pid,
        exit_status: status,
        exited_at: MessageField::some(at.clone()),
        ..Default::default()
    }
}

/// The container and exec id of the live process `pid`.
fn find(containers: &Containers, pid: i32) -> Option<(String, String)> {
    let is = |p: &Process| p.is_live() && i64::from(p.pid) == i64::from(pid);
    containers.iter().find_map(|(id, c)| {
        if is(&c.init) {
            return Some((id.clone(), String::new()));
        }
        c.execs
            .iter()
            .find(|(_, e)| is(&e.process))
            .map(|(exec_id, _)| (id.clone(), exec_id.clone()))
    })
}

/// Records each container process's exit (the framework's reaper reports
/// every child's), wakes `wait` and tells containerd.
pub fn watch_exits(shared: Arc<Shared>) {
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
            let found = {
                let containers = shared.lock();
                let found = find(&containers, pid);
                if found.is_none() {
                    let mut unclaimed = shared
                        .unclaimed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if unclaimed.len() >= UNCLAIMED_EXITS {
                        unclaimed.pop_front();
                    }
                    unclaimed.push_back((pid, event.exit_code));
                }
                found
            };
            if let Some((id, exec_id)) = found {
                shared.process_exited(&id, &exec_id, event.exit_code);
            }
        }
    });
}
