//! Waiting for a container's init to exit, the way containerd's shim does.
//!
//! After `create` the runtime has exited and its init is nobody's child. The
//! benchmark makes itself a child subreaper (as the shim is), so the
//! orphaned init is re-parented to it; it holds a pidfd on the init from
//! `create` on (the init is then blocked until `start`, so the pid cannot
//! have been reused), polls that pidfd for the exit and reaps the init with
//! `waitid(P_PIDFD)`, which also yields its exit status.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::error::BenchError;

/// Makes this process the reaper of its orphaned descendants, or stops.
pub fn set_subreaper(on: bool) -> Result<(), BenchError> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no
    // memory of ours.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_CHILD_SUBREAPER,
            libc::c_ulong::from(on),
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(BenchError::last_os("prctl(PR_SET_CHILD_SUBREAPER)"));
    }
    Ok(())
}

/// Reaps every exited child without blocking (inits orphaned by a failed
/// round, runtime helpers that daemonised).
pub fn reap_orphans() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only to `status`, a valid local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

/// CPU time (user + system) of every descendant reaped so far: the ones we
/// waited for and, recursively, the ones they waited for. As subreaper we
/// reap every orphan, so the growth of this across a round is the CPU the
/// whole round cost, whatever the machine's load.
pub fn children_cpu() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only to `usage`, a valid local.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

/// A pidfd on a process that is (or will become) our child.
pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    pub fn open(pid: i32) -> Result<PidFd, BenchError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or
        // -1; it touches no memory of ours.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(BenchError::last_os(format!("pidfd_open({pid})")));
        }
        let raw = i32::try_from(raw).map_err(|_| BenchError::Sys {
            what: format!("pidfd_open({pid}) returned {raw}"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        })?;
        // SAFETY: `raw` is a fresh fd returned by pidfd_open, owned by no
        // one else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(PidFd { fd, pid })
    }

    /// Blocks until the process exits (at most `timeout`); `None` if it
    /// is still running then.
    pub fn wait_exit(&self, timeout: Duration) -> Result<Option<()>, BenchError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        loop {
            // SAFETY: `pfd` is one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(BenchError::Sys {
                    what: format!("poll on pidfd of {}", self.pid),
                    source: err,
                });
            }
            return Ok((n > 0).then_some(()));
        }
    }

    /// Reaps the exited process and returns how it ended. The process must
    /// be our child by now (we are its subreaper).
    pub fn reap(&self) -> Result<Exit, BenchError> {
        // SAFETY: siginfo_t is plain data; all-zero is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only to `info`, a valid local; the id is our
        // pidfd, valid while `self` lives.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                self.fd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED,
            )
        };
        if rc != 0 {
            return Err(BenchError::last_os(format!(
                "waitid on pid {} (is it our child?)",
                self.pid
            )));
        }
        // SAFETY: waitid succeeded with WEXITED, so si_status is set.
        let status = unsafe { info.si_status() };
        Ok(if info.si_code == libc::CLD_EXITED {
            Exit::Code(status)
        } else {
            Exit::Signal(status)
        })
    }
}
