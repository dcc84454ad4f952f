//! Shared fixtures for the end-to-end tests that drive agentvm through real
//! clients: Docker, Podman and containerd's `ctr`.
//!
//! Each client talks to its own daemon (or storage), started by the tests
//! themselves under `/run/agentvm-test` and `/var/lib/agentvm-test`, so a
//! user's Docker, Podman or containerd is never touched. Daemons are left
//! running after the tests and reused by the next test binary or run.
//!
//! The runtime under test is chosen by `AGENTVM_TEST_RUNTIME`:
//! `agentvm-container` (the default), `agentvm` (the default tier, microvm),
//! or a peer (`runc`, `crun`) to check that the suite itself is right.
//!
//! A test that cannot run here prints `skipped: <why>` and returns.
//!
//! This crate is shared by the integration tests (`tests/*.rs`, which
//! import it as `common`) and the benchmark (`benches/compare`).
//! `AGENTVM_TEST_BINARY` overrides which agentvm binary they run (see
//! [`agentvm_bin`]).

/// Returns early from a test with `skipped: <why>` when `$fixture` (an
/// `Result<T, String>`) says the test cannot run here.
#[macro_export]
macro_rules! require {
    ($fixture:expr) => {
        match $fixture {
            Ok(v) => v,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        }
    };
}

pub mod bundle;
pub mod cgroup;
pub mod cmd;
pub mod containerd;
pub mod cri;
pub mod daemon;
pub mod docker;
pub mod guest;
pub mod netns;
pub mod otlp;
pub mod podman;
pub mod pty;
pub mod rootfs;
pub mod wsexec;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Sockets, pid files, logs and configs of the test daemons.
pub const RUN_DIR: &str = "/run/agentvm-test";
/// Persistent storage of the test daemons (images, layers).
pub const DATA_DIR: &str = "/var/lib/agentvm-test";
/// The OCI annotation that picks agentvm's tier for one container.
pub const ISOLATION_ANNOTATION: &str = "io.agentvm.isolation";

/// The runtime the suite runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// agentvm with `--isolation=container`.
    AgentvmContainer,
    /// agentvm with no tier given: its default (microvm).
    AgentvmDefault,
    /// The microvm tier with a warm pool of one booted VM
    /// (`microvm.pool = 1`), Docker runtime `agentvm-pool`.
    AgentvmPool,
    /// A peer runtime found in `PATH` (`runc`, `crun`), the reference.
    Peer(String),
}

impl Runtime {
    /// Reads `AGENTVM_TEST_RUNTIME`.
    pub fn from_env() -> Runtime {
        match std::env::var("AGENTVM_TEST_RUNTIME").as_deref() {
            Err(_) | Ok("") | Ok("agentvm-container") => Runtime::AgentvmContainer,
            Ok("agentvm") => Runtime::AgentvmDefault,
            Ok(other) => Runtime::Peer(other.to_string()),
        }
    }

    /// The name Docker knows this runtime by (see the daemon config).
    pub fn docker_name(&self) -> &str {
        match self {
            Runtime::AgentvmContainer => "agentvm-container",
            Runtime::AgentvmDefault => "agentvm",
            Runtime::AgentvmPool => "agentvm-pool",
            Runtime::Peer(name) => name,
        }
    }

    /// The binary a runc-compatible client (conmon, the runc shim) executes.
    pub fn binary(&self) -> PathBuf {
        match self {
            Runtime::AgentvmContainer | Runtime::AgentvmDefault | Runtime::AgentvmPool => {
                agentvm_bin()
            }
            Runtime::Peer(name) => find_in_path(name).unwrap_or_else(|| PathBuf::from(name)),
        }
    }

    pub fn is_agentvm(&self) -> bool {
        !matches!(self, Runtime::Peer(_))
    }
}

/// The agentvm binary cargo built for this test or benchmark run.
///
/// `$AGENTVM_TEST_BINARY` when set. Otherwise the `agentvm` next to the
/// running executable's `deps/` directory: cargo puts an integration test
/// or bench executable in `target/<triple>/<profile>/deps/` and, before
/// running it, builds the package's binaries one level up, so that is the
/// binary of the same build (profile and target). This crate is a
/// library: cargo's `CARGO_BIN_EXE_agentvm` does not exist when it is
/// compiled.
pub fn agentvm_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("AGENTVM_TEST_BINARY").filter(|b| !b.is_empty()) {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("the path of the running test executable");
        binary_of_build(&exe, "agentvm")
    })
    .clone()
}

