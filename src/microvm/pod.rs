//! A Kubernetes pod as one microVM (issue 11): the pod's sandbox (pause)
//! container boots the VM as any container does; every further container
//! of the pod (CRI's `io.kubernetes.cri.container-type=container`, its
//! sandbox named by `io.kubernetes.cri.sandbox-id`) runs inside that VM, in
//! its own mount, pid and cgroup namespaces in the guest, joining the
//! sandbox container's network, IPC, UTS (and, when asked, pid) namespaces
//! there.
//!
//! The member's host process is a **relay** (`agentvm supervise <member>`,
//! which comes here when the state says the container is a member): the pid
//! `create` writes to `--pid-file`, whose exit status is the member's. It
//! 1. clones the member's rootfs and bind-mount sources as detached mount
//!    trees (`open_tree`) in the host's mount namespace, where containerd
//!    mounted them;
//! 2. enters the sandbox supervisor's private mount namespace and attaches
//!    them (`move_mount`) below `share/pod/<member>/` of the sandbox's
//!    share. That share is a mount of its own with shared propagation,
//!    made before virtiofsd started (`stage::share`), and virtiofsd's
//!    sandbox is a slave of it: the new mounts reach the guest through the
//!    file server the VM already has (no hotplug);
//! 3. asks the sandbox's supervisor to create the container in the guest
//!    (`SupervisorRequest::CreateMember`); that connection then carries the
//!    member init's stdio, signals and exit, as an exec relay's does;
//! 4. when the member ends, detaches its mounts, records the exit and
//!    exits with the member's status (255 when the VM went away first).
//!
//! The other commands about a member go to the sandbox's supervisor as
//! `SupervisorRequest::Member` (see `super::ask`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use super::client::{self, SupervisorRequest};
use super::spec::{Staged, CRI_CONTAINER_TYPE};
use super::supervisor::{run_hooks_public as serve_hooks, tty::HostPty, Args};
use super::vmstate::{Status, VmState};
use crate::config::Isolation;
use crate::protocol::{PodNamespace, Reply, SHARE_POD_DIR};

/// CRI's annotation naming the pod's sandbox container.
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The member cannot join the pod's VM; the message says why.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Spec(#[from] super::spec::SpecError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error(transparent)]
    Stage(#[from] super::supervisor::stage::StageError),
    #[error("{what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn refused(msg: impl Into<String>) -> PodError {
    PodError::Refused(msg.into())
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> PodError {
    let what = what.into();
    move |source| PodError::Sys { what, source }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PodError {
    let what = what.into();
    move |source| PodError::Io { what, source }
}

/// The sandbox a spec names when it is a further container of a CRI pod,
/// `None` for any other container (a pod's sandbox included).
pub fn sandbox_of(spec: &Spec) -> Result<Option<String>, PodError> {
    if !super::spec::is_pod_member(spec) {
        return Ok(None);
    }
    match spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(CRI_SANDBOX_ID))
    {
        Some(id) if !id.is_empty() => Ok(Some(id.clone())),
        _ => Err(refused(format!(
            "{CRI_CONTAINER_TYPE}=container without {CRI_SANDBOX_ID}: the microvm tier runs a \
             pod's container in its sandbox's VM and must know which"
        ))),
    }
}

/// The microvm-tier container of `root` whose network namespace the spec
/// names by path: Docker's and Podman's `--network container:X` give
/// `/proc/<X's pid>/ns/net`, and X's pid is its supervisor's; any other
/// path to the namespace X's supervisor is in (a named one, say) names it
/// too. Such a container runs in X's VM, as a pod's member runs in its
/// sandbox's (joining there the other namespaces the spec
/// names of X's, `--pid container:X` and `--ipc container:X`): a VM of its
/// own would take X's address a second time and not see X's `localhost`.
/// Only the network decides: with a network of its own (`--pid
/// container:X` alone) a container needs a VM of its own for it. `None`
/// when no path names one (a member of a pod is never taken: its VM is
/// its sandbox's).
pub fn joined_container(root: &Path, spec: &Spec) -> Option<String> {
    // Each path, and whether it is the host's namespace (where no VM's
    // supervisor lives, so the inode says nothing there).
    let host = Path::new("/proc/self/ns/net");
    let paths: Vec<(&Path, bool)> = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .into_iter()
        .flatten()
        .filter(|ns| ns.typ() == LinuxNamespaceType::Network)
        .filter_map(|ns| ns.path().as_deref())
        .map(|p| (p, same_namespace(p, host)))
        .collect();
    if paths.is_empty() {
        return None;
    }
    let names = |&(path, is_host): &(&Path, bool), pid: i32| {
        process_of(path) == Some(pid)
            || (!is_host
                && same_namespace(
                    path,
                    &Path::new("/proc").join(pid.to_string()).join("ns/net"),
                ))
    };
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if crate::bundle::validate_id(&id).is_err() {
            continue;
        }
        match crate::state::Record::load(root, &id) {
            Ok(Some(r)) if r.isolation == Isolation::Microvm => {}
            _ => continue,
        }
        let Ok(state) = VmState::load(&entry.path()) else {
            continue;
        };
        if state.pod_sandbox.is_none()
            && state
                .supervisor_pid
                .is_some_and(|pid| paths.iter().any(|p| names(p, pid)) && state.supervisor_alive())
        {
            return Some(id);
        }
    }
    None
}

