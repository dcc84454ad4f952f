//! Part (d): networking, on the tests' own dockerd, for runc, agentvm's
//! container tier and its microvm tier, without and with an egress policy:
//!
//! - TCP throughput (`iperf3`) both ways, with the connection made from
//!   outside (server in the container, client on the host) and made by the
//!   container (client in the container, server in a runc container on the
//!   same network: under a policy every such connection goes through
//!   agentvm's transparent proxy);
//! - HTTP requests/s and latency (`wrk`) against busybox `httpd` in the
//!   container, from the host;
//! - the proxy's cost per connection: `wrk` in the container against
//!   `httpd` in the runc container, one connection at a time;
//! - what networking adds to `docker run --rm` cold start: the default
//!   bridge against `--network none`.
//!
//! Each throughput and HTTP figure is one run of a few seconds per runtime
//! (the runtimes one after the other); the cold starts are interleaved
//! rounds, as in the other parts.

mod cold;
mod image;
mod render;
mod tools;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::cmd;
use crate::common::docker::{docker, Docker};
use crate::docker_run;
use crate::runtimes::{self, Runtime};
use crate::Options;

use image::Tools;
use tools::{Http, Throughput};

/// The Docker runtime whose policy the "+ policy" microvm row uses, and
/// that policy (from the test dockerd's `daemon.json`): TCP to the name
/// `web` on port 80 only, so the benchmark's server is named `web` and
/// listens on port 80.
pub const POLICY_RUNTIME: &str = "agentvm-only-web";
const POLICY: &str = "--egress web:80";
/// The same policy in the container tier.
pub const CONTAINER_POLICY_RUNTIME: &str = "agentvm-container-only-web";
/// The port of the iperf3 server in the measured container.
const IPERF_PORT: u16 = 5201;
/// `wrk` connections from the host (requests/s), and from the container
/// to the server (one at a time: the time of one connection).
const WRK_CONNS_IN: u32 = 4;
const WRK_CONNS_OUT: u32 = 1;
/// How long the measured container's servers may take to answer.
const READY_SECS: u64 = 120;

/// One row of the network tables: a Docker runtime, or why there is none.
pub struct NetRow {
    pub name: &'static str,
    pub docker_name: Result<&'static str, Unmeasured>,
    /// Boots a VM (fewer cold-start rounds, see `main::Schedule`).
    pub slow: bool,
}

/// Why a row has no figures.
#[derive(Debug, Clone)]
pub enum Unmeasured {
    /// It exists but cannot run here: `skipped: why`.
    Skipped(String),
}

impl Unmeasured {
    fn text(&self) -> String {
        match self {
            Unmeasured::Skipped(why) => format!("skipped: {why}"),
        }
    }
}

/// One figure of one row.
#[derive(Debug, Clone)]
pub enum Cell<T> {
    Done(T),
    Unmeasured(Unmeasured),
    Failed(String),
}

impl<T> Cell<T> {
    fn from(r: Result<T, String>) -> Cell<T> {
        match r {
            Ok(v) => Cell::Done(v),
            Err(e) => Cell::Failed(e),
        }
    }

    fn skipped(why: &str) -> Cell<T> {
        Cell::Unmeasured(Unmeasured::Skipped(why.to_string()))
    }

    pub fn done(&self) -> Option<&T> {
        match self {
            Cell::Done(v) => Some(v),
            _ => None,
        }
    }
}

/// Everything measured for one row, besides cold start.
pub struct Figures {
    pub name: &'static str,
    /// Why the whole row has no figures, if it has none.
    pub whole: Option<Unmeasured>,
    /// iperf3, server in the container: host → container, container → host.
    pub into: Cell<Throughput>,
    pub out_of: Cell<Throughput>,
    /// iperf3, client in the container: container → web, web → container.
    pub to_web: Cell<Throughput>,
    pub from_web: Cell<Throughput>,
    /// wrk from the host against httpd in the container.
    pub http_in: Cell<Http>,
    /// wrk in the container against httpd in the runc container.
    pub http_out: Cell<Http>,
}

