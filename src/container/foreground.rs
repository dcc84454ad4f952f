//! Foreground `run` and `exec`: agentvm stays as the parent of the workload,
//! forwards the signals it receives, and exits with the workload's status.

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use signal_hook::consts::signal::*;
use signal_hook::iterator::Signals;

use super::tty::{Relay, RunningRelay};

#[derive(Debug, thiserror::Error)]
pub enum ForegroundError {
    #[error("cannot become a child subreaper: {0}")]
    Subreaper(Errno),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("waiting for process {pid}: {errno}")]
    Wait { pid: i32, errno: Errno },
}

/// libcontainer forks the workload from an intermediate process that exits;
/// as a subreaper we inherit the workload and can wait for it.
pub fn become_subreaper() -> Result<(), ForegroundError> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(ForegroundError::Subreaper(Errno::last()));
    }
    Ok(())
}

/// The exit code a shell (and runc) reports for a wait status.
pub fn exit_code(status: WaitStatus) -> Option<u8> {
    match status {
        WaitStatus::Exited(_, code) => Some(code as u8),
        WaitStatus::Signaled(_, sig, _) => Some(128u8.wrapping_add(sig as i32 as u8)),
        _ => None,
    }
}

const FORWARDED: &[i32] = &[
    SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGCONT, SIGTSTP,
    SIGTTIN, SIGTTOU, SIGWINCH, SIGCHLD,
];

/// Blocks the forwarded signals when dropped.
struct BlockOnDrop;

impl Drop for BlockOnDrop {
    fn drop(&mut self) {
        let mut set = nix::sys::signal::SigSet::empty();
        for &sig in FORWARDED {
            if let Ok(s) = Signal::try_from(sig) {
                set.add(s);
            }
        }
        let _ = nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_BLOCK,
            Some(&set),
            None,
        );
    }
}

/// Waits for `pid`, forwarding signals to it and relaying its terminal if
/// there is one; returns its exit code.
pub fn wait(pid: Pid, relay: Option<Relay>) -> Result<u8, ForegroundError> {
    let mut signals = Signals::new(FORWARDED).map_err(ForegroundError::Signals)?;
    // Dropped before `signals`: while signal-hook removes its handlers it
    // has closed their self-pipe, and a signal arriving then (SIGCHLD from
    // a helper ending with the workload) makes the handler write to it;
    // the EPIPE raises SIGPIPE, which is one of ours, whose handler writes
    // again: a storm that never ends (seen as a `run` spinning after its
    // workload exited). Blocked from then on, they wait: the process ends
    // soon, or has its own use for them.
    let _quiet = BlockOnDrop;
    let relay: Option<RunningRelay> = relay.map(Relay::start);
    if let Some(r) = &relay {
        r.resize();
    }
    let code = 'outer: loop {
        // Reap first: the workload may have exited before the handlers were
        // installed. Other children (orphans we adopted) are reaped too.
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) if status.pid() == Some(pid) => {
                    if let Some(code) = exit_code(status) {
                        break 'outer code;
                    }
                }
                Ok(_) => {}
                Err(Errno::ECHILD) => {
                    return Err(ForegroundError::Wait {
                        pid: pid.as_raw(),
                        errno: Errno::ECHILD,
                    })
                }
                Err(Errno::EINTR) => {}
                Err(errno) => {
                    return Err(ForegroundError::Wait {
                        pid: pid.as_raw(),
                        errno,
                    })
                }
            }
        }
        for sig in signals.wait() {
            match sig {
                SIGCHLD => {}
                SIGWINCH => {
                    if let Some(r) = &relay {
                        r.resize();
                    }
                }
                other => {
                    if let Ok(s) = Signal::try_from(other) {
                        let _ = kill(pid, s);
                    }
                }
            }
        }
    };
    if let Some(r) = relay {
        r.finish();
    }
    Ok(code)
}
