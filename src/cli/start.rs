//! `agentvm start`

use anyhow::Context as _;
use clap::Args;

use crate::context::Context;
use crate::state::LockMode;

#[derive(Args, Debug)]
pub struct StartArgs {
    pub id: String,
}

pub fn run(ctx: &Context, args: StartArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    tier.start(ctx, &args.id)
        .with_context(|| format!("cannot start container {}", args.id))
}
