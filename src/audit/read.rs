//! Reading the audit file back, for `agentvm audit`, `events --stats` and
//! the OTLP exporter: line by line from a position, following the file as
//! it grows, in bounded memory whatever its size.
//!
//! The file is append-only; an operator rotates it with `copytruncate`
//! (writers keep it open, so a rename would leave them writing to the old
//! file). A [`Follower`] that finds the file shorter than where it was
//! starts again from its beginning; one that finds another file at the path
//! (renamed away) reads the old one to its end and then moves to the new
//! one. A line longer than [`MAX_LINE`] is skipped, as is one that is not
//! JSON: a reader never stops at a bad line.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Event, Verdict};

/// Longest line a reader keeps, in bytes; a writer's lines are far
/// shorter (every field from the sandbox is bounded).
pub const MAX_LINE: usize = 1 << 20;
const CHUNK: usize = 64 * 1024;

/// Which file: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// A place in the audit file to go on from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub file: FileId,
    pub offset: u64,
}

/// Reads complete lines of the audit file as they are appended.
pub struct Follower {
    path: PathBuf,
    file: Option<(File, FileId)>,
    /// Where to start in the file once it is open (a saved position).
    resume: Option<Position>,
    /// Offset in the file of the first byte not read into `buf`.
    read_to: u64,
    buf: Vec<u8>,
    /// Start of the unreturned bytes in `buf`.
    start: usize,
    /// Dropping the rest of a line longer than [`MAX_LINE`].
    skipping: bool,
    /// Times the reader went back to the start of a file (the file was
    /// truncated or replaced): what was counted before is gone.
    restarts: u64,
    /// Lines dropped for their length.
    pub too_long: u64,
}

impl Follower {
    /// A reader of the file at `path` from its beginning (the file may not
    /// exist yet).
    pub fn new(path: &Path) -> Follower {
        Follower::resume(path, None)
    }

    /// A reader that goes on from `position` when the file at `path` is
    /// still the one it names and is not shorter; else from the beginning.
    pub fn resume(path: &Path, position: Option<Position>) -> Follower {
        Follower {
            path: path.to_path_buf(),
            file: None,
            resume: position,
            read_to: 0,
            buf: Vec::new(),
            start: 0,
            skipping: false,
            restarts: 0,
            too_long: 0,
        }
    }

    /// Where the next line starts; `None` before the file was opened.
    pub fn position(&self) -> Option<Position> {
        let (_, id) = self.file.as_ref()?;
        let pending = (self.buf.len() - self.start) as u64;
        Some(Position {
            file: *id,
            offset: self.read_to.saturating_sub(pending),
        })
    }

    /// How many times reading started over (see the module doc).
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// The next complete line (without its newline); `None` when the file
    /// holds no further complete line now.
    pub fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(line) = self.split_line() {
                return Ok(Some(line));
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// What follows the last newline, as a last line: for a reader that is
    /// not following, a final line whose newline is missing.
    pub fn take_rest(&mut self) -> Option<Vec<u8>> {
        let rest = self.buf.split_off(self.start);
        self.buf.clear();
        self.start = 0;
        let skipping = std::mem::take(&mut self.skipping);
        (!rest.is_empty() && !skipping).then_some(rest)
    }

    fn split_line(&mut self) -> Option<Vec<u8>> {
        loop {
            let pending = &self.buf[self.start..];
            let Some(nl) = pending.iter().position(|&b| b == b'\n') else {
                if pending.len() > MAX_LINE {
                    self.skipping = true;
                    self.too_long += 1;
                    self.buf.clear();
                    self.start = 0;
                }
                return None;
            };
            let line = pending[..nl].to_vec();
            self.start += nl + 1;
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            return Some(line);
        }
    }

    /// Reads more of the file into `buf`; false when there is nothing more
    /// to read now.
    fn fill(&mut self) -> io::Result<bool> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.file.is_none() && !self.open()? {
            return Ok(false);
        }
        let Some((file, id)) = &self.file else {
            return Ok(false);
        };
        let len = file.metadata()?.len();
        if len < self.read_to {
            // Truncated (copytruncate): the lines now there are new.
            self.start_over();
            return Ok(true);
        }
        if len == self.read_to {
            // At the end: is another file at the path now (renamed away,
            // or removed and made again)?
            let moved = match std::fs::metadata(&self.path) {
                Ok(meta) => FileId::of(&meta) != *id,
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(e),
            };
            if moved {
                self.file = None;
                self.start_over();
                return self.open();
            }
            return Ok(false);
        }
        let want = (len - self.read_to).min(CHUNK as u64) as usize;
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        let n = file.read_at(&mut self.buf[old..], self.read_to)?;
        self.buf.truncate(old + n);
        self.read_to += n as u64;
        Ok(n > 0)
    }

