//! The jail's root tree, built by the supervisor before the fork: a tmpfs
//! in the supervisor's private mount namespace, with read-only bind mounts
//! of the host files the VMM reads, the symbolic links that lead to them on
//! the host (so the loader and the VMM find them at their usual paths), and
//! device nodes. Sealed read-only before the VMM enters it.

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::mount::{mount, MsFlags};

use super::{Identity, JailError};

/// Symbolic links followed while mirroring one path, as the kernel's
/// limit (`ELOOP`).
const MAX_LINKS: usize = 40;

/// A jail root under construction.
pub struct Tree {
    root: PathBuf,
    /// Host paths already bound, canonical.
    bound: HashSet<PathBuf>,
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> JailError {
    let path = path.to_path_buf();
    move |source| JailError::Io { what, path, source }
}

fn sys(what: &'static str, path: &Path) -> impl FnOnce(nix::errno::Errno) -> JailError {
    let path = path.to_path_buf();
    move |source| JailError::Mount { what, path, source }
}

impl Tree {
    /// Mounts a fresh tmpfs at `root` (made if missing), in the caller's
    /// mount namespace, which must be private (the supervisor's is:
    /// `stage::private_mounts`). No set-id program runs from it; device
    /// nodes are allowed, for the few the VMM opens.
    pub fn create(root: &Path) -> Result<Tree, JailError> {
        std::fs::create_dir_all(root).map_err(io("create jail root", root))?;
        mount(
            Some("agentvm-jail"),
            root,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=256k,nr_inodes=4096"),
        )
        .map_err(sys("mount tmpfs on", root))?;
        Ok(Tree {
            root: root.to_path_buf(),
            bound: HashSet::new(),
        })
    }

    /// Where the absolute path `inside` (as the jailed process names it) is
    /// in the tree.
    fn at(&self, inside: &Path) -> PathBuf {
        let rel: PathBuf = inside
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        self.root.join(rel)
    }

    /// Recreates in the tree the directories and symbolic links that the
    /// host path `host` goes through (the same link targets, so the jailed
    /// process resolves the path as the host does), and returns the host's
    /// canonical path of what it names.
    fn mirror(&self, host: &Path, links: &mut usize) -> Result<PathBuf, JailError> {
        if !host.is_absolute() {
            return Err(JailError::Relative {
                path: host.to_path_buf(),
            });
        }
        let mut cur = PathBuf::from("/");
        for part in host.components() {
            let name = match part {
                Component::Normal(n) => n,
                Component::ParentDir => {
                    cur.pop();
                    continue;
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            };
            let next = cur.join(name);
            let meta = std::fs::symlink_metadata(&next).map_err(io("stat", &next))?;
            if meta.file_type().is_symlink() {
                *links += 1;
                if *links > MAX_LINKS {
                    return Err(JailError::SymlinkLoop {
                        path: host.to_path_buf(),
                    });
                }
                let target = std::fs::read_link(&next).map_err(io("read link", &next))?;
                let here = self.at(&next);
                if std::fs::symlink_metadata(&here).is_err() {
                    std::os::unix::fs::symlink(&target, &here).map_err(io("create link", &here))?;
                }
                let absolute = if target.is_absolute() {
                    target
                } else {
                    cur.join(target)
                };
                cur = self.mirror(&absolute, links)?;
            } else {
                // A final file is left to the bind mount that follows.
                if meta.is_dir() {
                    let here = self.at(&next);
                    if std::fs::symlink_metadata(&here).is_err() {
                        std::fs::create_dir(&here).map_err(io("create directory", &here))?;
                    }
                }
                cur = next;
            }
        }
        Ok(cur)
    }

    /// Makes the host file or directory `host` visible read-only at its own
    /// path in the tree, through the same symbolic links as on the host.
    /// `exec`: whether code in it may be run or mapped executable.
    pub fn bind(&mut self, host: &Path, exec: bool) -> Result<(), JailError> {
        let canonical = self.mirror(host, &mut 0)?;
        if self.bound.contains(&canonical) {
            return Ok(());
        }
        let target = self.at(&canonical);
        self.bind_at(&canonical, &target, exec)?;
        self.bound.insert(canonical);
        Ok(())
    }

    /// Makes the host file `host` visible read-only at `inside`, a path of
    /// the jail's own (`/vm/kernel`), whatever its host path. It must be
    /// readable by others: the jailed process has no other claim to it.
    pub fn bind_as(&mut self, host: &Path, inside: &Path) -> Result<(), JailError> {
        let meta = std::fs::metadata(host).map_err(io("stat", host))?;
        if meta.mode() & 0o004 == 0 {
            return Err(JailError::NotReadable {
                path: host.to_path_buf(),
                mode: meta.mode() & 0o7777,
            });
        }
        let target = self.at(inside);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
        }
        self.bind_at(host, &target, false)
    }

