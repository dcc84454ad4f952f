//! The runc-compatible command line: global flags and one module per command.
//!
//! The shape follows runc's, because containerd's runc shim (go-runc), conmon
//! and Docker build their argument lists for runc and hand them to us as-is.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::config::{Config, Isolation};
use crate::context::{absolute, Context};
pub use crate::logging::LogFormat;
use crate::tier::Tier;

pub mod audit;
pub mod check;
pub mod checkpoint;
pub mod create;
pub mod delete;
pub mod events;
pub mod exec;
pub mod features;
pub mod kill;
pub mod list;
pub mod pause;
pub mod pool;
pub mod ps;
pub mod restore;
pub mod run;
pub mod spec;
pub mod start;
pub mod state;
pub mod update;
pub mod usage;

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

    /// Path to criu (accepted for compatibility; checkpoint runs `criu` from PATH)
    #[arg(long, global = true)]
    pub criu: Option<PathBuf>,

    /// Isolation tier: microvm (own kernel) or container (namespaces)
    #[arg(long, global = true)]
    pub isolation: Option<Isolation>,

    /// Egress policy: allow, deny, or an allowlist of CIDR[:PORT][/udp]
    /// items (see README); narrows a locked policy of the config file
    #[arg(long, global = true, value_name = "RULES")]
    pub egress: Option<String>,

    /// Configuration file
    #[arg(long, global = true, env = "AGENTVM_CONFIG")]
    pub config: Option<PathBuf>,

    /// Print version information
    #[arg(short = 'v', long = "version")]
    pub version: bool,
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
    /// Checkpoint a running container
    Checkpoint(checkpoint::CheckpointArgs),
    /// Restore a container from a previous checkpoint
    Restore(restore::RestoreArgs),
    /// Create a new specification file
    Spec(spec::SpecArgs),
    /// Show the features this runtime implements, per isolation tier
    Features(features::FeaturesArgs),
    /// Show which isolation tiers this host can run, and why not
    Check(check::CheckArgs),
    /// Print a container's audit trail (execs, connections) as JSON lines
    Audit(audit::AuditArgs),
    /// Manage the warm pool of booted microVMs (microvm.pool)
    Pool(pool::PoolArgs),
    /// (internal) the host's OTLP exporter of the audit trail
    #[command(hide = true)]
    AuditExport,
    /// (internal) the per-container supervisor of a microVM
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    /// (internal) boots and keeps one VM of the pool
    #[command(hide = true)]
    PoolKeeper(pool::PoolKeeperArgs),
    /// (internal) the egress policy's resolver, proxy and log reader,
    /// in a sandbox's network namespace
    #[command(hide = true)]
    EgressDaemon(EgressDaemonArgs),
}

