//! The per-container supervisor: the host process whose life is the
//! container's life (its pid is what `create` writes to `--pid-file`).
//!
//! It sets itself up in the spec's network namespace and cgroup, stages the
//! share, starts the VMM, brings the guest agent to "created", then relays
//! stdio, signals and CLI requests until the workload exits, and exits with
//! the workload's status (128 + the signal when it was killed, by `exit`:
//! the host process never raises a signal the guest names).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::host::{Accel, Host};
use super::vmm::{Vm, VmConfig};
use super::vmstate::{Status, VmState, CONSOLE_LOG};
use crate::config::Config;
use crate::protocol::{Frame, GuestMessage, HostMessage, Reply, VERSION};
use crate::state::process_start_time;

pub mod guest_log;
pub mod jail;
mod relays;
mod serve;
pub use serve::run_hooks as run_hooks_public;
pub use serve::wait_reply;
pub mod stage;
pub mod trace;
pub mod tty;

/// The socket, in the state directory, that the VMM joins to the guest's
/// control port.
pub(crate) const CONTROL_SOCKET: &str = "ctl.sock";

/// The fd on which `create` waits for "ready" or an error.
pub const SYNC_FD: i32 = 3;
/// Exit status when the VM ends without the workload's status (guest
/// kernel panic, VMM crash, broken control channel).
pub const VM_LOST_STATUS: i32 = 255;

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error(transparent)]
    Stage(#[from] stage::StageError),
    #[error(transparent)]
    Host(#[from] super::host::HostError),
    #[error(transparent)]
    Vmm(#[from] super::vmm::VmmError),
    #[error(transparent)]
    VmmChoice(#[from] super::vmm::choice::ChoiceError),
    #[error(transparent)]
    Plan(#[from] super::spec::SpecError),
    #[error(transparent)]
    Net(#[from] super::net::NetError),
    #[error(transparent)]
    Egress(#[from] crate::egress::PolicyError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error(transparent)]
    Tty(#[from] tty::TtyError),
    #[error("guest: {0}")]
    Guest(String),
    /// The guest sent something that is not the protocol: it is not
    /// trusted further and the VM is killed.
    #[error("guest protocol violation: {0}")]
    Violation(String),
    /// Boot failed while talking to the guest; the last lines of its
    /// console (sanitised, bounded) say why the guest went away.
    #[error("{error}; the guest's console ended with: {console}")]
    WithConsole {
        error: Box<SupervisorError>,
        console: String,
    },
    #[error("the guest did not boot within {secs}s ({detail}); console log: {console}")]
    BootTimeout {
        secs: u64,
        detail: String,
        console: PathBuf,
    },
    #[error(transparent)]
    Spec(#[from] crate::bundle::BundleError),
    /// An OCI hook failed; the message names the hook.
    #[error("{0}")]
    Hook(String),
    #[error("process.terminal is true but no --console-socket was given")]
    NoConsoleSocket,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let what = what.into();
    move |source| SupervisorError::Io { what, source }
}

impl From<crate::protocol::ProtocolError> for SupervisorError {
    fn from(e: crate::protocol::ProtocolError) -> SupervisorError {
        if e.is_violation() {
            SupervisorError::Violation(e.to_string())
        } else {
            SupervisorError::Guest(e.to_string())
        }
    }
}

pub struct Args {
    pub dir: PathBuf,
    pub console_socket: Option<PathBuf>,
    pub config: Config,
    /// `--systemd-cgroup`: the spec's cgroupsPath is `slice:prefix:name`
    /// and the VM's cgroup is a systemd scope, as in the container tier.
    pub systemd_cgroup: bool,
}

/// Reports the outcome of boot to the waiting `create`, once.
struct Sync(Option<File>);

impl Sync {
    fn send(&mut self, line: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// Entry point of `agentvm supervise`. Never returns normally: it exits
/// with the workload's status.
pub fn run(args: Args) -> ! {
    // The VMM and file server must not inherit the sync pipe, or `create`
    // would never see it close.
    // SAFETY: fcntl on a descriptor number; no memory is passed.
    unsafe { libc::fcntl(SYNC_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: `create` passes the write end of its sync pipe as SYNC_FD and
    // nothing else in this process uses that descriptor.
    let mut sync = Sync(Some(File::from(unsafe { OwnedFd::from_raw_fd(SYNC_FD) })));
    // A further container of a pod: its relay into the sandbox's VM.
    if VmState::load(&args.dir).is_ok_and(|s| s.pod_sandbox.is_some()) {
        let status = super::pod::relay(&args, &mut |outcome| match outcome {
            Ok(()) => sync.send("ok\n"),
            Err(msg) => sync.send(&format!("error {msg}\n")),
        });
        exit_like(status)
    }
    let status = match boot(&args) {
        Ok(booted) => {
            sync.send("ok\n");
            serve::serve(&args, booted)
        }
        Err(e) => {
            let msg = format!("{e}");
            tracing::error!("{msg}");
            // The whole pipe is the answer (create reads it to its end):
            // the message keeps its newlines.
            sync.send(&format!("error {msg}\n"));
            1
        }
    };
    exit_like(status)
}

/// A VM whose guest has created the container.
pub struct Booted {
    pub vm: Box<dyn Vm>,
    pub guest: UnixStream,
    pub terminal: Option<tty::HostPty>,
    pub state: VmState,
    /// The CLI socket, bound before `create` is told the container exists,
    /// so a `start` right after `create` finds it.
    pub cli: UnixListener,
    pub guest_log: guest_log::GuestLog,
    /// The host side of the DNS relay, started once the jail is on.
    pub dns: Option<super::net::HostDnsRelay>,
    /// IPv6 neighbour answers on the taps, started once the jail is on.
    pub ndp: Vec<crate::ndp::NdpProxy>,
    /// The egress policy's daemon, if there is a policy.
    pub egress: Option<EgressDaemon>,
    /// How much of the VM's RAM the guest may use, where a balloon sets it
    /// (the VM booted with `microvm.memory_ceiling_mib`).
    pub guest_ram: Option<GuestRam>,
    /// The guest's interface names, one per NIC in order (for the VMM's
    /// counters in `events --stats`).
    pub nic_names: Vec<String>,
    /// The spec's startContainer hooks, which `start` runs in the guest.
    pub start_hooks: Option<super::client::StartHooks>,
}

/// The guest's share of its VM's RAM, and the VMM's control of it.
pub struct GuestRam {
    pub control: Box<dyn super::vmm::GuestRam>,
    pub current_mib: u64,
    pub vm_mib: u64,
}

/// The egress daemon, and the pipe whose closing ends it.
pub struct EgressDaemon {
    child: std::process::Child,
    end: std::os::fd::OwnedFd,
}

impl EgressDaemon {
    /// Tells it to end — it writes the flows still open to the audit
    /// trail first — and waits for it a moment (it dies with the
    /// supervisor in any case).
    pub fn end(self) {
        let EgressDaemon { mut child, end } = self;
        drop(end);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                _ => return,
            }
        }
    }
}

fn boot(args: &Args) -> Result<Booted, SupervisorError> {
    let dir = &args.dir;
    let mut trace = trace::BootTrace::new(Instant::now());
    let mut state = VmState::load(dir)?;
    let spec = state.spec()?;
    // The same choice `create` made from the same config and annotations.
    let vmm =
        super::vmm::choice::for_container(args.config.microvm.vmm, spec.annotations().as_ref())?;
    let host = Host::probe(&args.config, vmm.backend)?;

    stage::private_mounts()?;
    stage::network(&spec)?;
    state.systemd_cgroup = args.systemd_cgroup;
    state.cgroup_path = stage::cgroup(&spec, &state.id, args.systemd_cgroup)?;
    state.supervisor_pid = Some(std::process::id() as i32);
    state.supervisor_start_time = process_start_time(std::process::id() as i32);
    state.accel = host.accel.as_str().to_string();
    state.vmm = vmm.backend.as_str().to_string();
    state.save(dir)?;
    trace.mark("setup");
    let plan = super::spec::plan(&spec, &state.bundle, &state.rootfs, &args.config)?;
    for w in &plan.warnings {
        tracing::warn!("container {}: {w}", state.id);
    }
    let cmdline = super::pool::guest_cmdline(&host);
    // Docker's prestart hook only fills the (still empty) namespace with
    // the container's interface: the VM boots meanwhile, or a pooled one
    // is taken, with the one NIC Docker gives a container.
    let mut ahead = if hooks_only_fill_the_network(&spec) {
        boot_ahead(
            args,
            &state,
            &spec,
            &host,
            &cmdline,
            &plan,
            vmm.backend,
            &mut trace,
        )?
    } else {
        None
    };
    // A VM booted ahead staged the share, even if it is given up.
    let share_staged = matches!(
        ahead.as_ref().and_then(|a| a.vm.as_ref()),
        Some(AheadVm::Booting(_))
    );
    // Any error from here on drops `ahead`, which kills its VM.
    serve::run_hooks(&spec, &state, &["prestart", "createRuntime"])
        .map_err(SupervisorError::Hook)?;
    trace.mark("hooks");
    // The hooks have put Docker's or CNI's interfaces in the namespace.
    if ahead.is_some() && super::net::guest_nics().unwrap_or(usize::MAX) > super::pool::NICS {
        tracing::info!(
            "container {}: the hooks made more NICs than the VM booted beside them has: \
             booting one with them all",
            state.id
        );
        drop(ahead.take());
    }
    let egress: crate::egress::Policy = state.egress.parse()?;
    let dns_mode = if egress.is_allow() {
        super::net::DnsMode::Relay
    } else if egress.has_names() {
        super::net::DnsMode::Resolver
    } else {
        super::net::DnsMode::None
    };
    // A VM booted before the container, when one fits: its NIC's tap is
    // moved into this namespace as the one plumb would make.
    let claim = match ahead {
        Some(_) => None,
        None => claim_pooled(args, &state, &spec, &host, &cmdline, &plan, vmm.backend),
    };
    let boot_macs = match (&ahead, &claim) {
        (Some(a), _) => Some(a.nic_macs.clone()),
        (None, Some(c)) => Some(c.nic_macs.clone()),
        (None, None) => None,
    };
    let sandbox = match boot_macs {
        Some(_) => super::net::Sandbox::MadeTaps,
        None => super::net::Sandbox::Taps,
    };
    let mut plumbed = super::net::plumb(
        super::net::resolv_conf(&spec, &state.rootfs).as_deref(),
        dns_mode,
        !egress.is_allow(),
        sandbox,
    )?;
    for w in &plumbed.warnings {
        tracing::warn!("container {}: {w}", state.id);
    }
    for (iface, mac) in plumbed
        .guest
        .interfaces
        .iter_mut()
        .zip(boot_macs.iter().flatten())
    {
        iface.boot_mac = Some(mac.clone());
    }
    // Before the guest exists, so its first packet meets them.
    let sources = plumbed.sources(super::net::Sandbox::Taps);
    if let Some(rules) = crate::egress::ruleset(
        &egress,
        super::net::TAP_PREFIX,
        super::net::DNS_RELAY,
        plumbed.proxy6.as_ref().map(|_| super::net::SERVICE6),
        &sources,
    ) {
        plumbed.install_egress(&rules)?;
    }
    // The policy's resolver, proxy and log reader run beside the
    // supervisor, unjailed enough to add the addresses it resolves to the
    // rules' sets.
    let egress_daemon = match plumbed.proxy.take() {
        Some(proxy) => {
            let dns = match dns_mode {
                super::net::DnsMode::Resolver => plumbed.dns.take(),
                _ => None,
            };
            // Closing the write end tells the daemon to write what it
            // still holds and end.
            let (end_read, end_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| io_error("cannot make the egress daemon's pipe")(e.into()))?;
            let child = super::net::EgressDaemon {
                policy: &state.egress,
                id: &state.id,
                audit: &args.config.audit.path(),
                dns,
                proxy,
                proxy6: plumbed.proxy6.take(),
                dns6: plumbed.dns6.take(),
                source6: plumbed.source6,
                ndp: Vec::new(),
                run_dir: dir,
                life: super::net::DaemonLife::WithParent(end_read.as_fd()),
                workload_dns: None,
            }
            .spawn()?;
            Some(EgressDaemon {
                child,
                end: end_write,
            })
        }
        None => None,
    };

    trace.mark("network");
    if plan.root_readonly() {
        stage::mount_points(&spec, &state.bundle, &state.rootfs)?;
    }
    let terminal = spec
        .process()
        .as_ref()
        .and_then(|p| p.terminal())
        .unwrap_or(false);
    let host_pty = match (&args.console_socket, terminal) {
        (Some(sock), true) => {
            let pty = tty::HostPty::open_and_send(sock)?;
            // The supervisor leads its own session (see create).
            pty.take_as_controlling();
            Some(pty)
        }
        (None, true) => return Err(SupervisorError::NoConsoleSocket),
        _ => None,
    };

    // The network and the container's spec go out as soon as the VMM
    // connects the control port, before the agent says Hello (or at once
    // to a pooled VM's agent, which said it): the agent answers them in
    // order.
    let mut early = Vec::new();
    if !plumbed.guest.interfaces.is_empty() {
        early.push(Early {
            what: "network",
            msg: HostMessage::Network {
                network: plumbed.guest.clone(),
            },
            expected: |r| matches!(r, Reply::Ok),
        });
    }
    early.push(Early {
        what: "create",
        msg: HostMessage::Create {
            spec: Box::new(plan.spec.clone()),
        },
        expected: |r| matches!(r, Reply::Created { .. }),
    });
    let timeout = args.config.microvm.boot_timeout();
    let mut guest_log = guest_log::GuestLog::new(Instant::now());
    let console_log = dir.join(CONSOLE_LOG);
    let taken = match (ahead.as_mut().and_then(|a| a.vm.take()), claim) {
        (Some(AheadVm::Booting(starting)), _) => {
            let launched = starting.handshake(args, &early, &mut guest_log)?;
            // The hooks and the network ran while it booted: the rest of
            // its boot is one part.
            trace.mark(trace::GUEST_BOOT);
            Some(launched)
        }
        (Some(AheadVm::Pooled(p)), _) => Some(send_early(p, &early, &console_log)?),
        (None, Some(c)) => match pooled_vm(args, &state, c, &plan) {
            Some(p) => {
                trace.mark("pool");
                Some(send_early(p, &early, &console_log)?)
            }
            // Its tap went with it: a VM booted now would have no NIC.
            None if !plumbed.guest.interfaces.is_empty() => {
                return Err(SupervisorError::Guest(
                    "the pooled VM taken for this container failed to move in (see the log)".into(),
                ));
            }
            None => None,
        },
        (None, None) => None,
    };
    let launched = match taken {
        Some(launched) => launched,
        None => launch(
            args,
            &state,
            &host,
            cmdline,
            &plan,
            &plumbed,
            &early,
            share_staged,
            &mut trace,
            &mut guest_log,
        )?,
    };
    let Launched {
        mut vm,
        mut guest,
        guest_ram,
    } = launched;
    for request in &early {
        if let Err(e) = request.answered(&mut guest, timeout, &mut guest_log) {
            vm.kill();
            return Err(with_console(e, &console_log));
        }
        if matches!(request.msg, HostMessage::Network { .. }) {
            trace.mark("guest network");
        }
    }
    trace.mark("container");
    // createContainer hooks resolve in the runtime's namespaces and run in
    // the container's: for a VM, the host side of those is the supervisor,
    // which is in the container's network namespace and cgroup (what runs
    // in the guest kernel cannot be reached from a host binary).
    if let Err(e) = serve::run_hooks(&spec, &state, &["createContainer"]) {
        vm.kill();
        return Err(SupervisorError::Hook(e));
    }
    let cli_path = dir.join(super::vmstate::SUPERVISOR_SOCKET);
    let cli = match super::sock::bind(dir, super::vmstate::SUPERVISOR_SOCKET) {
        Ok(l) => l,
        Err(e) => {
            vm.kill();
            return Err(io_error(format!("cannot listen on {}", cli_path.display()))(e));
        }
    };
    let nic_names = plumbed
        .guest
        .interfaces
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let super::net::Kept { dns, ndp, restore } = plumbed.keep();
    state.netns = super::spec::netns_path(&spec);
    state.net_restore = restore;
    state.status = Status::Created;
    state.vcpus = plan.vcpus;
    state.memory_mib = plan.memory_mib;
    trace.mark("finish");
    tracing::debug!("container {}: boot trace: {}", state.id, trace.summary());
    state.boot = trace.parts().to_vec();
    if let Some(c) = vm.counters().map(|c| c.read()) {
        state.first_instruction_us = c.first_instruction_us;
        state.first_instruction_steps = c
            .first_instruction_steps
            .into_iter()
            .map(|(part, us)| trace::BootPart { part, us })
            .collect();
    }
    state.save(dir)?;
    let start_hooks = super::client::StartHooks::of(&spec, &state);
    Ok(Booted {
        vm,
        guest,
        terminal: host_pty,
        state,
        cli,
        guest_log,
        dns,
        ndp,
        egress: egress_daemon,
        guest_ram,
        nic_names,
        start_hooks,
    })
}

/// A VM whose guest agent said Hello, with the container's requests sent.
struct Launched {
    vm: Box<dyn Vm>,
    guest: UnixStream,
    guest_ram: Option<GuestRam>,
}

/// Claims a VM of the pool (`microvm::pool`) for this container when the
/// pool is on, holds one of this container's key, and the container needs
/// at most the one NIC a pooled VM has; `None` boots one.
fn claim_pooled(
    args: &Args,
    state: &VmState,
    spec: &oci_spec::runtime::Spec,
    host: &Host,
    cmdline: &str,
    plan: &super::spec::GuestPlan,
    backend: super::vmm::choice::BackendKind,
) -> Option<super::pool::Claim> {
    if args.config.microvm.pool_size() == 0 {
        return None;
    }
    let nics = super::net::guest_nics().unwrap_or(usize::MAX);
    let pod_sandbox = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(super::spec::CRI_CONTAINER_TYPE))
        .is_some_and(|t| t == "sandbox");
    let why_not = if pod_sandbox {
        // Its members' mounts are attached in the supervisor's mount
        // namespace, which a pooled VM's file server does not see.
        Some("it is a pod's sandbox")
    } else if nics > super::pool::NICS {
        Some("it needs more NICs than a pooled VM has")
    } else if backend != super::vmm::choice::BackendKind::Qemu {
        Some("its VMM is not qemu")
    } else {
        None
    };
    if let Some(why) = why_not {
        tracing::info!("container {}: no pooled VM: {why}", state.id);
        return None;
    }
    let root = args.dir.parent()?;
    let key = super::pool::Key::new(
        host,
        cmdline,
        plan.vcpus,
        plan.memory_mib,
        plan.guest_ram_mib.is_some(),
    );
    let claim = super::pool::claim(root, &key);
    if claim.is_none() {
        tracing::info!("container {}: no pooled VM of its key waits", state.id);
    }
    claim
}

/// Moves a claimed VM in: the container's mounts reach its share, it and
/// its keeper join the container's cgroup. `None` (the VM given up) boots
/// one.
fn pooled_vm(
    args: &Args,
    state: &VmState,
    claim: super::pool::Claim,
    plan: &super::spec::GuestPlan,
) -> Option<Launched> {
    let cgroup = state.cgroup_path.clone();
    let mut join = |pid: i32| {
        stage::join_cgroup(&cgroup, args.systemd_cgroup, &state.id, pid).map_err(|e| e.to_string())
    };
    match super::pool::move_in(claim, &args.dir, &plan.staged, &mut join) {
        Ok((mut vm, guest, _)) => {
            // The balloon leaves the guest what this container's limit
            // needs, before the guest applies the limit.
            let guest_ram = match set_guest_ram(&mut vm, plan) {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("container {}: pooled VM's balloon: {e}", state.id);
                    vm.kill();
                    return None;
                }
            };
            tracing::info!("container {}: took a pooled microVM", state.id);
            Some(Launched {
                vm: Box::new(vm),
                guest,
                guest_ram,
            })
        }
        Err(e) => {
            tracing::warn!("container {}: cannot take a pooled VM: {e}", state.id);
            None
        }
    }
}

/// Sets the balloon of a VM booted with the configured ceiling so that
/// the guest has what the container's limit needs (the balloon holds the
/// rest until an update); `None` when the VM has no balloon.
fn set_guest_ram(
    vm: &mut dyn Vm,
    plan: &super::spec::GuestPlan,
) -> Result<Option<GuestRam>, super::vmm::VmmError> {
    let (Some(mib), Some(mut control)) = (plan.guest_ram_mib, vm.take_guest_ram()) else {
        return Ok(None);
    };
    control.set_guest_ram(mib)?;
    Ok(Some(GuestRam {
        control,
        current_mib: mib,
        vm_mib: plan.memory_mib,
    }))
}

/// Boots the container's VM: stages the share, launches the VMM and waits
/// for the agent's Hello, sending `early` as soon as the control port is
/// connected.
#[allow(clippy::too_many_arguments)]
fn launch(
    args: &Args,
    state: &VmState,
    host: &Host,
    cmdline: String,
    plan: &super::spec::GuestPlan,
    plumbed: &super::net::Plumbed,
    early: &[Early],
    share_staged: bool,
    trace: &mut trace::BootTrace,
    guest_log: &mut guest_log::GuestLog,
) -> Result<Launched, SupervisorError> {
    let nics = plumbed.nics.clone();
    let starting = start_vm(args, state, host, cmdline, plan, nics, share_staged, trace)?;
    let (launched, milestones) = starting.handshake_with_milestones(args, early, guest_log)?;
    trace.guest_booted(milestones);
    Ok(launched)
}

/// A VM whose VMM runs and whose agent has not been waited for yet.
struct Starting {
    vm: Box<dyn Vm>,
    listener: UnixListener,
    console_log: PathBuf,
    guest_ram: Option<GuestRam>,
}

/// Stages the share (unless `share_staged`: a VM booted ahead of the
/// hooks and given up did) and launches the VMM with `nics`.
#[allow(clippy::too_many_arguments)]
fn start_vm(
    args: &Args,
    state: &VmState,
    host: &Host,
    cmdline: String,
    plan: &super::spec::GuestPlan,
    nics: Vec<super::net::Nic>,
    share_staged: bool,
    trace: &mut trace::BootTrace,
) -> Result<Starting, SupervisorError> {
    let dir = &args.dir;
    let share_dir = dir.join("share");
    if !share_staged {
        stage::share(&share_dir, &plan.staged)?;
        stage::agent(&share_dir, host.guest_agent.as_deref())?;
    }
    let listener = super::sock::bind(dir, CONTROL_SOCKET)
        .map_err(io_error("cannot listen on the control socket"))?;
    let config = VmConfig {
        name: state.id.clone(),
        kernel: host.kernel.clone(),
        initramfs: None,
        cmdline,
        vcpus: plan.vcpus,
        memory_mib: plan.memory_mib,
        balloon: plan.guest_ram_mib.is_some(),
        share_dir,
        control_socket: CONTROL_SOCKET.into(),
        console_log: dir.join(CONSOLE_LOG),
        run_dir: dir.clone(),
        kvm: host.accel == Accel::Kvm,
        nics,
        vmm_user: super::vmm::jail::Identity::for_supervisor(
            args.config.microvm.vmm_uid_base(),
            std::process::id(),
        ),
    };
    let backend = super::vmm::for_host(host);
    tracing::info!(
        "container {}: booting {} vCPU / {} MiB microVM with {} ({}: {})",
        state.id,
        config.vcpus,
        config.memory_mib,
        backend.name(),
        host.accel.as_str(),
        host.accel_reason
    );
    trace.mark("share");
    let mut vm = backend.launch(&config)?;
    // A VM booted with the configured ceiling starts its guest with what
    // the limit needs; the balloon holds the rest until an update.
    let guest_ram = match set_guest_ram(vm.as_mut(), plan) {
        Ok(g) => g,
        Err(e) => {
            vm.kill();
            return Err(e.into());
        }
    };
    trace.mark("vmm launch");
    Ok(Starting {
        vm,
        listener,
        console_log: config.console_log,
        guest_ram,
    })
}

impl Starting {
    /// Waits for the agent's Hello, sending `early` as soon as the control
    /// port is connected; kills the VM on failure.
    fn handshake_with_milestones(
        mut self,
        args: &Args,
        early: &[Early],
        guest_log: &mut guest_log::GuestLog,
    ) -> Result<(Launched, Option<crate::protocol::GuestBoot>), SupervisorError> {
        let handshaken = handshake(
            &self.listener,
            self.vm.as_mut(),
            args.config.microvm.boot_timeout(),
            &self.console_log,
            guest_log,
            early,
        );
        match handshaken {
            Ok((guest, milestones)) => Ok((
                Launched {
                    vm: self.vm,
                    guest,
                    guest_ram: self.guest_ram,
                },
                milestones,
            )),
            Err(e) => {
                self.vm.kill();
                Err(with_console(e, &self.console_log))
            }
        }
    }

    fn handshake(
        self,
        args: &Args,
        early: &[Early],
        guest_log: &mut guest_log::GuestLog,
    ) -> Result<Launched, SupervisorError> {
        self.handshake_with_milestones(args, early, guest_log)
            .map(|(launched, _)| launched)
    }
}

/// Sends `early` to a pooled VM's agent, which said Hello long ago.
fn send_early(
    mut p: Launched,
    early: &[Early],
    console_log: &Path,
) -> Result<Launched, SupervisorError> {
    let sent = early.iter().try_for_each(|request| {
        Frame::control(&request.msg)
            .write_to(&mut p.guest)
            .map_err(SupervisorError::from)
    });
    match sent {
        Ok(()) => Ok(p),
        Err(e) => {
            p.vm.kill();
            Err(with_console(e, console_log))
        }
    }
}

/// Whether the prestart and createRuntime hooks are all Docker's
/// `libnetwork-setkey` (its daemon's own binary, which moves the
/// container's veth into the namespace and configures it, and touches
/// neither the rootfs nor the mounts), and there is at least one.
fn hooks_only_fill_the_network(spec: &oci_spec::runtime::Spec) -> bool {
    let Some(hooks) = spec.hooks() else {
        return false;
    };
    let before: Vec<&oci_spec::runtime::Hook> = [hooks.prestart(), hooks.create_runtime()]
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    !before.is_empty()
        && before.iter().all(|h| {
            h.args()
                .as_ref()
                .and_then(|a| a.first())
                .is_some_and(|a| a == DOCKER_NETWORK_HOOK)
        })
}

/// `args[0]` of the prestart hook Docker gives every container with a
/// network namespace of its own.
const DOCKER_NETWORK_HOOK: &str = "libnetwork-setkey";

/// A VM started before the prestart hooks, for [`boot_ahead`]: dropped
/// while it still holds one, it kills it.
struct Ahead {
    vm: Option<AheadVm>,
    /// The MACs its NICs booted with, which the guest swaps for the
    /// container's.
    nic_macs: Vec<String>,
}

enum AheadVm {
    /// Booting, with its taps waiting in the namespace.
    Booting(Starting),
    /// Taken from the pool, its taps moved into the namespace.
    Pooled(Launched),
}

impl Drop for Ahead {
    fn drop(&mut self) {
        match self.vm.take() {
            Some(AheadVm::Booting(mut s)) => s.vm.kill(),
            Some(AheadVm::Pooled(mut p)) => p.vm.kill(),
            None => {}
        }
    }
}

/// Takes a pooled VM, or boots one, before the hooks that fill the
/// still-empty network namespace have run, with the NICs a pooled VM has
/// ([`super::pool::NICS`]): taps in the namespace, down until the router
/// configures them. `None` (with the reason logged) leaves the boot for
/// after the hooks, as without them; an error is what booting after them
/// would have met.
#[allow(clippy::too_many_arguments)]
fn boot_ahead(
    args: &Args,
    state: &VmState,
    spec: &oci_spec::runtime::Spec,
    host: &Host,
    cmdline: &str,
    plan: &super::spec::GuestPlan,
    backend: super::vmm::choice::BackendKind,
    trace: &mut trace::BootTrace,
) -> Result<Option<Ahead>, SupervisorError> {
    match super::net::guest_nics() {
        Ok(0) => {}
        Ok(_) => {
            tracing::info!(
                "container {}: its namespace has interfaces before its hooks ran: booting after them",
                state.id
            );
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!("container {}: {e}", state.id);
            return Ok(None);
        }
    }
    if let Some(claim) = claim_pooled(args, state, spec, host, cmdline, plan, backend) {
        let nic_macs = claim.nic_macs.clone();
        let Some(p) = pooled_vm(args, state, claim, plan) else {
            return Ok(None);
        };
        trace.mark("pool");
        return Ok(Some(Ahead {
            vm: Some(AheadVm::Pooled(p)),
            nic_macs,
        }));
    }
    let nics = super::pool::boot_nics(super::pool::NICS)?;
    let nic_macs = nics
        .iter()
        .map(|n| crate::netlink::format_mac(&n.mac))
        .collect();
    let starting = start_vm(
        args,
        state,
        host,
        cmdline.to_string(),
        plan,
        nics,
        false,
        trace,
    )?;
    Ok(Some(Ahead {
        vm: Some(AheadVm::Booting(starting)),
        nic_macs,
    }))
}

/// Sends a boot request and waits for the reply `expected` accepts: the
/// guest's own error, any other reply (a protocol violation) or no reply is
/// an error.
/// Most bytes of the guest's console put in an error.
const CONSOLE_TAIL: usize = 400;

/// The last lines of the guest's console, for an error: printable ASCII
/// only (the guest writes it), at most [`CONSOLE_TAIL`] bytes.
fn console_tail(path: &Path) -> Option<String> {
    let text = super::vmm::printable_tail(path, 64 * 1024)?;
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut tail = lines[lines.len().saturating_sub(4)..].join(" | ");
    if tail.len() > CONSOLE_TAIL {
        tail = format!("…{}", &tail[tail.len() - CONSOLE_TAIL..]);
    }
    (!tail.is_empty()).then_some(tail)
}

/// `e`, with the console's last lines when the guest went away (a boot
/// timeout names the console file already; a hook is not the guest's).
fn with_console(e: SupervisorError, console: &Path) -> SupervisorError {
    match e {
        SupervisorError::BootTimeout { .. } | SupervisorError::Hook(_) => e,
        e => match console_tail(console) {
            Some(console) => SupervisorError::WithConsole {
                error: Box::new(e),
                console,
            },
            None => e,
        },
    }
}

/// A request sent with the handshake, before the agent's Hello.
pub(crate) struct Early {
    what: &'static str,
    msg: HostMessage,
    /// The reply that means it was done.
    expected: fn(&Reply) -> bool,
}

impl Early {
    /// Waits for the agent's answer to this request.
    fn answered(
        &self,
        guest: &mut UnixStream,
        timeout: Duration,
        log: &mut guest_log::GuestLog,
    ) -> Result<(), SupervisorError> {
        match serve::wait_reply(guest, timeout, log)? {
            r if (self.expected)(&r) => Ok(()),
            Reply::Error { message } => Err(SupervisorError::Guest(message)),
            other => Err(SupervisorError::Violation(format!(
                "unexpected reply to {}: {other:?}",
                self.what
            ))),
        }
    }
}

/// Waits for the VMM to connect the control port and the agent's Hello.
pub(crate) fn handshake(
    listener: &UnixListener,
    vm: &mut dyn Vm,
    timeout: Duration,
    console: &Path,
    log: &mut guest_log::GuestLog,
    early: &[Early],
) -> Result<(UnixStream, Option<crate::protocol::GuestBoot>), SupervisorError> {
    // The timeout is bounded (config.rs), but a deadline past what an
    // Instant holds must not panic the supervisor.
    let deadline = Instant::now().checked_add(timeout).unwrap_or_else(|| {
        Instant::now() + Duration::from_secs(crate::config::MAX_BOOT_TIMEOUT_SECS)
    });
    let timed_out = |detail: &str| SupervisorError::BootTimeout {
        secs: timeout.as_secs(),
        detail: detail.to_string(),
        console: console.to_path_buf(),
    };
    listener
        .set_nonblocking(true)
        .map_err(io_error("control socket"))?;
    let milestones;
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io_error("control socket")(e)),
        }
        if let Some(end) = vm.exited() {
            return Err(SupervisorError::Guest(format!(
                "{} exited during boot ({}); see {}",
                end.part,
                end.how,
                console.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(timed_out("the VMM never connected the control port"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    conn.set_nonblocking(false)
        .map_err(io_error("control channel"))?;
    // The VMM holds what the guest has not read yet: a write that does not
    // fit waits for the guest, within the boot timeout.
    let left = deadline.saturating_duration_since(Instant::now());
    conn.set_write_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(io_error("control channel"))?;
    for request in early {
        Frame::control(&request.msg)
            .write_to(&mut conn)
            .map_err(|e| match e {
                crate::protocol::ProtocolError::Io(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    timed_out(&format!(
                        "the guest never read the {} request",
                        request.what
                    ))
                }
                e => e.into(),
            })?;
    }
    conn.set_write_timeout(None)
        .map_err(io_error("control channel"))?;
    loop {
        // Poll for Hello so a VM that dies while booting is noticed. A
        // frame that has begun is read whole, however slowly it comes,
        // within the boot timeout: a read timeout in the middle of a frame
        // would drop its first bytes and misread the rest.
        let frame = if readable(&conn, Duration::from_millis(200))? {
            let left = deadline.saturating_duration_since(Instant::now());
            conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(io_error("control channel"))?;
            Some(Frame::read_from(&mut conn))
        } else {
            None
        };
        match frame {
            None => {}
            Some(Ok(f)) => {
                let msg: GuestMessage = f.parse_control()?;
                match msg {
                    GuestMessage::Hello {
                        version,
                        kernel,
                        boot,
                    } if version == VERSION => {
                        tracing::info!("guest agent up, kernel {kernel}");
                        milestones = boot;
                        break;
                    }
                    GuestMessage::Hello { version, .. } => {
                        return Err(SupervisorError::Guest(format!(
                            "guest agent speaks protocol {version}, host {VERSION}"
                        )))
                    }
                    GuestMessage::Log { level, message } => guest_log::emit(log, &level, &message),
                    other => {
                        return Err(SupervisorError::Violation(format!(
                            "expected hello, got {other:?}"
                        )))
                    }
                }
            }
            Some(Err(crate::protocol::ProtocolError::Io(e)))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Some(Err(e)) => return Err(e.into()),
        }
        if let Some(end) = vm.exited() {
            return Err(SupervisorError::Guest(format!(
                "{} exited during boot ({}); see {}",
                end.part,
                end.how,
                console.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(timed_out("no hello from the guest agent"));
        }
    }
    conn.set_read_timeout(None)
        .map_err(io_error("control channel"))?;
    Ok((conn, milestones))
}

/// Whether `conn` has data (or EOF) within `wait`.
fn readable(conn: &UnixStream, wait: Duration) -> Result<bool, SupervisorError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(io_error("control channel")(e.into())),
    }
}

/// Exits with the workload's status: its exit code, or 128+n when it died
/// of signal n — what Docker and containerd report for runc's init either
/// way. The signal is never raised here: the guest's word must not make a
/// host process dump core (SIGSEGV, SIGABRT) or stop (SIGSTOP).
pub fn exit_like(status: i32) -> ! {
    std::process::exit(exit_code(status))
}

/// The exit code for a workload status: 0..=255 as is, anything else
/// (which a hostile guest may report) 255.
pub fn exit_code(status: i32) -> i32 {
    if (0..=255).contains(&status) {
        status
    } else {
        VM_LOST_STATUS
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_console_tail_is_printable_bounded_and_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        assert!(console_tail(&path).is_none(), "no file");
        let mut text = b"early\n".to_vec();
        text.extend(b"x\x1b[31mred\x07\r\n\n\n");
        text.extend(vec![b'a'; 2000]);
        text.extend(b"\nKernel panic - not syncing: Attempted to kill init!\n\xff\xfe");
        std::fs::write(&path, &text).unwrap();
        let tail = console_tail(&path).unwrap();
        assert!(
            tail.len() <= CONSOLE_TAIL + '…'.len_utf8(),
            "{}",
            tail.len()
        );
        assert!(tail.contains("Kernel panic - not syncing"), "{tail}");
        assert!(!tail.contains('\x1b') && !tail.contains('\x07'), "{tail:?}");
        let e = with_console(SupervisorError::Guest("gone".into()), &path);
        assert!(
            e.to_string()
                .starts_with("guest: gone; the guest's console ended with: "),
            "{e}"
        );
        let hook = with_console(SupervisorError::Hook("hook failed".into()), &path);
        assert_eq!(hook.to_string(), "hook failed");
    }

    use super::*;

    #[test]
    fn statuses_map_to_exit_codes() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(7), 7);
        assert_eq!(exit_code(128 + libc::SIGSEGV), 139);
        assert_eq!(exit_code(128 + libc::SIGKILL), 137);
        assert_eq!(exit_code(255), 255);
        assert_eq!(exit_code(-1), VM_LOST_STATUS);
        assert_eq!(exit_code(256), VM_LOST_STATUS);
        assert_eq!(exit_code(i32::MAX), VM_LOST_STATUS);
    }

    /// A guest-reported death by SIGSEGV or SIGABRT ends the supervisor
    /// with status 139/134, by exit, not by the signal (no core dump).
    #[test]
    fn a_core_dumping_signal_is_never_raised() {
        for sig in [libc::SIGSEGV, libc::SIGABRT, libc::SIGQUIT, libc::SIGSTOP] {
            // SAFETY: fork in a test; the child only calls exit_like, which
            // exits at once.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                exit_like(128 + sig);
            }
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid out-pointer.
            let rc = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
            assert_eq!(rc, pid);
            assert!(libc::WIFEXITED(status), "signal {sig}: status {status:#x}");
            assert_eq!(libc::WEXITSTATUS(status), 128 + sig);
        }
    }
}
