//! The supervisor's steady-state jail, after Firecracker's jailer and Cloud
//! Hypervisor's per-thread filters: once the VM runs, the supervisor only
//! relays bytes between sockets, the guest and its caller, so it keeps one
//! capability, `CAP_KILL` (QEMU runs as a uid of its own, which uid 0
//! cannot signal without it; the filter lets `kill` reach only the VM's
//! processes), and runs under a seccomp allow-list of the system calls its
//! event loop, signal forwarding and exec relays use.
//!
//! Installed on the main thread before the relay threads exist, so every
//! thread inherits both. A system call outside the list fails with EPERM;
//! the ones that would let a hijacked supervisor act on the host (exec,
//! ptrace, mounts, module loading, namespace changes, new privileges) kill
//! it at once.

use libseccomp::ScmpFilterContext;

pub use crate::jail::JailError;

/// What the supervisor does while the VM runs: read/write/poll its
/// sockets and pipes, accept CLI connections, run threads, forward signals,
/// reap and kill its VMM, write its state file and log.
const ALLOWED: &[&str] = &[
    // I/O on descriptors it holds.
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "close",
    "lseek",
    "fstat",
    "newfstatat",
    "statx",
    "fcntl",
    "ioctl",
    "dup",
    "dup2",
    "dup3",
    "pipe2",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "eventfd2",
    "fsync",
    "fdatasync",
    "ftruncate",
    // Files in its state directory (state file, logs).
    "openat",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "mkdirat",
    "getdents64",
    "readlink",
    "readlinkat",
    "access",
    "faccessat",
    "faccessat2",
    "getcwd",
    // Sockets: accept the CLI, talk to the guest and the relays.
    "accept",
    "accept4",
    "recvfrom",
    "recvmsg",
    "sendto",
    "sendmsg",
    "shutdown",
    "getsockopt",
    "setsockopt",
    "getsockname",
    "getpeername",
    "socketpair",
    // Memory and threads.
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "madvise",
    "brk",
    "futex",
    "clone",
    "clone3",
    "set_robust_list",
    "get_robust_list",
    "rseq",
    "set_tid_address",
    "sched_yield",
    "sched_getaffinity",
    "membarrier",
    // Signals, children, time.
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigtimedwait",
    "sigaltstack",
    "wait4",
    "waitid",
    // A pooled VM's QEMU and virtiofsd are its keeper's children: the
    // supervisor holds pidfds of them (and of nothing else).
    "pidfd_send_signal",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "restart_syscall",
    // Identity and limits, read only.
    "getpid",
    "gettid",
    "getppid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "uname",
    "getrandom",
    "prlimit64",
    "getrusage",
    "sysinfo",
    "prctl",
    "capget",
    "exit",
    "exit_group",
];

/// The filter, not yet loaded (tests load it in a child). Signals may go
/// to this process's own threads and to `children` (the VMM and its file
/// server), nowhere else: uid 0 without capabilities could still signal
/// every root process of the host.
pub fn filter(children: &[i32]) -> Result<ScmpFilterContext, JailError> {
    // Never needed once the VM runs, and the first things a hijacked
    // supervisor would try, exec among them: they end it (SIGSYS).
    crate::jail::filter(ALLOWED, &crate::jail::fatal_with_exec(), children)
}

/// The one capability the running supervisor keeps: to kill its jailed
/// VMM, whose uid is not its own.
pub const KEPT: &[caps::Capability] = &[caps::Capability::CAP_KILL];

/// Enters the steady-state jail: every capability but [`KEPT`] dropped,
/// then the filter.
pub fn enter(children: &[i32]) -> Result<(), JailError> {
    crate::jail::drop_capabilities_except(KEPT)?;
    filter(children)?
        .load()
        .map_err(|source| JailError::Seccomp {
            what: "load".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::jail::{am_root, in_forked_child};

    /// Runs `f` in a forked child that entered the jail; returns how the
    /// child ended.
    fn in_jailed_child(f: fn() -> i32) -> i32 {
        in_forked_child(|| match enter(&[]) {
            Ok(()) => f(),
            Err(_) => 100,
        })
    }

    #[test]
    fn the_filter_builds() {
        filter(&[1234]).unwrap();
    }

    #[test]
    fn a_jailed_supervisor_that_tries_to_exec_dies_of_sigsys() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        let status = in_jailed_child(|| {
            let path = c"/bin/true";
            let argv = [path.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            // SAFETY: valid NUL-terminated strings and NULL-terminated arrays.
            unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            101
        });
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "status {status:#x}"
        );
    }

    #[test]
    fn unlisted_calls_fail_and_listed_ones_work() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        let status = in_jailed_child(|| {
            // Not on the list: fails with EPERM, the supervisor lives on.
            // SAFETY: socket(2) with constant arguments.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
                return 1;
            }
            // No capability is left but CAP_KILL: even root cannot chown
            // what it does not own, or raise the capabilities again.
            let kept: caps::CapsHashSet = KEPT.iter().copied().collect();
            if caps::read(None, caps::CapSet::Effective).map_or(true, |s| s != kept)
                || caps::read(None, caps::CapSet::Bounding).map_or(true, |s| s != kept)
            {
                return 2;
            }
            // On the list: a thread, a pipe, time.
            let t = std::thread::spawn(std::time::Instant::now);
            if t.join().is_err() {
                return 3;
            }
            if std::io::pipe().is_err() {
                return 4;
            }
            // Signals reach only ourselves and our VMM: pid 1 is refused.
            // SAFETY: kill(2) with signal 0 only checks permission.
            if unsafe { libc::kill(1, 0) } == 0 {
                return 5;
            }
            // SAFETY: as above, at ourselves.
            if unsafe { libc::kill(libc::getpid(), 0) } != 0 {
                return 6;
            }
            0
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status:#x}"
        );
    }
}
