//! The microvm tier's per-container state file, `<root>/<id>/microvm.json`,
//! written by `create` and the supervisor, read by every command.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state::{process_gone, process_start_time, write_json_atomic, StateError};

pub const STATE_FILE: &str = "microvm.json";
pub const SUPERVISOR_SOCKET: &str = "supervisor.sock";
pub const CONSOLE_LOG: &str = "console.log";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Creating,
    Created,
    Running,
    Stopped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub status: Status,
    pub supervisor_pid: Option<i32>,
    pub supervisor_start_time: Option<u64>,
    /// RFC 3339 creation time.
    pub created: String,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    /// Host cgroup path of the supervisor (and so of the VMM).
    pub cgroup_path: PathBuf,
    /// Workload exit status once known (exit code or 128+signal).
    pub exit_status: Option<i32>,
    /// The container's OOM kills in the guest when its init exited, for
    /// `events` once the VM is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
    pub accel: String,
    /// The VMM backend running the VM (`qemu`, `builtin`; empty until the
    /// supervisor has chosen, and in states written before it was kept).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vmm: String,
    #[serde(default)]
    pub paused: bool,
    /// The VM's size, fixed at boot (0 until it booted).
    #[serde(default)]
    pub vcpus: u32,
    #[serde(default)]
    pub memory_mib: u64,
    /// The host cgroup is a systemd unit (`--systemd-cgroup`).
    #[serde(default)]
    pub systemd_cgroup: bool,
    /// The network namespace the guest's NICs are routed through, when it
    /// can outlive the container, and what `delete` gives back to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net_restore: Vec<super::net::Restore>,
    /// The egress policy in force (`egress::Policy` as text).
    #[serde(default = "allow")]
    pub egress: String,
    /// Where `create` spent its time, part by part (the supervisor's boot
    /// trace); empty until the VM booted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boot: Vec<super::supervisor::trace::BootPart>,
    /// The VMM's own measure, where it keeps one (the builtin VMM): from
    /// the VM's creation to the guest's first instruction, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_instruction_us: Option<u64>,
    /// That span step by step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_instruction_steps: Vec<super::supervisor::trace::BootPart>,
    /// A further container of a Kubernetes pod, running in the VM of this
    /// sandbox container (same `--root`); `supervisor_pid` is then its
    /// relay's (`src/microvm/pod.rs`), and it has no host cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_sandbox: Option<String>,
}

fn allow() -> String {
    "allow".into()
}

impl VmState {
    /// The manager of the VM's host cgroup (supervisor, VMM, file server).
    pub fn cgroup_manager(
        &self,
    ) -> Result<libcgroups::common::AnyCgroupManager, libcgroups::common::CreateCgroupSetupError>
    {
        libcgroups::common::create_cgroup_manager(libcgroups::common::CgroupConfig {
            cgroup_path: self.cgroup_path.clone(),
            systemd_cgroup: self.systemd_cgroup,
            container_name: self.id.clone(),
        })
    }

    /// The container's spec, from its bundle.
    pub fn spec(&self) -> Result<oci_spec::runtime::Spec, crate::bundle::BundleError> {
        crate::bundle::Bundle::read_spec(&self.bundle.join("config.json")).map(|(spec, _)| spec)
    }

    pub fn path(dir: &Path) -> PathBuf {
        dir.join(STATE_FILE)
    }

    pub fn load(dir: &Path) -> Result<VmState, StateError> {
        let path = Self::path(dir);
        let text = std::fs::read(&path).map_err(|source| StateError::Read {
            path: path.clone(),
            source,
        })?;
        serde_json::from_slice(&text).map_err(|source| StateError::Corrupt { path, source })
    }

    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        write_json_atomic(&Self::path(dir), self)
    }

    /// Whether the supervisor recorded here is still that process.
    pub fn supervisor_alive(&self) -> bool {
        match (self.supervisor_pid, self.supervisor_start_time) {
            (Some(pid), Some(t)) => process_start_time(pid) == Some(t) && !process_gone(pid),
            _ => false,
        }
    }

    /// The status as the world sees it now.
    pub fn effective_status(&self) -> Status {
        match self.status {
            Status::Stopped => Status::Stopped,
            s if self.supervisor_pid.is_some() && !self.supervisor_alive() => {
                let _ = s;
                Status::Stopped
            }
            s => s,
        }
    }
}
