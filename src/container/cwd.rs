//! A missing `process.cwd` is created, as runc does; libcontainer 0.7 only
//! `chdir`s and fails with "failed to unix syscall".
//!
//! libcontainer's init changes directory before it waits for `start`, so
//! the directory must exist before `create`: it is made here, on the host,
//! in whatever the container will see at that path once its mounts are in
//! place — the rootfs, or the source of the bind mount that covers the path.
//! Every path is resolved with `openat2` confined to that directory
//! (`RESOLVE_IN_ROOT` for the rootfs, which is how the path resolves inside
//! the container; `RESOLVE_BENEATH` for a bind source), and new directories
//! are made with `mkdirat` relative to their parent's descriptor, so no
//! symlink, `..` or race can make us create anything outside it.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Mount, Spec};

use super::fixup::{clean, is_bind, option_set};
use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum CwdError {
    #[error("cannot create {what} {cwd}: cannot open {base}: {source}")]
    Base {
        what: &'static str,
        cwd: PathBuf,
        base: PathBuf,
        source: io::Error,
    },
    #[error("cannot create {what} {cwd}: {at}: {source}")]
    Resolve {
        what: &'static str,
        cwd: PathBuf,
        at: PathBuf,
        source: io::Error,
    },
    #[error(
        "process.cwd {cwd} lies inside the {fstype} mounted at {mount}, which starts empty: \
         the directory cannot exist there"
    )]
    InsideFreshMount {
        cwd: PathBuf,
        mount: PathBuf,
        fstype: String,
    },
}

/// Where the cwd has to be made, if anywhere.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// Already there, or ours to leave to libcontainer.
    Nothing,
    /// `rest` under the rootfs, resolved as the container will.
    Rootfs { rest: Vec<OsString> },
    /// `rest` under a writable bind mount's source on the host.
    BindSource {
        source: PathBuf,
        rest: Vec<OsString>,
    },
}

/// Makes `process.cwd` inside the container's future view if it is missing.
pub fn ensure(spec: &Spec, rootfs: &Path) -> Result<(), CwdError> {
    let Some(process) = spec.process() else {
        return Ok(());
    };
    let cwd = process.cwd();
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    let (base, rest, resolve) = match target(cwd, mounts)? {
        Target::Nothing => return Ok(()),
        Target::Rootfs { rest } => (rootfs.to_path_buf(), rest, sys::RESOLVE_IN_ROOT),
        Target::BindSource { source, rest } => (source, rest, sys::RESOLVE_BENEATH),
    };
    let owner = root_owner(spec);
    make_dirs(
        "process.cwd",
        cwd,
        &base,
        &rest,
        resolve | sys::RESOLVE_NO_MAGICLINKS,
        owner,
    )
    .map(drop)
}

