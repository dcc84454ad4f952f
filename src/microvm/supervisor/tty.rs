//! A terminal on the host side of a microVM container: the pty master goes
//! to the caller's console socket (as runc does), the supervisor relays the
//! slave to the guest, whose own pty gives the workload its terminal.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::pty::openpty;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use nix::sys::termios::{self, SetArg};

#[derive(Debug, thiserror::Error)]
pub enum TtyError {
    #[error("cannot open a pty: {0}")]
    Open(nix::errno::Errno),
    #[error("console socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot send the pty master: {0}")]
    Send(nix::errno::Errno),
}

pub struct HostPty {
    slave: OwnedFd,
}

impl HostPty {
    pub fn open_and_send(console_socket: &Path) -> Result<HostPty, TtyError> {
        let pty = openpty(None, None).map_err(TtyError::Open)?;
        // Transparent: line editing and echo happen on the guest's pty.
        if let Ok(mut t) = termios::tcgetattr(pty.slave.as_fd()) {
            termios::cfmakeraw(&mut t);
            let _ = termios::tcsetattr(pty.slave.as_fd(), SetArg::TCSANOW, &t);
        }
        let sock = UnixStream::connect(console_socket).map_err(|source| TtyError::Socket {
            path: console_socket.display().to_string(),
            source,
        })?;
        let name = b"/dev/ptmx";
        let fds = [pty.master.as_raw_fd()];
        sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(name)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(TtyError::Send)?;
        drop(pty.master);
        Ok(HostPty { slave: pty.slave })
    }

    /// Makes the slave our controlling terminal, so resizes of the master
    /// arrive as SIGWINCH. Only a session leader without a terminal can;
    /// otherwise resizes are simply not seen.
    pub fn take_as_controlling(&self) {
        // SAFETY: TIOCSCTTY takes an int argument, no memory.
        let rc = unsafe { libc::ioctl(self.slave.as_raw_fd(), libc::TIOCSCTTY, 0) };
        if rc != 0 {
            tracing::debug!(
                "cannot take the pty as controlling terminal: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    pub fn writer(&self) -> std::io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.slave.try_clone()?))
    }

    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.slave.try_clone()?))
    }

    /// Rows and columns the caller set on the master.
    pub fn size(&self) -> Option<(u16, u16)> {
        window_size(self.slave.as_fd())
    }
}

pub use crate::term::window_size;
