//! Side-by-side cold-start benchmark of agentvm against runc and crun, in
//! one run on one machine (see docs/benchmarks.md for results).
//!
//! (a) the OCI lifecycle of `/bin/true` from a busybox bundle, driven the
//!     way containerd's shim drives a runtime: `create --pid-file`,
//!     `start`, wait for the init to exit (pidfd, as its subreaper),
//!     `delete`;
//! (b) `docker run --rm local/busybox true` on the tests' own dockerd.
//!
//! Rounds are interleaved: every round runs each runtime once, in an order
//! that rotates from round to round, so machine noise hits all of them.
//!
//!     cargo bench --bench compare             # both parts (needs root)
//!     cargo bench --bench compare -- oci      # only (a); `docker`: only (b)
//!
//! Environment: AGENTVM_BENCH_ROUNDS (a, default 50),
//! AGENTVM_BENCH_DOCKER_ROUNDS (b, default 20), AGENTVM_BENCH_WARMUP
//! (untimed rounds per runtime first, default 2), AGENTVM_BENCH_REPORT
//! (also write the markdown report to this file).

#[allow(dead_code, unused_imports)]
#[path = "../../tests/common/mod.rs"]
mod common;

mod docker_run;
mod error;
mod machine;
mod oci;
mod reaper;
mod runtimes;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

use error::BenchError;
use runtimes::Runtime;
use stats::{phase_table, ratio_table, summarize, Row, Series};

/// Bundle, runtime roots and logs of the OCI part.
const BENCH_DIR: &str = "/run/agentvm-bench";

struct Options {
    oci: bool,
    docker: bool,
    oci_rounds: usize,
    docker_rounds: usize,
    warmup: usize,
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
                "oci" | "docker" => parts.push(arg),
                other => anyhow::bail!("unknown part {other:?}: expected `oci` or `docker`"),
            }
        }
        let all = parts.is_empty();
        Ok(Options {
            oci: all || parts.iter().any(|p| p == "oci"),
            docker: all || parts.iter().any(|p| p == "docker"),
            oci_rounds: env_count("AGENTVM_BENCH_ROUNDS", 50)?,
            docker_rounds: env_count("AGENTVM_BENCH_DOCKER_ROUNDS", 20)?,
            warmup: env_count("AGENTVM_BENCH_WARMUP", 2)?,
            report: std::env::var_os("AGENTVM_BENCH_REPORT").map(PathBuf::from),
        })
    }
}

/// Runs `warmup + rounds` rounds; each round calls `one` once per runtime,
/// starting one runtime further along the list each time. Warm-up samples
/// are dropped; failures are kept, warm-up or not.
fn interleave<T>(
    runtimes: &[&Runtime],
    rounds: usize,
    warmup: usize,
    label: &str,
    mut one: impl FnMut(&Runtime, usize) -> Result<T, BenchError>,
) -> Vec<Series<T>> {
    let mut series: Vec<Series<T>> = runtimes.iter().map(|r| Series::new(r.name)).collect();
    let n = runtimes.len();
    for round in 0..warmup + rounds {
        for k in 0..n {
            let i = (round + k) % n;
            let result = one(runtimes[i], round);
            match result {
                Ok(v) if round >= warmup => series[i].samples.push(v),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("{label}: {} round {round} failed: {e}", runtimes[i].name);
                    series[i].failures.push(e.to_string());
                }
            }
        }
        if (round + 1) % 10 == 0 || round + 1 == warmup + rounds {
            eprintln!("{label}: {}/{} rounds", round + 1, warmup + rounds);
        }
    }
    series
}

/// The first failure of each runtime that had any, for the report.
fn failure_notes<T>(series: &[Series<T>]) -> String {
    let mut out = String::new();
    for s in series.iter().filter(|s| !s.failures.is_empty()) {
        out.push_str(&format!(
            "\n{} failed {} round(s); the first:\n\n```\n{}\n```\n",
            s.name,
            s.failures.len(),
            s.failures[0].trim()
        ));
    }
    out
}

