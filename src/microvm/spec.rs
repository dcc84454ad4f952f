//! From the container's OCI spec to what the microVM needs: the spec the
//! guest agent runs (paths rewritten onto the share), the host directories
//! to stage into the share, and the VM's size.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::protocol::SHARE_MOUNT;
use crate::config::Config;

/// Guest memory on top of the container's limit, for the guest kernel and
/// the agent (documented in README).
pub const MEMORY_OVERHEAD_MIB: u64 = 64;
pub const DEFAULT_MEMORY_MIB: u64 = 512;
pub const MIN_MEMORY_MIB: u64 = 128;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("config.json: {0}")]
    Invalid(String),
}

/// One host path that the guest reaches through the share.
#[derive(Debug, Clone, PartialEq)]
pub struct Staged {
    /// Host path (a directory, or a file for file bind mounts).
    pub source: PathBuf,
    /// Name under the staging directory (and under SHARE_MOUNT in the guest).
    pub name: String,
    pub readonly: bool,
}

#[derive(Debug, Clone)]
pub struct GuestPlan {
    /// The spec for the guest agent.
    pub spec: Value,
    /// The rootfs first, then one entry per bind mount.
    pub staged: Vec<Staged>,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Settings the VM cannot honour, for the runtime log.
    pub warnings: Vec<String>,
}

impl GuestPlan {
    /// Whether the container's root is read-only (the share holds it so).
    pub fn root_readonly(&self) -> bool {
        self.staged.first().is_some_and(|s| s.readonly)
    }
}

/// The part of a container's limits that its VM's host cgroup carries: CPU
/// and pids. Memory is the guest's RAM, not a host limit on the VMM, which
/// needs headroom beyond it.
pub fn host_limits(full: &oci_spec::runtime::LinuxResources) -> oci_spec::runtime::LinuxResources {
    let mut r = oci_spec::runtime::LinuxResources::default();
    r.set_devices(None);
    r.set_cpu(full.cpu().clone());
    r.set_pids(*full.pids());
    r
}

/// Refuses an `update` that would need a bigger VM than the one booted:
/// vCPUs and RAM are fixed at create (no hotplug), limits within them are
/// applied in the guest.
pub fn check_update(
    resources: &oci_spec::runtime::LinuxResources,
    vcpus: u32,
    memory_mib: u64,
) -> Result<(), String> {
    if let Some(limit) = resources
        .memory()
        .as_ref()
        .and_then(|m| m.limit())
        .filter(|l| *l > 0)
    {
        let room = memory_mib.saturating_sub(MEMORY_OVERHEAD_MIB);
        if vcpus > 0 && (limit as u64).div_ceil(1 << 20) > room {
            return Err(format!(
                "memory limit {} MiB exceeds what this microVM was booted with ({room} MiB for the \
                 container): guest RAM is fixed at create",
                (limit as u64).div_ceil(1 << 20)
            ));
        }
    }
    let cpu = resources.cpu().as_ref();
    if let (Some(q), Some(p)) = (
        cpu.and_then(|c| c.quota()).filter(|q| *q > 0),
        cpu.and_then(|c| c.period()).filter(|p| *p > 0),
    ) {
        let wanted = (q as u64).div_ceil(p);
        if vcpus > 0 && wanted > u64::from(vcpus) {
            return Err(format!(
                "a CPU quota of {wanted} CPUs exceeds this microVM's {vcpus} vCPUs, fixed at create"
            ));
        }
    }
    Ok(())
}

pub fn is_bind(m: &Value) -> bool {
    m.get("type").and_then(Value::as_str) == Some("bind")
        || m.get("options")
            .and_then(Value::as_array)
            .is_some_and(|o| o.iter().any(|v| v == "bind" || v == "rbind"))
}

fn has_option(m: &Value, opt: &str) -> bool {
    m.get("options")
        .and_then(Value::as_array)
        .is_some_and(|o| o.iter().any(|v| v == opt))
}