    fn start_over(&mut self) {
        self.read_to = 0;
        self.buf.clear();
        self.start = 0;
        self.skipping = false;
        self.restarts += 1;
    }

    /// Opens the file at the path; false when there is none.
    fn open(&mut self) -> io::Result<bool> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let id = FileId::of(&meta);
        if let Some(pos) = self.resume.take() {
            if pos.file == id && pos.offset <= meta.len() {
                self.read_to = pos.offset;
            }
        }
        self.file = Some((file, id));
        Ok(true)
    }
}

#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    container: std::borrow::Cow<'a, str>,
}

/// Whether `line` is a JSON object whose `container` is exactly `id`.
pub fn is_of(line: &[u8], id: &str) -> bool {
    serde_json::from_slice::<Head>(line).is_ok_and(|h| h.container == id)
}

/// What a container's egress added up to, from its connection lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EgressCounts {
    /// Attempts, each line counting for itself and the ones it stands for
    /// (`suppressed`).
    pub allowed: u64,
    pub denied: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl EgressCounts {
    pub fn add(&mut self, event: &Event) {
        if let Event::Connection {
            verdict,
            bytes_out,
            bytes_in,
            suppressed,
            ..
        } = event
        {
            let attempts = suppressed.saturating_add(1);
            match verdict {
                Verdict::Allowed => self.allowed = self.allowed.saturating_add(attempts),
                Verdict::Denied => self.denied = self.denied.saturating_add(attempts),
            }
            self.bytes_out = self.bytes_out.saturating_add(*bytes_out);
            self.bytes_in = self.bytes_in.saturating_add(*bytes_in);
        }
    }
}

/// The egress counts of one container, kept up to date by reading only
/// what was appended since the last call.
pub struct Tally {
    follower: Follower,
    id: String,
    restarts: u64,
    counts: EgressCounts,
}

impl Tally {
    pub fn new(path: &Path, id: &str) -> Tally {
        Tally {
            follower: Follower::new(path),
            id: id.to_string(),
            restarts: 0,
            counts: EgressCounts::default(),
        }
    }

    /// The counts over the lines the file holds now.
    pub fn update(&mut self) -> io::Result<EgressCounts> {
        while let Some(line) = self.follower.next_line()? {
            if self.follower.restarts() != self.restarts {
                // Rotated: count what the file holds now.
                self.restarts = self.follower.restarts();
                self.counts = EgressCounts::default();
            }
            if !is_of(&line, &self.id) {
                continue;
            }
            if let Ok(record) = serde_json::from_slice::<super::Record>(&line) {
                self.counts.add(&record.event);
            }
        }
        if self.follower.restarts() != self.restarts {
            self.restarts = self.follower.restarts();
            self.counts = EgressCounts::default();
        }
        Ok(self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .expect("open");
        f.write_all(text.as_bytes()).expect("write");
    }

    fn drain(f: &mut Follower) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(l) = f.next_line().expect("read") {
            out.push(String::from_utf8(l).expect("utf-8"));
        }
        out
    }

