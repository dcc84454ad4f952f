//! The microvm tier's per-container state file, `<root>/<id>/microvm.json`,
//! written by `create` and the supervisor, read by every command.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state::{process_start_time, StateError};

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
    pub accel: String,
    #[serde(default)]
    pub paused: bool,
}

impl VmState {
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

    /// Atomic write: readers never see a partial file.
    pub fn save(&self, dir: &Path) -> Result<(), StateError> {
        let path = Self::path(dir);
        let tmp = dir.join(format!(".{STATE_FILE}.{}", std::process::id()));
        let data = serde_json::to_vec(self).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, data)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|source| StateError::Write { path, source })
    }

    /// Whether the supervisor recorded here is still that process.
    pub fn supervisor_alive(&self) -> bool {
        match (self.supervisor_pid, self.supervisor_start_time) {
            (Some(pid), Some(t)) => process_start_time(pid) == Some(t) && !is_zombie(pid),
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

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(|st| st == "Z"))
        })
        .unwrap_or(true)
}
