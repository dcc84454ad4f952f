//! The builtin VMM's per-thread jails, after Firecracker's per-thread
//! seccomp filters: each of the VMM's threads enters the jail of its role
//! as it starts, before it touches anything the guest hands it.
//!
//! Capabilities, the bounding set, `no_new_privs` and seccomp filters are
//! a thread's own in Linux: the supervisor's steady-state jail
//! ([`crate::microvm::supervisor::jail`]), entered on its main thread once
//! the VM runs, reaches only the threads that main thread starts later,
//! and the VMM's threads were started before it. So each jails itself:
//!
//! - a **vCPU** thread runs `KVM_RUN` and the device registers its exits
//!   reach: one `ioctl` (`KVM_RUN`), writes (an interrupt's eventfd, the
//!   serial console's log), memory and futexes; no capability;
//! - the **devices** thread (virtio-rng, the agent's control port,
//!   virtio-net) polls its eventfds, the control socket and the taps, and
//!   reads and writes them; no `ioctl`, no capability;
//! - the **fs** thread serves virtio-fs: the file system calls of
//!   `fuse-backend-rs`'s passthrough, relative to descriptors it holds,
//!   with virtiofsd's capabilities (chown, DAC override, fowner, fsetid,
//!   setgid, setuid, mknod, setfcap) so the guest's root can act on its
//!   share's files; it takes each request's credentials as its effective
//!   uid and gid (`setresuid(-1, uid, -1)`: the filter refuses any other
//!   form) and drops `CAP_FSETID` around writes (`capset`, within what it
//!   holds);
//! - the **runner** thread, which started the others, only waits for the
//!   first to stop the VM, kicks the vCPUs out of `KVM_RUN` (a signal to
//!   its own threads) and joins them; no capability. It jails itself last:
//!   a filter is inherited by the threads a thread starts, and stacks.
//!
//! Whatever a thread is not allowed fails with `EPERM`; what only a
//! hijacked thread would call (exec, ptrace, mounts, namespaces, module
//! loading, new privileges: [`crate::jail::FATAL`]) ends the supervisor
//! with `SIGSYS`. Nothing in the process may change credentials with
//! glibc's `set*id` once the VMM runs (glibc makes every thread repeat
//! the call, which the jailed threads may not).

pub use crate::jail::JailError;

/// What a thread of the builtin VMM does, and so what it is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Vcpu,
    Devices,
    Fs,
    Runner,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Vcpu => "vCPU",
            Role::Devices => "devices",
            Role::Fs => "virtio-fs",
            Role::Runner => "runner",
        }
    }
}

/// What any thread of a running program calls: memory, futexes, its own
/// signals, time, randomness (std's hash maps), writing a log line, and
/// ending.
const EVERY_THREAD: &[&str] = &[
    "write",
    "writev",
    "close",
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "madvise",
    "brk",
    "futex",
    "sched_yield",
    "getrandom",
    "clock_gettime",
    "clock_nanosleep",
    "nanosleep",
    "gettid",
    "getpid",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sigaltstack",
    "restart_syscall",
    "rseq",
    "set_robust_list",
    "exit",
    "exit_group",
];

/// An event loop's calls ([`event_manager`]: epoll over eventfds and
/// sockets), and reading what it is woken for.
const EVENT_LOOP: &[&str] = &["epoll_wait", "epoll_pwait", "epoll_ctl", "read", "readv"];

/// The devices thread's sockets: the control port's stream, the taps (or
/// the datagram sockets the tests give as taps).
const DEVICES: &[&str] = &["recvfrom", "recvmsg", "sendto", "sendmsg"];

/// `fuse-backend-rs`'s passthrough: every call relative to a descriptor it
/// holds (the share's root and the nodes it handed out, `/proc/self/fd`
/// to reopen them), never a host path of the guest's choosing.
const FS: &[&str] = &[
    "openat",
    "newfstatat",
    "fstat",
    "statx",
    "fstatfs",
    "lseek",
    "getdents64",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "readlinkat",
    "mkdirat",
    "mknodat",
    "symlinkat",
    "linkat",
    "unlinkat",
    "renameat",
    "renameat2",
    "fchmod",
    "fchmodat",
    "fchown",
    "fchownat",
    "utimensat",
    "ftruncate",
    "fallocate",
    "fsync",
    "fdatasync",
    "fcntl",
    "dup",
    "dup3",
    "name_to_handle_at",
    "getuid",
    "getgid",
    "geteuid",
    "getegid",
    "capget",
];

/// The runner thread kicks vCPUs (`tgkill` to its own process, which
/// [`crate::jail::filter`] allows every jail) and joins threads.
const RUNNER: &[&str] = &[];

