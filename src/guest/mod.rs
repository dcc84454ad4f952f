//! The guest agent: what runs as `/init` (PID 1) inside a microVM.
//!
//! The host boots the VM with its virtio-fs share as the root filesystem
//! and the static `agentvm` binary in it as `/init` (`microvm::host::
//! share_root`); `main` sees it is PID 1 and comes here. The agent
//! - moves `/` to a tmpfs, mounts the API filesystems and cgroup2, brings up
//!   `lo`, and mounts the host's virtio-fs share (the container's rootfs
//!   and bind-mount sources) at `SHARE_MOUNT`;
//! - opens the virtio-serial port named `PORT_NAME`, sends
//!   `Hello`, and serves the host's requests in a single-threaded poll loop
//!   (`agent.rs`): create/start/exec through the container tier, which
//!   applies the spec's user, capabilities, seccomp, rlimits, masked paths
//!   and so on inside the VM; stdio as data frames; exit statuses as `Exit`
//!   events, sent after the process's output is drained;
//! - reaps every process of the VM, as PID 1 must;
//! - ends the VM by rebooting (QEMU runs with `-no-reboot`): after
//!   `Shutdown`, when the host closes the port, on a malformed frame (the
//!   byte stream cannot be resynchronised; the host is told with a `Log`
//!   first), on a panic, and on any failure before the port is open (told
//!   on the serial console). A malformed *request* inside a well-formed
//!   frame only gets `Reply::Error`.

mod agent;
mod boot;
mod console;
mod hooks;
mod net;
mod port;
mod requests;
mod stream;
mod sys;
mod trim;
mod warm;

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use crate::config::{Config, Isolation};
use crate::context::Context;

use crate::protocol::ProtocolError;

/// The agent's own files, on the guest's /run tmpfs.
pub const AGENT_DIR: &str = "/run/agentvm";
/// State root of the container tier inside the VM.
pub const STATE_ROOT: &str = "/run/agentvm/state";
/// The bundle whose config.json is the spec the host sent.
pub const BUNDLE_DIR: &str = "/run/agentvm/bundle";
/// The one container of the VM, as the container tier knows it.
pub const CONTAINER_ID: &str = "container";
/// The container's cgroup in the VM when the spec's has no meaning there.
pub const GUEST_CGROUP: &str = "/agentvm";

#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    #[error("cannot open the control port {path}: {source}")]
    OpenPort {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {path}: {source}")]
    Dir {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("control channel: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the host closed the control channel")]
    HostGone,
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: nix::errno::Errno,
    },
}

impl GuestError {
    /// Whether the host can still be told about this error over the port.
    fn reportable(&self) -> bool {
        match self {
            GuestError::HostGone => false,
            GuestError::Protocol(e) => !matches!(e, ProtocolError::Io(_) | ProtocolError::Closed),
            _ => true,
        }
    }
}

/// PID 1's entry point; never returns: every way out ends the VM.
pub fn main() -> ! {
    let init_at = sys::since_boot();
    std::panic::set_hook(Box::new(|info| {
        console::line(&format!("panic: {info}; the VM powers off"));
        sys::power_off();
    }));
    let mut agent = match start(init_at) {
        Ok(agent) => agent,
        Err(e) => {
            console::line(&format!("cannot start: {e}; the VM powers off"));
            sys::power_off();
        }
    };
    if let Err(e) = agent.serve() {
        console::line(&format!("stopping: {e}"));
        agent.fail(&e);
    }
    sys::power_off();
}

/// Boot, the agent's directories, the port and Hello.
fn start(init_at: std::time::Duration) -> Result<agent::Agent, GuestError> {
    let booted = boot::setup()?;
    console::init_tracing();
    for path in [AGENT_DIR, STATE_ROOT] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| GuestError::Dir { path, source })?;
    }
    let port = port::Port::open(&booted.port).map_err(|source| GuestError::OpenPort {
        path: booted.port.clone(),
        source,
    })?;
    let ctx = Context {
        root: PathBuf::from(STATE_ROOT),
        config: Config::default(),
        isolation_flag: Some(Isolation::Container),
        egress_flag: None,
        systemd_cgroup: false,
        config_path: None,
        log: None,
        log_json: false,
    };
    let mut agent = agent::Agent::new(port, ctx, booted.share_error.clone())?;
    agent.hello(booted, init_at)?;
    Ok(agent)
}
