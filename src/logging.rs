//! Runtime log: runc's lines, in its text format (logrus':
//! `time="…" level=error msg="…"`) or its JSON (`level`, `msg`, `time`),
//! which containerd's shim reads back to report why a command failed.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// The log line format (`--log-format`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

enum Sink {
    Stderr,
    File(Mutex<File>),
}

struct RuncLayer {
    sink: Sink,
    format: LogFormat,
    max: Level,
    /// The libraries' messages already written by this process.
    seen: Mutex<HashSet<String>>,
}

/// Distinct library messages remembered per process; past this (a long
/// supervisor with --debug) they are written again rather than kept.
const MAX_SEEN: usize = 4096;

/// Whether an event is agentvm's own (not libcontainer's or libcgroups').
fn ours(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target().starts_with("agentvm")
}

#[derive(Default)]
struct Fields {
    msg: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={:?}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.msg, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={:?}", field.name(), value);
        }
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

impl<S: Subscriber> Layer<S> for RuncLayer {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        // Libraries (libcontainer, libcgroups) report through their errors,
        // which reach the log once at the CLI edge; their own log lines are
        // only wanted with --debug.
        if !ours(metadata) && self.max < Level::DEBUG {
            return false;
        }
        *metadata.level() <= self.max
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let msg = format!("{}{}", fields.msg, fields.rest);
        let mut level = level_name(event.metadata().level());
        if !ours(event.metadata()) {
            // A library's line is debug detail whatever its level, written
            // once per process: libcgroups warns about every controller the
            // host lacks each time a cgroup manager is made, several times
            // a command, and the failures that matter reach the log once
            // as agentvm's error.
            level = level_name(&Level::DEBUG);
            let first = self
                .seen
                .lock()
                .map(|mut seen| seen.len() >= MAX_SEEN || seen.insert(msg.clone()))
                .unwrap_or(true);
            if !first {
                return;
            }
        }
        // runc's (logrus') time format: RFC 3339, seconds.
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let line = match self.format {
            LogFormat::Json => {
                // The fields containerd's go-runc reads back.
                let mut s =
                    serde_json::json!({ "level": level, "msg": msg, "time": time }).to_string();
                s.push('\n');
                s
            }
            LogFormat::Text => text_line(&time, level, &fields.msg, &fields.rest),
        };
        match &self.sink {
            Sink::Stderr => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            Sink::File(f) => {
                if let Ok(mut f) = f.lock() {
                    let _ = f.write_all(line.as_bytes());
                }
            }
        }
    }
}

/// A line in logrus' text format, as runc writes it on stderr or into
/// `--log`: `time="…" level=… msg=…`, then the other fields.
fn text_line(time: &str, level: &str, msg: &str, rest: &str) -> String {
    format!(
        "time={} level={level} msg={}{rest}\n",
        quoted(time),
        quoted(msg)
    )
}

/// A value as logrus' text formatter writes it: bare when it holds only
/// letters, digits and `-._/@^+`, else in double quotes with Go's `%q`
/// escapes (so a message is always one line).
fn quoted(value: &str) -> String {
    let bare = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c));
    if bare {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// True when the log goes somewhere other than stderr, so the CLI edge must
/// also print errors on stderr itself.
pub struct LogGuard {
    pub to_file: bool,
}

pub fn init(log: Option<&Path>, format: LogFormat, debug: bool) -> std::io::Result<LogGuard> {
    let sink = match log {
        Some(path) => Sink::File(Mutex::new(
            OpenOptions::new().create(true).append(true).open(path)?,
        )),
        None => Sink::Stderr,
    };
    let to_file = matches!(sink, Sink::File(_));
    let max = if debug { Level::DEBUG } else { Level::WARN };
    let layer = RuncLayer {
        sink,
        format,
        max,
        seen: Mutex::new(HashSet::new()),
    };
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = tracing_subscriber::registry().with(layer).try_init();
    Ok(LogGuard { to_file })
}

#[cfg(test)]
mod tests {
    use super::{quoted, text_line};

    #[test]
    fn text_lines_are_logrus_lines() {
        assert_eq!(
            text_line(
                "2026-12-05T00:57:55Z",
                "error",
                "container does not exist",
                ""
            ),
            "time=\"2026-12-05T00:57:55Z\" level=error msg=\"container does not exist\"\n"
        );
        assert_eq!(quoted("plain-word_1.2/x@y^z+"), "plain-word_1.2/x@y^z+");
        assert_eq!(quoted(""), "");
        assert_eq!(
            quoted("say \"hi\"\\ now\nnext\ttab\u{1}"),
            "\"say \\\"hi\\\"\\\\ now\\nnext\\ttab\\x01\""
        );
        // Whatever the message holds, the line is one line.
        assert_eq!(
            text_line("t", "warning", "a\nb", " id=\"c1\"")
                .lines()
                .count(),
            1
        );
    }
}
