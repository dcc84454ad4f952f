//! One process the host knows by a stream id: its stdio (pipes, or a pty
//! master) and, once reaped, its exit status.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::Pid;

use super::sys::set_nonblocking;
use crate::protocol::Kind;

/// Stdin bytes the agent holds for a process that does not read them;
/// beyond this, more input is dropped (and the host told).
pub const STDIN_BUFFER_LIMIT: usize = 64 << 20;

pub struct Stream {
    pub pid: Pid,
    /// Open output descriptors; an entry goes at EOF.
    pub outputs: Vec<Output>,
    pub stdin: Option<Input>,
    /// The pty master, for resizing, when the process has a terminal.
    pub pty: Option<OwnedFd>,
    pub exit: Option<Exited>,
}

pub struct Output {
    pub kind: Kind,
    pub fd: OwnedFd,
}

pub struct Exited {
    pub status: i32,
    /// When to stop waiting for the output to reach EOF (a descendant may
    /// hold the pipe open) and report the exit anyway.
    pub deadline: Instant,
}

pub struct Input {
    fd: OwnedFd,
    pending: Vec<u8>,
    close_requested: bool,
    /// A pty's input cannot be half-closed: StdinClose is ignored there.
    is_pty: bool,
}

pub enum Read {
    Data(usize),
    Eof,
    WouldBlock,
}

/// The process-side ends of three pipes, handed to libcontainer.
pub struct ChildStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The agent's ends of the same pipes.
pub struct ParentStdio {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Three close-on-exec pipes; the agent's ends non-blocking.
pub fn pipes() -> nix::Result<(ChildStdio, ParentStdio)> {
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    for fd in [&in_w, &out_r, &err_r] {
        set_nonblocking(fd.as_fd())?;
    }
    Ok((
        ChildStdio {
            stdin: in_r,
            stdout: out_w,
            stderr: err_w,
        },
        ParentStdio {
            stdin: in_w,
            stdout: out_r,
            stderr: err_r,
        },
    ))
}

impl Stream {
    pub fn with_pipes(pid: Pid, io: ParentStdio) -> Stream {
        Stream {
            pid,
            outputs: vec![
                Output {
                    kind: Kind::Stdout,
                    fd: io.stdout,
                },
                Output {
                    kind: Kind::Stderr,
                    fd: io.stderr,
                },
            ],
            stdin: Some(Input::new(io.stdin, false)),
            pty: None,
            exit: None,
        }
    }

    /// A process on a terminal: everything it writes arrives as Stdout.
    pub fn with_pty(pid: Pid, master: OwnedFd) -> std::io::Result<Stream> {
        set_nonblocking(master.as_fd())?;
        let output = master.try_clone()?;
        let input = master.try_clone()?;
        Ok(Stream {
            pid,
            outputs: vec![Output {
                kind: Kind::Stdout,
                fd: output,
            }],
            stdin: Some(Input::new(input, true)),
            pty: Some(master),
            exit: None,
        })
    }

    /// Reads once from the output of `kind`; EOF (and a pty's EIO, which
    /// means every slave is closed) drops that output.
    pub fn read_output(&mut self, kind: Kind, buf: &mut [u8]) -> Read {
        let Some(pos) = self.outputs.iter().position(|o| o.kind == kind) else {
            return Read::Eof;
        };
        let result = loop {
            match nix::unistd::read(self.outputs[pos].fd.as_raw_fd(), buf) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        };
        match result {
            Ok(0) => {
                self.outputs.remove(pos);
                Read::Eof
            }
            Ok(n) => Read::Data(n),
            Err(Errno::EAGAIN) => Read::WouldBlock,
            Err(_) => {
                self.outputs.remove(pos);
                Read::Eof
            }
        }
    }

    /// Done: reaped, and its output drained to EOF.
    pub fn finished(&self) -> bool {
        self.exit.is_some() && self.outputs.is_empty()
    }

    pub fn running(&self) -> bool {
        self.exit.is_none()
    }

    /// Resizes the terminal (TIOCSWINSZ on the master).
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), String> {
        let Some(master) = &self.pty else {
            return Err("the process has no terminal".to_string());
        };
        crate::term::set_window_size(master.as_fd(), rows, cols)
            .map_err(|e| format!("cannot resize the terminal: {e}"))?;
        Ok(())
    }
}

impl Input {
    fn new(fd: OwnedFd, is_pty: bool) -> Input {
        Input {
            fd,
            pending: Vec::new(),
            close_requested: false,
            is_pty,
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Queues bytes; false if they were dropped because the process has
    /// not read what it was already sent.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if self.pending.len().saturating_add(bytes.len()) > STDIN_BUFFER_LIMIT {
            return false;
        }
        self.pending.extend_from_slice(bytes);
        true
    }

    pub fn request_close(&mut self) {
        if !self.is_pty {
            self.close_requested = true;
        }
    }

    pub fn wants_write(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes what the pipe takes without blocking. Returns false when this
    /// input is finished (closed as asked, or the reader is gone) and should
    /// be dropped, which closes the descriptor.
    pub fn flush(&mut self) -> bool {
        while !self.pending.is_empty() {
            match nix::unistd::write(&self.fd, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return true,
                // EPIPE, EIO: nobody reads this any more.
                Err(_) => return false,
            }
        }
        !self.close_requested
    }
}
