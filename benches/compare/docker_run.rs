//! Part (b): `docker run --rm local/busybox true` through the tests' own
//! dockerd, once per runtime it has registered.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::docker::Docker;
use crate::common::rootfs::IMAGE;
use crate::common::{agentvm_bin, RUN_DIR};
use crate::error::BenchError;
use crate::runtimes::Runtime;

/// The runtimes the daemon reports, as `docker info` prints them.
pub fn registered(d: &Docker) -> Result<String, BenchError> {
    let mut cmd = d.cmd();
    cmd.args(["info", "--format", "{{json .Runtimes}}"]);
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(BenchError::Failed {
            command,
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `docker_name` is among the runtimes `docker info` listed.
pub fn is_registered(runtimes_json: &str, docker_name: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(runtimes_json)
        .ok()
        .and_then(|v| v.get(docker_name).map(|_| ()))
        .is_some()
}

/// Client and daemon versions of the test dockerd.
pub fn version(d: &Docker) -> String {
    let out = d
        .cmd()
        .args([
            "version",
            "--format",
            "client {{.Client.Version}}, daemon {{.Server.Version}}",
        ])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => format!("unknown ({})", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => format!("unknown ({e})"),
    }
}

/// One timed `docker run --rm --runtime RT local/busybox true`.
pub fn round(d: &Docker, rt: &Runtime) -> Result<Duration, BenchError> {
    run_true(d, rt.docker_name, &[])
}

/// `Some(why)` when the test dockerd would not run this benchmark's
/// agentvm. Its runtimes run agentvm through one link that
/// `tests/support` points at the binary of whichever test or benchmark run
/// started last, so a test run started by someone else during the
/// benchmark silently swaps the binary under it.
pub fn foreign_agentvm() -> Option<String> {
    let link = Path::new(RUN_DIR).join("bin/agentvm");
    let ours = agentvm_bin();
    match std::fs::read_link(&link) {
        Ok(target) if target == ours => None,
        Ok(target) => Some(format!(
            "{} points at {}, not at this run's {}: another test run re-pointed it, so Docker \
             ran that binary",
            link.display(),
            target.display(),
            ours.display()
        )),
        Err(e) => Some(format!("cannot read {}: {e}", link.display())),
    }
}

/// One timed `docker run --rm --runtime DOCKER_NAME OPTS local/busybox true`;
/// for an agentvm runtime, an error if the daemon's agentvm was not ours
/// before or after it (see [`foreign_agentvm`]).
pub fn run_true(d: &Docker, docker_name: &str, opts: &[&str]) -> Result<Duration, BenchError> {
    let agentvm = docker_name.starts_with("agentvm");
    let check = || match foreign_agentvm() {
        Some(why) if agentvm => Err(BenchError::ForeignAgentvm(why)),
        _ => Ok(()),
    };
    check()?;
    let elapsed = timed_run(d, docker_name, opts)?;
    check()?;
    Ok(elapsed)
}

fn timed_run(d: &Docker, docker_name: &str, opts: &[&str]) -> Result<Duration, BenchError> {
    let mut cmd = d.cmd();
    cmd.args(["run", "--rm", "--runtime", docker_name])
        .args(opts)
        .args([IMAGE, "true"]);
    let command = format!("{cmd:?}");
    let t0 = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::Spawn {
            command: command.clone(),
            source,
        })?;
    let elapsed = t0.elapsed();
    if !out.status.success() {
        return Err(BenchError::Failed {
            command,
            status: out.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(elapsed)
}
