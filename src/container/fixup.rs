//! The fix-up pass after libcontainer's `create`: mount flags and
//! propagation that libcontainer 0.7 leaves out.
//!
//! When `build()` returns, the container's init has made every mount and
//! waits for `start` in its own mount namespace, so nothing in the container
//! has run yet. libcontainer does not apply:
//! - `ro` (nor `nosuid`/`nodev`/`noexec`) to the per-hierarchy binds and the
//!   tmpfs it makes for a cgroup v1 mount, leaving them writable by the
//!   container's root;
//! - `ro` to `/dev` (it strips the flag so that it can make device nodes;
//!   runc remounts `/dev` read-only once they are made);
//! - the propagation options (`private`, `rshared`, `slave`, ...).
//!
//! A dedicated thread joins the init's mount namespace and sets, with
//! `mount_setattr`, every attribute and propagation the spec asks for on the
//! mount at each destination (on the whole subtree for cgroup mounts and for
//! the recursive `r`-options). Attributes are only ever added, and a spec
//! mount hidden by a later one is skipped. Any failure fails `create`: a
//! container must not run with weaker mounts than it asked for.
//!
//! libcontainer also leaves the loopback interface of a new network
//! namespace down, where runc brings it up: [`loopback_up`] does that from
//! a thread that joins the init's network namespace.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Mount, Spec};

use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum FixupError {
    #[error("cannot open {path} of the container's init: {source}")]
    Proc { path: PathBuf, source: io::Error },
    #[error("cannot enter the container's mount namespace: {0}")]
    Setns(io::Error),
    #[error("cannot find the mount at {dest} in the container: {source}")]
    Lookup { dest: PathBuf, source: io::Error },
    #[error("cannot set {what} on the mount at {dest}: {source}")]
    Setattr {
        dest: PathBuf,
        what: String,
        source: io::Error,
    },
    #[error("the mount fix-up thread panicked")]
    Panicked,
    #[error("cannot bring up the loopback interface of the container's network namespace: {0}")]
    Loopback(io::Error),
}

/// What one spec mount needs beyond what libcontainer gave it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MountFix {
    pub destination: PathBuf,
    /// MOUNT_ATTR_* for the mount itself.
    pub attrs: u64,
    /// MOUNT_ATTR_* for the mount and everything mounted below it.
    pub recursive_attrs: u64,
    /// (MS_PRIVATE | MS_SHARED | MS_SLAVE | MS_UNBINDABLE, recursive), in
    /// the spec's order.
    pub propagation: Vec<(u64, bool)>,
}

const ATTRS: &[(&str, &str, u64)] = &[
    ("ro", "rw", sys::MOUNT_ATTR_RDONLY),
    ("nosuid", "suid", sys::MOUNT_ATTR_NOSUID),
    ("nodev", "dev", sys::MOUNT_ATTR_NODEV),
    ("noexec", "exec", sys::MOUNT_ATTR_NOEXEC),
];

const PROPAGATION: &[(&str, u64)] = &[
    ("private", libc::MS_PRIVATE),
    ("shared", libc::MS_SHARED),
    ("slave", libc::MS_SLAVE),
    ("unbindable", libc::MS_UNBINDABLE),
];

/// A path's normal components after lexical cleaning (`.` dropped, `..`
/// removing the previous component and stopping at `/`), as runc cleans
/// mount destinations and the cwd.
pub fn clean(path: &Path) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// libcontainer's rule: a bind mount by type or by option.
pub fn is_bind(m: &Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .iter()
            .flatten()
            .any(|o| o == "bind" || o == "rbind")
}

/// Whether option `on` wins over `off` (the last of them counts).
pub fn option_set(m: &Mount, on: &str, off: &str) -> bool {
    m.options()
        .iter()
        .flatten()
        .rev()
        .find(|o| *o == on || *o == off)
        .is_some_and(|o| o == on)
}