impl Figures {
    fn all(name: &'static str, why: Unmeasured) -> Figures {
        Figures {
            name,
            whole: Some(why.clone()),
            into: Cell::Unmeasured(why.clone()),
            out_of: Cell::Unmeasured(why.clone()),
            to_web: Cell::Unmeasured(why.clone()),
            from_web: Cell::Unmeasured(why.clone()),
            http_in: Cell::Unmeasured(why.clone()),
            http_out: Cell::Unmeasured(why),
        }
    }

    fn failed(name: &'static str, why: &str) -> Figures {
        Figures {
            name,
            whole: None,
            into: Cell::Failed(why.to_string()),
            out_of: Cell::Failed(why.to_string()),
            to_web: Cell::Failed(why.to_string()),
            from_web: Cell::Failed(why.to_string()),
            http_in: Cell::Failed(why.to_string()),
            http_out: Cell::Failed(why.to_string()),
        }
    }

    /// (what, error) of each figure that failed.
    pub fn failures(&self) -> Vec<(&'static str, &str)> {
        fn f<'a, T>(what: &'static str, c: &'a Cell<T>) -> Option<(&'static str, &'a str)> {
            match c {
                Cell::Failed(e) => Some((what, e.as_str())),
                _ => None,
            }
        }
        [
            f("iperf3 host → container", &self.into),
            f("iperf3 container → host", &self.out_of),
            f("iperf3 container → web", &self.to_web),
            f("iperf3 web → container", &self.from_web),
            f("wrk from the host", &self.http_in),
            f("wrk to web", &self.http_out),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The rows, in table order, from the runtimes found and those the test
/// dockerd registered.
fn rows(runtimes: &[Runtime], registered: &str) -> Vec<NetRow> {
    let has = |name: &str| runtimes.iter().any(|r| r.name == name);
    let row = |name: &'static str, bench_name: &str, docker_name: &'static str, slow: bool| {
        let docker_name = if !has(bench_name) {
            Err(Unmeasured::Skipped(format!(
                "{bench_name} is not available (see the skipped runtimes above)"
            )))
        } else if !docker_run::is_registered(registered, docker_name) {
            Err(Unmeasured::Skipped(format!(
                "runtime {docker_name:?} is not registered with the test dockerd"
            )))
        } else {
            Ok(docker_name)
        };
        NetRow {
            name,
            docker_name,
            slow,
        }
    };
    vec![
        row(runtimes::REFERENCE, runtimes::REFERENCE, "runc", false),
        row(
            "agentvm container",
            "agentvm container",
            "agentvm-container",
            false,
        ),
        row(
            "agentvm container + policy",
            "agentvm container",
            CONTAINER_POLICY_RUNTIME,
            false,
        ),
        row(runtimes::MICROVM, runtimes::MICROVM, "agentvm", true),
        row(
            "agentvm microvm + policy",
            runtimes::MICROVM,
            POLICY_RUNTIME,
            true,
        ),
    ]
}

/// A container or network of the test dockerd, removed on drop.
struct Owned<'a> {
    d: &'a Docker,
    kind: &'static str,
    name: String,
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        let args: &[&str] = match self.kind {
            "network" => &["network", "rm"],
            _ => &["rm", "-f"],
        };
        let mut c = self.d.cmd();
        c.args(args).arg(&self.name);
        match cmd::try_run_with(&mut c, None, Duration::from_secs(120)) {
            Ok(o) if o.success() => {}
            Ok(o) => eprintln!("network: cleanup of {} failed:\n{o}", self.name),
            Err(e) => eprintln!("network: cleanup of {} failed: {e}", self.name),
        }
    }
}

