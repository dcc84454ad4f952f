//! The host's requests, served by the container tier inside the VM.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use libcontainer::container::ContainerStatus;
use nix::errno::Errno;
use oci_spec::runtime::{LinuxResources, Process, Spec};

use super::agent::Agent;
use super::stream::{pipes, ParentStdio, Stream};
use super::sys::{SigchldUnblocked, StdioSwap};
use super::{AGENT_DIR, BUNDLE_DIR, CONTAINER_ID, GUEST_CGROUP};
use crate::bundle::{Bundle, BundleError};
use crate::container::create::CreateOptions;
use crate::container::exec::ExecOptions;
use crate::container::tty::{ConsoleSocket, TtyError};
use crate::container::{lc_error, status_str, ContainerError};
use crate::protocol::{
    GuestProcess, GuestStats, HostMessage, MemberRequest, PodNamespace, Reply, INIT_STREAM,
};

/// A request that failed; its text is the Reply::Error message, worded as
/// runc would word it where runc has an equivalent.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Tier(#[from] ContainerError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Tty(#[from] TtyError),
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys { what: String, source: Errno },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RequestError {
    let what = what.into();
    move |source| RequestError::Io { what, source }
}

fn sys(what: impl Into<String>) -> impl FnOnce(Errno) -> RequestError {
    let what = what.into();
    move |source| RequestError::Sys { what, source }
}

/// How a new process's stdio reaches the agent.
enum Stdio {
    Pipes(ParentStdio),
    /// The pty master arrives on this socket.
    Pty(ConsoleSocket),
}

impl Agent {
    /// Serves one request (all but Shutdown, which the loop handles).
    pub(super) fn handle(&mut self, msg: HostMessage) -> Reply {
        let result = match msg {
            HostMessage::Network { network } => self.network(network),
            HostMessage::Create { spec } => self.create(*spec),
            HostMessage::Start => self.start(CONTAINER_ID),
            HostMessage::RunHooks { hooks, state } => self.run_hooks(CONTAINER_ID, hooks, state),
            HostMessage::Exec {
                id,
                process,
                cgroup,
            } => self.exec(CONTAINER_ID, id, *process, cgroup),
            HostMessage::Signal { id, signal, all } => self.signal(id, signal, all),
            HostMessage::Resize { id, rows, cols } => self.resize(id, rows, cols),
            HostMessage::Ps => self.ps(CONTAINER_ID),
            HostMessage::Stats => self.stats(CONTAINER_ID),
            HostMessage::Update { resources } => self.update(CONTAINER_ID, *resources),
            HostMessage::Pause => self.set_paused(CONTAINER_ID, true),
            HostMessage::Resume => self.set_paused(CONTAINER_ID, false),
            HostMessage::Shutdown => Ok(Reply::Ok),
            HostMessage::CreateMember { id, spec, join } => self.create_member(id, *spec, &join),
            HostMessage::Member { id, request } => self.member(id, request),
            HostMessage::Warm => self.warm(),
        };
        result.unwrap_or_else(|e| Reply::Error {
            message: e.to_string(),
        })
    }

    /// [`super::warm`], before any container: after one it would run
    /// beside the container's processes for nothing.
    fn warm(&mut self) -> Result<Reply, RequestError> {
        if !self.streams.is_empty() || self.ctx.container_dir(CONTAINER_ID).exists() {
            return Err(RequestError::Refused(
                "warm-up: the VM already has a container".into(),
            ));
        }
        let took =
            super::warm::warm(&self.ctx).map_err(|e| RequestError::Refused(e.to_string()))?;
        let _ = self
            .port
            .log("debug", format!("warm-up: {} ms", took.as_millis()));
        Ok(Reply::Ok)
    }

    fn network(&mut self, network: crate::protocol::Network) -> Result<Reply, RequestError> {
        if self.netns.is_some() || self.streams.contains_key(&INIT_STREAM) {
            return Err(RequestError::Refused(
                "the network is configured once, before create".into(),
            ));
        }
        let path =
            super::net::configure(&network).map_err(|e| RequestError::Refused(e.to_string()))?;
        self.netns = Some(path);
        Ok(Reply::Ok)
    }

