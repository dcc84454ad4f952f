//! `agentvm kill`

use clap::Args;

use crate::context::Context;
use crate::state::LockMode;

#[derive(Args, Debug)]
pub struct KillArgs {
    /// Send the signal to every process in the container
    #[arg(short, long)]
    pub all: bool,
    pub id: String,
    /// Signal name or number (default SIGTERM); 0 checks the container runs
    #[arg(default_value = "SIGTERM", allow_negative_numbers = true)]
    pub signal: String,
}

pub fn run(ctx: &Context, args: KillArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let signal = crate::signal::parse(&args.signal)?;
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.kill(ctx, &args.id, signal, args.all)?)
}
