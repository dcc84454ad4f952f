//! `agentvm start`

use anyhow::Context as _;
use clap::Args;
use libcontainer::container::ContainerStatus;

use crate::config::Isolation;
use crate::container::{lc_error, load, status_str};
use crate::context::Context;
use crate::state::{lock_container, tier_of, LockMode};

#[derive(Args, Debug)]
pub struct StartArgs {
    pub id: String,
}

pub fn run(ctx: &Context, args: StartArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let _lock = lock_container(&ctx.root, &args.id, LockMode::Exclusive)?;
    if tier_of(&ctx.root, &args.id)? == Isolation::Microvm {
        return Ok(crate::microvm::start(ctx, &args.id)?);
    }
    let mut container = load(ctx, &args.id)?;
    match container.status() {
        ContainerStatus::Created => {}
        ContainerStatus::Stopped => anyhow::bail!("cannot start a container that has stopped"),
        other => anyhow::bail!(
            "cannot start container {} in status {}: only a created container can be started",
            args.id,
            status_str(other)
        ),
    }
    container
        .start()
        .map_err(lc_error)
        .with_context(|| format!("cannot start container {}", args.id))
}
