//! `agentvm pause` and `agentvm resume`

use clap::Args;

use crate::context::Context;
use crate::state::LockMode;

#[derive(Args, Debug)]
pub struct PauseArgs {
    pub id: String,
}

pub fn pause(ctx: &Context, args: PauseArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.pause(ctx, &args.id)?)
}

pub fn resume(ctx: &Context, args: PauseArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.resume(ctx, &args.id)?)
}
