//! The audit trail: one JSON object per line, appended to one host-wide
//! file (`[audit] path` in the config, default [`DEFAULT_PATH`]), for every
//! connection attempt a policy judged, every DNS query it answered and
//! every `exec`. Whoever sees the event writes it: the egress daemon in the
//! container's namespace for connections and names, the command line and
//! the supervisor for execs. Lines are written with one `write(2)` on an
//! `O_APPEND` descriptor, so writers in different processes never
//! interleave inside a line.
//!
//! Every field that came from the sandbox (names, argv) is data: it is
//! escaped by the JSON encoder and bounded in length ([`MAX_FIELD`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub mod exec;
pub mod export;
pub mod otlp;
pub mod read;

/// Where the audit trail goes when the config names no file.
pub const DEFAULT_PATH: &str = "/var/log/agentvm/audit.jsonl";
/// Longest string field kept from the sandbox, in bytes; longer ones are
/// cut (on a character boundary) and marked with a trailing `…`.
pub const MAX_FIELD: usize = 1024;
/// Most argv entries kept for an exec.
pub const MAX_ARGS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Allowed or denied, and by what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allowed,
    Denied,
}

/// Where the name of a connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NameSource {
    /// The address was in a DNS answer for this name.
    Dns,
    /// The TLS ClientHello's server name.
    Sni,
    /// The HTTP request's Host header.
    Host,
}

/// One event; serialized with its kind as `"event"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// A connection attempt that a policy judged.
    Connection {
        verdict: Verdict,
        /// The rule that allowed it, as written; none for a denial.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        rule: Option<String>,
        /// Why it was denied, when there is more to say than "no rule".
        #[serde(skip_serializing_if = "Option::is_none", default)]
        reason: Option<String>,
        proto: String,
        dst: IpAddr,
        port: u16,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        name: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        name_from: Option<NameSource>,
        /// Bytes from the sandbox to the destination.
        #[serde(default)]
        bytes_out: u64,
        /// Bytes from the destination to the sandbox.
        #[serde(default)]
        bytes_in: u64,
        #[serde(default)]
        duration_ms: u64,
        /// Attempts to the same destination that were denied since the
        /// last line about it and not written on their own.
        #[serde(skip_serializing_if = "is_zero", default)]
        suppressed: u64,
    },
    /// A DNS query the policy's resolver answered.
    Dns {
        verdict: Verdict,
        name: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        rule: Option<String>,
        /// Addresses the answer allowed.
        #[serde(skip_serializing_if = "Vec::is_empty", default)]
        addresses: Vec<IpAddr>,
    },
    /// A process started with `exec`, and how it ended.
    Exec {
        argv: Vec<String>,
        user: String,
        cwd: String,
        /// Exit status (128+n for a signal); none when the runtime does
        /// not see the end (a detached exec in the container tier, whose
        /// status goes to the caller that waits for it).
        #[serde(skip_serializing_if = "Option::is_none", default)]
        exit: Option<i32>,
        /// Why the exec did not start, or why its end was not seen.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        error: Option<String>,
        /// From the request to the exit, when the exit was seen; the
        /// line's `time` is when it was written (the end, or for a
        /// detached container-tier exec the start).
        #[serde(skip_serializing_if = "Option::is_none", default)]
        duration_ms: Option<u64>,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One line of the audit file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    pub container: String,
    #[serde(flatten)]
    pub event: Event,
}

