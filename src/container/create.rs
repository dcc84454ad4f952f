//! `create` in the container tier.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;

use super::idmap::MapHelpers;
use super::workload::Workload;
use super::{cgroups, console, cwd, fixup, hooks, lc_error, lsm, overlay, ContainerError};
use crate::bundle::Bundle;
use crate::config::Isolation;
use crate::context::Context;
use crate::state::{process_start_time, Record};

/// Everything `create` and `run` take from the command line.
#[derive(Default)]
pub struct CreateOptions {
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub preserve_fds: i32,
    pub no_pivot: bool,
    /// False for a foreground `run` without a console socket of the
    /// caller's: the terminal, if any, is then ours to relay.
    pub detached: bool,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// An egress policy other than `allow`, and the audit trail.
    pub egress: Option<(crate::egress::Policy, PathBuf)>,
    /// The caller knows the cgroup cannot exist yet (the first container
    /// of a freshly booted microVM's guest), so it is not checked for
    /// being frozen or holding processes.
    pub fresh_cgroup: bool,
    /// The spec's seccomp profile has runc's ENOSYS rule already (the
    /// microvm tier adds it on the host): it is not worked out again.
    pub enosys_added: bool,
}

/// Creates the container; on any failure removes what was made for it. The
/// caller holds the root lock and has checked that the id is free.
pub fn create(
    ctx: &Context,
    id: &str,
    bundle: &Bundle,
    mut opts: CreateOptions,
) -> Result<Container, ContainerError> {
    // Where the time goes, at debug level (in a microVM's guest:
    // `AGENTVM_GUEST_LOG=agentvm=debug` in the supervisor's environment).
    let started = std::time::Instant::now();
    let step =
        |what: &str| tracing::debug!(id, "create: {what} at {} us", started.elapsed().as_micros());
    // Before libcontainer starts anything: it ignores SELinux labels, and
    // its init changes to the cwd before it waits for `start`.
    lsm::check_spec(&bundle.spec, lsm::selinux_enabled())?;
    cgroups::refuse_unified_on_v1(&bundle.spec)?;
    cwd::ensure(&bundle.spec, &bundle.rootfs)?;
    let dir = ctx.container_dir(id);
    let egress = opts.egress.take();
    // As runc: the hooks run at create (prestart, createRuntime) run in the
    // bundle directory, and a relative path in the spec resolves there.
    std::env::set_current_dir(&bundle.path).map_err(|source| ContainerError::Chdir {
        path: bundle.path.clone(),
        source,
    })?;
    // What libcontainer is handed instead of the bundle's config: hooks
    // that fail in runc's words, runc's ENOSYS for system calls newer than
    // the seccomp profile, and runc's cgroup without cgroupsPath.
    let hook_errors = hooks::message_file(&ctx.root, id);
    let _ = std::fs::remove_file(&hook_errors);
    let mut spec = bundle.spec.clone();
    let exe = std::env::current_exe().map_err(|e| {
        ContainerError::Libcontainer(format!("cannot find this program's path: {e}"))
    })?;
    hooks::wrap(&mut spec, &exe, &hook_errors);
    // runc reads `noNewPrivileges: false` as no field at all. libcontainer
    // puts the seccomp filter on before it drops the capabilities only
    // when the field is absent: with `false` it loaded the filter after,
    // without CAP_SYS_ADMIN, and `create` failed ("failed to load seccomp
    // context") where runc runs the container.
    if let Some(process) = spec
        .process_mut()
        .as_mut()
        .filter(|p| p.no_new_privileges() == Some(false))
    {
        process.set_no_new_privileges(None);
    }
    if let Some(seccomp) = spec
        .linux_mut()
        .as_mut()
        .and_then(|l| l.seccomp_mut().as_mut())
        .filter(|_| !opts.enosys_added)
    {
        super::enosys::add_rule(seccomp);
    }
    if !ctx.systemd_cgroup {
        let path = cgroups::resolve_path(&mut spec, id);
        if !opts.fresh_cgroup {
            cgroups::refuse_frozen(&path)?;
            cgroups::warn_if_populated(&path);
        }
    }
    // libcontainer cannot mount a co-mounted v1 hierarchy in a cgroup
    // namespace: the runtime mounts them itself (see cgroupns).
    let cgroup_mounts = super::cgroupns::take_over(&mut spec)?;
    // Bind sources the user namespace cannot reach are opened here, as
    // runc opens them, and attached by the runtime (see binds).
    let staged_binds = super::binds::take_over(&mut spec)?;
    step("checks done");
    let result = {
        let _helpers = MapHelpers::install(&bundle.spec, &ctx.root)?;
        // libcontainer reads config.json: it gets ours when it differs.
        let overlay = if spec == bundle.spec && !bundle.edited {
            None
        } else {
            let json = serde_json::to_vec(&spec).map_err(|e| {
                ContainerError::Libcontainer(format!("cannot encode the config: {e}"))
            })?;
            let scratch = ctx.root.join(format!(".{id}.config.json"));
            // Without one (no CAP_SYS_ADMIN) libcontainer reads the bundle's
            // config: its own hook messages and cgroup name.
            match overlay::Overlay::install(&bundle.path, &json, &scratch) {
                Ok(o) => Some(o),
                Err(e) => {
                    tracing::warn!("container {id}: {e}; libcontainer reads the bundle's config");
                    None
                }
            }
        };
        let through = overlay.as_ref().map(|o| o.bundle());
        step("overlay done");
        let built = build(ctx, id, bundle, through, opts);
        step("libcontainer done");
        drop(overlay);
        built.map_err(|e| match hooks::take_message(&hook_errors) {
            Some(msg) => ContainerError::Hook(msg),
            None => e,
        })
    };
    match result {
        Ok(container) => {
            if let Err(e) = fix_up(&container, bundle, cgroup_mounts.as_ref(), &staged_binds) {
                discard(ctx, id, &container);
                return Err(e);
            }
            step("fix-ups done");
            if let Some((policy, audit)) = &egress {
                if let Err(e) = enforce(&container, bundle, policy, audit) {
                    discard(ctx, id, &container);
                    return Err(e);
                }
            }
            let record = Record {
                isolation: Isolation::Container,
                init_start_time: container.pid().and_then(|p| process_start_time(p.as_raw())),
            };
            if let Err(e) = record.save(&ctx.root, id) {
                discard(ctx, id, &container);
                return Err(e.into());
            }
            step("saved");
            if tracing::enabled!(tracing::Level::DEBUG) {
                let faults = |who| {
                    nix::sys::resource::getrusage(who)
                        .map(|u| (u.major_page_faults(), u.minor_page_faults()))
                        .unwrap_or_default()
                };
                tracing::debug!(
                    id,
                    "create: page faults (major, minor): this process {:?}, its children {:?}",
                    faults(nix::sys::resource::UsageWho::RUSAGE_SELF),
                    faults(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
                );
            }
            Ok(container)
        }
        Err(e) => {
            // libcontainer removes its own work when the clone fails, but not
            // when it fails earlier (console socket, config save).
            if dir.exists() {
                if let Err(rm) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!("cannot remove {}: {rm}", dir.display());
                }
            }
            Err(e)
        }
    }
}