    fn create(&mut self, spec: Spec) -> Result<Reply, RequestError> {
        if self.streams.contains_key(&INIT_STREAM) || self.ctx.container_dir(CONTAINER_ID).exists()
        {
            return Err(RequestError::Refused(format!(
                "container with id {CONTAINER_ID} already exists"
            )));
        }
        if let Some(e) = &self.share_error {
            return Err(RequestError::Refused(e.clone()));
        }
        let mut spec = guest_spec(spec, self.netns.as_deref());
        super::net::apply_net_sysctls(&mut spec)
            .map_err(|e| RequestError::Refused(e.to_string()))?;
        // guest_spec leaves an absolute cgroup path, which the container
        // tier takes as it is.
        let cgroup = spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().as_deref())
            .map(cgroup_dir);
        // The VM booted for this container: nothing made its cgroup yet.
        let reply =
            self.create_container(CONTAINER_ID, Path::new(BUNDLE_DIR), spec, INIT_STREAM, true)?;
        self.init_cgroup = cgroup;
        Ok(reply)
    }

    /// A further container of the pod, whose init is stream `id`, in the
    /// namespaces `join` names of the VM's own container.
    fn create_member(
        &mut self,
        id: u32,
        spec: Spec,
        join: &[PodNamespace],
    ) -> Result<Reply, RequestError> {
        if id == INIT_STREAM || self.streams.contains_key(&id) || self.members.contains_key(&id) {
            return Err(RequestError::Refused(format!(
                "stream {id} cannot be a member's init: it is 0 or in use"
            )));
        }
        if let Some(e) = &self.share_error {
            return Err(RequestError::Refused(e.clone()));
        }
        // The pod's namespaces are the sandbox container's: its init must
        // exist (it does while the VM serves the pod).
        let sandbox = crate::container::load(&self.ctx, CONTAINER_ID)?;
        let sandbox_pid = sandbox.pid().ok_or_else(|| {
            RequestError::Refused("the pod's sandbox container has no process".into())
        })?;
        let mut spec = member_spec(spec, join, sandbox_pid.as_raw(), self.netns.as_deref());
        super::net::apply_net_sysctls(&mut spec)
            .map_err(|e| RequestError::Refused(e.to_string()))?;
        let guest_id = member_id(id);
        let bundle_dir = PathBuf::from(format!("{MEMBER_BUNDLES}/{guest_id}"));
        let reply = self.create_container(&guest_id, &bundle_dir, spec, id, false);
        match &reply {
            Ok(_) => {
                self.members.insert(id, guest_id);
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(&bundle_dir);
            }
        }
        reply
    }

    /// A request about member `id`.
    fn member(&mut self, id: u32, request: MemberRequest) -> Result<Reply, RequestError> {
        let Some(guest_id) = self.members.get(&id).cloned() else {
            return Err(RequestError::Refused(format!(
                "stream {id} is not a member container of this pod"
            )));
        };
        match request {
            MemberRequest::Start => self.start(&guest_id),
            MemberRequest::RunHooks { hooks, state } => self.run_hooks(&guest_id, hooks, state),
            MemberRequest::Exec {
                stream,
                process,
                cgroup,
            } => self.exec(&guest_id, stream, *process, cgroup),
            MemberRequest::Ps => self.ps(&guest_id),
            MemberRequest::Stats => self.stats(&guest_id),
            MemberRequest::Update { resources } => self.update(&guest_id, *resources),
            MemberRequest::Pause => self.set_paused(&guest_id, true),
            MemberRequest::Resume => self.set_paused(&guest_id, false),
            MemberRequest::Delete => self.delete_member(id, &guest_id),
        }
    }

    /// Kills what is left of member `id` and removes it; the agent's loop
    /// reports its init's exit (if it had not) as for any stream.
    fn delete_member(&mut self, id: u32, guest_id: &str) -> Result<Reply, RequestError> {
        if self.ctx.container_dir(guest_id).exists() {
            let mut container = crate::container::load(&self.ctx, guest_id)?;
            crate::container::delete::delete(&mut container, true)?;
        }
        let _ = std::fs::remove_dir_all(format!("{MEMBER_BUNDLES}/{guest_id}"));
        self.members.remove(&id);
        Ok(Reply::Ok)
    }

    /// Creates container `guest_id` from `spec` in `bundle_dir`, its init
    /// as stream `stream`; `fresh_cgroup` as in [`CreateOptions`].
    fn create_container(
        &mut self,
        guest_id: &str,
        bundle_dir: &Path,
        mut spec: Spec,
        stream: u32,
        fresh_cgroup: bool,
    ) -> Result<Reply, RequestError> {
        if let Some(seccomp) = spec
            .linux_mut()
            .as_mut()
            .and_then(|l| l.seccomp_mut().as_mut())
        {
            keep_runnable_arches(seccomp, Path::new(IA32_SYSCTL).exists());
        }
        std::fs::create_dir_all(bundle_dir)
            .map_err(io(format!("cannot create {}", bundle_dir.display())))?;
        let config = bundle_dir.join("config.json");
        let text = serde_json::to_vec(&spec)
            .map_err(|e| RequestError::Refused(format!("cannot encode the spec: {e}")))?;
        std::fs::write(&config, text).map_err(io(format!("cannot write {}", config.display())))?;
        // libcontainer reads the file; the spec it holds is at hand.
        let bundle = Bundle::with_spec(bundle_dir, spec)?;
        let terminal = bundle
            .spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false);
        let mut opts = CreateOptions {
            detached: true,
            fresh_cgroup,
            // The host added it (`microvm::spec::plan_in`).
            enosys_added: true,
            ..Default::default()
        };
        let stdio = if terminal {
            let name = match stream {
                INIT_STREAM => "init".to_string(),
                n => format!("init-{n}"),
            };
            let socket = ConsoleSocket::bind(Path::new(AGENT_DIR), &name)?;
            opts.console_socket = Some(socket.path().to_path_buf());
            Stdio::Pty(socket)
        } else {
            let (child, parent) = pipes().map_err(sys("cannot create stdio pipes"))?;
            opts.stdin = Some(child.stdin);
            opts.stdout = Some(child.stdout);
            opts.stderr = Some(child.stderr);
            Stdio::Pipes(parent)
        };
        let created = {
            let _unblocked = SigchldUnblocked::new().map_err(sys("cannot unblock SIGCHLD"))?;
            crate::container::create::create(&self.ctx, guest_id, &bundle, opts)
        };
        // The container tier works in the bundle, as runc does; a member's
        // bundle goes with it, and the agent's directory must not.
        let _ = std::env::set_current_dir(AGENT_DIR);
        let container = created?;
        let pid = container.pid().ok_or_else(|| {
            RequestError::Refused("the container was created without a process".into())
        })?;
        let process = new_stream(pid, stdio)?;
        self.streams.insert(stream, process);
        Ok(Reply::Created { pid: pid.as_raw() })
    }

    fn start(&mut self, guest_id: &str) -> Result<Reply, RequestError> {
        let mut container = crate::container::load(&self.ctx, guest_id)?;
        match container.status() {
            ContainerStatus::Created => {}
            other => {
                return Err(RequestError::Refused(crate::tier::cannot_start(
                    status_str(other),
                )))
            }
        }
        container.start().map_err(lc_error)?;
        Ok(Reply::Ok)
    }

    fn exec(
        &mut self,
        guest_id: &str,
        id: u32,
        process: Process,
        cgroup: Vec<String>,
    ) -> Result<Reply, RequestError> {
        if id == INIT_STREAM {
            return Err(RequestError::Refused(
                "exec stream ids start at 1 (0 is the container's init)".into(),
            ));
        }
        if self.streams.contains_key(&id) || self.members.contains_key(&id) {
            return Err(RequestError::Refused(format!(
                "exec stream {id} is still in use"
            )));
        }
        if process.args().as_ref().is_none_or(|a| a.is_empty()) {
            return Err(RequestError::Refused(format!(
                "invalid process for exec {id}: args must not be empty"
            )));
        }
        let path = PathBuf::from(format!("{AGENT_DIR}/exec-{id}.json"));
        let text = serde_json::to_vec(&process)
            .map_err(|e| RequestError::Refused(format!("cannot encode the process: {e}")))?;
        std::fs::write(&path, text).map_err(io(format!("cannot write {}", path.display())))?;
        let terminal = process.terminal().unwrap_or(false);
        let result = self.exec_process(guest_id, id, &path, terminal, cgroup);
        let _ = std::fs::remove_file(&path);
        result
    }

    fn exec_process(
        &mut self,
        guest_id: &str,
        id: u32,
        path: &Path,
        terminal: bool,
        sub_cgroup: Vec<String>,
    ) -> Result<Reply, RequestError> {
        let mut opts = ExecOptions {
            process: Some(path.to_path_buf()),
            detach: true,
            sub_cgroup,
            ..Default::default()
        };
        let (pid, stdio) = if terminal {
            let socket = ConsoleSocket::bind(Path::new(AGENT_DIR), &format!("exec-{id}"))?;
            opts.console_socket = Some(socket.path().to_path_buf());
            let _unblocked = SigchldUnblocked::new().map_err(sys("cannot unblock SIGCHLD"))?;
            let pid = crate::container::exec::exec(&self.ctx, guest_id, opts)?;
            (pid, Stdio::Pty(socket))
        } else {
            let (child, parent) = pipes().map_err(sys("cannot create stdio pipes"))?;
            let pid = {
                let _swap = StdioSwap::new(
                    child.stdin.as_fd(),
                    child.stdout.as_fd(),
                    child.stderr.as_fd(),
                )
                .map_err(sys("cannot hand stdio pipes to the process"))?;
                let _unblocked = SigchldUnblocked::new().map_err(sys("cannot unblock SIGCHLD"))?;
                crate::container::exec::exec(&self.ctx, guest_id, opts)?
            };
            // Our copies of the process's ends go now, or EOF never comes.
            drop(child);
            (pid, Stdio::Pipes(parent))
        };
        let stream = new_stream(pid, stdio)?;
        self.streams.insert(id, stream);
        Ok(Reply::Started { pid: pid.as_raw() })
    }

    fn signal(&mut self, id: u32, signal: i32, all: bool) -> Result<Reply, RequestError> {
        if all {
            // Every process of the container whose init is stream `id`.
            let guest_id = self
                .members
                .get(&id)
                .map(String::as_str)
                .unwrap_or(CONTAINER_ID);
            let container = crate::container::load(&self.ctx, guest_id)?;
            for pid in crate::container::pids(&container)? {
                match crate::signal::send(pid, signal) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => return Err(sys(format!("cannot signal process {pid}"))(e)),
                }
            }
            return Ok(Reply::Ok);
        }
        let Some(stream) = self.streams.get(&id).filter(|s| s.running()) else {
            return Err(RequestError::Refused(if id == INIT_STREAM {
                "container not running".to_string()
            } else {
                format!("exec process {id} is not running")
            }));
        };
        crate::signal::send(stream.pid, signal)
            .map_err(sys(format!("cannot signal process {}", stream.pid)))?;
        Ok(Reply::Ok)
    }

    fn resize(&mut self, id: u32, rows: u16, cols: u16) -> Result<Reply, RequestError> {
        let stream = self
            .streams
            .get(&id)
            .ok_or_else(|| RequestError::Refused(format!("no process with stream id {id}")))?;
        stream
            .resize(rows, cols)
            .map_err(|e| RequestError::Refused(format!("stream {id}: {e}")))?;
        Ok(Reply::Ok)
    }

    fn ps(&mut self, guest_id: &str) -> Result<Reply, RequestError> {
        let container = crate::container::load(&self.ctx, guest_id)?;
        let pids = crate::container::pids(&container)?;
        let pids: Vec<i32> = pids.into_iter().map(|p| p.as_raw()).collect();
        let processes = pids.iter().filter_map(|&p| describe_process(p)).collect();
        Ok(Reply::Pids { pids, processes })
    }

    fn update(&mut self, guest_id: &str, resources: LinuxResources) -> Result<Reply, RequestError> {
        let container = crate::container::load(&self.ctx, guest_id)?;
        crate::container::update(&container, &resources)?;
        Ok(Reply::Ok)
    }

    /// Freezes or thaws the container's cgroup (libcontainer's pause, as
    /// the container tier's), with runc's words for a container that is
    /// not running, or not paused.
    fn set_paused(&mut self, guest_id: &str, paused: bool) -> Result<Reply, RequestError> {
        let mut container = crate::container::load(&self.ctx, guest_id)?;
        match (paused, container.status()) {
            (true, ContainerStatus::Running) => container.pause().map_err(lc_error)?,
            (false, ContainerStatus::Paused) => container.resume().map_err(lc_error)?,
            (true, _) => return Err(RequestError::Refused(crate::tier::NOT_RUNNING.into())),
            (false, _) => return Err(RequestError::Refused(crate::tier::NOT_PAUSED.into())),
        }
        Ok(Reply::Ok)
    }

    fn stats(&mut self, guest_id: &str) -> Result<Reply, RequestError> {
        let meminfo =
            std::fs::read_to_string("/proc/meminfo").map_err(io("cannot read /proc/meminfo"))?;
        let mut stats = GuestStats {
            memory_total_bytes: meminfo_bytes(&meminfo, "MemTotal").unwrap_or(0),
            memory_available_bytes: meminfo_bytes(&meminfo, "MemAvailable").unwrap_or(0),
            ..Default::default()
        };
        if self.ctx.container_dir(guest_id).exists() {
            let container = crate::container::load(&self.ctx, guest_id)?;
            let dir = cgroup_dir(&crate::container::cgroup_path(&container)?);
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            stats.memory_usage_bytes = read("memory.current").trim().parse().unwrap_or(0);
            stats.cpu_usage_ns = cpu_usage_usec(&read("cpu.stat"))
                .unwrap_or(0)
                .saturating_mul(1000);
            stats.pids = read("pids.current").trim().parse().unwrap_or(0);
            // "max" (no limit) parses to nothing: the guest's RAM bounds it.
            stats.memory_limit_bytes = read("memory.max").trim().parse().unwrap_or(0);
            stats.oom_kills = oom_kills(&dir);
        }
        Ok(Reply::Stats { stats, vmm: None })
    }
}

