//! Bind mounts whose source a container's user namespace cannot reach.
//!
//! libcontainer resolves and mounts a bind source from inside the new user
//! namespace, so a source below a directory its root cannot search (a
//! host directory of mode 0700, say) fails the container. runc 1.1 opens
//! such a source outside the namespace and mounts it by descriptor: the
//! container starts, and its workload meets only the source's own modes.
//!
//! `create` does the same ([`take_over`]): it clones each such source as a
//! detached mount tree (`open_tree`, as the host's root, before anything
//! starts) and hands libcontainer a placeholder at the destination (an
//! empty tmpfs for a directory, `/dev/null` for a file), which makes the
//! mount point as the real mount would have. While the init waits for
//! `start` ([`attach`]), a thread in the init's mount namespace detaches
//! the placeholder and attaches the tree there; the fix-up pass then sets
//! the spec's flags and propagation on it as on any mount.
//!
//! A mount is only taken over when nothing the spec mounts or masks lies
//! below its destination (a late mount there would hide it); otherwise it
//! is refused at `create`, naming the mount and the directory in the way.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Mount, MountBuilder, Spec};

use super::fixup::clean;
use super::idmap::IdMapError;
use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(transparent)]
    Refused(#[from] IdMapError),
    #[error("{0}; {1} could not be mounted after it")]
    Hides(IdMapError, String),
    #[error("cannot open {path} to bind mount it at {destination}: {source}")]
    Open {
        path: PathBuf,
        destination: PathBuf,
        source: io::Error,
    },
    #[error("cannot build the placeholder mount at {destination}: {msg}")]
    Spec { destination: PathBuf, msg: String },
    #[error("cannot open {path} of the container's init: {source}")]
    Proc { path: PathBuf, source: io::Error },
    #[error("cannot enter the container's mount namespace: {0}")]
    Setns(io::Error),
    #[error("cannot bind mount {source_path} at {destination} in the container: {what}: {source}")]
    Attach {
        source_path: PathBuf,
        destination: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("the bind mount thread panicked")]
    Panicked,
}

/// One bind mount taken over from libcontainer.
#[derive(Debug)]
pub struct Staged {
    /// The source as the spec names it (for messages).
    pub source: PathBuf,
    pub destination: PathBuf,
    /// The detached clone of the source (recursive for `rbind`).
    tree: OwnedFd,
}

/// The placeholder libcontainer mounts in place of `m`: an empty tmpfs for
/// a directory source, `/dev/null` (which any user reaches) for a file.
fn placeholder(m: &Mount, dir: bool) -> Result<Mount, BindError> {
    let b = MountBuilder::default().destination(m.destination().clone());
    let b = match dir {
        true => b.typ("tmpfs").source("tmpfs").options(
            ["nosuid", "nodev", "noexec", "mode=700", "size=4k"]
                .map(String::from)
                .to_vec(),
        ),
        false => b
            .typ("bind")
            .source("/dev/null")
            .options(vec!["bind".to_string()]),
    };
    b.build().map_err(|e| BindError::Spec {
        destination: m.destination().clone(),
        msg: e.to_string(),
    })
}

/// What the spec mounts or masks at, below or over `dest` after mount
/// `index`: a later mount at, under or above it (one above covers it, as
/// it would under runc, where the tree, attached after the init's mounts,
/// would land on top instead), or a masked or read-only path under it.
fn later_below(spec: &Spec, index: usize, dest: &Path) -> Option<String> {
    let dest = clean(dest);
    let under = |p: &Path| {
        let p = clean(p);
        p.len() >= dest.len() && p.starts_with(&dest)
    };
    let over = |p: &Path| dest.starts_with(&clean(p));
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    for m in mounts.iter().skip(index + 1) {
        if under(m.destination()) {
            return Some(format!(
                "the mount at {} below it",
                m.destination().display()
            ));
        }
        if over(m.destination()) {
            return Some(format!(
                "the mount at {} over it",
                m.destination().display()
            ));
        }
    }
    let linux = spec.linux().as_ref()?;
    let paths = linux
        .masked_paths()
        .iter()
        .flatten()
        .chain(linux.readonly_paths().iter().flatten());
    for p in paths {
        if under(Path::new(p)) {
            return Some(format!("the masked or read-only path {p} below it"));
        }
    }
    None
}

/// Takes over from libcontainer the bind mounts of `spec` whose source the
/// new user namespace's root cannot reach: clones each source and puts a
/// placeholder in its place in `spec`. Refuses one that a later mount or
/// masked path below it would end up hidden by.
pub fn take_over(spec: &mut Spec) -> Result<Vec<Staged>, BindError> {
    let unreachable = super::idmap::unreachable_bind_sources(spec);
    let mut staged = Vec::new();
    for (index, why) in unreachable {
        let Some(m) = spec.mounts().as_ref().and_then(|ms| ms.get(index)).cloned() else {
            continue;
        };
        if let Some(what) = later_below(spec, index, m.destination()) {
            return Err(BindError::Hides(why, what));
        }
        let source = m.source().clone().unwrap_or_default();
        let recursive = m.options().iter().flatten().any(|o| o == "rbind");
        let tree = sys::open_tree_clone(&source, recursive).map_err(|e| BindError::Open {
            path: source.clone(),
            destination: m.destination().clone(),
            source: e,
        })?;
        let dir = nix::sys::stat::fstat(tree.as_raw_fd())
            .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            .map_err(|e| BindError::Open {
                path: source.clone(),
                destination: m.destination().clone(),
                source: e.into(),
            })?;
        let stand_in = placeholder(&m, dir)?;
        if let Some(slot) = spec.mounts_mut().as_mut().and_then(|ms| ms.get_mut(index)) {
            *slot = stand_in;
        }
        tracing::debug!(
            source = %source.display(),
            destination = %m.destination().display(),
            "bind source out of the user namespace's reach: mounted by the runtime"
        );
        staged.push(Staged {
            source,
            destination: m.destination().clone(),
            tree,
        });
    }
    Ok(staged)
}