/// The fix for one mount from its options alone.
fn fix_for(m: &Mount) -> MountFix {
    let mut fix = MountFix {
        destination: m.destination().clone(),
        ..Default::default()
    };
    for opt in m.options().iter().flatten() {
        let opt = opt.as_str();
        for &(on, off, bit) in ATTRS {
            match opt {
                o if o == on => fix.attrs |= bit,
                o if o == off => fix.attrs &= !bit,
                o if o.strip_prefix('r') == Some(on) => fix.recursive_attrs |= bit,
                o if o.strip_prefix('r') == Some(off) => fix.recursive_attrs &= !bit,
                _ => {}
            }
        }
        for &(name, flag) in PROPAGATION {
            if opt == name {
                fix.propagation.push((flag, false));
            } else if opt.strip_prefix('r') == Some(name) {
                fix.propagation.push((flag, true));
            }
        }
    }
    // libcontainer turns a cgroup mount into a tmpfs with a mount per
    // hierarchy below it: the options are meant for all of them.
    if matches!(m.typ().as_deref(), Some("cgroup") | Some("cgroup2")) {
        fix.recursive_attrs |= fix.attrs;
        fix.attrs = 0;
    }
    fix
}

/// The fixes for a spec's mounts, skipping mounts that a later mount at
/// the same or an enclosing destination hides.
pub fn plan(spec: &Spec) -> Vec<MountFix> {
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    let dests: Vec<Vec<OsString>> = mounts.iter().map(|m| clean(m.destination())).collect();
    mounts
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            !dests[i + 1..]
                .iter()
                .any(|later| dests[*i].starts_with(later))
        })
        .map(|(_, m)| fix_for(m))
        .filter(|f| f.attrs != 0 || f.recursive_attrs != 0 || !f.propagation.is_empty())
        .collect()
}

/// Applies `fixes` to the mounts of the container whose init is `pid`.
pub fn apply(pid: i32, fixes: &[MountFix]) -> Result<(), FixupError> {
    if fixes.is_empty() {
        return Ok(());
    }
    let open = |what: &str, dir: bool| {
        sys::open_proc(pid, what, dir).map_err(|(path, source)| FixupError::Proc { path, source })
    };
    let root = open("root", true)?;
    let ns = open("ns/mnt", false)?;
    let own_ns = same_file(ns.as_fd(), Path::new("/proc/self/ns/mnt"));
    // setns() changes the calling thread only; this thread ends right after.
    std::thread::scope(|s| {
        s.spawn(|| {
            if !own_ns {
                sys::enter_mount_namespace(ns.as_fd()).map_err(FixupError::Setns)?;
            }
            fixes.iter().try_for_each(|f| apply_one(root.as_fd(), f))
        })
        .join()
        .unwrap_or(Err(FixupError::Panicked))
    })
}

/// Whether the spec asks for a new network namespace (one not joined by
/// path), whose loopback interface the runtime brings up.
pub fn new_network_namespace(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|nss| {
            nss.iter()
                .any(|n| n.typ() == LinuxNamespaceType::Network && n.path().is_none())
        })
}

/// Brings up `lo` in the network namespace of the container whose init is
/// `pid`, as runc does for a new network namespace.
pub fn loopback_up(pid: i32) -> Result<(), FixupError> {
    let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
    let ns = std::fs::File::open(&path)
        .map(OwnedFd::from)
        .map_err(|source| FixupError::Proc { path, source })?;
    // setns() changes the calling thread only; this thread ends right after.
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::enter_network_namespace(ns.as_fd())
                .and_then(|()| sys::loopback_up())
                .map_err(FixupError::Loopback)
        })
        .join()
        .unwrap_or(Err(FixupError::Panicked))
    })
}

/// `ip link set lo up` in the caller's own network namespace.
pub fn loopback_up_here() -> io::Result<()> {
    sys::loopback_up()
}

fn same_file(fd: std::os::fd::BorrowedFd<'_>, path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    match (
        nix::sys::stat::fstat(fd.as_raw_fd()),
        nix::sys::stat::stat(path),
    ) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

