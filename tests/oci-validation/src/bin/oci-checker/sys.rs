//! Checks that go through the kernel: namespaces, syscalls under seccomp and
//! capabilities, cgroup interface files.

use std::path::{Path, PathBuf};

use oci_validation::expect::{Check, Probe, Relation};

use crate::{expect_eq, fs, mismatch, Failure, Verdict};

pub fn run(check: &Check) -> Verdict {
    match check {
        Check::Namespace {
            ns,
            relation,
            reference,
        } => namespace(ns, *relation, reference),
        Check::Syscall { probe, errno } => {
            let got = do_probe(probe).err();
            expect_eq(&format!("{probe:?} errno"), got, *errno)
        }
        Check::KilledBy { probe, signal } => killed_by(probe, *signal),
        Check::Cgroup {
            v1_controller,
            v1_file,
            v1_value,
            v2_file,
            v2_value,
        } => cgroup(v1_controller, v1_file, v1_value, v2_file, v2_value),
        Check::CgroupNsRoot => {
            let text = std::fs::read_to_string("/proc/self/cgroup")
                .map_err(|e| Failure::Mismatch(format!("/proc/self/cgroup: {e}")))?;
            let bad: Vec<&str> = text
                .lines()
                .filter(|l| l.splitn(3, ':').nth(2) != Some("/"))
                .collect();
            match bad.is_empty() {
                true => Ok(()),
                false => mismatch!("not at the cgroup namespace root: {bad:?}"),
            }
        }
        _ => mismatch!("check routed to the wrong module"),
    }
}

fn ns_link(path: &str) -> Result<String, Failure> {
    std::fs::read_link(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| Failure::Mismatch(format!("readlink {path}: {e}")))
}

fn namespace(ns: &str, relation: Relation, reference: &str) -> Verdict {
    let own = format!("/proc/self/ns/{ns}");
    if !Path::new(&own).exists() {
        return Err(Failure::Skip(format!(
            "{own} does not exist on this kernel"
        )));
    }
    let got = ns_link(&own)?;
    let reference = if reference.starts_with('/') {
        ns_link(reference)?
    } else {
        reference.to_string()
    };
    match (relation, got == reference) {
        (Relation::Same, true) | (Relation::Differs, false) => Ok(()),
        (Relation::Same, false) => mismatch!("{ns} is {got}, want {reference}"),
        (Relation::Differs, true) => mismatch!("{ns} is {got}, the same as the reference"),
    }
}

/// Makes the probe's syscall; `Err(errno)` when it fails.
fn do_probe(probe: &Probe) -> Result<(), i32> {
    use nix::unistd::{Gid, Pid, Uid};
    let r = match probe {
        Probe::Mkdir { path } => {
            let r = nix::unistd::mkdir(
                path.as_str(),
                nix::sys::stat::Mode::from_bits_truncate(0o755),
            );
            if r.is_ok() {
                // The probe only tests permission; the directory is not needed.
                let _ = std::fs::remove_dir(path);
            }
            r
        }
        Probe::Getpgid { pid } => nix::unistd::getpgid(Some(Pid::from_raw(*pid))).map(drop),
        Probe::Chown { path, uid, gid } => nix::unistd::chown(
            path.as_str(),
            Some(Uid::from_raw(*uid)),
            Some(Gid::from_raw(*gid)),
        ),
        Probe::Sethostname { name } => nix::unistd::sethostname(name),
        Probe::BindTcp { port } => return bind_tcp(*port),
        Probe::WriteFile { path } => {
            return std::fs::write(path, b"x").map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        }
        Probe::Getppid => {
            // SAFETY: getppid takes no arguments; the raw syscall is used so
            // that an errno from seccomp is seen (libc's wrapper cannot fail).
            let rc = unsafe { libc::syscall(libc::SYS_getppid) };
            nix::errno::Errno::result(rc).map(drop)
        }
        Probe::Getsid { pid } => nix::unistd::getsid(Some(Pid::from_raw(*pid))).map(drop),
        Probe::AddKey => {
            // SAFETY: add_key with null pointers reads no memory of ours:
            // the kernel fails it with EFAULT (or a filter answers first).
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    std::ptr::null::<libc::c_char>(),
                    std::ptr::null::<libc::c_char>(),
                    std::ptr::null::<libc::c_void>(),
                    0usize,
                    0i32,
                )
            };
            nix::errno::Errno::result(rc).map(drop)
        }
        Probe::Faccessat2 => {
            // SAFETY: the path is a NUL-terminated literal that outlives
            // the call; faccessat2 only reads it.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_faccessat2,
                    libc::AT_FDCWD,
                    c"/".as_ptr(),
                    libc::F_OK,
                    0i32,
                )
            };
            nix::errno::Errno::result(rc).map(drop)
        }
    };
    r.map_err(|e| e as i32)
}

fn bind_tcp(port: u16) -> Result<(), i32> {
    match std::net::TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

fn killed_by(probe: &Probe, signal: i32) -> Verdict {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the checker is single-threaded, so the child may run any code.
    match unsafe { fork() } {
        Err(e) => mismatch!("fork: {e}"),
        Ok(ForkResult::Child) => {
            let code = match do_probe(probe) {
                Ok(()) => 0,
                Err(e) => 100 + (e & 0x7f),
            };
            // SAFETY: _exit ends the child without running the parent's atexit work.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Signaled(_, sig, _)) => expect_eq("signal", sig as i32, signal),
            Ok(WaitStatus::Exited(_, 0)) => mismatch!("probe returned normally"),
            Ok(WaitStatus::Exited(_, c)) => mismatch!("probe failed with errno {}", c - 100),
            Ok(other) => mismatch!("child ended as {other:?}"),
            Err(e) => mismatch!("waitpid: {e}"),
        },
    }
}

/// The directory of this process's cgroup for a v1 controller (`Some`) or
/// the v2 hierarchy (`None`), as this process's mounts show it.
fn cgroup_dir(controller: Option<&str>) -> Result<Option<PathBuf>, Failure> {
    let text = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| Failure::Mismatch(format!("/proc/self/cgroup: {e}")))?;
    let own = text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    });
    let Some(own) = own else { return Ok(None) };
    for m in fs::mounts()?.iter().rev() {
        let hit = match controller {
            Some(c) => m.fstype == "cgroup" && m.super_options.iter().any(|o| o == c),
            None => m.fstype == "cgroup2",
        };
        if !hit {
            continue;
        }
        // The mount shows the hierarchy from m.root down; our cgroup must be
        // under it to be visible.
        let rel = if m.root == "/" {
            Some(own.as_str())
        } else {
            own.strip_prefix(&m.root)
                .filter(|r| r.is_empty() || r.starts_with('/'))
        };
        if let Some(rel) = rel {
            let dir = Path::new(&m.target).join(rel.trim_start_matches('/'));
            if dir.is_dir() {
                return Ok(Some(dir));
            }
        }
    }
    Ok(None)
}

fn cgroup(ctrl: &str, v1_file: &str, v1_value: &str, v2_file: &str, v2_value: &str) -> Verdict {
    let (file, want) = match cgroup_dir(Some(ctrl))? {
        Some(d) => (d.join(v1_file), v1_value),
        None => match cgroup_dir(None)? {
            Some(d) => (d.join(v2_file), v2_value),
            None => {
                return mismatch!("neither a cgroup v1 {ctrl} hierarchy nor cgroup2 is visible")
            }
        },
    };
    let got = std::fs::read_to_string(&file)
        .map_err(|e| Failure::Mismatch(format!("read {}: {e}", file.display())))?;
    expect_eq(&file.display().to_string(), got.trim(), want)
}
