//! Reading a container's cgroup from the host, on cgroup v1, v2 or hybrid.

use std::path::PathBuf;

/// A resource as the host's cgroup files show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Memory limit in bytes.
    MemoryLimit,
    /// Maximum number of tasks.
    PidsMax,
    /// CPU quota and period in microseconds.
    CpuQuota,
    /// Whether the cgroup is frozen.
    Frozen,
}

/// Where the cgroup v2 hierarchy is mounted, if it is.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
}

/// The v1 hierarchy of `controller` that `pid` is in, as a host path.
fn v1_dir(pid: i32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        if !ctrls.split(',').any(|c| c == controller) {
            return None;
        }
        let mount = PathBuf::from("/sys/fs/cgroup").join(ctrls);
        Some(mount.join(path.trim_start_matches('/')))
    })
}

/// The v2 cgroup directory of `pid`, as a host path.
fn v2_dir(pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2_mount()?.join(path.trim_start_matches('/')))
}

fn read(path: PathBuf) -> Result<String, String> {
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("read {}: {e}", path.display()))
}

/// Reads `resource` for the cgroup of `pid`, preferring the v1 controller
/// (which is where limits live on a hybrid host) and falling back to v2.
/// Values are normalised: "max" becomes `u64::MAX`; CpuQuota is
/// "quota period"; Frozen is "1" or "0".
pub fn read_resource(pid: i32, resource: Resource) -> Result<String, String> {
    let (v1_ctrl, v1_file) = match resource {
        Resource::MemoryLimit => ("memory", "memory.limit_in_bytes"),
        Resource::PidsMax => ("pids", "pids.max"),
        Resource::CpuQuota => ("cpu", "cpu.cfs_quota_us"),
        Resource::Frozen => ("freezer", "freezer.state"),
    };
    if let Some(dir) = v1_dir(pid, v1_ctrl) {
        let value = read(dir.join(v1_file))?;
        return Ok(match resource {
            Resource::CpuQuota => format!("{value} {}", read(dir.join("cpu.cfs_period_us"))?),
            Resource::Frozen => (if value == "FROZEN" { "1" } else { "0" }).to_string(),
            Resource::PidsMax if value == "max" => u64::MAX.to_string(),
            _ => value,
        });
    }
    let dir = v2_dir(pid).ok_or_else(|| format!("no cgroup found for pid {pid}"))?;
    let value = match resource {
        Resource::MemoryLimit => read(dir.join("memory.max"))?,
        Resource::PidsMax => read(dir.join("pids.max"))?,
        Resource::CpuQuota => read(dir.join("cpu.max"))?,
        Resource::Frozen => read(dir.join("cgroup.freeze"))?,
    };
    Ok(if value == "max" {
        u64::MAX.to_string()
    } else {
        value.replace("max ", "-1 ")
    })
}

/// The host directory of `pid`'s cgroup for `controller` (v1), or its v2
/// cgroup where that controller has no v1 hierarchy.
pub fn dir(pid: i32, controller: &str) -> Option<PathBuf> {
    v1_dir(pid, controller).or_else(|| v2_dir(pid))
}
