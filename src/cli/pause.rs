//! `agentvm pause` and `agentvm resume`

use clap::Args;
use libcontainer::container::ContainerStatus;

use crate::config::Isolation;
use crate::container::{lc_error, load, status_str};
use crate::context::Context;
use crate::state::{lock_container, tier_of, LockMode};

#[derive(Args, Debug)]
pub struct PauseArgs {
    pub id: String,
}

pub fn pause(ctx: &Context, args: PauseArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let _lock = lock_container(&ctx.root, &args.id, LockMode::Exclusive)?;
    if tier_of(&ctx.root, &args.id)? == Isolation::Microvm {
        return Ok(crate::microvm::set_paused(ctx, &args.id, true)?);
    }
    let mut c = load(ctx, &args.id)?;
    if c.status() != ContainerStatus::Running {
        anyhow::bail!(
            "cannot pause container {}: it is {}, not running",
            args.id,
            status_str(c.status())
        );
    }
    c.pause().map_err(lc_error)?;
    Ok(())
}

pub fn resume(ctx: &Context, args: PauseArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let _lock = lock_container(&ctx.root, &args.id, LockMode::Exclusive)?;
    if tier_of(&ctx.root, &args.id)? == Isolation::Microvm {
        return Ok(crate::microvm::set_paused(ctx, &args.id, false)?);
    }
    let mut c = load(ctx, &args.id)?;
    if c.status() != ContainerStatus::Paused {
        anyhow::bail!(
            "cannot resume container {}: it is {}, not paused",
            args.id,
            status_str(c.status())
        );
    }
    c.resume().map_err(lc_error)?;
    Ok(())
}
