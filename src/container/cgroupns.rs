//! cgroup v1 hierarchies mounted in a container's own cgroup namespace when
//! the host co-mounts controllers (`cpu,cpuacct`, `net_cls,net_prio`).
//!
//! For a `cgroup` mount on a cgroup v1 host, libcontainer 0.7 mounts a
//! tmpfs and, with a cgroup namespace, a fresh cgroupfs of each host
//! hierarchy below it, naming the controllers by the hierarchy's directory
//! in a single `fsconfig` flag. The new mount API splits nothing on commas,
//! so `net_cls,net_prio` is no controller to the kernel (EINVAL) and the
//! container fails to start where runc's starts.
//!
//! When the host has such a hierarchy, libcontainer is handed a plain tmpfs
//! at the mount's destination instead ([`take_over`]), and once the init
//! waits for `start` a thread joins its mount and cgroup namespaces and
//! does what runc does ([`mount`]): a cgroupfs of each host hierarchy in a
//! directory of the hierarchy's name (its root is the container's cgroup,
//! the namespace's root), with one option per controller, and a link from
//! each co-mounted controller's name to its hierarchy (`cpu ->
//! cpu,cpuacct`). The spec's options for the mount (`ro`, `nosuid`, ...)
//! then reach the whole tree through the fix-up pass, as for any cgroup
//! mount (`fixup::plan`).

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Mount, MountBuilder, Spec};

use super::fixup::clean;
use super::sys;

/// Where a cgroup v1 host mounts its hierarchies (libcontainer mounts only
/// those, as runc does).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What libcontainer's own cgroup tmpfs gets.
const TMPFS_OPTIONS: &[&str] = &["noexec", "nosuid", "nodev", "mode=755"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupNsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot build the tmpfs for the cgroup mount at {dest}: {msg}")]
    Spec { dest: PathBuf, msg: String },
    #[error("cannot open {path} of the container's init: {source}")]
    Proc { path: PathBuf, source: io::Error },
    #[error("cannot enter the container's {what} namespace: {source}")]
    Setns {
        what: &'static str,
        source: io::Error,
    },
    #[error("cannot find the cgroup tmpfs at {dest} in the container: {source}")]
    Lookup { dest: PathBuf, source: io::Error },
    #[error("cannot mount the cgroup v1 hierarchy {dir} at {dest} in the container: {source}")]
    Mount {
        dir: String,
        dest: PathBuf,
        source: io::Error,
    },
    #[error("cannot link {name} to {dir} at {dest} in the container: {source}")]
    Link {
        name: String,
        dir: String,
        dest: PathBuf,
        source: io::Error,
    },
    #[error("the cgroup mount thread panicked")]
    Panicked,
}

/// One cgroup v1 hierarchy of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Its directory's name below the cgroup root (`net_cls,net_prio`).
    pub dir: String,
    /// Its controllers and name, one per option (`net_cls`, `net_prio`,
    /// `name=systemd`).
    pub options: Vec<String>,
}

impl Hierarchy {
    /// The controller names that link to this hierarchy: those of a
    /// directory named after several controllers, as runc links them.
    fn links(&self) -> Vec<&str> {
        if !self.dir.contains(',') {
            return Vec::new();
        }
        self.dir
            .split(',')
            .filter(|n| !n.is_empty() && !n.contains('='))
            .collect()
    }
}

/// The cgroup mounts this runtime makes itself, with the host's
/// hierarchies as they were at `create`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeOver {
    pub destinations: Vec<PathBuf>,
    pub hierarchies: Vec<Hierarchy>,
}

/// The controllers the kernel knows (`/proc/cgroups`).
pub fn subsystems(proc_cgroups: &str) -> Vec<String> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v1 hierarchies mounted directly below [`CGROUP_ROOT`] in
/// `mountinfo`, each with the options naming its controllers (those in
/// `subsystems`) and its name.
pub fn hierarchies(mountinfo: &str, subsystems: &[String]) -> Vec<Hierarchy> {
    let mut out: Vec<Hierarchy> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split_whitespace();
        if right.next() != Some("cgroup") {
            continue;
        }
        let superopts = right.nth(1).unwrap_or("");
        let Some(point) = left.split_whitespace().nth(4).map(unescape) else {
            continue;
        };
        let point = Path::new(&point);
        if point.parent() != Some(Path::new(CGROUP_ROOT)) {
            continue;
        }
        let Some(dir) = point.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let options: Vec<String> = superopts
            .split(',')
            .filter(|o| o.starts_with("name=") || subsystems.iter().any(|s| s == o))
            .map(str::to_string)
            .collect();
        // A hierarchy mounted twice at the same place counts once.
        if options.is_empty() || out.iter().any(|h| h.dir == dir) {
            continue;
        }
        out.push(Hierarchy {
            dir: dir.to_string(),
            options,
        });
    }
    out
}

/// Whether the spec gives the container a cgroup namespace.
fn has_cgroup_namespace(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|nss| nss.iter().any(|n| n.typ() == LinuxNamespaceType::Cgroup))
}

