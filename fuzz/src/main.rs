//! `agentvm-fuzz`: runs the fuzz targets for a number of cases or seconds,
//! or replays saved inputs. See docs/fuzzing.md.
//!
//! ```text
//! agentvm-fuzz [--target NAME|all] [--cases N] [--time SECS] [--seed S]
//!              [--crash-dir DIR] [--case-timeout SECS]
//! agentvm-fuzz --target NAME --replay FILE|DIR...
//! agentvm-fuzz --list
//! ```
//!
//! Exit status: 0 clean, 1 a crash (the target and the saved file are
//! named), 2 a usage error, 3 a case that hung.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agentvm_fuzz::driver::{self, Limits};
use agentvm_fuzz::targets::{find, Target, TARGETS};

struct Args {
    targets: Vec<&'static Target>,
    limits: Limits,
    seed: u64,
    crash_dir: PathBuf,
    case_timeout: Duration,
    replay: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
enum UsageError {
    #[error("{0} needs a value")]
    Missing(String),
    #[error("{flag}: {value:?} is not a number")]
    NotNumber { flag: String, value: String },
    #[error("unknown target {0:?} (--list shows them)")]
    UnknownTarget(String),
    #[error("unknown argument {0:?}")]
    Unknown(String),
    #[error("--replay needs one --target")]
    ReplayTarget,
}

const USAGE: &str = "usage: agentvm-fuzz [--target NAME|all] [--cases N] [--time SECS] [--seed S]
                    [--crash-dir DIR] [--case-timeout SECS]
       agentvm-fuzz --target NAME --replay FILE|DIR...
       agentvm-fuzz --list";

fn number(flag: &str, value: Option<String>) -> Result<u64, UsageError> {
    let value = value.ok_or_else(|| UsageError::Missing(flag.to_string()))?;
    value.parse().map_err(|_| UsageError::NotNumber {
        flag: flag.to_string(),
        value,
    })
}

fn parse_args() -> Result<Option<Args>, UsageError> {
    let mut args = Args {
        targets: TARGETS.iter().collect(),
        limits: Limits::default(),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        crash_dir: driver::crate_dir().join("crashes"),
        case_timeout: Duration::from_secs(10),
        replay: Vec::new(),
    };
    let mut one_target = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--list" => {
                for t in TARGETS {
                    println!("{:12} {}", t.name, t.about);
                }
                return Ok(None);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--target" => {
                let name = it.next().ok_or_else(|| UsageError::Missing(flag.clone()))?;
                if name == "all" {
                    args.targets = TARGETS.iter().collect();
                    one_target = false;
                } else {
                    let t = find(&name).ok_or(UsageError::UnknownTarget(name))?;
                    args.targets = vec![t];
                    one_target = true;
                }
            }
            "--cases" => args.limits.cases = Some(number(&flag, it.next())?),
            "--time" => args.limits.time = Some(Duration::from_secs(number(&flag, it.next())?)),
            "--seed" => args.seed = number(&flag, it.next())?,
            "--case-timeout" => {
                args.case_timeout = Duration::from_secs(number(&flag, it.next())?.max(1));
            }
            "--crash-dir" => {
                args.crash_dir = it
                    .next()
                    .ok_or_else(|| UsageError::Missing(flag.clone()))?
                    .into();
            }
            "--replay" => args.replay.extend(it.by_ref().map(PathBuf::from)),
            other => return Err(UsageError::Unknown(other.to_string())),
        }
    }
    if !args.replay.is_empty() && !one_target {
        return Err(UsageError::ReplayTarget);
    }
    if args.limits.cases.is_none() && args.limits.time.is_none() {
        args.limits.cases = Some(10_000);
    }
    Ok(Some(args))
}

