//! Running client commands with a deadline and captured output.

use std::fmt;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one client command may take before the test calls it hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The outcome of one command.
#[derive(Debug, Clone)]
pub struct Output {
    pub command: String,
    /// Exit code, or `128 + signal` if the command died by a signal.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Panics with the whole output unless the command exited 0.
    #[track_caller]
    pub fn ok(self) -> Output {
        assert!(self.success(), "command failed:\n{self}");
        self
    }

    /// Panics unless the command exited with `code`.
    #[track_caller]
    pub fn code(self, code: i32) -> Output {
        assert_eq!(self.code, code, "unexpected exit code:\n{self}");
        self
    }

    /// stdout without surrounding whitespace.
    pub fn out(&self) -> &str {
        self.stdout.trim()
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "$ {}\nexit code: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.code, self.stdout, self.stderr
        )
    }
}

/// Renders a command for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` with `input` on stdin, waiting at most `timeout`; a command
/// still running then is killed and the test panics with what it printed.
pub fn run_with(cmd: &mut Command, input: Option<&[u8]>, timeout: Duration) -> Output {
    try_run_with(cmd, input, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// As `run_with`, but a command that cannot start or hangs is an `Err`
/// instead of a panic (for cleanup code that runs while unwinding).
pub fn try_run_with(
    cmd: &mut Command,
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output, String> {
    let command = describe(cmd);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start `{command}`: {e}"))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(format!("`{command}`: stdout and stderr were not piped"));
    };
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => return Err(format!("wait for `{command}`: {e}")),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    let Some(status) = status else {
        return Err(format!(
            "`{command}` did not finish within {timeout:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        ));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1);
    Ok(Output {
        command,
        code,
        stdout,
        stderr,
    })
}

/// Runs `cmd` with no input and the default timeout.
pub fn run(cmd: &mut Command) -> Output {
    run_with(cmd, None, DEFAULT_TIMEOUT)
}

/// `pid` and every process below it, parents first (from `/proc`'s ppid
/// links; a process that has reparented away is missed).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The fields after the comm, which may itself hold spaces and ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found
}

/// One line per thread of `pid`: its name, state, wait channel and system
/// call, as `/proc` shows them.
pub fn threads_of(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let mut out = format!("  {pid}: {}\n", cmdline.trim());
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let t = task.path();
        let read = |f: &str| {
            std::fs::read_to_string(t.join(f))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let status = read("status");
        let state = status
            .lines()
            .find_map(|l| l.strip_prefix("State:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        out.push_str(&format!(
            "    {} {}: {state}, wchan {}, syscall {}\n",
            task.file_name().to_string_lossy(),
            read("comm"),
            read("wchan"),
            read("syscall")
        ));
    }
    out
}