fn apply_one(root: std::os::fd::BorrowedFd<'_>, fix: &MountFix) -> Result<(), FixupError> {
    let dest = &fix.destination;
    let mut rel: PathBuf = clean(dest).iter().collect();
    if rel.as_os_str().is_empty() {
        rel = PathBuf::from(".");
    }
    // Resolved the way libcontainer resolved it when mounting: inside the
    // container's root, never through /proc magic links.
    let fd = sys::openat2(
        root,
        &rel,
        libc::O_PATH,
        sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|source| FixupError::Lookup {
        dest: dest.clone(),
        source,
    })?;
    let err = |what: String| {
        move |source: io::Error| FixupError::Setattr {
            dest: dest.clone(),
            what,
            source,
        }
    };
    if fix.attrs != 0 {
        sys::mount_setattr(fd.as_fd(), fix.attrs, 0, false)
            .map_err(err(attr_names(fix.attrs, "")))?;
    }
    if fix.recursive_attrs != 0 {
        sys::mount_setattr(fd.as_fd(), fix.recursive_attrs, 0, true)
            .map_err(err(attr_names(fix.recursive_attrs, "r")))?;
    }
    for &(flag, recursive) in &fix.propagation {
        sys::mount_setattr(fd.as_fd(), 0, flag, recursive)
            .map_err(err(propagation_name(flag, recursive)))?;
    }
    tracing::debug!(?fix, "mount fixed up");
    Ok(())
}

