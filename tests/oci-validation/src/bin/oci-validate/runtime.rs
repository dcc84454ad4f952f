//! Invoking one OCI runtime's command line, each with its own `--root`.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;

/// How long one runtime command may take before it is killed.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// One runtime under test: a name for the table and the command that runs it.
#[derive(Debug)]
pub struct Runtime {
    pub name: String,
    argv: Vec<String>,
    /// The runtime's private state directory (`--root`).
    pub root: PathBuf,
    /// Where this runtime's command output files go.
    logs: PathBuf,
    seq: AtomicUsize,
}

/// The result of one finished runtime command.
#[derive(Debug)]
pub struct Output {
    /// Exit code, or `None` when the command died by a signal or timed out.
    pub code: Option<i32>,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    /// On a timeout: the command's process tree as it was, each process
    /// with its state and where the kernel has it waiting.
    pub hung: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A short description for a failure detail: exit code and stderr tail.
    pub fn describe(&self) -> String {
        let status = match (self.timed_out, self.code) {
            (true, _) => format!("timed out [{}]", self.hung),
            (false, Some(c)) => format!("exit {c}"),
            (false, None) => match self.signal {
                Some(s) => format!("killed by signal {s}"),
                None => "no exit status".to_string(),
            },
        };
        let err = tail(self.stderr.trim(), 300);
        if err.is_empty() {
            status
        } else {
            format!("{status}: {err}")
        }
    }
}

/// The last `max` characters of `s`, on a char boundary, newlines flattened.
pub fn tail(s: &str, max: usize) -> String {
    let start = s
        .char_indices()
        .rev()
        .nth(max.saturating_sub(1))
        .map(|(i, _)| i)
        .unwrap_or(0);
    s[start..].replace('\n', " | ")
}

/// Parses `NAME=COMMAND [ARGS...]`, splitting the command on whitespace.
pub fn parse_spec(spec: &str) -> Result<(String, Vec<String>)> {
    let Some((name, cmd)) = spec.split_once('=') else {
        bail!("runtime {spec:?} is not NAME=COMMAND");
    };
    let argv: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
    if name.is_empty() || argv.is_empty() {
        bail!("runtime {spec:?} needs a name and a command");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        bail!("runtime name {name:?} may only use letters, digits, '-' and '_'");
    }
    Ok((name.to_string(), argv))
}

impl Runtime {
    pub fn new(name: String, argv: Vec<String>, work: &Path) -> Result<Runtime> {
        let root = work.join(format!("root-{name}"));
        let logs = work.join(format!("logs-{name}"));
        for d in [&root, &logs] {
            std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
        }
        Ok(Runtime {
            name,
            argv,
            root,
            logs,
            seq: AtomicUsize::new(0),
        })
    }

