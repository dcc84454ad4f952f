//! The machine a run was made on, and the host setup every runtime needs.

use std::path::Path;

use crate::error::BenchError;

/// /proc/loadavg when the run began, before our own load.
static LOAD_AT_START: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records the load average before anything is measured.
pub fn note_load() {
    let _ = LOAD_AT_START.set(read("/proc/loadavg"));
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `key : value` lines of /proc/cpuinfo or /proc/meminfo.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

fn cgroup_layout() -> &'static str {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2 (unified)"
    } else if Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
        "hybrid (v1 controllers, cgroup2 at /sys/fs/cgroup/unified)"
    } else {
        "v1"
    }
}

/// Rows of the machine table: (what, value).
pub fn describe(versions: &[(String, String)]) -> Vec<(String, String)> {
    let cpuinfo = read("/proc/cpuinfo");
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let meminfo = read("/proc/meminfo");
    let memory = field(&meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    let mut rows = vec![
        (
            "CPU".to_string(),
            field(&cpuinfo, "model name")
                .unwrap_or("unknown")
                .to_string(),
        ),
        ("cores".to_string(), cores.to_string()),
        ("memory".to_string(), memory),
        ("OS".to_string(), os),
        (
            "kernel".to_string(),
            read("/proc/sys/kernel/osrelease").trim().to_string(),
        ),
        ("cgroups".to_string(), cgroup_layout().to_string()),
    ];
    let load: Vec<&str> = LOAD_AT_START
        .get()
        .map(|l| l.split_whitespace().take(3).collect())
        .unwrap_or_default();
    if !load.is_empty() {
        rows.push(("load average at start".to_string(), load.join(" ")));
    }
    rows.extend(versions.iter().cloned());
    rows
}

/// Whether a v1 controller is enabled in the kernel but mounted nowhere
/// (hierarchy 0 in /proc/cgroups).
fn v1_controller_unmounted(controller: &str) -> bool {
    read("/proc/cgroups").lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 4 && f[0] == controller && f[1] == "0" && f[3] == "1"
    })
}

/// On a v1 or hybrid cgroup layout, crun refuses to run unless every
/// enabled v1 controller it knows is mounted; hugetlb is the one this kind
/// of host leaves out. Mounts it at /sys/fs/cgroup/hugetlb if missing and
/// says so; every runtime then sees the same layout.
pub fn ensure_hugetlb() -> Result<Option<String>, BenchError> {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        || !v1_controller_unmounted("hugetlb")
    {
        return Ok(None);
    }
    let target = Path::new("/sys/fs/cgroup/hugetlb");
    std::fs::create_dir_all(target).map_err(|source| BenchError::File {
        what: "cannot create",
        path: target.to_path_buf(),
        source,
    })?;
    nix::mount::mount(
        Some("cgroup"),
        target,
        Some("cgroup"),
        nix::mount::MsFlags::empty(),
        Some("hugetlb"),
    )
    .map_err(|e| BenchError::Sys {
        what: format!("mount -t cgroup -o hugetlb cgroup {}", target.display()),
        source: e.into(),
    })?;
    Ok(Some(format!(
        "mounted the hugetlb cgroup v1 hierarchy at {} (crun needs it)",
        target.display()
    )))
}