/// The pid of a namespace path of the form `/proc/<pid>/ns/<type>`.
fn process_of(path: &Path) -> Option<i32> {
    let rest = path.strip_prefix("/proc").ok()?;
    let mut parts = rest.components();
    let pid = parts
        .next()?
        .as_os_str()
        .to_str()?
        .parse()
        .ok()
        .filter(|p: &i32| *p > 0)?;
    let ns = parts.next()?;
    (ns.as_os_str() == "ns" && parts.next().is_some() && parts.next().is_none()).then_some(pid)
}

/// The sandbox's state, checked: a microvm-tier container of this
/// `--root`, not itself a member, whose VM runs (created or running, not
/// paused).
pub fn sandbox_state(root: &Path, member: &str, sandbox: &str) -> Result<VmState, PodError> {
    crate::bundle::validate_id(sandbox)
        .map_err(|e| refused(format!("{CRI_SANDBOX_ID} {sandbox:?}: {e}")))?;
    if sandbox == member {
        return Err(refused(format!(
            "container {member} names itself as its pod's sandbox"
        )));
    }
    let missing = || {
        refused(format!(
            "pod sandbox {sandbox} does not exist in {}: a pod's containers run in its \
             sandbox's microVM",
            root.display()
        ))
    };
    let record = crate::state::Record::load(root, sandbox)?.ok_or_else(missing)?;
    if record.isolation != Isolation::Microvm {
        return Err(refused(format!(
            "pod sandbox {sandbox} runs in the {} tier: a pod's containers run in their \
             sandbox's tier (set io.agentvm.isolation on the pod)",
            record.isolation
        )));
    }
    let state = VmState::load(&root.join(sandbox))?;
    if state.pod_sandbox.is_some() {
        return Err(refused(format!(
            "{sandbox} is a member of a pod, not a pod's sandbox"
        )));
    }
    let status = state.effective_status();
    if !matches!(status, Status::Created | Status::Running) || !state.supervisor_alive() {
        return Err(refused(format!(
            "pod sandbox {sandbox} is not running: its microVM is gone"
        )));
    }
    if state.paused {
        return Err(refused(format!("pod sandbox {sandbox} is paused")));
    }
    Ok(state)
}

/// What a member runs as in the pod's VM.
#[derive(Debug)]
pub struct MemberPlan {
    /// The spec for the guest: paths below the member's share directory,
    /// no namespace paths, its own cgroup in the guest.
    pub spec: Spec,
    /// What to attach below `share/pod/<member>/`.
    pub staged: Vec<Staged>,
    /// The sandbox container's namespaces it joins.
    pub join: Vec<PodNamespace>,
    pub warnings: Vec<String>,
}

/// The member's directory in the share, relative to the share's root.
pub fn share_dir(member: &str) -> String {
    format!("{SHARE_POD_DIR}/{member}")
}

/// The member's cgroup in the guest: a sibling of the sandbox's, so each
/// has its own limits (cgroup v2 keeps processes out of inner nodes).
pub fn guest_cgroup(member: &str) -> PathBuf {
    PathBuf::from(format!("/{SHARE_POD_DIR}/{member}"))
}

