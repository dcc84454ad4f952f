//! The runtimes compared, as one list: a runtime is an entry here, and every
//! part of the benchmark runs each entry the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{agentvm_bin, find_in_path, guest};

/// The reference every figure is divided by.
pub const REFERENCE: &str = "runc";
/// The second reference (the fastest peer).
pub const FAST_PEER: &str = "crun";
/// The row of agentvm's microvm tier.
pub const MICROVM: &str = "agentvm microvm";
/// The microvm tier taking its VMs from a warm pool (`microvm.pool = 1`):
/// part (a) only.
pub const MICROVM_POOL: &str = "agentvm microvm, warm pool";

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
    /// A round takes seconds rather than milliseconds (it boots a VM): it
    /// may run in fewer rounds than the others (see `main::Schedule`).
    pub slow: bool,
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

    /// For agentvm's microvm tier: the accelerator its VMs run with, as
    /// `agentvm check` reports it ("tcg (why)" or "kvm (why)").
    pub fn accelerator(&self) -> Option<String> {
        if self.name != MICROVM {
            return None;
        }
        let out = Command::new(&self.program)
            .args(&self.global_args)
            .arg("check")
            .stdin(Stdio::null())
            .output();
        let text = match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => return Some(format!("unknown (agentvm check: {e})")),
        };
        // "microvm tier: available with qemu (tcg: the CPU has no vmx/svm)"
        let line = text.lines().find(|l| l.starts_with("microvm tier:"));
        Some(
            match line.and_then(|l| l.split_once("available with qemu (")) {
                Some((_, rest)) => {
                    let rest = rest.strip_suffix(')').unwrap_or(rest);
                    match rest.split_once(": ") {
                        Some((accel, why)) => format!("{accel} ({why})"),
                        None => rest.to_string(),
                    }
                }
                None => format!("unknown ({})", line.unwrap_or("agentvm check said nothing")),
            },
        )
    }
}

/// The agentvm config file of the microvm entry: the kernel kernels/build.sh
/// built and the virtiofsd `make virtiofsd` installed, written to `dir`.
fn microvm_config(dir: &Path) -> Result<PathBuf, String> {
    if let Some(why) = guest::unavailable() {
        return Err(why);
    }
    let kernel = guest::kernel()?;
    let text = format!(
        "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n",
        kernel.display().to_string(),
        guest::VIRTIOFSD
    );
    let path = dir.join("agentvm-microvm.toml");
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&path, text))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The microvm entry with a warm pool of one VM (`microvm.pool = 1`): its
/// config is the microvm entry's plus the pool, written to `dir`.
pub fn pooled(microvm: &Runtime, dir: &Path) -> Result<Runtime, String> {
    let config = microvm_config(dir)?;
    let text = std::fs::read_to_string(&config)
        .map_err(|e| format!("cannot read {}: {e}", config.display()))?;
    let path = dir.join("agentvm-microvm-pool.toml");
    std::fs::write(&path, format!("{text}pool = 1\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Runtime {
        name: MICROVM_POOL,
        program: microvm.program.clone(),
        global_args: vec![
            "--isolation=microvm".to_string(),
            "--config".to_string(),
            path.display().to_string(),
        ],
        docker_name: "agentvm-pool",
        slow: true,
    })
}

/// A runtime entry: label, binary (or why there is none), global flags,
/// docker name, slow.
type Candidate = (
    &'static str,
    Result<PathBuf, String>,
    Vec<String>,
    &'static str,
    bool,
);

/// Every runtime the benchmark compares, in column order. `dir` is the
/// benchmark's work directory (for the microvm entry's config file).
fn candidates(dir: &Path) -> Vec<Candidate> {
    let installed =
        |name: &str| find_in_path(name).ok_or_else(|| format!("{name} is not installed"));
    let agentvm = || {
        Some(agentvm_bin())
            .filter(|p| p.exists())
            .ok_or_else(|| format!("{} is not built", agentvm_bin().display()))
    };
    let microvm = agentvm().and_then(|bin| microvm_config(dir).map(|config| (bin, config)));
    let (microvm_bin, microvm_args) = match microvm {
        Ok((bin, config)) => (
            Ok(bin),
            vec![
                "--isolation=microvm".to_string(),
                "--config".to_string(),
                config.display().to_string(),
            ],
        ),
        Err(why) => (Err(why), vec![]),
    };
    vec![
        (REFERENCE, installed("runc"), vec![], "runc", false),
        (FAST_PEER, installed("crun"), vec![], "crun", false),
        (
            "agentvm container",
            agentvm(),
            vec!["--isolation=container".to_string()],
            "agentvm-container",
            false,
        ),
        (MICROVM, microvm_bin, microvm_args, "agentvm", true),
    ]
}

/// The runtimes present on this machine, and why the others are not.
pub fn available(dir: &Path) -> (Vec<Runtime>, Vec<String>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (name, program, global_args, docker_name, slow) in candidates(dir) {
        match program {
            Ok(program) => found.push(Runtime {
                name,
                program,
                global_args,
                docker_name,
                slow,
            }),
            Err(why) => skipped.push(format!("{name}: {why}")),
        }
    }
    (found, skipped)
}