/// The containerd shim v2 binary (`containerd-shim-agentvm-v2`, the
/// `agentvm-shim` package) of the same build as [`agentvm_bin`]: beside
/// it. `$AGENTVM_TEST_SHIM` overrides it.
pub fn shim_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("AGENTVM_TEST_SHIM").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    let agentvm = agentvm_bin();
    agentvm
        .parent()
        .unwrap_or(Path::new("."))
        .join("containerd-shim-agentvm-v2")
}

/// The directory of [`shim_bin`], for the `PATH` of a containerd that must
/// find that shim; panics when the shim is not built.
pub fn built_shim_dir() -> PathBuf {
    let shim = shim_bin();
    assert!(
        shim.is_file(),
        "the shim under test {} is not built: cargo build -p agentvm-shim \
         (make integration-test builds it)",
        shim.display()
    );
    shim.parent().unwrap_or(Path::new(".")).to_path_buf()
}

/// The binary `name` of the cargo build that made the test or bench
/// executable `exe`: in `exe`'s directory, or above it when that is
/// `deps/`.
fn binary_of_build(exe: &Path, name: &str) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("."));
    let profile_dir = match dir.parent() {
        Some(parent) if dir.file_name().is_some_and(|d| d == "deps") => parent,
        _ => dir,
    };
    profile_dir.join(name)
}

/// The agentvm repository (the workspace root): where `kernels/` and
/// `tests/images/` are.
pub fn repo_root() -> PathBuf {
    // This crate is tests/support.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support is two levels below the repository")
        .to_path_buf()
}

/// Looks a program up in `PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| p.exists());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Why the end-to-end tests cannot run on this machine, if they cannot.
pub fn host_unsuitable(programs: &[&str]) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (starts its own daemons, cgroups, networks)".into());
    }
    if let Some(missing) = programs.iter().find(|p| find_in_path(p).is_none()) {
        return Some(format!("{missing} is not installed"));
    }
    // A runtime asked for by name must exist: a typo is an error, not a
    // reason to skip.
    let rt = Runtime::from_env();
    assert!(
        rt.binary().exists(),
        "AGENTVM_TEST_RUNTIME: runtime binary {} not found",
        rt.binary().display()
    );
    None
}

/// This host's boot id. A container tier process reads the same value; a
/// microVM guest boots its own kernel and so reads another one.
pub fn host_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("read boot_id")
        .trim()
        .to_string()
}

/// This host's kernel release (`uname -r`), which a microVM's guest does
/// not share.
/// The host kernel's /proc/version: its release and build (two kernels
/// built from one source differ here, not in `uname -r`).
pub fn host_kernel_version() -> String {
    std::fs::read_to_string("/proc/version")
        .expect("/proc/version")
        .trim()
        .to_string()
}

pub fn host_uname_r() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("osrelease")
        .trim()
        .to_string()
}

/// Whether the runtime under test shares the host kernel (the container
/// tier and the peers do; agentvm's default tier, microvm, does not).
pub fn expects_host_kernel(rt: &Runtime) -> bool {
    !matches!(rt, Runtime::AgentvmDefault)
}

/// A name no other test, thread or run uses at the same time.
/// Whether CRIU can run on this host (`criu check`): `Err(why)` if not,
/// for the checkpoint and restore tests to skip aloud.
pub fn criu_works() -> Result<(), String> {
    match std::process::Command::new("criu")
        .arg("check")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "criu check failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("no criu: {e}")),
    }
}

pub fn unique_name(test: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("avmt-{test}-{}-{n}", std::process::id())
}

/// The last `n` lines of a log file, for failure messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    format!(
        "--- last {} lines of {} ---\n{}\n---",
        lines.len() - from,
        path.display(),
        lines[from..].join("\n")
    )
}

/// Polls `f` every 100 ms until it returns `Some`, for up to `secs` seconds.
pub fn wait_for<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Whether `pid` has exited (no such process, or a zombie nobody reaped).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_found_above_deps_in_the_same_profile() {
        let exe = Path::new("/t/target/x86_64-unknown-linux-gnu/release/deps/cli-0123abcd");
        assert_eq!(
            binary_of_build(exe, "agentvm"),
            Path::new("/t/target/x86_64-unknown-linux-gnu/release/agentvm")
        );
        // An executable run from the profile directory itself.
        let exe = Path::new("/t/target/debug/compare");
        assert_eq!(
            binary_of_build(exe, "agentvm"),
            Path::new("/t/target/debug/agentvm")
        );
    }

    #[test]
    fn the_repository_holds_the_test_scripts() {
        assert!(repo_root().join("tests/images/busybox-rootfs.sh").is_file());
        assert!(repo_root().join("kernels/build.sh").is_file());
    }
}
