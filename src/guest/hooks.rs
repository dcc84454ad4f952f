//! The startContainer hooks, run by the agent in the created container's
//! namespaces just before it starts.
//!
//! The OCI spec runs them in the container's namespaces with their path
//! resolved there, after `start` and before the user's process. libcontainer
//! would run them from the container's init, but would hand them the
//! guest's view of the state (the agent's container id and bundle); the
//! host sends the state it shows (`agentvm state`), so they run here: a
//! dedicated thread joins the init's mount, network, IPC, UTS, cgroup and
//! PID namespaces (its children are then born in them, and `/` is the
//! container's root) and runs them with libcontainer's hook runner (stdin,
//! environment, timeout). A user namespace cannot be joined by one thread of
//! a process; with one the hooks run as the guest's root, as hooks are the
//! operator's trusted code.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use libcontainer::container::state::State;
use libcontainer::container::ContainerStatus;
use nix::sched::CloneFlags;
use nix::unistd::Pid;
use oci_spec::runtime::Hook;

use super::agent::Agent;
use super::requests::RequestError;
use super::BUNDLE_DIR;
use crate::protocol::{OciState, Reply, INIT_STREAM};

/// The namespaces joined, by their /proc/PID/ns name. The mount namespace
/// comes first among the joins only after every file is open (see below).
const NAMESPACES: [(&str, CloneFlags); 6] = [
    ("net", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

impl Agent {
    /// `RunHooks`: the startContainer hooks of the created container.
    pub(super) fn run_hooks(
        &mut self,
        guest_id: &str,
        hooks: Vec<Hook>,
        state: OciState,
    ) -> Result<Reply, RequestError> {
        // The container's init: stream 0 for the VM's own, its member
        // stream for a pod's further container.
        let stream = self
            .members
            .iter()
            .find(|(_, g)| g.as_str() == guest_id)
            .map(|(&id, _)| id)
            .unwrap_or(INIT_STREAM);
        let bundle = match stream {
            INIT_STREAM => PathBuf::from(BUNDLE_DIR),
            _ => PathBuf::from(format!("{}/{guest_id}", super::requests::MEMBER_BUNDLES)),
        };
        let Some(init) = self.streams.get(&stream).filter(|s| s.running()) else {
            return Err(RequestError::Refused(
                "cannot run startContainer hooks: the container's init is not running".into(),
            ));
        };
        let mut lc_state = State::new(
            &state.id,
            ContainerStatus::Created,
            state.pid,
            state.bundle.clone(),
        );
        lc_state.annotations = Some(state.annotations).filter(|a| !a.is_empty());
        let env = process_env(&bundle.join("config.json"));
        run_in_namespaces(init.pid, &hooks, &lc_state, &env).map_err(RequestError::Refused)?;
        Ok(Reply::Ok)
    }
}

/// The container process's environment, the default of a hook without
/// `env` (as runc's init hands its own to startContainer hooks).
fn process_env(config: &Path) -> HashMap<String, String> {
    let Ok(spec) = oci_spec::runtime::Spec::load(config) else {
        return HashMap::new();
    };
    spec.process()
        .as_ref()
        .and_then(|p| p.env().as_ref())
        .map(|env| {
            env.iter()
                .filter_map(|v| v.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn run_in_namespaces(
    pid: Pid,
    hooks: &[Hook],
    state: &State,
    env: &HashMap<String, String>,
) -> Result<(), String> {
    // Every namespace file is opened before the first join: after the
    // mount namespace's, /proc would be the container's.
    let mut files = Vec::new();
    for (name, flag) in NAMESPACES {
        let path = PathBuf::from(format!("/proc/{pid}/ns/{name}"));
        let file = File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        files.push((name, flag, file));
    }
    let hooks = hooks.to_vec();
    std::thread::scope(|s| {
        s.spawn(|| {
            // setns() changes the calling thread only, and this thread ends
            // once the hooks ran; a thread that shares its filesystem
            // context with others cannot switch mount namespaces.
            nix::sched::unshare(CloneFlags::CLONE_FS)
                .map_err(|e| format!("cannot unshare the filesystem context: {e}"))?;
            for (name, flag, file) in &files {
                nix::sched::setns(file.as_fd(), *flag)
                    .map_err(|e| format!("cannot join the container's {name} namespace: {e}"))?;
            }
            libcontainer::hooks::run_hooks(Some(&hooks), Some(state), None, None, Some(env))
                .map_err(|e| {
                    format!(
                        "startContainer hook failed: {}",
                        crate::container::lc_error(e)
                    )
                })
        })
        .join()
        .unwrap_or_else(|_| Err("the startContainer hook thread panicked".into()))
    })
}
