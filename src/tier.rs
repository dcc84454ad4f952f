//! The seam between the command line and the isolation tiers.
//!
//! Every stateful runc command is one method of [`Tier`]; `container::Tier`
//! runs containers on the host kernel through libcontainer and
//! `microvm::Tier` in their own microVM. The command line parses its
//! arguments, picks the implementation once — [`for_isolation`] when a
//! container is created, [`of_container`] for one that exists — and calls
//! it. A third kind of backend is one more implementation of this trait.

use std::path::{Path, PathBuf};

use nix::unistd::Pid;
use oci_spec::runtime::{LinuxResources, Process};

use crate::bundle::Bundle;
use crate::config::Isolation;
use crate::context::Context;
use crate::protocol::GuestProcess;
use crate::state::{self, StateError};

/// The state object exactly as runc prints it (field order included).
#[derive(Debug, serde::Serialize)]
pub struct RuncState {
    #[serde(rename = "ociVersion")]
    pub oci_version: String,
    pub id: String,
    pub pid: i32,
    pub status: &'static str,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub created: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::HashMap<String, String>>,
    pub owner: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    Container(#[from] crate::container::ContainerError),
    #[error(transparent)]
    Microvm(#[from] crate::microvm::MicrovmError),
    #[error(transparent)]
    State(#[from] StateError),
    /// A runc feature this tier does not provide; the message says why.
    #[error("{what} is not supported by the {tier} tier{why}")]
    Unsupported {
        what: &'static str,
        tier: Isolation,
        why: &'static str,
    },
}

impl TierError {
    pub fn unsupported(what: &'static str, tier: Isolation, why: &'static str) -> TierError {
        TierError::Unsupported { what, tier, why }
    }
}

pub type Result<T> = std::result::Result<T, TierError>;

/// What `create` (and `run`) hand to a tier, checked and made absolute.
pub struct CreateRequest<'a> {
    pub id: &'a str,
    pub bundle: &'a Bundle,
    pub console_socket: Option<&'a Path>,
    pub pid_file: Option<&'a Path>,
    pub preserve_fds: i32,
    pub no_pivot: bool,
    /// False for a foreground `run` that relays the terminal itself.
    pub detached: bool,
    /// The egress policy in force (`egress::Policy::select`).
    pub egress: &'a crate::egress::Policy,
}

/// An `exec`, the process already built from `--process` or the flags.
pub struct ExecRequest<'a> {
    pub id: &'a str,
    pub process: &'a Process,
    pub console_socket: Option<&'a Path>,
    pub pid_file: Option<&'a Path>,
    pub detach: bool,
    pub preserve_fds: i32,
    pub ignore_paused: bool,
    /// `exec --cgroup`: sub-cgroups of the container's, each
    /// `[<controller>[,<controller>...]:]<path>` as in runc 1.1.
    pub cgroup: &'a [String],
}

/// The processes of a container as `ps` shows them.
pub enum ProcessTable {
    /// Host pids: the table is the host's `ps` output filtered to them.
    Host(Vec<i32>),
    /// The processes as the guest kernel sees them (a microVM's workload).
    Guest(Vec<GuestProcess>),
}

/// The OOM-kill count of one container.
pub trait OomWatch {
    /// How many processes of the container the kernel's OOM killer has
    /// killed since it was created; an error once that cannot be read.
    fn kills(&mut self, ctx: &Context) -> Result<u64>;
}

/// One isolation tier. Each method is one runc command on an existing
/// container (but `create`), called with the container's lock held as the
/// command needs it.
pub trait Tier {
    fn isolation(&self) -> Isolation;
    /// Creates the container. The caller holds the root lock and has
    /// checked that the id is free; on failure nothing is left behind.
    fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<()>;
    fn start(&self, ctx: &Context, id: &str) -> Result<()>;
    fn state(&self, ctx: &Context, id: &str) -> Result<RuncState>;
    /// Sends signal number `signal` (0 probes, as `kill(2)`; real-time
    /// numbers included) to the init, or with `all` to every process.
    fn kill(&self, ctx: &Context, id: &str, signal: i32, all: bool) -> Result<()>;
    fn delete(&self, ctx: &Context, id: &str, force: bool) -> Result<()>;
    fn pause(&self, ctx: &Context, id: &str) -> Result<()>;
    fn resume(&self, ctx: &Context, id: &str) -> Result<()>;
    /// The container's processes in the host's process table: what
    /// `ps --format json` prints and the shim and `docker top` look up.
    fn host_pids(&self, ctx: &Context, id: &str) -> Result<Vec<i32>>;
    /// What `ps` shows as a table.
    fn process_table(&self, ctx: &Context, id: &str, ps_args: &[String]) -> Result<ProcessTable>;
    /// One stats sample in runc's shape; `None` once the container has
    /// stopped.
    fn stats(&self, ctx: &Context, id: &str) -> Result<Option<crate::events::Stats>>;
    /// A counter of the container's OOM kills, opened while it runs, for
    /// `events` to report each new one as runc does (`{"type":"oom"}`).
    fn oom_watch(&self, ctx: &Context, id: &str) -> Result<Box<dyn OomWatch>>;
    fn update(&self, ctx: &Context, id: &str, resources: &LinuxResources) -> Result<()>;
    /// Runs a process in the container; in the foreground, returns its exit
    /// status as a shell reports it, detached 0.
    fn exec(&self, ctx: &Context, req: &ExecRequest) -> Result<u8>;
    /// The pid a foreground `run` waits for: our child (or, as a
    /// subreaper, our descendant) whose exit status is the container's.
    fn init_pid(&self, ctx: &Context, id: &str) -> Result<Pid>;
    /// `checkpoint`: the container's processes saved to images (CRIU).
    fn checkpoint(&self, _ctx: &Context, _id: &str, _req: &CheckpointRequest) -> Result<()> {
        Err(TierError::unsupported(
            "checkpoint",
            self.isolation(),
            ": no CRIU or VM snapshot support yet",
        ))
    }
    /// `restore`: a container made from a checkpoint's images, running;
    /// returns its init's pid, a child of ours.
    fn restore(&self, _ctx: &Context, _req: &RestoreRequest) -> Result<Pid> {
        Err(TierError::unsupported(
            "restore",
            self.isolation(),
            ": no CRIU or VM snapshot support yet",
        ))
    }
}

/// How CRIU treats the container's cgroups (runc's `--manage-cgroups-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupsMode {
    Soft,
    Full,
    Strict,
    Ignore,
}