/// Plans member `id` of the pod whose sandbox is `sandbox`. A namespace the
/// spec names by path must be one of the sandbox's (CRI names the pause
/// process's, `/proc/<pid>/ns/<type>`, and the pause process of a pod VM is
/// its supervisor): the guest joins the sandbox container's instead.
pub fn plan(
    spec: &Spec,
    bundle: &Path,
    rootfs: &Path,
    config: &crate::config::Config,
    id: &str,
    sandbox: &VmState,
) -> Result<MemberPlan, PodError> {
    let pause = sandbox
        .supervisor_pid
        .ok_or_else(|| refused(format!("pod sandbox {} has no supervisor", sandbox.id)))?;
    let mut spec = spec.clone();
    let mut join = Vec::new();
    if let Some(mut linux) = spec.linux().clone() {
        if let Some(nss) = linux.namespaces().clone() {
            let mut out = Vec::with_capacity(nss.len());
            for mut ns in nss {
                if let Some(path) = ns.path().clone() {
                    let (kind, name) = match ns.typ() {
                        LinuxNamespaceType::Network => (PodNamespace::Network, "net"),
                        LinuxNamespaceType::Ipc => (PodNamespace::Ipc, "ipc"),
                        LinuxNamespaceType::Uts => (PodNamespace::Uts, "uts"),
                        LinuxNamespaceType::Pid => (PodNamespace::Pid, "pid"),
                        other => {
                            return Err(refused(format!(
                                "namespace {} at {}: a pod's container in the microvm tier \
                                 can join only its sandbox's network, IPC, UTS and pid \
                                 namespaces",
                                format!("{other:?}").to_lowercase(),
                                path.display()
                            )))
                        }
                    };
                    let theirs = Path::new("/proc")
                        .join(pause.to_string())
                        .join("ns")
                        .join(name);
                    if !same_namespace(&path, &theirs) {
                        return Err(refused(format!(
                            "namespace {name} at {}: not the namespace of pod sandbox {}, \
                             whose microVM this container runs in",
                            path.display(),
                            sandbox.id
                        )));
                    }
                    join.push(kind);
                    ns.set_path(None);
                }
                out.push(ns);
            }
            linux.set_namespaces(Some(out));
        }
        spec.set_linux(Some(linux));
    }
    let dir = share_dir(id);
    let p = super::spec::plan_in(&spec, bundle, rootfs, config, &dir)?;
    let mut spec = p.spec;
    if let Some(mut linux) = spec.linux().clone() {
        linux.set_cgroups_path(Some(guest_cgroup(id)));
        spec.set_linux(Some(linux));
    }
    let mut warnings = p.warnings;
    if let Some(limit) = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.limit())
        .filter(|l| *l > 0)
    {
        let room = sandbox
            .memory_mib
            .saturating_sub(super::spec::MEMORY_OVERHEAD_MIB);
        if (limit as u64).div_ceil(1 << 20) > room {
            warnings.push(format!(
                "memory limit {} MiB is more than the pod's microVM has ({room} MiB): the \
                 VM's RAM, sized by the sandbox, bounds it",
                (limit as u64).div_ceil(1 << 20)
            ));
        }
    }
    Ok(MemberPlan {
        spec,
        staged: p.staged,
        join,
        warnings,
    })
}

/// Whether two paths name the same namespace (device and inode).
fn same_namespace(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// A detached copy of a host mount tree, to be attached in another mount
/// namespace.
pub struct Tree {
    fd: OwnedFd,
    is_dir: bool,
    staged: Staged,
}

/// Clones each staged source as a detached mount tree, in the caller's
/// (the host's) mount namespace.
pub fn clone_trees(staged: &[Staged]) -> Result<Vec<Tree>, PodError> {
    staged
        .iter()
        .map(|s| {
            let meta = std::fs::metadata(&s.source)
                .map_err(io(format!("bind mount source {}", s.source.display())))?;
            let path = std::ffi::CString::new(s.source.as_os_str().as_bytes())
                .map_err(|_| refused(format!("{}: a path with a NUL", s.source.display())))?;
            // SAFETY: open_tree with a NUL-terminated path that outlives
            // the call; it returns a new descriptor or -1.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
                        | libc::AT_RECURSIVE as libc::c_uint,
                )
            };
            if fd < 0 {
                return Err(sys(format!("clone the mount of {}", s.source.display()))(
                    nix::errno::Errno::last(),
                ));
            }
            // SAFETY: open_tree returned a new descriptor that nothing else
            // owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            Ok(Tree {
                fd,
                is_dir: meta.is_dir(),
                staged: s.clone(),
            })
        })
        .collect()
}

