//! `agentvm features`: the OCI features document, with what each isolation
//! tier provides in agentvm's own annotations.

use clap::Args;
use serde_json::json;

use crate::cli::GlobalOpts;
use crate::config::Config;

#[derive(Args, Debug)]
pub struct FeaturesArgs {}

const HOOKS: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

const MOUNT_OPTIONS: &[&str] = &[
    "async",
    "atime",
    "bind",
    "defaults",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "iversion",
    "lazytime",
    "loud",
    "mand",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "noiversion",
    "nolazytime",
    "nomand",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "nosymfollow",
    "private",
    "ratime",
    "rbind",
    "rdev",
    "rdiratime",
    "relatime",
    "remount",
    "rexec",
    "rnoatime",
    "rnodev",
    "rnodiratime",
    "rnoexec",
    "rnorelatime",
    "rnostrictatime",
    "rnosuid",
    "rnosymfollow",
    "ro",
    "rprivate",
    "rrelatime",
    "rro",
    "rrw",
    "rshared",
    "rslave",
    "rstrictatime",
    "rsuid",
    "rsymfollow",
    "runbindable",
    "rw",
    "shared",
    "silent",
    "slave",
    "strictatime",
    "suid",
    "symfollow",
    "sync",
    "tmpcopyup",
    "unbindable",
];

const NAMESPACES: &[&str] = &[
    "cgroup", "ipc", "mount", "network", "pid", "time", "user", "uts",
];

const SECCOMP_ACTIONS: &[&str] = &[
    "SCMP_ACT_ALLOW",
    "SCMP_ACT_ERRNO",
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_LOG",
    "SCMP_ACT_NOTIFY",
    "SCMP_ACT_TRACE",
    "SCMP_ACT_TRAP",
];

const SECCOMP_OPERATORS: &[&str] = &[
    "SCMP_CMP_EQ",
    "SCMP_CMP_GE",
    "SCMP_CMP_GT",
    "SCMP_CMP_LE",
    "SCMP_CMP_LT",
    "SCMP_CMP_MASKED_EQ",
    "SCMP_CMP_NE",
];

const SECCOMP_ARCHS: &[&str] = &["SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32"];

pub fn run(global: &GlobalOpts, _args: &FeaturesArgs) -> anyhow::Result<()> {
    let config = Config::load(global.config.as_deref())?;
    let (default_tier, source) = config.select_isolation(global.isolation, None)?;
    let microvm = match crate::microvm::host::Host::probe_default(&config) {
        Ok(h) => format!(
            "available: {}, {} ({}), IPv4 and IPv6 networking routed through the \
             container's namespace, egress policy by address and by name (--egress; a proxy checks TLS SNI and HTTP Host); refused: the host's network \
             (--network host); update of the memory limit past what the VM booted for, up to \
             microvm.memory_ceiling_mib (a balloon); a Kubernetes pod is one microVM (a CRI \
             pod's further containers run in its sandbox's VM, each in its own mount, pid and \
             cgroup namespaces); not implemented yet: joining host namespaces by path, \
             update of vCPUs after create",
            h.vmm_description(),
            h.accel.as_str(),
            h.accel_reason
        ),
        Err(e) => format!("not available on this host: {e}"),
    };
    let vmm = match crate::microvm::vmm::choice::for_container(config.microvm.vmm, None) {
        Ok(d) => format!(
            "{} ({}; requested {} from {})",
            d.backend.as_str(),
            d.why,
            d.requested,
            d.source
        ),
        Err(e) => format!("none: {e}"),
    };
    let builtin = if crate::microvm::vmm::builtin::complete() {
        "complete".to_string()
    } else {
        format!(
            "not complete, run only when asked for by name (auto picks qemu): lacks {}",
            crate::microvm::vmm::builtin::MISSING.join(", ")
        )
    };
    let audit = format!(
        "one JSON line per exec (both tiers) and per connection and DNS answer an egress policy \
         judges, in {} (agentvm audit ID [--follow]; egress counts in events --stats); {}",
        config.audit.path().display(),
        match config.audit.endpoint() {
            Some(e) => format!("exported as OTLP/HTTP logs to {}", e.url()),
            None => "OTLP/HTTP export when [audit] otlp_endpoint is set".to_string(),
        }
    );
    // The kernel a microVM boots: the configured one, or the path `make
    // install` puts it at, as `check` resolves it.
    let kernel = match &config.microvm.kernel {
        Some(k) => format!("{} (microvm.kernel)", k.display()),
        None => {
            let k = std::path::Path::new(crate::microvm::host::DEFAULT_KERNEL);
            let missing = if k.is_file() { "" } else { ", missing" };
            format!("{} (the default{missing})", k.display())
        }
    };
    let pool = match config.microvm.pool_size() {
        0 => "off (microvm.pool = N keeps N VMs booted per --root; agentvm pool fill|drain|list)"
            .to_string(),
        n => format!(
            "{n} booted VMs kept per --root (QEMU backend), each with one NIC, taken by \
             containers that set no CPU limit, no memory limit {} and need at most one NIC; \
             others boot their own",
            match config.microvm.memory_ceiling_mib {
                Some(c) => format!("above memory_ceiling_mib ({c} MiB)"),
                None => "(memory_ceiling_mib unset)".to_string(),
            }
        ),
    };
    let mut caps: Vec<String> = caps::all().iter().map(|c| c.to_string()).collect();
    caps.sort();
    let doc = json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": oci_spec::runtime::VERSION,
        "hooks": HOOKS,
        "mountOptions": MOUNT_OPTIONS,
        "linux": {
            "namespaces": NAMESPACES,
            "capabilities": caps,
            "cgroup": { "v1": true, "v2": true, "systemd": true, "systemdUser": false, "rdma": false },
            "seccomp": {
                "enabled": true,
                "actions": SECCOMP_ACTIONS,
                "operators": SECCOMP_OPERATORS,
                "archs": SECCOMP_ARCHS,
            },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false },
            "intelRdt": { "enabled": false },
            "mountExtensions": { "idmap": { "enabled": false } },
        },
        "annotations": {
            "io.agentvm.version": env!("CARGO_PKG_VERSION"),
            "io.agentvm.isolation.default": format!("{default_tier} (from {source})"),
            "io.agentvm.isolation.container": "available: namespaces, cgroups v1/v2, seccomp, capabilities (youki libcontainer 0.7); egress policy by address and by name (--egress) from a router namespace the workload's sits behind; refused: a policy on the host's network (--network host)",
            "io.agentvm.isolation.microvm": microvm,
            "io.agentvm.microvm.vmm": vmm,
            "io.agentvm.microvm.vmm.builtin": builtin,
            "io.agentvm.checkpoint": "container tier: checkpoint (libcontainer's CRIU dump) and restore (agentvm's, through CRIU's RPC as runc drives it), with the criu on PATH; microvm tier: neither supported yet (a VM snapshot is the equivalent)",
            "io.agentvm.audit": audit,
            "io.agentvm.microvm.pool": pool,
            "io.agentvm.microvm.kernel": kernel,
        },
        "potentiallyUnsafeConfigAnnotations": ["io.agentvm."],
    });
    super::emit(&format!("{}\n", serde_json::to_string_pretty(&doc)?))
}