/// The capabilities the fs thread keeps: virtiofsd's default set, so the
/// guest's root may chown, chmod and make nodes in its share as root on a
/// local file system could (a node is never opened on the host:
/// `fuse-backend-rs` opens only regular files and directories).
pub const FS_KEPT: &[caps::Capability] = &[
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_FSETID,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_MKNOD,
    caps::Capability::CAP_SETFCAP,
];

/// `KVM_RUN`, `_IO(KVMIO, 0x80)`: the one `ioctl` a vCPU thread makes.
const KVM_RUN: u64 = 0xAE80;

/// The calls `role` may make: the allow-list, then the fatal list.
fn lists(role: Role) -> (Vec<&'static str>, Vec<&'static str>) {
    let mut allowed: Vec<&str> = EVERY_THREAD.to_vec();
    match role {
        Role::Vcpu => {}
        Role::Devices => {
            allowed.extend(EVENT_LOOP);
            allowed.extend(DEVICES);
        }
        Role::Fs => {
            allowed.extend(EVENT_LOOP);
            allowed.extend(FS);
        }
        Role::Runner => allowed.extend(RUNNER),
    }
    let mut fatal = crate::jail::fatal_with_exec();
    if role == Role::Fs {
        // Allowed in the one form `fuse-backend-rs` uses (below), refused
        // (EPERM) in any other: not fatal.
        fatal.retain(|c| !matches!(*c, "setresuid" | "setresgid" | "capset"));
    }
    (allowed, fatal)
}

/// The filter of `role`, not yet loaded.
pub fn filter(role: Role) -> Result<libseccomp::ScmpFilterContext, JailError> {
    use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpSyscall};
    let err = |what: &'static str| {
        move |source| JailError::Seccomp {
            what: what.into(),
            source,
        }
    };
    let (allowed, fatal) = lists(role);
    let mut f = crate::jail::filter(&allowed, &fatal, &[])?;
    match role {
        Role::Vcpu => {
            let ioctl = ScmpSyscall::from_name("ioctl").map_err(err("ioctl"))?;
            f.add_rule_conditional(
                ScmpAction::Allow,
                ioctl,
                &[ScmpArgCompare::new(1, ScmpCompareOp::Equal, KVM_RUN)],
            )
            .map_err(err("ioctl"))?;
        }
        Role::Fs => {
            // A request's credentials as the effective ids only:
            // setres[ug]id(-1, id, -1). The real and saved ids stay 0, so
            // the thread can always return to them, and never leaves them.
            let unchanged = |arg| {
                ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(0xffff_ffff), 0xffff_ffff)
            };
            for name in ["setresuid", "setresgid"] {
                let call = ScmpSyscall::from_name(name).map_err(err("setresuid"))?;
                f.add_rule_conditional(ScmpAction::Allow, call, &[unchanged(0), unchanged(2)])
                    .map_err(err("setresuid"))?;
            }
            // capset can only lower what the thread holds (its bounding
            // and permitted sets are FS_KEPT at most).
            let capset = ScmpSyscall::from_name("capset").map_err(err("capset"))?;
            f.add_rule(ScmpAction::Allow, capset)
                .map_err(err("capset"))?;
        }
        Role::Devices | Role::Runner => {}
    }
    Ok(f)
}

/// The capabilities `role` keeps.
pub fn kept(role: Role) -> &'static [caps::Capability] {
    match role {
        Role::Fs => FS_KEPT,
        Role::Vcpu | Role::Devices | Role::Runner => &[],
    }
}

/// Jails the calling thread as `role`: every capability but [`kept`]
/// dropped (those of them it does not hold are not gained), then the
/// filter, loaded for this thread only.
pub fn enter(role: Role) -> Result<(), JailError> {
    let held = caps::read(None, caps::CapSet::Permitted)
        .map_err(|e| JailError::Capabilities(e.to_string()))?;
    let keep: Vec<caps::Capability> = kept(role)
        .iter()
        .copied()
        .filter(|c| held.contains(c))
        .collect();
    crate::jail::drop_capabilities_except(&keep)?;
    filter(role)?.load().map_err(|source| JailError::Seccomp {
        what: format!("load the {} thread's filter", role.name()),
        source,
    })
}