/// `docker ARGS` on the test daemon; stdout, or everything it printed.
fn docker_cmd(d: &Docker, args: &[&str], secs: u64) -> Result<String, String> {
    let mut c = d.cmd();
    c.args(args);
    let out = cmd::try_run_with(&mut c, None, Duration::from_secs(secs))?;
    if !out.success() {
        return Err(out.to_string());
    }
    Ok(out.stdout.trim().to_string())
}

/// `docker run -d --name NAME OPTS IMAGE ARGS`, removed on drop.
fn start<'a>(
    d: &'a Docker,
    name: String,
    opts: &[&str],
    args: &[&str],
) -> Result<Owned<'a>, String> {
    let owned = Owned {
        d,
        kind: "container",
        name,
    };
    let mut all = vec!["run", "-d", "--name", &owned.name];
    all.extend_from_slice(opts);
    all.push(image::IMAGE);
    all.extend_from_slice(args);
    docker_cmd(d, &all, 180)?;
    Ok(owned)
}

/// A shell loop, bounded to about 30 s, until something listens on TCP
/// `port` (`want` true) or nothing does (`want` false).
fn wait_listen(port: u16, want: bool) -> String {
    let bang = if want { "!" } else { "" };
    format!(
        "i=0; while {bang} netstat -ltn | grep -q ':{port} '; do \
         i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done"
    )
}

/// What the `web` container serves on port 80.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serve {
    Http,
    Iperf,
}

/// The server the containers connect to: a runc container named `web` on
/// the benchmark's network, serving HTTP or iperf3 on port 80 (the only
/// port the policy allows).
struct Web<'a> {
    container: Owned<'a>,
    serving: Option<Serve>,
}

impl Web<'_> {
    fn serve(&mut self, what: Serve) -> Result<(), String> {
        if self.serving == Some(what) {
            return Ok(());
        }
        let start = match what {
            Serve::Http => "httpd -p 80 -h /www",
            Serve::Iperf => "iperf3 -s -p 80 -D",
        };
        let script = format!(
            "killall -q httpd iperf3; {}; {start}; {}",
            wait_listen(80, false),
            wait_listen(80, true)
        );
        self.serving = None;
        docker_cmd(
            self.container.d,
            &["exec", &self.container.name, "sh", "-c", &script],
            60,
        )?;
        self.serving = Some(what);
        Ok(())
    }
}

/// Polls `GET /` on `addr` until it answers 200.
fn wait_http(addr: &str, secs: u64) -> Result<(), String> {
    let sa: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let get = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET / HTTP/1.0\r\nHost: bench\r\n\r\n")?;
        let mut all = Vec::new();
        s.read_to_end(&mut all)?;
        Ok(all.starts_with(b"HTTP/1.") && all.windows(5).any(|w| w == b" 200 "))
    };
    crate::common::wait_for(secs, || get().ok().filter(|ok| *ok))
        .map(|_| ())
        .ok_or_else(|| format!("nothing answered GET / on {addr} within {secs} s"))
}

/// The shell line of the measured container: iperf3 server (when the image
/// has it) and httpd on port 80 in the foreground.
fn server_script(iperf: bool) -> String {
    let mut s = String::new();
    if iperf {
        s.push_str(&format!(
            "iperf3 -s -p {IPERF_PORT} >/dev/null 2>&1 & {}; ",
            wait_listen(IPERF_PORT, true)
        ));
    }
    s.push_str("exec httpd -f -p 80 -h /www");
    s
}

/// What one row's measurements share.
struct Ctx<'a> {
    d: &'a Docker,
    tools: &'a Tools,
    network: &'a str,
    wrk_script: &'a Path,
    secs: u64,
}

