//! Thin wrappers over the Linux system calls the container tier's own
//! fix-ups need and that neither `nix` 0.29 nor `std` expose: `openat2`
//! (path resolution confined to a directory), `mount_setattr` (mount
//! flags and propagation on one mount or a whole subtree) and the
//! interface-flags ioctl that brings up loopback.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `struct open_how` (linux/openat2.h); libc's is `non_exhaustive`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `struct mount_attr` (linux/mount.h), version 0 (32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

// Kernel ABI constants from linux/mount.h.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// Resolution confined to the directory fd as if it were `/`: `..` stops at
/// it and absolute symlinks restart from it.
pub const RESOLVE_IN_ROOT: u64 = libc::RESOLVE_IN_ROOT;
/// Resolution that fails (EXDEV) instead of leaving the directory fd.
pub const RESOLVE_BENEATH: u64 = libc::RESOLVE_BENEATH;
pub const RESOLVE_NO_MAGICLINKS: u64 = libc::RESOLVE_NO_MAGICLINKS;
pub const RESOLVE_NO_SYMLINKS: u64 = libc::RESOLVE_NO_SYMLINKS;

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `openat2(dirfd, path, {flags | O_CLOEXEC, resolve})`.
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    path: &Path,
    flags: i32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `c` is a NUL-terminated string and `how` a properly laid out
    // open_how that both outlive the call; the kernel reads them only.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens a directory (O_PATH) outside any confinement.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `/proc/PID/WHAT`: a directory as an O_PATH descriptor (`root`) or a
/// file opened for reading (`ns/mnt`); the path with the error.
pub fn open_proc(
    pid: i32,
    what: &str,
    dir: bool,
) -> Result<OwnedFd, (std::path::PathBuf, io::Error)> {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/{what}"));
    let opened = match dir {
        true => open_dir_path(&path),
        false => std::fs::File::open(&path).map(OwnedFd::from),
    };
    opened.map_err(|e| (path, e))
}

/// `mkdirat(dirfd, name, mode)`; `name` must be a single component.
pub fn mkdirat(dirfd: BorrowedFd<'_>, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let rc = unsafe { libc::mkdirat(dirfd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates the empty regular file `name` (a single component) under
/// `dirfd` without following a symlink there; an existing entry is left.
pub fn create_file_at(dirfd: BorrowedFd<'_>, name: &Path, mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EEXIST) {
            Ok(())
        } else {
            Err(e)
        };
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: chown what `fd` refers to.
pub fn fchown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: the empty string literal is NUL-terminated and static.
    let rc = unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets mount attributes and/or propagation on the mount `fd` is the root
/// of (EINVAL when it is not the root of a mount), or on its whole subtree
/// when `recursive`. `propagation` is 0 or one of MS_PRIVATE, MS_SHARED,
/// MS_SLAVE, MS_UNBINDABLE. Attributes are only ever added here.
pub fn mount_setattr(
    fd: BorrowedFd<'_>,
    attr_set: u64,
    propagation: u64,
    recursive: bool,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    // SAFETY: the path is a static NUL-terminated empty string and `attr` a
    // properly laid out mount_attr that outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setns(fd, CLONE_NEWNS)` for the calling thread, after giving the thread
/// its own filesystem context (a thread sharing it cannot switch mount
/// namespaces). Only for a dedicated thread that exits afterwards.
pub fn enter_mount_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: unshare(CLONE_FS) takes no pointers and affects only the
    // calling thread's fs context.
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setns takes a descriptor we borrow for the call only.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setns(fd, CLONE_NEWNET)` for the calling thread. Only for a dedicated
/// thread that exits afterwards.
pub fn enter_network_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a descriptor we borrow for the call only.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `ip link set lo up` in the calling thread's network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) takes no pointers; the result is checked below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that we now own.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq we pass.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we pass.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setns(fd, CLONE_NEWCGROUP)` for the calling thread: what it mounts of
/// cgroupfs from then on has that namespace's root. Only for a dedicated
/// thread that exits afterwards.
pub fn enter_cgroup_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns takes a descriptor we borrow for the call only.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWCGROUP) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's file system uid and gid (`setfsuid`/`setfsgid`,
/// which change only the calling thread): what it creates is theirs. Only
/// for a dedicated thread that exits afterwards.
pub fn set_thread_fs_ids(uid: u32, gid: u32) {
    // SAFETY: the raw system calls take plain integers and change only
    // this thread's credentials. They return the previous id, never an
    // error.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
    }
}

