//! `agentvm exec`

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use oci_spec::runtime::{Process, Spec};

use crate::container::exec::{exec, ExecOptions};
use crate::container::foreground;
use crate::container::tty::{ConsoleSocket, Relay};
use crate::context::{absolute, Context};

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    /// Current working directory in the container
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// Set environment variables (KEY=VALUE)
    #[arg(short, long)]
    pub env: Vec<String>,
    /// Allocate a pseudo-TTY
    #[arg(short, long)]
    pub tty: bool,
    /// UID[:GID] to run as
    #[arg(short, long)]
    pub user: Option<String>,
    /// Additional group ids
    #[arg(short = 'g', long = "additional-gids")]
    pub additional_gids: Vec<u32>,
    /// Path to a process.json
    #[arg(short, long)]
    pub process: Option<PathBuf>,
    /// Detach from the process
    #[arg(short, long)]
    pub detach: bool,
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// Accepted for compatibility (no SELinux here)
    #[arg(long = "process-label")]
    pub process_label: Option<String>,
    /// Accepted for compatibility (no AppArmor here)
    #[arg(long)]
    pub apparmor: Option<String>,
    #[arg(long = "no-new-privs")]
    pub no_new_privs: bool,
    /// Add a capability
    #[arg(short, long)]
    pub cap: Vec<String>,
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    /// Run in a sub-cgroup of the container
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Allow exec into a paused container
    #[arg(long = "ignore-paused")]
    pub ignore_paused: bool,
    pub id: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Builds the process for a flag-style exec the way runc does: the
/// container's own process settings, overridden by the flags.
fn process_from_flags(config: &Path, args: &ExecArgs) -> anyhow::Result<Process> {
    if args.command.is_empty() {
        anyhow::bail!("exec needs a command to run, or --process");
    }
    let spec = Spec::load(config).with_context(|| format!("cannot read {}", config.display()))?;
    let mut p = spec.process().clone().unwrap_or_default();
    p.set_args(Some(args.command.clone()));
    p.set_terminal(Some(args.tty));
    if let Some(cwd) = &args.cwd {
        p.set_cwd(cwd.clone());
    }
    let mut env = p.env().clone().unwrap_or_default();
    for kv in &args.env {
        let key = kv.split('=').next().unwrap_or_default();
        env.retain(|e| e.split('=').next() != Some(key));
        env.push(kv.clone());
    }
    p.set_env(Some(env));
    let mut user = p.user().clone();
    if let Some(u) = &args.user {
        let (uid, gid) = match u.split_once(':') {
            Some((uid, gid)) => (uid, Some(gid)),
            None => (u.as_str(), None),
        };
        user.set_uid(
            uid.parse()
                .map_err(|_| anyhow::anyhow!("invalid --user {u:?}: expected numeric UID[:GID]"))?,
        );
        if let Some(gid) = gid {
            user.set_gid(gid.parse().map_err(|_| {
                anyhow::anyhow!("invalid --user {u:?}: expected numeric UID[:GID]")
            })?);
        }
    }
    if !args.additional_gids.is_empty() {
        user.set_additional_gids(Some(args.additional_gids.clone()));
    }
    p.set_user(user);
    if args.no_new_privs {
        p.set_no_new_privileges(Some(true));
    }
    if !args.cap.is_empty() {
        let mut caps = p.capabilities().clone().unwrap_or_default();
        for name in &args.cap {
            let cap: oci_spec::runtime::Capability = name
                .parse()
                .map_err(|_| anyhow::anyhow!("unknown capability {name:?}"))?;
            let add = |s: Option<oci_spec::runtime::Capabilities>| {
                let mut s = s.unwrap_or_default();
                s.insert(cap);
                Some(s)
            };
            caps.set_bounding(add(caps.bounding().clone()));
            caps.set_effective(add(caps.effective().clone()));
            caps.set_permitted(add(caps.permitted().clone()));
        }
        p.set_capabilities(Some(caps));
    }
    Ok(p)
}