/// Replaces each placeholder with its tree in the mount namespace of the
/// container whose init is `pid`.
pub fn attach(pid: i32, staged: &[Staged]) -> Result<(), BindError> {
    if staged.is_empty() {
        return Ok(());
    }
    let open = |what: &str, dir: bool| {
        sys::open_proc(pid, what, dir).map_err(|(path, source)| BindError::Proc { path, source })
    };
    let root = open("root", true)?;
    let mnt = open("ns/mnt", false)?;
    // setns() and fchdir() change the calling thread only (its fs context
    // is its own after enter_mount_namespace); this thread ends right after.
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::enter_mount_namespace(mnt.as_fd()).map_err(BindError::Setns)?;
            staged.iter().try_for_each(|b| attach_one(root.as_fd(), b))
        })
        .join()
        .unwrap_or(Err(BindError::Panicked))
    })
}

fn attach_one(root: std::os::fd::BorrowedFd<'_>, b: &Staged) -> Result<(), BindError> {
    let err = |what: &'static str| {
        move |source: io::Error| BindError::Attach {
            source_path: b.source.clone(),
            destination: b.destination.clone(),
            what,
            source,
        }
    };
    let parts = clean(&b.destination);
    let Some((name, parent)) = parts.split_last() else {
        return Err(err("the destination is the root")(io::Error::from(
            io::ErrorKind::InvalidInput,
        )));
    };
    let mut parent: PathBuf = parent.iter().collect();
    if parent.as_os_str().is_empty() {
        parent = PathBuf::from(".");
    }
    // Resolved as libcontainer resolved it: inside the container's root.
    let dir = sys::openat2(
        root,
        &parent,
        libc::O_PATH | libc::O_DIRECTORY,
        sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(err("cannot find its parent"))?;
    sys::fchdir(dir.as_fd()).map_err(err("cannot enter its parent"))?;
    nix::mount::umount2(
        Path::new(name),
        nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
    )
    .map_err(|e| err("cannot detach the placeholder")(e.into()))?;
    let target = sys::openat2(
        dir.as_fd(),
        Path::new(name),
        libc::O_PATH,
        sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS,
    )
    .map_err(err("cannot find the mount point"))?;
    sys::move_mount_onto(b.tree.as_fd(), target.as_fd()).map_err(err("cannot attach"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxBuilder, SpecBuilder};

    fn mount(dest: &str) -> Mount {
        MountBuilder::default()
            .destination(dest)
            .typ("bind")
            .source("/srv/x")
            .options(vec!["rbind".to_string()])
            .build()
            .unwrap()
    }

    fn spec(mounts: &[&str], masked: &[&str]) -> Spec {
        SpecBuilder::default()
            .mounts(mounts.iter().map(|d| mount(d)).collect::<Vec<_>>())
            .linux(
                LinuxBuilder::default()
                    .masked_paths(masked.iter().map(|p| p.to_string()).collect::<Vec<_>>())
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn a_later_mount_or_mask_below_blocks_the_take_over() {
        let s = spec(&["/data", "/data/sub", "/other"], &[]);
        assert_eq!(
            later_below(&s, 0, Path::new("/data")).as_deref(),
            Some("the mount at /data/sub below it")
        );
        // A later mount over it (at a parent) would cover it.
        let s = spec(&["/data/sub", "/data"], &[]);
        assert_eq!(
            later_below(&s, 0, Path::new("/data/sub")).as_deref(),
            Some("the mount at /data over it")
        );
        assert_eq!(later_below(&s, 1, Path::new("/data/sub")), None);
        // A sibling with a common prefix is not below.
        let s = spec(&["/data", "/database"], &[]);
        assert_eq!(later_below(&s, 0, Path::new("/data")), None);
        // The same destination mounted again later hides it too, and so
        // does a mask on it.
        let s = spec(&["/data", "/data/"], &[]);
        assert!(later_below(&s, 0, Path::new("/data")).is_some());
        let s = spec(&["/data"], &["/data"]);
        assert!(later_below(&s, 0, Path::new("/data")).is_some());
        let s = spec(&["/proc/x"], &["/proc/x/y"]);
        assert_eq!(
            later_below(&s, 0, Path::new("/proc/x")).as_deref(),
            Some("the masked or read-only path /proc/x/y below it")
        );
    }

    #[test]
    fn placeholders_are_empty_and_reachable() {
        let m = mount("/data");
        let d = placeholder(&m, true).unwrap();
        assert_eq!(d.typ().as_deref(), Some("tmpfs"));
        assert_eq!(d.destination(), Path::new("/data"));
        let f = placeholder(&m, false).unwrap();
        assert_eq!(f.source().as_deref(), Some(Path::new("/dev/null")));
        assert!(super::super::fixup::is_bind(&f));
    }
}
