//! Boot-time setup of the VM before the agent serves the host: a real root
//! mount, the API filesystems, cgroup2 controllers, loopback, the virtio-fs
//! share and the control port.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sys::statfs::{statfs, FsType, TMPFS_MAGIC};

use super::console;
use crate::protocol::{PORT_NAME, SHARE_BOOT_DIR, SHARE_MOUNT, SHARE_TAG};

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot mount {fstype} on {target}: {source}")]
    Mount {
        fstype: &'static str,
        target: &'static str,
        source: Errno,
    },
    #[error("cannot create directory {path}: {source}")]
    Mkdir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot move the root onto a tmpfs: {what}: {source}")]
    SwitchRoot { what: &'static str, source: Errno },
    #[error("no virtio-serial port named {PORT_NAME} appeared within {0:?} (ports seen: {1})")]
    NoPort(Duration, String),
}

/// What the agent needs from boot.
pub struct Booted {
    /// The control port's device node.
    pub port: PathBuf,
    /// Why the virtio-fs share is not mounted, if it is not: `create`
    /// fails with this message.
    pub share_error: Option<String>,
    /// Problems that do not stop the agent, reported to the host once the
    /// port is open.
    pub warnings: Vec<String>,
    /// How long each step took.
    pub phases: Vec<(&'static str, Duration)>,
}

/// How long to wait for the host to name the control port: the name
/// arrives on virtio-serial's control queue after the driver probed.
const PORT_WAIT: Duration = Duration::from_secs(10);

const NOSUID: MsFlags = MsFlags::MS_NOSUID;
const NODEV: MsFlags = MsFlags::MS_NODEV;
const NOEXEC: MsFlags = MsFlags::MS_NOEXEC;

pub fn setup() -> Result<Booted, BootError> {
    let mut warnings = Vec::new();
    let mut phases = Phases::default();
    switch_root()?;
    phases.mark("root");
    mount_api_filesystems()?;
    if let Err(e) = console::open() {
        warnings.push(format!("cannot open /dev/console: {e}"));
    }
    ensure_stdio();
    phases.mark("mounts");
    if let Err(e) = enable_cgroup_controllers() {
        warnings.push(e);
    }
    phases.mark("cgroups");
    if let Err(e) = loopback_up() {
        warnings.push(format!("cannot bring up lo: {e}"));
    }
    phases.mark("lo");
    if let Err(e) = super::trim::report_small_blocks() {
        warnings.push(e.to_string());
    }
    phases.mark("reporting");
    let share_error = mount_share().err();
    phases.mark("virtio-fs");
    let port = find_port()?;
    phases.mark("port");
    Ok(Booted {
        port,
        share_error,
        warnings,
        phases: phases.done,
    })
}

/// Durations of the boot steps, for the debug log.
struct Phases {
    since: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            since: Instant::now(),
            done: Vec::new(),
        }
    }
}

impl Phases {
    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, now - self.since));
        self.since = now;
    }
}

/// Where the share that was the boot root waits, in the new root, for
/// [`mount_share`] to move it to [`SHARE_MOUNT`] (under `/run`, which is
/// mounted after the switch).
const BOOT_SHARE: &str = "/.share";

/// Gives the agent a root of its own on a fresh tmpfs, whatever the kernel
/// booted from:
/// - the virtio-fs share (how agentvm boots a container's VM; see
///   `microvm::host::share_root`): a tmpfs is mounted on the agent's
///   directory in the share and pivoted to, the share kept at
///   [`BOOT_SHARE`] — the agent must not run on the host's directory;
/// - an initramfs (the kernel's `rootfs` mount, which has no parent, and
///   pivot_root(2) refuses a root without one, while libcontainer pivots
///   into the container's rootfs): `/` is moved onto a tmpfs, as
///   `switch_root` does.
fn switch_root() -> Result<(), BootError> {
    // include/uapi/linux/magic.h; neither nix nor libc has them.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
    const FUSE_SUPER_MAGIC: FsType = FsType(0x6573_5546);
    let root = statfs("/").map(|s| s.filesystem_type()).ok();
    if root == Some(FUSE_SUPER_MAGIC) {
        return pivot_off_the_share();
    }
    let on_ramfs = root.is_some_and(|t| t == RAMFS_MAGIC || t == TMPFS_MAGIC);
    if !on_ramfs {
        return Ok(());
    }
    mkdir("/newroot", 0o755)?;
    let err = |what| move |source| BootError::SwitchRoot { what, source };
    mount(
        Some("tmpfs"),
        "/newroot",
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755"),
    )
    .map_err(err("mount tmpfs on /newroot"))?;
    nix::unistd::chdir("/newroot").map_err(err("chdir /newroot"))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(err("move /newroot to /"))?;
    nix::unistd::chroot(".").map_err(err("chroot"))?;
    nix::unistd::chdir("/").map_err(err("chdir /"))?;
    Ok(())
}

