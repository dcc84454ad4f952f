//! Side-by-side cold-start benchmark of agentvm against runc and crun, in
//! one run on one machine (see docs/benchmarks.md for results).
//!
//! (a) the OCI lifecycle of `/bin/true` from a busybox bundle, driven the
//!     way containerd's shim drives a runtime: `create --pid-file`,
//!     `start`, wait for the init to exit (pidfd, as its subreaper),
//!     `delete`; and, under the microvm tier, the floor: plain QEMU booting
//!     the same kernel to an `/init` that powers off;
//! (b) `docker run --rm local/busybox true` on the tests' own dockerd;
//! (c) host memory per idle container (`sleep`): RSS and PSS of the
//!     container's processes, and the guest pages a microVM touched;
//! (d) networking on the tests' dockerd, without and with an egress
//!     policy: TCP throughput both ways (`iperf3`), HTTP requests/s and
//!     latency (`wrk`), a connection through agentvm's proxy against a
//!     direct one, and what the network adds to `docker run` cold start;
//! (e) Kubernetes pods through containerd's CRI: pod start (RunPodSandbox +
//!     one container) and teardown with runc's shim and agentvm's two
//!     tiers, and the host memory of microvm-tier pods of 1 and 4
//!     containers against 4 one-container pods;
//! (f) the builtin VMM beside QEMU, both on KVM, in one run inside the test
//!     host of `make test-builtin` (nested KVM on TCG: correctness-grade):
//!     VM creation to the first guest instruction, the boot to the agent,
//!     `run true`, and the host memory of an idle VM beyond its guest pages.
//!
//! Rounds are interleaved: every round runs each runtime once, in an order
//! that rotates from round to round, so machine noise hits all of them.
//! Entries that boot a VM may take part in fewer rounds, spread evenly
//! through the run.
//!
//!     cargo bench --bench compare             # all parts (needs root)
//!     cargo bench --bench compare -- oci      # only (a); `docker`: only
//!                                             # (b); `memory`: only (c);
//!                                             # `network`: only (d);
//!                                             # `pod`: only (e);
//!                                             # `testhost`: only (f)
//!
//! Environment: AGENTVM_BENCH_ROUNDS (a, default 50),
//! AGENTVM_BENCH_DOCKER_ROUNDS (b, default 20),
//! AGENTVM_BENCH_MICROVM_ROUNDS (at most this many rounds of (a) and (b)
//! for the microvm tier and the QEMU floor, default 20),
//! AGENTVM_BENCH_WARMUP (untimed rounds per runtime first, default 2),
//! AGENTVM_BENCH_IDLE (c: idle containers per runtime, default 3),
//! AGENTVM_BENCH_NET_SECONDS (d: length of each iperf3 and wrk run,
//! default 5), AGENTVM_BENCH_NET_ROUNDS (d: cold-start rounds, default 10),
//! AGENTVM_BENCH_POD_ROUNDS (e, default 10), AGENTVM_BENCH_MICROVM_POD_ROUNDS
//! (e: at most this many for the microvm tier, default 5),
//! AGENTVM_BENCH_TESTHOST_ROUNDS (f: rounds per VMM, default 5),
//! AGENTVM_BENCH_REPORT (also write the markdown report to this file, and
//! beside it, with the extension `.svg`, a chart of parts (a) and (c)).

mod chart;
mod docker_run;
mod error;
mod machine;
mod memory;
mod network;
mod oci;
mod pod;
mod pool;
mod qemu_floor;
mod reaper;
mod runtimes;
mod stats;
mod testhost;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use agentvm_test_support as common;
use anyhow::Context as _;

use error::BenchError;
use qemu_floor::Floor;
use runtimes::Runtime;
use stats::{
    median_u64, memory_table, mib, ms, phase_table, ratio_table, summarize, MemRow, Row, Series,
};

/// Bundle, runtime roots, configs and logs.
pub const BENCH_DIR: &str = "/run/agentvm-bench";

struct Options {
    oci: bool,
    docker: bool,
    memory: bool,
    network: bool,
    pod: bool,
    testhost: bool,
    testhost_rounds: usize,
    oci_rounds: usize,
    docker_rounds: usize,
    microvm_rounds: usize,
    warmup: usize,
    idle: usize,
    net_seconds: u64,
    net_rounds: usize,
    pod_rounds: usize,
    microvm_pod_rounds: usize,
    report: Option<PathBuf>,
}

