//! Hands libcontainer a config.json of our own without touching the
//! bundle's or changing the bundle path it records.
//!
//! libcontainer 0.7 reads the spec from `BUNDLE/config.json` and records
//! `realpath(BUNDLE)` as the container's bundle. A helper process unshares
//! a mount namespace (a slave of the host's, so nothing leaks back), binds
//! our config over the bundle's there and waits. libcontainer is then given
//! `/proc/HELPER/root/BUNDLE` as the bundle: opening `config.json` through
//! that magic link reads ours, while `realpath` of it (the helper shares
//! our root directory) is `BUNDLE`, the path `state` shows and the hooks
//! get. Everything else (hooks, the container's init) stays in the host's
//! mount namespace. The helper dies with us (`PR_SET_PDEATHSIG`) or when
//! the overlay is dropped.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pipe2, ForkResult, Pid};

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot resolve the bundle {path}: {source}")]
    Bundle {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("path with a NUL byte: {0}")]
    Nul(PathBuf),
    #[error("cannot start the config overlay helper: {0}")]
    Helper(nix::errno::Errno),
    #[error("config overlay helper: {step}: {errno}")]
    Setup {
        step: &'static str,
        errno: nix::errno::Errno,
    },
}

/// A bundle path through which libcontainer reads our config.
pub struct Overlay {
    helper: Pid,
    bundle: PathBuf,
}

impl Overlay {
    /// Binds `config` (written to `scratch` first, removed again once
    /// bound) over `bundle/config.json` in a helper's mount namespace.
    pub fn install(bundle: &Path, config: &[u8], scratch: &Path) -> Result<Overlay, OverlayError> {
        let real = std::fs::canonicalize(bundle).map_err(|source| OverlayError::Bundle {
            path: bundle.to_path_buf(),
            source,
        })?;
        std::fs::write(scratch, config).map_err(|source| OverlayError::Write {
            path: scratch.to_path_buf(),
            source,
        })?;
        let result = Self::spawn(&real, scratch);
        let _ = std::fs::remove_file(scratch);
        result
    }

    fn spawn(real: &Path, scratch: &Path) -> Result<Overlay, OverlayError> {
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|_| OverlayError::Nul(p.to_path_buf()))
        };
        let source = cstr(scratch)?;
        let target = cstr(&real.join("config.json"))?;
        let (rd, wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(OverlayError::Helper)?;
        let parent = nix::unistd::getpid().as_raw();
        // SAFETY: the child only makes raw system calls (prctl, unshare,
        // mount, write, pause, _exit) on data prepared before the fork,
        // all async-signal-safe, so another thread's state (a held lock)
        // cannot bite it.
        match unsafe { fork() }.map_err(OverlayError::Helper)? {
            ForkResult::Child => helper(&source, &target, wr, parent),
            ForkResult::Parent { child } => {
                drop(wr);
                let mut answer = [0u8; 4];
                let n = nix::unistd::read(rd.as_raw_fd(), &mut answer).unwrap_or(0);
                let code = i32::from_ne_bytes(answer);
                if n == answer.len() && code == 0 {
                    return Ok(Overlay {
                        helper: child,
                        bundle: Path::new("/proc")
                            .join(child.as_raw().to_string())
                            .join("root")
                            .join(real.strip_prefix("/").unwrap_or(real)),
                    });
                }
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                let step = match code >> 16 {
                    1 => "prctl",
                    2 => "unshare",
                    3 => "make / a slave",
                    _ => "bind the config",
                };
                Err(OverlayError::Setup {
                    step,
                    errno: nix::errno::Errno::from_raw(code & 0xffff),
                })
            }
        }
    }

    /// The bundle path to give libcontainer.
    pub fn bundle(&self) -> &Path {
        &self.bundle
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = kill(self.helper, Signal::SIGKILL);
        let _ = waitpid(self.helper, None);
    }
}

/// The helper's side: report 0, or (step << 16 | errno), then wait to die.
fn helper(source: &CString, target: &CString, wr: OwnedFd, parent: i32) -> ! {
    let fail = |step: i32| -> ! {
        let code = (step << 16) | (nix::errno::Errno::last_raw() & 0xffff);
        report(&wr, code);
        // SAFETY: _exit is async-signal-safe and ends only this child.
        unsafe { libc::_exit(1) }
    };
    // SAFETY: plain system calls on valid, NUL-terminated strings made
    // before the fork; nothing here allocates or takes a lock.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            fail(1);
        }
        // The parent died before the death signal was armed.
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            fail(2);
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            fail(3);
        }
        if libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) != 0
        {
            fail(4);
        }
    }
    report(&wr, 0);
    loop {
        // SAFETY: pause only waits for the SIGKILL that ends the helper.
        unsafe { libc::pause() };
    }
}

fn report(wr: &OwnedFd, code: i32) {
    let bytes = code.to_ne_bytes();
    // SAFETY: writes 4 bytes from a live buffer to a pipe we own.
    unsafe { libc::write(wr.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcontainer_reads_ours_and_sees_the_bundle() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), "theirs").expect("write");
        let scratch = dir.path().join(".scratch");
        let o = Overlay::install(dir.path(), b"ours", &scratch).expect("overlay");
        assert_eq!(
            std::fs::read_to_string(o.bundle().join("config.json")).expect("read"),
            "ours"
        );
        assert_eq!(
            std::fs::canonicalize(o.bundle()).expect("realpath"),
            std::fs::canonicalize(dir.path()).expect("realpath")
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("config.json")).expect("read"),
            "theirs"
        );
        assert!(!scratch.exists());
        drop(o);
    }
}
