//! cgroup behaviour of runc that libcontainer 0.7 leaves out.
//!
//! - `linux.resources.memory.disableOOMKiller`: libcontainer always hands
//!   its cgroup manager `disable_oom_killer: false`, so the v1 memory
//!   controller writes `0` to `memory.oom_control`. runc writes `1` there
//!   when the spec asks for it (and nothing on cgroup v2, which has no such
//!   switch), at create and again at every `update`.
//! - `exec --cgroup [<controller>:]<path>` (runc 1.1): the exec'd process
//!   goes into an existing sub-cgroup of the container's, of every
//!   hierarchy or of the controllers named. libcontainer 0.7 takes one path
//!   for all hierarchies and makes it when it is missing; runc refuses a
//!   missing one. agentvm opens the `cgroup.procs` of each target before the
//!   process is started (so a missing or escaping path fails the exec with
//!   nothing started) and the process writes itself there right before its
//!   `execve` (see [`JoinCgroups`]).
//! - `delete` removes the cgroups the workload made below the container's
//!   (runc removes the whole tree); libcontainer's manager only `rmdir`s the
//!   container's own, which fails while it has children.
//! - `create` into a cgroup that already holds processes warns as runc 1.1
//!   does (it still creates the container); one that is frozen fails
//!   `create` with runc's error instead of leaving its init frozen (and the
//!   command hanging).
//! - Without `linux.cgroupsPath` runc 1.1 (cgroupfs driver) names the
//!   cgroup after the container, below its caller's own cgroup: on v1 in
//!   each hierarchy below the caller's cgroup of that hierarchy, on v2
//!   below the parent of the caller's. libcontainer names it `:youki:ID`
//!   at the top; `create` hands it runc's path instead ([`default_path`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libcontainer::container::Container;
use oci_spec::runtime::Spec;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("invalid --cgroup argument: {0}")]
    SubCgroupArg(String),
    #[error("invalid --cgroup argument: {0} (missing <controller>: prefix)")]
    SubCgroupPrefix(String),
    #[error("unknown controller {0} in --cgroup")]
    UnknownController(String),
    #[error("{0} is not a sub cgroup path")]
    NotSub(String),
    #[error("cannot read the cgroups of the container's init ({path}): {source}")]
    Init { path: PathBuf, source: io::Error },
    #[error("cannot find where the cgroup hierarchy of {0} is mounted")]
    NoMount(String),
    #[error("container's cgroup unexpectedly frozen")]
    Frozen,
    #[error("cannot join cgroup {path}: {source}")]
    Join { path: PathBuf, source: io::Error },
    /// runc's words (`cgroups.ErrV1NoUnified`).
    #[error("invalid configuration: cannot use unified on cgroup v1")]
    UnifiedOnV1,
    #[error("cannot tell the host's cgroup version: {0}")]
    Setup(String),
}

/// Refuses `linux.resources.unified` (even an empty one) unless
/// `/sys/fs/cgroup` is the unified hierarchy, as runc 1.1's validator does:
/// a hybrid host's `/sys/fs/cgroup/unified` holds no controllers, so the
/// settings could not be applied there.
pub fn refuse_unified_on_v1(spec: &Spec) -> Result<(), CgroupError> {
    let asked = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .is_some_and(|r| r.unified().is_some());
    if !asked {
        return Ok(());
    }
    match libcgroups::common::get_cgroup_setup() {
        Ok(libcgroups::common::CgroupSetup::Unified) => Ok(()),
        Ok(_) => Err(CgroupError::UnifiedOnV1),
        Err(e) => Err(CgroupError::Setup(e.to_string())),
    }
}

/// Whether this host's cgroups are v1 (legacy or hybrid): libcontainer
/// then mounts a `cgroup` mount hierarchy by hierarchy.
pub fn v1_host() -> bool {
    matches!(
        libcgroups::common::get_cgroup_setup(),
        Ok(libcgroups::common::CgroupSetup::Legacy | libcgroups::common::CgroupSetup::Hybrid)
    )
}

/// v1's switch of the OOM killer.
const OOM_CONTROL: &str = "memory.oom_control";

/// Whether the spec asks for the OOM killer to be disabled.
pub fn oom_killer_disabled(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.disable_oom_killer())
        .unwrap_or(false)
}