/// Makes the mount point `dest` in the rootfs on the host — a directory, or
/// an empty file when `file` — resolved as the container will resolve it,
/// so no symlink or `..` in the image makes us create anything outside it.
/// For a read-only rootfs, whose mount points must exist before it is
/// mounted read-only (runc makes them before its final remount).
pub fn ensure_mount_point(rootfs: &Path, dest: &Path, file: bool) -> Result<(), CwdError> {
    const WHAT: &str = "mount point";
    let mut parts = clean(dest);
    let name = if file { parts.pop() } else { None };
    let resolve = sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS;
    let parent = make_dirs(WHAT, dest, rootfs, &parts, resolve, None)?;
    if let Some(name) = name {
        sys::create_file_at(parent.as_fd(), Path::new(&name), 0o644).map_err(|source| {
            CwdError::Resolve {
                what: WHAT,
                cwd: dest.to_path_buf(),
                at: dest.to_path_buf(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Decides where `cwd` lives once the spec's mounts are in place: the last
/// mount (in order) whose destination contains it is the one on top.
fn target(cwd: &Path, mounts: &[Mount]) -> Result<Target, CwdError> {
    let parts = clean(cwd);
    if parts.is_empty() {
        return Ok(Target::Nothing);
    }
    let covering = mounts
        .iter()
        .enumerate()
        .rfind(|(_, m)| parts.starts_with(&clean(m.destination())));
    let Some((index, mount)) = covering else {
        return Ok(Target::Rootfs { rest: parts });
    };
    let dest = clean(mount.destination());
    let rest = parts[dest.len()..].to_vec();
    if rest.is_empty() {
        // libcontainer makes every mount point.
        return Ok(Target::Nothing);
    }
    if is_bind(mount) {
        let source = mount.source().clone().unwrap_or_default();
        // A read-only bind cannot be written through (runc fails with EROFS
        // too), and a relative source is not ours to guess at.
        if option_set(mount, "ro", "rw") || !source.is_absolute() {
            return Ok(Target::Nothing);
        }
        return Ok(Target::BindSource { source, rest });
    }
    // libcontainer makes the mount points of later mounts: one at or below
    // the cwd makes the cwd too.
    let made_later = mounts[index + 1..]
        .iter()
        .any(|m| clean(m.destination()).starts_with(&parts));
    let fstype = mount.typ().clone().unwrap_or_default();
    if fstype == "tmpfs" && dest != clean(Path::new("/dev")) && !made_later {
        return Err(CwdError::InsideFreshMount {
            cwd: cwd.to_path_buf(),
            mount: mount.destination().clone(),
            fstype,
        });
    }
    // proc, sysfs, devpts and the like: the path may well exist there.
    Ok(Target::Nothing)
}

/// The host uid and gid of the container's root when it gets a new user
/// namespace: runc creates the cwd as that user.
fn root_owner(spec: &Spec) -> Option<(u32, u32)> {
    let linux = spec.linux().as_ref()?;
    let new_userns = linux
        .namespaces()
        .as_ref()?
        .iter()
        .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none());
    if !new_userns {
        return None;
    }
    let host_of = |maps: &Option<Vec<oci_spec::runtime::LinuxIdMapping>>| {
        maps.as_ref()?
            .iter()
            .find(|m| m.container_id() == 0 && m.size() > 0)
            .map(|m| m.host_id())
    };
    Some((
        host_of(linux.uid_mappings())?,
        host_of(linux.gid_mappings())?,
    ))
}

fn make_dirs(
    what: &'static str,
    cwd: &Path,
    base: &Path,
    rest: &[OsString],
    resolve: u64,
    owner: Option<(u32, u32)>,
) -> Result<OwnedFd, CwdError> {
    let base_fd = sys::open_dir_path(base).map_err(|source| CwdError::Base {
        what,
        cwd: cwd.to_path_buf(),
        base: base.to_path_buf(),
        source,
    })?;
    let resolve_err = |upto: usize, source: io::Error| CwdError::Resolve {
        what,
        cwd: cwd.to_path_buf(),
        at: rest[..upto].iter().collect::<PathBuf>(),
        source,
    };
    // The longest prefix that exists, resolved as the container would.
    let mut dir: OwnedFd = base_fd.try_clone().map_err(|e| resolve_err(0, e))?;
    let mut existing = 0;
    while existing < rest.len() {
        let prefix: PathBuf = rest[..=existing].iter().collect();
        match sys::openat2(base_fd.as_fd(), &prefix, dir_flags(), resolve) {
            Ok(fd) => {
                dir = fd;
                existing += 1;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(resolve_err(existing + 1, e)),
        }
    }
    // Everything below is new: plain directories, made one by one under the
    // descriptor of their parent and opened without following anything.
    for (i, name) in rest.iter().enumerate().skip(existing) {
        let name = Path::new(name);
        match sys::mkdirat(dir.as_fd(), name, 0o755) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(resolve_err(i + 1, e)),
        }
        let fd = sys::openat2(
            dir.as_fd(),
            name,
            dir_flags() | libc::O_NOFOLLOW,
            sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|e| resolve_err(i + 1, e))?;
        if let Some((uid, gid)) = owner {
            sys::fchown_fd(fd.as_fd(), uid, gid).map_err(|e| resolve_err(i + 1, e))?;
        }
        dir = fd;
    }
    if existing < rest.len() {
        tracing::debug!("created {what} {} under {}", cwd.display(), base.display());
    }
    Ok(dir)
}

fn dir_flags() -> i32 {
    libc::O_PATH | libc::O_DIRECTORY
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, MetadataExt};

    use oci_spec::runtime::{MountBuilder, ProcessBuilder, SpecBuilder};

    use super::*;

    fn spec(cwd: &str, mounts: Vec<Mount>) -> Spec {
        SpecBuilder::default()
            .process(ProcessBuilder::default().cwd(cwd).build().unwrap())
            .mounts(mounts)
            .build()
            .unwrap()
    }

    fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Mount {
        MountBuilder::default()
            .destination(dest)
            .typ(typ)
            .source(source)
            .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .build()
            .unwrap()
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        rootfs: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path().join("rootfs");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        Fixture {
            _tmp: tmp,
            rootfs,
            outside,
        }
    }

    #[test]
    fn creates_missing_directories_in_the_rootfs() {
        let f = fixture();
        ensure(&spec("/oci/new/cwd", vec![]), &f.rootfs).unwrap();
        assert!(f.rootfs.join("oci/new/cwd").is_dir());
        // Existing: nothing to do, no error.
        ensure(&spec("/oci/new/cwd", vec![]), &f.rootfs).unwrap();
    }

    #[test]
    fn dotdot_never_climbs_out_of_the_rootfs() {
        let f = fixture();
        ensure(&spec("/../../outside/x", vec![]), &f.rootfs).unwrap();
        assert!(f.rootfs.join("outside/x").is_dir());
        assert!(!f.outside.join("x").exists());
    }

    #[test]
    fn absolute_symlink_to_the_host_creates_nothing_on_the_host() {
        let f = fixture();
        // rootfs/link -> <host path of outside>: inside the container that
        // path does not exist, so the cwd cannot be made through it.
        symlink(&f.outside, f.rootfs.join("link")).unwrap();
        let err = ensure(&spec("/link/new", vec![]), &f.rootfs).unwrap_err();
        assert!(matches!(err, CwdError::Resolve { .. }), "{err}");
        assert!(!f.outside.join("new").exists());
        assert_eq!(std::fs::read_dir(&f.outside).unwrap().count(), 0);
    }

    #[test]
    fn absolute_symlink_resolves_inside_the_rootfs() {
        let f = fixture();
        // The same host path, made inside the rootfs: the link leads there.
        let inside = f.rootfs.join(f.outside.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        symlink(&f.outside, f.rootfs.join("link")).unwrap();
        ensure(&spec("/link/new", vec![]), &f.rootfs).unwrap();
        assert!(inside.join("new").is_dir());
        assert!(!f.outside.join("new").exists());
    }

    #[test]
    fn relative_symlink_escape_is_clamped_to_the_rootfs() {
        let f = fixture();
        let up = "../".repeat(f.rootfs.components().count() + 2);
        symlink(format!("{up}outside"), f.rootfs.join("up")).unwrap();
        std::fs::create_dir_all(f.rootfs.join("outside")).unwrap();
        ensure(&spec("/up/new", vec![]), &f.rootfs).unwrap();
        assert!(f.rootfs.join("outside/new").is_dir());
        assert!(!f.outside.join("new").exists());
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let f = fixture();
        std::fs::write(f.rootfs.join("file"), "x").unwrap();
        let err = ensure(&spec("/file/sub", vec![]), &f.rootfs).unwrap_err();
        assert!(err.to_string().contains("process.cwd /file/sub"), "{err}");
    }

    #[test]
    fn dangling_symlink_in_the_way_is_an_error() {
        let f = fixture();
        symlink("/nowhere", f.rootfs.join("dangling")).unwrap();
        assert!(ensure(&spec("/dangling/sub", vec![]), &f.rootfs).is_err());
        assert!(!f.rootfs.join("nowhere").exists());
    }

    #[test]
    fn bind_mounted_cwd_is_made_in_the_source() {
        let f = fixture();
        let src = f.outside.to_str().unwrap();
        let m = mount("/data", "bind", src, &["rbind", "rw"]);
        ensure(&spec("/data/work/dir", vec![m]), &f.rootfs).unwrap();
        assert!(f.outside.join("work/dir").is_dir());
        assert!(!f.rootfs.join("data/work").exists());
    }

    #[test]
    fn bind_source_symlinks_cannot_leave_the_source() {
        let f = fixture();
        let src = f.outside.join("src");
        std::fs::create_dir_all(&src).unwrap();
        symlink("..", src.join("up")).unwrap();
        let m = mount("/data", "bind", src.to_str().unwrap(), &["rbind"]);
        assert!(ensure(&spec("/data/up/escaped", vec![m]), &f.rootfs).is_err());
        assert!(!f.outside.join("escaped").exists());
    }

    #[test]
    fn read_only_bind_is_left_alone() {
        let f = fixture();
        let m = mount(
            "/data",
            "bind",
            f.outside.to_str().unwrap(),
            &["rbind", "ro"],
        );
        ensure(&spec("/data/work", vec![m]), &f.rootfs).unwrap();
        assert!(!f.outside.join("work").exists());
        assert!(!f.rootfs.join("data").exists());
    }

    #[test]
    fn inside_a_fresh_tmpfs_is_refused_with_a_clear_error() {
        let f = fixture();
        let m = mount("/scratch", "tmpfs", "tmpfs", &[]);
        let err = ensure(&spec("/scratch/work", vec![m]), &f.rootfs).unwrap_err();
        assert!(matches!(err, CwdError::InsideFreshMount { .. }), "{err}");
        // A later mount below the cwd makes the directory itself.
        let t = mount("/scratch", "tmpfs", "tmpfs", &[]);
        let b = mount("/scratch/work/in", "bind", "/tmp", &["rbind"]);
        ensure(&spec("/scratch/work", vec![t, b]), &f.rootfs).unwrap();
    }

    #[test]
    fn later_mounts_decide_what_covers_the_cwd() {
        let t = mount("/data", "tmpfs", "tmpfs", &[]);
        let b = mount("/data", "bind", "/srv", &["rbind"]);
        let got = target(Path::new("/data/x"), &[t.clone(), b.clone()]).unwrap();
        assert_eq!(
            got,
            Target::BindSource {
                source: "/srv".into(),
                rest: vec!["x".into()]
            }
        );
        assert!(target(Path::new("/data/x"), &[b, t]).is_err());
        let proc_mount = mount("/proc", "proc", "proc", &[]);
        assert_eq!(
            target(Path::new("/proc/sys"), &[proc_mount]).unwrap(),
            Target::Nothing
        );
        assert_eq!(target(Path::new("/"), &[]).unwrap(), Target::Nothing);
    }

    #[test]
    fn new_directories_belong_to_the_containers_root_in_a_user_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: chown to a mapped uid needs root");
            return;
        }
        let f = fixture();
        let mut s = spec("/home/new", vec![]);
        let json = serde_json::json!({
            "namespaces": [{"type": "user"}, {"type": "mount"}],
            "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
        });
        s.set_linux(Some(serde_json::from_value(json).unwrap()));
        std::fs::create_dir(f.rootfs.join("home")).unwrap();
        ensure(&s, &f.rootfs).unwrap();
        let meta = std::fs::metadata(f.rootfs.join("home/new")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (100000, 200000));
        // The directory that existed keeps its owner.
        assert_eq!(std::fs::metadata(f.rootfs.join("home")).unwrap().uid(), 0);
    }
}