fn new_stream(pid: nix::unistd::Pid, stdio: Stdio) -> Result<Stream, RequestError> {
    match stdio {
        Stdio::Pipes(parent) => Ok(Stream::with_pipes(pid, parent)),
        Stdio::Pty(socket) => {
            let master = socket.receive_master()?;
            Stream::with_pty(pid, master).map_err(io("cannot set up the pty master"))
        }
    }
}

/// The spec as the guest runs it. The host already rewrote paths onto the
/// share; here only the cgroup path changes when it has no meaning in the
/// VM: a systemd-style `slice:prefix:name` (there is no systemd in the
/// guest) or a relative path becomes [`GUEST_CGROUP`]. With a configured
/// network the container joins its namespace (`netns`).
pub fn guest_spec(mut spec: Spec, netns: Option<&Path>) -> Spec {
    let mut linux = spec.linux().clone().unwrap_or_default();
    if let (Some(path), Some(nss)) = (netns, linux.namespaces().clone()) {
        let nss = nss
            .into_iter()
            .map(|mut ns| {
                if ns.typ() == oci_spec::runtime::LinuxNamespaceType::Network {
                    ns.set_path(Some(path.to_path_buf()));
                }
                ns
            })
            .collect();
        linux.set_namespaces(Some(nss));
    }
    let keep = linux
        .cgroups_path()
        .as_ref()
        .is_some_and(|p| p.is_absolute() && !p.to_string_lossy().contains(':'));
    if !keep {
        linux.set_cgroups_path(Some(GUEST_CGROUP.into()));
    }
    spec.set_linux(Some(linux));
    spec
}