/// Disables the OOM killer of the container's v1 memory cgroup when the spec
/// asks for it, as runc does. On a host without a v1 memory hierarchy
/// nothing is written (runc ignores the setting on cgroup v2).
pub fn apply_oom_killer(container: &Container, spec: &Spec) -> Result<(), CgroupError> {
    if !oom_killer_disabled(spec) {
        return Ok(());
    }
    let Some(dir) = super::cgroup_dir(container, "memory") else {
        return Ok(());
    };
    let path = dir.join(OOM_CONTROL);
    if !path.exists() {
        // The unified hierarchy: no oom_control.
        return Ok(());
    }
    std::fs::write(&path, "1").map_err(|source| CgroupError::Write { path, source })
}

/// Whether the container's v1 memory cgroup has its OOM killer disabled
/// now; `update` passes this on, so that it keeps what `create` set (runc
/// rewrites the setting from the container's config at every update).
pub fn oom_killer_is_disabled(container: &Container) -> bool {
    super::cgroup_dir(container, "memory")
        .and_then(|dir| std::fs::read_to_string(dir.join(OOM_CONTROL)).ok())
        .is_some_and(|text| text.lines().any(|l| l.trim() == "oom_kill_disable 1"))
}

/// `exec --cgroup` values as runc 1.1 reads them: controller (`""` for
/// every hierarchy) to the sub-cgroup's path.
pub fn parse_sub_cgroups(args: &[String]) -> Result<BTreeMap<String, String>, CgroupError> {
    let mut paths = BTreeMap::new();
    for arg in args {
        let parts: Vec<&str> = arg.splitn(3, ':').collect();
        match parts.as_slice() {
            [path] if args.len() == 1 => {
                paths.insert(String::new(), (*path).to_string());
            }
            [_] => return Err(CgroupError::SubCgroupPrefix(arg.clone())),
            [controllers, path] => {
                for c in controllers.split(',') {
                    paths.insert(c.to_string(), (*path).to_string());
                }
            }
            _ => return Err(CgroupError::SubCgroupArg(arg.clone())),
        }
    }
    Ok(paths)
}

/// One hierarchy the container's init is in, as `/proc/PID/cgroup` names
/// it: its controllers (empty for the unified one) and the path in it.
#[derive(Debug, PartialEq, Eq)]
struct Membership {
    controllers: Vec<String>,
    path: String,
}

fn memberships(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            let controllers = ctrls
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some(Membership {
                controllers,
                path: path.to_string(),
            })
        })
        .collect()
}

/// runc's cgroup for container `id` when the spec names none (cgroupfs
/// driver): see [`default_path_in`], from our own `/proc/self/cgroup`.
/// The container's cgroup: the spec's `cgroupsPath`, or runc's default
/// path, which is then written into the spec for libcontainer to use.
pub fn resolve_path(spec: &mut Spec, id: &str) -> PathBuf {
    if let Some(p) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) {
        return p;
    }
    let p = default_path(id);
    if let Some(linux) = spec.linux_mut() {
        linux.set_cgroups_path(Some(p.clone()));
    }
    p
}

pub fn default_path(id: &str) -> PathBuf {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    default_path_in(&own, id)
}

/// runc's default path given the caller's `/proc/self/cgroup`: `id` below
/// the caller's cgroup of the v1 hierarchies (libcgroups takes one path
/// for all of them, so when the caller's differ between hierarchies,
/// which runc follows one by one, `/ID`), or on a v2-only host below the
/// parent of the caller's (runc's fs2: the caller's own holds processes).
pub fn default_path_in(own: &str, id: &str) -> PathBuf {
    let all = memberships(own);
    let v1: Vec<&Membership> = all
        .iter()
        .filter(|m| {
            !m.controllers.is_empty() && !m.controllers.iter().any(|c| c.starts_with("name="))
        })
        .collect();
    let base = match v1.first() {
        Some(first) if v1.iter().all(|m| m.path == first.path) => PathBuf::from(&first.path),
        Some(_) => PathBuf::from("/"),
        None => all
            .iter()
            .find(|m| m.controllers.is_empty())
            .and_then(|m| Path::new(&m.path).parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("/")),
    };
    Path::new("/")
        .join(base.strip_prefix("/").unwrap_or(&base))
        .join(id)
}