#[derive(Args, Debug)]
pub struct EgressDaemonArgs {
    #[arg(long)]
    pub policy: String,
    /// The container's id, for the audit trail.
    #[arg(long)]
    pub id: String,
    /// The audit file.
    #[arg(long)]
    pub audit: Option<PathBuf>,
    /// The container's own resolver; without one every allowed name fails.
    #[arg(long)]
    pub upstream: Option<std::net::SocketAddr>,
    /// A resolver socket is passed (names in the policy).
    #[arg(long)]
    pub dns: bool,
    /// The namespace's service addresses, never a destination.
    #[arg(long = "own")]
    pub own: Vec<std::net::IpAddr>,
    /// A pidfd or a pipe is passed: the daemon ends when that process
    /// does, or the pipe's writer closes it.
    #[arg(long)]
    pub watch: bool,
    /// Not tied to its parent's life (no parent-death signal).
    #[arg(long)]
    pub detached: bool,
    /// A resolver socket in the workload's namespace and a pool of
    /// sockets connected to its resolver are passed.
    #[arg(long = "workload-dns")]
    pub workload_dns: bool,
    /// The proxy's IPv6 listener is passed.
    #[arg(long)]
    pub proxy6: bool,
    /// The resolver's IPv6 socket is passed.
    #[arg(long)]
    pub dns6: bool,
    /// The container's IPv6 address, which the daemon's own IPv6 sockets
    /// leave from.
    #[arg(long)]
    pub source6: Option<std::net::Ipv6Addr>,
    /// A packet socket to answer neighbour solicitations on is passed, per
    /// `MAC=ADDR,…` (the interface's MAC, the sandbox's own addresses).
    #[arg(long)]
    pub ndp: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SuperviseArgs {
    pub id: String,
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
}

/// A list as runc prints it in JSON: Go marshals an empty (nil) slice as
/// `null`.
pub fn json_list<T: serde::Serialize>(items: &[T]) -> serde_json::Result<String> {
    if items.is_empty() {
        Ok("null".to_string())
    } else {
        serde_json::to_string(items)
    }
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

/// The version output, in runc's shape: `agentvm version X`, `commit:`,
/// `spec:` and the `libseccomp:` linked in (runc also prints `go:`).
pub fn version_text() -> String {
    let seccomp = match libseccomp::ScmpVersion::current() {
        Ok(v) => format!("{}.{}.{}", v.major, v.minor, v.micro),
        Err(e) => format!("unknown ({e})"),
    };
    format!(
        "agentvm version {}\ncommit: {}\nspec: {}\nlibseccomp: {seccomp}\n",
        env!("CARGO_PKG_VERSION"),
        option_env!("AGENTVM_COMMIT").unwrap_or("unknown"),
        oci_spec::runtime::VERSION,
    )
}

/// runc's exit status of a failed `exec` (a foreground exec otherwise exits
/// with its process's status, so a failure to start it must not look like
/// a status of 1).
const EXEC_FAILED: u8 = 255;

/// The command line's entry: parse, log, dispatch, and turn an error into
/// one log line and exit status 1 (255 for `exec`), as runc does.
pub fn main() -> ExitCode {
    // SIGPIPE stays ignored (Rust's default) so that a hook that exits
    // without reading its state, or a closed stdout, is an error we handle
    // rather than our death; workloads get the default back right before
    // their exec (see container::workload).
    let cli = match usage::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if cli.global.version {
        print!("{}", version_text());
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        // As runc: no command shows the help.
        usage::print_help();
        return ExitCode::SUCCESS;
    };
    let guard = match crate::logging::init(
        cli.global.log.as_deref(),
        cli.global.log_format,
        cli.global.debug,
    ) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("agentvm: cannot open log file: {e}");
            return ExitCode::from(1);
        }
    };
    tracing::debug!(
        "agentvm {}: {:?}",
        env!("CARGO_PKG_VERSION"),
        std::env::args_os().skip(1).collect::<Vec<_>>()
    );
    let failed = if matches!(command, Command::Exec(_)) {
        EXEC_FAILED
    } else {
        1
    };
    match dispatch(&cli.global, command) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let msg = one_line(&err);
            tracing::error!("{msg}");
            // As runc: a log that is not stderr gets the line, and stderr
            // the bare message.
            if guard.to_file {
                eprintln!("{msg}");
            }
            ExitCode::from(failed)
        }
    }
}

/// The error and its causes as one line, each cause once: many of the
/// modules' errors show their source in their own message already (and
/// still give it as their source), which `{:#}` would repeat.
fn one_line(err: &anyhow::Error) -> String {
    crate::audit::exec::error_chain(err.as_ref())
}

