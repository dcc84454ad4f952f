//! The serial console (`/dev/console`, which the host logs): where the
//! agent writes what it cannot send to the host, and libcontainer's logs.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::OnceLock;

/// Our own descriptor of the console, separate from fds 0-2 (which the
/// agent lends to container processes for a moment, see `StdioSwap`).
static CONSOLE: OnceLock<File> = OnceLock::new();

/// Environment variable (set on the kernel command line) holding a
/// `tracing` filter for the console log; `warn` when absent.
pub const LOG_ENV: &str = "AGENTVM_GUEST_LOG";

/// Opens `/dev/console` once `/dev` is mounted.
pub fn open() -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/console")?;
    let _ = CONSOLE.set(file);
    Ok(())
}

/// Writes one line, prefixed, to the console (or, before it is open, to
/// fd 2, which the kernel points at the console when the initramfs has a
/// `/dev/console` node). Errors are ignored: there is nowhere else to go.
pub fn line(msg: &str) {
    let text = format!("agentvm-guest: {msg}\n");
    write_raw(text.as_bytes());
}

fn write_raw(bytes: &[u8]) {
    match CONSOLE.get() {
        Some(mut f) => {
            let _ = f.write_all(bytes);
        }
        None => {
            // SAFETY: write(2) reads `bytes.len()` bytes from a live slice;
            // a closed fd 2 only makes it fail with EBADF.
            unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        }
    }
}

/// A `tracing` writer onto the console.
struct ConsoleWriter;

impl Write for ConsoleWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_raw(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends `tracing` events (libcontainer's and the container tier's) to the
/// console, filtered by `$AGENTVM_GUEST_LOG`.
pub fn init_tracing() {
    let filter = std::env::var(LOG_ENV).unwrap_or_else(|_| "warn".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_writer(|| ConsoleWriter)
        .with_ansi(false)
        .with_env_filter(filter)
        .try_init();
}