/// `base` joined with `sub` as a cgroup path (a leading `/` of `sub` does
/// not make it absolute), refused when it leaves `base`.
fn sub_path(base: &str, sub: &str) -> Result<PathBuf, CgroupError> {
    let mut out = PathBuf::from(base);
    let floor = out.components().count();
    for c in Path::new(sub).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir if out.components().count() > floor => {
                out.pop();
            }
            Component::ParentDir => return Err(CgroupError::NotSub(sub.to_string())),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

/// Where the hierarchy with these controllers (none: the unified one) is
/// mounted, from a `/proc/self/mountinfo` text.
fn mount_of(mountinfo: &str, controllers: &[String]) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let target = pre.split(' ').nth(4)?;
        let mut post = post.split(' ');
        let fstype = post.next()?;
        let opts: Vec<&str> = post.nth(1).unwrap_or("").split(',').collect();
        let hit = match controllers {
            [] => fstype == "cgroup2",
            _ => fstype == "cgroup" && controllers.iter().all(|c| opts.contains(&c.as_str())),
        };
        hit.then(|| PathBuf::from(target))
    })
}

/// The `cgroup.procs` files an `exec --cgroup` process joins, opened: for
/// each hierarchy of the container's init (in `cgroup_path`) that the
/// request names, the sub-cgroup's. Hierarchies not named keep the process
/// where libcontainer put it, in the container's own cgroup.
pub fn open_sub_cgroups(
    init_pid: i32,
    cgroup_path: &Path,
    paths: &BTreeMap<String, String>,
) -> Result<JoinCgroups, CgroupError> {
    let proc_file = PathBuf::from(format!("/proc/{init_pid}/cgroup"));
    let text = std::fs::read_to_string(&proc_file).map_err(|source| CgroupError::Init {
        path: proc_file,
        source,
    })?;
    let base = cgroup_path.to_string_lossy();
    let own: Vec<Membership> = memberships(&text)
        .into_iter()
        .filter(|m| m.path == base)
        .collect();
    for c in paths.keys().filter(|c| !c.is_empty()) {
        if !own.iter().any(|m| m.controllers.contains(c)) {
            return Err(CgroupError::UnknownController(c.clone()));
        }
    }
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Init {
            path: "/proc/self/mountinfo".into(),
            source,
        })?;
    let mut files = Vec::new();
    for m in &own {
        let sub = match paths.get("") {
            Some(sub) => sub,
            None => match m.controllers.iter().find_map(|c| paths.get(c)) {
                Some(sub) => sub,
                None => continue,
            },
        };
        let rel = sub_path(&m.path, sub)?;
        let mount = mount_of(&mountinfo, &m.controllers)
            .ok_or_else(|| CgroupError::NoMount(m.controllers.join(",")))?;
        let path = mount
            .join(rel.strip_prefix("/").unwrap_or(&rel))
            .join("cgroup.procs");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| CgroupError::Join { path, source })?;
        files.push(OwnedFd::from(file));
    }
    Ok(JoinCgroups(Arc::new(files)))
}

/// `cgroup.procs` files of sub-cgroups, opened by agentvm; the exec'd
/// process writes `0` (itself) to each right before its `execve`. The
/// kernel checks such a write against the credentials the file was opened
/// with, so the process's own dropped privileges do not matter.
#[derive(Clone, Default)]
pub struct JoinCgroups(Arc<Vec<OwnedFd>>);

impl JoinCgroups {
    pub fn join(&self) -> io::Result<()> {
        for fd in self.0.iter() {
            let mut file = std::fs::File::from(fd.try_clone()?);
            file.write_all(b"0")?;
        }
        Ok(())
    }
}