fn env_count(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

impl Options {
    fn parse() -> anyhow::Result<Options> {
        let mut parts = Vec::new();
        // cargo bench passes `--bench`; other flags are not ours either.
        for arg in std::env::args().skip(1).filter(|a| !a.starts_with('-')) {
            match arg.as_str() {
                "oci" | "docker" | "memory" | "network" | "pod" | "testhost" => parts.push(arg),
                other => {
                    anyhow::bail!(
                        "unknown part {other:?}: expected `oci`, `docker`, `memory`, `network`, \
                         `pod` or `testhost`"
                    )
                }
            }
        }
        let all = parts.is_empty();
        let has = |p: &str| all || parts.iter().any(|q| q == p);
        Ok(Options {
            oci: has("oci"),
            docker: has("docker"),
            memory: has("memory"),
            network: has("network"),
            pod: has("pod"),
            testhost: has("testhost"),
            testhost_rounds: env_count("AGENTVM_BENCH_TESTHOST_ROUNDS", 5)?.max(1),
            oci_rounds: env_count("AGENTVM_BENCH_ROUNDS", 50)?,
            docker_rounds: env_count("AGENTVM_BENCH_DOCKER_ROUNDS", 20)?,
            microvm_rounds: env_count("AGENTVM_BENCH_MICROVM_ROUNDS", 20)?,
            warmup: env_count("AGENTVM_BENCH_WARMUP", 2)?,
            idle: env_count("AGENTVM_BENCH_IDLE", 3)?.max(1),
            net_seconds: env_count("AGENTVM_BENCH_NET_SECONDS", 5)?.max(1) as u64,
            net_rounds: env_count("AGENTVM_BENCH_NET_ROUNDS", 10)?,
            pod_rounds: env_count("AGENTVM_BENCH_POD_ROUNDS", 10)?,
            microvm_pod_rounds: env_count("AGENTVM_BENCH_MICROVM_POD_ROUNDS", 5)?,
            report: std::env::var_os("AGENTVM_BENCH_REPORT").map(PathBuf::from),
        })
    }
}

/// Something measured in the interleaved rounds.
trait Entry {
    fn name(&self) -> &'static str;
    /// Boots a VM: may take part in fewer rounds (see [`Schedule`]).
    fn slow(&self) -> bool;
}

impl Entry for &Runtime {
    fn name(&self) -> &'static str {
        self.name
    }
    fn slow(&self) -> bool {
        self.slow
    }
}

/// An entry of part (a): a runtime, or the QEMU floor.
enum OciEntry<'a> {
    Runtime(&'a Runtime),
    Floor(&'a Floor),
}

impl Entry for OciEntry<'_> {
    fn name(&self) -> &'static str {
        match self {
            OciEntry::Runtime(rt) => rt.name,
            OciEntry::Floor(_) => qemu_floor::NAME,
        }
    }
    fn slow(&self) -> bool {
        match self {
            OciEntry::Runtime(rt) => rt.slow,
            OciEntry::Floor(_) => true,
        }
    }
}

/// Which rounds each entry takes part in: every warm-up round, and every
/// timed round except for slow entries, which run in `slow_rounds` of them
/// spread evenly through the run (all in the same rounds, so the microvm
/// tier and its QEMU floor are measured side by side).
#[derive(Debug, Clone, Copy)]
struct Schedule {
    rounds: usize,
    slow_rounds: usize,
    warmup: usize,
}

impl Schedule {
    fn new(rounds: usize, slow_rounds: usize, warmup: usize) -> Schedule {
        Schedule {
            rounds,
            slow_rounds: slow_rounds.min(rounds),
            warmup,
        }
    }

    fn runs(&self, slow: bool, round: usize) -> bool {
        if !slow || round < self.warmup || self.slow_rounds == self.rounds {
            return true;
        }
        let (r, s, n) = (round - self.warmup, self.slow_rounds, self.rounds);
        (r + 1) * s / n != r * s / n
    }

