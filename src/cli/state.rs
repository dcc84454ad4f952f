//! `agentvm state`

use clap::Args;

use crate::config::Isolation;
use crate::container::{load, runc_state};
use crate::context::Context;
use crate::state::{lock_container, tier_of, LockMode};

#[derive(Args, Debug)]
pub struct StateArgs {
    pub id: String,
}

pub fn run(ctx: &Context, args: StateArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let _lock = lock_container(&ctx.root, &args.id, LockMode::Shared)?;
    let state = match tier_of(&ctx.root, &args.id)? {
        Isolation::Microvm => crate::microvm::state(ctx, &args.id)?,
        Isolation::Container => runc_state(&load(ctx, &args.id)?),
    };
    super::emit(&format!("{}\n", serde_json::to_string_pretty(&state)?))
}
