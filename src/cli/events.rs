//! `agentvm events`

use clap::Args;

use crate::container::{lc_error, load};
use crate::context::Context;
use crate::state::{lock_container, LockMode};

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Seconds between stats samples (runc accepts a duration like "5s")
    #[arg(long, default_value = "5s")]
    pub interval: String,
    /// Print the container's stats once and exit
    #[arg(long)]
    pub stats: bool,
    pub id: String,
}

fn parse_interval(s: &str) -> anyhow::Result<u32> {
    let digits = s.strip_suffix('s').unwrap_or(s);
    match digits.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => anyhow::bail!("invalid --interval {s:?}: expected whole seconds like 5s"),
    }
}

pub fn run(ctx: &Context, args: EventsArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let interval = parse_interval(&args.interval)?;
    let mut c = {
        let _lock = lock_container(&ctx.root, &args.id, LockMode::Shared)?;
        load(ctx, &args.id)?
    };
    c.events(interval, args.stats).map_err(lc_error)?;
    Ok(())
}