impl std::str::FromStr for CgroupsMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "soft" => Ok(CgroupsMode::Soft),
            "full" => Ok(CgroupsMode::Full),
            "strict" => Ok(CgroupsMode::Strict),
            "ignore" => Ok(CgroupsMode::Ignore),
            _ => Err(format!("invalid manage cgroups mode {s:?}")),
        }
    }
}

/// What `checkpoint` asks for, with runc's defaults filled in.
#[derive(Debug)]
pub struct CheckpointRequest {
    /// Where the images go (runc: `./checkpoint` without `--image-path`).
    pub image_path: PathBuf,
    /// CRIU's work files and log (the image path without `--work-path`).
    pub work_path: Option<PathBuf>,
    pub leave_running: bool,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    pub shell_job: bool,
    pub file_locks: bool,
    /// Soft unless given, as in runc.
    pub cgroups_mode: CgroupsMode,
    /// CRIU's pre-dump: the memory only, the container keeps running.
    pub pre_dump: bool,
    /// A previous (pre-)dump's images, relative to the image path.
    pub parent_path: Option<PathBuf>,
    /// Pages left for a lazy restore to fetch from the page server.
    pub lazy_pages: bool,
    pub auto_dedup: bool,
    /// CLONE_NEW* flags of namespaces dumped empty.
    pub empty_ns: u32,
    /// Where the pages go: a CRIU page server's address and port.
    pub page_server: Option<(String, i32)>,
    /// Where `\0` is written once the lazy pages can be fetched.
    pub status_fd: Option<i32>,
}

/// What `restore` asks for, with runc's defaults filled in.
pub struct RestoreRequest<'a> {
    pub id: &'a str,
    pub bundle: &'a Bundle,
    /// Where the checkpoint's images are (runc: `./checkpoint`).
    pub image_path: PathBuf,
    /// CRIU's work files and `restore.log` (the image path without it).
    pub work_path: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    pub shell_job: bool,
    pub file_locks: bool,
    pub auto_dedup: bool,
    pub lazy_pages: bool,
    /// Namespaces to create empty (runc: `network` only).
    pub empty_ns: Vec<String>,
    pub lsm_profile: Option<String>,
    pub lsm_mount_context: Option<String>,
    /// Soft unless given, as in runc.
    pub cgroups_mode: CgroupsMode,
}

/// The implementation of a tier.
pub fn for_isolation(isolation: Isolation) -> Box<dyn Tier> {
    match isolation {
        Isolation::Container => Box::new(crate::container::Tier),
        Isolation::Microvm => Box::new(crate::microvm::Tier),
    }
}

/// The tier an existing container was created in.
pub fn of_container(ctx: &Context, id: &str) -> std::result::Result<Box<dyn Tier>, StateError> {
    Ok(for_isolation(state::tier_of(&ctx.root, id)?))
}

/// runc 1.1's refusal of `start` for a container in `status` (its state
/// name), any state but created.
pub fn cannot_start(status: &str) -> String {
    match status {
        "stopped" => "cannot start a container that has stopped".into(),
        "running" => "cannot start an already running container".into(),
        other => format!("cannot start a container in the {other} state"),
    }
}

/// runc 1.1's refusal of `pause` of a container that is not running.
pub const NOT_RUNNING: &str = "container not running";
/// runc 1.1's refusal of `resume` of a container that is not paused.
pub const NOT_PAUSED: &str = "container not paused";