/// The root is the share: a tmpfs on its agent directory becomes `/`, and
/// the share moves to [`BOOT_SHARE`] in it.
fn pivot_off_the_share() -> Result<(), BootError> {
    let err = |what| move |source| BootError::SwitchRoot { what, source };
    let new_root = format!("/{SHARE_BOOT_DIR}");
    mount(
        Some("tmpfs"),
        new_root.as_str(),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755"),
    )
    .map_err(err("mount tmpfs on the share's agent directory"))?;
    mkdir(&format!("{new_root}{BOOT_SHARE}"), 0o755)?;
    nix::unistd::chdir(new_root.as_str()).map_err(err("chdir to the new root"))?;
    nix::unistd::pivot_root(".", &BOOT_SHARE[1..]).map_err(err("pivot_root off the share"))?;
    nix::unistd::chdir("/").map_err(err("chdir /"))?;
    Ok(())
}

struct ApiMount {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: Option<&'static str>,
}

const API_MOUNTS: &[ApiMount] = &[
    ApiMount {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: NOSUID.union(NODEV).union(NOEXEC),
        data: None,
    },
    ApiMount {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID.union(NODEV).union(NOEXEC),
        data: None,
    },
    ApiMount {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: NOSUID,
        data: Some("mode=0755"),
    },
    ApiMount {
        source: "devpts",
        target: "/dev/pts",
        fstype: "devpts",
        flags: NOSUID.union(NOEXEC),
        data: Some("newinstance,ptmxmode=0666,mode=0620,gid=5"),
    },
    ApiMount {
        source: "shm",
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: NOSUID.union(NODEV),
        data: Some("mode=1777"),
    },
    ApiMount {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: NOSUID.union(NODEV),
        data: Some("mode=0755"),
    },
    ApiMount {
        source: "cgroup2",
        target: "/sys/fs/cgroup",
        fstype: "cgroup2",
        flags: NOSUID.union(NODEV).union(NOEXEC),
        data: None,
    },
];

fn mount_api_filesystems() -> Result<(), BootError> {
    for m in API_MOUNTS {
        mkdir(m.target, 0o755)?;
        match mount(Some(m.source), m.target, Some(m.fstype), m.flags, m.data) {
            Ok(()) => {}
            // The kernel may have mounted devtmpfs itself.
            Err(Errno::EBUSY) if m.fstype == "devtmpfs" => {}
            Err(source) => {
                return Err(BootError::Mount {
                    fstype: m.fstype,
                    target: m.target,
                    source,
                })
            }
        }
    }
    // With a private devpts instance, /dev/ptmx must lead to it.
    let _ = std::fs::remove_file("/dev/ptmx");
    let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    Ok(())
}

fn mkdir(path: &str, mode: u32) -> Result<(), BootError> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(_) if Path::new(path).is_dir() => Ok(()),
        Err(source) => Err(BootError::Mkdir {
            path: path.to_string(),
            source,
        }),
    }
}

/// Points fds 0-2 at the console if the kernel left them closed (an
/// initramfs without a `/dev/console` node), so that no file the agent
/// opens later lands on them.
fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on any integer only reads the fd table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1 {
            continue;
        }
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/console")
            .or_else(|_| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
            });
        if let Ok(file) = opened {
            let file = OwnedFd::from(file);
            if file.as_raw_fd() != fd {
                // SAFETY: `fd` is closed (checked above), so dup2 replaces
                // nothing that anyone owns.
                unsafe { libc::dup2(file.as_raw_fd(), fd) };
            } else {
                // It landed exactly on the free slot: keep it open, and
                // inheritable like a kernel-opened console would be.
                // SAFETY: F_SETFD on a descriptor we own takes no pointers.
                unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
                std::mem::forget(file);
            }
        }
    }
}

