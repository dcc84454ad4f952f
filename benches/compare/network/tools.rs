//! Running `iperf3` and `wrk` (on the host or, through `docker exec`, in a
//! container) and reading their figures.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::cmd;

/// How long a tool may overrun its own duration before it is called hung
/// (connection set-up, a microVM's slow `docker exec`, the proxy's wait).
const SLACK: Duration = Duration::from_secs(60);

/// One `iperf3` run: the receiver's rate over the test.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    pub bits_per_second: f64,
    /// The client's wall clock, set-up included.
    pub wall: Duration,
}

/// One `wrk` run.
#[derive(Debug, Clone, Copy)]
pub struct Http {
    pub requests: u64,
    pub duration: Duration,
    pub errors: u64,
    /// Request written to response read, as wrk measures it.
    pub p50: Duration,
    pub p99: Duration,
}

impl Http {
    pub fn per_second(&self) -> f64 {
        if self.duration.is_zero() {
            return 0.0;
        }
        self.requests as f64 / self.duration.as_secs_f64()
    }

    /// The mean time of one whole exchange (with one connection at a time
    /// and a server that closes after each response: connect, request,
    /// response, close).
    pub fn mean_cycle(&self) -> Option<Duration> {
        (self.requests > 0).then(|| self.duration / self.requests as u32)
    }
}

/// Runs `cmd` (expected to take about `secs`), returning its stdout and
/// wall clock, or everything it printed when it fails.
fn run(cmd: &mut Command, secs: u64) -> Result<(String, Duration), String> {
    let t0 = Instant::now();
    let out = cmd::try_run_with(cmd, None, Duration::from_secs(secs) + SLACK)?;
    let wall = t0.elapsed();
    if !out.success() {
        return Err(out.to_string());
    }
    Ok((out.stdout, wall))
}

/// `iperf3 -c HOST -p PORT -t SECS -J [-R]` run by `cmd` (the program and
/// any prefix, e.g. `docker exec C`, already in it).
pub fn iperf3(
    mut cmd: Command,
    host: &str,
    port: u16,
    secs: u64,
    reverse: bool,
) -> Result<Throughput, String> {
    cmd.args(["-c", host, "-p", &port.to_string(), "-t", &secs.to_string()])
        .args(["-J", "--connect-timeout", "10000"]);
    if reverse {
        cmd.arg("-R");
    }
    let described = cmd::describe(&cmd);
    let (stdout, wall) = match run(&mut cmd, secs) {
        Ok(r) => r,
        // -J puts the error in the JSON on stdout; show it plainly.
        Err(all) => return Err(iperf3_error(&all).unwrap_or(all)),
    };
    let v: serde_json::Value = serde_json::from_str(&stdout)
        .map_err(|e| format!("`{described}`: output is not JSON ({e}):\n{stdout}"))?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(format!("`{described}`: {err}"));
    }
    let bps = v
        .pointer("/end/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .ok_or_else(|| format!("`{described}`: no end.sum_received.bits_per_second"))?;
    Ok(Throughput {
        bits_per_second: bps,
        wall,
    })
}

/// The `"error"` of iperf3's JSON inside a failed command's output.
fn iperf3_error(output: &str) -> Option<String> {
    let start = output.find('{')?;
    let end = output.rfind('}')?;
    let v: serde_json::Value = serde_json::from_str(output.get(start..=end)?).ok()?;
    let err = v.get("error")?.as_str()?;
    let command = output.lines().next().unwrap_or_default();
    Some(format!("{command}\niperf3: {err}"))
}

/// `wrk -t1 -cCONNS -dSECSs -s SCRIPT URL` run by `cmd`.
pub fn wrk(
    mut cmd: Command,
    script: &str,
    url: &str,
    conns: u32,
    secs: u64,
) -> Result<Http, String> {
    cmd.args(["-t1", &format!("-c{conns}"), &format!("-d{secs}s")])
        .args(["--timeout", "10s", "-s", script, url]);
    let described = cmd::describe(&cmd);
    let (stdout, _) = run(&mut cmd, secs)?;
    parse_wrk(&stdout).ok_or_else(|| format!("`{described}`: no avmbench-wrk line in\n{stdout}"))
}

/// The line the report script prints:
/// `avmbench-wrk requests=N duration_us=N errors=N p50_us=N p99_us=N`.
fn parse_wrk(stdout: &str) -> Option<Http> {
    let line = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("avmbench-wrk "))?;
    let field = |key: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some(Http {
        requests: field("requests")?,
        duration: Duration::from_micros(field("duration_us")?),
        errors: field("errors")?,
        p50: Duration::from_micros(field("p50_us")?),
        p99: Duration::from_micros(field("p99_us")?),
    })
}
