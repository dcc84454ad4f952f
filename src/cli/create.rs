//! `agentvm create`

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::bundle::{validate_id, Bundle};
use crate::context::{absolute, Context};
use crate::state;
use crate::tier::{CreateRequest, Tier};

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Path to the bundle directory
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    /// Unix socket that receives the pty master when process.terminal is true
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    /// File to write the container's init pid to
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// Do not use pivot_root to jail the process
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    /// Do not create a new session keyring (accepted for compatibility)
    #[arg(long = "no-new-keyring")]
    pub no_new_keyring: bool,
    /// Pass N additional file descriptors (from 3) to the container
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    pub id: String,
}

/// What `create` and `run` share: checks, tier selection, the root lock.
/// Returns the tier that created the container.
pub fn create_container(
    ctx: &Context,
    args: &CreateArgs,
    detached: bool,
) -> anyhow::Result<Box<dyn Tier>> {
    let id = args.id.as_str();
    validate_id(id)?;
    let bundle = Bundle::load(&absolute(&args.bundle)?)?;
    crate::container::bindcheck::check(&bundle.spec, &bundle.rootfs)?;
    let (isolation, source) = ctx
        .config
        .select_isolation(ctx.isolation_flag, bundle.spec.annotations().as_ref())?;
    tracing::debug!(
        "container {id}: isolation {isolation} (from {source}), rootfs {}",
        bundle.rootfs.display()
    );
    let annotations = bundle.spec.annotations().as_ref();
    let (egress, egress_source) = crate::egress::Policy::select(
        ctx.egress_flag.as_deref(),
        annotations
            .and_then(|a| a.get(crate::egress::EGRESS_ANNOTATION))
            .map(String::as_str),
        ctx.config.egress.policy.as_deref(),
        ctx.config.egress.locked,
    )
    .with_context(|| format!("cannot create container {id}"))?;
    if !egress.is_allow() {
        tracing::debug!(
            "container {id}: egress policy {egress} (from {})",
            egress_source.as_str()
        );
    }
    if args.preserve_fds < 0 {
        anyhow::bail!("--preserve-fds must not be negative");
    }
    let pid_file = super::pid_file(args.pid_file.as_deref())?;
    let console_socket = args.console_socket.as_deref().map(absolute).transpose()?;
    let _root_lock = state::lock_root(&ctx.root)?;
    if ctx.container_dir(id).exists() {
        anyhow::bail!("container with id {id} already exists");
    }
    let tier = crate::tier::for_isolation(isolation);
    tier.create(
        ctx,
        &CreateRequest {
            id,
            bundle: &bundle,
            console_socket: console_socket.as_deref(),
            pid_file: pid_file.as_deref(),
            preserve_fds: args.preserve_fds,
            no_pivot: args.no_pivot,
            detached,
            egress: &egress,
        },
    )
    .with_context(|| {
        format!("cannot create container {id} (isolation {isolation}, from {source})")
    })?;
    drop(_root_lock);
    ensure_audit_exporter(ctx);
    if isolation == crate::config::Isolation::Microvm {
        super::pool::refill(ctx);
    }
    Ok(tier)
}

pub fn run(ctx: &Context, args: CreateArgs) -> anyhow::Result<()> {
    create_container(ctx, &args, true)?;
    Ok(())
}

/// Starts the host's audit exporter when the config names an OTLP
/// endpoint and none runs (`audit::export`); never fails the command.
pub fn ensure_audit_exporter(ctx: &Context) {
    crate::audit::export::ensure_running(&ctx.config, ctx.config_path.as_deref());
}