/// The take-over for `spec` on a host with `hierarchies` (cgroup v1 when
/// `v1`): the `cgroup` mounts of a container with a cgroup namespace, when
/// one of the hierarchies is co-mounted. Each such mount becomes a tmpfs
/// in `spec`.
pub fn plan(
    spec: &mut Spec,
    v1: bool,
    hierarchies: Vec<Hierarchy>,
) -> Result<Option<TakeOver>, CgroupNsError> {
    if !v1 || !has_cgroup_namespace(spec) || !hierarchies.iter().any(|h| h.dir.contains(',')) {
        return Ok(None);
    }
    let Some(mounts) = spec.mounts_mut().as_mut() else {
        return Ok(None);
    };
    let mut destinations = Vec::new();
    for m in mounts
        .iter_mut()
        .filter(|m| m.typ().as_deref() == Some("cgroup"))
    {
        *m = tmpfs_at(m)?;
        destinations.push(m.destination().clone());
    }
    if destinations.is_empty() {
        return Ok(None);
    }
    Ok(Some(TakeOver {
        destinations,
        hierarchies,
    }))
}

fn tmpfs_at(m: &Mount) -> Result<Mount, CgroupNsError> {
    MountBuilder::default()
        .destination(m.destination().clone())
        .typ("tmpfs")
        .source("tmpfs")
        .options(
            TMPFS_OPTIONS
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>(),
        )
        .build()
        .map_err(|e| CgroupNsError::Spec {
            dest: m.destination().clone(),
            msg: e.to_string(),
        })
}

/// [`plan`] with this host's hierarchies.
pub fn take_over(spec: &mut Spec) -> Result<Option<TakeOver>, CgroupNsError> {
    if !has_cgroup_namespace(spec) {
        return Ok(None);
    }
    let v1 = super::cgroups::v1_host();
    if !v1 {
        return Ok(None);
    }
    let read = |path: &str| {
        std::fs::read_to_string(path).map_err(|source| CgroupNsError::Read {
            path: PathBuf::from(path),
            source,
        })
    };
    let known = subsystems(&read("/proc/cgroups")?);
    let found = hierarchies(&read("/proc/self/mountinfo")?, &known);
    let taken = plan(spec, v1, found)?;
    if let Some(t) = &taken {
        tracing::debug!(?t, "the runtime mounts the cgroup v1 hierarchies itself");
    }
    Ok(taken)
}

/// Mounts the hierarchies below each taken-over destination in the
/// container whose init is `pid`.
pub fn mount(pid: i32, taken: &TakeOver) -> Result<(), CgroupNsError> {
    let open = |what: &str, dir: bool| {
        sys::open_proc(pid, what, dir)
            .map_err(|(path, source)| CgroupNsError::Proc { path, source })
    };
    let root = open("root", true)?;
    let mnt = open("ns/mnt", false)?;
    let cgroup = open("ns/cgroup", false)?;
    // What is made in the container's tmpfs is the container root's: in a
    // user namespace, an unmapped owner (the host's root) cannot even
    // create there (EOVERFLOW).
    let read_map = |what: &str| {
        let path = PathBuf::from(format!("/proc/{pid}/{what}"));
        std::fs::read_to_string(&path)
            .map(|m| host_id_of_root(&m))
            .map_err(|source| CgroupNsError::Proc { path, source })
    };
    let (uid, gid) = (read_map("uid_map")?, read_map("gid_map")?);
    // setns() changes the calling thread only; this thread ends right after.
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::enter_mount_namespace(mnt.as_fd()).map_err(|source| CgroupNsError::Setns {
                what: "mount",
                source,
            })?;
            sys::enter_cgroup_namespace(cgroup.as_fd()).map_err(|source| CgroupNsError::Setns {
                what: "cgroup",
                source,
            })?;
            sys::set_thread_fs_ids(uid, gid);
            taken
                .destinations
                .iter()
                .try_for_each(|d| mount_below(root.as_fd(), d, &taken.hierarchies))
        })
        .join()
        .unwrap_or(Err(CgroupNsError::Panicked))
    })
}

/// The host id that id 0 of a user namespace maps to (`uid_map` or
/// `gid_map` of one of its processes); 0 when none does.
fn host_id_of_root(map: &str) -> u32 {
    map.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|v| v.parse::<u32>().ok());
            Some((f.next()??, f.next()??, f.next()??))
        })
        .find(|&(inside, _, len)| inside == 0 && len > 0)
        .map_or(0, |(_, outside, _)| outside)
}