/// Enters the mount namespace of the sandbox's supervisor (pid `pid`,
/// which must still be the supervisor recorded in `sandbox`). The caller
/// must be single-threaded.
pub fn enter_sandbox_mounts(sandbox: &VmState) -> Result<(), PodError> {
    let pid = sandbox
        .supervisor_pid
        .ok_or_else(|| refused(format!("pod sandbox {} has no supervisor", sandbox.id)))?;
    let path = format!("/proc/{pid}/ns/mnt");
    let ns = std::fs::File::open(&path).map_err(io(format!("open {path}")))?;
    // The namespace is held open: the supervisor must still be the one
    // recorded (not a reused pid).
    if !sandbox.supervisor_alive() {
        return Err(refused(format!(
            "pod sandbox {} is not running: its microVM is gone",
            sandbox.id
        )));
    }
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNS).map_err(sys(format!(
        "enter the mount namespace of pod sandbox {}",
        sandbox.id
    )))
}

/// Attaches the trees below `share` (in the sandbox's mount namespace,
/// entered already); read-only entries are made read-only. On failure what
/// was attached is detached again.
pub fn attach(share: &Path, trees: Vec<Tree>) -> Result<(), PodError> {
    let mut done: Vec<PathBuf> = Vec::new();
    for tree in trees {
        let target = share.join(&tree.staged.name);
        let result = attach_one(&target, &tree);
        if let Err(e) = result {
            for t in done.iter().rev() {
                let _ = umount2(t, MntFlags::MNT_DETACH);
            }
            return Err(e);
        }
        done.push(target);
    }
    Ok(())
}

fn attach_one(target: &Path, tree: &Tree) -> Result<(), PodError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
    }
    let made = if tree.is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::File::create(target).map(|_| ())
    };
    made.map_err(io(format!("create {}", target.display())))?;
    let to = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| refused(format!("{}: a path with a NUL", target.display())))?;
    let empty = c"";
    // SAFETY: move_mount of a detached tree we own onto a NUL-terminated
    // path; both strings outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(sys(format!(
            "attach {} at {}",
            tree.staged.source.display(),
            target.display()
        ))(nix::errno::Errno::last()));
    }
    if tree.staged.readonly {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(sys(format!("remount {} read-only", target.display())))?;
    }
    Ok(())
}

/// Detaches what was attached for member `id` below `share` and removes
/// its directory (in the sandbox's mount namespace, entered already).
pub fn detach(share: &Path, id: &str) {
    let dir = share.join(share_dir(id));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if let Err(e) = umount2(&path, MntFlags::MNT_DETACH) {
            if e != nix::errno::Errno::EINVAL {
                tracing::warn!("container {id}: cannot detach {}: {e}", path.display());
            }
        }
        let _ = std::fs::remove_dir(&path).or_else(|_| std::fs::remove_file(&path));
    }
    let _ = std::fs::remove_dir(&dir);
}

/// Status of a member whose VM (or its supervisor) went away before the
/// member's init ended, as for the VM's own container.
const LOST_STATUS: i32 = super::supervisor::VM_LOST_STATUS;

/// `agentvm supervise <id>` for a pod member: the relay. `ready` gets the
/// outcome of creating the member (create waits for it); the relay then
/// returns the member's exit status when its init ends.
pub fn relay(args: &Args, ready: &mut dyn FnMut(Result<(), String>)) -> i32 {
    let mut state = match VmState::load(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            ready(Err(e.to_string()));
            return 1;
        }
    };
    let prepared = match prepare(args, &mut state) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("container {}: {e}", state.id);
            ready(Err(e.to_string()));
            return 1;
        }
    };
    ready(Ok(()));
    let Prepared { conn, io, share } = prepared;
    let outcome = super::exec::relay(conn, &io);
    detach(&share, &state.id);
    let status = match outcome {
        Ok(status) => status,
        Err(e) => {
            tracing::warn!("container {}: {e}", state.id);
            LOST_STATUS
        }
    };
    // Its end, for `state` and `events`; the CLI may be writing "running"
    // after a start: the last word is the relay's.
    if let Ok(mut s) = VmState::load(&args.dir) {
        s.status = Status::Stopped;
        s.exit_status = Some(status);
        let _ = s.save(&args.dir);
    }
    status
}