fn attr_names(bits: u64, prefix: &str) -> String {
    ATTRS
        .iter()
        .filter(|(_, _, bit)| bits & bit != 0)
        .map(|(on, _, _)| format!("{prefix}{on}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn propagation_name(flag: u64, recursive: bool) -> String {
    let name = PROPAGATION
        .iter()
        .find(|(_, f)| *f == flag)
        .map_or("propagation", |(n, _)| n);
    match recursive {
        true => format!("r{name}"),
        false => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{MountBuilder, SpecBuilder};

    use super::*;

    fn mount(dest: &str, typ: &str, options: &[&str]) -> Mount {
        MountBuilder::default()
            .destination(dest)
            .typ(typ)
            .source(typ)
            .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .build()
            .unwrap()
    }

    fn plan_of(mounts: Vec<Mount>) -> Vec<MountFix> {
        plan(&SpecBuilder::default().mounts(mounts).build().unwrap())
    }

    #[test]
    fn clean_is_lexical_and_stops_at_root() {
        let c = |p: &str| clean(Path::new(p)).into_iter().collect::<PathBuf>();
        assert_eq!(c("/a/./b/../c"), PathBuf::from("a/c"));
        assert_eq!(c("/../../etc"), PathBuf::from("etc"));
        assert_eq!(c("/"), PathBuf::new());
        assert_eq!(c("a//b/"), PathBuf::from("a/b"));
    }

    #[test]
    fn later_options_override_earlier_ones() {
        let f = fix_for(&mount(
            "/x",
            "bind",
            &["ro", "nosuid", "rw", "exec", "noexec"],
        ));
        assert_eq!(f.attrs, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC);
        assert_eq!(f.recursive_attrs, 0);
    }

    #[test]
    fn recursive_options_apply_to_the_subtree() {
        let f = fix_for(&mount("/x", "bind", &["rbind", "rro", "rnodev", "nosuid"]));
        assert_eq!(f.attrs, sys::MOUNT_ATTR_NOSUID);
        assert_eq!(
            f.recursive_attrs,
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV
        );
    }

    #[test]
    fn cgroup_options_cover_every_hierarchy_below() {
        let f = fix_for(&mount(
            "/sys/fs/cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", "ro"],
        ));
        assert_eq!(f.attrs, 0);
        assert_eq!(
            f.recursive_attrs,
            sys::MOUNT_ATTR_RDONLY
                | sys::MOUNT_ATTR_NOSUID
                | sys::MOUNT_ATTR_NODEV
                | sys::MOUNT_ATTR_NOEXEC
        );
    }

    #[test]
    fn propagation_in_order_with_recursion() {
        let f = fix_for(&mount(
            "/x",
            "bind",
            &["rbind", "rprivate", "shared", "runbindable"],
        ));
        assert_eq!(
            f.propagation,
            vec![
                (libc::MS_PRIVATE, true),
                (libc::MS_SHARED, false),
                (libc::MS_UNBINDABLE, true)
            ]
        );
        // "rbind" is not "r" + "bind" propagation, nor is "rw" a flag.
        let f = fix_for(&mount("/y", "bind", &["rbind", "rw"]));
        assert_eq!(
            f,
            MountFix {
                destination: "/y".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn dev_read_only_is_planned() {
        let p = plan_of(vec![mount("/dev", "tmpfs", &["nosuid", "ro", "mode=755"])]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].attrs, sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID);
    }

    #[test]
    fn hidden_mounts_and_mounts_without_options_are_skipped() {
        let p = plan_of(vec![
            mount("/data/sub", "bind", &["ro"]),
            mount("/data/./", "tmpfs", &["nodev"]),
            mount("/plain", "tmpfs", &["size=1m"]),
            mount("/other", "bind", &["rbind", "rslave"]),
        ]);
        let dests: Vec<_> = p.iter().map(|f| f.destination.clone()).collect();
        assert_eq!(
            dests,
            vec![PathBuf::from("/data/./"), PathBuf::from("/other")]
        );
    }

    #[test]
    fn names_for_errors() {
        assert_eq!(
            attr_names(sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOEXEC, "r"),
            "rro,rnoexec"
        );
        assert_eq!(propagation_name(libc::MS_SLAVE, true), "rslave");
    }

    /// A shell in its own mount namespace with a tmpfs at `dir` and another
    /// at `dir/sub`, waiting for a line on stdin.
    struct Namespaced {
        child: std::process::Child,
    }

    impl Namespaced {
        fn start(dir: &Path) -> Option<Namespaced> {
            let script = format!(
                "mount -t tmpfs tmpfs {d} && mkdir {d}/sub && mount -t tmpfs tmpfs {d}/sub \
                 && echo ready && read x",
                d = dir.display()
            );
            let mut child = std::process::Command::new("/usr/bin/unshare")
                .args([
                    "--mount",
                    "--propagation",
                    "private",
                    "/bin/sh",
                    "-c",
                    &script,
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .ok()?;
            let mut out = std::io::BufReader::new(child.stdout.take()?);
            let mut line = String::new();
            std::io::BufRead::read_line(&mut out, &mut line).ok()?;
            (line == "ready\n").then_some(Namespaced { child })
        }

        fn pid(&self) -> i32 {
            self.child.id() as i32
        }

        /// (per-mount options, optional fields) of the mount at `target`.
        fn mount(&self, target: &Path) -> (Vec<String>, Vec<String>) {
            let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid())).unwrap();
            let line = info
                .lines()
                .rev()
                .find(|l| l.split(' ').nth(4) == Some(target.to_str().unwrap()))
                .unwrap_or_else(|| panic!("{} not mounted", target.display()))
                .to_string();
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-").unwrap();
            let opts = fields[5].split(',').map(str::to_string).collect();
            let optional = fields[6..dash].iter().map(|s| s.to_string()).collect();
            (opts, optional)
        }
    }

    impl Drop for Namespaced {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    #[test]
    fn apply_sets_flags_and_propagation_in_the_containers_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mount namespaces need root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        let Some(ns) = Namespaced::start(&dir) else {
            eprintln!("skipped: cannot start a shell in a new mount namespace");
            return;
        };
        let fix = MountFix {
            destination: dir.clone(),
            attrs: sys::MOUNT_ATTR_RDONLY,
            recursive_attrs: sys::MOUNT_ATTR_NODEV,
            propagation: vec![(libc::MS_SHARED, false)],
        };
        apply(ns.pid(), &[fix]).unwrap();
        let (opts, optional) = ns.mount(&dir);
        assert!(opts.contains(&"ro".to_string()), "{opts:?}");
        assert!(opts.contains(&"nodev".to_string()), "{opts:?}");
        assert!(
            optional.iter().any(|o| o.starts_with("shared:")),
            "{optional:?}"
        );
        // Non-recursive flags stay on the mount itself, recursive ones
        // reach the submount; propagation was not recursive.
        let (opts, optional) = ns.mount(&dir.join("sub"));
        assert!(opts.contains(&"rw".to_string()), "{opts:?}");
        assert!(opts.contains(&"nodev".to_string()), "{opts:?}");
        assert!(optional.is_empty(), "{optional:?}");
        // Nothing of this reached our own namespace.
        let ours = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!ours.contains(dir.to_str().unwrap()));
    }

    #[test]
    fn apply_refuses_a_destination_that_is_not_a_mount() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mount namespaces need root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        std::fs::create_dir_all(dir.join("plain")).unwrap();
        let Some(ns) = Namespaced::start(&dir) else {
            eprintln!("skipped: cannot start a shell in a new mount namespace");
            return;
        };
        let fix = |d: PathBuf| MountFix {
            destination: d,
            attrs: sys::MOUNT_ATTR_RDONLY,
            ..Default::default()
        };
        // Missing in the container's view (the host has it, hidden there).
        let err = apply(ns.pid(), &[fix(dir.join("plain"))]).unwrap_err();
        assert!(matches!(err, FixupError::Lookup { .. }), "{err}");
        // A plain directory: the mount containing it is left alone.
        let plain = apply(ns.pid(), &[fix(tmp.path().to_path_buf())]).unwrap_err();
        assert!(matches!(plain, FixupError::Setattr { .. }), "{plain}");
        let root_opts = ns.mount(Path::new("/")).0;
        assert!(root_opts.contains(&"rw".to_string()), "{root_opts:?}");
    }

    #[test]
    fn only_a_new_network_namespace_asks_for_loopback() {
        let spec = |nss: serde_json::Value| -> Spec {
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "linux": {"namespaces": nss}
            }))
            .unwrap()
        };
        assert!(new_network_namespace(&spec(serde_json::json!([
            {"type": "pid"}, {"type": "network"}
        ]))));
        assert!(!new_network_namespace(&spec(serde_json::json!([
            {"type": "network", "path": "/var/run/netns/x"}
        ]))));
        assert!(!new_network_namespace(&spec(
            serde_json::json!([{"type": "pid"}])
        )));
    }

    /// `lo`'s flags in the network namespace of `pid`, as `ip` shows them.
    fn lo_flags(pid: i32) -> Option<String> {
        let out = std::process::Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ip",
                "-o",
                "link",
                "show",
                "lo",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let flags = text.split('<').nth(1)?.split('>').next()?;
        out.status.success().then(|| flags.to_string())
    }

    #[test]
    fn loopback_comes_up_in_the_containers_network_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: network namespaces need root");
            return;
        }
        let Ok(mut child) = std::process::Command::new("/usr/bin/unshare")
            .args(["--net", "/bin/sh", "-c", "echo ready && read x"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: cannot start a shell in a new network namespace");
            return;
        };
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let pid = child.id() as i32;
        let before = lo_flags(pid);
        let result = loopback_up(pid);
        let after = lo_flags(pid);
        let _ = child.kill();
        let _ = child.wait();
        let (Some(before), Some(after)) = (before, after) else {
            eprintln!("skipped: nsenter or ip is missing");
            return;
        };
        result.unwrap();
        assert!(!before.split(',').any(|f| f == "UP"), "{before}");
        assert!(after.split(',').any(|f| f == "UP"), "{after}");
    }

    #[test]
    fn option_set_takes_the_last() {
        let m = mount("/x", "bind", &["ro", "rw"]);
        assert!(!option_set(&m, "ro", "rw"));
        let m = mount("/x", "bind", &["rw", "ro"]);
        assert!(option_set(&m, "ro", "rw"));
        assert!(!option_set(&mount("/x", "bind", &[]), "ro", "rw"));
    }
}
