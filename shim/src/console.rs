//! Terminals: a process with `terminal: true` gets a pty whose master
//! agentvm sends over a console socket (`--console-socket`, runc's
//! protocol: one message carrying the fd as `SCM_RIGHTS`). The shim keeps
//! the master, copies it to the stdout FIFO and the stdin FIFO into it,
//! and resizes it (`TIOCSWINSZ`) when containerd asks.
//!
//! In the container tier the master is the container's own pty. In the
//! microvm tier it is the host side of the supervisor's (init) or the
//! exec relay's pty: the relay, whose controlling terminal it is, gets
//! SIGWINCH on a resize and passes the size on to the guest's pty.

use std::fs::{DirBuilder, File};
use std::io::{ErrorKind, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use crate::stdio::{self, StdioError};

/// How long agentvm's message with the master may take to arrive once
/// the command that was given the socket has returned (it is sent before
/// that, so it is normally queued already).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot make the console socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agentvm sent no terminal to the console socket {path} within {} s", RECEIVE_TIMEOUT.as_secs())]
    NotSent { path: PathBuf },
    #[error("cannot receive the terminal from the console socket {path}: {detail}")]
    Receive { path: PathBuf, detail: String },
    #[error("the terminal size {width}x{height} is out of range")]
    Size { width: u32, height: u32 },
    #[error("cannot resize the terminal: {0}")]
    Resize(#[source] std::io::Error),
    #[error("cannot use the terminal's master: {0}")]
    Master(#[source] std::io::Error),
    #[error(transparent)]
    Stdio(#[from] StdioError),
}

/// A listening console socket in a directory of its own (removed on
/// drop): runc's shim does the same, since a bundle path is too long for
/// a unix socket's address.
pub struct ConsoleSocket {
    dir: PathBuf,
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    pub fn new() -> Result<ConsoleSocket, ConsoleError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("agentvm-shim-{}-{n}", std::process::id()));
        let path = dir.join("pty.sock");
        let socket_err = |source| ConsoleError::Socket {
            path: path.clone(),
            source,
        };
        // A stale directory of a dead shim with our pid: start afresh.
        let _ = std::fs::remove_dir_all(&dir);
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(socket_err)?;
        let listener = UnixListener::bind(&path).map_err(socket_err)?;
        listener.set_nonblocking(true).map_err(socket_err)?;
        Ok(ConsoleSocket {
            dir,
            path,
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pty master agentvm sent, read once the command that was given
    /// the socket has returned successfully.
    pub fn receive(&self) -> Result<OwnedFd, ConsoleError> {
        let deadline = Instant::now() + RECEIVE_TIMEOUT;
        let stream = loop {
            match self.listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Err(ConsoleError::NotSent {
                        path: self.path.clone(),
                    })
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.receive_error(e.to_string())),
            }
        };
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(RECEIVE_TIMEOUT)))
            .map_err(|e| self.receive_error(e.to_string()))?;
        // The payload is the pty's name, which is not needed.
        let mut name = [0u8; 4096];
        let mut iov = [IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| self.receive_error(e.to_string()))?;
        let mut received: Vec<OwnedFd> = Vec::new();
        for cmsg in msg.cmsgs().map_err(|e| self.receive_error(e.to_string()))? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // SAFETY: the kernel has just installed `fd` in our
                    // descriptor table for this message; nothing else
                    // owns it.
                    received.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        // Exactly one descriptor is the protocol; any extra is closed.
        let mut fds = received.into_iter();
        fds.next()
            .ok_or_else(|| self.receive_error("the message carried no descriptor".into()))
    }

    fn receive_error(&self, detail: String) -> ConsoleError {
        ConsoleError::Receive {
            path: self.path.clone(),
            detail,
        }
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process's terminal as the shim holds it: the master, and the thread
/// that copies its output to the stdout FIFO.
pub struct Console {
    master: File,
    output: Mutex<Option<JoinHandle<()>>>,
}

impl Console {
    /// Takes `master` and starts copying: its output to the FIFO `stdout`
    /// (discarded when there is none, so the process never blocks on a
    /// full pty), the FIFO `stdin` (if any) into it.
    pub fn start(master: OwnedFd, stdin: &str, stdout: &str) -> Result<Arc<Console>, ConsoleError> {
        let master = File::from(master);
        let mut reader = master.try_clone().map_err(ConsoleError::Master)?;
        let mut sink = if stdout.is_empty() {
            None
        } else {
            Some(stdio::output_file(stdout, "stdout")?)
        };
        if !stdin.is_empty() {
            let writer = master.try_clone().map_err(ConsoleError::Master)?;
            copy_stdin(PathBuf::from(stdin), writer);
        }
        let output = std::thread::spawn(move || {
            let mut buf = [0u8; 32 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let (Some(out), Some(chunk)) = (sink.as_mut(), buf.get(..n)) else {
                            continue;
                        };
                        // A client that went away: keep draining.
                        if out.write_all(chunk).is_err() {
                            sink = None;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // EIO: every slave descriptor is closed, i.e. the
                    // process (and whatever shared its terminal) is gone.
                    Err(_) => break,
                }
            }
            // Dropping `sink` closes our end of the FIFO: the client
            // reads end of file.
        });
        Ok(Arc::new(Console {
            master,
            output: Mutex::new(Some(output)),
        }))
    }

    /// Sets the terminal's size; the kernel sends SIGWINCH to the
    /// terminal's foreground process group.
    pub fn resize(&self, width: u32, height: u32) -> Result<(), ConsoleError> {
        let (Ok(cols), Ok(rows)) = (u16::try_from(width), u16::try_from(height)) else {
            return Err(ConsoleError::Size { width, height });
        };
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: the master is open for the life of `self`, and
        // TIOCSWINSZ reads one `winsize` from the valid pointer given.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc != 0 {
            return Err(ConsoleError::Resize(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Waits (at most `limit`) until the output has been copied to the
    /// end, so that a client that sees the exit has all of it.
    pub fn wait_output(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut output = self
                .output
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match output.as_ref() {
                None => return,
                Some(handle) if handle.is_finished() => {
                    if let Some(handle) = output.take() {
                        let _ = handle.join();
                    }
                    return;
                }
                Some(_) if Instant::now() >= deadline => {
                    log::warn!(
                        "terminal output still open {} ms after the exit (a process kept the terminal)",
                        limit.as_millis()
                    );
                    return;
                }
                Some(_) => {}
            }
            drop(output);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Copies the client's input into the terminal until its end of file.
/// Only this copy of the master is closed then, not the terminal (that
/// would hang it up): a client that wants the process to see end of file
/// types it (^D).
fn copy_stdin(path: PathBuf, master: File) {
    stdio::copy_fifo_into(path, master);
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::pty::openpty;
    use nix::sys::socket::{sendmsg, ControlMessage};
    use std::io::IoSlice;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_master_sent_to_the_socket_is_received_and_resized() {
        let socket = ConsoleSocket::new().expect("console socket");
        let pty = openpty(None, None).expect("openpty");
        let sender = UnixStream::connect(socket.path()).expect("connect");
        sendmsg::<()>(
            sender.as_raw_fd(),
            &[IoSlice::new(b"/dev/ptmx")],
            &[ControlMessage::ScmRights(&[pty.master.as_raw_fd()])],
            MsgFlags::empty(),
            None,
        )
        .expect("sendmsg");
        drop(sender);
        let master = socket.receive().expect("receive");
        let console = Console::start(master, "", "").expect("console");
        console.resize(100, 40).expect("resize");
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` to the valid pointer; the
        // slave is open.
        let rc = unsafe { libc::ioctl(pty.slave.as_fd().as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
        assert_eq!(rc, 0);
        assert_eq!((size.ws_row, size.ws_col), (40, 100));
        assert!(matches!(
            console.resize(70_000, 1),
            Err(ConsoleError::Size { .. })
        ));
        // The output thread ends once the slave is closed.
        drop(pty.slave);
        console.wait_output(Duration::from_secs(5));
        assert!(console.output.lock().expect("lock").as_ref().is_none());
        let dir = socket.dir.clone();
        drop(socket);
        assert!(!dir.exists());
    }

    #[test]
    fn nothing_sent_is_an_error_naming_the_socket() {
        let socket = ConsoleSocket::new().expect("console socket");
        let sender = UnixStream::connect(socket.path()).expect("connect");
        drop(sender);
        let err = socket.receive().expect_err("no descriptor");
        assert!(err.to_string().contains("pty.sock"), "{err}");
    }
}
