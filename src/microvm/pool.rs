//! A warm pool of booted microVMs (`microvm.pool = N` in the config), as
//! Kata's VM cache keeps VMs booted ahead of their containers.
//!
//! Each VM of the pool has a **keeper** (`agentvm pool-keeper SLOT`), a
//! process of its own in `<root>/.~pool/SLOT/` that boots it the way the
//! supervisor boots a container's (the same kernel, command line, guest
//! agent, jailed QEMU and virtiofsd), with the size a container without
//! limits gets, no NIC, in an empty network namespace of its own, up to the
//! agent's Hello. Then it waits.
//!
//! A container's supervisor whose VM would be that VM (the same key: the
//! agentvm binary, kernel, guest agent, command line, vCPUs and RAM) and
//! that has no NIC to give it claims a slot instead of booting: it renames
//! the slot's `ready` to `claimed` (one claimer wins), takes the guest's
//! control connection and pidfds of QEMU and virtiofsd from the keeper over
//! its socket, attaches the container's rootfs and bind mounts below the
//! VM's share in the keeper's mount namespace (whose share virtiofsd's
//! sandbox is a slave of, as a pod member's are, `super::pod`), moves the
//! slot's files into the container's state directory and the keeper and
//! its VM into the container's cgroup, and sends the container's spec. The
//! container's pid stays the supervisor `create` started, a child of
//! `create`'s caller as always; the keeper stays the parent of QEMU and
//! virtiofsd (they die with it), and ends them when the supervisor ends.
//!
//! A container that does not fit (a limit, a NIC, another kernel) boots as
//! before. `create` refills the pool after it (`agentvm pool fill`, in the
//! background); `agentvm pool fill --wait` fills it and waits, `agentvm
//! pool drain` ends the VMs waiting.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::host::Host;
use super::vmm::{Exited, Vm, VmConfig};
use crate::config::Config;
use crate::protocol::GuestBoot;

/// The pool's directory in the root: a name no container id can have
/// (`~`), hidden from `list` (`.`).
pub const POOL_DIR: &str = ".~pool";
/// Who keeps a slot, written by `pool fill` when it starts the keeper.
const KEEPER_JSON: &str = "keeper.json";
/// Made by the keeper once its VM's agent said Hello.
const READY: &str = "ready";
/// `ready`, renamed by the supervisor that took the VM.
const CLAIMED: &str = "claimed";
/// Where the keeper waits for its VM's supervisor.
const KEEPER_SOCKET: &str = "keeper.sock";
/// The keeper's log.
const KEEPER_LOG: &str = "keeper.log";
/// The fd on which `pool fill --wait` hears whether a keeper's VM booted.
const SYNC_FD: RawFd = 3;
/// The nice value a keeper, its VM and its file server boot and wait at:
/// a refill, started by the `create` that took a pooled VM, boots while
/// that container starts and runs, and must not take the CPU from it (or
/// from any container). The supervisor that claims the VM gives its
/// threads the supervisor's own nice value back ([`set_nice`]).
pub const KEEPER_NICE: i32 = 19;
/// NICs a pooled VM boots with: its tap moves into the container's network
/// namespace when the container takes it (a container with none leaves it
/// unused, outside its own namespace in the guest).
pub const NICS: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("pool: {0}")]
    Refused(String),
    #[error(transparent)]
    Host(#[from] super::host::HostError),
    #[error(transparent)]
    VmmChoice(#[from] super::vmm::choice::ChoiceError),
    #[error(transparent)]
    Pod(#[from] super::pod::PodError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PoolError {
    let what = what.into();
    move |source| PoolError::Io { what, source }
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> PoolError {
    let what = what.into();
    move |source| PoolError::Sys { what, source }
}

/// What makes a pooled VM the VM a container would have booted. Equal
/// keys, same VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The agentvm binary (path, device, inode, mtime): the keeper's and
    /// the guest agent's code.
    pub agentvm: String,
    /// The kernel (path, size, mtime).
    pub kernel: String,
    pub guest_agent: Option<PathBuf>,
    pub cmdline: String,
    pub accel: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The VM has a balloon (`memory_ceiling_mib`): the guest's share of
    /// its RAM is set when a container takes it.
    pub balloon: bool,
}

fn file_identity(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{} dev={} ino={} size={} mtime={}.{}",
            path.display(),
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(e) => format!("{}: {e}", path.display()),
    }
}

impl Key {
    pub fn new(host: &Host, cmdline: &str, vcpus: u32, memory_mib: u64, balloon: bool) -> Key {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        Key {
            agentvm: file_identity(&exe),
            kernel: file_identity(&host.kernel),
            guest_agent: host.guest_agent.clone(),
            cmdline: cmdline.to_string(),
            accel: host.accel.as_str().to_string(),
            vcpus,
            memory_mib,
            balloon,
        }
    }
}

/// `keeper.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Keeper {
    pid: i32,
    start_time: Option<u64>,
    key: Key,
}