/// Present when the guest kernel runs 32-bit x86 system calls
/// (`CONFIG_IA32_EMULATION`); agentvm's own kernel does not.
const IA32_SYSCTL: &str = "/proc/sys/abi/vsyscall32";

/// Keeps of a seccomp profile's architectures those whose system calls
/// the guest kernel can run: x86-64, and 32-bit x86 only when `ia32`. The
/// others cannot reach the guest kernel, and libseccomp compiling rules
/// for them is most of the cost of loading a profile under TCG (Docker's
/// lists three). A call of an architecture left out is the filter's bad
/// architecture (the thread is killed), never let through: an x32 call,
/// which agentvm's kernel answers ENOSYS, is killed instead. A profile
/// naming none of them is left as it is.
pub fn keep_runnable_arches(seccomp: &mut oci_spec::runtime::LinuxSeccomp, ia32: bool) {
    use oci_spec::runtime::Arch;
    let Some(arches) = seccomp.architectures().clone() else {
        return;
    };
    let runnable: Vec<Arch> = arches
        .iter()
        .copied()
        .filter(|a| match a {
            Arch::ScmpArchX86_64 => cfg!(target_arch = "x86_64"),
            Arch::ScmpArchX86 => cfg!(target_arch = "x86_64") && ia32,
            _ => false,
        })
        .collect();
    if !runnable.is_empty() {
        seccomp.set_architectures(Some(runnable));
    }
}

