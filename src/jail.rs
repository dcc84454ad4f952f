//! What the jailed processes share (the supervisor once its VM runs, the
//! egress daemon once its sockets are open): a seccomp filter built from
//! an allow-list and a list of calls that end the process, and dropping
//! capabilities. After Firecracker's jailer and Cloud Hypervisor's
//! per-thread filters.

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("cannot drop capabilities: {0}")]
    Capabilities(String),
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("cannot change to user {uid}: {source}")]
    User { uid: u32, source: nix::errno::Errno },
    #[error("cannot build the seccomp filter ({what}): {source}")]
    Seccomp {
        what: String,
        source: libseccomp::error::SeccompError,
    },
}

/// Calls no jailed process needs, and the first things a hijacked one
/// would try (ptrace, mounts, namespace changes, module loading, new
/// privileges): they end it (SIGSYS) rather than fail. Exec is not among
/// them; see [`fatal_with_exec`].
pub const FATAL: &[&str] = &[
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "capset",
    "userfaultfd",
    "open_by_handle_at",
];

/// [`FATAL`] and `execve`, for a process that never runs a program.
pub fn fatal_with_exec() -> Vec<&'static str> {
    std::iter::once("execve")
        .chain(FATAL.iter().copied())
        .collect()
}

/// A seccomp filter, not yet loaded: `allowed` calls pass, `fatal` ones
/// kill the process, any other fails with EPERM, as does another ABI.
/// Signals may go to this process's own threads and to `children`,
/// nowhere else: uid 0 without capabilities could still signal every root
/// process of the host.
pub fn filter(
    allowed: &[&str],
    fatal: &[&str],
    children: &[i32],
) -> Result<ScmpFilterContext, JailError> {
    let err = |what: &str| {
        let what = what.to_string();
        move |source| JailError::Seccomp { what, source }
    };
    let mut f =
        ScmpFilterContext::new(ScmpAction::Errno(libc::EPERM)).map_err(err("new filter"))?;
    f.add_arch(ScmpArch::Native).map_err(err("native arch"))?;
    // Another ABI (x32, i386 through int 0x80) is a way around the list.
    f.set_act_badarch(ScmpAction::KillProcess)
        .map_err(err("bad arch"))?;
    for name in allowed {
        // A name this libseccomp does not know is not callable either.
        let Ok(call) = ScmpSyscall::from_name(name) else {
            continue;
        };
        f.add_rule(ScmpAction::Allow, call).map_err(err(name))?;
    }
    let me = std::process::id() as u64;
    // tgkill(tgid, tid, sig): only to threads of this process.
    let tgkill = ScmpSyscall::from_name("tgkill").map_err(err("tgkill"))?;
    f.add_rule_conditional(
        ScmpAction::Allow,
        tgkill,
        &[ScmpArgCompare::new(0, ScmpCompareOp::Equal, me)],
    )
    .map_err(err("tgkill"))?;
    let kill = ScmpSyscall::from_name("kill").map_err(err("kill"))?;
    for pid in children.iter().copied().chain([me as i32]) {
        let cmp = ScmpArgCompare::new(0, ScmpCompareOp::Equal, pid as u32 as u64);
        f.add_rule_conditional(ScmpAction::Allow, kill, &[cmp])
            .map_err(err("kill"))?;
    }
    for name in fatal {
        let Ok(call) = ScmpSyscall::from_name(name) else {
            continue;
        };
        f.add_rule(ScmpAction::KillProcess, call)
            .map_err(err(name))?;
    }
    Ok(f)
}

/// Drops every capability (bounding, ambient, inheritable, permitted,
/// effective) but `keep`, which stays in all of them (ambient too, so a
/// program it runs has them), and sets no_new_privs.
pub fn drop_capabilities_except(keep: &[caps::Capability]) -> Result<(), JailError> {
    use caps::CapSet;
    let cap_err = |e: caps::errors::CapsError| JailError::Capabilities(e.to_string());
    // The bounding set first: dropping from it needs CAP_SETPCAP, which the
    // effective set still holds.
    for cap in caps::all() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(cap_err)?;
        }
    }
    let kept: caps::CapsHashSet = keep.iter().copied().collect();
    caps::clear(None, CapSet::Ambient).map_err(cap_err)?;
    caps::set(None, CapSet::Effective, &kept).map_err(cap_err)?;
    caps::set(None, CapSet::Permitted, &kept).map_err(cap_err)?;
    caps::set(None, CapSet::Inheritable, &kept).map_err(cap_err)?;
    for cap in keep {
        caps::raise(None, CapSet::Ambient, *cap).map_err(cap_err)?;
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(JailError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Drops every capability and sets no_new_privs.
pub fn drop_capabilities() -> Result<(), JailError> {
    drop_capabilities_except(&[])
}

/// Becomes `uid`:`uid` with no supplementary groups, keeping the permitted
/// capabilities (to be dropped next, all but what is kept).
pub fn become_user(uid: u32) -> Result<(), JailError> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    let err = |source| JailError::User { uid, source };
    // SAFETY: prctl(PR_SET_KEEPCAPS, 1) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
        return Err(err(nix::errno::Errno::last()));
    }
    setgroups(&[]).map_err(err)?;
    let (g, u) = (Gid::from_raw(uid), Uid::from_raw(uid));
    setresgid(g, g, g).map_err(err)?;
    setresuid(u, u, u).map_err(err)?;
    // The change of user cleared the effective set; what is dropped next
    // needs it (CAP_SETPCAP for the bounding set).
    let permitted = caps::read(None, caps::CapSet::Permitted)
        .map_err(|e| JailError::Capabilities(e.to_string()))?;
    caps::set(None, caps::CapSet::Effective, &permitted)
        .map_err(|e| JailError::Capabilities(e.to_string()))?;
    Ok(())
}

/// Runs `f` in a forked child and returns the child's wait status: how the
/// jails' tests try what a jailed process must not do (a fatal call ends
/// the child, not the test).
#[cfg(test)]
pub fn in_forked_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork in a test; the child runs `f` and leaves with _exit,
    // never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = f();
        // SAFETY: _exit ends the child without running atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// Whether the tests run as root (the jails drop capabilities, which
/// needs them).
#[cfg(test)]
pub fn am_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