    #[test]
    fn lines_arrive_as_they_are_completed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let mut f = Follower::new(&path);
        assert!(drain(&mut f).is_empty(), "no file yet");
        append(&path, "one\ntw");
        assert_eq!(drain(&mut f), ["one"]);
        append(&path, "o\nthree\n");
        assert_eq!(drain(&mut f), ["two", "three"]);
        assert_eq!(f.position().expect("open").offset, 14);
        append(&path, "tail");
        assert!(drain(&mut f).is_empty());
        assert_eq!(f.take_rest().as_deref(), Some(&b"tail"[..]));
    }

    #[test]
    fn a_saved_position_is_resumed_only_in_the_same_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        append(&path, "one\ntwo\n");
        let mut f = Follower::new(&path);
        assert_eq!(f.next_line().expect("read").as_deref(), Some(&b"one"[..]));
        let pos = f.position().expect("pos");
        let mut again = Follower::resume(&path, Some(pos));
        assert_eq!(drain(&mut again), ["two"]);
        // Another file at the path: from its start.
        std::fs::remove_file(&path).expect("rm");
        append(&path, "new\n");
        let other = std::fs::metadata(&path).expect("meta");
        let mut moved = Follower::resume(
            &path,
            Some(Position {
                file: FileId {
                    dev: other.dev(),
                    ino: other.ino().wrapping_add(1),
                },
                offset: 2,
            }),
        );
        assert_eq!(drain(&mut moved), ["new"]);
    }

    #[test]
    fn copytruncate_and_rename_rotations_are_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        append(&path, "one\ntwo\n");
        let mut f = Follower::new(&path);
        assert_eq!(drain(&mut f), ["one", "two"]);
        // copytruncate: the same file, emptied, then written again.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open")
            .set_len(0)
            .expect("truncate");
        append(&path, "3\n");
        assert_eq!(drain(&mut f), ["3"]);
        assert_eq!(f.restarts(), 1);
        // Renamed away: the rest of the old file, then the new one.
        append(&path, "4\n");
        std::fs::rename(&path, dir.path().join("a.jsonl.1")).expect("rename");
        append(&path, "5\n");
        assert_eq!(drain(&mut f), ["4", "5"]);
        assert_eq!(f.restarts(), 2);
    }

    #[test]
    fn an_overlong_line_is_skipped_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let long = "x".repeat(MAX_LINE + CHUNK + 10);
        append(&path, &format!("a\n{long}\nb\n"));
        let mut f = Follower::new(&path);
        assert_eq!(drain(&mut f), ["a", "b"]);
        assert_eq!(f.too_long, 1);
    }

    #[test]
    fn only_lines_of_exactly_that_container() {
        assert!(is_of(
            br#"{"time":"t","container":"web","event":"exec"}"#,
            "web"
        ));
        assert!(!is_of(br#"{"container":"web2"}"#, "web"));
        assert!(!is_of(br#"{"container":"we"}"#, "web"));
        assert!(!is_of(br#"{"container":"web""#, "web"), "malformed");
        assert!(!is_of(b"not json web", "web"));
        assert!(!is_of(br#"{"name":"web"}"#, "web"));
    }

    #[test]
    fn egress_counts_add_up_connections_of_one_container() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let conn = |id: &str, verdict: &str, out: u64, inn: u64, suppressed: u64| {
            format!(
                "{{\"time\":\"2025-01-01T00:00:00.000Z\",\"container\":\"{id}\",\"event\":\"connection\",\
                 \"verdict\":\"{verdict}\",\"proto\":\"tcp\",\"dst\":\"192.0.2.1\",\"port\":443,\
                 \"bytes_out\":{out},\"bytes_in\":{inn},\"duration_ms\":5,\"suppressed\":{suppressed}}}\n"
            )
        };
        append(&path, &conn("c1", "allowed", 100, 2000, 0));
        append(&path, &conn("c1", "denied", 0, 0, 41));
        append(&path, &conn("c2", "allowed", 7, 7, 0));
        append(&path, "garbage\n");
        append(
            &path,
            "{\"time\":\"t\",\"container\":\"c1\",\"event\":\"exec\",\"argv\":[\"ls\"],\"user\":\"0:0\",\"cwd\":\"/\"}\n",
        );
        let mut t = Tally::new(&path, "c1");
        let want = EgressCounts {
            allowed: 1,
            denied: 42,
            bytes_out: 100,
            bytes_in: 2000,
        };
        assert_eq!(t.update().expect("update"), want);
        append(&path, &conn("c1", "allowed", 1, 1, 0));
        let more = t.update().expect("update");
        assert_eq!((more.allowed, more.bytes_out), (2, 101));
        // Emptied by a rotation: the counts are of what the file holds.
        std::fs::write(&path, conn("c1", "denied", 0, 0, 0)).expect("rewrite");
        let after = t.update().expect("update");
        assert_eq!(
            after,
            EgressCounts {
                denied: 1,
                ..Default::default()
            }
        );
    }
}
