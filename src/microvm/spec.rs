//! From the container's OCI spec to what the microVM needs: the spec the
//! guest agent runs (paths rewritten onto the share), the host directories
//! to stage into the share, and the VM's size.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxCpu, LinuxNamespace, LinuxNamespaceType, Root, Spec};

use crate::config::Config;
use crate::protocol::SHARE_MOUNT;

/// Guest memory on top of the container's limit, for the guest kernel and
/// the agent (documented in README).
pub const MEMORY_OVERHEAD_MIB: u64 = 64;
pub const DEFAULT_MEMORY_MIB: u64 = 512;
pub const MIN_MEMORY_MIB: u64 = 128;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A field the microVM must interpret has a value it cannot.
    #[error("{field}: {value:?}: {why}")]
    Field {
        field: String,
        value: String,
        why: String,
    },
}

impl SpecError {
    fn field(field: impl Into<String>, value: &str, why: impl Into<String>) -> SpecError {
        SpecError::Field {
            field: field.into(),
            value: value.to_string(),
            why: why.into(),
        }
    }
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
    pub spec: Spec,
    /// The rootfs first, then one entry per bind mount.
    pub staged: Vec<Staged>,
    pub vcpus: u32,
    /// The VM's RAM.
    pub memory_mib: u64,
    /// What the guest may use of it at first (a balloon holds the rest),
    /// when that is less: the VM booted with the configured ceiling.
    pub guest_ram_mib: Option<u64>,
    /// Settings the VM cannot honour, for the runtime log.
    pub warnings: Vec<String>,
}

impl GuestPlan {
    /// Whether the container's root is read-only (the share holds it so).
    pub fn root_readonly(&self) -> bool {
        self.staged.first().is_some_and(|s| s.readonly)
    }
}

/// The part of a container's limits that its VM's host cgroup carries: CPU.
/// Memory is the guest's RAM, not a host limit on the VMM, which needs
/// headroom beyond it; the device rules and the pids limit apply inside the
/// guest, where the container's processes are. On the host the cgroup holds
/// the supervisor, the VMM's and virtiofsd's threads and the hooks the
/// supervisor runs, none of them the container's processes: a small
/// `--pids-limit` there failed Docker's prestart hook (a Go program that
/// could not start its threads) and would starve the VMM of threads.
pub fn host_limits(full: &oci_spec::runtime::LinuxResources) -> oci_spec::runtime::LinuxResources {
    let unified = matches!(
        libcgroups::common::get_cgroup_setup(),
        Ok(libcgroups::common::CgroupSetup::Unified)
    );
    host_limits_on(full, unified)
}

/// [`host_limits`] for a host whose cgroups are `unified` (v2) or not.
///
/// On cgroup v2 libcgroups puts a device filter (eBPF, deny by default)
/// on every cgroup it applies resources to, whatever the devices asked:
/// the VMM would lose `/dev/kvm` and the tap and vhost devices (`open`
/// fails with EPERM). So the VM's cgroup gets one rule that allows every
/// device; its ancestors' filters still apply. On v1 nothing is written,
/// and the cgroup keeps its parent's rules.
pub fn host_limits_on(
    full: &oci_spec::runtime::LinuxResources,
    unified: bool,
) -> oci_spec::runtime::LinuxResources {
    let mut r = oci_spec::runtime::LinuxResources::default();
    let devices = unified.then(|| {
        let mut all = oci_spec::runtime::LinuxDeviceCgroup::default();
        all.set_allow(true);
        all.set_typ(Some(oci_spec::runtime::LinuxDeviceType::A));
        all.set_major(None);
        all.set_minor(None);
        all.set_access(Some("rwm".to_string()));
        vec![all]
    });
    r.set_devices(devices);
    r.set_cpu(full.cpu().clone());
    r
}

/// Refuses an `update` that would need a bigger VM than the one booted:
/// vCPUs and RAM are fixed at create (no hotplug), limits within them are
/// applied in the guest (and a VM booted with the configured
/// `memory_ceiling_mib` gives its guest more RAM by its balloon).
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
                 container): guest RAM is fixed at create (microvm.memory_ceiling_mib sets it)",
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