    /// The runtime's command with `--root` and `args` appended.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_via(&[], args)
    }

    /// The runtime's command as the arguments of `wrapper` (a program and
    /// its first arguments), or itself when `wrapper` is empty.
    fn command_via(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let mut argv = wrapper.iter().map(std::ffi::OsStr::new).chain(
            self.argv
                .iter()
                .map(std::ffi::OsStr::new)
                .chain([std::ffi::OsStr::new("--root"), self.root.as_os_str()])
                .chain(args.iter().map(std::ffi::OsStr::new)),
        );
        let mut c = Command::new(argv.next().unwrap_or_default());
        c.args(argv);
        c.stdin(Stdio::null());
        c
    }

    fn log_files(&self, what: &str) -> Result<(PathBuf, File, PathBuf, File)> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let out = self.logs.join(format!("{n:05}-{what}.out"));
        let err = self.logs.join(format!("{n:05}-{what}.err"));
        let fo = File::create(&out).with_context(|| format!("create {}", out.display()))?;
        let fe = File::create(&err).with_context(|| format!("create {}", err.display()))?;
        Ok((out, fo, err, fe))
    }

    /// Starts `args` with stdout and stderr going to fresh files, so a
    /// container that inherits them never blocks the harness.
    pub fn spawn(&self, args: &[&str]) -> Result<Pending> {
        self.spawn_ignoring(args, &[])
    }

    /// As [`Runtime::spawn`], with the `ignored` signals at SIG_IGN in the
    /// runtime's process (std gives every child an empty signal mask and the
    /// default SIGPIPE, and leaves other dispositions as the harness has them).
    fn spawn_ignoring(&self, args: &[&str], ignored: &[Signal]) -> Result<Pending> {
        self.spawn_via(&[], args, ignored)
    }

    fn spawn_via(&self, wrapper: &[&str], args: &[&str], ignored: &[Signal]) -> Result<Pending> {
        let what = args.first().copied().unwrap_or("cmd");
        let (out, fo, err, fe) = self.log_files(what)?;
        let mut command = self.command_via(wrapper, args);
        command.stdout(fo).stderr(fe);
        if !ignored.is_empty() {
            let ignored: Vec<libc::c_int> = ignored.iter().map(|s| *s as libc::c_int).collect();
            // SAFETY: the hook runs in the child between fork and exec and
            // only calls signal(2), which is async-signal-safe; it allocates
            // nothing (the list was built before the fork).
            unsafe {
                command.pre_exec(move || {
                    for &sig in &ignored {
                        if libc::signal(sig, libc::SIG_IGN) == libc::SIG_ERR {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .spawn()
            .with_context(|| format!("spawn {} {what}", self.argv[0]))?;
        crate::reaper::register(child.id());
        Ok(Pending { child, out, err })
    }

    /// Runs `args` to completion (or the timeout). With OCI_VALIDATE_TRACE
    /// set, each command and its duration go to stderr.
    pub fn run(&self, args: &[&str]) -> Result<Output> {
        self.run_ignoring(args, &[])
    }

    /// As [`Runtime::run`], with the `ignored` signals ignored in the
    /// runtime's process, as whoever started it may have left them: `nohup`
    /// ignores SIGHUP, a background job of a script SIGINT and SIGQUIT.
    pub fn run_ignoring(&self, args: &[&str], ignored: &[Signal]) -> Result<Output> {
        let started = Instant::now();
        let out = self.spawn_ignoring(args, ignored)?.wait(TIMEOUT)?;
        if std::env::var_os("OCI_VALIDATE_TRACE").is_some() {
            eprintln!(
                "  [{}] {} -> {:?} in {:.3}s",
                self.name,
                args.join(" "),
                out.code,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(out)
    }

    /// Runs `args` under `wrapper`, a program that runs its arguments (as
    /// `unshare -m sh -c SCRIPT sh`), to completion or the timeout.
    pub fn run_via(&self, wrapper: &[&str], args: &[&str]) -> Result<Output> {
        self.spawn_via(wrapper, args, &[])?.wait(TIMEOUT)
    }

    /// Runs `args`, ignoring the outcome (cleanup).
    pub fn quiet(&self, args: &[&str]) {
        // Cleanup is best-effort: a failure here shows up in later checks.
        let _ = self.run(args);
    }
}

/// A runtime command that was started and not yet waited for.
#[derive(Debug)]
pub struct Pending {
    pub child: Child,
    out: PathBuf,
    err: PathBuf,
}

/// Waits for a child up to `timeout`; `None` when it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().context("wait for runtime")? {
            return Ok(Some(st));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        crate::reaper::tick(Duration::from_millis(5));
    }
}

impl Pending {
    /// What the command has written to stdout so far.
    pub fn stdout_now(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits up to `timeout`, killing the command when it is exceeded.
    pub fn wait(mut self, timeout: Duration) -> Result<Output> {
        let status = wait_timeout(&mut self.child, timeout)?;
        let timed_out = status.is_none();
        let hung = if timed_out {
            process_tree(self.child.id())
        } else {
            String::new()
        };
        if timed_out {
            // Best-effort: the process may have exited right at the deadline.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        crate::reaper::unregister(self.child.id());
        Ok(Output {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
            timed_out,
            hung,
        })
    }
}

/// `pid` and its descendants as `pid comm state wchan` (threads' wait
/// channels after a `/`), for a failure detail.
fn process_tree(root: u32) -> String {
    let stat = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let ppid = stat(pid).and_then(|s| {
                let rest = s.rsplit_once(')')?.1.to_string();
                rest.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let wchan = |path: String| {
        std::fs::read_to_string(path)
            .map(|w| w.trim().to_string())
            .unwrap_or_default()
    };
    tree.iter()
        .map(|pid| {
            let s = stat(*pid).unwrap_or_default();
            let comm = s
                .split_once('(')
                .and_then(|(_, r)| r.rsplit_once(')'))
                .map(|(c, _)| c.to_string())
                .unwrap_or_default();
            let state = s
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                .unwrap_or_default();
            let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| {
                    d.flatten()
                        .map(|t| wchan(format!("{}/wchan", t.path().display())))
                        .collect()
                })
                .unwrap_or_default();
            format!("{pid} {comm} {state} /{}", threads.join(","))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runtime_specs() {
        let (n, a) = parse_spec("container=/x/agentvm --isolation=container").unwrap();
        assert_eq!(n, "container");
        assert_eq!(a, vec!["/x/agentvm", "--isolation=container"]);
        assert!(parse_spec("runc").is_err());
        assert!(parse_spec("=runc").is_err());
        assert!(parse_spec("a b=runc").is_err());
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("ab", 3), "ab");
        assert_eq!(tail("a\nb", 10), "a | b");
    }
}
