//! A minimal QMP client: the supervisor's side of QEMU's machine protocol,
//! on a socketpair made before QEMU starts (QEMU opens no socket of ours).
//! Used for one thing so far, the balloon's target, which sets how much of
//! its RAM the guest may use.
//!
//! QEMU parses what the guest sends it, so a guest that takes the emulator
//! over also writes this socket: every line read is bounded in length, a
//! reply is awaited for a bounded time, and asynchronous events (QEMU sends
//! them at any time) are skipped, a bounded number per command.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Longest line accepted from QEMU (its greeting and replies are short).
const MAX_LINE: usize = 64 * 1024;
/// Events skipped while waiting for one reply.
const MAX_EVENTS: usize = 256;
/// How long a reply may take.
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP: {0}")]
    Protocol(String),
    #[error("QMP: {command} failed: {message}")]
    Failed { command: String, message: String },
}

/// One QMP connection, negotiated on first use.
pub struct Qmp {
    stream: UnixStream,
    buf: Vec<u8>,
    ready: bool,
}

impl Qmp {
    pub fn new(stream: UnixStream) -> Qmp {
        Qmp {
            stream,
            buf: Vec::new(),
            ready: false,
        }
    }

    /// Reads one line (without its newline), at most [`MAX_LINE`] bytes.
    /// A connection another process negotiated already (a pooled VM's,
    /// handed over by its keeper).
    pub fn resumed(stream: UnixStream) -> Qmp {
        Qmp {
            stream,
            buf: Vec::new(),
            ready: true,
        }
    }

    /// The connection, to hand over.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    fn line(&mut self) -> Result<Vec<u8>, QmpError> {
        self.stream.set_read_timeout(Some(TIMEOUT))?;
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(QmpError::Protocol(format!(
                    "a line longer than {MAX_LINE} bytes"
                )));
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(QmpError::Protocol("QEMU closed the connection".into()));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn message(&mut self) -> Result<serde_json::Value, QmpError> {
        let line = self.line()?;
        serde_json::from_slice(&line)
            .map_err(|e| QmpError::Protocol(format!("a message that is not JSON: {e}")))
    }

    /// Reads until the reply to the command just sent, skipping events.
    fn reply(&mut self, command: &str) -> Result<serde_json::Value, QmpError> {
        for _ in 0..=MAX_EVENTS {
            let msg = self.message()?;
            if msg.get("event").is_some() {
                continue;
            }
            if let Some(ret) = msg.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = msg.get("error") {
                let message = err
                    .get("desc")
                    .and_then(|d| d.as_str())
                    .unwrap_or("no description")
                    .chars()
                    .take(300)
                    .collect();
                return Err(QmpError::Failed {
                    command: command.to_string(),
                    message,
                });
            }
            return Err(QmpError::Protocol(format!(
                "an unexpected message while waiting for {command}"
            )));
        }
        Err(QmpError::Protocol(format!(
            "more than {MAX_EVENTS} events while waiting for {command}"
        )))
    }

