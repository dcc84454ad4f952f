//! `agentvm checkpoint`: runc's flags, answered by the container's tier
//! (CRIU in the container tier; the microvm tier says it cannot yet).

use std::path::PathBuf;

use clap::Args;

use crate::context::{absolute, Context};
use crate::state::LockMode;
use crate::tier::{CgroupsMode, CheckpointRequest};

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// Path for saving criu image files
    #[arg(long = "image-path")]
    pub image_path: Option<PathBuf>,
    /// Path for saving work files and logs
    #[arg(long = "work-path")]
    pub work_path: Option<PathBuf>,
    /// Path for previous criu image files in pre-dump
    #[arg(long = "parent-path")]
    pub parent_path: Option<PathBuf>,
    /// Leave the process running after checkpointing
    #[arg(long = "leave-running")]
    pub leave_running: bool,
    /// Allow open tcp connections
    #[arg(long = "tcp-established")]
    pub tcp_established: bool,
    /// Allow external unix sockets
    #[arg(long = "ext-unix-sk")]
    pub ext_unix_sk: bool,
    /// Allow shell jobs
    #[arg(long = "shell-job")]
    pub shell_job: bool,
    /// Use userfaultfd to lazily restore memory pages
    #[arg(long = "lazy-pages")]
    pub lazy_pages: bool,
    /// Handle file locks
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// Dump the container's memory while it keeps running
    #[arg(long = "pre-dump")]
    pub pre_dump: bool,
    /// cgroups mode: soft (default), full, strict or ignore
    #[arg(long = "manage-cgroups-mode")]
    pub manage_cgroups_mode: Option<String>,
    /// Create a namespace, but don't restore its properties
    #[arg(long = "empty-ns")]
    pub empty_ns: Vec<String>,
    /// Enable auto deduplication of memory images
    #[arg(long = "auto-dedup")]
    pub auto_dedup: bool,
    /// ADDRESS:PORT of the page server
    #[arg(long = "page-server")]
    pub page_server: Option<String>,
    /// Criu writes \0 to this FD once lazy-pages is ready
    #[arg(long = "status-fd")]
    pub status_fd: Option<i32>,
    pub id: String,
}

pub fn run(ctx: &Context, args: CheckpointArgs) -> anyhow::Result<()> {
    // CRIU options libcontainer's checkpoint has no setting for: refused by
    // name rather than ignored, since each changes what the images hold.
    let unsupported = [
        ("--pre-dump", args.pre_dump),
        ("--parent-path", args.parent_path.is_some()),
        ("--lazy-pages", args.lazy_pages),
        ("--auto-dedup", args.auto_dedup),
        ("--empty-ns", !args.empty_ns.is_empty()),
        ("--page-server", args.page_server.is_some()),
        ("--status-fd", args.status_fd.is_some()),
    ];
    if let Some((flag, _)) = unsupported.iter().find(|(_, given)| *given) {
        anyhow::bail!("checkpoint {flag} is not supported yet");
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
    let req = CheckpointRequest {
        image_path,
        work_path,
        leave_running: args.leave_running,
        tcp_established: args.tcp_established,
        ext_unix_sk: args.ext_unix_sk,
        shell_job: args.shell_job,
        file_locks: args.file_locks,
        cgroups_mode,
    };
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.checkpoint(ctx, &args.id, &req)?)
}
