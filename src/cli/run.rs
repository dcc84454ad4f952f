//! `agentvm run`: create + start, and in the foreground, wait and delete.

use anyhow::Context as _;
use clap::Args;

use super::create::{create_container, CreateArgs};
use crate::container::foreground;
use crate::container::tty::{ConsoleSocket, Relay};
use crate::context::Context;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub create: CreateArgs,
    /// Detach from the container's process
    #[arg(short, long)]
    pub detach: bool,
    /// Keep the container's state after it exits (foreground only)
    #[arg(long)]
    pub keep: bool,
    /// Accepted for compatibility: agentvm always reaps as a subreaper
    #[arg(long = "no-subreaper")]
    pub no_subreaper: bool,
}

fn wants_terminal(bundle: &std::path::Path) -> bool {
    crate::bundle::Bundle::read_spec(&bundle.join("config.json"))
        .ok()
        .and_then(|(s, _)| s.process().as_ref()?.terminal())
        .unwrap_or(false)
}

pub fn run(ctx: &Context, mut args: RunArgs) -> anyhow::Result<u8> {
    let id = args.create.id.clone();
    let foreground_tty =
        !args.detach && args.create.console_socket.is_none() && wants_terminal(&args.create.bundle);
    let own_socket = if foreground_tty {
        Some(ConsoleSocket::bind(&ctx.root, &id)?)
    } else {
        None
    };
    if !args.detach {
        foreground::become_subreaper()?;
    }
    if let Some(s) = &own_socket {
        args.create.console_socket = Some(s.path().to_path_buf());
    }
    // libcontainer wants "detached" whenever a console socket is used.
    let tier = create_container(ctx, &args.create, args.detach || own_socket.is_some())?;
    let relay = match &own_socket {
        Some(s) => Some(Relay::new(s.receive_master()?)),
        None => None,
    };
    drop(own_socket);
    if let Err(e) = tier.start(ctx, &id) {
        let _ = tier.delete(ctx, &id, true);
        return Err(e).with_context(|| format!("cannot start container {id}"));
    }
    if args.detach {
        return Ok(0);
    }
    let pid = tier.init_pid(ctx, &id)?;
    let code = foreground::wait(pid, relay)?;
    if !args.keep {
        tier.delete(ctx, &id, true)?;
    }
    Ok(code)
}
