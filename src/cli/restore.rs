//! `agentvm restore`: runc's flags; the tier the bundle selects restores
//! (the container tier through CRIU; the microvm tier says it cannot yet).
//! Detached, the restored container is left running; in the foreground,
//! as `run`, it is waited for, its status is ours and it is deleted.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::bundle::{validate_id, Bundle};
use crate::container::foreground;
use crate::container::tty::{ConsoleSocket, Relay};
use crate::context::{absolute, Context};
use crate::state;
use crate::tier::{CgroupsMode, RestoreRequest};

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Path to an AF_UNIX socket which will receive the console's pty master
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    /// Path to criu image files for restoring
    #[arg(long = "image-path")]
    pub image_path: Option<PathBuf>,
    /// Path for saving work files and logs
    #[arg(long = "work-path")]
    pub work_path: Option<PathBuf>,
    /// Allow open tcp connections
    #[arg(long = "tcp-established")]
    pub tcp_established: bool,
    /// Allow external unix sockets
    #[arg(long = "ext-unix-sk")]
    pub ext_unix_sk: bool,
    /// Allow shell jobs
    #[arg(long = "shell-job")]
    pub shell_job: bool,
    /// Handle file locks, for safety
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// cgroups mode: soft (default), full and strict
    #[arg(long = "manage-cgroups-mode")]
    pub manage_cgroups_mode: Option<String>,
    /// Path to the root of the bundle directory
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    /// Detach from the container's process
    #[arg(short, long)]
    pub detach: bool,
    /// File to write the process id to
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// Disable the use of the subreaper used to reap reparented processes
    #[arg(long = "no-subreaper")]
    pub no_subreaper: bool,
    /// Do not use pivot root to jail process inside rootfs
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    /// Create a namespace, but don't restore its properties
    #[arg(long = "empty-ns")]
    pub empty_ns: Vec<String>,
    /// Enable auto deduplication of memory images
    #[arg(long = "auto-dedup")]
    pub auto_dedup: bool,
    /// Use userfaultfd to lazily restore memory pages
    #[arg(long = "lazy-pages")]
    pub lazy_pages: bool,
    /// An LSM profile to be used during restore, as TYPE:NAME
    #[arg(long = "lsm-profile")]
    pub lsm_profile: Option<String>,
    /// An LSM mount context to be used during restore
    #[arg(long = "lsm-mount-context")]
    pub lsm_mount_context: Option<String>,
    pub id: String,
}

pub fn run(ctx: &Context, args: RestoreArgs) -> anyhow::Result<u8> {
    let id = args.id.as_str();
    validate_id(id)?;
    let bundle = Bundle::load(&absolute(&args.bundle)?)?;
    let (isolation, _source) = ctx
        .config
        .select_isolation(ctx.isolation_flag, bundle.spec.annotations().as_ref())?;
    let egress = crate::egress::Policy::select(
        ctx.egress_flag.as_deref(),
        bundle
            .spec
            .annotations()
            .as_ref()
            .and_then(|a| a.get(crate::egress::EGRESS_ANNOTATION))
            .map(String::as_str),
        ctx.config.egress.policy.as_deref(),
        ctx.config.egress.locked,
    )?
    .0;
    if !egress.is_allow() {
        // As `checkpoint`: the router's namespaces are not in the images.
        anyhow::bail!(
            "restore of container {id} under an egress policy ({egress}) is not supported yet"
        );
    }
    let cgroups_mode = match args.manage_cgroups_mode.as_deref() {
        None => CgroupsMode::Soft,
        Some(m) => m.parse().map_err(anyhow::Error::msg)?,
    };
    // runc's default image path: `checkpoint` in the current directory.
    let image_path = absolute(
        args.image_path
            .as_deref()
            .unwrap_or(std::path::Path::new("checkpoint")),
    )?;
    let work_path = args.work_path.as_deref().map(absolute).transpose()?;
    let pid_file = super::pid_file(args.pid_file.as_deref())?;
    let terminal = bundle.terminal();
    // As `run`: in the foreground a terminal is ours to relay, and the
    // restored init is reaped here.
    let own_socket = match !args.detach && args.console_socket.is_none() && terminal {
        true => Some(ConsoleSocket::bind(&ctx.root, id)?),
        false => None,
    };
    let console_socket = match &own_socket {
        Some(s) => Some(s.path().to_path_buf()),
        None => args.console_socket.as_deref().map(absolute).transpose()?,
    };
    if !args.detach {
        foreground::become_subreaper()?;
    }
    let root_lock = state::lock_root(&ctx.root)?;
    if ctx.container_dir(id).exists() {
        anyhow::bail!("container with id {id} already exists");
    }
    let tier = crate::tier::for_isolation(isolation);
    let pid = tier
        .restore(
            ctx,
            &RestoreRequest {
                id,
                bundle: &bundle,
                image_path,
                work_path,
                console_socket,
                pid_file,
                tcp_established: args.tcp_established,
                ext_unix_sk: args.ext_unix_sk,
                shell_job: args.shell_job,
                file_locks: args.file_locks,
                auto_dedup: args.auto_dedup,
                lazy_pages: args.lazy_pages,
                empty_ns: args.empty_ns.clone(),
                lsm_profile: args.lsm_profile.clone(),
                lsm_mount_context: args.lsm_mount_context.clone(),
                cgroups_mode,
            },
        )
        .with_context(|| format!("cannot restore container {id} (isolation {isolation})"))?;
    drop(root_lock);
    if args.detach {
        return Ok(0);
    }
    let relay = match &own_socket {
        Some(s) => Some(Relay::new(s.receive_master()?)),
        None => None,
    };
    drop(own_socket);
    let code = foreground::wait(pid, relay)?;
    tier.delete(ctx, id, true)?;
    Ok(code)
}
