//! `agentvm run`: create + start, and in the foreground, wait and delete.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use super::create::Created;
use crate::container::create::CreateOptions;
use crate::container::foreground;
use crate::container::tty::{ConsoleSocket, Relay};
use crate::container::{delete::delete, lc_error};
use crate::context::Context;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// Detach from the container's process
    #[arg(short, long)]
    pub detach: bool,
    /// Keep the container's state after it exits (foreground only)
    #[arg(long)]
    pub keep: bool,
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    #[arg(long = "no-new-keyring")]
    pub no_new_keyring: bool,
    /// Accepted for compatibility: agentvm always reaps as a subreaper
    #[arg(long = "no-subreaper")]
    pub no_subreaper: bool,
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    pub id: String,
}

fn wants_terminal(bundle: &std::path::Path) -> bool {
    std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("process")?.get("terminal")?.as_bool())
        .unwrap_or(false)
}

pub fn run(ctx: &Context, args: RunArgs) -> anyhow::Result<u8> {
    let foreground_tty =
        !args.detach && args.console_socket.is_none() && wants_terminal(&args.bundle);
    let own_socket = if foreground_tty {
        Some(ConsoleSocket::bind(&ctx.root, &args.id)?)
    } else {
        None
    };
    if !args.detach {
        foreground::become_subreaper()?;
    }
    let opts = CreateOptions {
        pid_file: args.pid_file.clone(),
        console_socket: args
            .console_socket
            .clone()
            .or_else(|| own_socket.as_ref().map(|s| s.path().to_path_buf())),
        preserve_fds: args.preserve_fds,
        no_pivot: args.no_pivot,
        // libcontainer wants "detached" whenever a console socket is used.
        detached: args.detach || own_socket.is_some(),
        ..Default::default()
    };
    let created = super::create::create_container(ctx, &args.id, &args.bundle, opts)?;
    let relay = match &own_socket {
        Some(s) => Some(Relay::new(s.receive_master()?)),
        None => None,
    };
    drop(own_socket);
    let mut container = match created {
        Created::Container(c) => *c,
        Created::Microvm => return run_microvm(ctx, &args, relay),
    };
    if let Err(e) = container.start().map_err(lc_error) {
        let _ = delete(&mut container, true);
        return Err(e).with_context(|| format!("cannot start container {}", args.id));
    }
    if args.detach {
        return Ok(0);
    }
    let pid = container
        .pid()
        .ok_or_else(|| anyhow::anyhow!("container {} has no init pid", args.id))?;
    let code = foreground::wait(pid, relay)?;
    if !args.keep {
        let mut c = crate::container::load(ctx, &args.id)?;
        delete(&mut c, true)?;
    }
    Ok(code)
}

/// The rest of `run` for a microVM: start, then in the foreground wait for
/// the supervisor (our child), whose exit status is the workload's.
fn run_microvm(ctx: &Context, args: &RunArgs, relay: Option<Relay>) -> anyhow::Result<u8> {
    if let Err(e) = crate::microvm::start(ctx, &args.id) {
        let _ = crate::microvm::delete(ctx, &args.id, true);
        return Err(e).with_context(|| format!("cannot start container {}", args.id));
    }
    if args.detach {
        return Ok(0);
    }
    // The supervisor is our child, so its pid cannot be reused before we
    // reap it; `state` would say pid 0 once it has exited (a workload or a
    // guest that ends right after start).
    let state = crate::microvm::vmstate::VmState::load(&ctx.container_dir(&args.id))?;
    let pid = state
        .supervisor_pid
        .ok_or_else(|| anyhow::anyhow!("container {} has no supervisor", args.id))?;
    let pid = nix::unistd::Pid::from_raw(pid);
    let code = foreground::wait(pid, relay)?;
    if !args.keep {
        crate::microvm::delete(ctx, &args.id, true)?;
    }
    Ok(code)
}
