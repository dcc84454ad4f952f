//! `agentvm restore`: runc's flags; the tier the bundle selects answers
//! (neither restores from CRIU images yet, and each says so).

use std::path::PathBuf;

use clap::Args;

use crate::bundle::{validate_id, Bundle};
use crate::context::{absolute, Context};
use crate::state;
use crate::tier::RestoreRequest;

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
    // runc's default image path: `checkpoint` in the current directory.
    let image_path = absolute(
        args.image_path
            .as_deref()
            .unwrap_or(std::path::Path::new("checkpoint")),
    )?;
    let _root_lock = state::lock_root(&ctx.root)?;
    if ctx.container_dir(id).exists() {
        anyhow::bail!("container with id {id} already exists");
    }
    let tier = crate::tier::for_isolation(isolation);
    tier.restore(
        ctx,
        &RestoreRequest {
            id,
            bundle: &bundle,
            image_path,
        },
    )?;
    Ok(0)
}
