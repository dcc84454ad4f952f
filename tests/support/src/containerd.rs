//! A dedicated containerd (no CRI) driven with `ctr`.
//!
//! `ctr run --runc-binary` makes the runc shim (io.containerd.runc.v2) call
//! agentvm in place of runc. ctr cannot add global runtime flags, so the
//! tier travels in the OCI annotation `io.agentvm.isolation`, which agentvm
//! reads from config.json. (The shim passes containerd's environment on to
//! the runtime, so `AGENTVM_CONFIG` set for containerd would work too.)
//! The container's rootfs is an unpacked busybox tree (`--rootfs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::cmd::{self, Output};
use super::{daemon, host_unsuitable, rootfs, Runtime, DATA_DIR, ISOLATION_ANNOTATION, RUN_DIR};

/// The containerd namespace the tests use.
pub const NAMESPACE: &str = "agentvm-test";

pub struct Containerd {
    pub runtime: Runtime,
    rootfs: PathBuf,
}

/// The shared fixture: containerd is up and the rootfs is unpacked.
pub fn containerd() -> Result<&'static Containerd, String> {
    static CONTAINERD: OnceLock<Result<Containerd, String>> = OnceLock::new();
    CONTAINERD
        .get_or_init(|| {
            if let Some(why) = host_unsuitable(&["containerd", "ctr", "containerd-shim-runc-v2"]) {
                return Err(why);
            }
            ensure_daemon();
            Ok(Containerd {
                runtime: Runtime::from_env(),
                rootfs: rootfs::unpacked(),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn dir() -> PathBuf {
    Path::new(RUN_DIR).join("containerd")
}

fn socket() -> PathBuf {
    dir().join("containerd.sock")
}

fn log_path() -> PathBuf {
    Path::new(RUN_DIR).join("containerd.log")
}

fn config() -> String {
    format!(
        "version = 2\n\
         root = \"{}\"\n\
         state = \"{}\"\n\
         disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
         \n\
         [grpc]\n  address = \"{}\"\n",
        Path::new(DATA_DIR).join("containerd").display(),
        dir().join("state").display(),
        socket().display(),
    )
}

fn ctr() -> Command {
    let mut c = Command::new("ctr");
    c.arg("--address")
        .arg(socket())
        .args(["--namespace", NAMESPACE]);
    c
}

fn answers() -> bool {
    cmd::try_run_with(
        ctr().arg("version"),
        None,
        std::time::Duration::from_secs(10),
    )
    .map(|o| o.success())
    .unwrap_or(false)
}

fn ensure_daemon() {
    std::fs::create_dir_all(dir()).expect("create containerd dir");
    let _lock = daemon::lock(&Path::new(RUN_DIR).join("containerd.lock"));
    let config_path = Path::new(RUN_DIR).join("containerd.toml");
    let changed = daemon::write_if_changed(&config_path, &config());
    if let Some(pid) = find_containerd_pid(&config_path) {
        if !changed && answers() {
            return;
        }
        // SAFETY: kill only sends a signal, to the live containerd named by
        // our own pid file; it is restarted with the new config below.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        super::wait_for(30, || {
            find_containerd_pid(&config_path).is_none().then_some(())
        });
    }
    let mut command = Command::new("containerd");
    command.arg("--config").arg(&config_path).current_dir("/");
    daemon::start(daemon::Spec {
        name: "containerd",
        command,
        log: log_path(),
        ready: &answers,
        ready_timeout_secs: 60,
    });
}

/// The pid of a live containerd started with `config` (containerd writes
/// no pid file of its own).
fn find_containerd_pid(config: &Path) -> Option<i32> {
    let want = config.to_str()?;
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        // A zombie has an empty cmdline and does not match.
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it = args.first().is_some_and(|a| a.ends_with(b"containerd"))
            && args.contains(&want.as_bytes());
        is_it.then_some(pid)
    })
}

impl Containerd {
    /// `ctr run --rm` of `command` with the runtime under test.
    pub fn run_rm(&self, id: &str, command: &[&str]) -> Output {
        let mut c = ctr();
        c.args(["run", "--rm", "--runc-binary"])
            .arg(self.runtime.binary())
            .arg("--runc-root")
            .arg(Path::new(RUN_DIR).join("runc"))
            .args(["--env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
        if self.runtime == Runtime::AgentvmContainer {
            c.arg("--annotation")
                .arg(format!("{ISOLATION_ANNOTATION}=container"));
        }
        c.arg("--rootfs").arg(&self.rootfs).arg(id).args(command);
        cmd::run(&mut c)
    }
}