/// A member created in the guest: the connection that carries its stdio.
struct Prepared {
    conn: std::os::unix::net::UnixStream,
    io: super::exec::Io,
    /// The sandbox's share, in whose mount namespace the relay now is.
    share: PathBuf,
}

fn prepare(args: &Args, state: &mut VmState) -> Result<Prepared, PodError> {
    let id = state.id.clone();
    let root = args
        .dir
        .parent()
        .ok_or_else(|| refused(format!("{} has no parent", args.dir.display())))?
        .to_path_buf();
    let sandbox_id = state
        .pod_sandbox
        .clone()
        .ok_or_else(|| refused(format!("container {id} is not a pod member")))?;
    let sandbox = sandbox_state(&root, &id, &sandbox_id)?;
    let spec = state.spec().map_err(|e| refused(e.to_string()))?;
    let plan = plan(
        &spec,
        &state.bundle,
        &state.rootfs,
        &args.config,
        &id,
        &sandbox,
    )?;
    for w in &plan.warnings {
        tracing::warn!("container {id}: {w}");
    }
    if plan.staged.first().is_some_and(|s| s.readonly) {
        super::supervisor::stage::mount_points(&spec, &state.bundle, &state.rootfs)?;
    }
    let terminal = spec
        .process()
        .as_ref()
        .and_then(|p| p.terminal())
        .unwrap_or(false);
    // The console socket is a path of the host's mount namespace.
    let io = match (&args.console_socket, terminal) {
        (Some(sock), true) => {
            super::exec::Io::Pty(HostPty::open_and_send(sock).map_err(|e| refused(e.to_string()))?)
        }
        (None, true) => {
            return Err(refused(
                "process.terminal is true but no --console-socket was given",
            ))
        }
        _ => super::exec::Io::Inherited { raw_tty: None },
    };
    state.supervisor_pid = Some(std::process::id() as i32);
    state.supervisor_start_time = crate::state::process_start_time(std::process::id() as i32);
    state.save(&args.dir)?;
    serve_hooks(&spec, state, &["prestart", "createRuntime"]).map_err(PodError::Refused)?;
    let trees = clone_trees(&plan.staged)?;
    enter_sandbox_mounts(&sandbox)?;
    let share = root.join(&sandbox_id).join("share");
    attach(&share, trees)?;
    let start_hooks = client::StartHooks::of(&spec, state);
    let created = create_in_guest(&root, &sandbox_id, &id, &plan, start_hooks);
    let conn = match created {
        Ok(conn) => conn,
        Err(e) => {
            detach(&share, &id);
            return Err(e);
        }
    };
    if let Err(e) = serve_hooks(&spec, state, &["createContainer"]) {
        detach(&share, &id);
        return Err(PodError::Refused(e));
    }
    state.status = Status::Created;
    state.save(&args.dir)?;
    Ok(Prepared { conn, io, share })
}