    /// "50 rounds per runtime (20 for X and Y, spread evenly through the
    /// run), interleaved, after 2 untimed warm-up round(s)".
    fn describe<E: Entry>(&self, entries: &[E]) -> String {
        let mut slow: Vec<&str> = entries
            .iter()
            .filter(|e| e.slow())
            .map(|e| e.name())
            .collect();
        // An entry may appear more than once in a row (part (d)).
        slow.dedup();
        let fewer = if slow.is_empty() || self.slow_rounds == self.rounds {
            String::new()
        } else {
            format!(
                " ({} for {}, spread evenly through the run)",
                self.slow_rounds,
                slow.join(" and ")
            )
        };
        format!(
            "{} rounds per runtime{fewer}, interleaved, after {} untimed warm-up round(s)",
            self.rounds, self.warmup
        )
    }
}

/// Runs `warmup + rounds` rounds; each round calls `one` once per entry
/// scheduled in it, starting one entry further along the list each time.
/// Warm-up samples are dropped; failures are kept, warm-up or not.
fn interleave<E: Entry, T>(
    entries: &[E],
    schedule: Schedule,
    label: &str,
    mut one: impl FnMut(&E, usize) -> Result<T, BenchError>,
) -> Vec<Series<T>> {
    let mut series: Vec<Series<T>> = entries.iter().map(|e| Series::new(e.name())).collect();
    let n = entries.len();
    let total = schedule.warmup + schedule.rounds;
    for round in 0..total {
        for k in 0..n {
            let i = (round + k) % n;
            if !schedule.runs(entries[i].slow(), round) {
                continue;
            }
            match one(&entries[i], round) {
                Ok(v) if round >= schedule.warmup => series[i].samples.push(v),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("{label}: {} round {round} failed: {e}", entries[i].name());
                    series[i].failures.push(e.to_string());
                }
            }
        }
        if (round + 1) % 10 == 0 || round + 1 == total {
            eprintln!("{label}: {}/{total} rounds", round + 1);
        }
    }
    series
}

/// The first failure of each runtime that had any, for the report.
fn failure_notes<T>(series: &[Series<T>]) -> String {
    let mut out = String::new();
    for s in series {
        out.push_str(&failure_note(s.name, &s.failures));
    }
    out
}

/// "NAME failed N round(s); the first: ..." for the report; empty when
/// `failures` is.
pub fn failure_note(name: &str, failures: &[String]) -> String {
    match failures.first() {
        Some(first) => format!(
            "\n{name} failed {} round(s); the first:\n\n```\n{}\n```\n",
            failures.len(),
            first.trim()
        ),
        None => String::new(),
    }
}

/// The microvm tier against the raw boot under it, from part (a)'s rows.
fn overhead_table(rows: &[Row]) -> Option<String> {
    let get = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.summary);
    let (vm, floor) = (get(runtimes::MICROVM)?, get(qemu_floor::NAME)?);
    let pooled = get(runtimes::MICROVM_POOL);
    let diff = |a: Duration, b: Duration| {
        if a >= b {
            format!("+{}", ms(a - b))
        } else {
            format!("−{}", ms(b - a))
        }
    };
    let ratio = |a: Duration, b: Duration| {
        if b.is_zero() {
            "n/a".to_string()
        } else {
            format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64())
        }
    };
    let mut table = format!(
        "| | median | p90 |\n|---|---:|---:|\n\
         | {} | {} | {} |\n\
         | {} | {} | {} |\n\
         | agentvm's overhead (difference) | {} | {} |\n\
         | ratio | {} | {} |\n",
        runtimes::MICROVM,
        ms(vm.median),
        ms(vm.p90),
        qemu_floor::NAME,
        ms(floor.median),
        ms(floor.p90),
        diff(vm.median, floor.median),
        diff(vm.p90, floor.p90),
        ratio(vm.median, floor.median),
        ratio(vm.p90, floor.p90),
    );
    if let Some(p) = pooled {
        table.push_str(&format!(
            "| {} | {} | {} |\n\
             | its difference from the floor | {} | {} |\n\
             | its ratio to the floor | {} | {} |\n",
            runtimes::MICROVM_POOL,
            ms(p.median),
            ms(p.p90),
            diff(p.median, floor.median),
            diff(p.p90, floor.p90),
            ratio(p.median, floor.median),
            ratio(p.p90, floor.p90),
        ));
    }
    Some(table)
}