pub fn run(ctx: &Context, args: ExecArgs) -> anyhow::Result<u8> {
    crate::bundle::validate_id(&args.id)?;
    let dir = ctx.container_dir(&args.id);
    if crate::state::tier_of(&ctx.root, &args.id)? == crate::config::Isolation::Microvm {
        return run_microvm(ctx, &args);
    }
    if !dir.join("state.json").exists() {
        anyhow::bail!("container {} does not exist", args.id);
    }
    // Resolve the process: a given process.json, or one built from flags
    // and written next to the container's state for libcontainer to read.
    let (process_path, process, written) = match &args.process {
        Some(p) => {
            let (path, process) = process_from_file(p)?;
            (path, process, false)
        }
        None => {
            let container = crate::container::load(ctx, &args.id)?;
            let process = process_from_flags(&container.bundle().join("config.json"), &args)?;
            let path = dir.join(format!(".exec-{}.json", std::process::id()));
            std::fs::write(&path, serde_json::to_vec(&process)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            (path, process, true)
        }
    };
    let result = run_process(ctx, &args, &process_path, &process);
    if written {
        let _ = std::fs::remove_file(&process_path);
    }
    result
}

/// Reads and checks a `--process` file.
fn process_from_file(p: &Path) -> anyhow::Result<(PathBuf, Process)> {
    let path = absolute(p)?;
    let text = std::fs::read(&path)
        .with_context(|| format!("cannot read process file {}", path.display()))?;
    let process: Process = serde_json::from_slice(&text)
        .with_context(|| format!("invalid process file {}", path.display()))?;
    if process.args().as_ref().is_none_or(|a| a.is_empty()) {
        anyhow::bail!("process file {}: args must not be empty", path.display());
    }
    Ok((path, process))
}

/// The microvm tier: the process runs in the guest, this command relays.
fn run_microvm(ctx: &Context, args: &ExecArgs) -> anyhow::Result<u8> {
    let process = match &args.process {
        Some(p) => process_from_file(p)?.1,
        None => {
            let state = crate::microvm::vmstate::VmState::load(&ctx.container_dir(&args.id))?;
            process_from_flags(&state.bundle.join("config.json"), args)?
        }
    };
    if args.preserve_fds > 0 {
        anyhow::bail!("exec --preserve-fds is not supported by the microvm tier: host descriptors cannot cross into the guest");
    }
    if args.cgroup.is_some() {
        anyhow::bail!("exec --cgroup is not supported by the microvm tier");
    }
    let console_socket = args.console_socket.as_deref().map(absolute).transpose()?;
    let pid_file = args.pid_file.as_deref().map(absolute).transpose()?;
    let status = crate::microvm::exec::exec(
        ctx,
        &args.id,
        crate::microvm::exec::ExecRequest {
            process: serde_json::to_value(&process)?,
            console_socket: console_socket.as_deref(),
            pid_file: pid_file.as_deref(),
            detach: args.detach,
            ignore_paused: args.ignore_paused,
        },
    )
    .with_context(|| format!("cannot exec in container {}", args.id))?;
    Ok(status)
}

fn run_process(
    ctx: &Context,
    args: &ExecArgs,
    process_path: &Path,
    process: &Process,
) -> anyhow::Result<u8> {
    let terminal = process.terminal().unwrap_or(false);
    let own_socket = if terminal && !args.detach && args.console_socket.is_none() {
        Some(ConsoleSocket::bind(&ctx.root, &args.id)?)
    } else {
        None
    };
    if !args.detach {
        foreground::become_subreaper()?;
    }
    let opts = ExecOptions {
        process: Some(process_path.to_path_buf()),
        console_socket: match &own_socket {
            Some(s) => Some(s.path().to_path_buf()),
            None => args.console_socket.as_deref().map(absolute).transpose()?,
        },
        pid_file: args.pid_file.as_deref().map(absolute).transpose()?,
        detach: args.detach || own_socket.is_some(),
        preserve_fds: args.preserve_fds,
        ignore_paused: args.ignore_paused,
        sub_cgroup: args.cgroup.clone(),
        ..Default::default()
    };
    let pid = exec(ctx, &args.id, opts)
        .with_context(|| format!("cannot exec in container {}", args.id))?;
    if args.detach {
        return Ok(0);
    }
    let relay = match &own_socket {
        Some(s) => Some(Relay::new(s.receive_master()?)),
        None => None,
    };
    drop(own_socket);
    Ok(foreground::wait(pid, relay)?)
}
