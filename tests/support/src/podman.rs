//! Podman with isolated storage and configuration.
//!
//! Everything podman would read from /etc or write under /var/lib or /run is
//! redirected: a containers.conf named by `CONTAINERS_CONF`, `--root` and
//! `--runroot` for storage, cgroupfs (no systemd) and file events (no
//! journald). The runtime is given as a path with `--runtime`; agentvm's
//! tier travels as `--runtime-flag isolation=container`, which podman (and
//! conmon) hand to every runtime call as the global `--isolation=container`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::cmd::{self, Output};
use super::{daemon, host_unsuitable, rootfs, Runtime, DATA_DIR, RUN_DIR};

/// Podman stores imported images under the `localhost/` domain.
pub const IMAGE: &str = "localhost/local/busybox";

pub struct Podman {
    pub runtime: Runtime,
}

/// The shared fixture: config written and the image imported.
pub fn podman() -> Result<&'static Podman, String> {
    static PODMAN: OnceLock<Result<Podman, String>> = OnceLock::new();
    PODMAN
        .get_or_init(|| {
            if let Some(why) = host_unsuitable(&["podman", "conmon"]) {
                return Err(why);
            }
            let podman = Podman {
                runtime: Runtime::from_env(),
            };
            podman.ensure_config();
            podman.ensure_image();
            Ok(podman)
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn dir() -> PathBuf {
    Path::new(RUN_DIR).join("podman")
}

fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid pointer given.
    let rc = unsafe { libc::getrlimit(resource, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    lim.rlim_max
}

/// containers.conf for the tests. Podman's defaults for RLIMIT_NOFILE
/// (1048576) and RLIMIT_NPROC (its own limit, which podman lowers to 32768)
/// can exceed what root may set where the hard limits are lower and
/// CAP_SYS_RESOURCE is missing, so they are pinned at what this host allows.
fn containers_conf() -> String {
    let nofile = hard_limit(libc::RLIMIT_NOFILE).min(1 << 20);
    let nproc = hard_limit(libc::RLIMIT_NPROC).min(32768);
    let d = dir();
    format!(
        "[containers]\n\
         default_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\
         \n\
         [engine]\n\
         cgroup_manager = \"cgroupfs\"\n\
         events_logger = \"file\"\n\
         events_logfile_path = \"{}\"\n\
         tmp_dir = \"{}\"\n",
        d.join("events.log").display(),
        d.join("tmp").display(),
    )
}

impl Podman {
    /// A `podman` command with the test storage, config and runtime.
    pub fn cmd(&self) -> Command {
        self.cmd_with_flag(self.runtime == Runtime::AgentvmContainer)
    }

    /// As `cmd`, choosing whether to add `--runtime-flag isolation=container`.
    pub fn cmd_with_flag(&self, isolation_flag: bool) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", dir().join("containers.conf"))
            .arg("--root")
            .arg(Path::new(DATA_DIR).join("podman/root"))
            .arg("--runroot")
            .arg(dir().join("runroot"))
            .args(["--storage-driver", "overlay"])
            .args(["--cgroup-manager=cgroupfs", "--events-backend=file"])
            .arg("--runtime")
            .arg(self.runtime.binary());
        if isolation_flag {
            c.args(["--runtime-flag", "isolation=container"]);
        }
        c
    }

    fn ensure_config(&self) {
        std::fs::create_dir_all(dir().join("tmp")).expect("create podman dirs");
        daemon::write_if_changed(&dir().join("containers.conf"), &containers_conf());
    }

    fn ensure_image(&self) {
        let tar = rootfs::tarball();
        let _lock = daemon::lock(&dir().join("image.lock"));
        let stamp_path = Path::new(DATA_DIR).join("podman/image.stamp");
        let stamp = tar_stamp(&tar);
        let fresh = cmd::run(self.cmd().args(["image", "exists", IMAGE])).success()
            && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str());
        if !fresh {
            cmd::run(self.cmd().arg("import").arg(&tar).arg(IMAGE)).ok();
            std::fs::write(&stamp_path, stamp).expect("write podman image stamp");
        }
    }

    /// `podman run --rm --network none IMAGE CMD...`.
    pub fn run_rm(&self, command: &[&str]) -> Output {
        let mut c = self.cmd();
        c.args(["run", "--rm", "--network", "none", IMAGE])
            .args(command);
        cmd::run(&mut c)
    }
}

/// A stamp naming the tarball (by mtime) the stored image came from.
fn tar_stamp(tar: &Path) -> String {
    let mtime = std::fs::metadata(tar)
        .and_then(|m| m.modified())
        .expect("stat rootfs tarball");
    format!("{mtime:?}")
}