    fn bind_at(&self, host: &Path, target: &Path, exec: bool) -> Result<(), JailError> {
        let meta = std::fs::metadata(host).map_err(io("stat", host))?;
        if meta.is_dir() {
            std::fs::create_dir_all(target).map_err(io("create directory", target))?;
        } else {
            std::fs::File::create(target).map_err(io("create", target))?;
        }
        mount(
            Some(host),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys("bind mount", host))?;
        let mut flags = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV;
        if !exec {
            flags |= MsFlags::MS_NOEXEC;
        }
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
            .map_err(sys("remount read-only", target))
    }

    /// A character device like the host's `host` (same number), at the
    /// same path in the tree, with `mode`, owned by `owner` (else root).
    /// A host without the device gets none in the tree either.
    pub fn device(
        &mut self,
        host: &Path,
        mode: u32,
        owner: Option<Identity>,
    ) -> Result<(), JailError> {
        let meta = match std::fs::metadata(host) {
            Ok(m) if m.file_type().is_char_device() => m,
            _ => return Ok(()),
        };
        let target = self.at(host);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
        }
        nix::sys::stat::mknod(
            &target,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            meta.rdev(),
        )
        .map_err(sys("make device node", &target))?;
        if let Some(id) = owner {
            std::os::unix::fs::chown(&target, Some(id.uid), Some(id.gid))
                .map_err(io("chown", &target))?;
        }
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(io("chmod", &target))
    }

    /// Remounts the tmpfs read-only and returns the root: nothing in the
    /// tree can be changed from inside.
    pub fn seal(self) -> Result<PathBuf, JailError> {
        mount(
            None::<&str>,
            &self.root,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(sys("remount read-only", &self.root))?;
        Ok(self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree whose mirroring is tested without mounting (bind and seal
    /// need root and are exercised by the microvm tests).
    fn unmounted(root: &Path) -> Tree {
        Tree {
            root: root.to_path_buf(),
            bound: HashSet::new(),
        }
    }

    #[test]
    fn mirroring_recreates_the_links_on_the_way() {
        let host = tempfile::tempdir().expect("tempdir");
        let jail = tempfile::tempdir().expect("tempdir");
        let h = host.path();
        // h/lib -> usr/lib, h/usr/lib/libx.so.1 -> libx.so.1.2.3,
        // h/usr/lib64/ld.so -> <absolute>/lib/real-ld.so
        std::fs::create_dir_all(h.join("usr/lib")).unwrap();
        std::fs::create_dir_all(h.join("usr/lib64")).unwrap();
        std::fs::write(h.join("usr/lib/libx.so.1.2.3"), b"x").unwrap();
        std::fs::write(h.join("usr/lib/real-ld.so"), b"ld").unwrap();
        std::os::unix::fs::symlink("usr/lib", h.join("lib")).unwrap();
        std::os::unix::fs::symlink("libx.so.1.2.3", h.join("usr/lib/libx.so.1")).unwrap();
        std::os::unix::fs::symlink(h.join("lib/real-ld.so"), h.join("usr/lib64/ld.so")).unwrap();
        let tree = unmounted(jail.path());
        let canonical = tree.mirror(&h.join("lib/libx.so.1"), &mut 0).unwrap();
        assert_eq!(canonical, h.join("usr/lib/libx.so.1.2.3"));
        let canonical = tree.mirror(&h.join("usr/lib64/ld.so"), &mut 0).unwrap();
        assert_eq!(canonical, h.join("usr/lib/real-ld.so"));
        // The same links exist in the tree; the final files are left to
        // the bind mounts.
        let inside = |p: &Path| tree.at(p);
        assert_eq!(
            std::fs::read_link(inside(&h.join("lib"))).unwrap(),
            PathBuf::from("usr/lib")
        );
        assert_eq!(
            std::fs::read_link(inside(&h.join("usr/lib/libx.so.1"))).unwrap(),
            PathBuf::from("libx.so.1.2.3")
        );
        assert!(inside(&h.join("usr/lib64")).is_dir());
        assert!(!inside(&h.join("usr/lib/libx.so.1.2.3")).exists());
    }

    #[test]
    fn a_link_loop_is_an_error_not_a_hang() {
        let host = tempfile::tempdir().expect("tempdir");
        let jail = tempfile::tempdir().expect("tempdir");
        let h = host.path();
        std::os::unix::fs::symlink(h.join("b"), h.join("a")).unwrap();
        std::os::unix::fs::symlink(h.join("a"), h.join("b")).unwrap();
        let tree = unmounted(jail.path());
        assert!(matches!(
            tree.mirror(&h.join("a"), &mut 0),
            Err(JailError::SymlinkLoop { .. })
        ));
        assert!(matches!(
            tree.mirror(Path::new("relative"), &mut 0),
            Err(JailError::Relative { .. })
        ));
    }
}