/// Cuts `s` to [`MAX_FIELD`] bytes.
pub fn bounded(s: &str) -> String {
    if s.len() <= MAX_FIELD {
        return s.to_string();
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// An argv as the audit keeps it.
pub fn bounded_argv(argv: &[String]) -> Vec<String> {
    let mut out: Vec<String> = argv.iter().take(MAX_ARGS).map(|a| bounded(a)).collect();
    if argv.len() > MAX_ARGS {
        out.push(format!("… {} more", argv.len() - MAX_ARGS));
    }
    out
}

/// The audit file, open for appending.
pub struct Log {
    path: PathBuf,
    file: File,
}

impl Log {
    /// Opens (creating it and its directory, mode 0600/0700) the file.
    pub fn open(path: &Path) -> Result<Log, AuditError> {
        let err = |source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(err)?;
            }
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(err)?;
        Ok(Log {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends one event of `container`, stamped now.
    pub fn append(&self, container: &str, event: Event) -> Result<(), AuditError> {
        let record = Record {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            container: container.to_string(),
            event,
        };
        self.write(&record)
    }

    /// Appends `record` as one line, in one write.
    pub fn write(&self, record: &Record) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(record).unwrap_or_default();
        line.push(b'\n');
        (&self.file)
            .write_all(&line)
            .map_err(|source| AuditError::Io {
                path: self.path.clone(),
                source,
            })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

use std::os::unix::fs::DirBuilderExt;

/// Keeps denied attempts to one destination to one line per interval: a
/// flood of packets to a denied address is one line, then one per
/// interval with the count of those not written.
pub struct DenyLimiter {
    interval: Duration,
    capacity: usize,
    seen: std::collections::HashMap<String, (Instant, u64)>,
}

impl DenyLimiter {
    pub fn new(interval: Duration, capacity: usize) -> DenyLimiter {
        DenyLimiter {
            interval,
            capacity,
            seen: std::collections::HashMap::new(),
        }
    }

    /// `Some(suppressed)` when this attempt is to be written (with the
    /// number of attempts to the same destination not written since the
    /// last line), `None` when it is to be counted only.
    /// `key` names the destination (e.g. `"udp 192.0.2.1:53"`).
    pub fn admit(&mut self, key: &str, now: Instant) -> Option<u64> {
        if let Some((last, count)) = self.seen.get_mut(key) {
            if now.duration_since(*last) < self.interval {
                *count += 1;
                return None;
            }
            let suppressed = *count;
            *last = now;
            *count = 0;
            return Some(suppressed);
        }
        if self.seen.len() >= self.capacity {
            let interval = self.interval;
            self.seen
                .retain(|_, (last, _)| now.duration_since(*last) < interval);
            if self.seen.len() >= self.capacity {
                // Still full of recent destinations: a scan. Count it
                // against nothing and write nothing; the first line of
                // each of those destinations is already there.
                return None;
            }
        }
        self.seen.insert(key.to_string(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_name_their_kind() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(&dir.path().join("a/audit.jsonl")).unwrap();
        log.append(
            "c1",
            Event::Connection {
                verdict: Verdict::Denied,
                rule: None,
                reason: Some("forged \"sni\"\n".into()),
                proto: "tcp".into(),
                dst: "192.0.2.1".parse().unwrap(),
                port: 443,
                name: Some("evil.example".into()),
                name_from: Some(NameSource::Sni),
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
                suppressed: 0,
            },
        )
        .unwrap();
        log.append(
            "c1",
            Event::Exec {
                argv: vec!["sh".into(), "-c".into(), "exit 7".into()],
                user: "0:0".into(),
                cwd: "/".into(),
                exit: Some(7),
                error: None,
                duration_ms: Some(12),
            },
        )
        .unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("\"event\":\"connection\""),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("\"event\":\"exec\""), "{}", lines[1]);
        let r: Record = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(r.container, "c1");
        match r.event {
            Event::Connection { reason, port, .. } => {
                assert_eq!(reason.as_deref(), Some("forged \"sni\"\n"));
                assert_eq!(port, 443);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fields_from_the_sandbox_are_bounded() {
        let long = "é".repeat(MAX_FIELD);
        let b = bounded(&long);
        assert!(b.len() <= MAX_FIELD + '…'.len_utf8());
        assert!(b.ends_with('…'));
        let argv: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let a = bounded_argv(&argv);
        assert_eq!(a.len(), MAX_ARGS + 1);
        assert_eq!(a[MAX_ARGS], "… 36 more");
    }

    #[test]
    fn denials_are_one_line_per_destination_per_interval() {
        let mut l = DenyLimiter::new(Duration::from_secs(60), 4);
        let t0 = Instant::now();
        let d = "tcp 192.0.2.1:80";
        assert_eq!(l.admit(d, t0), Some(0));
        for i in 1..1000 {
            assert_eq!(l.admit(d, t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(l.admit("udp 192.0.2.1:80", t0), Some(0), "another protocol");
        assert_eq!(l.admit(d, t0 + Duration::from_secs(61)), Some(999));
        // A scan of many destinations is bounded by the capacity.
        let mut written = 0;
        for i in 0..1000u16 {
            if l.admit(&format!("tcp 192.0.2.1:{i}"), t0 + Duration::from_secs(62))
                .is_some()
            {
                written += 1;
            }
        }
        assert!(written <= 4, "{written}");
    }
}