/// Runs one command; the result is the process exit code.
fn dispatch(global: &GlobalOpts, command: Command) -> anyhow::Result<u8> {
    // Commands that need no state directory.
    match &command {
        Command::Spec(args) => return spec::run(args, global.rootless.as_deref()).map(|_| 0),
        Command::Features(args) => return features::run(global, args).map(|_| 0),
        Command::Check(args) => return check::run(global, args),
        _ => {}
    }
    let ctx = context(global)?;
    match command {
        Command::Create(args) => create::run(&ctx, args).map(|_| 0),
        Command::Start(args) => start::run(&ctx, args).map(|_| 0),
        Command::Run(args) => run::run(&ctx, args),
        Command::State(args) => state::run(&ctx, args).map(|_| 0),
        Command::Kill(args) => kill::run(&ctx, args).map(|_| 0),
        Command::Delete(args) => delete::run(&ctx, args).map(|_| 0),
        Command::List(args) => list::run(&ctx, args).map(|_| 0),
        Command::Ps(args) => ps::run(&ctx, args).map(|_| 0),
        Command::Exec(args) => exec::run(&ctx, args),
        Command::Pause(args) => pause::pause(&ctx, args).map(|_| 0),
        Command::Resume(args) => pause::resume(&ctx, args).map(|_| 0),
        Command::Events(args) => events::run(&ctx, args).map(|_| 0),
        Command::Update(args) => update::run(&ctx, args).map(|_| 0),
        Command::Checkpoint(args) => checkpoint::run(&ctx, args).map(|_| 0),
        Command::Restore(args) => restore::run(&ctx, args),
        Command::Audit(args) => audit::run(&ctx, args).map(|_| 0),
        Command::AuditExport => audit::export(&ctx).map(|_| 0),
        Command::Supervise(args) => {
            crate::microvm::supervisor::run(crate::microvm::supervisor::Args {
                dir: ctx.container_dir(&args.id),
                console_socket: args.console_socket,
                config: ctx.config,
                systemd_cgroup: ctx.systemd_cgroup,
            })
        }
        Command::Pool(args) => pool::run(&ctx, args).map(|_| 0),
        Command::PoolKeeper(args) => {
            crate::microvm::pool::keep(&ctx.root, &ctx.config, &args.slot, args.sync)
        }
        Command::EgressDaemon(args) => egress_daemon(args),
        Command::Spec(_) | Command::Features(_) | Command::Check(_) => {
            unreachable!("handled above")
        }
    }
}

/// `agentvm egress-daemon`: serves on the sockets its parent passed
/// (`egress::daemon::DNS_FD`, `PROXY_FD`).
fn egress_daemon(args: EgressDaemonArgs) -> anyhow::Result<u8> {
    use crate::egress::daemon::{self, Options};
    use std::os::fd::FromRawFd;
    let policy: crate::egress::Policy = args.policy.parse()?;
    let dns = args.dns.then(|| {
        // SAFETY: the parent passes the bound UDP socket as this
        // descriptor when it says --dns, and nothing else here owns it.
        unsafe { std::net::UdpSocket::from_raw_fd(daemon::DNS_FD) }
    });
    // SAFETY: the parent always passes the proxy's listening socket as
    // this descriptor, and nothing else here owns it.
    let proxy = unsafe { std::net::TcpListener::from_raw_fd(daemon::PROXY_FD) };
    let add: crate::egress::resolver::AddElements =
        std::sync::Arc::new(|elements: &str| crate::egress::nft::apply(elements).is_ok());
    let watch = args.watch.then(|| {
        // SAFETY: the parent passes a pidfd as this descriptor when it
        // says --watch, and nothing else here owns it.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(daemon::WATCH_FD) }
    });
    let workload_dns = args.workload_dns.then(|| {
        let take = |fd| {
            // SAFETY: the parent passes these UDP sockets as descriptors
            // WORKLOAD_DNS_FD.. when it says --workload-dns; nothing else
            // here owns them.
            unsafe { std::net::UdpSocket::from_raw_fd(fd) }
        };
        let pool = (1..=daemon::POOL_SIZE)
            .map(|i| take(daemon::WORKLOAD_DNS_FD + i))
            .collect();
        (
            take(daemon::WORKLOAD_DNS_FD),
            std::sync::Arc::new(crate::egress::resolver::SocketPool::new(pool)),
        )
    });
    let proxy6 = args.proxy6.then(|| {
        // SAFETY: the parent passes the IPv6 listener as this descriptor
        // when it says --proxy6, and nothing else here owns it.
        unsafe { std::net::TcpListener::from_raw_fd(daemon::PROXY6_FD) }
    });
    let dns6 = args.dns6.then(|| {
        // SAFETY: the parent passes the IPv6 resolver socket as this
        // descriptor when it says --dns6, and nothing else here owns it.
        unsafe { std::net::UdpSocket::from_raw_fd(daemon::DNS6_FD) }
    });
    if args.ndp.len() > daemon::MAX_NDP as usize {
        anyhow::bail!("at most {} --ndp", daemon::MAX_NDP);
    }
    let mut ndp = Vec::new();
    for (i, d) in args.ndp.iter().enumerate() {
        // SAFETY: the parent passes the i-th --ndp's packet socket as
        // descriptor NDP_FD + i, and nothing else here owns it.
        let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(daemon::NDP_FD + i as i32) };
        ndp.push(crate::ndp::NdpProxy::adopt(sock, d).map_err(anyhow::Error::msg)?);
    }
    if let Some(s) = args.source6 {
        crate::egress::sock::set_source6(s);
    }
    daemon::run(Options {
        proxy6,
        dns6,
        ndp,
        watch,
        detached: args.detached,
        workload_dns,
        policy,
        id: args.id,
        audit: args.audit,
        upstream: args.upstream,
        dns,
        proxy,
        own: args.own,
        add,
    })?;
    Ok(0)
}