/// A microVM's round part by part: what runs before the supervisor's
/// trace (the `create` command and the supervisor's start), each part of
/// the trace, then `start`, the wait for the exit (the VM's shutdown
/// included) and `delete`. `None` when the runtime keeps no trace.
fn boot_table(samples: &[oci::Phases]) -> Option<String> {
    let mut table = String::from("| part | median |\n|---|---:|\n");
    for (name, d) in boot_parts(samples)? {
        table.push_str(&format!(
            "| {name} | {} |\n",
            d.map_or_else(|| "–".to_string(), ms)
        ));
    }
    Some(table)
}

/// The parts of a microvm round (medians), the round last; `None` without
/// a boot trace.
fn boot_parts(samples: &[oci::Phases]) -> Option<Vec<(String, Option<Duration>)>> {
    let traced: Vec<&oci::Phases> = samples.iter().filter(|p| !p.boot.is_empty()).collect();
    let first = traced.first()?;
    let mut lines: Vec<(String, Option<Duration>)> = Vec::new();
    let traced_sum = |p: &oci::Phases| p.boot.iter().map(|(_, d)| *d).sum::<Duration>();
    lines.push((
        "`create` before the trace (command, supervisor start)".into(),
        summarize(
            traced
                .iter()
                .map(|p| p.create.saturating_sub(traced_sum(p))),
        )
        .map(|m| m.median),
    ));
    for (name, _) in &first.boot {
        let of = |p: &&oci::Phases| {
            p.boot
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| *d)
                .unwrap_or_default()
        };
        lines.push((
            format!("create: {name}"),
            summarize(traced.iter().map(of)).map(|m| m.median),
        ));
    }
    let median =
        |f: fn(&oci::Phases) -> Duration| summarize(traced.iter().map(|p| f(p))).map(|m| m.median);
    lines.push(("`start`".into(), median(|p| p.start)));
    lines.push((
        "wait for exit (VM shutdown included)".into(),
        median(|p| p.wait),
    ));
    lines.push(("`delete`".into(), median(|p| p.delete)));
    lines.push(("round".into(), median(|p| p.total)));
    Some(lines)
}