/// What the watchdog and the panic hook know of the case in flight.
static TARGET: AtomicUsize = AtomicUsize::new(usize::MAX);
static CASE: AtomicU64 = AtomicU64::new(0);
/// Milliseconds since `EPOCH` at which the current case began.
static STARTED_MS: AtomicU64 = AtomicU64::new(u64::MAX);
static EPOCH: OnceLock<Instant> = OnceLock::new();
static SEED: AtomicU64 = AtomicU64::new(0);
static CRASH_DIR: OnceLock<PathBuf> = OnceLock::new();

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Rebuilds the input in flight (a case's input depends on the seed, the
/// target and its number only) and saves it.
fn save_current(why: &str) -> Option<PathBuf> {
    let target = TARGETS.get(TARGET.load(Ordering::SeqCst))?;
    let case = CASE.load(Ordering::SeqCst);
    let input = driver::input_for(target, SEED.load(Ordering::SeqCst), case);
    let dir = CRASH_DIR.get()?;
    match driver::save(dir, target.name, &input) {
        Ok(file) => {
            eprintln!(
                "fuzz {}: {why} at case {case}; input saved to {}\n  reproduce: agentvm-fuzz --target {} --replay {}",
                target.name,
                file.display(),
                target.name,
                file.display()
            );
            Some(file)
        }
        Err(e) => {
            eprintln!("fuzz {}: {why} at case {case}; {e}", target.name);
            None
        }
    }
}

/// A case that runs longer than `limit` is a hang: its input is saved
/// and the process ends.
fn start_watchdog(limit: Duration) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let started = STARTED_MS.load(Ordering::SeqCst);
        if started != u64::MAX && now_ms().saturating_sub(started) > limit.as_millis() as u64 {
            save_current(&format!("a case ran over {limit:?} (a hang)"));
            std::process::exit(3);
        }
    });
}

fn replay(target: &'static Target, paths: &[PathBuf]) -> ExitCode {
    match driver::replay(target, paths) {
        Ok(results) => {
            let mut failed = 0;
            for (file, result) in results {
                match result {
                    Ok(()) => println!("ok    {}", file.display()),
                    Err(msg) => {
                        failed += 1;
                        println!("CRASH {}: {msg}", file.display());
                    }
                }
            }
            if failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("agentvm-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentvm-fuzz: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let [target] = args.targets[..] {
        if !args.replay.is_empty() {
            return replay(target, &args.replay);
        }
    }
    let _ = EPOCH.set(Instant::now());
    let _ = CRASH_DIR.set(args.crash_dir.clone());
    SEED.store(args.seed, Ordering::SeqCst);
    if cfg!(panic = "abort") {
        // Built without unwinding (the release profile): the process dies
        // with the panic, so the hook saves the input first.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            save_current("a panic");
        }));
    }
    start_watchdog(args.case_timeout);

    println!("agentvm-fuzz: seed {}", args.seed);
    let mut crashed = false;
    for target in &args.targets {
        let index = TARGETS
            .iter()
            .position(|t| t.name == target.name)
            .unwrap_or(usize::MAX);
        TARGET.store(index, Ordering::SeqCst);
        let result = driver::fuzz(target, args.seed, args.limits, |case| {
            CASE.store(case, Ordering::SeqCst);
            STARTED_MS.store(now_ms(), Ordering::SeqCst);
        });
        STARTED_MS.store(u64::MAX, Ordering::SeqCst);
        match result {
            Ok(p) => {
                let secs = p.elapsed.as_secs_f64();
                println!(
                    "fuzz {:12} {:>9} cases in {:6.1} s ({:>7.0}/s), no crash",
                    target.name,
                    p.cases,
                    secs,
                    p.cases as f64 / secs.max(1e-9)
                );
            }
            Err(crash) => {
                crashed = true;
                println!("fuzz {:12} CRASH: {crash}", target.name);
                match driver::save(&args.crash_dir, target.name, &crash.input) {
                    Ok(file) => println!(
                        "  input saved to {}\n  reproduce: agentvm-fuzz --target {} --replay {}",
                        file.display(),
                        target.name,
                        file.display()
                    ),
                    Err(e) => println!("  {e}"),
                }
            }
        }
    }
    if crashed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
