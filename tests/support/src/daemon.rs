//! Background daemons (dockerd, containerd) that outlive one test binary.
//!
//! A daemon is started once, in its own process group so that a test run
//! interrupted with ^C leaves it alone, with its output appended to a log
//! file. Its pid file tells later test binaries that it is already up.
//! Setup is serialised across processes with an exclusive `flock`.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{log_tail, wait_for};

/// An exclusive lock on a file, released on drop.
pub struct Lock {
    _file: File,
}

/// Takes an exclusive, cross-process lock on `path` (created if missing).
pub fn lock(path: &Path) -> Lock {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open lock file {}: {e}", path.display()));
    // SAFETY: the fd is valid for the lifetime of `file`; flock only
    // changes the lock state of that open file description.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Lock { _file: file }
}

/// The pid in `pid_file` if that process is alive and runs `program`.
pub fn running_pid(pid_file: &Path, program: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    is_live(pid, program).then_some(pid)
}

/// Whether `pid` is a live (not zombie) process named `program`.
pub fn is_live(pid: i32, program: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": the state follows the last ')'.
    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
    stat.contains(&format!("({program})")) && !state.starts_with('Z')
}

/// A daemon to start: its command line, log and readiness check.
pub struct Spec<'a> {
    pub name: &'a str,
    pub command: Command,
    pub log: PathBuf,
    /// Returns true once the daemon answers on its socket.
    pub ready: &'a dyn Fn() -> bool,
    pub ready_timeout_secs: u64,
}

/// Starts the daemon in the background and waits until it is ready.
/// Panics with the tail of its log if it exits or never becomes ready.
pub fn start(mut spec: Spec<'_>) {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", spec.log.display()));
    let log_err = log.try_clone().expect("dup log fd");
    let mut child = spec
        .command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", spec.name));
    let outcome = wait_for(spec.ready_timeout_secs, || {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(Err(format!("{} exited early with {status}", spec.name)));
        }
        (spec.ready)().then_some(Ok(()))
    });
    match outcome {
        Some(Ok(())) => {}
        Some(Err(why)) => panic!("{why}\n{}", log_tail(&spec.log, 40)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} did not become ready within {} s\n{}",
                spec.name,
                spec.ready_timeout_secs,
                log_tail(&spec.log, 40)
            );
        }
    }
    // The daemon is meant to outlive this process; it is reaped by init
    // once the test binary exits. Dropping `child` does not kill it.
    drop(child);
}

/// Stops the daemon `pid` (SIGTERM, then SIGKILL after 30 s) and waits
/// until it is gone.
pub fn stop(pid: i32, program: &str, log: &Path) {
    let alive = || is_live(pid, program);
    // SAFETY: kill only sends a signal, to a live `program` whose pid the
    // caller read from that daemon's own pid file or command line.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if wait_for(30, || (!alive()).then_some(())).is_some() {
        return;
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        wait_for(10, || (!alive()).then_some(())).is_some(),
        "{program} (pid {pid}) does not stop\n{}",
        log_tail(log, 40)
    );
}

/// Writes `content` to `path` unless it is already there; true if changed.
pub fn write_if_changed(path: &Path, content: &str) -> bool {
    if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
        return false;
    }
    std::fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    true
}
