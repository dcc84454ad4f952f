//! Terminals for foreground `run -t`/`exec -t`: agentvm takes the pty master
//! through its own console socket and relays it to its stdio, as runc does.

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use nix::cmsg_space;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::sys::termios::{self, SetArg, Termios};

#[derive(Debug, thiserror::Error)]
pub enum TtyError {
    #[error("cannot listen on console socket {path}: {source}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no pty master arrived on the console socket: {0}")]
    Receive(String),
}

/// A console socket of our own, removed when dropped.
pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    pub fn bind(dir: &Path, name: &str) -> Result<ConsoleSocket, TtyError> {
        let path = dir.join(format!(".console-{name}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|source| TtyError::Listen {
            path: path.clone(),
            source,
        })?;
        Ok(ConsoleSocket { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts the runtime's connection and takes the master fd it sends.
    pub fn receive_master(&self) -> Result<OwnedFd, TtyError> {
        let (stream, _) = self
            .listener
            .accept()
            .map_err(|e| TtyError::Receive(e.to_string()))?;
        let mut buf = [0u8; 4096];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = cmsg_space!([RawFd; 1]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| TtyError::Receive(e.to_string()))?;
        let cmsgs = msg.cmsgs().map_err(|e| TtyError::Receive(e.to_string()))?;
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                if let Some(&fd) = fds.first() {
                    // Close any extra descriptors a confused sender passed.
                    for &extra in &fds[1..] {
                        // SAFETY: the kernel just installed these fds for us.
                        drop(unsafe { OwnedFd::from_raw_fd(extra) });
                    }
                    // SAFETY: SCM_RIGHTS gave us a fresh descriptor we own.
                    return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        Err(TtyError::Receive(
            "message carried no file descriptor".into(),
        ))
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Relays a pty master to our stdin/stdout until the workload closes it.
pub struct Relay {
    master: std::fs::File,
    saved: Option<Termios>,
}

pub struct RunningRelay {
    master: std::fs::File,
    saved: Option<Termios>,
    output: JoinHandle<()>,
}

impl Relay {
    pub fn new(master: OwnedFd) -> Relay {
        Relay {
            master: std::fs::File::from(master),
            saved: None,
        }
    }

    pub fn start(mut self) -> RunningRelay {
        let stdin = std::io::stdin();
        // Our terminal goes raw so keys reach the container's line discipline
        // unprocessed; restored in finish().
        if let Ok(t) = termios::tcgetattr(stdin.as_fd()) {
            let mut raw = t.clone();
            termios::cfmakeraw(&mut raw);
            if termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).is_ok() {
                self.saved = Some(t);
            }
        }
        if let Ok(mut to_master) = self.master.try_clone() {
            std::thread::spawn(move || {
                let mut input = std::io::stdin();
                let mut buf = [0u8; 8192];
                loop {
                    match input.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to_master.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
        let from_master = self.master.try_clone();
        let output = std::thread::spawn(move || {
            let Ok(mut from_master) = from_master else {
                return;
            };
            let mut out = std::io::stdout();
            let mut buf = [0u8; 8192];
            loop {
                match from_master.read(&mut buf) {
                    // EIO: every slave descriptor is closed.
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        RunningRelay {
            master: self.master,
            saved: self.saved,
            output,
        }
    }
}

impl RunningRelay {
    /// Copies our terminal's window size to the container's.
    pub fn resize(&self) {
        if let Some((rows, cols)) = crate::term::window_size(std::io::stdin().as_fd()) {
            let _ = crate::term::set_window_size(self.master.as_fd(), rows, cols);
        }
    }

    /// Drains the workload's output, then restores our terminal.
    pub fn finish(self) {
        let _ = self.output.join();
        if let Some(t) = self.saved {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &t);
        }
    }
}