/// Starts the measured container of one row (servers: iperf3 and httpd)
/// and waits until it serves; the container and its address.
fn start_measured<'a>(ctx: &Ctx<'a>, docker_name: &str) -> Result<(Owned<'a>, String), String> {
    let cname = format!("avmb-net-{docker_name}-{}", std::process::id());
    let script = server_script(ctx.tools.iperf3.is_ok());
    let c = start(
        ctx.d,
        cname,
        &["--runtime", docker_name, "--network", ctx.network],
        &["sh", "-c", &script],
    )?;
    let format = format!(
        "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
        ctx.network
    );
    let ip = docker_cmd(ctx.d, &["inspect", "--format", &format, &c.name], 30)?;
    if let Err(e) = wait_http(&format!("{ip}:80"), READY_SECS) {
        let logs = docker_cmd(ctx.d, &["logs", &c.name], 30).unwrap_or_else(|e| e);
        return Err(format!("{e}\ncontainer logs:\n{logs}"));
    }
    Ok((c, ip))
}

/// Every figure but cold start of one measurable row: starts its
/// container, measures, removes it.
fn measure(ctx: &Ctx, web: &mut Web, name: &'static str, docker_name: &str) -> Figures {
    eprintln!("network: {name}: starting its container");
    let (c, ip) = match start_measured(ctx, docker_name) {
        Ok(started) => started,
        Err(e) => return Figures::failed(name, &e),
    };
    let secs = ctx.secs;
    let in_container = |program: &str| {
        let mut cmd = ctx.d.cmd();
        cmd.args(["exec", &c.name, program]);
        cmd
    };
    let step = |what: &str| eprintln!("network: {name}: {what}");

    let (into, out_of) = match &ctx.tools.iperf3 {
        Ok(iperf3) => {
            // `iperf3 -s` serves one test at a time and listens again
            // after it: in a slow guest the second client can come first.
            let run = |reverse: bool| {
                let mut tries = 0;
                loop {
                    let r = tools::iperf3(Command::new(iperf3), &ip, IPERF_PORT, secs, reverse);
                    match &r {
                        Err(e) if e.contains("Connection refused") && tries < 20 => {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(250));
                        }
                        _ => return r,
                    }
                }
            };
            step("iperf3, host → container");
            let a = run(false);
            step("iperf3, container → host");
            let b = run(true);
            (Cell::from(a), Cell::from(b))
        }
        Err(why) => (Cell::skipped(why), Cell::skipped(why)),
    };
    let (http_in, http_out) = match &ctx.tools.wrk {
        Ok(wrk) => {
            step("wrk from the host");
            let script = ctx.wrk_script.display().to_string();
            let url = format!("http://{ip}:80/");
            let a = tools::wrk(Command::new(wrk), &script, &url, WRK_CONNS_IN, secs);
            step("wrk to web");
            let b = web.serve(Serve::Http).and_then(|()| {
                let url = "http://web:80/";
                tools::wrk(
                    in_container("wrk"),
                    image::WRK_SCRIPT,
                    url,
                    WRK_CONNS_OUT,
                    secs,
                )
            });
            (Cell::from(a), Cell::from(b))
        }
        Err(why) => (Cell::skipped(why), Cell::skipped(why)),
    };
    let (to_web, from_web) = match &ctx.tools.iperf3 {
        Ok(_) => {
            step("iperf3, container → web");
            let a = web
                .serve(Serve::Iperf)
                .and_then(|()| tools::iperf3(in_container("iperf3"), "web", 80, secs, false));
            step("iperf3, web → container");
            let b = web
                .serve(Serve::Iperf)
                .and_then(|()| tools::iperf3(in_container("iperf3"), "web", 80, secs, true));
            (Cell::from(a), Cell::from(b))
        }
        Err(why) => (Cell::skipped(why), Cell::skipped(why)),
    };
    Figures {
        name,
        whole: None,
        into,
        out_of,
        to_web,
        from_web,
        http_in,
        http_out,
    }
}