/// The directory of cgroup `path` (as a spec or the container tier names
/// it) in the guest's cgroup2 mount.
fn cgroup_dir(path: &Path) -> PathBuf {
    Path::new("/sys/fs/cgroup").join(path.strip_prefix("/").unwrap_or(path))
}

/// The OOM-kill count of the cgroup at `dir`; 0 if it cannot be read.
pub(super) fn oom_kills(dir: &Path) -> u64 {
    let events = std::fs::read_to_string(dir.join("memory.events")).unwrap_or_default();
    crate::events::oom_kill_count(&events).unwrap_or(0)
}

/// Where the agent writes the bundles of a pod's member containers.
pub(super) const MEMBER_BUNDLES: &str = "/run/agentvm/members";

/// The container tier's id, in the guest, of the member whose init is
/// stream `id`.
fn member_id(id: u32) -> String {
    format!("member-{id}")
}

/// A member's spec as the guest runs it: the namespaces `join` names are
/// the sandbox container's (its init `sandbox_pid`; the network is the
/// pod's, `netns`, when the host configured one); the host cleared every
/// namespace path, and the cgroup path it chose is the member's own.
pub fn member_spec(
    mut spec: Spec,
    join: &[PodNamespace],
    sandbox_pid: i32,
    netns: Option<&Path>,
) -> Spec {
    use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut nss = linux.namespaces().clone().unwrap_or_default();
    for kind in join {
        let (typ, name) = match kind {
            PodNamespace::Network => (LinuxNamespaceType::Network, "net"),
            PodNamespace::Ipc => (LinuxNamespaceType::Ipc, "ipc"),
            PodNamespace::Uts => (LinuxNamespaceType::Uts, "uts"),
            PodNamespace::Pid => (LinuxNamespaceType::Pid, "pid"),
        };
        let path = match (kind, netns) {
            (PodNamespace::Network, Some(ns)) => ns.to_path_buf(),
            _ => PathBuf::from(format!("/proc/{sandbox_pid}/ns/{name}")),
        };
        match nss.iter_mut().find(|n| n.typ() == typ) {
            Some(ns) => {
                ns.set_path(Some(path));
            }
            None => {
                let mut ns = LinuxNamespace::default();
                ns.set_typ(typ);
                ns.set_path(Some(path));
                nss.push(ns);
            }
        }
    }
    linux.set_namespaces(Some(nss));
    spec.set_linux(Some(linux));
    spec
}