/// The RAM the guest needs for the memory limit an `update` sets, in a VM
/// of `vm_mib`: the limit and the guest's own overhead, at most the VM;
/// the whole VM for `-1` (unlimited); `None` when the update sets no
/// memory limit.
pub fn guest_ram_for(resources: &oci_spec::runtime::LinuxResources, vm_mib: u64) -> Option<u64> {
    let limit = resources.memory().as_ref().and_then(|m| m.limit())?;
    if limit < 0 {
        return Some(vm_mib);
    }
    let mib = (limit as u64).div_ceil(1 << 20);
    Some(
        mib.saturating_add(MEMORY_OVERHEAD_MIB)
            .max(MIN_MEMORY_MIB)
            .min(vm_mib),
    )
}

/// Builds the guest plan. `bundle` resolves relative paths; `rootfs` is the
/// bundle's rootfs on the host. A value the VM would have to interpret and
/// cannot is an error naming the field, never dropped.
/// CRI's annotation that tells a pod's sandbox from its other containers.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

/// Whether the spec is a container that CRI adds to a pod (any but the
/// pod's sandbox): it shares the sandbox's network, IPC and UTS
/// namespaces, so in the microvm tier it runs in the sandbox's VM
/// (`super::pod`): a VM of its own would take the pod's address a second
/// time and not see the pod's `localhost`.
pub fn is_pod_member(spec: &Spec) -> bool {
    spec.annotations()
        .as_ref()
        .and_then(|a| a.get(CRI_CONTAINER_TYPE))
        .is_some_and(|kind| kind == "container")
}

pub fn plan(
    spec: &Spec,
    bundle: &Path,
    rootfs: &Path,
    config: &Config,
) -> Result<GuestPlan, SpecError> {
    plan_in(spec, bundle, rootfs, config, "")
}

/// [`plan`], with what is staged named below `dir` of the share (a pod
/// member's directory, `pod/<id>`), or at the share's root for "".
pub fn plan_in(
    spec: &Spec,
    bundle: &Path,
    rootfs: &Path,
    config: &Config,
    dir: &str,
) -> Result<GuestPlan, SpecError> {
    let named = |name: &str| match dir {
        "" => name.to_string(),
        dir => format!("{dir}/{name}"),
    };
    // A seccomp notify fd is the guest kernel's: no listener on the host
    // can receive or use it.
    if let Some(path) = spec
        .linux()
        .as_ref()
        .and_then(|l| l.seccomp().as_ref())
        .and_then(|s| s.listener_path().as_ref())
    {
        return Err(SpecError::field(
            "linux.seccomp.listenerPath",
            &path.display().to_string(),
            "seccomp notify is not supported by the microvm tier: the notify fd belongs to the \
             guest kernel and cannot be handed to a listener on the host",
        ));
    }
    let mut spec = spec.clone();
    let mut warnings = Vec::new();
    let root_ro = spec
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let mut staged = vec![Staged {
        source: rootfs.to_path_buf(),
        name: named("rootfs"),
        readonly: root_ro,
    }];
    let mut root = Root::default();
    root.set_path(PathBuf::from(format!("{SHARE_MOUNT}/{}", named("rootfs"))));
    root.set_readonly(Some(root_ro));
    spec.set_root(Some(root));

    if let Some(mounts) = spec.mounts().clone() {
        let mut rewritten = Vec::with_capacity(mounts.len());
        for (i, mut m) in mounts.into_iter().enumerate() {
            if is_bind(&m) {
                let Some(src) = m.source().clone() else {
                    return Err(SpecError::field(
                        format!("mounts[{i}].source"),
                        "",
                        "a bind mount needs a source",
                    ));
                };
                let src = if src.is_absolute() {
                    src
                } else {
                    bundle.join(src)
                };
                let name = named(&format!("m{}", staged.len()));
                let readonly = m
                    .options()
                    .as_ref()
                    .is_some_and(|o| o.iter().any(|v| v == "ro"));
                staged.push(Staged {
                    source: src,
                    name: name.clone(),
                    readonly,
                });
                m.set_source(Some(PathBuf::from(format!("{SHARE_MOUNT}/{name}"))));
            }
            rewritten.push(m);
        }
        spec.set_mounts(Some(rewritten));
    }

    // Hooks run on the host, by the supervisor.
    spec.set_hooks(None);

    let mut vcpus = config.microvm.default_vcpus.unwrap_or(1);
    let mut memory_mib = default_memory_mib(config);
    if let Some(mut linux) = spec.linux().clone() {
        if let Some(nss) = linux.namespaces().clone() {
            let mut nss: Vec<LinuxNamespace> = nss
                .into_iter()
                .map(|mut ns| {
                    if let Some(path) = ns.path().clone() {
                        warnings.push(format!(
                            "namespace {} at {} is a host namespace: the guest gets a new one",
                            format!("{:?}", ns.typ()).to_lowercase(),
                            path.display()
                        ));
                        ns.set_path(None);
                    }
                    ns
                })
                .collect();
            // The guest is the container's alone: it always gets a cgroup
            // namespace, so it sees its own limits at /sys/fs/cgroup as
            // with Docker on a cgroup v2 host, whatever the host runs.
            if !nss.iter().any(|ns| ns.typ() == LinuxNamespaceType::Cgroup) {
                let mut ns = LinuxNamespace::default();
                ns.set_typ(LinuxNamespaceType::Cgroup);
                nss.push(ns);
            }
            linux.set_namespaces(Some(nss));
        }
        linux.set_cgroups_path(Some(PathBuf::from("/agentvm")));
        // runc's ENOSYS for system calls newer than the profile, worked
        // out here at the host's speed rather than the guest's (libseccomp
        // resolving every name of the profile); the guest's container
        // tier is told it is done (`CreateOptions::enosys_added`).
        if let Some(seccomp) = linux.seccomp_mut() {
            crate::container::enosys::add_rule(seccomp);
        }
        if let Some(res) = linux.resources() {
            if let Some(limit) = res
                .memory()
                .as_ref()
                .and_then(|m| m.limit())
                .filter(|l| *l > 0)
            {
                let mib = (limit as u64).div_ceil(1 << 20);
                memory_mib = mib.saturating_add(MEMORY_OVERHEAD_MIB).max(MIN_MEMORY_MIB);
            }
            if let Some(n) = cpu_count(res.cpu().as_ref())? {
                vcpus = n;
            }
        }
        spec.set_linux(Some(linux));
    }
    let vcpus = clamp_vcpus(vcpus);
    let (memory_mib, guest_ram_mib) = match config.microvm.memory_ceiling_mib {
        Some(ceiling) if ceiling > memory_mib => (ceiling, Some(memory_mib)),
        _ => (memory_mib, None),
    };
    Ok(GuestPlan {
        spec,
        staged,
        vcpus,
        memory_mib,
        guest_ram_mib,
        warnings,
    })
}