/// Removes every cgroup below the container's (`cgroup_path`, as
/// libcontainer resolved it) in every hierarchy, deepest first, so that the
/// container's own can go. Their processes must be gone already (`delete`
/// kills the whole tree first); a cgroup whose last task is still being
/// reaped is retried for up to `wait`. Returns the cgroups that stayed.
pub fn remove_children(cgroup_path: &Path, wait: Duration) -> Vec<(PathBuf, io::Error)> {
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    if rel.as_os_str().is_empty() || !cgroup_path.is_absolute() {
        // A root cgroup (never the container's) or a systemd unit name.
        return Vec::new();
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut left = Vec::new();
    for mount in cgroup_mounts(&mountinfo) {
        let top = mount.join(rel);
        let mut below = Vec::new();
        subdirs(&top, &mut below);
        // Children come after their parent in `below`: remove from the end.
        for dir in below.into_iter().rev() {
            if let Err(e) = rmdir_retrying(&dir, wait) {
                left.push((dir, e));
            }
        }
    }
    left
}

/// The processes already in the cgroup at `cgroup_path` and below, counted
/// as runc counts them: in the v1 devices hierarchy, else the unified one.
pub fn populated(cgroup_path: &Path) -> usize {
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    if rel.as_os_str().is_empty() || !cgroup_path.is_absolute() {
        return 0;
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let Some(mount) =
        mount_of(&mountinfo, &["devices".to_string()]).or_else(|| mount_of(&mountinfo, &[]))
    else {
        return 0;
    };
    let top = mount.join(rel);
    let mut dirs = vec![top.clone()];
    subdirs(&top, &mut dirs);
    dirs.iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
        .sum()
}

/// runc 1.1's warning for a container created into a cgroup that already
/// holds processes (runc adds a deprecation notice of its own 1.2).
pub fn warn_if_populated(cgroup_path: &Path) {
    let n = populated(cgroup_path);
    if n > 0 {
        tracing::warn!("container's cgroup is not empty: {n} process(es) found");
    }
}

/// Refuses a cgroup that exists frozen (v1 `freezer.state` FROZEN or
/// FREEZING, v2 `cgroup.freeze` 1): a container's init put there would
/// stop before it runs, as runc 1.1 checks too.
pub fn refuse_frozen(cgroup_path: &Path) -> Result<(), CgroupError> {
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    if rel.as_os_str().is_empty() || !cgroup_path.is_absolute() {
        return Ok(());
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(());
    };
    let v1 = mount_of(&mountinfo, &["freezer".to_string()])
        .and_then(|m| std::fs::read_to_string(m.join(rel).join("freezer.state")).ok())
        .is_some_and(|s| s.trim() != "THAWED");
    let v2 = mount_of(&mountinfo, &[])
        .and_then(|m| std::fs::read_to_string(m.join(rel).join("cgroup.freeze")).ok())
        .is_some_and(|s| s.trim() == "1");
    if v1 || v2 {
        return Err(CgroupError::Frozen);
    }
    Ok(())
}

/// Every cgroup mount point (v1 hierarchies and the unified one).
fn cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let target = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(target))
        })
        .collect()
}

/// The directories below `dir`, each after its parent.
fn subdirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let p = e.path();
            out.push(p.clone());
            subdirs(&p, out);
        }
    }
}

