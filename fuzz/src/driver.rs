//! Runs a target over generated cases: the input of case N is a function
//! of the seed, the target's name and N alone, so a run is reproducible
//! from its seed and any one case can be rebuilt without the others.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arbitrary::Unstructured;

use crate::rng::{case_seed, fnv1a, Rng};
use crate::targets::Target;

/// Most random bytes a case starts from.
const MAX_RAW: usize = 8192;

/// Where a run stops: after `cases`, after `time`, whichever comes first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub cases: Option<u64>,
    pub time: Option<Duration>,
}

/// What a clean run did.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub cases: u64,
    pub elapsed: Duration,
}

/// A case that panicked.
#[derive(Debug, Clone)]
pub struct Crash {
    pub target: &'static str,
    /// The case number, when it came from a run (not a replayed file).
    pub case: Option<u64>,
    pub message: String,
    pub input: Vec<u8>,
}

impl fmt::Display for Crash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.case {
            Some(n) => write!(
                f,
                "target {} crashed at case {n}: {}",
                self.target, self.message
            ),
            None => write!(f, "target {} crashed: {}", self.target, self.message),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot save the crashing input under {dir}: {source}")]
    Save {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The input of case `case` of a run with `seed`.
pub fn input_for(target: &Target, seed: u64, case: u64) -> Vec<u8> {
    let mut rng = Rng::new(case_seed(seed, target.name, case));
    let len = rng.length(MAX_RAW);
    let raw = rng.bytes(len);
    let mut u = Unstructured::new(&raw);
    match (target.generate)(&mut u) {
        Ok(input) => input,
        // A generator that ran out of choices: the bytes as they are.
        Err(_) => raw,
    }
}

/// The text of a panic's payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs one input, catching a panic as its message.
pub fn run_one(target: &Target, input: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|p| panic_message(&*p))
}

/// Runs cases 0, 1, ... of `target` until `limits`; `before` is told each
/// case's number before it runs (the binary's hang watchdog). The first
/// panic ends the run.
pub fn fuzz(
    target: &'static Target,
    seed: u64,
    limits: Limits,
    mut before: impl FnMut(u64),
) -> Result<Progress, Box<Crash>> {
    let start = Instant::now();
    let mut case = 0u64;
    loop {
        if limits.cases.is_some_and(|n| case >= n)
            || limits.time.is_some_and(|t| start.elapsed() >= t)
        {
            return Ok(Progress {
                cases: case,
                elapsed: start.elapsed(),
            });
        }
        before(case);
        let input = input_for(target, seed, case);
        if let Err(message) = run_one(target, &input) {
            return Err(Box::new(Crash {
                target: target.name,
                case: Some(case),
                message,
                input,
            }));
        }
        case += 1;
    }
}

/// Saves a crashing input as `<dir>/<target>-<hash>`.
pub fn save(dir: &Path, target: &str, input: &[u8]) -> Result<PathBuf, DriverError> {
    let path = dir.join(format!("{target}-{:016x}", fnv1a(input)));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_err(|source| DriverError::Save {
            dir: dir.to_path_buf(),
            source,
        })?;
    Ok(path)
}

/// This crate's directory (the default home of `crashes/` and
/// `regressions/`).
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `regressions/<target>/`, sorted; none when it is absent.
pub fn regression_files(target: &str) -> Result<Vec<PathBuf>, DriverError> {
    let dir = crate_dir().join("regressions").join(target);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(DriverError::Read { path: dir, source }),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DriverError::Read {
            path: dir.clone(),
            source,
        })?;
        if entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Each replayed file with what became of it (the panic message on failure).
pub type Replayed = Vec<(PathBuf, Result<(), String>)>;

/// Replays files (or every file in directories) through a target.
pub fn replay(target: &'static Target, paths: &[PathBuf]) -> Result<Replayed, DriverError> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .and_then(|d| d.map(|e| e.map(|e| e.path())).collect())
                .map_err(|source| DriverError::Read {
                    path: p.clone(),
                    source,
                })?;
            inside.sort();
            files.extend(inside.into_iter().filter(|f| f.is_file()));
        } else {
            files.push(p.clone());
        }
    }
    let mut out = Vec::new();
    for f in files {
        let input = std::fs::read(&f).map_err(|source| DriverError::Read {
            path: f.clone(),
            source,
        })?;
        let result = run_one(target, &input);
        out.push((f, result));
    }
    Ok(out)
}