/// What `ps` shows of a process, from /proc; `None` once it is gone.
fn describe_process(pid: i32) -> Option<GuestProcess> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cmd = if args.is_empty() {
        format!("[{comm}]")
    } else {
        args.join(" ")
    };
    Some(GuestProcess {
        pid,
        ppid,
        uid,
        cmd,
    })
}

/// A `/proc/meminfo` field in bytes.
pub fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// `usage_usec` of a cgroup v2 `cpu.stat`.
pub fn cpu_usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "usage_usec").then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seccomp_keeps_the_architectures_the_guest_kernel_runs() {
        use oci_spec::runtime::Arch::{ScmpArchAarch64, ScmpArchX32, ScmpArchX86, ScmpArchX86_64};
        let profile = |arches: Option<Vec<oci_spec::runtime::Arch>>| {
            let mut s = oci_spec::runtime::LinuxSeccomp::default();
            s.set_architectures(arches);
            s
        };
        let docker = Some(vec![ScmpArchX86_64, ScmpArchX86, ScmpArchX32]);
        let cases = [
            (docker.clone(), false, Some(vec![ScmpArchX86_64])),
            (docker, true, Some(vec![ScmpArchX86_64, ScmpArchX86])),
            // Nothing the guest runs: left as it is, not emptied (an empty
            // list would mean the native architecture).
            (
                Some(vec![ScmpArchAarch64]),
                false,
                Some(vec![ScmpArchAarch64]),
            ),
            (Some(vec![ScmpArchX86]), false, Some(vec![ScmpArchX86])),
            (None, false, None),
        ];
        for (given, ia32, want) in cases {
            let mut s = profile(given.clone());
            keep_runnable_arches(&mut s, ia32);
            assert_eq!(s.architectures(), &want, "{given:?} ia32={ia32}");
        }
    }

    #[test]
    fn cgroup_paths_without_meaning_in_the_guest_are_replaced() {
        let cases = [
            (None, GUEST_CGROUP),
            (Some("system.slice:docker:abc"), GUEST_CGROUP),
            (Some("relative/path"), GUEST_CGROUP),
            (Some("/docker/abc"), "/docker/abc"),
        ];
        for (path, want) in cases {
            let mut spec = Spec::default();
            let mut linux = spec.linux().clone().unwrap_or_default();
            linux.set_cgroups_path(path.map(Into::into));
            spec.set_linux(Some(linux));
            let out = guest_spec(spec, None);
            let got = out.linux().as_ref().and_then(|l| l.cgroups_path().clone());
            assert_eq!(got, Some(want.into()));
        }
        let mut spec = Spec::default();
        spec.set_linux(None);
        let got = guest_spec(spec, None)
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().clone());
        assert_eq!(got, Some(GUEST_CGROUP.into()));
    }

    #[test]
    fn a_member_joins_the_sandbox_s_namespaces() {
        use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};
        let mut spec = Spec::default();
        let mut linux = spec.linux().clone().unwrap_or_default();
        let ns = |t| {
            let mut n = LinuxNamespace::default();
            n.set_typ(t);
            n
        };
        linux.set_namespaces(Some(vec![
            ns(LinuxNamespaceType::Mount),
            ns(LinuxNamespaceType::Pid),
            ns(LinuxNamespaceType::Network),
        ]));
        spec.set_linux(Some(linux));
        let out = member_spec(
            spec,
            &[PodNamespace::Network, PodNamespace::Ipc],
            42,
            Some(Path::new("/run/agentvm/netns")),
        );
        let nss = out.linux().as_ref().unwrap().namespaces().clone().unwrap();
        let path = |t| {
            nss.iter()
                .find(|n| n.typ() == t)
                .map(|n| n.path().clone())
                .unwrap()
        };
        assert_eq!(path(LinuxNamespaceType::Mount), None);
        assert_eq!(path(LinuxNamespaceType::Pid), None);
        assert_eq!(
            path(LinuxNamespaceType::Network),
            Some("/run/agentvm/netns".into())
        );
        assert_eq!(
            path(LinuxNamespaceType::Ipc),
            Some("/proc/42/ns/ipc".into())
        );
    }

    #[test]
    fn meminfo_and_cpu_stat_parse() {
        let meminfo = "MemTotal:         499996 kB\nMemFree:          4000 kB\nMemAvailable:     400000 kB\nHugePages_Total:       0\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(499996 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable"), Some(400000 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
        assert_eq!(meminfo_bytes("MemTotal: x kB", "MemTotal"), None);
        let stat = "usage_usec 12345\nuser_usec 10000\nsystem_usec 2345\n";
        assert_eq!(cpu_usage_usec(stat), Some(12345));
        assert_eq!(cpu_usage_usec("user_usec 1\n"), None);
        assert_eq!(cpu_usage_usec("usage_usec nope\n"), None);
    }
}
