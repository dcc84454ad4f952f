//! `agentvm state`

use clap::Args;

use crate::context::Context;
use crate::state::LockMode;

#[derive(Args, Debug)]
pub struct StateArgs {
    pub id: String,
}

pub fn run(ctx: &Context, args: StateArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Shared))?;
    let state = tier.state(ctx, &args.id)?;
    super::emit(&format!("{}\n", serde_json::to_string_pretty(&state)?))
}
