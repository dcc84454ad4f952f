//! `agentvm kill`

use clap::Args;
use libcgroups::common::{CgroupManager, FreezerState};
use libcontainer::container::ContainerStatus;
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};

use crate::config::Isolation;
use crate::container::{cgroup_manager, load, pids};
use crate::context::Context;
use crate::state::{lock_container, tier_of, LockMode};

#[derive(Args, Debug)]
pub struct KillArgs {
    /// Send the signal to every process in the container
    #[arg(short, long)]
    pub all: bool,
    pub id: String,
    /// Signal name or number (default SIGTERM)
    #[arg(default_value = "SIGTERM")]
    pub signal: String,
}

pub fn run(ctx: &Context, args: KillArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let signal = crate::signal::parse(&args.signal)?;
    let _lock = lock_container(&ctx.root, &args.id, LockMode::Exclusive)?;
    if tier_of(&ctx.root, &args.id)? == Isolation::Microvm {
        return Ok(crate::microvm::kill(
            ctx,
            &args.id,
            signal as i32,
            args.all,
        )?);
    }
    let container = load(ctx, &args.id)?;
    let status = container.status();
    if args.all {
        // As runc: --all also reaches leftovers of a stopped container.
        let cm = cgroup_manager(&container)?;
        let frozen = cm.freeze(FreezerState::Frozen).is_ok();
        for pid in pids(&container)? {
            match kill(pid, signal) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => anyhow::bail!("cannot signal process {pid}: {e}"),
            }
        }
        // Leave a paused container frozen, unless it is being killed.
        if frozen && (status != ContainerStatus::Paused || signal == Signal::SIGKILL) {
            let _ = cm.freeze(FreezerState::Thawed);
        }
        return Ok(());
    }
    if matches!(status, ContainerStatus::Stopped | ContainerStatus::Creating) {
        anyhow::bail!("container {} is not running", args.id);
    }
    let pid = container
        .pid()
        .ok_or_else(|| anyhow::anyhow!("container {} has no init process", args.id))?;
    match kill(pid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => anyhow::bail!("cannot signal container {}: {e}", args.id),
    }
    // A frozen task cannot act on SIGKILL: thaw so it dies (runc does too).
    if status == ContainerStatus::Paused && signal == Signal::SIGKILL {
        let _ = cgroup_manager(&container)?.freeze(FreezerState::Thawed);
    }
    Ok(())
}