/// Part (a). Returns the report section and whether every round passed.
fn oci_part(
    opts: &Options,
    ws: &oci::Workspace,
    runtimes: &[Runtime],
    floor: Option<&Floor>,
    chart: &mut chart::Chart,
) -> anyhow::Result<(String, bool)> {
    reaper::set_subreaper(true)?;
    let pid = std::process::id();
    // The microvm tier once more, taking its VMs from a warm pool of one.
    let pooled = match runtimes.iter().find(|r| r.name == runtimes::MICROVM) {
        Some(vm) => match pool::start(ws, vm) {
            Ok(p) => Some(p),
            Err(why) => {
                println!("skipped: {}: {why}", runtimes::MICROVM_POOL);
                None
            }
        },
        None => None,
    };
    let mut entries: Vec<OciEntry> = runtimes.iter().map(OciEntry::Runtime).collect();
    entries.extend(pooled.iter().map(OciEntry::Runtime));
    entries.extend(floor.map(OciEntry::Floor));
    let schedule = Schedule::new(opts.oci_rounds, opts.microvm_rounds, opts.warmup);
    let series = interleave(&entries, schedule, "oci", |entry, round| match entry {
        OciEntry::Runtime(rt) => {
            let phases = oci::round(ws, rt, &format!("avmb-{}-{pid}-{round}", rt.docker_name));
            if rt.name == runtimes::MICROVM_POOL {
                // Untimed: the refill `create` started boots before any
                // other entry's round, which it would otherwise slow.
                pool::wait_ready(ws, rt);
            }
            phases
        }
        OciEntry::Floor(f) => f.round(),
    });
    if let Some(p) = &pooled {
        pool::drain(ws, p);
    }
    reaper::set_subreaper(false)?;
    reaper::reap_orphans();
    let rows: Vec<Row> = series
        .iter()
        .map(|s| Row::from_series(s, |p| p.total))
        .collect();
    chart.cold_start = rows
        .iter()
        .filter_map(|r| Some((r.name.to_string(), r.summary?.median.as_secs_f64() * 1e3)))
        .collect();
    let phases: Vec<(&'static str, Vec<Option<Duration>>)> = series
        .iter()
        .map(|s| {
            let median = |f: fn(&oci::Phases) -> Duration| {
                summarize(s.samples.iter().map(f)).map(|m| m.median)
            };
            let lifecycle = s.name != qemu_floor::NAME;
            let phase = |f: fn(&oci::Phases) -> Duration| median(f).filter(|_| lifecycle);
            let cols = vec![
                phase(|p| p.create),
                phase(|p| p.start),
                phase(|p| p.wait),
                phase(|p| p.delete),
                median(|p| p.cpu),
            ];
            (s.name, cols)
        })
        .collect();
    let mut section = format!(
        "## (a) OCI lifecycle: `create` + `start` + wait for exit + `delete` of `/bin/true`\n\n\
         {}. Wall clock of the whole round:\n\n{}\nMedian of each phase, and of the CPU time \
         (user + system) of all the round's processes (ratio to runc's median):\n\n{}",
        schedule.describe(&entries),
        ratio_table(&rows),
        phase_table(
            &["create", "start", "wait for exit", "delete", "CPU time"],
            &phases
        ),
    );
    if let Some(f) = floor {
        section.push_str(&format!(
            "\nThe QEMU floor is one boot of the guest kernel to an `/init` that runs \
             `busybox reboot -f`, QEMU's start to its exit, in the same rounds as the microvm \
             tier:\n\n```\n{}\n```\n",
            f.command_line()
        ));
        if let Some(table) = overhead_table(&rows) {
            section.push_str(&format!(
                "\nThe microvm tier's lifecycle over the raw boot:\n\n{table}"
            ));
        }
    }
    let floor_median = rows
        .iter()
        .find(|r| r.name == qemu_floor::NAME)
        .and_then(|r| r.summary.as_ref().map(|m| m.median));
    if let Some(s) = series.iter().find(|s| s.name == runtimes::MICROVM_POOL) {
        let took = s
            .samples
            .iter()
            .filter(|p| p.boot.iter().any(|(n, _)| n == "pool"))
            .count();
        section.push_str(&format!(
            "\n{}: `microvm.pool = 1`; after each round the benchmark waits (untimed) until \
             the VM its `create` started to refill the pool has booted. {took} of its {} \
             timed rounds took a pooled VM (the others booted their own).\n",
            s.name,
            s.samples.len()
        ));
    }
    for s in &series {
        if s.name != runtimes::MICROVM {
            if let Some(table) = boot_table(&s.samples) {
                section.push_str(&format!(
                    "\n{}'s round by part (median of each):\n\n{table}",
                    s.name
                ));
            }
            continue;
        }
        if let Some(parts) = boot_parts(&s.samples) {
            chart.parts_title = format!("{}: cold start by part (median)", s.name);
            chart.parts = parts
                .into_iter()
                .filter_map(|(name, d)| Some((name.replace('`', ""), d?.as_secs_f64() * 1e3)))
                .chain(floor_median.map(|d| (qemu_floor::NAME.to_string(), d.as_secs_f64() * 1e3)))
                .collect();
        }
        if let Some(table) = boot_table(&s.samples) {
            section.push_str(&format!(
                "\n{}'s round by part (median of each; `create`'s parts from the supervisor's \
                 boot trace in `microvm.json`, the guest's own milestones splitting the VM's \
                 boot):\n\n{table}",
                s.name
            ));
        }
    }
    section.push_str(&failure_notes(&series));
    Ok((section, series.iter().all(|s| s.failures.is_empty())))
}

/// Part (b). Returns the report section, whether every round passed, and
/// the Docker version for the machine table.
fn docker_part(opts: &Options, runtimes: &[Runtime]) -> anyhow::Result<(String, bool, String)> {
    let d = match common::docker::docker() {
        Ok(d) => d,
        Err(why) => {
            println!("skipped: docker run part: {why}");
            let section = format!("## (b) `docker run`\n\nskipped: {why}\n");
            return Ok((section, true, "not measured".into()));
        }
    };
    let registered = docker_run::registered(d)?;
    let mut list = Vec::new();
    let mut notes = String::new();
    for rt in runtimes {
        if docker_run::is_registered(&registered, rt.docker_name) {
            list.push(rt);
        } else {
            let why = format!(
                "runtime {:?} is not registered with the test dockerd",
                rt.docker_name
            );
            println!("skipped: docker run with {}: {why}", rt.name);
            notes.push_str(&format!("\nskipped {}: {why}\n", rt.name));
        }
    }
    // The microvm tier once more, taking its VMs from a warm pool of one.
    let pooled = match list.iter().find(|r| r.name == runtimes::MICROVM) {
        Some(vm) if docker_run::is_registered(&registered, "agentvm-pool") => {
            match pool::docker_start(vm) {
                Ok(p) => Some(p),
                Err(why) => {
                    println!("skipped: docker run with {}: {why}", runtimes::MICROVM_POOL);
                    notes.push_str(&format!("\nskipped {}: {why}\n", runtimes::MICROVM_POOL));
                    None
                }
            }
        }
        _ => None,
    };
    list.extend(pooled.iter());
    let schedule = Schedule::new(opts.docker_rounds, opts.microvm_rounds, opts.warmup.min(1));
    let series = interleave(&list, schedule, "docker", |rt, _| {
        let took = docker_run::round(d, rt);
        if rt.name == runtimes::MICROVM_POOL {
            // Untimed, as in (a): the refill boots before the next round.
            pool::wait_ready_in(&common::docker::runtime_root());
        }
        took
    });
    if let Some(p) = &pooled {
        pool::drain_in(p, &common::docker::runtime_root());
        notes.push_str(&format!(
            "\n{}: the test dockerd's runtime `agentvm-pool` (`microvm.pool = 1`); after each \
             of its rounds the benchmark waits (untimed) until the pool's VM is booted again.\n",
            runtimes::MICROVM_POOL
        ));
    }
    let rows: Vec<Row> = series.iter().map(|s| Row::from_series(s, |t| *t)).collect();
    let section = format!(
        "## (b) `docker run --rm --runtime RT local/busybox true`\n\n\
         {}, on the tests' own dockerd (`tests/support/src/docker.rs`). Wall clock of the `docker` \
         client:\n\n{}{}{}",
        schedule.describe(&list),
        ratio_table(&rows),
        notes,
        failure_notes(&series)
    );
    let ok = series.iter().all(|s| s.failures.is_empty());
    Ok((section, ok, docker_run::version(d)))
}

/// Part (c). Returns the report section and whether every container could
/// be started and measured.
fn memory_part(
    opts: &Options,
    ws: &oci::Workspace,
    runtimes: &[Runtime],
    chart: &mut chart::Chart,
) -> anyhow::Result<(String, bool)> {
    let bundle = ws.bundle_running("bundle-sleep", &["sleep", "1000"])?;
    reaper::set_subreaper(true)?;
    let mut rows = Vec::new();
    let mut details = String::new();
    let mut failures = String::new();
    for rt in runtimes {
        eprintln!("memory: {} ({} idle containers)", rt.name, opts.idle);
        let (fps, failed) = match memory::idle(ws, rt, &bundle, opts.idle) {
            Ok(fps) => (fps, 0),
            Err(e) => {
                eprintln!("memory: {} failed: {e}", rt.name);
                failures.push_str(&format!(
                    "\n{} failed:\n\n```\n{}\n```\n",
                    rt.name,
                    e.to_string().trim()
                ));
                (Vec::new(), opts.idle)
            }
        };
        let guest: Vec<u64> = fps.iter().filter_map(|f| f.guest_touched()).collect();
        if !guest.is_empty() {
            details.push_str(&kinds_table(rt.name, &fps));
        }
        rows.push(MemRow {
            name: rt.name,
            processes: median_u64(fps.iter().map(|f| f.procs.len() as u64)),
            rss: median_u64(fps.iter().map(|f| f.rss())),
            pss: median_u64(fps.iter().map(|f| f.pss())),
            guest: median_u64(guest),
            ok: fps.len(),
            failed,
        });
        let by_comm: Vec<_> = fps.iter().map(|f| f.by_comm()).collect();
        let names: std::collections::BTreeSet<&String> =
            by_comm.iter().flat_map(|m| m.keys()).collect();
        if names.len() > 1 {
            let parts: Vec<String> = names
                .iter()
                .map(|name| {
                    let of =
                        |i: usize| {
                            median_u64(by_comm.iter().filter_map(|m| m.get(*name)).map(
                                |v| match i {
                                    0 => v.0 as u64,
                                    1 => v.1,
                                    _ => v.2,
                                },
                            ))
                            .unwrap_or(0)
                        };
                    format!("`{name}` ×{}: {} / {}", of(0), mib(of(1)), mib(of(2)))
                })
                .collect();
            details.push_str(&format!(
                "\n{}, RSS / PSS per process name (median per container): {}.\n",
                rt.name,
                parts.join("; ")
            ));
        }
    }
    reaper::set_subreaper(false)?;
    reaper::reap_orphans();
    chart.idle_pss = rows
        .iter()
        .filter_map(|r| Some((r.name.to_string(), r.pss? as f64 / 1024.0)))
        .collect();
    let section = format!(
        "## (c) Host memory per idle container (`sleep 1000`)\n\n\
         {} containers per runtime running at once, measured {} s after the last `start`; \
         medians per container of the RSS and PSS summed over the container's pid and all its \
         descendants (`/proc/PID/smaps_rollup`). Guest RAM touched is QEMU's `RssShmem`: the \
         guest memory is a memfd QEMU maps shared, so these are the guest pages ever touched \
         (they are part of QEMU's RSS; virtiofsd maps the same memfd, and PSS splits the pages \
         both touched). PSS ratios:\n\n{}{}{}",
        opts.idle,
        memory::SETTLE.as_secs(),
        memory_table(&rows),
        details,
        failures
    );
    Ok((section, failures.is_empty()))
}

/// Where an idle microVM's PSS goes (medians per container of each kind),
/// and how many such VMs 8 GiB holds.
fn kinds_table(name: &str, fps: &[memory::Footprint]) -> String {
    let kinds: Vec<memory::Kinds> = fps.iter().map(|f| f.kinds()).collect();
    let of = |f: fn(&memory::Kinds) -> u64| median_u64(kinds.iter().map(f)).unwrap_or(0);
    let rows: [(&str, u64); 6] = [
        (
            "guest RAM touched (the memfd; QEMU's and virtiofsd's shares)",
            of(|k| k.guest),
        ),
        (
            "QEMU: TCG translation cache (none under KVM)",
            of(|k| k.code_cache),
        ),
        ("QEMU: other private memory", of(|k| k.qemu_anon)),
        ("virtiofsd: private memory", of(|k| k.virtiofsd_anon)),
        (
            "supervisor (agentvm): private memory",
            of(|k| k.supervisor_anon),
        ),
        (
            "mapped files: binaries, libraries, the kernel image QEMU keeps mapped (page cache shared by all VMs: PSS splits it)",
            of(|k| k.files),
        ),
    ];
    let total = median_u64(fps.iter().map(|f| f.pss())).unwrap_or(0);
    let private: u64 = rows[..5].iter().map(|(_, v)| v).sum();
    let mut out = format!(
        "\n{name}: where an idle VM's PSS goes (median per VM of each kind):\n\n\
         | kind | PSS |\n|---|---:|\n"
    );
    for (kind, kib) in rows {
        out.push_str(&format!("| {kind} | {} |\n", mib(kib)));
    }
    out.push_str(&format!(
        "| total (median of the sums) | {} |\n",
        mib(total)
    ));
    let fit =
        |kib: u64| stats::fit_in_8_gib(kib).map_or_else(|| "–".to_string(), |n| n.to_string());
    out.push_str(&format!(
        "\nIdle VMs in 8 GiB at that PSS: {}; counting only what each VM has of its own (all but \
         the mapped files, which many VMs share), {} ({} each).\n",
        fit(total),
        fit(private),
        mib(private)
    ));
    out
}

fn run() -> anyhow::Result<bool> {
    // Inside the test host (part (f)): measure there, print, and stop.
    if std::env::args().nth(1).as_deref() == Some("testhost-inside") {
        testhost::inside(env_count("AGENTVM_BENCH_TESTHOST_ROUNDS", 5)?.max(1), 1)?;
        return Ok(true);
    }
    let opts = Options::parse()?;
    machine::note_load();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: the benchmark needs root (container runtimes, dockerd, cgroups)");
        return Ok(true);
    }
    let dir = Path::new(BENCH_DIR);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {BENCH_DIR}"))?;
    let (runtimes, skipped) = runtimes::available(dir);
    for why in &skipped {
        println!("skipped: {why}");
    }
    if runtimes.is_empty() {
        anyhow::bail!("no runtime to measure");
    }
    let mut notes: Vec<String> = skipped
        .iter()
        .map(|why| format!("skipped: {why}"))
        .collect();
    if let Some(note) = machine::ensure_hugetlb()? {
        eprintln!("{note}");
        notes.push(note);
    }
    let mut versions: Vec<(String, String)> = runtimes
        .iter()
        .map(|r| (r.name.to_string(), r.version()))
        .collect();
    let accel = runtimes.iter().find_map(Runtime::accelerator);
    if let Some(accel) = &accel {
        versions.push(("qemu".into(), qemu_floor::version()));
        versions.push(("microvm accelerator".into(), accel.clone()));
    }
    let floor = if !opts.oci {
        None
    } else if accel.is_none() {
        let why = format!(
            "{}: the {} entry is skipped",
            qemu_floor::NAME,
            runtimes::MICROVM
        );
        println!("skipped: {why}");
        notes.push(format!("skipped: {why}"));
        None
    } else {
        let kvm = accel.as_deref().is_some_and(|a| a.starts_with("kvm"));
        match common::guest::kernel().and_then(|k| Floor::prepare(dir, &k, kvm)) {
            Ok(f) => Some(f),
            Err(why) => {
                println!("skipped: {}: {why}", qemu_floor::NAME);
                notes.push(format!("skipped: {}: {why}", qemu_floor::NAME));
                None
            }
        }
    };
    let ws = if opts.oci || opts.memory {
        let ws = oci::Workspace::prepare(dir, &runtimes[0])?;
        for rt in &runtimes {
            ws.clear_root(rt)?;
        }
        Some(ws)
    } else {
        None
    };
    let mut sections = Vec::new();
    let mut all_ok = true;
    let mut chart = chart::Chart::default();
    if let (true, Some(ws)) = (opts.oci, &ws) {
        let (section, ok) = oci_part(&opts, ws, &runtimes, floor.as_ref(), &mut chart)?;
        sections.push(section);
        all_ok &= ok;
    }
    if opts.docker {
        let (section, ok, docker_version) = docker_part(&opts, &runtimes)?;
        sections.push(section);
        all_ok &= ok;
        versions.push(("docker".into(), docker_version));
    }
    if let (true, Some(ws)) = (opts.memory, &ws) {
        let (section, ok) = memory_part(&opts, ws, &runtimes, &mut chart)?;
        sections.push(section);
        all_ok &= ok;
    }
    if opts.network {
        let outcome = network::part(&opts, dir, &runtimes)?;
        sections.push(outcome.section);
        all_ok &= outcome.ok;
        for (what, version) in outcome.versions {
            if !versions.iter().any(|(w, _)| *w == what) {
                versions.push((what, version));
            }
        }
    }
    if opts.pod {
        let (section, ok) = pod::part(&opts);
        sections.push(section);
        all_ok &= ok;
    }
    if opts.testhost {
        match testhost::part(opts.testhost_rounds) {
            Ok((section, ok)) => {
                sections.push(section);
                all_ok &= ok;
            }
            Err(testhost::PartError::Skipped(why)) => {
                println!("skipped: (f) the test host: {why}");
                notes.push(format!("skipped: (f) the test host: {why}"));
            }
            Err(testhost::PartError::Failed(why)) => {
                sections.push(format!(
                    "## (f) The builtin VMM beside QEMU, inside the test host

Failed: {why}
"
                ));
                all_ok = false;
            }
        }
    }
    let report = render(&versions, &notes, &sections);
    println!("{report}");
    if let Some(path) = &opts.report {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !chart.is_empty() {
            let svg = path.with_extension("svg");
            let title = format!(
                "agentvm beside runc and crun, {}",
                chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
            );
            std::fs::write(&svg, chart.svg(&title))
                .with_context(|| format!("cannot write {}", svg.display()))?;
            println!("chart: {}", svg.display());
        }
    }
    Ok(all_ok)
}

fn render(versions: &[(String, String)], notes: &[String], sections: &[String]) -> String {
    let mut out = format!(
        "# agentvm cold-start benchmark, {}\n\n## Machine\n\n| | |\n|---|---|\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    for (k, v) in machine::describe(versions) {
        out.push_str(&format!("| {k} | {v} |\n"));
    }
    for n in notes {
        out.push_str(&format!("\n{n}\n"));
    }
    for s in sections {
        out.push('\n');
        out.push_str(s);
    }
    out
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("compare: some rounds failed (see the report)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("compare: {e:#}");
            ExitCode::FAILURE
        }
    }
}
