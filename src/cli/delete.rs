//! `agentvm delete`

use clap::Args;

use crate::context::Context;
use crate::state::{lock_container, LockMode, StateError};

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Kill the container if it is still running, and succeed if it is gone
    #[arg(short, long)]
    pub force: bool,
    pub id: String,
}

pub fn run(ctx: &Context, args: DeleteArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let lock = match lock_container(&ctx.root, &args.id, LockMode::Exclusive) {
        Ok(l) => l,
        Err(StateError::NotFound(_)) => {
            // A create that died half way can leave a directory without
            // state; runc removes it too.
            let dir = ctx.container_dir(&args.id);
            if dir.is_dir() && !dir.join("state.json").exists() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            if args.force {
                return Ok(());
            }
            anyhow::bail!("container {} does not exist", args.id);
        }
        Err(e) => return Err(e.into()),
    };
    let (tier, _) = super::open(ctx, &args.id, None)?;
    tier.delete(ctx, &args.id, args.force)?;
    drop(lock);
    Ok(())
}