fn mount_below(
    root: std::os::fd::BorrowedFd<'_>,
    dest: &Path,
    hierarchies: &[Hierarchy],
) -> Result<(), CgroupNsError> {
    let rel: PathBuf = clean(dest).iter().collect();
    // Resolved as libcontainer resolved it: inside the container's root.
    let dir = sys::openat2(
        root,
        &rel,
        libc::O_PATH | libc::O_DIRECTORY,
        sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|source| CgroupNsError::Lookup {
        dest: dest.to_path_buf(),
        source,
    })?;
    let attrs = sys::MOUNT_ATTR_NOEXEC | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    for h in hierarchies {
        let err = |source| CgroupNsError::Mount {
            dir: h.dir.clone(),
            dest: dest.to_path_buf(),
            source,
        };
        let name = Path::new(&h.dir);
        sys::mkdirat(dir.as_fd(), name, 0o755).map_err(err)?;
        let sub = sys::openat2(
            dir.as_fd(),
            name,
            libc::O_PATH | libc::O_DIRECTORY,
            sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
        )
        .map_err(err)?;
        let fs = sys::new_mount("cgroup", "cgroup", &h.options, attrs).map_err(err)?;
        sys::move_mount_onto(fs.as_fd(), sub.as_fd()).map_err(err)?;
        for link in h.links() {
            sys::symlinkat(Path::new(&h.dir), dir.as_fd(), Path::new(link)).map_err(|source| {
                CgroupNsError::Link {
                    name: link.to_string(),
                    dir: h.dir.clone(),
                    dest: dest.to_path_buf(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxBuilder, LinuxNamespaceBuilder, SpecBuilder};

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
48 31 0:41 / /sys/fs/cgroup/net_cls,net_prio rw,relatime - cgroup cgroup rw,net_cls,net_prio
49 22 0:41 / /srv/elsewhere rw,relatime - cgroup cgroup rw,net_cls,net_prio
50 22 0:42 / /srv/with\\040space rw,relatime - cgroup cgroup rw,pids
";

    fn known() -> Vec<String> {
        subsystems(
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
             cpu\t1\t1\t1\ncpuacct\t2\t1\t1\nmemory\t4\t1\t1\n\
             net_cls\t11\t1\t1\nnet_prio\t11\t1\t1\npids\t8\t1\t1\n",
        )
    }

    fn h(dir: &str, options: &[&str]) -> Hierarchy {
        Hierarchy {
            dir: dir.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    #[test]
    fn hierarchies_below_the_cgroup_root_with_their_controllers() {
        assert_eq!(
            hierarchies(MOUNTINFO, &known()),
            vec![
                h("cpu,cpuacct", &["cpu", "cpuacct"]),
                h("memory", &["memory"]),
                h("systemd", &["name=systemd"]),
                h("net_cls,net_prio", &["net_cls", "net_prio"]),
            ]
        );
    }

    #[test]
    fn only_a_comounted_directory_links_its_controllers() {
        assert_eq!(h("cpu,cpuacct", &[]).links(), vec!["cpu", "cpuacct"]);
        assert!(h("memory", &[]).links().is_empty());
        assert!(h("systemd", &[]).links().is_empty());
    }

    #[test]
    fn root_maps_to_its_host_id() {
        assert_eq!(host_id_of_root("         0          0 4294967295\n"), 0);
        assert_eq!(host_id_of_root("1 200 10\n0 100000 1\n"), 100000);
        assert_eq!(host_id_of_root("1 200 10\n"), 0);
        assert_eq!(host_id_of_root("garbage\n"), 0);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/srv/with\\040space"), "/srv/with space");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("plain"), "plain");
    }

    fn spec(cgroupns: bool) -> Spec {
        let mut nss = vec![LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Mount)
            .build()
            .unwrap()];
        if cgroupns {
            nss.push(
                LinuxNamespaceBuilder::default()
                    .typ(LinuxNamespaceType::Cgroup)
                    .build()
                    .unwrap(),
            );
        }
        let cg = MountBuilder::default()
            .destination("/sys/fs/cgroup")
            .typ("cgroup")
            .source("cgroup")
            .options(vec!["ro".to_string(), "nosuid".to_string()])
            .build()
            .unwrap();
        SpecBuilder::default()
            .mounts(vec![cg])
            .linux(LinuxBuilder::default().namespaces(nss).build().unwrap())
            .build()
            .unwrap()
    }

    #[test]
    fn a_comounted_host_with_a_cgroup_namespace_is_taken_over() {
        let mut s = spec(true);
        let all = hierarchies(MOUNTINFO, &known());
        let t = plan(&mut s, true, all.clone()).unwrap().unwrap();
        assert_eq!(t.destinations, vec![PathBuf::from("/sys/fs/cgroup")]);
        assert_eq!(t.hierarchies, all);
        let m = &s.mounts().as_ref().unwrap()[0];
        assert_eq!(m.typ().as_deref(), Some("tmpfs"));
        assert_eq!(
            m.options().as_ref().unwrap(),
            &TMPFS_OPTIONS
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn libcontainer_keeps_the_mount_otherwise() {
        let plain = vec![h("memory", &["memory"]), h("cpu", &["cpu"])];
        let comounted = hierarchies(MOUNTINFO, &known());
        for (cgroupns, v1, hs) in [
            (false, true, comounted.clone()),
            (true, false, comounted.clone()),
            (true, true, plain),
        ] {
            let mut s = spec(cgroupns);
            let before = s.clone();
            assert_eq!(plan(&mut s, v1, hs).unwrap(), None);
            assert_eq!(s, before);
        }
    }
}