// linux/mount.h: fsconfig commands, fsmount and move_mount flags.
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// A new, detached mount of file system `fstype` from `source` (fsopen,
/// fsconfig, fsmount) with `options`, each a flag (`net_cls`) or a `key=value`
/// string, one per fsconfig call (the new mount API splits nothing on
/// commas), and the mount attributes `attrs` (MOUNT_ATTR_*).
pub fn new_mount(
    fstype: &str,
    source: &str,
    options: &[String],
    attrs: u64,
) -> io::Result<OwnedFd> {
    let c = |s: &str| {
        CString::new(s)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "option contains a NUL byte"))
    };
    let fstype = c(fstype)?;
    // SAFETY: `fstype` is NUL-terminated and outlives the call.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), 1 as libc::c_uint) };
    if fs < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsopen returned a new descriptor that nothing else owns.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let config = |cmd: libc::c_uint, key: Option<&CString>, value: Option<&CString>| {
        let ptr = |v: Option<&CString>| v.map_or(std::ptr::null(), |v| v.as_ptr());
        // SAFETY: key and value are NUL-terminated strings (or null, as the
        // command allows) that outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                cmd,
                ptr(key),
                ptr(value),
                0 as libc::c_int,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    config(FSCONFIG_SET_STRING, Some(&c("source")?), Some(&c(source)?))?;
    for opt in options {
        match opt.split_once('=') {
            Some((k, v)) => config(FSCONFIG_SET_STRING, Some(&c(k)?), Some(&c(v)?))?,
            None => config(FSCONFIG_SET_FLAG, Some(&c(opt)?), None)?,
        }
    }
    config(FSCONFIG_CMD_CREATE, None, None)?;
    // SAFETY: fsmount takes the configured context's descriptor only.
    let m = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs as libc::c_uint,
        )
    };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsmount returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(m as i32) })
}

/// Attaches the detached mount `mount` on the directory `target` (an
/// O_PATH descriptor) in the calling thread's mount namespace.
pub fn move_mount_onto(mount: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: both paths are the static empty string; the descriptors are
    // borrowed for the call only.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached clone of the mount tree at `path` (`open_tree` with
/// OPEN_TREE_CLONE; with its submounts when `recursive`), resolved and
/// permission-checked as the caller.
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `fchdir(fd)`: for a thread with its own fs context only.
pub fn fchdir(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fchdir takes a descriptor we borrow for the call only.
    if unsafe { libc::fchdir(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `symlinkat(target, dirfd, name)`; `name` must be a single component.
pub fn symlinkat(target: &Path, dirfd: BorrowedFd<'_>, name: &Path) -> io::Result<()> {
    let t = cstring(target)?;
    let n = cstring(name)?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let rc = unsafe { libc::symlinkat(t.as_ptr(), dirfd.as_raw_fd(), n.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub use crate::term::set_window_size as set_winsize;

/// Most descriptors [`recv_with_fds`] takes from one message; further ones
/// are closed by the kernel (`MSG_CTRUNC`).
pub const MAX_PASSED_FDS: usize = 8;

/// One `recvmsg(2)` on `sock` into `buf`: the bytes read and the
/// descriptors passed with them (`SCM_RIGHTS`, close-on-exec), owned.
pub fn recv_with_fds(sock: BorrowedFd, buf: &mut [u8]) -> nix::Result<(usize, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; MAX_PASSED_FDS]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: SCM_RIGHTS just installed these descriptors in our
            // table; nothing else owns them.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn openat2_in_root_clamps_dotdot_and_absolute_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("abs")).unwrap();
        let rootfd = open_dir_path(&root).unwrap();
        // `..` at the root stays at the root.
        let fd = openat2(
            rootfd.as_fd(),
            Path::new("../../etc"),
            libc::O_PATH,
            RESOLVE_IN_ROOT,
        )
        .unwrap();
        let a = nix::sys::stat::fstat(fd.as_raw_fd()).unwrap();
        let b = nix::sys::stat::stat(&root.join("etc")).unwrap();
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        // An absolute symlink resolves inside the root.
        let fd = openat2(
            rootfd.as_fd(),
            Path::new("abs"),
            libc::O_PATH,
            RESOLVE_IN_ROOT,
        )
        .unwrap();
        let a = nix::sys::stat::fstat(fd.as_raw_fd()).unwrap();
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        // RESOLVE_BENEATH refuses to leave instead.
        let err = openat2(
            rootfd.as_fd(),
            Path::new("abs"),
            libc::O_PATH,
            RESOLVE_BENEATH,
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    }
}
