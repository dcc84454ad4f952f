//! Driving an interactive client (`docker run -it`) through a real pty, as a
//! terminal emulator would: the client's stdin/stdout/stderr are the pty's
//! slave side, which is also its controlling terminal.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::pty::{openpty, Winsize};

use super::cmd::describe;

/// A client running on a pty; everything it prints is collected.
pub struct PtySession {
    command: String,
    master: File,
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl PtySession {
    /// Starts `cmd` on a new pty of `rows` x `cols`.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16) -> PtySession {
        let command = describe(&cmd);
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let stdio = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup pty slave"));
        cmd.stdin(stdio(&slave))
            .stdout(stdio(&slave))
            .stderr(stdio(&slave));
        // SAFETY: the closure runs in the forked child before exec and only
        // calls async-signal-safe functions (setsid, ioctl) on fd 0, which
        // is the pty slave set up above.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{command}`: {e}"));
        // Only the child may hold the slave, so that reads on the master
        // end (EIO) when the client exits.
        drop(cmd);
        drop(slave);
        let master = File::from(pty.master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut reader_master = master.try_clone().expect("dup pty master");
        let sink = Arc::clone(&output);
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader_master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("output lock")
                    .extend_from_slice(&buf[..n]);
            }
        });
        PtySession {
            command,
            master,
            child,
            output,
            reader: Some(reader),
        }
    }

    /// Types `text` into the terminal.
    pub fn send(&mut self, text: &str) {
        self.master
            .write_all(text.as_bytes())
            .expect("write to pty master");
    }

    /// Everything the client printed so far.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().expect("output lock")).into_owned()
    }

    /// Waits until the output contains `needle`; panics with the output
    /// after `secs` seconds.
    #[track_caller]
    pub fn expect(&mut self, needle: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !self.output().contains(needle) {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "`{}`: {needle:?} did not appear within {secs} s; terminal output:\n{}",
                    self.command,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the client to exit and returns its exit code.
    #[track_caller]
    pub fn wait(&mut self, secs: u64) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for pty client") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "`{}` did not exit within {secs} s; terminal output:\n{}",
                    self.command,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader sees EIO once the client and its children let go of
        // the slave: give it a moment to collect the last output, but do
        // not wait for stragglers that might keep the slave open.
        if let Some(reader) = self.reader.take() {
            let drained = Instant::now() + Duration::from_secs(5);
            while !reader.is_finished() && Instant::now() < drained {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        use std::os::unix::process::ExitStatusExt;
        status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(-1)
    }

    /// Resizes the terminal, as a terminal emulator does when its window
    /// changes; the kernel sends SIGWINCH to the client.
    pub fn resize(&mut self, rows: u16, cols: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: the master fd is open for the life of `self`, and
        // TIOCSWINSZ reads one `winsize` from the valid pointer given.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }
}

impl Drop for PtySession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