/// Enables the controllers libcontainer's cgroup v2 manager uses.
fn enable_cgroup_controllers() -> Result<(), String> {
    const WANTED: [&str; 5] = ["cpuset", "cpu", "io", "memory", "pids"];
    let available = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .map_err(|e| format!("cannot read /sys/fs/cgroup/cgroup.controllers: {e}"))?;
    let have: Vec<&str> = available.split_whitespace().collect();
    let enable: Vec<String> = WANTED
        .iter()
        .filter(|c| have.contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    if !enable.is_empty() {
        std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", enable.join(" "))
            .map_err(|e| format!("cannot enable cgroup controllers {enable:?}: {e}"))?;
    }
    let missing: Vec<&str> = WANTED
        .iter()
        .copied()
        .filter(|c| !have.contains(c))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the guest kernel lacks cgroup controllers {missing:?}"
        ))
    }
}

/// `ip link set lo up` in the guest's own network namespace.
fn loopback_up() -> std::io::Result<()> {
    crate::container::fixup::loopback_up_here()
}

/// Mounts the host's virtio-fs share. A failure is kept as a message for
/// `create` rather than ending the VM, so the host learns why.
///
/// The share is made a shared mount, as a host's `/` is under systemd, so
/// that the container's `rslave`/`rshared` bind mounts of its directories
/// get the propagation they ask for (of a private source, a slave bind
/// would be private). Each staged directory the host mounted shows up as a
/// virtio-fs submount on first access: they are reached here first, so
/// that they exist, shared, before the container's mount namespace copies
/// them (made there, they would be private).
fn mount_share() -> Result<(), String> {
    mkdir(SHARE_MOUNT, 0o755).map_err(|e| e.to_string())?;
    if Path::new(BOOT_SHARE).exists() {
        // Booted from the share: it is mounted already.
        mount(
            Some(BOOT_SHARE),
            SHARE_MOUNT,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("cannot move the virtio-fs share to {SHARE_MOUNT}: {e}"))?;
        let _ = std::fs::remove_dir(BOOT_SHARE);
    } else {
        mount(
            Some(SHARE_TAG),
            SHARE_MOUNT,
            Some("virtiofs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| {
            format!("cannot mount the virtio-fs share {SHARE_TAG:?} on {SHARE_MOUNT}: {e}")
        })?;
    }
    if let Ok(entries) = std::fs::read_dir(SHARE_MOUNT) {
        for entry in entries.flatten() {
            // Opening (not stat) triggers an automount. A failure only
            // leaves that submount to be made later, private.
            match entry.file_type() {
                Ok(t) if t.is_dir() => drop(std::fs::read_dir(entry.path())),
                Ok(t) if t.is_file() => drop(std::fs::File::open(entry.path())),
                _ => {}
            }
        }
    }
    mount(
        None::<&str>,
        SHARE_MOUNT,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the virtio-fs share on {SHARE_MOUNT} shared: {e}"))
}

/// Finds `/dev/vportNpM` whose sysfs name is [`PORT_NAME`]; never by number.
fn find_port() -> Result<PathBuf, BootError> {
    let start = Instant::now();
    loop {
        let (found, seen) = scan_ports();
        if let Some(dev) = found {
            // devtmpfs creates the node as the port is added; wait for it.
            if dev.exists() {
                return Ok(dev);
            }
        }
        if start.elapsed() >= PORT_WAIT {
            let seen = if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join(", ")
            };
            return Err(BootError::NoPort(PORT_WAIT, seen));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The device node of our port if its name is known yet, and every
/// `vport=name` pair seen (for the error message).
fn scan_ports() -> (Option<PathBuf>, Vec<String>) {
    let mut seen = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") else {
        return (None, seen);
    };
    for entry in dir.flatten() {
        let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        let name = name.trim();
        let vport = entry.file_name();
        seen.push(format!("{}={name:?}", vport.to_string_lossy()));
        if name == PORT_NAME {
            return (Some(Path::new("/dev").join(vport)), seen);
        }
    }
    (None, seen)
}
