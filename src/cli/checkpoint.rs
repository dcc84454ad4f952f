//! `agentvm checkpoint`: runc's flags, answered by the container's tier
//! (which says clearly that it cannot checkpoint yet).

use std::path::PathBuf;

use clap::Args;

use crate::context::Context;
use crate::state::LockMode;

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
    /// Handle file locks
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// Dump the container's memory while it keeps running
    #[arg(long = "pre-dump")]
    pub pre_dump: bool,
    /// cgroups mode: soft, full, strict or ignore
    #[arg(long = "manage-cgroups-mode")]
    pub manage_cgroups_mode: Option<String>,
    pub id: String,
}

pub fn run(ctx: &Context, args: CheckpointArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.checkpoint(ctx, &args.id)?)
}
