//! Bind mounts checked on the host before either tier starts anything,
//! with runc 1.1's words for the two mistakes users make most: a source
//! that does not exist, and a file bound onto a directory (or a directory
//! onto a file).
//!
//! libcontainer reports both from inside the container's init as "failed
//! to prepare rootfs", naming neither the mount nor the cause, and in the
//! microvm tier the guest would report it with its own paths. runc says
//! `error mounting "SRC" to rootfs at "DEST": stat SRC: no such file or
//! directory` and `...: mount SRC:DEST: not a directory`; Docker reads the
//! latter to add its hint ("Are you trying to mount a directory onto a
//! file (or vice-versa)?").
//!
//! Only what can be known before anything is mounted is checked: a
//! destination below an earlier mount's is left to the mount itself (that
//! mount may make or hide it).

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use oci_spec::runtime::{Mount, Spec};

use super::fixup::{clean, is_bind};
use super::sys;

#[derive(Debug, thiserror::Error)]
#[error("error mounting {from:?} to rootfs at {to:?}: {reason}")]
pub struct BindCheckError {
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// Checks each bind mount of `spec` whose source is an absolute path
/// against the host and the container's root filesystem `rootfs`.
pub fn check(spec: &Spec, rootfs: &Path) -> Result<(), BindCheckError> {
    let mounts = spec.mounts().as_deref().unwrap_or_default();
    // The root as a directory to resolve destinations in; without it the
    // create fails on its own, with its own error.
    let Ok(root) = sys::open_dir_path(rootfs) else {
        return Ok(());
    };
    for (i, m) in mounts.iter().enumerate() {
        let Some(source) = m
            .source()
            .as_deref()
            .filter(|s| is_bind(m) && s.is_absolute())
        else {
            continue;
        };
        let error = |reason: String| BindCheckError {
            from: source.display().to_string(),
            to: m.destination().display().to_string(),
            reason,
        };
        let source_is_dir = match std::fs::metadata(source) {
            Ok(meta) => meta.is_dir(),
            Err(e) => {
                return Err(error(format!(
                    "stat {}: {}",
                    source.display(),
                    super::hooks::go_errno(e)
                )))
            }
        };
        if below_earlier(&mounts[..i], m) {
            continue;
        }
        let relative = m.destination().strip_prefix("/").unwrap_or(m.destination());
        if relative.as_os_str().is_empty() {
            continue;
        }
        // Resolved as the container will see it: symlinks in the rootfs
        // stay inside it.
        let Ok(dest) = sys::openat2(
            root.as_fd(),
            relative,
            libc::O_PATH,
            sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS,
        ) else {
            // Missing: made at mount time as the source's kind.
            continue;
        };
        let dest_is_dir = nix::sys::stat::fstat(dest.as_raw_fd())
            .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            .unwrap_or(source_is_dir);
        if dest_is_dir != source_is_dir {
            return Err(error(format!(
                "mount {}:{}: not a directory",
                source.display(),
                m.destination().display()
            )));
        }
    }
    Ok(())
}

/// Whether an earlier mount's destination is `m`'s or one of its parents.
fn below_earlier(earlier: &[Mount], m: &Mount) -> bool {
    let dest = clean(m.destination());
    earlier
        .iter()
        .any(|e| dest.starts_with(&clean(e.destination())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mounts: serde_json::Value) -> Spec {
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "root": {"path": "rootfs"},
            "mounts": mounts,
        }))
        .unwrap()
    }

    #[test]
    fn bind_mistakes_are_named_in_runc_s_words() {
        let host = tempfile::tempdir().unwrap();
        let rootfs = host.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc/dir")).unwrap();
        std::fs::write(rootfs.join("etc/file"), "").unwrap();
        std::os::unix::fs::symlink("/etc/dir", rootfs.join("link")).unwrap();
        let file = host.path().join("file");
        std::fs::write(&file, "").unwrap();
        let dir = host.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let (file, dir) = (file.display().to_string(), dir.display().to_string());
        let bind = |src: &str, dest: &str| serde_json::json!({"destination": dest, "source": src, "type": "bind", "options": ["rbind"]});
        let err = |mounts| check(&spec(mounts), &rootfs).map_err(|e| e.to_string());

        let missing = format!("{dir}/missing");
        assert_eq!(
            err(serde_json::json!([bind(&missing, "/x")])),
            Err(format!(
                "error mounting \"{missing}\" to rootfs at \"/x\": stat {missing}: no such file or directory"
            ))
        );
        assert_eq!(
            err(serde_json::json!([bind(&file, "/etc/dir")])),
            Err(format!(
                "error mounting \"{file}\" to rootfs at \"/etc/dir\": mount {file}:/etc/dir: not a directory"
            ))
        );
        assert_eq!(
            err(serde_json::json!([bind(&dir, "/etc/file")])),
            Err(format!(
                "error mounting \"{dir}\" to rootfs at \"/etc/file\": mount {dir}:/etc/file: not a directory"
            ))
        );
        // A symlink in the rootfs resolves inside it.
        assert!(err(serde_json::json!([bind(&file, "/link")])).is_err());
        assert_eq!(err(serde_json::json!([bind(&dir, "/link")])), Ok(()));

        // Fine: the same kinds, a destination still to be made, a
        // destination an earlier mount decides, a mount that is no bind.
        assert_eq!(err(serde_json::json!([bind(&file, "/etc/file")])), Ok(()));
        assert_eq!(err(serde_json::json!([bind(&dir, "/etc/dir")])), Ok(()));
        assert_eq!(err(serde_json::json!([bind(&file, "/new/file")])), Ok(()));
        assert_eq!(
            err(serde_json::json!([
                {"destination": "/etc", "source": "tmpfs", "type": "tmpfs"},
                bind(&file, "/etc/dir")
            ])),
            Ok(())
        );
        assert_eq!(
            err(serde_json::json!([
                {"destination": "/etc/dir", "source": "tmpfs", "type": "tmpfs"}
            ])),
            Ok(())
        );
    }
}