fn rmdir_retrying(dir: &Path, wait: Duration) -> io::Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unified_refused_unless_the_host_is_cgroup_v2() {
        use super::{refuse_unified_on_v1, CgroupError};
        let spec = |resources: serde_json::Value| -> oci_spec::runtime::Spec {
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "linux": {"resources": resources}
            }))
            .expect("spec")
        };
        assert!(refuse_unified_on_v1(&spec(serde_json::json!({}))).is_ok());
        let v2 = matches!(
            libcgroups::common::get_cgroup_setup(),
            Ok(libcgroups::common::CgroupSetup::Unified)
        );
        for unified in [serde_json::json!({}), serde_json::json!({"pids.max": "10"})] {
            let got = refuse_unified_on_v1(&spec(serde_json::json!({"unified": unified})));
            match v2 {
                true => assert!(got.is_ok()),
                false => assert!(matches!(got, Err(CgroupError::UnifiedOnV1))),
            }
        }
    }

    #[test]
    fn runc_default_path() {
        use super::default_path_in;
        use std::path::Path;
        let root = "3:cpu,cpuacct:/\n2:memory:/\n1:name=systemd:/x\n0::/\n";
        assert_eq!(default_path_in(root, "c"), Path::new("/c"));
        let nested = "3:cpu,cpuacct:/a/b\n2:memory:/a/b\n1:name=systemd:/\n0::/\n";
        assert_eq!(default_path_in(nested, "c"), Path::new("/a/b/c"));
        let mixed = "3:cpu:/\n2:memory:/m/n\n0::/\n";
        assert_eq!(default_path_in(mixed, "c"), Path::new("/c"));
        let v2 = "0::/user.slice/session-1.scope\n";
        assert_eq!(default_path_in(v2, "c"), Path::new("/user.slice/c"));
        assert_eq!(default_path_in("0::/\n", "c"), Path::new("/c"));
    }

    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn sub_cgroup_arguments_as_runc_reads_them() {
        let p = parse_sub_cgroups(&args(&["sub"])).unwrap();
        assert_eq!(p.get(""), Some(&"sub".to_string()));
        let p = parse_sub_cgroups(&args(&["memory,pids:a", "cpu:/b"])).unwrap();
        assert_eq!(p.get("memory"), Some(&"a".to_string()));
        assert_eq!(p.get("pids"), Some(&"a".to_string()));
        assert_eq!(p.get("cpu"), Some(&"/b".to_string()));
        assert!(matches!(
            parse_sub_cgroups(&args(&["a:b:c"])),
            Err(CgroupError::SubCgroupArg(_))
        ));
        assert!(matches!(
            parse_sub_cgroups(&args(&["sub", "sub2"])),
            Err(CgroupError::SubCgroupPrefix(_))
        ));
    }

    #[test]
    fn sub_paths_stay_below_the_container() {
        assert_eq!(sub_path("/a/b", "sub").unwrap(), PathBuf::from("/a/b/sub"));
        assert_eq!(sub_path("/a/b", "/sub").unwrap(), PathBuf::from("/a/b/sub"));
        assert_eq!(sub_path("/a/b", "x/../y").unwrap(), PathBuf::from("/a/b/y"));
        assert!(sub_path("/a/b", "../../x").is_err());
        assert!(sub_path("/a/b", "x/../../y").is_err());
    }

    #[test]
    fn children_are_removed_deepest_first() {
        let tmp = std::env::temp_dir().join(format!("agentvm-cg-test-{}", std::process::id()));
        let deep = tmp.join("a/b/c");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(tmp.join("d")).unwrap();
        let mut below = Vec::new();
        subdirs(&tmp, &mut below);
        assert_eq!(below.len(), 4);
        for dir in below.into_iter().rev() {
            rmdir_retrying(&dir, Duration::ZERO).unwrap();
        }
        assert!(std::fs::read_dir(&tmp).unwrap().next().is_none());
        std::fs::remove_dir(&tmp).unwrap();
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                  32 25 0:28 / /tmp rw - tmpfs tmpfs rw\n";
        assert_eq!(
            cgroup_mounts(mi),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
        assert!(remove_children(Path::new("/"), Duration::ZERO).is_empty());
    }

    #[test]
    fn memberships_and_mounts() {
        let m = memberships("4:memory:/t/c\n9:name=systemd:/t/c\n1:cpu,cpuacct:/x\n0::/\n");
        assert_eq!(m.len(), 4);
        assert_eq!(m[2].controllers, vec!["cpu", "cpuacct"]);
        assert!(m[3].controllers.is_empty());
        let mi =
            "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            mount_of(mi, &["memory".to_string()]),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            mount_of(mi, &[]),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(mount_of(mi, &["pids".to_string()]), None);
    }

    fn spec(memory: serde_json::Value) -> Spec {
        let mut v = serde_json::to_value(Spec::default()).expect("default spec as JSON");
        v["linux"]["resources"]["memory"] = memory;
        serde_json::from_value(v).expect("spec from JSON")
    }

    #[test]
    fn oom_killer_disabled_only_when_asked() {
        assert!(oom_killer_disabled(&spec(
            serde_json::json!({"disableOOMKiller": true})
        )));
        assert!(!oom_killer_disabled(&spec(
            serde_json::json!({"disableOOMKiller": false})
        )));
        assert!(!oom_killer_disabled(&spec(
            serde_json::json!({"limit": 1048576})
        )));
        assert!(!oom_killer_disabled(&Spec::default()));
    }
}
