//! What a guest may reach through virtio-fs, and the passthrough file
//! system that serves it.
//!
//! The guest names files by FUSE node ids that the server handed out, and
//! new names one path component at a time; `fuse-backend-rs`'s
//! passthrough opens each with `openat(parent, name, O_PATH|O_NOFOLLOW)`
//! relative to its parent's descriptor, refuses names holding a `/`, and
//! answers `..` of the root with the root itself. So a guest cannot name a
//! host file outside the share: symlinks are never followed on the host
//! (the guest kernel resolves them, inside the guest), `..` stops at the
//! share's root, and a hard link needs a source the guest already holds.
//! The device tests send each of these requests by hand
//! (`tests.rs`, `a_guest_cannot_name_a_host_file_outside_its_share`).
//!
//! What differs from `virtiofsd --sandbox namespace` under QEMU: virtiofsd
//! also runs in a mount namespace whose root is the share (`pivot_root`),
//! a second wall if the first had a hole; here the server is a part of the
//! supervisor, whose own mount namespace holds only the share and what
//! the supervisor needs, and whose seccomp filter and capabilities bound
//! what any bug could do.

use std::path::Path;
use std::time::Duration;

use fuse_backend_rs::passthrough::{CachePolicy, Config, PassthroughFs};

use super::FsError;

/// How long the guest may trust names and attributes (virtiofsd's
/// `--cache auto` under QEMU: one second).
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// The passthrough file system over `share`, its root imported (opened)
/// now, before the supervisor's jail closes the host's paths.
pub fn passthrough(share: &Path) -> Result<PassthroughFs, FsError> {
    let refuse = |source: std::io::Error| FsError::Share {
        path: share.to_path_buf(),
        source,
    };
    let root = share
        .to_str()
        .filter(|s| s.starts_with('/') && !s.contains('\0'))
        .ok_or_else(|| {
            refuse(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not an absolute UTF-8 path",
            ))
        })?;
    if !std::fs::metadata(share).map_err(refuse)?.is_dir() {
        return Err(refuse(std::io::Error::from_raw_os_error(libc::ENOTDIR)));
    }
    let config = Config {
        root_dir: root.to_string(),
        cache_policy: CachePolicy::Auto,
        attr_timeout: TIMEOUT,
        entry_timeout: TIMEOUT,
        // As virtiofsd's default: extended attributes would cost every
        // write a check for privileges to drop, and no guest needs them.
        xattr: false,
        writeback: false,
        do_import: true,
        ..Config::default()
    };
    let fs = PassthroughFs::new(config).map_err(refuse)?;
    fs.import().map_err(refuse)?;
    Ok(fs)
}
