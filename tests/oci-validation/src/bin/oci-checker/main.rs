//! oci-checker: runs inside the container as its workload and verifies that
//! what config.json asked for was applied.
//!
//! Usage: `oci-checker [EXPECTATIONS.json] [ignored args...]` (default
//! `/oci-expect.json`). Prints one line per check: `ok NAME`,
//! `not ok NAME: detail` or `skip NAME: reason`; exits 0 when no check failed.

mod fs;
mod process;
mod sys;

use std::io::Write;

use oci_validation::expect::{Check, Expectations};
use oci_validation::{Line, EXPECT_PATH};

/// Why a check did not pass.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The container does not match the expectation.
    #[error("{0}")]
    Mismatch(String),
    /// The check cannot run in this environment.
    #[error("{0}")]
    Skip(String),
}

pub type Verdict = Result<(), Failure>;

/// Shorthand for a mismatch with a formatted detail.
#[macro_export]
macro_rules! mismatch {
    ($($arg:tt)*) => {
        Err($crate::Failure::Mismatch(format!($($arg)*)))
    };
}

/// Compares an observed value with the expected one.
pub fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Verdict {
    if got == want {
        Ok(())
    } else {
        mismatch!("{what}: got {got:?}, want {want:?}")
    }
}

fn run(check: &Check) -> Verdict {
    match check {
        Check::Args { .. }
        | Check::Env { .. }
        | Check::Cwd { .. }
        | Check::Uid { .. }
        | Check::Gid { .. }
        | Check::Groups { .. }
        | Check::Umask { .. }
        | Check::CapSet { .. }
        | Check::Rlimit { .. }
        | Check::Status { .. }
        | Check::Tty { .. }
        | Check::WinSize { .. }
        | Check::Pid { .. } => process::run(check),
        Check::FileContent { .. }
        | Check::SameContent { .. }
        | Check::Mount { .. }
        | Check::NotMounted { .. }
        | Check::Masked { .. }
        | Check::ReadOnly { .. }
        | Check::Writable { .. }
        | Check::Node { .. }
        | Check::Symlink { .. }
        | Check::Open { .. }
        | Check::CgroupMountsReadOnly => fs::run(check),
        Check::Namespace { .. }
        | Check::Syscall { .. }
        | Check::KilledBy { .. }
        | Check::Cgroup { .. }
        | Check::CgroupNsRoot => sys::run(check),
    }
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| EXPECT_PATH.to_string());
    let expectations: Expectations = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(e) => e,
        Err(e) => {
            println!("not ok checker: cannot read expectations {path}: {e}");
            std::process::exit(2);
        }
    };
    let mut failed = false;
    let stdout = std::io::stdout();
    for e in &expectations.checks {
        let line = match run(&e.check) {
            Ok(()) => Line::Ok(e.name.clone()),
            Err(Failure::Mismatch(d)) => {
                failed = true;
                Line::NotOk(e.name.clone(), d)
            }
            Err(Failure::Skip(d)) => Line::Skip(e.name.clone(), d),
        };
        let mut out = stdout.lock();
        // A closed stdout leaves nothing to report to; the exit code still tells.
        let _ = writeln!(out, "{}", line.render());
        let _ = out.flush();
    }
    std::process::exit(i32::from(failed));
}

#[cfg(test)]
mod tests;
