//! The control port: the virtio-serial device the host reaches through a
//! unix socket, carrying protocol frames both ways.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::protocol::{Decoder, Frame, GuestMessage, Kind, ProtocolError, MAX_PAYLOAD};

/// Bytes read from the port at a time.
const READ_CHUNK: usize = 64 * 1024;

pub struct Port {
    /// Blocking: a write waits for the host to take the data (and, before
    /// the host connects, for the connection), which is the backpressure we
    /// want; reads happen only when poll(2) says data is there.
    file: File,
    decoder: Decoder,
}

impl Port {
    pub fn open(path: &Path) -> std::io::Result<Port> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Port {
            file,
            decoder: Decoder::default(),
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn send(&mut self, msg: &GuestMessage) -> Result<(), ProtocolError> {
        Frame::control(msg).write_to(&mut self.file)
    }

    /// Sends process output as data frames of at most MAX_PAYLOAD bytes.
    pub fn send_data(
        &mut self,
        kind: Kind,
        stream: u32,
        bytes: &[u8],
    ) -> Result<(), ProtocolError> {
        for chunk in bytes.chunks(MAX_PAYLOAD) {
            Frame::data(kind, stream, chunk).write_to(&mut self.file)?;
        }
        Ok(())
    }

    /// A diagnostic for the host's runtime log (and the console).
    pub fn log(&mut self, level: &str, message: String) -> Result<(), ProtocolError> {
        super::console::line(&format!("{level}: {message}"));
        self.send(&GuestMessage::Log {
            level: level.to_string(),
            message,
        })
    }

    /// Reads what the host has sent so far into the decoder. `Ok(false)`
    /// when the host side is closed.
    pub fn fill(&mut self) -> Result<bool, ProtocolError> {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.decoder.push(&buf[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The next complete frame received. An error is final: the byte
    /// stream cannot be resynchronised after a malformed header.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        self.decoder.next_frame()
    }

    pub fn flush(&mut self) {
        let _ = self.file.flush();
    }
}