/// [`measure`], for an agentvm row only if the test dockerd runs this
/// benchmark's agentvm before and after it (another test run on the
/// machine may re-point it): figures of another build would be wrong
/// without anything showing it.
fn measure_ours(ctx: &Ctx, web: &mut Web, name: &'static str, docker_name: &str) -> Figures {
    let agentvm = docker_name.starts_with("agentvm");
    let foreign = || docker_run::foreign_agentvm().filter(|_| agentvm);
    if let Some(why) = foreign() {
        return Figures::failed(name, &why);
    }
    let figures = measure(ctx, web, name, docker_name);
    match foreign() {
        Some(why) => Figures::failed(name, &format!("{why} (during this row)")),
        None => figures,
    }
}

/// The throughput and HTTP figures of every row.
fn throughput(ctx: &Ctx, rows: &[NetRow]) -> Result<Vec<Figures>, String> {
    let web_name = format!("avmb-net-web-{}", std::process::id());
    let web = start(
        ctx.d,
        web_name,
        &[
            "--runtime",
            "runc",
            "--network",
            ctx.network,
            "--network-alias",
            "web",
        ],
        &["sleep", "1000000"],
    )?;
    let mut web = Web {
        container: web,
        serving: None,
    };
    let mut out = Vec::new();
    for row in rows {
        out.push(match &row.docker_name {
            Ok(docker_name) => measure_ours(ctx, &mut web, row.name, docker_name),
            Err(why) => Figures::all(row.name, why.clone()),
        });
    }
    Ok(out)
}

/// What part (d) hands back to the report.
pub struct Outcome {
    pub section: String,
    /// Whether everything measured could be.
    pub ok: bool,
    /// Versions of the tools, for the machine table.
    pub versions: Vec<(String, String)>,
}

/// Part (d).
pub fn part(opts: &Options, dir: &Path, runtimes: &[Runtime]) -> anyhow::Result<Outcome> {
    let title = "## (d) Networking";
    let d = match docker() {
        Ok(d) => d,
        Err(why) => {
            println!("skipped: network part: {why}");
            return Ok(Outcome {
                section: format!("{title}\n\nskipped: {why}\n"),
                ok: true,
                versions: Vec::new(),
            });
        }
    };
    let registered = docker_run::registered(d)?;
    let rows = rows(runtimes, &registered);
    for r in &rows {
        if let Err(Unmeasured::Skipped(why)) = &r.docker_name {
            println!("skipped: network part, {}: {why}", r.name);
        }
    }
    let tools = Tools::find();
    for why in [&tools.iperf3, &tools.wrk]
        .into_iter()
        .filter_map(|t| t.as_ref().err())
    {
        println!("skipped: network part: {why}");
    }
    let mut ok = true;
    let mut sections = Vec::new();
    match image::ensure(d, &tools, dir) {
        Ok(wrk_script) => {
            let network = format!("avmb-net-{}", std::process::id());
            docker_cmd(d, &["network", "create", &network], 60).map_err(anyhow::Error::msg)?;
            let net = Owned {
                d,
                kind: "network",
                name: network.clone(),
            };
            let ctx = Ctx {
                d,
                tools: &tools,
                network: &network,
                wrk_script: &wrk_script,
                secs: opts.net_seconds,
            };
            match throughput(&ctx, &rows) {
                Ok(figures) => {
                    ok &= figures.iter().all(|f| f.failures().is_empty());
                    sections.push(render::throughput(&figures, opts.net_seconds));
                }
                Err(e) => {
                    ok = false;
                    sections.push(format!(
                        "The server container `web` failed:\n\n```\n{e}\n```\n"
                    ));
                }
            }
            drop(net);
        }
        Err(e) => {
            ok = false;
            sections.push(format!(
                "The image {} could not be made:\n\n```\n{e}\n```\n",
                image::IMAGE
            ));
        }
    }
    let (cold, cold_ok) = cold::part(opts, d, &rows);
    sections.push(cold);
    ok &= cold_ok;
    let mut versions = tools.versions();
    versions.push(("docker".into(), docker_run::version(d)));
    Ok(Outcome {
        section: format!("{title}\n\n{}", sections.join("\n")),
        ok,
        versions,
    })
}
