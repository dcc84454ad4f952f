//! `process.consoleSize`, which libcontainer 0.7 ignores: runc sizes the
//! pty before the workload runs.
//!
//! - `create`: the init waits for `start` with the pty slave as its stdin,
//!   so the size is set through `/proc/<pid>/fd/0` right after `build()`.
//! - `exec`: libcontainer runs the process as soon as it is set up, so the
//!   size is set from inside, by the executor, right before its `execve`
//!   (and before the container's seccomp profile is loaded for it).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::{LinuxNamespaceType, Process, Spec};

use super::sys;
use super::workload::Workload;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("process.consoleSize {height}x{width} does not fit a terminal's 65535x65535")]
    TooLarge { height: u64, width: u64 },
    #[error("cannot open the terminal of the container's init ({path}): {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("stdin of the container's init ({0}) is not a terminal")]
    NotATerminal(PathBuf),
    #[error("cannot set the terminal size: {0}")]
    Resize(io::Error),
    #[error("cannot give the terminal of the container's init ({path}) to uid {uid}: {source}")]
    Chown {
        path: PathBuf,
        uid: u32,
        source: io::Error,
    },
}

/// (rows, columns) to apply: only for a terminal with a size given.
pub fn wanted(process: Option<&Process>) -> Result<Option<(u16, u16)>, ConsoleError> {
    let Some(p) = process else {
        return Ok(None);
    };
    if !p.terminal().unwrap_or(false) {
        return Ok(None);
    }
    let Some(size) = p.console_size() else {
        return Ok(None);
    };
    let (height, width) = (size.height(), size.width());
    match (u16::try_from(height), u16::try_from(width)) {
        (Ok(rows), Ok(cols)) => Ok(Some((rows, cols))),
        _ => Err(ConsoleError::TooLarge { height, width }),
    }
}

/// Sets the size of the terminal that is the stdin of the (waiting) init.
pub fn apply_to_init(pid: i32, rows: u16, cols: u16) -> Result<(), ConsoleError> {
    let path = PathBuf::from(format!("/proc/{pid}/fd/0"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| ConsoleError::Open {
            path: path.clone(),
            source,
        })?;
    let fd = OwnedFd::from(file);
    if !nix::unistd::isatty(fd.as_raw_fd()).unwrap_or(false) {
        return Err(ConsoleError::NotATerminal(path));
    }
    apply(fd.as_fd(), rows, cols)
}

/// The host uid of the process's user: through the spec's uid mappings
/// when it has a user namespace; `None` when the uid is not mapped.
fn host_uid(spec: &Spec, uid: u32) -> Option<u32> {
    let linux = spec.linux().as_ref();
    let userns = linux
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::User));
    if !userns {
        return Some(uid);
    }
    linux
        .and_then(|l| l.uid_mappings().as_ref())?
        .iter()
        .find(|m| uid >= m.container_id() && uid - m.container_id() < m.size())
        .and_then(|m| m.host_id().checked_add(uid - m.container_id()))
}

/// Gives the terminal of the (waiting) init to the process's user, as runc
/// does before it switches to that user (the uid only; the group stays
/// devpts' `tty`). libcontainer leaves it root's, so a workload running as
/// uid 1000 could not, for one, `chmod` its own terminal. An unmapped uid
/// leaves it as it is (runc skips it too).
pub fn chown_init_terminal(pid: i32, spec: &Spec) -> Result<(), ConsoleError> {
    let Some(process) = spec.process().as_ref() else {
        return Ok(());
    };
    if !process.terminal().unwrap_or(false) {
        return Ok(());
    }
    let Some(uid) = host_uid(spec, process.user().uid()) else {
        return Ok(());
    };
    let path = PathBuf::from(format!("/proc/{pid}/fd/0"));
    // chown follows the /proc link to the pty slave itself.
    std::os::unix::fs::chown(&path, Some(uid), None).map_err(|source| ConsoleError::Chown {
        path,
        uid,
        source,
    })
}

fn apply(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> Result<(), ConsoleError> {
    sys::set_winsize(fd, rows, cols).map_err(ConsoleError::Resize)
}

/// The executor for `exec`: sizes the terminal on stdin, then hands over to
/// [`Workload`].
#[derive(Clone)]
pub struct SizedExec(pub Workload);

impl Executor for SizedExec {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let size =
            wanted(spec.process().as_ref()).map_err(|e| ExecutorError::Other(e.to_string()))?;
        if let Some((rows, cols)) = size {
            apply(io::stdin().as_fd(), rows, cols)
                .map_err(|e| ExecutorError::Other(e.to_string()))?;
        }
        self.0.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        self.0.validate(spec)
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        self.0.setup_envs(envs)
    }
}

#[cfg(test)]
mod tests {
    use nix::pty::openpty;
    use oci_spec::runtime::{BoxBuilder, ProcessBuilder};

    use super::*;

    fn process(terminal: bool, size: Option<(u64, u64)>) -> Process {
        let mut p = ProcessBuilder::default()
            .terminal(terminal)
            .build()
            .unwrap();
        p.set_console_size(
            size.map(|(h, w)| BoxBuilder::default().height(h).width(w).build().unwrap()),
        );
        p
    }

    #[test]
    fn host_uid_through_the_mappings() {
        let mut v = serde_json::to_value(Spec::default()).unwrap();
        assert_eq!(
            host_uid(&serde_json::from_value(v.clone()).unwrap(), 1000),
            Some(1000)
        );
        v["linux"]["namespaces"] = serde_json::json!([{"type": "user"}]);
        v["linux"]["uidMappings"] = serde_json::json!([
            {"containerID": 0, "hostID": 100000, "size": 65536}
        ]);
        let spec: Spec = serde_json::from_value(v).unwrap();
        assert_eq!(host_uid(&spec, 1000), Some(101000));
        assert_eq!(host_uid(&spec, 70000), None);
    }

    #[test]
    fn size_only_for_a_terminal_with_a_size() {
        assert_eq!(wanted(None).unwrap(), None);
        assert_eq!(wanted(Some(&process(false, Some((24, 80))))).unwrap(), None);
        assert_eq!(wanted(Some(&process(true, None))).unwrap(), None);
        assert_eq!(
            wanted(Some(&process(true, Some((33, 101))))).unwrap(),
            Some((33, 101))
        );
        assert!(wanted(Some(&process(true, Some((70000, 80))))).is_err());
    }

    #[test]
    fn init_terminal_is_resized_through_proc() {
        // Our own stdin stands in for the init's: give this test a pty as
        // fd 0 of a child and resize it through /proc/<child>/fd/0.
        let pty = openpty(None, None).unwrap();
        let child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .stdin(std::process::Stdio::from(pty.slave))
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("skipped: /bin/sleep is not available");
            return;
        };
        let res = apply_to_init(child.id() as i32, 33, 101);
        let size = crate::term::window_size(std::os::fd::AsFd::as_fd(&pty.master));
        let _ = child.kill();
        let _ = child.wait();
        res.unwrap();
        assert_eq!(size, Some((33, 101)));
    }

    #[test]
    fn a_non_terminal_stdin_is_an_error() {
        let child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("skipped: /bin/sleep is not available");
            return;
        };
        let res = apply_to_init(child.id() as i32, 24, 80);
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(res, Err(ConsoleError::NotATerminal(_))), "{res:?}");
    }
}
