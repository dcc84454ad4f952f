//! `delete` in the container tier.

use std::time::{Duration, Instant};

use libcgroups::common::{AnyCgroupManager, CgroupManager, FreezerState};
use libcontainer::container::{Container, ContainerStatus};
use nix::sys::signal::{kill, Signal};

use super::{cgroup_manager, pids, status_str, ContainerError};

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("cannot delete container {id} that is not stopped: {status}")]
    NotStopped { id: String, status: &'static str },
    #[error("processes of container {id} did not exit after SIGKILL")]
    Unkillable { id: String },
}

/// How long delete waits for SIGKILLed processes to disappear.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long delete retries a busy child cgroup (its last task being reaped).
const CHILD_WAIT: Duration = Duration::from_secs(2);

pub fn delete(container: &mut Container, force: bool) -> Result<(), ContainerError> {
    let id = container.id().to_string();
    match container.status() {
        ContainerStatus::Stopped => {}
        // runc and crun delete a created container without --force.
        ContainerStatus::Created => kill_everything(container)?,
        _ if force => kill_everything(container)?,
        status => {
            return Err(DeleteError::NotStopped {
                id,
                status: status_str(status),
            }
            .into())
        }
    }
    container.set_status(ContainerStatus::Stopped);
    // Before the state directory goes: the router's namespaces are pinned
    // there.
    super::egress::teardown(&container.root);

    let config = container.spec().ok();
    if let Some(c) = &config {
        if !container.systemd() {
            for (dir, e) in super::cgroups::remove_children(&c.cgroup_path, CHILD_WAIT) {
                tracing::warn!(
                    "cannot remove cgroup {} of container {id}: {e}",
                    dir.display()
                );
            }
        }
        match cgroup_manager(container) {
            Ok(cm) => remove_cgroup(&cm, &id),
            Err(e) => tracing::warn!("{e}"),
        }
    }
    // The runtime spec says a failing poststop hook is logged and delete
    // goes on.
    // As runc, in its words: `error running hook #1: error running hook:
    // exit status 4, stdout: ..., stderr: ...` at level error.
    if let Some(list) = config
        .as_ref()
        .and_then(|c| c.hooks.as_ref())
        .and_then(|h| h.poststop().as_ref())
    {
        match oci_state_json(container) {
            Ok(state) => {
                if let Err(e) = super::hooks::run(list, &state) {
                    tracing::error!("{e}");
                }
            }
            Err(e) => tracing::error!("cannot run the poststop hooks of container {id}: {e}"),
        }
    }
    // A message a wrapped hook left and nobody took (see `hooks`).
    if let Some(root) = container.root.parent() {
        let _ = std::fs::remove_file(super::hooks::message_file(root, &id));
    }
    if container.root.exists() {
        std::fs::remove_dir_all(&container.root).map_err(|e| {
            ContainerError::Libcontainer(format!(
                "cannot remove state directory {}: {e}",
                container.root.display()
            ))
        })?;
    }
    Ok(())
}

/// The OCI state hooks get on stdin.
fn oci_state_json(container: &Container) -> Result<Vec<u8>, String> {
    let state = oci_spec::runtime::State::try_from(&container.state).map_err(|e| e.to_string())?;
    serde_json::to_vec(&state).map_err(|e| e.to_string())
}

/// SIGKILLs every process of the container (thawing it first, since a
/// frozen task cannot die) and waits until they are gone.
fn kill_everything(container: &Container) -> Result<(), ContainerError> {
    let id = container.id().to_string();
    let cm = cgroup_manager(container)?;
    let _ = cm.freeze(FreezerState::Thawed);
    if let Some(pid) = container.pid() {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let remaining = pids(container).unwrap_or_default();
        let alive: Vec<_> = remaining
            .into_iter()
            .filter(|p| !crate::state::process_gone(p.as_raw()))
            .collect();
        if alive.is_empty() {
            return Ok(());
        }
        for p in &alive {
            let _ = kill(*p, Signal::SIGKILL);
        }
        if Instant::now() > deadline {
            return Err(DeleteError::Unkillable { id }.into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Removes the cgroup; a cgroup whose last task is still being reaped can
/// be busy for a moment, so retry briefly.
fn remove_cgroup(cm: &AnyCgroupManager, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match cm.remove() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => {
                tracing::warn!("cannot remove cgroup of container {id}: {e}");
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