/// Whether a mount is a bind mount (its type, or a bind option).
/// The path of the network namespace the spec joins, if it names one.
/// The RAM of a VM whose container sets no memory limit, in MiB.
fn default_memory_mib(config: &Config) -> u64 {
    config
        .microvm
        .default_memory_mib
        .unwrap_or(DEFAULT_MEMORY_MIB)
}

/// At least one vCPU, and no more than the host has.
fn clamp_vcpus(vcpus: u32) -> u32 {
    let host_cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    vcpus.clamp(1, host_cpus.max(1))
}

/// The VM [`plan`] gives a container that sets no CPU or memory limit:
/// the size of the pool's VMs (`microvm::pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultSize {
    pub vcpus: u32,
    /// The VM's RAM: `memory_ceiling_mib` when it is set higher.
    pub vm_mib: u64,
    /// What the balloon leaves the guest, when the VM has one.
    pub guest_mib: Option<u64>,
}

pub fn default_size(config: &Config) -> DefaultSize {
    let memory = default_memory_mib(config);
    let (vm_mib, guest_mib) = match config.microvm.memory_ceiling_mib {
        Some(ceiling) if ceiling > memory => (ceiling, Some(memory)),
        _ => (memory, None),
    };
    DefaultSize {
        vcpus: clamp_vcpus(config.microvm.default_vcpus.unwrap_or(1)),
        vm_mib,
        guest_mib,
    }
}

pub fn netns_path(spec: &Spec) -> Option<PathBuf> {
    spec.linux()
        .as_ref()?
        .namespaces()
        .as_ref()?
        .iter()
        .find(|n| n.typ() == LinuxNamespaceType::Network)?
        .path()
        .clone()
}

