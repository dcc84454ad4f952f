//! The runc-compatible command line: global flags and one module per command.
//!
//! The shape follows runc's, because containerd's runc shim (go-runc), conmon
//! and Docker build their argument lists for runc and hand them to us as-is.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Isolation;

pub mod check;
pub mod create;
pub mod delete;
pub mod events;
pub mod exec;
pub mod features;
pub mod kill;
pub mod list;
pub mod pause;
pub mod ps;
pub mod run;
pub mod spec;
pub mod start;
pub mod state;
pub mod update;

/// Default state directory, as runc's `/run/runc`.
pub const DEFAULT_ROOT: &str = "/run/agentvm";

#[derive(Parser, Debug)]
#[command(
    name = "agentvm",
    about = "OCI runtime: each container in its own microVM, or in namespaces",
    disable_version_flag = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Args, Debug, Clone)]
pub struct GlobalOpts {
    /// Root directory for container state
    #[arg(long, global = true, default_value = DEFAULT_ROOT)]
    pub root: PathBuf,

    /// Log file (default: stderr)
    #[arg(long, global = true)]
    pub log: Option<PathBuf>,

    /// Log format: text or json
    #[arg(long = "log-format", global = true, default_value = "text")]
    pub log_format: LogFormat,

    /// Enable debug logging
    #[arg(long, global = true)]
    pub debug: bool,

    /// Manage cgroups through systemd
    #[arg(long = "systemd-cgroup", global = true)]
    pub systemd_cgroup: bool,

    /// Rootless mode: true, false or auto (accepted for compatibility)
    #[arg(long, global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub rootless: Option<String>,

    /// Path to criu (accepted for compatibility; checkpoint is not supported)
    #[arg(long, global = true)]
    pub criu: Option<PathBuf>,

    /// Isolation tier: microvm (own kernel) or container (namespaces)
    #[arg(long, global = true)]
    pub isolation: Option<Isolation>,

    /// Configuration file
    #[arg(long, global = true, env = "AGENTVM_CONFIG")]
    pub config: Option<PathBuf>,

    /// Print version information
    #[arg(short = 'v', long = "version")]
    pub version: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a container
    Create(create::CreateArgs),
    /// Start a created container
    Start(start::StartArgs),
    /// Create and start a container
    Run(run::RunArgs),
    /// Output the state of a container
    State(state::StateArgs),
    /// Send a signal to the container's init process
    Kill(kill::KillArgs),
    /// Delete a container and everything the runtime holds for it
    Delete(delete::DeleteArgs),
    /// List containers
    List(list::ListArgs),
    /// List processes running inside a container
    Ps(ps::PsArgs),
    /// Execute a new process inside a container
    Exec(exec::ExecArgs),
    /// Suspend all processes of a container
    Pause(pause::PauseArgs),
    /// Resume all processes of a paused container
    Resume(pause::PauseArgs),
    /// Display container events and resource statistics
    Events(events::EventsArgs),
    /// Update container resource constraints
    Update(update::UpdateArgs),
    /// Create a new specification file
    Spec(spec::SpecArgs),
    /// Show the features this runtime implements, per isolation tier
    Features(features::FeaturesArgs),
    /// Show which isolation tiers this host can run, and why not
    Check(check::CheckArgs),
    /// (internal) the per-container supervisor of a microVM
    #[command(hide = true)]
    Supervise(SuperviseArgs),
}

#[derive(Args, Debug)]
pub struct SuperviseArgs {
    pub id: String,
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
}

/// Writes command output to stdout. A reader that went away (`| head`)
/// is not an error: agentvm ignores SIGPIPE, so it sees EPIPE instead.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// The three-line version output, in runc's shape.
pub fn version_text() -> String {
    format!(
        "agentvm version {}\ncommit: {}\nspec: {}\n",
        env!("CARGO_PKG_VERSION"),
        option_env!("AGENTVM_COMMIT").unwrap_or("unknown"),
        oci_spec::runtime::VERSION,
    )
}
