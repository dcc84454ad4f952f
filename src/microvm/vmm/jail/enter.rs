//! The child's side of the jail: between fork and exec, mount, IPC and UTS
//! namespaces of its own, the mount namespace's root the sealed tree (`pivot_root`, then the
//! old root detached), every capability dropped, its own uid and gid, and
//! `no_new_privs`. Only system calls run here, on values prepared before
//! the fork: nothing allocates or takes a lock.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use super::{Identity, JailError};

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The highest capability number this kernel knows.
fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Makes `cmd`'s child enter the jail rooted at `root` (a sealed
/// [`super::Tree`]) as `id` just before it execs; the program's path is
/// then resolved inside the jail. Registered before any step that must
/// follow the change of user (`PR_SET_PDEATHSIG`, which a change of uid
/// clears, is set after it: see `vmm::die_with_parent`).
pub fn install(cmd: &mut Command, root: &Path, id: Identity) -> Result<(), JailError> {
    let root_c = CString::new(root.as_os_str().as_bytes()).map_err(|_| JailError::Io {
        what: "jail root",
        path: root.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let last_cap = last_capability();
    // SAFETY: the closure runs in the child between fork and exec. It only
    // makes system calls (unshare, mount, chdir, pivot_root, umount2,
    // prctl, setgroups, setres[ug]id, capset) on a CString and plain
    // values captured before the fork; none allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || enter(&root_c, id, last_cap));
    }
    Ok(())
}

/// Runs in the forked child only.
fn enter(root: &CString, id: Identity, last_cap: u32) -> io::Result<()> {
    let slash = c"/";
    let dot = c".";
    // SAFETY: every call below is a system call with NUL-terminated
    // strings that outlive it, null pointers where the call takes none, a
    // capability header and data array on this stack frame, and plain
    // integers; no memory is handed to the kernel to keep.
    unsafe {
        // Its own mount namespace, and IPC and UTS ones it needs nothing
        // from (guest memory is a memfd): no System V object or message
        // queue of the host's to reach.
        check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS).into())?;
        // Private already (the supervisor's namespace is); said again so
        // that nothing done below can propagate anywhere.
        check(
            libc::mount(
                std::ptr::null(),
                slash.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
            .into(),
        )?;
        check(libc::chdir(root.as_ptr()).into())?;
        // pivot_root(".", "."): the old root ends up stacked on the new one
        // and is then detached with everything under it — the host's tree
        // is gone from this namespace, not merely out of reach as with
        // chroot.
        check(libc::syscall(
            libc::SYS_pivot_root,
            dot.as_ptr(),
            dot.as_ptr(),
        ))?;
        check(libc::umount2(dot.as_ptr(), libc::MNT_DETACH).into())?;
        check(libc::chdir(slash.as_ptr()).into())?;
        // No capability can come back: the bounding set is emptied while
        // CAP_SETPCAP is still held, the ambient set cleared.
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
            .into(),
        )?;
        for cap in 0..=last_cap {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
            }
        }
        check(libc::setgroups(0, std::ptr::null()).into())?;
        check(libc::setresgid(id.gid, id.gid, id.gid).into())?;
        // From root to a uid that is not: the permitted, effective and
        // ambient sets are cleared by the kernel; the inheritable one is
        // cleared below.
        check(libc::setresuid(id.uid, id.uid, id.uid).into())?;
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        ))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microvm::vmm::jail::Tree;
    use std::os::unix::fs::PermissionsExt;

    /// The checks of a child that entered a jail holding `/vm/file` (a copy
    /// of the marker's text) and `/dev/null`; 0 when all hold.
    fn jailed_child_checks(dir: &Path, marker: &Path, text: &str, id: Identity) -> i32 {
        // The tree's mounts stay in this child's own namespace.
        if nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).is_err() {
            return 10;
        }
        let private = nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE;
        if nix::mount::mount(None::<&str>, "/", None::<&str>, private, None::<&str>).is_err() {
            return 11;
        }
        let built = (|| {
            let mut tree = Tree::create(&dir.join("root"))?;
            tree.device(Path::new("/dev/null"), 0o666, None)?;
            tree.bind_as(marker, Path::new("/vm/file"))?;
            tree.seal()
        })();
        let Ok(root) = built else {
            return 12;
        };
        let Ok(root_c) = CString::new(root.as_os_str().as_bytes()) else {
            return 13;
        };
        if enter(&root_c, id, last_capability()).is_err() {
            return 14;
        }
        let mut names: Vec<String> = match std::fs::read_dir("/") {
            Ok(d) => d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => return 15,
        };
        names.sort();
        if names != ["dev", "vm"] {
            return 16;
        }
        if std::fs::read_to_string("/vm/file").ok().as_deref() != Some(text) {
            return 17;
        }
        // The host's files are gone, not hidden: the marker's own path, the
        // shadow file, /proc.
        if marker.exists() || Path::new("/etc/shadow").exists() || Path::new("/proc/self").exists()
        {
            return 18;
        }
        // Nothing in the tree can be changed, nothing added.
        if std::fs::write("/vm/file", "changed").is_ok() || std::fs::write("/new", "x").is_ok() {
            return 19;
        }
        if std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .is_err()
        {
            return 20;
        }
        // SAFETY: getters without arguments.
        let ids = unsafe {
            (
                libc::getuid(),
                libc::geteuid(),
                libc::getgid(),
                libc::getegid(),
            )
        };
        if ids != (id.uid, id.uid, id.gid, id.gid) {
            return 21;
        }
        // SAFETY: getgroups(0, NULL) only counts the groups.
        if unsafe { libc::getgroups(0, std::ptr::null_mut()) } != 0 {
            return 22;
        }
        for set in [
            caps::CapSet::Effective,
            caps::CapSet::Permitted,
            caps::CapSet::Inheritable,
            caps::CapSet::Ambient,
            caps::CapSet::Bounding,
        ] {
            if caps::read(None, set).map_or(true, |s| !s.is_empty()) {
                return 23;
            }
        }
        // SAFETY: prctl(PR_GET_NO_NEW_PRIVS) takes no pointers.
        if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } != 1 {
            return 24;
        }
        0
    }

    #[test]
    fn a_jailed_child_sees_only_its_tree_as_its_own_user() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounts, pivot_root and a change of user need root");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("host-marker");
        let text = format!("marker-{}", std::process::id());
        std::fs::write(&marker, &text).expect("marker");
        std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let id = Identity::for_supervisor(crate::config::DEFAULT_VMM_UID_BASE, std::process::id());
        // SAFETY: fork in a test; the child runs the checks (system calls
        // and allocations glibc makes safe after fork) and leaves with
        // _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = jailed_child_checks(dir.path(), &marker, &text, id);
            // SAFETY: _exit ends the child without running atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the jailed child failed check {}",
            libc::WEXITSTATUS(status)
        );
        // The test's own namespace holds no trace of the tree.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mounts.contains(dir.path().to_str().expect("utf-8")),
            "{mounts}"
        );
    }
}