/// The state root, the config and the global flags the tiers act on.
fn context(global: &GlobalOpts) -> anyhow::Result<Context> {
    let config = Config::load(global.config.as_deref())?;
    let root = absolute(&global.root).context("cannot read the current directory")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&root)
        .with_context(|| format!("cannot create state root {}", root.display()))?;
    Ok(Context {
        root,
        config,
        isolation_flag: global.isolation,
        egress_flag: global.egress.clone(),
        systemd_cgroup: global.systemd_cgroup,
        config_path: global.config.as_ref().map(|p| absolute(p)).transpose()?,
        log: global.log.as_ref().map(|p| absolute(p)).transpose()?,
        log_json: global.log_format == LogFormat::Json,
    })
}

/// A `--pid-file` made absolute. runc writes it as `<dir>/.<name>` and
/// renames it, so a directory that does not exist fails the command; that
/// is checked here, before anything starts (libcontainer would only warn
/// after the process runs, and the caller would wait for a pid that never
/// comes).
pub fn pid_file(path: Option<&std::path::Path>) -> anyhow::Result<Option<PathBuf>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let path = absolute(path).context("cannot read the current directory")?;
    let dir = path.parent().unwrap_or(std::path::Path::new("/"));
    if !dir.is_dir() {
        anyhow::bail!(
            "cannot write pid file {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(Some(path))
}

/// The one place the command line picks a tier for an existing container:
/// checks the id, takes the container's lock, and returns the tier it was
/// created in.
pub fn open(
    ctx: &Context,
    id: &str,
    mode: Option<crate::state::LockMode>,
) -> anyhow::Result<(Box<dyn Tier>, Option<crate::state::DirLock>)> {
    crate::bundle::validate_id(id)?;
    let lock = match mode {
        Some(m) => Some(crate::state::lock_container(&ctx.root, id, m)?),
        None => None,
    };
    Ok((crate::tier::of_container(ctx, id)?, lock))
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("netlink add an address: {0}")]
    struct Inner(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("egress policy: {0}")]
    struct Outer(#[from] Inner);

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(libc::EACCES);
        let err = anyhow::Error::from(Outer(Inner(io))).context("cannot create container x");
        assert_eq!(
            one_line(&err),
            "cannot create container x: egress policy: netlink add an address: \
             Permission denied (os error 13)"
        );
        let plain = anyhow::anyhow!("no such container").context("cannot start");
        assert_eq!(one_line(&plain), "cannot start: no such container");
    }
}
