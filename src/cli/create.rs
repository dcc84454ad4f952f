//! `agentvm create`

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::bundle::{validate_id, Bundle};
use crate::config::Isolation;
use crate::container::create::CreateOptions;
use crate::context::{absolute, Context};
use crate::state;

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
pub fn create_container(
    ctx: &Context,
    id: &str,
    bundle: &std::path::Path,
    mut opts: CreateOptions,
) -> anyhow::Result<Created> {
    validate_id(id)?;
    let bundle = Bundle::load(&absolute(bundle)?)?;
    let (isolation, source) = ctx
        .config
        .select_isolation(ctx.isolation_flag, bundle.spec.annotations().as_ref())?;
    tracing::debug!(
        "container {id}: isolation {isolation} (from {source}), rootfs {}",
        bundle.rootfs.display()
    );
    if opts.preserve_fds < 0 {
        anyhow::bail!("--preserve-fds must not be negative");
    }
    opts.pid_file = opts.pid_file.map(|p| absolute(&p)).transpose()?;
    opts.console_socket = opts.console_socket.map(|p| absolute(&p)).transpose()?;
    let _root_lock = state::lock_root(&ctx.root)?;
    if ctx.container_dir(id).exists() {
        anyhow::bail!("container with id {id} already exists");
    }
    if isolation == Isolation::Microvm {
        if opts.preserve_fds > 0 {
            anyhow::bail!("--preserve-fds is not supported in the microvm tier");
        }
        crate::microvm::create(
            ctx,
            id,
            &bundle,
            crate::microvm::CreateOptions {
                console_socket: opts.console_socket.as_deref(),
                pid_file: opts.pid_file.as_deref(),
                log: ctx.log.as_deref(),
                log_json: ctx.log_json,
            },
        )
        .with_context(|| {
            format!("cannot create container {id} (isolation microvm, from {source})")
        })?;
        return Ok(Created::Microvm);
    }
    crate::container::create::create(ctx, id, &bundle, opts)
        .map(|c| Created::Container(Box::new(c)))
        .with_context(|| format!("cannot create container {id}"))
}

/// What `create_container` made.
pub enum Created {
    Container(Box<libcontainer::container::Container>),
    Microvm,
}

pub fn run(ctx: &Context, args: CreateArgs) -> anyhow::Result<()> {
    let opts = CreateOptions {
        pid_file: args.pid_file,
        console_socket: args.console_socket,
        preserve_fds: args.preserve_fds,
        no_pivot: args.no_pivot,
        detached: true,
        ..Default::default()
    };
    create_container(ctx, &args.id, &args.bundle, opts)?;
    Ok(())
}
