//! Talking to a container's supervisor over `<state>/supervisor.sock`:
//! what the CLI asks, and the exec stream that follows an `Exec` request.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::protocol::{Frame, ProtocolError, Reply};

/// Requests from the CLI. Each gets one [`Reply`]; after a successful
/// `Exec` the connection carries the process's stdio (data frames, stream
/// 0) and, from the CLI, [`ExecControl`] frames.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SupervisorRequest {
    Start,
    Signal {
        signal: i32,
        all: bool,
    },
    Ps,
    Stats,
    Exec {
        process: Box<oci_spec::runtime::Process>,
        /// `exec --cgroup` values, applied in the guest.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroup: Vec<String>,
        /// `exec --ignore-paused`: into a paused container, the process
        /// starts when the container is resumed (runc's waits frozen in its
        /// cgroup till then), and the request is answered then.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ignore_paused: bool,
    },
    /// New cgroup limits for the container in the guest.
    Update {
        resources: Box<oci_spec::runtime::LinuxResources>,
    },
    /// From a pod member's relay (`src/microvm/pod.rs`): create container
    /// `id` in this (the sandbox's) VM; its rootfs and volumes are in the
    /// share already. After `Created` the connection carries the member
    /// init's stdio and [`ExecControl`], and ends with an [`ExecEvent`], as
    /// an exec's does.
    CreateMember {
        id: String,
        spec: Box<oci_spec::runtime::Spec>,
        join: Vec<crate::protocol::PodNamespace>,
        /// The member's startContainer hooks, which its `start` runs in
        /// the guest: read from its bundle here, at create, as runc keeps
        /// its config from create (the jailed supervisor reads no bundle).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_hooks: Option<StartHooks>,
    },
    /// A request (`Start`, `Signal`, `Ps`, `Stats`, `Update`, `Exec`) about
    /// member `id` of the pod rather than the sandbox container.
    Member {
        id: String,
        request: Box<SupervisorRequest>,
    },
    /// Remove member `id` from the guest (killing what is left of it).
    DeleteMember {
        id: String,
    },
    /// Freeze the container (or, inside `Member`, a pod member) in the
    /// guest, as runc's pause freezes its cgroup; `Resume` thaws it.
    Pause,
    Resume,
}

/// A container's startContainer hooks and the OCI state they read (status
/// `created`, the container's pid), fixed at create: `start` runs them in
/// the guest before the workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartHooks {
    pub hooks: Vec<oci_spec::runtime::Hook>,
    pub state: crate::protocol::OciState,
}

impl StartHooks {
    /// The spec's startContainer hooks for the container whose state is
    /// `state`; `None` when it has none.
    pub fn of(spec: &oci_spec::runtime::Spec, state: &super::vmstate::VmState) -> Option<Self> {
        let hooks = spec
            .hooks()
            .as_ref()
            .and_then(|h| h.start_container().clone())
            .filter(|h| !h.is_empty())?;
        Some(StartHooks {
            hooks,
            state: crate::protocol::OciState {
                oci_version: oci_spec::runtime::VERSION.to_string(),
                id: state.id.clone(),
                status: "created".into(),
                pid: state.supervisor_pid,
                bundle: state.bundle.clone(),
                annotations: state.annotations.clone(),
            },
        })
    }
}

/// Control frames an exec relay sends after the exec started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecControl {
    Signal { signal: i32 },
    Resize { rows: u16, cols: u16 },
}

/// What the supervisor sends an exec relay when its process ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Exit { status: i32 },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the supervisor of container {id}: {source}")]
    Connect { id: String, source: std::io::Error },
    #[error("supervisor of container {id}: {source}")]
    Protocol { id: String, source: ProtocolError },
}

/// Sends one request and waits for its reply.
pub fn request(
    dir: &Path,
    id: &str,
    req: &SupervisorRequest,
    timeout: Duration,
) -> Result<(UnixStream, Reply), ClientError> {
    let mut conn =
        super::sock::connect(dir, super::vmstate::SUPERVISOR_SOCKET).map_err(|source| {
            ClientError::Connect {
                id: id.to_string(),
                source,
            }
        })?;
    let proto = |source| ClientError::Protocol {
        id: id.to_string(),
        source,
    };
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| proto(e.into()))?;
    Frame::control(req).write_to(&mut conn).map_err(proto)?;
    let reply: Reply = Frame::read_from(&mut conn)
        .and_then(|f| f.parse_control())
        .map_err(proto)?;
    conn.set_read_timeout(None).map_err(|e| proto(e.into()))?;
    Ok((conn, reply))
}