/// Part (a). Returns the report section and whether every round passed.
fn oci_part(opts: &Options, runtimes: &[Runtime]) -> anyhow::Result<(String, bool)> {
    let dir = Path::new(BENCH_DIR);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {BENCH_DIR}"))?;
    let ws = oci::Workspace::prepare(dir, &runtimes[0])?;
    for rt in runtimes {
        ws.clear_root(rt)?;
    }
    reaper::set_subreaper(true)?;
    let pid = std::process::id();
    let list: Vec<&Runtime> = runtimes.iter().collect();
    let series = interleave(&list, opts.oci_rounds, opts.warmup, "oci", |rt, round| {
        oci::round(&ws, rt, &format!("avmb-{}-{pid}-{round}", rt.docker_name))
    });
    reaper::set_subreaper(false)?;
    reaper::reap_orphans();
    let rows: Vec<Row> = series
        .iter()
        .map(|s| Row::from_series(s, |p| p.total))
        .collect();
    let phases: Vec<(&'static str, Vec<Option<Duration>>)> = series
        .iter()
        .map(|s| {
            let median = |f: fn(&oci::Phases) -> Duration| {
                summarize(s.samples.iter().map(f)).map(|m| m.median)
            };
            let cols = vec![
                median(|p| p.create),
                median(|p| p.start),
                median(|p| p.wait),
                median(|p| p.delete),
                median(|p| p.cpu),
            ];
            (s.name, cols)
        })
        .collect();
    let section = format!(
        "## (a) OCI lifecycle: `create` + `start` + wait for exit + `delete` of `/bin/true`\n\n\
         {} rounds per runtime, interleaved, after {} untimed warm-up round(s). Wall clock of the \
         whole round:\n\n{}\nMedian of each phase, and of the CPU time (user + system) of all the \
         round's processes (ratio to runc's median):\n\n{}{}",
        opts.oci_rounds,
        opts.warmup,
        ratio_table(&rows),
        phase_table(
            &["create", "start", "wait for exit", "delete", "CPU time"],
            &phases
        ),
        failure_notes(&series)
    );
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
        if docker_run::is_registered(&registered, rt) {
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
    let series = interleave(
        &list,
        opts.docker_rounds,
        opts.warmup.min(1),
        "docker",
        |rt, _| docker_run::round(d, rt),
    );
    let rows: Vec<Row> = series.iter().map(|s| Row::from_series(s, |t| *t)).collect();
    let section = format!(
        "## (b) `docker run --rm --runtime RT local/busybox true`\n\n\
         {} rounds per runtime, interleaved, after {} untimed warm-up round(s), on the tests' own \
         dockerd (`tests/common/docker.rs`). Wall clock of the `docker` client:\n\n{}{}{}",
        opts.docker_rounds,
        opts.warmup.min(1),
        ratio_table(&rows),
        notes,
        failure_notes(&series)
    );
    let ok = series.iter().all(|s| s.failures.is_empty());
    Ok((section, ok, docker_run::version(d)))
}

fn run() -> anyhow::Result<bool> {
    let opts = Options::parse()?;
    machine::note_load();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: the benchmark needs root (container runtimes, dockerd, cgroups)");
        return Ok(true);
    }
    let (runtimes, skipped) = runtimes::available();
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
    let mut sections = Vec::new();
    let mut all_ok = true;
    if opts.oci {
        let (section, ok) = oci_part(&opts, &runtimes)?;
        sections.push(section);
        all_ok &= ok;
    }
    if opts.docker {
        let (section, ok, docker_version) = docker_part(&opts, &runtimes)?;
        sections.push(section);
        all_ok &= ok;
        versions.push(("docker".into(), docker_version));
    }
    let report = render(&versions, &notes, &sections);
    println!("{report}");
    if let Some(path) = &opts.report {
        std::fs::write(path, &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
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
