//! Part (b): `docker run --rm local/busybox true` through the tests' own
//! dockerd, once per runtime it has registered.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::docker::Docker;
use crate::common::rootfs::IMAGE;
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

/// One timed `docker run --rm --runtime DOCKER_NAME OPTS local/busybox true`.
pub fn run_true(d: &Docker, docker_name: &str, opts: &[&str]) -> Result<Duration, BenchError> {
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
