//! The OTLP exporter: one process per host (`agentvm audit-export`) that
//! follows the audit file and sends its lines as OpenTelemetry logs to
//! `[audit] otlp_endpoint`.
//!
//! The audit file is the source of truth: the writers of connection lines
//! run in the container's network namespace and cannot reach an endpoint
//! on the host's loopback, so no writer exports anything itself. The
//! exporter reads from a saved position (`<audit file>.export`), sends a
//! batch, and saves the position after the endpoint took it: delivery is
//! at least once, and a restarted exporter goes on where the last one
//! stopped. A failed send is retried with backoff (1 s doubling to a
//! minute); an answer that refuses the batch itself (4xx other than 408
//! and 429) drops that batch with a warning, so one bad batch cannot stop
//! the stream.
//!
//! `create` and `exec` start the exporter when an endpoint is configured
//! and none runs ([`ensure_running`]): detached (its own session, stdio on
//! /dev/null, no descriptor of the caller), holding a `flock` on
//! `<audit file>.export.lock` (which holds its pid) so only one runs. It
//! runs until SIGTERM or SIGINT, or until its lock file is removed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::otlp::{self, Endpoint};
use super::read::{Follower, Position};

/// Most records in one request.
pub const MAX_BATCH_RECORDS: usize = 512;
/// Most bytes of audit lines in one request.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Longest wait between two tries of a failed send.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often a failure that goes on is logged again.
const REPEAT_WARNING: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("audit exporter: cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The exporter's files, beside the audit file.
#[derive(Debug, Clone)]
pub struct Files {
    /// `flock`ed by the running exporter; holds its pid.
    pub lock: PathBuf,
    /// The saved position (JSON).
    pub state: PathBuf,
    /// The exporter's own log (warnings only).
    pub log: PathBuf,
}

impl Files {
    pub fn of(audit: &Path) -> Files {
        let with = |suffix: &str| {
            let mut p = audit.as_os_str().to_os_string();
            p.push(suffix);
            PathBuf::from(p)
        };
        Files {
            lock: with(".export.lock"),
            state: with(".export"),
            log: with(".export.log"),
        }
    }
}

/// What the exporter needs.
pub struct Options {
    pub audit: PathBuf,
    pub endpoint: Endpoint,
    /// How often the file is looked at when there is nothing new.
    pub poll: Duration,
    /// Connect, write and read timeout of one request.
    pub timeout: Duration,
}

impl Options {
    pub fn new(audit: PathBuf, endpoint: Endpoint) -> Options {
        Options {
            audit,
            endpoint,
            poll: Duration::from_millis(250),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The held lock of the running exporter.
struct Lock {
    file: File,
    path: PathBuf,
}

impl Lock {
    /// Whether the lock file at the path is still the one held (removing
    /// it, or the directory, tells the exporter to stop).
    fn still_there(&self) -> bool {
        match (std::fs::metadata(&self.path), self.file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExportError {
    let path = path.to_path_buf();
    move |source| ExportError::Io { what, path, source }
}

fn open_lock_file(path: &Path) -> Result<File, ExportError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error("create", dir))?;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(io_error("open", path))
}

/// Takes the lock without waiting; `None` when another process holds it.
fn try_lock(path: &Path) -> Result<Option<File>, ExportError> {
    let file = open_lock_file(path)?;
    // SAFETY: flock on a descriptor this function owns; no pointers.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(io_error("lock", path)(err))
}

/// The pid of the exporter that holds the lock for `audit`, if one runs.
pub fn running_pid(audit: &Path) -> Option<i32> {
    let files = Files::of(audit);
    match try_lock(&files.lock) {
        Ok(None) => std::fs::read_to_string(&files.lock)
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        _ => None,
    }
}

fn load_position(path: &Path) -> Option<Position> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

fn save_position(path: &Path, pos: &Position) -> Result<(), ExportError> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let data = serde_json::to_vec(pos).unwrap_or_default();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_error("write", &tmp))?;
    f.write_all(&data).map_err(io_error("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_error("replace", path))
}

/// A warning that is written when a failure starts and then at most every
/// [`REPEAT_WARNING`] while it goes on.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    quiet: u64,
}

impl Throttle {
    fn warn(&mut self, message: &str) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < REPEAT_WARNING)
        {
            self.quiet += 1;
            return;
        }
        if self.quiet > 0 {
            tracing::warn!("{message} (and {} more times)", self.quiet);
        } else {
            tracing::warn!("{message}");
        }
        self.last = Some(now);
        self.quiet = 0;
    }

    /// The failure is over; true when it had been reported.
    fn clear(&mut self) -> bool {
        self.quiet = 0;
        self.last.take().is_some()
    }
}

struct Exporter<'a> {
    opts: &'a Options,
    stop: &'a AtomicBool,
    lock: Lock,
    files: Files,
    send_failure: Throttle,
    read_failure: Throttle,
    save_failure: Throttle,
}

impl Exporter<'_> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || !self.lock.still_there()
    }

    /// Sleeps `d`, waking early to stop; false when told to stop.
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        loop {
            if self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(100)));
        }
    }

    /// Sends one batch until the endpoint takes it or refuses it for good;
    /// false when told to stop first.
    fn send(&mut self, body: &[u8], records: usize) -> bool {
        let mut backoff = Duration::from_secs(1);
        loop {
            match self.opts.endpoint.post(body, self.opts.timeout) {
                Ok(()) => {
                    if self.send_failure.clear() {
                        tracing::warn!(
                            "audit exporter: {} takes records again",
                            self.opts.endpoint.url()
                        );
                    }
                    return true;
                }
                Err(e) if !e.retryable() => {
                    tracing::warn!("audit exporter: {records} records dropped: {e}");
                    return true;
                }
                Err(e) => {
                    self.send_failure
                        .warn(&format!("audit exporter: {e}; retrying"));
                    if !self.sleep(backoff) {
                        return false;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn run(&mut self) {
        let mut follower = Follower::resume(&self.opts.audit, load_position(&self.files.state));
        let mut saved = follower.position();
        while !self.stopped() {
            let mut records = Vec::new();
            let mut bytes = 0usize;
            while records.len() < MAX_BATCH_RECORDS && bytes < MAX_BATCH_BYTES {
                match follower.next_line() {
                    Ok(Some(line)) => {
                        if let Some(r) = std::str::from_utf8(&line).ok().and_then(otlp::log_record)
                        {
                            bytes += line.len();
                            records.push(r);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.read_failure.warn(&format!(
                            "audit exporter: cannot read {}: {e}",
                            self.opts.audit.display()
                        ));
                        break;
                    }
                }
            }
            let idle = records.is_empty();
            if !idle {
                let n = records.len();
                if !self.send(&otlp::encode(records), n) {
                    return;
                }
            }
            let pos = follower.position();
            if pos != saved {
                if let Some(p) = &pos {
                    // Not saved: a restart sends these lines again.
                    if let Err(e) = save_position(&self.files.state, p) {
                        self.save_failure.warn(&e.to_string());
                    }
                }
                saved = pos;
            }
            if idle && !self.sleep(self.opts.poll) {
                break;
            }
        }
    }
}

/// Runs the exporter until `stop` is set or its lock file is removed.
/// Returns false at once when another exporter of the same file runs.
pub fn run(opts: &Options, stop: &AtomicBool) -> Result<bool, ExportError> {
    let files = Files::of(&opts.audit);
    let Some(file) = try_lock(&files.lock)? else {
        return Ok(false);
    };
    let mut lock = Lock {
        file,
        path: files.lock.clone(),
    };
    lock.file
        .set_len(0)
        .and_then(|_| writeln!(lock.file, "{}", std::process::id()))
        .map_err(io_error("write", &files.lock))?;
    let mut exporter = Exporter {
        opts,
        stop,
        lock,
        files,
        send_failure: Throttle::default(),
        read_failure: Throttle::default(),
        save_failure: Throttle::default(),
    };
    exporter.run();
    Ok(true)
}

/// Starts `agentvm audit-export` in the background when the config names
/// an endpoint and no exporter of its audit file runs. Best effort: a
/// failure is a warning (the lines stay in the file for a later exporter).
pub fn ensure_running(config: &crate::config::Config, config_path: Option<&Path>) {
    if config.audit.otlp_endpoint.is_none() {
        return;
    }
    let audit = config.audit.path();
    let files = Files::of(&audit);
    match try_lock(&files.lock) {
        Ok(Some(free)) => drop(free),
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("{e}: the audit trail is not exported");
            return;
        }
    }
    if let Err(e) = spawn(config_path, &files) {
        tracing::warn!("cannot start the audit exporter: {e}");
    }
}

fn spawn(config_path: Option<&Path>, files: &Files) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    if let Some(c) = config_path {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("--log")
        .arg(&files.log)
        .args(["--log-format", "json", "audit-export"])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes async-signal-safe calls (setsid, fork, _exit, close_range).
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Fork again so that the exporter is no child of ours (nor of
            // a shim that waits for our children) and never a session
            // leader that could get a controlling terminal.
            match libc::fork() {
                -1 => return Err(std::io::Error::last_os_error()),
                0 => {}
                _ => libc::_exit(0),
            }
            // Nothing of the caller's (locks, pipes) stays open in it.
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // The intermediate process exits at once.
    child.wait()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentvm_test_support::otlp::Receiver;
    use std::sync::Arc;

    fn exec_line(container: &str, n: usize) -> String {
        format!(
            "{{\"time\":\"2025-01-01T00:00:00.000Z\",\"container\":\"{container}\",\"event\":\"exec\",\
             \"argv\":[\"echo\",\"{n}\"],\"user\":\"0:0\",\"cwd\":\"/\",\"exit\":0}}\n"
        )
    }

    fn append(path: &Path, text: &str) {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .expect("open");
        f.write_all(text.as_bytes()).expect("write");
    }

    fn start(opts: Options) -> (Arc<AtomicBool>, std::thread::JoinHandle<bool>) {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || run(&opts, &s).expect("exporter"));
        (stop, t)
    }

    #[test]
    fn lines_reach_the_receiver_once_and_resume_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit.jsonl");
        append(&audit, &exec_line("c1", 1));
        append(&audit, "not a record\n");
        append(&audit, &exec_line("c2", 2));
        let receiver = Receiver::start().expect("receiver");
        let endpoint: Endpoint = receiver.endpoint().parse().expect("endpoint");
        let mut opts = Options::new(audit.clone(), endpoint.clone());
        opts.poll = Duration::from_millis(20);
        let (stop, t) = start(opts);
        let got = receiver.wait_for(2, Duration::from_secs(10));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].container, "c1");
        assert_eq!(got[0].body, exec_line("c1", 1).trim_end());
        assert_eq!(got[1].event_name, "agentvm.audit.exec");
        // A second exporter of the same file does not start.
        let other = Options::new(audit.clone(), endpoint.clone());
        assert!(!run(&other, &AtomicBool::new(false)).expect("second"));
        assert_eq!(running_pid(&audit), Some(std::process::id() as i32));
        stop.store(true, Ordering::Relaxed);
        assert!(t.join().expect("join"));
        // Restarted: only what was appended since.
        append(&audit, &exec_line("c3", 3));
        let mut opts = Options::new(audit.clone(), endpoint);
        opts.poll = Duration::from_millis(20);
        let (stop, t) = start(opts);
        let got = receiver.wait_for(3, Duration::from_secs(10));
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[2].container, "c3");
        // Removing the lock file stops it.
        std::fs::remove_file(Files::of(&audit).lock).expect("rm lock");
        assert!(t.join().expect("join"));
        drop(stop);
    }

    #[test]
    fn a_failing_endpoint_is_retried_until_it_takes_the_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit.jsonl");
        append(&audit, &exec_line("c1", 1));
        let receiver = Receiver::start().expect("receiver");
        receiver.fail_next(2, 503);
        let mut opts = Options::new(audit.clone(), receiver.endpoint().parse().expect("url"));
        opts.poll = Duration::from_millis(20);
        let (stop, t) = start(opts);
        let got = receiver.wait_for(1, Duration::from_secs(15));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(receiver.requests(), 3, "two refused, then taken");
        stop.store(true, Ordering::Relaxed);
        assert!(t.join().expect("join"));
    }

    #[test]
    fn a_batch_the_endpoint_refuses_is_dropped_not_retried_forever() {
        let dir = tempfile::tempdir().expect("tempdir");
        let audit = dir.path().join("audit.jsonl");
        append(&audit, &exec_line("c1", 1));
        let receiver = Receiver::start().expect("receiver");
        receiver.fail_next(1, 400);
        let mut opts = Options::new(audit.clone(), receiver.endpoint().parse().expect("url"));
        opts.poll = Duration::from_millis(20);
        let (stop, t) = start(opts);
        let start = Instant::now();
        while receiver.requests() < 1 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        append(&audit, &exec_line("c2", 2));
        let got = receiver.wait_for(1, Duration::from_secs(10));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].container, "c2");
        stop.store(true, Ordering::Relaxed);
        assert!(t.join().expect("join"));
    }
}