/// Runs `f` on a new thread jailed as `role` and returns what it returned
/// (a panic in it panics here): how the device tests serve a device under
/// the jail it has in the VMM.
#[cfg(test)]
pub fn jailed<T: Send>(role: Role, f: impl FnOnce() -> T + Send) -> T {
    if !crate::jail::am_root() {
        eprintln!("jail skipped: dropping capabilities needs root");
        return f();
    }
    std::thread::scope(|s| {
        let t = s.spawn(move || {
            enter(role)
                .unwrap_or_else(|e| panic!("cannot jail the test's {} thread: {e}", role.name()));
            f()
        });
        match t.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jail::{am_root, in_forked_child};

    /// In a forked child, jails a new thread as `role` and runs `f` on it;
    /// the child exits with what `f` returned (100: the jail failed).
    fn on_jailed_thread_of_a_child(role: Role, f: fn() -> i32) -> i32 {
        in_forked_child(|| {
            let t = std::thread::spawn(move || match enter(role) {
                Ok(()) => f(),
                Err(_) => 100,
            });
            t.join().unwrap_or(101)
        })
    }

    fn exited(status: i32) -> Option<i32> {
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }

    fn died_of_sigsys(status: i32) -> bool {
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS
    }

    fn errno() -> Option<i32> {
        std::io::Error::last_os_error().raw_os_error()
    }

    /// `openat` of a host file by path: whether it was refused with EPERM.
    fn open_is_refused() -> bool {
        // SAFETY: a NUL-terminated path; the descriptor, if any, is closed.
        let fd = unsafe { libc::open(c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
        if fd >= 0 {
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            return false;
        }
        errno() == Some(libc::EPERM)
    }

    fn socket_is_refused() -> bool {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        fd < 0 && errno() == Some(libc::EPERM)
    }

    fn exec() -> i32 {
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: valid NUL-terminated strings and NULL-terminated arrays.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        1
    }

    /// The effective, permitted and bounding sets of thread `tid` of this
    /// process, read from its /proc status (a jailed thread may not ask).
    fn caps_of(tid: i32) -> Option<[u64; 3]> {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name))?;
            u64::from_str_radix(line[name.len()..].trim(), 16).ok()
        };
        Some([field("CapEff:")?, field("CapPrm:")?, field("CapBnd:")?])
    }

    fn mask(set: &[caps::Capability]) -> u64 {
        set.iter().fold(0, |m, c| m | 1 << c.index())
    }

    /// The fs thread's effective set, as it asks (capget, which it may).
    fn effective() -> caps::CapsHashSet {
        caps::read(None, caps::CapSet::Effective).unwrap_or_default()
    }

    #[test]
    fn each_role_keeps_only_its_capabilities() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        for role in [Role::Vcpu, Role::Devices, Role::Fs, Role::Runner] {
            let status = in_forked_child(|| {
                let (tx, rx) = std::sync::mpsc::channel();
                let checked = std::sync::Arc::new(std::sync::Barrier::new(2));
                let done = checked.clone();
                let t = std::thread::spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    let _ = tx.send(enter(role).is_ok().then_some(tid));
                    done.wait();
                });
                let Ok(Some(tid)) = rx.recv() else {
                    return 1;
                };
                let seen = caps_of(tid);
                checked.wait();
                let _ = t.join();
                let want = mask(kept(role));
                match seen {
                    Some(sets) if sets == [want; 3] => 0,
                    Some(_) => 2,
                    None => 3,
                }
            });
            assert_eq!(exited(status), Some(0), "{}: {status:#x}", role.name());
        }
    }

    #[test]
    fn each_role_s_filter_builds() {
        for role in [Role::Vcpu, Role::Devices, Role::Fs, Role::Runner] {
            filter(role).unwrap_or_else(|e| panic!("{}: {e}", role.name()));
        }
    }

    #[test]
    fn a_vcpu_thread_has_no_capability_and_only_kvm_run_for_ioctl() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        let status = on_jailed_thread_of_a_child(Role::Vcpu, || {
            if !open_is_refused() || !socket_is_refused() {
                return 2;
            }
            // Any ioctl but KVM_RUN is refused (here: a terminal's).
            let mut ws = libc::winsize {
                ws_row: 0,
                ws_col: 0,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCGWINSZ writes a winsize, which `ws` is.
            if unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) } >= 0
                || errno() != Some(libc::EPERM)
            {
                return 3;
            }
            // What it needs works: memory, a pipe's write end it holds.
            let v = vec![7u8; 1 << 20];
            if v.iter().map(|&b| u64::from(b)).sum::<u64>() != 7 << 20 {
                return 4;
            }
            // Starting threads is not among it.
            if std::thread::Builder::new().spawn(|| ()).is_ok() {
                return 5;
            }
            0
        });
        assert_eq!(exited(status), Some(0), "status {status:#x}");
    }

    #[test]
    fn a_jailed_thread_leaves_the_process_s_other_threads_as_they_were() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        let status = in_forked_child(|| {
            let jailed = std::thread::spawn(|| enter(Role::Vcpu).is_ok() && open_is_refused());
            if !jailed.join().unwrap_or(false) {
                return 1;
            }
            // This thread (the child's main one) was not jailed.
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() };
            if open_is_refused() || caps_of(me).is_none_or(|[eff, ..]| eff == 0) {
                return 2;
            }
            0
        });
        assert_eq!(exited(status), Some(0), "status {status:#x}");
    }

    #[test]
    fn a_hijacked_vmm_thread_that_execs_or_mounts_ends_the_supervisor() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        for role in [Role::Vcpu, Role::Devices, Role::Fs, Role::Runner] {
            let status = on_jailed_thread_of_a_child(role, exec);
            assert!(died_of_sigsys(status), "{}: exec: {status:#x}", role.name());
            let status = on_jailed_thread_of_a_child(role, || {
                // SAFETY: NUL-terminated strings; the call is meant to die.
                unsafe {
                    libc::mount(
                        c"none".as_ptr(),
                        c"/mnt".as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        std::ptr::null(),
                    )
                };
                1
            });
            assert!(
                died_of_sigsys(status),
                "{}: mount: {status:#x}",
                role.name()
            );
            let status = on_jailed_thread_of_a_child(role, || {
                // SAFETY: setuid(2) with a constant; the call is meant to die.
                unsafe { libc::syscall(libc::SYS_setuid, 0) };
                1
            });
            assert!(
                died_of_sigsys(status),
                "{}: setuid: {status:#x}",
                role.name()
            );
        }
    }

    #[test]
    fn the_devices_and_runner_threads_open_nothing_and_signal_only_their_own() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        for role in [Role::Devices, Role::Runner] {
            let status = on_jailed_thread_of_a_child(role, || {
                if !open_is_refused() || !socket_is_refused() {
                    return 2;
                }
                // SAFETY: kill(2) with signal 0 only checks permission.
                if unsafe { libc::kill(1, 0) } == 0 || errno() != Some(libc::EPERM) {
                    return 3;
                }
                // SAFETY: as above, at its own process.
                if unsafe { libc::kill(libc::getpid(), 0) } != 0 {
                    return 4;
                }
                0
            });
            assert_eq!(exited(status), Some(0), "{}: {status:#x}", role.name());
        }
    }

    #[test]
    fn the_fs_thread_keeps_virtiofsd_s_capabilities_and_takes_only_effective_ids() {
        if !am_root() {
            eprintln!("skipped: dropping the bounding set needs root");
            return;
        }
        let status = on_jailed_thread_of_a_child(Role::Fs, || {
            let kept: caps::CapsHashSet = FS_KEPT.iter().copied().collect();
            if effective() != kept {
                return 1;
            }
            if !socket_is_refused() {
                return 2;
            }
            // A request's credentials: the effective uid and gid only
            // (raw calls: glibc's would make every thread repeat them).
            let setres = |nr, r: i64, e: i64, s: i64| {
                // SAFETY: setres[ug]id(2) with plain integer arguments.
                unsafe { libc::syscall(nr, r, e, s) }
            };
            if setres(libc::SYS_setresgid, -1, 1000, -1) != 0
                || setres(libc::SYS_setresuid, -1, 1000, -1) != 0
            {
                return 3;
            }
            // SAFETY: geteuid/getuid have no preconditions.
            if unsafe { (libc::geteuid(), libc::getuid()) } != (1000, 0) {
                return 4;
            }
            if setres(libc::SYS_setresuid, -1, 0, -1) != 0
                || setres(libc::SYS_setresgid, -1, 0, -1) != 0
            {
                return 5;
            }
            // Back as root, the kept capabilities are effective again.
            if effective() != kept {
                return 6;
            }
            // Never the real or saved ids: refused, not fatal.
            for (r, e, s) in [(1000, 1000, 1000), (1000, -1, -1), (-1, -1, 1000)] {
                if setres(libc::SYS_setresuid, r, e, s) == 0 || errno() != Some(libc::EPERM) {
                    return 7;
                }
            }
            // SAFETY: as above.
            if unsafe { libc::getuid() } != 0 {
                return 8;
            }
            // capset cannot raise what the bounding set no longer holds.
            if caps::raise(
                None,
                caps::CapSet::Effective,
                caps::Capability::CAP_SYS_ADMIN,
            )
            .is_ok()
            {
                return 9;
            }
            // fuse-backend-rs drops CAP_FSETID around a write, and takes it back.
            if caps::drop(None, caps::CapSet::Effective, caps::Capability::CAP_FSETID).is_err()
                || caps::raise(None, caps::CapSet::Effective, caps::Capability::CAP_FSETID).is_err()
            {
                return 10;
            }
            0
        });
        assert_eq!(exited(status), Some(0), "status {status:#x}");
    }
}