/// Asks the sandbox's supervisor to create the member in the guest.
fn create_in_guest(
    root: &Path,
    sandbox: &str,
    id: &str,
    plan: &MemberPlan,
    start_hooks: Option<client::StartHooks>,
) -> Result<std::os::unix::net::UnixStream, PodError> {
    let request = SupervisorRequest::CreateMember {
        id: id.to_string(),
        spec: Box::new(plan.spec.clone()),
        join: plan.join.clone(),
        start_hooks,
    };
    let (conn, reply) = client::request(
        &root.join(sandbox),
        sandbox,
        &request,
        std::time::Duration::from_secs(60),
    )
    .map_err(|e| refused(e.to_string()))?;
    match reply {
        Reply::Created { .. } => Ok(conn),
        Reply::Error { message } => Err(PodError::Refused(message)),
        other => Err(refused(format!(
            "the pod's supervisor answered create with {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(annotations: &[(&str, &str)]) -> Spec {
        let mut s = Spec::default();
        s.set_annotations(Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ));
        s
    }

    #[test]
    fn a_member_names_its_sandbox() {
        assert_eq!(sandbox_of(&spec(&[])).unwrap(), None);
        assert_eq!(
            sandbox_of(&spec(&[(CRI_CONTAINER_TYPE, "sandbox")])).unwrap(),
            None
        );
        assert_eq!(
            sandbox_of(&spec(&[
                (CRI_CONTAINER_TYPE, "container"),
                (CRI_SANDBOX_ID, "pod1")
            ]))
            .unwrap(),
            Some("pod1".into())
        );
        let e = sandbox_of(&spec(&[(CRI_CONTAINER_TYPE, "container")])).unwrap_err();
        assert!(e.to_string().contains(CRI_SANDBOX_ID), "{e}");
    }

    #[test]
    fn a_namespace_path_names_a_process_only_in_docker_s_form() {
        assert_eq!(process_of(Path::new("/proc/123/ns/net")), Some(123));
        assert_eq!(process_of(Path::new("/proc/7/ns/pid")), Some(7));
        for other in [
            "/proc/self/ns/net",
            "/proc/123/ns",
            "/proc/123/ns/net/x",
            "/proc/123/fd/3",
            "/run/netns/x",
            "/proc/-1/ns/net",
            "proc/123/ns/net",
        ] {
            assert_eq!(process_of(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_container_joins_a_running_microvm_container_of_its_root() {
        let root = tempfile::tempdir().unwrap();
        let with_ns = |typ: LinuxNamespaceType, path: &str| {
            let mut s = Spec::default();
            let ns = oci_spec::runtime::LinuxNamespaceBuilder::default()
                .typ(typ)
                .path(path)
                .build()
                .unwrap();
            let mut linux = s.linux().clone().unwrap_or_default();
            linux.set_namespaces(Some(vec![ns]));
            s.set_linux(Some(linux));
            s
        };
        let with_net = |path: &str| with_ns(LinuxNamespaceType::Network, path);
        let me = std::process::id() as i32;
        let mine = format!("/proc/{me}/ns/net");
        assert_eq!(joined_container(root.path(), &with_net(&mine)), None);
        // A microvm container whose supervisor is this process.
        let dir = root.path().join("x");
        std::fs::create_dir(&dir).unwrap();
        crate::state::Record {
            isolation: Isolation::Microvm,
            init_start_time: None,
        }
        .save(root.path(), "x")
        .unwrap();
        let mut state: VmState = serde_json::from_value(serde_json::json!({
            "id": "x", "bundle": "/b", "rootfs": "/b/rootfs", "status": "running",
            "created": "2026-12-07T00:00:00Z", "cgroup_path": "/x", "accel": "tcg",
        }))
        .unwrap();
        state.supervisor_pid = Some(me);
        state.supervisor_start_time = crate::state::process_start_time(me);
        state.save(&dir).unwrap();
        assert_eq!(
            joined_container(root.path(), &with_net(&mine)),
            Some("x".into())
        );
        assert_eq!(
            joined_container(root.path(), &with_net("/proc/1/ns/net")),
            None
        );
        assert_eq!(joined_container(root.path(), &Spec::default()), None);
        // A member of a pod is never joined: its VM is its sandbox's.
        state.pod_sandbox = Some("pod".into());
        state.save(&dir).unwrap();
        assert_eq!(joined_container(root.path(), &with_net(&mine)), None);
        // Nor a container of the container tier.
        state.pod_sandbox = None;
        state.save(&dir).unwrap();
        crate::state::Record {
            isolation: Isolation::Container,
            init_start_time: None,
        }
        .save(root.path(), "x")
        .unwrap();
        assert_eq!(joined_container(root.path(), &with_net(&mine)), None);
    }

    #[test]
    fn the_member_s_share_directory_and_cgroup() {
        assert_eq!(share_dir("abc"), "pod/abc");
        assert_eq!(guest_cgroup("abc"), PathBuf::from("/pod/abc"));
    }
}
