//! oci-validate: runs every conformance case against several OCI runtimes in
//! the same run and compares each with the first (the reference, runc).
//!
//!     oci-validate --runtime runc=/usr/sbin/runc \
//!                  --runtime container="/path/agentvm --isolation=container"
//!
//! Prints a table `case | runc | container`, failure details, totals per
//! runtime and a final `N passed, N failed[, N skipped]` line counting the
//! comparisons with the reference. Exits non-zero when a check that passes on
//! the reference fails elsewhere (unless listed in known-differences.toml),
//! or when the reference itself fails a check (a bug in the case).

mod bundle;
mod cases;
mod reaper;
mod report;
mod runtime;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::report::{Outcome, RuntimeResults};
use crate::runtime::Runtime;

#[derive(Parser, Debug)]
#[command(
    name = "oci-validate",
    about = "OCI runtime conformance, compared with runc"
)]
struct Cli {
    /// NAME=COMMAND [ARGS...]; repeat for each runtime, the reference first
    #[arg(long = "runtime", required = true)]
    runtimes: Vec<String>,
    /// The static checker binary (default: next to this program)
    #[arg(long)]
    checker: Option<PathBuf>,
    /// The static busybox for the rootfs
    #[arg(long, default_value = "/bin/busybox")]
    busybox: PathBuf,
    /// Known differences (runtime, check, reason)
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/known-differences.toml"))]
    known: PathBuf,
    /// Run only cases whose name contains one of these strings
    #[arg(long = "case")]
    cases: Vec<String>,
    /// Work directory (default: a fresh one under the temp dir)
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep the work directory (bundles, runtime logs) afterwards
    #[arg(long)]
    keep: bool,
    /// List the cases and exit
    #[arg(long)]
    list: bool,
}

fn checker_path(cli: &Cli) -> Result<PathBuf> {
    if let Some(p) = &cli.checker {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().context("locate oci-validate")?;
    Ok(exe.with_file_name("oci-checker"))
}

fn run_all(cli: &Cli, env: &cases::Env, runtimes: &[Runtime]) -> Vec<RuntimeResults> {
    let mut results: Vec<RuntimeResults> = runtimes
        .iter()
        .map(|r| RuntimeResults {
            name: r.name.clone(),
            ..Default::default()
        })
        .collect();
    let selected = cases::all()
        .into_iter()
        .filter(|(n, _)| cli.cases.is_empty() || cli.cases.iter().any(|c| n.contains(c.as_str())));
    for (name, case) in selected {
        for (i, rt) in runtimes.iter().enumerate() {
            let started = Instant::now();
            let mut ctx = cases::Ctx::new(rt, env, i, name);
            let r = case(&mut ctx);
            ctx.cleanup();
            let res = &mut results[i];
            let fails = ctx
                .results
                .iter()
                .filter(|(_, o)| matches!(o, Outcome::Fail(_)))
                .count();
            let n = ctx.results.len();
            res.checks.append(&mut ctx.results);
            let note = match r {
                Ok(()) => String::new(),
                Err(e) => {
                    let why = format!("{e:#}");
                    res.aborted.insert(name.to_string(), why.clone());
                    format!(" (stopped early: {why})")
                }
            };
            eprintln!(
                "[{}] {name}: {n} checks, {fails} failed, {:.2}s{note}",
                rt.name,
                started.elapsed().as_secs_f64()
            );
        }
    }
    results
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.list {
        for (n, _) in cases::all() {
            println!("{n}");
        }
        return Ok(());
    }
    // A variable only the harness and the runtimes it starts have: a
    // container must not inherit it (checked by process-basic).
    std::env::set_var(cases::HOST_ONLY_VAR, "1");
    if !nix::unistd::geteuid().is_root() {
        bail!("oci-validate must run as root (runtimes create namespaces and cgroups)");
    }
    let checker = checker_path(&cli)?;
    if !checker.is_file() {
        bail!(
            "checker {} not found (build oci-checker or pass --checker)",
            checker.display()
        );
    }
    let known = report::load_known(&cli.known)?;
    let mut specs: Vec<(String, Vec<String>)> = Vec::new();
    for spec in &cli.runtimes {
        let (name, argv) = runtime::parse_spec(spec)?;
        if specs.iter().any(|(n, _)| *n == name) {
            bail!("runtime name {name} given twice");
        }
        specs.push((name, argv));
    }
    let work = match &cli.work {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("oci-validate-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    bundle::set_mode(&work, 0o755)?;
    let template = work.join("template");
    if let Err(e) = bundle::make_template(&template, &cli.busybox, &checker) {
        if !cli.keep {
            cases::remove_unless_mounted(&work);
        }
        return Err(e);
    }
    let env = cases::Env::new(work.clone(), template);
    reaper::become_subreaper()?;
    let runtimes = specs
        .into_iter()
        .map(|(name, argv)| Runtime::new(name, argv, &work))
        .collect::<Result<Vec<Runtime>>>()?;
    let results = run_all(&cli, &env, &runtimes);
    for rt in &runtimes {
        cases::sweep(rt, &env);
    }
    cases::cleanup_cgroups(&env);
    if cli.keep {
        eprintln!("work directory kept: {}", work.display());
    } else {
        cases::remove_unless_mounted(&work);
    }
    // The tally line is the last thing printed: CI reads it as the result.
    let tally = report::print(&results, &known);
    if tally.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
