//! The egress daemon's jail. The daemon parses what the sandbox sends (DNS
//! queries, the first bytes of every TCP connection, logged packets) and
//! what upstream resolvers answer, so once its sockets are open it keeps
//! nothing it does not need: it becomes `nobody`, drops every capability —
//! but `CAP_NET_ADMIN` when the policy has UDP rules, to dump the flows
//! still open when it ends (`conntrack.rs`) and, when a UDP rule names a
//! host, to add the addresses it resolves to that rule's nftables set with
//! `nft` — and runs under a
//! seccomp allow-list of what its threads do: accept, connect, splice,
//! send and receive. Exec (but for `nft` then), ptrace, mounts, namespace
//! changes and new privileges end it.

use crate::jail::{self, JailError};

/// The user the daemon runs as (`nobody`).
pub const DAEMON_UID: u32 = 65_534;

/// What the proxy, the resolver and the log reader do.
const ALLOWED: &[&str] = &[
    "read",
    "write",
    "readv",
    "writev",
    "close",
    "fcntl",
    "ioctl",
    "dup",
    "dup3",
    "pipe2",
    "splice",
    "poll",
    "ppoll",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "fstat",
    "newfstatat",
    "statx",
    // Sockets: accept the sandbox, connect out, relay, resolve.
    "socket",
    "connect",
    "bind",
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
    "rseq",
    "set_tid_address",
    "sched_yield",
    "sched_getaffinity",
    "membarrier",
    // Signals and time.
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sigaltstack",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "gettimeofday",
    "restart_syscall",
    "getpid",
    "gettid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getrandom",
    "prctl",
    "capget",
    "exit",
    "exit_group",
];

/// What running `nft` adds: the daemon's own fork and exec, and what the
/// dynamically linked `nft` does on its way to a netlink socket.
const FOR_NFT: &[&str] = &[
    "execve",
    "vfork",
    "wait4",
    "waitid",
    "openat",
    "access",
    "faccessat",
    "faccessat2",
    "arch_prctl",
    "prlimit64",
    "pread64",
    "lseek",
    "uname",
    "getdents64",
    "readlink",
    "readlinkat",
    "getcwd",
    "getppid",
    "getresuid",
    "getresgid",
    "dup2",
    "pidfd_open",
    "pidfd_send_signal",
];

/// Enters the jail; `nft` when the daemon must be able to run `nft`,
/// `net_admin` when it keeps `CAP_NET_ADMIN` (the flows' final dump).
/// With `with_parent` (the microVM's supervisor's daemon) the
/// parent-death signal is set again (a change of user clears it), and the
/// daemon ends if its parent is already gone; a detached daemon (the
/// container tier's, which outlives `create`) watches its init instead.
pub fn enter(nft: bool, net_admin: bool, with_parent: bool) -> Result<(), JailError> {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    jail::become_user(DAEMON_UID)?;
    if with_parent {
        // SAFETY: prctl(PR_SET_PDEATHSIG, SIGKILL) takes no pointers.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        // SAFETY: as above.
        if unsafe { libc::getppid() } != parent {
            std::process::exit(0);
        }
    }
    let keep: &[caps::Capability] = if nft || net_admin {
        &[caps::Capability::CAP_NET_ADMIN]
    } else {
        &[]
    };
    jail::drop_capabilities_except(keep)?;
    let mut allowed = ALLOWED.to_vec();
    let fatal = if nft {
        allowed.extend(FOR_NFT);
        jail::FATAL.to_vec()
    } else {
        jail::fatal_with_exec()
    };
    jail::filter(&allowed, &fatal, &[])?
        .load()
        .map_err(|source| JailError::Seccomp {
            what: "load".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child that entered the jail; how it ended.
    fn in_jail(nft: bool, f: fn() -> i32) -> i32 {
        // SAFETY: fork in a test; the child only enters the jail, runs `f`
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match enter(nft, nft, true) {
                Ok(()) => f(),
                Err(e) => {
                    eprintln!("{e}");
                    100
                }
            };
            // SAFETY: _exit ends the child without atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("skipped: changing user needs root");
        }
        root
    }

    /// A listener opened before the jail, as the daemon's are.
    static LISTENER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

    #[test]
    fn the_jailed_daemon_relays_as_nobody_and_cannot_exec() {
        if !root() {
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        LISTENER.store(
            std::os::fd::AsRawFd::as_raw_fd(&listener),
            std::sync::atomic::Ordering::SeqCst,
        );
        let status = in_jail(false, || {
            // SAFETY: getuid has no preconditions.
            if unsafe { libc::getuid() } != DAEMON_UID {
                return 1;
            }
            if caps::read(None, caps::CapSet::Effective).map_or(true, |s| !s.is_empty()) {
                return 2;
            }
            // What the proxy does: accept, connect, relay.
            let fd = LISTENER.load(std::sync::atomic::Ordering::SeqCst);
            // SAFETY: the parent's listener, inherited across fork; this
            // child owns its copy.
            let l = unsafe { <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let Ok(addr) = l.local_addr() else { return 3 };
            let t = std::thread::spawn(move || {
                use std::io::Write;
                let (mut s, _) = l.accept().ok()?;
                s.write_all(b"hello").ok()
            });
            let Ok(mut c) = std::net::TcpStream::connect(addr) else {
                return 4;
            };
            let mut got = String::new();
            if std::io::Read::read_to_string(&mut c, &mut got).is_err() || got != "hello" {
                return 5;
            }
            let _ = t.join();
            // Files root could read are not readable by nobody.
            if std::fs::read("/etc/shadow").is_ok() {
                return 6;
            }
            // exec ends it.
            let path = c"/bin/true";
            let argv = [path.as_ptr(), std::ptr::null()];
            let envp = [std::ptr::null()];
            // SAFETY: valid NUL-terminated strings and NULL-terminated arrays.
            unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            7
        });
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "status {status:#x}"
        );
    }

    #[test]
    fn with_udp_names_it_keeps_only_net_admin_and_can_run_nft() {
        if !root() || !std::path::Path::new("/usr/sbin/nft").exists() {
            return;
        }
        let status = in_jail(true, || {
            let Ok(set) = caps::read(None, caps::CapSet::Effective) else {
                return 1;
            };
            if set.len() != 1 || !set.contains(&caps::Capability::CAP_NET_ADMIN) {
                return 2;
            }
            match std::process::Command::new("/usr/sbin/nft")
                .args(["list", "tables"])
                .stdout(std::process::Stdio::null())
                .status()
            {
                Ok(s) if s.success() => 0,
                Ok(_) => 3,
                Err(_) => 4,
            }
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status:#x}"
        );
    }
}