impl Keeper {
    fn load(slot: &Path) -> Option<Keeper> {
        let text = std::fs::read(slot.join(KEEPER_JSON)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn alive(&self) -> bool {
        self.start_time.is_some() && crate::state::process_start_time(self.pid) == self.start_time
    }

    /// Ends the keeper and its VM (QEMU, virtiofsd), if it is still the
    /// process recorded, and waits a moment until they are gone.
    fn kill(&self) {
        let Some(fd) = pidfd_open(self.pid) else {
            return;
        };
        if !self.alive() {
            return;
        }
        let mut all: Vec<OwnedFd> = descendants(self.pid)
            .into_iter()
            .skip(1)
            .filter_map(pidfd_open)
            .collect();
        all.push(fd);
        for fd in &all {
            let _ = pidfd_kill(fd.as_fd());
        }
        for fd in &all {
            pidfd_ended(fd.as_fd(), Duration::from_secs(5));
        }
    }
}

/// The pool's directory for `root`.
pub fn dir(root: &Path) -> PathBuf {
    root.join(POOL_DIR)
}

/// The command line every container's VM boots with (the supervisor's, and
/// the pool's).
pub fn guest_cmdline(host: &Host) -> String {
    let mut cmdline = format!(
        "{} {}",
        super::host::kernel_cmdline(host.accel),
        super::host::share_root()
    );
    let guest_log = std::env::var("AGENTVM_GUEST_LOG").ok();
    if let Some(param) = super::host::guest_log_param(guest_log.as_deref()) {
        cmdline.push(' ');
        cmdline.push_str(&param);
    }
    cmdline
}

/// The key of the VMs the pool boots with `config` on this host, or `None`
/// when the pool is off or its VMs would not be QEMU's (the builtin VMM
/// keeps no pool).
fn pool_key(config: &Config) -> Result<Option<(Host, Key)>, PoolError> {
    if config.microvm.pool_size() == 0 {
        return Ok(None);
    }
    let vmm = super::vmm::choice::for_container(config.microvm.vmm, None)?;
    if vmm.backend != super::vmm::choice::BackendKind::Qemu {
        tracing::debug!("pool: no pool with the {} VMM", vmm.backend.as_str());
        return Ok(None);
    }
    let host = Host::probe(config, vmm.backend)?;
    let size = super::spec::default_size(config);
    let key = Key::new(
        &host,
        &guest_cmdline(&host),
        size.vcpus,
        size.vm_mib,
        size.guest_mib.is_some(),
    );
    Ok(Some((host, key)))
}

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Its keeper is alive; `ready` tells whether its VM waits.
    Alive { ready: bool, claimed: bool },
    /// Its keeper is gone or was never recorded.
    Dead,
}

fn slot_state(slot: &Path, keeper: Option<&Keeper>) -> SlotState {
    match keeper {
        Some(k) if k.alive() => SlotState::Alive {
            ready: slot.join(READY).exists(),
            claimed: slot.join(CLAIMED).exists(),
        },
        _ => SlotState::Dead,
    }
}

fn slots(pool: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pool) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Removes a slot's directory (its mounts live in its keeper's namespace
/// only, which is gone or going).
fn remove_slot(slot: &Path) {
    let _ = std::fs::remove_dir_all(slot);
}

/// The keeper's own end of a slot: its mounts there (the share, QEMU's
/// jail) are detached first, or the directories would be busy in its
/// namespace.
fn keeper_removes_slot(slot: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut under: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(slot) && p != slot)
        .collect();
    // Deepest first.
    under.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in under {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
    remove_slot(slot);
}

/// How `fill` went.
#[derive(Debug, Default)]
pub struct Filled {
    /// VMs booting or waiting before, with this key.
    pub kept: usize,
    /// Keepers started.
    pub started: usize,
    /// Of those, the ones whose VM failed to boot (with `wait`), and why.
    pub failed: Vec<String>,
    /// Keepers of another key (an older binary or kernel) ended.
    pub stale: usize,
}

/// Starts keepers until the pool of `root` holds `microvm.pool` VMs of the
/// current key (ending those of another), and with `wait` waits until each
/// has booted. `config_path` is passed on to the keepers.
pub fn fill(
    root: &Path,
    config: &Config,
    config_path: Option<&Path>,
    wait: bool,
) -> Result<Filled, PoolError> {
    let mut filled = Filled::default();
    let Some((_, key)) = pool_key(config)? else {
        return Ok(filled);
    };
    let pool = dir(root);
    std::fs::create_dir_all(&pool).map_err(io(format!("create {}", pool.display())))?;
    let _lock = crate::state::DirLock::acquire(&pool, crate::state::LockMode::Exclusive)
        .map_err(io(format!("lock {}", pool.display())))?;
    for slot in slots(&pool) {
        let keeper = Keeper::load(&slot);
        match (slot_state(&slot, keeper.as_ref()), keeper) {
            (SlotState::Alive { claimed: true, .. }, _) => {}
            (SlotState::Alive { .. }, Some(k)) if k.key == key => filled.kept += 1,
            (SlotState::Alive { .. }, Some(k)) => {
                k.kill();
                remove_slot(&slot);
                filled.stale += 1;
            }
            _ => remove_slot(&slot),
        }
    }
    let want = config.microvm.pool_size() as usize;
    let mut waiting = Vec::new();
    for _ in filled.kept..want {
        let (slot, pipe) = start_keeper(root, &pool, config_path, &key, wait)?;
        filled.started += 1;
        if let Some(pipe) = pipe {
            waiting.push((slot, pipe));
        }
    }
    drop(_lock);
    for (slot, mut pipe) in waiting {
        let mut answer = String::new();
        let _ = pipe.read_to_string(&mut answer);
        if answer.trim() != "ok" {
            let why = answer
                .strip_prefix("error ")
                .unwrap_or("the keeper died while booting its VM")
                .trim()
                .to_string();
            filled.failed.push(format!("{}: {why}", slot.display()));
        }
    }
    Ok(filled)
}

/// Starts one keeper in a new slot; returns the slot and, with `wait`, the
/// pipe that says how its boot went.
fn start_keeper(
    root: &Path,
    pool: &Path,
    config_path: Option<&Path>,
    key: &Key,
    wait: bool,
) -> Result<(PathBuf, Option<std::io::PipeReader>), PoolError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let name = format!("{}-{:x}", std::process::id(), now.as_nanos());
    let slot = pool.join(&name);
    std::fs::create_dir(&slot).map_err(io(format!("create {}", slot.display())))?;
    let exe = std::fs::read_link("/proc/self/exe").map_err(io("find the agentvm binary"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--root").arg(root);
    if let Some(cfg) = config_path {
        cmd.arg("--config").arg(cfg);
    }
    cmd.arg("--log")
        .arg(slot.join(KEEPER_LOG))
        .arg("pool-keeper")
        .arg(&name)
        .args(wait.then_some("--sync"))
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let pipe = if wait {
        let (read, write) = std::io::pipe().map_err(io("create a pipe"))?;
        let fd = write.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls:
        // setsid (the keeper leads its own session), setpriority and dup2.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                libc::setpriority(libc::PRIO_PROCESS, 0, KEEPER_NICE);
                if libc::dup2(fd, SYNC_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Some((read, write))
    } else {
        // SAFETY: setsid and setpriority are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                libc::setpriority(libc::PRIO_PROCESS, 0, KEEPER_NICE);
                Ok(())
            });
        }
        None
    };
    // Nothing of the caller's (a shim's pipes) stays open in the keeper.
    super::vmm::inherit_below(&mut cmd, if wait { SYNC_FD + 1 } else { SYNC_FD } as u32);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            remove_slot(&slot);
            return Err(io("start a pool keeper")(e));
        }
    };
    let pid = child.id() as i32;
    let keeper = Keeper {
        pid,
        start_time: crate::state::process_start_time(pid),
        key: key.clone(),
    };
    let text = serde_json::to_vec(&keeper).unwrap_or_default();
    let tmp = slot.join(format!("{KEEPER_JSON}.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, slot.join(KEEPER_JSON)))
        .map_err(io(format!("write {}", slot.join(KEEPER_JSON).display())))?;
    // The keeper is not waited for: it outlives this command.
    drop(child);
    Ok((slot, pipe.map(|(read, _write)| read)))
}

/// Ends every VM of the pool that no container took; returns how many.
pub fn drain(root: &Path) -> Result<usize, PoolError> {
    let pool = dir(root);
    if !pool.exists() {
        return Ok(0);
    }
    let _lock = crate::state::DirLock::acquire(&pool, crate::state::LockMode::Exclusive)
        .map_err(io(format!("lock {}", pool.display())))?;
    let mut ended = 0;
    for slot in slots(&pool) {
        let keeper = Keeper::load(&slot);
        match slot_state(&slot, keeper.as_ref()) {
            // Being taken by a container: its supervisor moves it out.
            SlotState::Alive { claimed: true, .. } => continue,
            SlotState::Alive { .. } => {
                if let Some(k) = &keeper {
                    k.kill();
                    ended += 1;
                }
            }
            SlotState::Dead => {}
        }
        remove_slot(&slot);
    }
    // Gone when nothing is left in it (a slot being taken stays).
    let _ = std::fs::remove_dir(&pool);
    Ok(ended)
}

/// One line per slot for `agentvm pool list`: its name, pid and state.
pub fn list(root: &Path) -> Vec<(String, i32, &'static str)> {
    let mut out: Vec<_> = slots(&dir(root))
        .into_iter()
        .map(|slot| {
            let keeper = Keeper::load(&slot);
            let state = match slot_state(&slot, keeper.as_ref()) {
                SlotState::Alive { claimed: true, .. } => "claimed",
                SlotState::Alive { ready: true, .. } => "ready",
                SlotState::Alive { .. } => "booting",
                SlotState::Dead => "dead",
            };
            let name = slot
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, keeper.map(|k| k.pid).unwrap_or(0), state)
        })
        .collect();
    out.sort();
    out
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_kill(fd: std::os::fd::BorrowedFd) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal(2) on a pidfd we hold, no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether the process behind `fd` has ended, within `wait`.
fn pidfd_ended(fd: std::os::fd::BorrowedFd, wait: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// What the keeper hands the supervisor, beside the descriptors (the
/// guest's control connection, then one pidfd per process).
#[derive(Debug, Serialize, Deserialize)]
struct Handover {
    milestones: Option<GuestBoot>,
    /// Name and pid of QEMU and virtiofsd, in the order of their pidfds.
    processes: Vec<(String, i32)>,
    /// The MACs the VM's NICs booted with.
    nic_macs: Vec<String>,
    /// The balloon's QMP connection follows the pidfds.
    #[serde(default)]
    balloon: bool,
}

/// A pooled VM taken by a container: QEMU and virtiofsd are the keeper's
/// children, watched and ended here through their pidfds.
pub struct AdoptedVm {
    processes: Vec<(&'static str, i32, OwnedFd)>,
    guest_ram: Option<Box<dyn super::vmm::GuestRam>>,
}

impl Vm for AdoptedVm {
    fn exited(&mut self) -> Option<Exited> {
        self.processes
            .iter()
            .find(|(_, _, fd)| pidfd_ended(fd.as_fd(), Duration::ZERO))
            .map(|(name, _, _)| Exited {
                part: name,
                how: "ended".to_string(),
            })
    }

    fn kill(&mut self) {
        for (_, _, fd) in &self.processes {
            let _ = pidfd_kill(fd.as_fd());
        }
        for (_, _, fd) in &self.processes {
            pidfd_ended(fd.as_fd(), Duration::from_secs(5));
        }
    }

    fn host_pids(&self) -> Vec<i32> {
        self.processes.iter().map(|(_, pid, _)| *pid).collect()
    }

    fn take_guest_ram(&mut self) -> Option<Box<dyn super::vmm::GuestRam>> {
        self.guest_ram.take()
    }
}

fn part_name(name: &str) -> &'static str {
    match name {
        "qemu" => "qemu",
        "virtiofsd" => "virtiofsd",
        _ => "vmm",
    }
}

/// A pooled VM taken by a container, before it is moved in.
pub struct Claim {
    slot: PathBuf,
    keeper: Keeper,
    pub vm: AdoptedVm,
    pub guest: UnixStream,
    pub milestones: Option<GuestBoot>,
    /// The MACs the VM's NICs booted with, in order.
    pub nic_macs: Vec<String>,
}

impl Claim {
    /// Gives the VM up: it and its keeper end, the slot goes.
    pub fn abandon(mut self) {
        self.vm.kill();
        self.keeper.kill();
        remove_slot(&self.slot);
    }
}

/// Takes a waiting VM of `key` from the pool of `root`, if there is one.
/// Anything that goes wrong is logged and the VM given up: the caller
/// boots one of its own.
pub fn claim(root: &Path, key: &Key) -> Option<Claim> {
    let pool = dir(root);
    for slot in slots(&pool) {
        let Some(keeper) = Keeper::load(&slot) else {
            continue;
        };
        if keeper.key != *key || !keeper.alive() {
            continue;
        }
        // One claimer wins the rename.
        if std::fs::rename(slot.join(READY), slot.join(CLAIMED)).is_err() {
            continue;
        }
        match take(&slot, &keeper) {
            Ok((vm, guest, handover)) => {
                return Some(Claim {
                    slot,
                    keeper,
                    vm,
                    guest,
                    milestones: handover.milestones,
                    nic_macs: handover.nic_macs,
                })
            }
            Err(e) => {
                tracing::warn!("pool: cannot take the VM of {}: {e}", slot.display());
                keeper.kill();
                remove_slot(&slot);
            }
        }
    }
    None
}

/// The adoption request, sent with the adopter's network namespace.
const ADOPT: &[u8] = b"adopt\n";
/// Most bytes of a handover's JSON.
const HANDOVER_MAX: usize = 4096;

/// Asks the keeper of `slot` for its VM; its taps come into the caller's
/// network namespace.
fn take(slot: &Path, keeper: &Keeper) -> Result<(AdoptedVm, UnixStream, Handover), PoolError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let conn = super::sock::connect(slot, KEEPER_SOCKET).map_err(io(format!(
        "connect {}",
        slot.join(KEEPER_SOCKET).display()
    )))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io("keeper socket"))?;
    // The keeper must be the one recorded: the socket's peer is.
    let cred = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(sys("read the keeper's credentials"))?;
    if cred.pid() != keeper.pid {
        return Err(PoolError::Refused(format!(
            "the keeper socket of {} is not its keeper's",
            slot.display()
        )));
    }
    let netns = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(io("open our network namespace"))?;
    let ask = [std::io::IoSlice::new(ADOPT)];
    let fds = [netns.as_raw_fd()];
    sendmsg::<()>(
        conn.as_raw_fd(),
        &ask,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(sys("ask the keeper"))?;
    let mut buf = vec![0u8; HANDOVER_MAX];
    let (len, fds) = crate::container::sys::recv_with_fds(conn.as_fd(), &mut buf)
        .map_err(sys("receive the VM from its keeper"))?;
    let handover: Handover = serde_json::from_slice(&buf[..len])
        .map_err(|e| PoolError::Refused(format!("the keeper's answer: {e}")))?;
    let want = 1 + handover.processes.len() + usize::from(handover.balloon);
    if fds.len() != want {
        return Err(PoolError::Refused(format!(
            "the keeper sent {} descriptors where {want} were due",
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().ok_or_else(|| PoolError::Refused("no fd".into()));
    let guest = UnixStream::from(next()?);
    let mut processes = Vec::new();
    for (name, pid) in &handover.processes {
        processes.push((part_name(name), *pid, next()?));
    }
    let guest_ram: Option<Box<dyn super::vmm::GuestRam>> = if handover.balloon {
        Some(Box::new(super::vmm::qmp::Qmp::resumed(UnixStream::from(
            next()?,
        ))))
    } else {
        None
    };
    Ok((
        AdoptedVm {
            processes,
            guest_ram,
        },
        guest,
        handover,
    ))
}

/// Moves a claimed VM into the container of state directory `dir`:
/// attaches `staged` below its share (in the keeper's mount namespace),
/// moves the slot's files into `dir` and the keeper with its VM into
/// the container's cgroup (`join_cgroup`). On failure the VM is given up.
pub fn move_in(
    claim: Claim,
    dir: &Path,
    staged: &[super::spec::Staged],
    join_cgroup: &mut dyn FnMut(i32) -> Result<(), String>,
) -> Result<(AdoptedVm, UnixStream, Option<GuestBoot>), PoolError> {
    match move_in_inner(&claim, dir, staged, join_cgroup) {
        Ok(()) => {
            let Claim {
                slot,
                vm,
                guest,
                milestones,
                ..
            } = claim;
            remove_slot(&slot);
            Ok((vm, guest, milestones))
        }
        Err(e) => {
            claim.abandon();
            Err(e)
        }
    }
}

fn move_in_inner(
    claim: &Claim,
    dir: &Path,
    staged: &[super::spec::Staged],
    join_cgroup: &mut dyn FnMut(i32) -> Result<(), String>,
) -> Result<(), PoolError> {
    // Cloned here, where the container's mounts are (the host's mounts as
    // of the supervisor's start), attached where the VM's file server is.
    let trees = super::pod::clone_trees(staged)?;
    let ours = std::fs::File::open("/proc/self/ns/mnt").map_err(io("open our mount namespace"))?;
    let theirs = std::fs::File::open(format!("/proc/{}/ns/mnt", claim.keeper.pid))
        .map_err(io("open the keeper's mount namespace"))?;
    if !claim.keeper.alive() {
        return Err(PoolError::Refused("the keeper is gone".into()));
    }
    nix::sched::setns(&theirs, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(sys("enter the keeper's mount namespace"))?;
    let attached = super::pod::attach(&claim.slot.join("share"), trees);
    nix::sched::setns(&ours, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(sys("return to our mount namespace"))?;
    attached?;
    // SAFETY: getpriority(2) of this thread; no memory is passed.
    let ours = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    // The keeper, QEMU, virtiofsd and its sandbox: charged and limited
    // with the container, killed with it by `delete`.
    for pid in descendants(claim.keeper.pid) {
        join_cgroup(pid)
            .map_err(|e| PoolError::Refused(format!("move pid {pid} into the cgroup: {e}")))?;
        // The VM is the container's now: it runs as the supervisor does,
        // not at the pool's background priority.
        set_nice(pid, ours)
            .map_err(|e| PoolError::Refused(format!("set the priority of pid {pid}: {e}")))?;
    }
    for entry in std::fs::read_dir(&claim.slot).map_err(io("read the slot"))? {
        let entry = entry.map_err(io("read the slot"))?;
        let name = entry.file_name();
        if [KEEPER_JSON, KEEPER_SOCKET, CLAIMED]
            .iter()
            .any(|n| name == std::ffi::OsStr::new(n))
        {
            continue;
        }
        std::fs::rename(entry.path(), dir.join(&name)).map_err(io(format!(
            "move {} into {}",
            entry.path().display(),
            dir.display()
        )))?;
    }
    Ok(())
}

/// Gives every thread of process `pid` the nice value `nice` (Linux keeps
/// it per thread: a process's threads took the value of the thread that
/// made them).
fn set_nice(pid: i32, nice: i32) -> std::io::Result<()> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        // SAFETY: setpriority(2) on a thread id; no memory is passed.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that ended meanwhile has no priority to set.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// `pid` and all its descendants.
fn descendants(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let children =
                    std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                all.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
        i += 1;
    }
    all
}

/// Entry point of `agentvm pool-keeper SLOT`: boots the slot's VM, waits
/// for a container to take it, then lives as its VM's parent. Never
/// returns.
pub fn keep(root: &Path, config: &Config, name: &str, synced: bool) -> ! {
    // `pool fill --wait` passes its pipe's write end as SYNC_FD (and says
    // so with --sync). It must not reach QEMU or virtiofsd, or the pipe
    // would never close.
    let mut sync = synced.then(|| {
        // SAFETY: fcntl on a descriptor number; no memory is passed.
        unsafe { libc::fcntl(SYNC_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: SYNC_FD is the pipe `pool fill` passed; nothing else in
        // this process uses that descriptor.
        std::fs::File::from(unsafe { OwnedFd::from_raw_fd(SYNC_FD) })
    });
    let slot = dir(root).join(name);
    let status = match boot(&slot, config, name) {
        Ok(idle) => {
            if let Some(mut s) = sync.take() {
                let _ = s.write_all(b"ok\n");
            }
            idle.serve(&slot)
        }
        Err(e) => {
            tracing::error!("pool keeper {name}: {e}");
            if let Some(mut s) = sync.take() {
                let _ = s.write_all(format!("error {e}\n").as_bytes());
            }
            keeper_removes_slot(&slot);
            1
        }
    };
    std::process::exit(status)
}

/// A booted VM waiting for its container.
struct Idle {
    vm: Box<dyn Vm>,
    guest: UnixStream,
    milestones: Option<GuestBoot>,
    nic_macs: Vec<String>,
    /// The balloon's control (QMP), with `memory_ceiling_mib`.
    guest_ram: Option<Box<dyn super::vmm::GuestRam>>,
    listener: UnixListener,
}

fn boot(slot: &Path, config: &Config, name: &str) -> Result<Idle, String> {
    use super::supervisor::stage;
    let Some((host, key)) = pool_key(config).map_err(|e| e.to_string())? else {
        return Err("the pool is off (microvm.pool) or the VMM is not qemu".into());
    };
    // An empty network of its own, where its NICs' taps wait (QEMU stays
    // in it: its taps move to the container's namespace by descriptor).
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare network namespace: {e}"))?;
    let nics = boot_nics(NICS).map_err(|e| e.to_string())?;
    let nic_macs = nics
        .iter()
        .map(|n| crate::netlink::format_mac(&n.mac))
        .collect();
    stage::private_mounts().map_err(|e| e.to_string())?;
    let share_dir = slot.join("share");
    stage::share(&share_dir, &[]).map_err(|e| e.to_string())?;
    stage::agent(&share_dir, host.guest_agent.as_deref()).map_err(|e| e.to_string())?;
    let listener = super::sock::bind(slot, super::supervisor::CONTROL_SOCKET)
        .map_err(|e| format!("cannot listen on the control socket: {e}"))?;
    let config_vm = VmConfig {
        name: format!("pool-{name}"),
        kernel: host.kernel.clone(),
        initramfs: None,
        cmdline: key.cmdline.clone(),
        vcpus: key.vcpus,
        memory_mib: key.memory_mib,
        balloon: key.balloon,
        share_dir,
        control_socket: super::supervisor::CONTROL_SOCKET.into(),
        console_log: slot.join(super::vmstate::CONSOLE_LOG),
        run_dir: slot.to_path_buf(),
        kvm: host.accel == super::host::Accel::Kvm,
        nics,
        vmm_user: super::vmm::jail::Identity::for_supervisor(
            config.microvm.vmm_uid_base(),
            std::process::id(),
        ),
    };
    let backend = super::vmm::for_host(&host);
    let mut vm = backend.launch(&config_vm).map_err(|e| e.to_string())?;
    // With a balloon the guest starts with what a container without a
    // limit gets, as a cold boot does; the container's supervisor sets its
    // own share when it takes the VM.
    let guest_ram = match (key.balloon, vm.take_guest_ram()) {
        (false, _) => None,
        (true, Some(mut control)) => {
            let mib = super::spec::default_size(config)
                .guest_mib
                .unwrap_or(key.memory_mib);
            if let Err(e) = control.set_guest_ram(mib) {
                vm.kill();
                return Err(e.to_string());
            }
            if control.handover_fd().is_none() {
                vm.kill();
                return Err("the VMM's balloon control cannot be handed over".into());
            }
            Some(control)
        }
        (true, None) => {
            vm.kill();
            return Err("the VM has no balloon control".into());
        }
    };
    let mut log = super::supervisor::guest_log::GuestLog::new(Instant::now());
    let (mut guest, milestones) = match super::supervisor::handshake(
        &listener,
        vm.as_mut(),
        config.microvm.boot_timeout(),
        &config_vm.console_log,
        &mut log,
        &[],
    ) {
        Ok(h) => h,
        Err(e) => {
            vm.kill();
            return Err(e.to_string());
        }
    };
    if let Err(e) = warm(&mut guest, name, config.microvm.boot_timeout(), &mut log) {
        vm.kill();
        return Err(e);
    }
    let keeper_listener = match super::sock::bind(slot, KEEPER_SOCKET) {
        Ok(l) => l,
        Err(e) => {
            vm.kill();
            return Err(format!("cannot listen on {KEEPER_SOCKET}: {e}"));
        }
    };
    if let Err(e) = std::fs::File::create(slot.join(READY)) {
        vm.kill();
        return Err(format!("cannot mark the slot ready: {e}"));
    }
    tracing::info!("pool keeper {name}: VM ready");
    Ok(Idle {
        vm,
        guest,
        milestones,
        nic_macs,
        guest_ram,
        listener: keeper_listener,
    })
}

/// Has the booted VM's agent run through a container's creation once
/// (`HostMessage::Warm`, `guest::warm`) before the slot is ready, so that
/// the container that takes the VM finds that code read and translated.
/// A warm-up the agent refuses or that fails leaves the VM as usable as
/// before (a warning); a channel that breaks or stays silent leaves it
/// unusable (an error).
fn warm(
    guest: &mut UnixStream,
    name: &str,
    timeout: Duration,
    log: &mut super::supervisor::guest_log::GuestLog,
) -> Result<(), String> {
    use crate::protocol::{Frame, HostMessage, Reply};
    let started = Instant::now();
    Frame::control(&HostMessage::Warm)
        .write_to(guest)
        .map_err(|e| format!("warm-up: control channel: {e}"))?;
    match super::supervisor::wait_reply(guest, timeout, log) {
        Ok(Reply::Ok) => {
            tracing::info!(
                "pool keeper {name}: warmed up in {} ms",
                started.elapsed().as_millis()
            );
            Ok(())
        }
        Ok(Reply::Error { message }) => {
            tracing::warn!("pool keeper {name}: {message}; the VM waits unwarmed");
            Ok(())
        }
        Ok(other) => Err(format!(
            "warm-up: unexpected reply from the guest: {other:?}"
        )),
        Err(e) => Err(format!("warm-up: {e}")),
    }
}

/// `count` NICs for a VM booted before its container's network is known:
/// taps `avtap0`… in this process's network namespace (down until the
/// router configures them), each with a random boot MAC that the guest
/// swaps for the container's (`Interface::boot_mac`).
pub fn boot_nics(count: usize) -> Result<Vec<crate::router::Nic>, crate::router::NetError> {
    (0..count)
        .map(|i| {
            let tap = crate::router::open_tap(&format!("{}{i}", crate::router::TAP_PREFIX))?;
            let mac = random_mac().map_err(|source| crate::router::NetError::Io {
                what: "make a MAC (/dev/urandom)".into(),
                source,
            })?;
            Ok(crate::router::Nic {
                tap: std::sync::Arc::new(tap),
                mac,
            })
        })
        .collect()
}

/// A locally administered unicast MAC, random.
fn random_mac() -> std::io::Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut mac)?;
    mac[0] = (mac[0] & 0xfc) | 0x02;
    Ok(mac)
}

impl Idle {
    /// Waits for the container's supervisor, hands the VM over, and lives
    /// until the VM or the supervisor ends; returns the exit status.
    fn serve(self, slot: &Path) -> i32 {
        let Idle {
            mut vm,
            guest,
            milestones,
            nic_macs,
            guest_ram,
            listener,
        } = self;
        let adopter = loop {
            if let Some(end) = vm.exited() {
                tracing::warn!("pool: the waiting VM's {} ended: {}", end.part, end.how);
                vm.kill();
                keeper_removes_slot(slot);
                return 1;
            }
            if !readable(&listener, Duration::from_millis(500)) {
                continue;
            }
            let Ok((mut conn, _)) = listener.accept() else {
                continue;
            };
            let handing = Handing {
                vm: vm.as_ref(),
                guest: &guest,
                milestones,
                nic_macs: &nic_macs,
                qmp: guest_ram.as_ref().and_then(|g| g.handover_fd()),
            };
            match hand_over(&mut conn, slot, &handing) {
                Ok(pidfd) => break pidfd,
                Err(e) => tracing::warn!("pool: refused a handover: {e}"),
            }
        };
        drop(guest);
        drop(guest_ram);
        drop(listener);
        // QEMU and virtiofsd are this process's children: it reaps them,
        // and ends them if their container's supervisor goes first.
        loop {
            if vm.exited().is_some() || pidfd_ended(adopter.as_fd(), Duration::from_millis(500)) {
                vm.kill();
                // Still there when the supervisor died before it moved the
                // VM in.
                keeper_removes_slot(slot);
                return 0;
            }
        }
    }
}

fn readable(listener: &UnixListener, wait: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// What the keeper hands over.
struct Handing<'a> {
    vm: &'a dyn Vm,
    guest: &'a UnixStream,
    milestones: Option<GuestBoot>,
    nic_macs: &'a [String],
    /// The balloon's QMP connection.
    qmp: Option<RawFd>,
}

/// Hands the VM to the process on `conn`: root, and the one that claimed
/// the slot. Its NICs' taps move into the network namespace it sends.
/// Returns a pidfd of it.
fn hand_over(conn: &mut UnixStream, slot: &Path, h: &Handing) -> Result<OwnedFd, PoolError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let cred = nix::sys::socket::getsockopt(&*conn, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(sys("read the peer's credentials"))?;
    if cred.uid() != 0 {
        return Err(PoolError::Refused(format!(
            "uid {} is not root",
            cred.uid()
        )));
    }
    if !slot.join(CLAIMED).exists() {
        return Err(PoolError::Refused("the slot was not claimed".into()));
    }
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io("keeper socket"))?;
    let mut ask = [0u8; 16];
    let (len, fds) = crate::container::sys::recv_with_fds(conn.as_fd(), &mut ask)
        .map_err(sys("read the request"))?;
    // The first descriptor is the namespace; any other is closed.
    let netns = fds.into_iter().next();
    if &ask[..len] != ADOPT {
        return Err(PoolError::Refused("not an adoption request".into()));
    }
    let netns = netns.ok_or_else(|| PoolError::Refused("no network namespace sent".into()))?;
    let adopter = pidfd_open(cred.pid())
        .ok_or_else(|| PoolError::Refused(format!("pid {} is gone", cred.pid())))?;
    move_taps(netns.as_fd())?;
    let mut processes = Vec::new();
    let mut pidfds = Vec::new();
    for (name, pid) in h.vm.host_processes() {
        let fd = pidfd_open(pid)
            .ok_or_else(|| PoolError::Refused(format!("the VM's {name} ({pid}) is gone")))?;
        processes.push((name.to_string(), pid));
        pidfds.push(fd);
    }
    let text = serde_json::to_vec(&Handover {
        milestones: h.milestones,
        processes,
        nic_macs: h.nic_macs.to_vec(),
        balloon: h.qmp.is_some(),
    })
    .map_err(|e| PoolError::Refused(e.to_string()))?;
    let mut fds: Vec<RawFd> = vec![h.guest.as_raw_fd()];
    fds.extend(pidfds.iter().map(|f| f.as_raw_fd()));
    fds.extend(h.qmp);
    let iov = [std::io::IoSlice::new(&text)];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(sys("send the VM"))?;
    Ok(adopter)
}

/// Moves the VM's taps (in the keeper's own network namespace) into
/// `netns`, keeping their names.
fn move_taps(netns: std::os::fd::BorrowedFd) -> Result<(), PoolError> {
    // It must be a network namespace, and not the keeper's own.
    let ns_type = nix::sys::stat::fstat(netns.as_raw_fd()).map_err(sys("stat the namespace"))?;
    let ours =
        nix::sys::stat::stat("/proc/thread-self/ns/net").map_err(sys("stat our namespace"))?;
    if (ns_type.st_dev, ns_type.st_ino) == (ours.st_dev, ours.st_ino) {
        return Err(PoolError::Refused(
            "the namespace sent is the keeper's".into(),
        ));
    }
    // SAFETY: ioctl NS_GET_NSTYPE on a descriptor we hold; no memory.
    let kind = unsafe { libc::ioctl(netns.as_raw_fd(), NS_GET_NSTYPE) };
    if kind != libc::CLONE_NEWNET {
        return Err(PoolError::Refused("not a network namespace".into()));
    }
    let mut nl =
        crate::netlink::Netlink::open().map_err(|e| PoolError::Refused(format!("netlink: {e}")))?;
    let links = nl
        .links()
        .map_err(|e| PoolError::Refused(format!("netlink: {e}")))?;
    for i in 0..NICS {
        let name = format!("{}{i}", crate::router::TAP_PREFIX);
        let link = links
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| PoolError::Refused(format!("tap {name} is gone")))?;
        nl.move_link(link.index, netns.as_raw_fd())
            .map_err(|e| PoolError::Refused(format!("move {name}: {e}")))?;
    }
    Ok(())
}

/// `NS_GET_NSTYPE` (linux/nsfs.h: _IO(0xb7, 0x3)).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nic_s_boot_mac_is_unicast_and_locally_administered() {
        for _ in 0..64 {
            let mac = random_mac().unwrap();
            assert_eq!(mac[0] & 0x01, 0, "multicast bit: {mac:?}");
            assert_eq!(mac[0] & 0x02, 0x02, "not locally administered: {mac:?}");
        }
    }

    fn key() -> Key {
        Key {
            agentvm: "a".into(),
            kernel: "k".into(),
            guest_agent: None,
            cmdline: "c".into(),
            accel: "tcg".into(),
            vcpus: 1,
            memory_mib: 512,
            balloon: false,
        }
    }

    #[test]
    fn a_slot_whose_keeper_is_gone_is_dead_and_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let pool = dir.path().join(POOL_DIR);
        let slot = pool.join("s");
        std::fs::create_dir_all(&slot).unwrap();
        // A pid that is not this keeper's (its start time differs).
        let keeper = Keeper {
            pid: std::process::id() as i32,
            start_time: Some(1),
            key: key(),
        };
        std::fs::write(slot.join(KEEPER_JSON), serde_json::to_vec(&keeper).unwrap()).unwrap();
        std::fs::File::create(slot.join(READY)).unwrap();
        let loaded = Keeper::load(&slot).unwrap();
        assert_eq!(slot_state(&slot, Some(&loaded)), SlotState::Dead);
        assert!(claim(dir.path(), &key()).is_none());
        assert!(slot.join(READY).exists(), "a dead slot was claimed");
        assert_eq!(list(dir.path())[0].2, "dead");
        assert_eq!(drain(dir.path()).unwrap(), 0);
        assert!(!pool.exists());
    }

    #[test]
    fn a_live_slot_of_another_key_is_not_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join(POOL_DIR).join("s");
        std::fs::create_dir_all(&slot).unwrap();
        let me = std::process::id() as i32;
        let keeper = Keeper {
            pid: me,
            start_time: crate::state::process_start_time(me),
            key: Key {
                memory_mib: 1024,
                ..key()
            },
        };
        std::fs::write(slot.join(KEEPER_JSON), serde_json::to_vec(&keeper).unwrap()).unwrap();
        std::fs::File::create(slot.join(READY)).unwrap();
        assert_eq!(
            slot_state(&slot, Keeper::load(&slot).as_ref()),
            SlotState::Alive {
                ready: true,
                claimed: false
            }
        );
        assert!(claim(dir.path(), &key()).is_none());
        assert!(slot.join(READY).exists(), "claimed with another key");
    }
}