/// Builds the guest plan. `bundle` resolves relative paths; `rootfs` is the
/// bundle's rootfs on the host.
pub fn plan(
    spec: &Value,
    bundle: &Path,
    rootfs: &Path,
    config: &Config,
) -> Result<GuestPlan, SpecError> {
    let mut spec = spec.clone();
    let obj = spec
        .as_object_mut()
        .ok_or_else(|| SpecError::Invalid("not a JSON object".into()))?;
    let mut warnings = Vec::new();
    let root_ro = obj
        .get("root")
        .and_then(|r| r.get("readonly"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut staged = vec![Staged {
        source: rootfs.to_path_buf(),
        name: "rootfs".into(),
        readonly: root_ro,
    }];
    obj.insert(
        "root".into(),
        serde_json::json!({ "path": format!("{SHARE_MOUNT}/rootfs"), "readonly": root_ro }),
    );

    if let Some(mounts) = obj.get_mut("mounts").and_then(Value::as_array_mut) {
        for m in mounts.iter_mut() {
            if !is_bind(m) {
                continue;
            }
            let Some(src) = m.get("source").and_then(Value::as_str) else {
                return Err(SpecError::Invalid("a bind mount has no source".into()));
            };
            let src = PathBuf::from(src);
            let src = if src.is_absolute() {
                src
            } else {
                bundle.join(src)
            };
            let name = format!("m{}", staged.len());
            staged.push(Staged {
                source: src,
                name: name.clone(),
                readonly: has_option(m, "ro"),
            });
            m["source"] = Value::String(format!("{SHARE_MOUNT}/{name}"));
        }
    }

    // Hooks run on the host, by the supervisor.
    obj.remove("hooks");

    let mut vcpus = config.microvm.default_vcpus.unwrap_or(1);
    let mut memory_mib = config
        .microvm
        .default_memory_mib
        .unwrap_or(DEFAULT_MEMORY_MIB);
    if let Some(linux) = obj.get_mut("linux").and_then(Value::as_object_mut) {
        if let Some(nss) = linux.get_mut("namespaces").and_then(Value::as_array_mut) {
            for ns in nss.iter_mut() {
                if let Some(path) = ns.as_object_mut().and_then(|o| o.remove("path")) {
                    warnings.push(format!(
                        "namespace {} at {} is a host namespace: the guest gets a new one",
                        ns.get("type").and_then(Value::as_str).unwrap_or("?"),
                        path.as_str().unwrap_or("?")
                    ));
                }
            }
            // The guest is the container's alone: it always gets a cgroup
            // namespace, so it sees its own limits at /sys/fs/cgroup as
            // with Docker on a cgroup v2 host, whatever the host runs.
            if !nss
                .iter()
                .any(|ns| ns.get("type") == Some(&Value::from("cgroup")))
            {
                nss.push(serde_json::json!({ "type": "cgroup" }));
            }
        }
        linux.insert("cgroupsPath".into(), Value::String("/agentvm".into()));
        if let Some(res) = linux.get("resources") {
            if let Some(limit) = res
                .get("memory")
                .and_then(|m| m.get("limit"))
                .and_then(Value::as_i64)
                .filter(|l| *l > 0)
            {
                let mib = (limit as u64).div_ceil(1 << 20);
                memory_mib = (mib + MEMORY_OVERHEAD_MIB).max(MIN_MEMORY_MIB);
            }
            let cpu = res.get("cpu");
            let quota = cpu.and_then(|c| c.get("quota")).and_then(Value::as_i64);
            let period = cpu.and_then(|c| c.get("period")).and_then(Value::as_u64);
            if let (Some(q), Some(p)) = (quota, period) {
                if q > 0 && p > 0 {
                    vcpus = (q as u64).div_ceil(p) as u32;
                }
            } else if let Some(cpus) = cpu.and_then(|c| c.get("cpus")).and_then(Value::as_str) {
                if let Some(n) = count_cpuset(cpus) {
                    vcpus = n;
                }
            }
        }
    }
    let host_cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    vcpus = vcpus.clamp(1, host_cpus.max(1));
    Ok(GuestPlan {
        spec,
        staged,
        vcpus,
        memory_mib,
        warnings,
    })
}

/// Number of CPUs in a cpuset list like "0-3,5".
fn count_cpuset(s: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<u32>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Value {
        serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs", "readonly": true},
            "hooks": {"prestart": [{"path": "/bin/true"}]},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind", "ro"]},
                {"destination": "/etc/hosts", "type": "none", "source": "hosts", "options": ["bind"]}
            ],
            "linux": {
                "namespaces": [{"type": "network", "path": "/var/run/netns/x"}, {"type": "pid"}],
                "cgroupsPath": "/docker/abc",
                "resources": {"memory": {"limit": 268435456}, "cpu": {"quota": 150000, "period": 100000}}
            }
        })
    }

    #[test]
    fn rewrites_paths_onto_the_share_and_sizes_the_vm() {
        let p = plan(
            &spec(),
            Path::new("/b"),
            Path::new("/b/rootfs"),
            &Config::default(),
        )
        .unwrap();
        assert_eq!(p.spec["root"]["path"], format!("{SHARE_MOUNT}/rootfs"));
        assert_eq!(p.spec["mounts"][0]["source"], "proc");
        assert_eq!(p.spec["mounts"][1]["source"], format!("{SHARE_MOUNT}/m1"));
        assert_eq!(p.spec["mounts"][2]["source"], format!("{SHARE_MOUNT}/m2"));
        assert!(p.spec.get("hooks").is_none());
        assert!(p.spec["linux"]["namespaces"][0].get("path").is_none());
        assert_eq!(p.spec["linux"]["cgroupsPath"], "/agentvm");
        assert_eq!(p.staged.len(), 3);
        assert_eq!(p.staged[0].source, PathBuf::from("/b/rootfs"));
        assert!(p.staged[0].readonly);
        assert_eq!(p.staged[1].source, PathBuf::from("/srv/data"));
        assert!(p.staged[1].readonly);
        assert_eq!(p.staged[2].source, PathBuf::from("/b/hosts"));
        assert!(!p.staged[2].readonly);
        assert_eq!(p.memory_mib, 256 + MEMORY_OVERHEAD_MIB);
        assert_eq!(
            p.vcpus,
            2.min(std::thread::available_parallelism().unwrap().get() as u32)
        );
        assert_eq!(p.warnings.len(), 1);
    }

    #[test]
    fn cpusets() {
        assert_eq!(count_cpuset("0-3,5"), Some(5));
        assert_eq!(count_cpuset("1"), Some(1));
        assert_eq!(count_cpuset("3-1"), None);
        assert_eq!(count_cpuset("x"), None);
    }
}