/// libcontainer's rule, as the container tier reads it.
pub use crate::container::fixup::is_bind;

/// The CPUs a container's limits ask for: the quota over the period, or
/// the size of its cpuset; `None` when it asks for neither.
fn cpu_count(cpu: Option<&LinuxCpu>) -> Result<Option<u32>, SpecError> {
    let Some(cpu) = cpu else {
        return Ok(None);
    };
    if let (Some(q), Some(p)) = (cpu.quota(), cpu.period()) {
        if q > 0 && p > 0 {
            let n = (q as u64).div_ceil(p);
            return Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)));
        }
        return Ok(None);
    }
    match cpu.cpus() {
        Some(cpus) => count_cpuset(cpus)
            .map(Some)
            .map_err(|why| SpecError::field("linux.resources.cpu.cpus", cpus, why)),
        None => Ok(None),
    }
}

/// Largest CPU number a cpuset may name (the kernel's NR_CPUS limit).
const MAX_CPU: u32 = 8191;

/// Number of CPUs in a cpuset list like "0-3,5".
fn count_cpuset(s: &str) -> Result<u32, String> {
    let cpu = |t: &str| -> Result<u32, String> {
        let n: u32 = t
            .trim()
            .parse()
            .map_err(|_| format!("{t:?} is not a CPU number"))?;
        if n > MAX_CPU {
            return Err(format!("CPU {n} is above {MAX_CPU}"));
        }
        Ok(n)
    };
    let mut n = 0u32;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let count = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu(a)?, cpu(b)?);
                if b < a {
                    return Err(format!("range {part:?} ends before it starts"));
                }
                b - a + 1
            }
            None => {
                cpu(part)?;
                1
            }
        };
        // Bounded by MAX_CPU per part; the sum of many parts saturates.
        n = n.saturating_add(count);
    }
    if n == 0 {
        return Err("names no CPU".into());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_vm_s_host_cgroup_allows_every_device_on_cgroup_v2() {
        let mut full = oci_spec::runtime::LinuxResources::default();
        let mut deny = oci_spec::runtime::LinuxDeviceCgroup::default();
        deny.set_allow(false);
        deny.set_access(Some("rwm".into()));
        full.set_devices(Some(vec![deny]));
        let mut pids = oci_spec::runtime::LinuxPids::default();
        pids.set_limit(10);
        full.set_pids(Some(pids));
        let v2 = host_limits_on(&full, true);
        let rules = v2.devices().as_ref().expect("one rule on v2");
        assert_eq!(rules.len(), 1);
        let r = &rules[0];
        assert!(r.allow());
        assert_eq!(r.typ(), Some(oci_spec::runtime::LinuxDeviceType::A));
        assert_eq!((r.major(), r.minor()), (None, None));
        assert_eq!(r.access().as_deref(), Some("rwm"));
        assert!(v2.pids().is_none(), "the pids limit is the guest's");
        let v1 = host_limits_on(&full, false);
        assert!(v1.devices().is_none());
        assert!(v1.memory().is_none());
    }

    use super::*;

    fn spec() -> Spec {
        serde_json::from_value(serde_json::json!({
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
        }))
        .unwrap()
    }

    fn plan_of(spec: &Spec) -> Result<GuestPlan, SpecError> {
        plan(
            spec,
            Path::new("/b"),
            Path::new("/b/rootfs"),
            &Config::default(),
        )
    }

    #[test]
    fn a_seccomp_notify_listener_is_refused_by_name() {
        let mut v = serde_json::to_value(spec()).unwrap();
        v["linux"]["seccomp"] = serde_json::json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "listenerPath": "/run/listener.sock",
            "syscalls": [{"names": ["getcwd"], "action": "SCMP_ACT_NOTIFY"}]
        });
        let with: Spec = serde_json::from_value(v).unwrap();
        let e = plan_of(&with).unwrap_err().to_string();
        assert!(
            e.starts_with("linux.seccomp.listenerPath: \"/run/listener.sock\""),
            "{e}"
        );
        assert!(e.contains("not supported by the microvm tier"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn the_guest_gets_runc_s_enosys_rule_worked_out_on_the_host() {
        let mut v = serde_json::to_value(spec()).unwrap();
        v["linux"]["seccomp"] = serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"}]
        });
        let with: Spec = serde_json::from_value(v).unwrap();
        let planned = plan_of(&with).unwrap().spec;
        let rules = planned
            .linux()
            .as_ref()
            .and_then(|l| l.seccomp().as_ref())
            .and_then(|s| s.syscalls().clone())
            .unwrap();
        assert_eq!(rules.len(), 2, "{rules:?}");
        let enosys = &rules[1];
        assert_eq!(enosys.errno_ret(), Some(libc::ENOSYS as u32));
        // Newer than exit_group (231), the highest the profile names.
        assert!(enosys.names().iter().any(|n| n == "openat2"), "{enosys:?}");
        assert!(!enosys.names().iter().any(|n| n == "open"), "{enosys:?}");
        // The guest's container tier finds nothing left to add.
        let mut again = planned
            .linux()
            .as_ref()
            .and_then(|l| l.seccomp().clone())
            .unwrap();
        crate::container::enosys::add_rule(&mut again);
        assert_eq!(again.syscalls().as_ref().map(Vec::len), Some(2));
    }

    #[test]
    fn a_container_cri_adds_to_a_pod_is_told_from_its_sandbox() {
        let with = |kind: &str| {
            let mut s = spec();
            let mut a = std::collections::HashMap::new();
            a.insert(CRI_CONTAINER_TYPE.to_string(), kind.to_string());
            s.set_annotations(Some(a));
            is_pod_member(&s)
        };
        assert!(with("container"));
        assert!(!with("sandbox"));
        assert!(!is_pod_member(&spec()));
    }

    #[test]
    fn rewrites_paths_onto_the_share_and_sizes_the_vm() {
        let p = plan_of(&spec()).unwrap();
        let v = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(v["root"]["path"], format!("{SHARE_MOUNT}/rootfs"));
        assert_eq!(v["mounts"][0]["source"], "proc");
        assert_eq!(v["mounts"][1]["source"], format!("{SHARE_MOUNT}/m1"));
        assert_eq!(v["mounts"][2]["source"], format!("{SHARE_MOUNT}/m2"));
        assert!(v.get("hooks").is_none());
        assert!(v["linux"]["namespaces"][0].get("path").is_none());
        assert_eq!(v["linux"]["namespaces"][2]["type"], "cgroup");
        assert_eq!(v["linux"]["cgroupsPath"], "/agentvm");
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

    fn with_cpus(cpus: &str) -> Spec {
        let mut s = spec();
        let mut linux = s.linux().clone().unwrap();
        let mut res = linux.resources().clone().unwrap();
        let mut cpu = LinuxCpu::default();
        cpu.set_cpus(Some(cpus.to_string()));
        res.set_cpu(Some(cpu));
        linux.set_resources(Some(res));
        s.set_linux(Some(linux));
        s
    }

    #[test]
    fn cpusets() {
        assert_eq!(count_cpuset("0-3,5"), Ok(5));
        assert_eq!(count_cpuset("1"), Ok(1));
        assert!(count_cpuset("3-1").is_err());
        assert!(count_cpuset("x").is_err());
        assert!(count_cpuset("").is_err());
        assert!(count_cpuset("0-4294967295").is_err());
        assert_eq!(count_cpuset("0-8191"), Ok(8192));
    }

    #[test]
    fn a_malformed_cpuset_is_an_error_naming_the_field() {
        for bad in ["0-99999999999", "0-4294967295", "7-2", "one", ","] {
            let err = plan_of(&with_cpus(bad)).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("linux.resources.cpu.cpus: {bad:?}: ")),
                "{err}"
            );
        }
        assert_eq!(plan_of(&with_cpus("0")).unwrap().vcpus, 1);
    }

    #[test]
    fn a_huge_quota_is_bounded_by_the_host() {
        let mut s = spec();
        let mut linux = s.linux().clone().unwrap();
        let mut res = linux.resources().clone().unwrap();
        let mut cpu = LinuxCpu::default();
        cpu.set_quota(Some(i64::MAX));
        cpu.set_period(Some(1));
        res.set_cpu(Some(cpu));
        linux.set_resources(Some(res));
        s.set_linux(Some(linux));
        let host = std::thread::available_parallelism().unwrap().get() as u32;
        assert_eq!(plan_of(&s).unwrap().vcpus, host);
    }
}