/// `through`: the bundle path to give libcontainer when it is to read a
/// config of ours (see `overlay`).
fn build(
    ctx: &Context,
    id: &str,
    bundle: &Bundle,
    through: Option<&std::path::Path>,
    opts: CreateOptions,
) -> Result<Container, ContainerError> {
    let mut builder = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_executor(Workload::default())
        .with_root_path(&ctx.root)
        .map_err(lc_error)?
        .with_pid_file(opts.pid_file.as_ref())
        .map_err(lc_error)?
        .with_console_socket(opts.console_socket.as_ref())
        .with_preserved_fds(opts.preserve_fds);
    if let Some(fd) = opts.stdin {
        builder = builder.with_stdin(fd);
    }
    if let Some(fd) = opts.stdout {
        builder = builder.with_stdout(fd);
    }
    if let Some(fd) = opts.stderr {
        builder = builder.with_stderr(fd);
    }
    builder
        .validate_id()
        .map_err(lc_error)?
        .as_init(through.unwrap_or(&bundle.path))
        .with_systemd(ctx.systemd_cgroup)
        .with_detach(opts.detached)
        .with_no_pivot(opts.no_pivot)
        .build()
        .map_err(lc_error)
}

/// The created container's init.
fn init_pid(container: &Container) -> Result<i32, ContainerError> {
    Ok(container
        .pid()
        .ok_or_else(|| {
            ContainerError::Libcontainer("the created container has no init pid".into())
        })?
        .as_raw())
}

/// What libcontainer left out, done while the init waits for `start`: the
/// mounts' flags and propagation, loopback in a new network namespace, the
/// terminal's size and owner, and a disabled OOM killer.
fn fix_up(
    container: &Container,
    bundle: &Bundle,
    cgroup_mounts: Option<&super::cgroupns::TakeOver>,
    staged_binds: &[super::binds::Staged],
) -> Result<(), ContainerError> {
    let pid = init_pid(container)?;
    cgroups::apply_oom_killer(container, &bundle.spec)?;
    if let Some(taken) = cgroup_mounts {
        super::cgroupns::mount(pid, taken)?;
    }
    super::binds::attach(pid, staged_binds)?;
    fixup::apply(pid, &fixup::plan(&bundle.spec))?;
    if fixup::new_network_namespace(&bundle.spec) {
        fixup::loopback_up(pid)?;
    }
    if let Some((rows, cols)) = console::wanted(bundle.spec.process().as_ref())? {
        console::apply_to_init(pid, rows, cols)?;
    }
    console::chown_init_terminal(pid, &bundle.spec)?;
    Ok(())
}

/// Puts the created container behind its egress policy's router, before
/// its workload can send a packet.
fn enforce(
    container: &Container,
    bundle: &Bundle,
    policy: &crate::egress::Policy,
    audit: &std::path::Path,
) -> Result<(), ContainerError> {
    let pid = init_pid(container)?;
    super::egress::enforce(
        &container.root,
        container.id(),
        pid,
        &bundle.spec,
        &bundle.rootfs,
        policy,
        audit,
    )?;
    Ok(())
}

/// Undoes a container that was created but cannot be kept.
fn discard(ctx: &Context, id: &str, container: &Container) {
    let mut c = container.clone();
    if let Err(e) = super::delete::delete(&mut c, true) {
        tracing::warn!("cannot clean up container {id}: {e}");
    }
    let dir = ctx.container_dir(id);
    if dir.exists() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
