//! Unix sockets in a container's state directory, whatever its length.
//!
//! `sun_path` holds 108 bytes, and a state directory under Docker's root
//! (`/run/docker/runtime-runc/moby/<64 hex digits>/`) or the tests' is
//! longer. A socket there is reached through `/proc/self/fd/<dirfd>/<name>`:
//! the kernel resolves the directory from the descriptor, so the address
//! stays short. Processes we start get the directory as their working
//! directory and the bare name instead.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The longest path `bind`/`connect` take (sun_path less its NUL).
const SUN_PATH_MAX: usize = 107;

/// A short address for `dir/name`, and the descriptor that keeps it valid.
struct Address {
    path: PathBuf,
    _dir: Option<OwnedFd>,
}

fn address(dir: &Path, name: &str) -> io::Result<Address> {
    let full = dir.join(name);
    if full.as_os_str().as_bytes().len() <= SUN_PATH_MAX {
        return Ok(Address {
            path: full,
            _dir: None,
        });
    }
    let fd = crate::container::sys::open_dir_path(dir)?;
    Ok(Address {
        path: PathBuf::from(format!("/proc/self/fd/{}/{name}", fd.as_raw_fd())),
        _dir: Some(fd),
    })
}

/// Listens on `dir/name`, replacing a stale socket file.
pub fn bind(dir: &Path, name: &str) -> io::Result<UnixListener> {
    let _ = std::fs::remove_file(dir.join(name));
    let addr = address(dir, name)?;
    UnixListener::bind(&addr.path)
}

/// Connects to `dir/name`.
pub fn connect(dir: &Path, name: &str) -> io::Result<UnixStream> {
    let addr = address(dir, name)?;
    UnixStream::connect(&addr.path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_in_directories_longer_than_sun_path_work() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let long = tmp.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&long).expect("mkdir");
        assert!(long.join("x.sock").as_os_str().len() > SUN_PATH_MAX);
        let listener = bind(&long, "x.sock").expect("bind");
        assert!(long.join("x.sock").exists(), "socket made in the directory");
        let _client = connect(&long, "x.sock").expect("connect");
        listener.accept().expect("accept");
        // A second bind replaces the stale file.
        drop(listener);
        bind(&long, "x.sock").expect("rebind");
    }
}
