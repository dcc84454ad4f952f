//! Terminal window sizes, the one place agentvm reads and sets them (host
//! ptys, the container's console, the guest's ptys).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The window size of a terminal as (rows, cols), when one was set.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct we pass, which
    // lives for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// Sets a terminal's window size (TIOCSWINSZ).
pub fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the struct we pass, which
    // lives for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_size_set_is_the_size_read() {
        let pty = nix::pty::openpty(None, None).unwrap();
        assert_eq!(window_size(pty.master.as_fd()), None);
        set_window_size(pty.master.as_fd(), 33, 101).unwrap();
        assert_eq!(window_size(pty.slave.as_fd()), Some((33, 101)));
    }
}
