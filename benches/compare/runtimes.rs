//! The runtimes compared, as one list: a runtime is an entry here, and every
//! part of the benchmark runs each entry the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{agentvm_bin, find_in_path};

/// The reference every figure is divided by.
pub const REFERENCE: &str = "runc";
/// The second reference (the fastest peer).
pub const FAST_PEER: &str = "crun";

/// One runtime under measurement.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Its column label in the tables.
    pub name: &'static str,
    /// The runc-compatible binary.
    pub program: PathBuf,
    /// Global flags given before every command (the tier, for agentvm).
    pub global_args: Vec<String>,
    /// The name the test dockerd knows it by (`docker run --runtime`).
    pub docker_name: &'static str,
}

impl Runtime {
    /// `PROGRAM GLOBAL_ARGS --root ROOT`: the start of every command line.
    pub fn command(&self, root: &Path) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.global_args).arg("--root").arg(root);
        cmd
    }

    /// The first line of `--version`, or why it could not be read.
    pub fn version(&self) -> String {
        let out = Command::new(&self.program)
            .arg("--version")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                let mut lines = text.lines();
                let first = lines.next().unwrap_or_default().trim().to_string();
                match lines.find_map(|l| l.strip_prefix("commit: ")) {
                    Some(commit) => format!("{first} (commit {})", commit.trim()),
                    None => first,
                }
            }
            Ok(o) => format!("unknown (--version exited with {})", o.status),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

/// Every runtime the benchmark compares, in column order. The microvm tier
/// will be one more entry (`--isolation=microvm`, docker name `agentvm`).
fn candidates() -> Vec<(&'static str, Option<PathBuf>, Vec<String>, &'static str)> {
    vec![
        (REFERENCE, find_in_path("runc"), vec![], "runc"),
        (FAST_PEER, find_in_path("crun"), vec![], "crun"),
        (
            "agentvm container",
            Some(agentvm_bin()).filter(|p| p.exists()),
            vec!["--isolation=container".to_string()],
            "agentvm-container",
        ),
    ]
}

/// The runtimes present on this machine, and why the others are not.
pub fn available() -> (Vec<Runtime>, Vec<String>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (name, program, global_args, docker_name) in candidates() {
        match program {
            Some(program) => found.push(Runtime {
                name,
                program,
                global_args,
                docker_name,
            }),
            None => skipped.push(format!("{name} is not installed")),
        }
    }
    (found, skipped)
}