    /// Runs `command` with `arguments` and returns its result.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: serde_json::Value,
    ) -> Result<serde_json::Value, QmpError> {
        if !self.ready {
            let greeting = self.message()?;
            if greeting.get("QMP").is_none() {
                return Err(QmpError::Protocol("no QMP greeting".into()));
            }
            self.send("qmp_capabilities", serde_json::Value::Null)?;
            self.reply("qmp_capabilities")?;
            self.ready = true;
        }
        self.send(command, arguments)?;
        self.reply(command)
    }

    fn send(&mut self, command: &str, arguments: serde_json::Value) -> Result<(), QmpError> {
        let mut msg = serde_json::json!({ "execute": command });
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        self.stream.write_all(&line)?;
        Ok(())
    }

    /// Sets how much RAM the guest may use: the balloon holds the rest.
    pub fn set_guest_ram(&mut self, mib: u64) -> Result<(), QmpError> {
        let bytes = mib
            .checked_mul(1 << 20)
            .ok_or_else(|| QmpError::Protocol(format!("{mib} MiB overflows")))?;
        self.execute("balloon", serde_json::json!({ "value": bytes }))
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake QEMU on the other end: writes `script` and records the
    /// commands it was sent.
    fn fake(script: &'static [&'static str]) -> (Qmp, std::thread::JoinHandle<Vec<String>>) {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let qemu = std::thread::spawn(move || {
            let mut theirs = theirs;
            let mut seen = Vec::new();
            let mut reader = std::io::BufReader::new(theirs.try_clone().expect("clone"));
            for out in script {
                if let Some(rest) = out.strip_prefix("<") {
                    let mut line = String::new();
                    if std::io::BufRead::read_line(&mut reader, &mut line).is_err() {
                        break;
                    }
                    assert!(line.contains(rest), "{line:?} lacks {rest:?}");
                    seen.push(line);
                } else if theirs.write_all(out.as_bytes()).is_err() {
                    // The client gave up first (the hostile cases).
                    break;
                }
            }
            seen
        });
        (Qmp::new(ours), qemu)
    }

    #[test]
    fn negotiates_then_sets_the_balloon_skipping_events() {
        let (mut qmp, qemu) = fake(&[
            "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n",
            "<qmp_capabilities",
            "{\"return\": {}}\n",
            "<\"value\":268435456",
            "{\"event\": \"BALLOON_CHANGE\", \"data\": {\"actual\": 1}}\n",
            "{\"return\": {}}\n",
        ]);
        qmp.set_guest_ram(256).expect("balloon");
        let seen = qemu.join().expect("fake qemu");
        assert!(seen[1].contains("\"execute\":\"balloon\""), "{seen:?}");
    }

    #[test]
    fn an_error_reply_names_the_command() {
        let (mut qmp, _qemu) = fake(&[
            "{\"QMP\": {}}\n",
            "<qmp_capabilities",
            "{\"return\": {}}\n",
            "<balloon",
            "{\"error\": {\"class\": \"DeviceNotActive\", \"desc\": \"No balloon device has been activated\"}}\n",
        ]);
        let e = qmp.set_guest_ram(256).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "QMP: balloon failed: No balloon device has been activated"
        );
    }

    #[test]
    fn hostile_answers_are_bounded() {
        // No greeting.
        let (mut qmp, _q) = fake(&["{\"return\": {}}\n"]);
        assert!(qmp.set_guest_ram(1).is_err());
        // A line without end.
        let long: &'static str = Box::leak("x".repeat(MAX_LINE + 4097).into_boxed_str());
        let script: &'static [&'static str] = Box::leak(vec![long].into_boxed_slice());
        let (mut qmp, _q) = fake(script);
        let e = qmp.set_guest_ram(1).expect_err("too long");
        assert!(e.to_string().contains("longer than"), "{e}");
        // Not JSON, and a message that is neither a reply nor an event.
        let (mut qmp, _q) = fake(&["{\"QMP\": {}}\n", "<qmp", "garbage\n"]);
        assert!(qmp.set_guest_ram(1).is_err());
        let (mut qmp, _q) = fake(&["{\"QMP\": {}}\n", "<qmp", "{\"what\": 1}\n"]);
        assert!(qmp.set_guest_ram(1).is_err());
        // A size that overflows is refused before anything is sent.
        let (mut qmp, _q) = fake(&[]);
        assert!(qmp.set_guest_ram(u64::MAX).is_err());
    }

    #[test]
    fn an_event_flood_ends_the_wait() {
        let flood: &'static str = Box::leak(
            "{\"event\": \"X\"}\n"
                .repeat(MAX_EVENTS + 2)
                .into_boxed_str(),
        );
        let script: &'static [&'static str] =
            Box::leak(vec!["{\"QMP\": {}}\n", "<qmp", flood].into_boxed_slice());
        let (mut qmp, _q) = fake(script);
        let e = qmp.set_guest_ram(1).expect_err("flood");
        assert!(e.to_string().contains("events"), "{e}");
    }
}
