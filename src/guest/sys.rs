//! Small system helpers of PID 1: the SIGCHLD mask, borrowed stdio, wait
//! statuses, ending the VM.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Blocks SIGCHLD so that it is only seen through the agent's signalfd.
pub fn block_sigchld() -> nix::Result<()> {
    signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&sigchld()), None)
}

pub fn sigchld() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set
}

/// SIGCHLD unblocked for as long as this lives.
///
/// A blocked signal mask is inherited through fork and kept across exec, so
/// the container's processes must not be forked while SIGCHLD is blocked:
/// a workload would start with it blocked. libcontainer forks inside
/// `create` and `exec`, so those run under this guard. Notifications that
/// arrive meanwhile are discarded (SIGCHLD's default action), which is fine:
/// the agent reaps with `waitpid(-1)` after every request anyway.
pub struct SigchldUnblocked(());

impl SigchldUnblocked {
    pub fn new() -> nix::Result<SigchldUnblocked> {
        signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&sigchld()), None)?;
        Ok(SigchldUnblocked(()))
    }
}

impl Drop for SigchldUnblocked {
    fn drop(&mut self) {
        if let Err(e) = block_sigchld() {
            super::console::line(&format!("cannot block SIGCHLD again: {e}"));
        }
    }
}

/// Our fds 0, 1 and 2 replaced by a child's stdio for as long as this
/// lives, then restored.
///
/// The container tier's `exec` gives the new process the caller's stdio
/// (it has no stdio parameters), so the agent lends it the pipes this way.
/// The agent is single-threaded and its own logs go to a separate console
/// descriptor, so nothing else writes to 0-2 meanwhile.
pub struct StdioSwap {
    saved: [OwnedFd; 3],
}

impl StdioSwap {
    pub fn new(
        stdin: BorrowedFd,
        stdout: BorrowedFd,
        stderr: BorrowedFd,
    ) -> nix::Result<StdioSwap> {
        let saved = [dup_high(0)?, dup_high(1)?, dup_high(2)?];
        let swap = StdioSwap { saved };
        for (fd, target) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
            // SAFETY: dup2 onto 0-2 only replaces descriptors this guard
            // saved and restores on drop; no Rust object owns 0-2 here.
            Errno::result(unsafe { libc::dup2(fd.as_raw_fd(), target) })?;
        }
        Ok(swap)
    }
}

impl Drop for StdioSwap {
    fn drop(&mut self) {
        for (target, saved) in self.saved.iter().enumerate() {
            // SAFETY: as in new(): 0-2 belong to this guard until it ends.
            unsafe { libc::dup2(saved.as_raw_fd(), target as RawFd) };
        }
    }
}

/// A close-on-exec copy of `fd` at 10 or above (boot makes sure 0-2 are
/// open).
fn dup_high(fd: RawFd) -> nix::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that we then own.
    let new = Errno::result(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) })?;
    // SAFETY: `new` was just created by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

pub fn set_nonblocking(fd: BorrowedFd) -> nix::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// The status the host reports for a finished process: its exit code, or
/// 128 + the signal that killed it. `None` for a process that only stopped.
pub fn exit_status(status: WaitStatus) -> Option<(Pid, i32)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid, code)),
        WaitStatus::Signaled(pid, sig, _) => Some((pid, 128 + sig as i32)),
        _ => None,
    }
}

/// One non-blocking reap of any child (clone children included). `None`
/// when there is nothing (more) to reap right now.
pub fn reap_one() -> Option<WaitStatus> {
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        ) {
            Ok(WaitStatus::StillAlive) => return None,
            Ok(status) => return Some(status),
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// SIGKILLs every process but us and reaps them, for at most `limit`.
pub fn kill_everything(limit: Duration) {
    // SAFETY: kill(-1, SIGKILL) takes no pointers; from PID 1 it reaches
    // every other process of the VM.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        ) {
            Err(Errno::ECHILD) => return,
            Ok(WaitStatus::StillAlive) | Err(_) => {
                if Instant::now() >= deadline {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(_) => {}
        }
    }
}

/// Time since the kernel started (CLOCK_BOOTTIME; needs no /proc).
pub fn since_boot() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the struct we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Writes back what the guest's page cache holds dirty for the host's
/// files, when it holds any. Writes through virtio-fs reach the host as
/// they are made (no writeback cache), so pages are left dirty only by a
/// shared writable mapping; without any, `sync` would only make the host
/// run syncfs(2) on the filesystem behind the share, flushing the whole
/// of it to disk, which runc never does when a container ends, and would
/// cost the guest about 20 ms under TCG.
pub fn flush_dirty() {
    // The counters are kept per CPU and folded into the totals /proc shows
    // now and then: a write to stat_refresh folds them now, so a page
    // dirtied just before is counted.
    let refreshed = std::fs::write("/proc/sys/vm/stat_refresh", "1").is_ok();
    let meminfo = refreshed
        .then(|| std::fs::read_to_string("/proc/meminfo").ok())
        .flatten();
    if meminfo.as_deref().is_none_or(has_dirty_pages) {
        nix::unistd::sync();
    }
}

/// Whether `/proc/meminfo` shows pages dirty or under writeback (or lacks
/// the figures, when the answer is yes to be safe).
fn has_dirty_pages(meminfo: &str) -> bool {
    use super::requests::meminfo_bytes;
    match (
        meminfo_bytes(meminfo, "Dirty"),
        meminfo_bytes(meminfo, "Writeback"),
    ) {
        (Some(dirty), Some(writeback)) => dirty > 0 || writeback > 0,
        _ => true,
    }
}

/// Ends the VM: the host runs QEMU with `-no-reboot` and the kernel with
/// `reboot=t`, so a reboot is how a microVM powers off (there is no ACPI).
pub fn power_off() -> ! {
    flush_dirty();
    // SAFETY: reboot(2) with a valid command takes no pointers.
    unsafe { libc::reboot(libc::RB_AUTOBOOT) };
    // Only a non-PID-1 caller gets here; exiting PID 1 panics the kernel,
    // which (panic=-1) reboots as well.
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dirty_or_writeback_pages_or_unknown_figures_need_a_sync() {
        let meminfo = |dirty: &str, writeback: &str| {
            format!(
                "MemTotal:         504000 kB\nDirty:          {dirty} kB\nWriteback:      {writeback} kB\nAnonPages:        1200 kB\n"
            )
        };
        assert!(!has_dirty_pages(&meminfo("0", "0")));
        assert!(has_dirty_pages(&meminfo("4", "0")));
        assert!(has_dirty_pages(&meminfo("0", "8")));
        assert!(has_dirty_pages("MemTotal: 504000 kB\n"));
        assert!(has_dirty_pages(""));
        // "WritebackTmp" is another field, not Writeback.
        assert!(!has_dirty_pages(
            "Dirty: 0 kB\nWriteback: 0 kB\nWritebackTmp: 12 kB\n"
        ));
    }
}
