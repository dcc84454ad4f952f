//! The jail a VMM process runs in, after Firecracker's jailer: its own
//! mount namespace whose root (by `pivot_root`, not `chroot`) is a fresh,
//! read-only tmpfs holding only what the VMM reads — its binary and
//! libraries, its firmware, the guest's kernel and initramfs, a few device
//! nodes — an unprivileged uid and gid of its own, no capabilities and
//! `no_new_privs`. Everything else it needs (taps, the control and
//! vhost-user sockets, the console log) arrives as descriptors.
//!
//! The supervisor builds the tree in its own private mount namespace
//! ([`Tree`], before the fork); the child moves into it between fork and
//! exec ([`install`]). Nothing of it is ever mounted in the host's
//! namespace, and it goes away with the last process that sees it.

mod enter;
mod libs;
mod tree;

use std::path::PathBuf;

pub use enter::install;
pub use libs::dependencies;
pub use tree::Tree;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("cannot list the shared libraries of {binary}: {detail}")]
    Libraries { binary: PathBuf, detail: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path}: {source}")]
    Mount {
        what: &'static str,
        path: PathBuf,
        source: nix::errno::Errno,
    },
    #[error(
        "{path} is not readable by the VMM's unprivileged user (mode {mode:o}): \
         make it readable by others (chmod o+r)"
    )]
    NotReadable { path: PathBuf, mode: u32 },
    #[error("{path}: too many levels of symbolic links")]
    SymlinkLoop { path: PathBuf },
    #[error("{path}: not an absolute path")]
    Relative { path: PathBuf },
}

/// The uid and gid a jailed VMM runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// The identity of the VMM whose supervisor has pid `pid`: `base` +
    /// `pid` for both ids. A pid belongs to one live process, and the VMM
    /// lives no longer than its supervisor (`PR_SET_PDEATHSIG`), so no two
    /// running VMs share it (within one pid namespace). `base` is checked
    /// when the config file is read (`config::MAX_VMM_UID_BASE`); a sum
    /// past the range saturates rather than wrap to root.
    pub fn for_supervisor(base: u32, pid: u32) -> Identity {
        let id = base.saturating_add(pid).min(u32::MAX - 1);
        Identity { uid: id, gid: id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_supervisor_gets_its_own_identity_and_never_root() {
        let a = Identity::for_supervisor(2_000_000_000, 41);
        let b = Identity::for_supervisor(2_000_000_000, 42);
        assert_eq!(a.uid, 2_000_000_041);
        assert_eq!(a.gid, a.uid);
        assert_ne!(a, b);
        // Never -1 (no change) nor a wrap to 0.
        let c = Identity::for_supervisor(u32::MAX - 3, 1 << 22);
        assert_eq!(c.uid, u32::MAX - 1);
    }
}
