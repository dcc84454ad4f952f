//! What the guest agent asks the host to log, bounded: the guest is not
//! trusted, and its words go into the host's runtime log (which containerd
//! reads back) only as sanitised, length-limited lines at a limited rate.
//! What is dropped is counted and the count is logged.

use std::time::{Duration, Instant};

/// Longest guest message copied into the host log, in bytes.
pub const MAX_LINE: usize = 512;
/// Lines per second allowed on average…
const RATE_PER_SEC: f64 = 20.0;
/// …and in a burst.
const BURST: f64 = 100.0;
/// How often a count of dropped lines is reported at most.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A token bucket over guest log lines, with a count of what it dropped.
pub struct GuestLog {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    dropped_total: u64,
    reported: Instant,
}

/// The level a guest line is logged at; anything unknown is a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    fn of(s: &str) -> Level {
        match s {
            "error" => Level::Error,
            "info" => Level::Info,
            "debug" | "trace" => Level::Debug,
            _ => Level::Warn,
        }
    }
}

/// One line for the host log.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    pub text: String,
}

impl GuestLog {
    pub fn new(now: Instant) -> GuestLog {
        GuestLog {
            tokens: BURST,
            refilled: now,
            dropped: 0,
            dropped_total: 0,
            reported: now,
        }
    }

    /// The line to log for a guest message, or `None` when the rate limit
    /// drops it.
    pub fn accept(&mut self, now: Instant, level: &str, message: &str) -> Option<Line> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * RATE_PER_SEC).min(BURST);
        self.refilled = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            self.dropped_total += 1;
            return None;
        }
        self.tokens -= 1.0;
        Some(Line {
            level: Level::of(level),
            text: sanitise(message),
        })
    }

    /// How many lines were dropped since the last report, when it is time
    /// to say so (`force` at the end of the container).
    pub fn dropped_report(&mut self, now: Instant, force: bool) -> Option<u64> {
        if self.dropped == 0
            || (!force && now.saturating_duration_since(self.reported) < REPORT_EVERY)
        {
            return None;
        }
        self.reported = now;
        Some(std::mem::take(&mut self.dropped))
    }

    /// Lines dropped over the container's life.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }
}

/// One printable line of at most [`MAX_LINE`] bytes: control characters
/// (newlines, escapes that would forge log lines or drive a terminal)
/// become `\u{..}` escapes, and what is cut is said.
pub fn sanitise(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_LINE) + 32);
    let mut consumed = 0;
    for c in message.chars() {
        let piece = if c.is_control() {
            c.escape_unicode().to_string()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > MAX_LINE {
            break;
        }
        out.push_str(&piece);
        consumed += c.len_utf8();
    }
    if consumed < message.len() {
        out.push_str(&format!(" [{} more bytes cut]", message.len() - consumed));
    }
    out
}

/// Logs a guest message through `log`'s limits, and the count of lines
/// dropped before it when that is due.
pub fn emit(log: &mut GuestLog, level: &str, message: &str) {
    let now = Instant::now();
    if let Some(n) = log.dropped_report(now, false) {
        tracing::warn!("guest: {n} log lines dropped (more than {RATE_PER_SEC}/s)");
    }
    let Some(line) = log.accept(now, level, message) else {
        return;
    };
    match line.level {
        Level::Error => tracing::error!("guest: {}", line.text),
        Level::Warn => tracing::warn!("guest: {}", line.text),
        Level::Info => tracing::info!("guest: {}", line.text),
        Level::Debug => tracing::debug!("guest: {}", line.text),
    }
}

/// Logs the count of dropped lines not reported yet (the container ended).
pub fn flush(log: &mut GuestLog) {
    if let Some(n) = log.dropped_report(Instant::now(), true) {
        tracing::warn!(
            "guest: {n} log lines dropped (more than {RATE_PER_SEC}/s; {} over the container's life)",
            log.dropped_total()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_and_say_so() {
        let line = sanitise(&"x".repeat(10_000));
        assert!(line.starts_with(&"x".repeat(MAX_LINE)));
        assert!(line.ends_with(&format!("[{} more bytes cut]", 10_000 - MAX_LINE)));
        assert!(line.len() < MAX_LINE + 40);
        // Multi-byte characters are never split.
        let line = sanitise(&"é".repeat(1000));
        assert!(line.contains("more bytes cut"));
    }

    #[test]
    fn control_characters_cannot_forge_lines() {
        let line = sanitise("ok\nlevel=error msg=\"forged\"\r\x1b[2J");
        assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\x1b'));
        assert!(line.contains("\\u{a}"));
    }

    #[test]
    fn a_flood_is_limited_and_counted() {
        let t0 = Instant::now();
        let mut log = GuestLog::new(t0);
        let accepted = (0..10_000)
            .filter(|_| log.accept(t0, "warn", "spam").is_some())
            .count();
        assert_eq!(accepted, BURST as usize);
        assert_eq!(log.dropped_total(), 10_000 - BURST as u64);
        // Not reported again before its time, unless forced.
        assert_eq!(log.dropped_report(t0, false), None);
        assert_eq!(log.dropped_report(t0, true), Some(10_000 - BURST as u64));
        assert_eq!(log.dropped_report(t0, true), None);
        // The bucket refills with time.
        let later = t0 + Duration::from_secs(1);
        let accepted = (0..1000)
            .filter(|_| log.accept(later, "info", "again").is_some())
            .count();
        assert_eq!(accepted, RATE_PER_SEC as usize);
        assert!(log.dropped_report(later + REPORT_EVERY, false).is_some());
    }

    #[test]
    fn levels() {
        let mut log = GuestLog::new(Instant::now());
        let now = Instant::now();
        assert_eq!(log.accept(now, "error", "e").unwrap().level, Level::Error);
        assert_eq!(log.accept(now, "debug", "d").unwrap().level, Level::Debug);
        assert_eq!(
            log.accept(now, "\u{1b}[31m", "?").unwrap().level,
            Level::Warn
        );
    }
}
