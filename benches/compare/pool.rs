//! Part (a)'s warm-pool entry: the microvm tier with `microvm.pool = 1`
//! (`src/microvm/pool.rs`), filled before its rounds and drained after.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::oci::Workspace;
use crate::runtimes::{self, Runtime};

/// The pooled entry, its root cleared and its pool filled (one VM booted).
pub fn start(ws: &Workspace, microvm: &Runtime) -> Result<Runtime, String> {
    let rt = runtimes::pooled(microvm, &ws.dir)?;
    ws.clear_root(&rt).map_err(|e| e.to_string())?;
    fill(&rt, &ws.root(&rt))?;
    Ok(rt)
}

/// `agentvm pool fill --wait` in `root`.
fn fill(rt: &Runtime, root: &Path) -> Result<(), String> {
    let out = rt
        .command(root)
        .args(["pool", "fill", "--wait"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("agentvm pool fill: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "agentvm pool fill --wait: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Part (b)'s warm-pool entry: the test dockerd's runtime `agentvm-pool`
/// (`tests/support/src/docker.rs`), its pool in the dockerd's runtime root
/// filled.
pub fn docker_start(microvm: &Runtime) -> Result<Runtime, String> {
    let rt = Runtime {
        name: runtimes::MICROVM_POOL,
        program: microvm.program.clone(),
        global_args: vec!["--config".to_string(), crate::common::docker::pool_config()],
        docker_name: "agentvm-pool",
        slow: true,
    };
    fill(&rt, &crate::common::docker::runtime_root())?;
    Ok(rt)
}

/// Waits (at most 60 s) until the pool in `root` holds a booted VM again.
pub fn wait_ready_in(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(root) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends the VMs of the pool in `root`.
pub fn drain_in(rt: &Runtime, root: &Path) {
    let _ = rt
        .command(root)
        .args(["pool", "drain"])
        .stdin(Stdio::null())
        .status();
}

/// Whether a VM of the pool in `root` has booted and waits.
fn ready(root: &Path) -> bool {
    let Ok(slots) = std::fs::read_dir(root.join(".~pool")) else {
        return false;
    };
    slots.flatten().any(|s| s.path().join("ready").exists())
}

/// Waits (at most 60 s) until the pool holds a booted VM again.
pub fn wait_ready(ws: &Workspace, rt: &Runtime) {
    wait_ready_in(&ws.root(rt));
}

/// Ends the pool's VMs.
pub fn drain(ws: &Workspace, rt: &Runtime) {
    drain_in(rt, &ws.root(rt));
}
