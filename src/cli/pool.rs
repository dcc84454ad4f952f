//! `agentvm pool`: the warm pool of booted microVMs (`microvm.pool` in the
//! config; `microvm::pool`).

use clap::{Args, Subcommand};

use crate::context::Context;

#[derive(Args, Debug)]
pub struct PoolArgs {
    #[command(subcommand)]
    pub action: PoolAction,
}

#[derive(Subcommand, Debug)]
pub enum PoolAction {
    /// Boot VMs until the pool holds `microvm.pool` of them (ending any
    /// booted by another agentvm binary, kernel or config)
    Fill {
        /// Wait until each VM has booted; fail if one did not
        #[arg(long)]
        wait: bool,
    },
    /// End the pool's VMs that no container took
    Drain,
    /// List the pool's VMs: slot, keeper pid, state
    List,
}

#[derive(Args, Debug)]
pub struct PoolKeeperArgs {
    pub slot: String,
    /// `pool fill --wait` hears on fd 3 how the boot went.
    #[arg(long)]
    pub sync: bool,
}

pub fn run(ctx: &Context, args: PoolArgs) -> anyhow::Result<()> {
    match args.action {
        PoolAction::Fill { wait } => {
            if ctx.config.microvm.pool_size() == 0 {
                anyhow::bail!("the pool is off: set microvm.pool in the config (--config)");
            }
            let filled = crate::microvm::pool::fill(
                &ctx.root,
                &ctx.config,
                ctx.config_path.as_deref(),
                wait,
            )?;
            tracing::debug!("pool fill: {filled:?}");
            if !filled.failed.is_empty() {
                anyhow::bail!(
                    "{} of {} pool VMs did not boot: {}",
                    filled.failed.len(),
                    filled.started,
                    filled.failed.join("; ")
                );
            }
            Ok(())
        }
        PoolAction::Drain => {
            let ended = crate::microvm::pool::drain(&ctx.root)?;
            tracing::debug!("pool drain: {ended} VMs ended");
            Ok(())
        }
        PoolAction::List => {
            let mut text = String::from("SLOT\tPID\tSTATE\n");
            for (slot, pid, state) in crate::microvm::pool::list(&ctx.root) {
                text.push_str(&format!("{slot}\t{pid}\t{state}\n"));
            }
            super::emit(&text)
        }
    }
}

/// Refills the pool in the background after a microvm `create`, when the
/// config keeps one: a failure is logged, never the container's.
pub fn refill(ctx: &Context) {
    if ctx.config.microvm.pool_size() == 0 {
        return;
    }
    match crate::microvm::pool::fill(&ctx.root, &ctx.config, ctx.config_path.as_deref(), false) {
        Ok(f) => tracing::debug!("pool refill: {f:?}"),
        Err(e) => tracing::warn!("pool refill: {e}"),
    }
}
