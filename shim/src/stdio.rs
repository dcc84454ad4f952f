//! The container's stdio: the FIFOs containerd's client created and named
//! in the create request (an empty path: none).
//!
//! stdout and stderr FIFOs are handed to the container as they are: the
//! client opened their read ends before asking for the task, so the
//! container writes straight to it and the client sees end of file when
//! the last process holding them exits. stdin is relayed through a pipe by
//! a thread, because a FIFO opened before its writer exists reads as end of
//! file: the thread waits for the client's writer, copies, and closes the
//! pipe on the client's end of file, which the container then reads.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::runtime::CreateStdio;

#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    #[error("cannot open the {stream} FIFO {path}: {source}")]
    Open {
        stream: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make a pipe for stdin: {0}")]
    Pipe(#[source] nix::Error),
    #[error("cannot clear O_NONBLOCK on the {stream} FIFO: {source}")]
    Blocking {
        stream: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// The three streams as containerd named them.
pub struct Paths<'a> {
    pub stdin: &'a str,
    pub stdout: &'a str,
    pub stderr: &'a str,
}

/// Opens the streams for `agentvm create` or `exec`, whose child (the
/// container's process, or the microvm tier's exec relay) inherits them.
/// (With a terminal the process's stdio is the pty: see `console.rs`.)
pub fn open(paths: &Paths) -> Result<CreateStdio, StdioError> {
    Ok(CreateStdio {
        stdin: if paths.stdin.is_empty() {
            Stdio::null()
        } else {
            relay_stdin(Path::new(paths.stdin))?
        },
        stdout: output(paths.stdout, "stdout")?,
        stderr: output(paths.stderr, "stderr")?,
    })
}

/// Stdio for no stream at all.
pub fn none() -> CreateStdio {
    CreateStdio {
        stdin: Stdio::null(),
        stdout: Stdio::null(),
        stderr: Stdio::null(),
    }
}

fn output(path: &str, stream: &'static str) -> Result<Stdio, StdioError> {
    if path.is_empty() {
        return Ok(Stdio::null());
    }
    Ok(Stdio::from(output_file(path, stream)?))
}

/// The FIFO at `path` opened for writing, blocking.
pub fn output_file(path: &str, stream: &'static str) -> Result<File, StdioError> {
    let open_err = |source| StdioError::Open {
        stream,
        path: PathBuf::from(path),
        source,
    };
    // Non-blocking, so that a FIFO nobody reads (yet) is an error here
    // (ENXIO) and not a shim stuck in open(2).
    let file = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        // The client is not reading yet: hold a read end ourselves (O_RDWR
        // on a FIFO never blocks) so the container's writes do not fail.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(open_err)?,
        Err(e) => return Err(open_err(e)),
    };
    blocking(&file, stream)?;
    Ok(file)
}

/// Clears O_NONBLOCK: the container expects ordinary blocking writes.
fn blocking(file: &File, stream: &'static str) -> Result<(), StdioError> {
    let flags = fcntl(file.as_raw_fd(), FcntlArg::F_GETFL)
        .map_err(|source| StdioError::Blocking { stream, source })?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(file.as_raw_fd(), FcntlArg::F_SETFL(flags))
        .map_err(|source| StdioError::Blocking { stream, source })?;
    Ok(())
}

/// A pipe whose read end is the container's stdin, fed from the FIFO at
/// `path` by a thread until the client's end of file.
fn relay_stdin(path: &Path) -> Result<Stdio, StdioError> {
    let (read, write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(StdioError::Pipe)?;
    // When the copy ends, dropping the write end closes the pipe: the
    // container reads end of file.
    copy_fifo_into(path.to_path_buf(), File::from(write));
    Ok(Stdio::from(read))
}

/// Copies what the client writes into the stdin FIFO at `path` to `sink`,
/// on a thread of its own, until the client's end of file (or a write
/// fails); then drops `sink`.
pub(crate) fn copy_fifo_into(path: PathBuf, mut sink: File) {
    std::thread::spawn(move || {
        // Blocks until the client opens its write end.
        let mut fifo = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                log::warn!("stdin FIFO {}: {e}", path.display());
                return;
            }
        };
        let mut buf = [0u8; 32 * 1024];
        loop {
            match fifo.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let Some(chunk) = buf.get(..n) else { break };
                    if sink.write_all(chunk).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
}
