//! The agentvm binary, driven as runc's shim drives runc: one short-lived
//! `agentvm <command>` process per request.
//!
//! Executing the binary (rather than linking the tiers into the shim) keeps
//! the shim a small multi-threaded ttrpc server that never forks inside
//! libcontainer, and gives both tiers the process model they already have
//! under the runc shim: `create` leaves one host pid (the container's init,
//! or a microVM's supervisor) that is re-parented to the shim, a
//! subreaper, whose exit status is the container's. One shim process can
//! then serve every container of a pod: each is one more pid it reaps.
//!
//! The shim framework reaps every child (`waitpid(-1)` on SIGCHLD) and
//! announces each exit on its monitor, so a command's exit status is read
//! from a monitor subscription taken before it is spawned, never from
//! `Child::wait` (which would find the child already reaped).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};

/// How long one agentvm command may take before the shim gives up on it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot run {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agentvm {command} failed (exit status {code}): {message}")]
    Failed {
        command: String,
        code: i32,
        message: String,
    },
    #[error("agentvm {command} did not exit within {} s", COMMAND_TIMEOUT.as_secs())]
    Timeout { command: String },
    #[error("cannot subscribe to the shim's exit monitor: {0}")]
    Monitor(String),
    #[error("agentvm {command} printed {what} that cannot be read: {detail}")]
    Output {
        command: String,
        what: &'static str,
        detail: String,
    },
}

/// The files of a process agentvm starts for the shim (`create`, `exec`).
pub struct ProcessFiles<'a> {
    /// Where agentvm writes the process's host pid.
    pub pid_file: &'a Path,
    /// agentvm's JSON log, where its errors are read from.
    pub log: &'a Path,
    /// With a terminal: where agentvm sends the pty's master.
    pub console_socket: Option<&'a Path>,
}

/// The stdio a command's process (and, for `create`, the container's
/// init, which inherits it) is given.
pub struct CreateStdio {
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// The `agentvm` binary and the state root it keeps containers under.
#[derive(Debug, Clone)]
pub struct Agentvm {
    binary: PathBuf,
    root: PathBuf,
}

impl Agentvm {
    /// `agentvm` next to the shim's own executable (where `make install`
    /// puts both), else the one in `PATH`; state under
    /// `/run/containerd/agentvm/<namespace>` as runc's shim keeps runc's.
    pub fn new(namespace: &str) -> Agentvm {
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("agentvm")))
            .filter(|p| p.is_file());
        Agentvm {
            binary: beside.unwrap_or_else(|| PathBuf::from("agentvm")),
            root: Path::new("/run/containerd/agentvm").join(namespace),
        }
    }

    fn command(&self, log: Option<&Path>) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--root").arg(&self.root);
        if let Some(log) = log {
            c.arg("--log").arg(log).args(["--log-format", "json"]);
        }
        c
    }

    /// `agentvm create`: the container's init (or supervisor) gets `stdio`,
    /// or with `console_socket` a terminal whose master agentvm sends
    /// there; its pid is read back from `pid_file`. Errors are read from
    /// `log`, since the process's own stderr is the container's. `config`:
    /// the agentvm config file for this container (a CRI handler's
    /// `ConfigPath`), else agentvm's own default.
    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        config: Option<&Path>,
        files: &ProcessFiles,
        stdio: CreateStdio,
    ) -> Result<i32, RuntimeError> {
        let mut c = self.command(Some(files.log));
        if let Some(config) = config {
            c.arg("--config").arg(config);
        }
        c.arg("create").arg("--bundle").arg(bundle);
        if let Some(socket) = files.console_socket {
            c.arg("--console-socket").arg(socket);
        }
        c.arg("--pid-file")
            .arg(files.pid_file)
            .arg(id)
            .current_dir(bundle)
            .stdin(stdio.stdin)
            .stdout(stdio.stdout)
            .stderr(stdio.stderr);
        self.run_for_pid(&mut c, "create", files)
    }

    /// `agentvm exec --detach --process <file>`: the process described in
    /// `process` (an OCI `Process`, JSON) starts in container `id` and its
    /// host pid is read back from the pid file. In the container tier that
    /// is the process itself, in the microvm tier the relay that carries
    /// its stdio and ends with its status; either is re-parented to the
    /// shim once agentvm exits.
    pub fn exec(
        &self,
        id: &str,
        process: &Path,
        files: &ProcessFiles,
        stdio: CreateStdio,
    ) -> Result<i32, RuntimeError> {
        let mut c = self.command(Some(files.log));
        c.arg("exec").arg("--detach").arg("--process").arg(process);
        if let Some(socket) = files.console_socket {
            c.arg("--console-socket").arg(socket);
        }
        c.arg("--pid-file")
            .arg(files.pid_file)
            .arg(id)
            .stdin(stdio.stdin)
            .stdout(stdio.stdout)
            .stderr(stdio.stderr);
        self.run_for_pid(&mut c, "exec", files)
    }

    /// Runs `c` (whose stdio belongs to the container) and reads the pid
    /// it wrote; its errors come from its JSON log.
    fn run_for_pid(
        &self,
        c: &mut Command,
        name: &str,
        files: &ProcessFiles,
    ) -> Result<i32, RuntimeError> {
        let code = self.wait(c, name)?;
        if code != 0 {
            return Err(RuntimeError::Failed {
                command: name.into(),
                code,
                message: last_error(files.log),
            });
        }
        let pid_file = files.pid_file;
        let text = std::fs::read_to_string(pid_file).map_err(|e| RuntimeError::Output {
            command: name.into(),
            what: "a pid file",
            detail: format!("{}: {e}", pid_file.display()),
        })?;
        text.trim().parse().map_err(|e| RuntimeError::Output {
            command: name.into(),
            what: "a pid file",
            detail: format!("{}: {text:?}: {e}", pid_file.display()),
        })
    }

    pub fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.run("pause", &[id]).map(drop)
    }

    pub fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.run("resume", &[id]).map(drop)
    }

    /// `agentvm update --resources -`: `resources` is the OCI
    /// `LinuxResources` as JSON, given on stdin.
    pub fn update(&self, id: &str, resources: &[u8]) -> Result<(), RuntimeError> {
        self.run_input(&["update", "--resources", "-", id], Some(resources))
            .map(drop)
    }

    /// `agentvm events --stats`: one stats line, runc's JSON (in the
    /// microvm tier the guest's figures).
    pub fn stats(&self, id: &str) -> Result<Vec<u8>, RuntimeError> {
        self.run("events", &["--stats", id])
    }

    /// `agentvm events` running in the background for its `oom` lines,
    /// counted from create on, looked for once a second (each look is a
    /// question to the guest in the microvm tier):
    /// stdout is a pipe to read them from, stderr a pipe of its warnings.
    /// Stats lines come once a day (`--interval`), i.e. practically never;
    /// the command ends by itself once the container has stopped (or is
    /// gone).
    pub fn spawn_events(&self, id: &str) -> Result<Child, RuntimeError> {
        let mut c = self.command(None);
        c.args(["events", "--oom-since-create", "--oom-interval", "1s"])
            .args(["--interval", "24h", id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().map_err(|source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        })
    }

    pub fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.run("start", &[id]).map(drop)
    }

    pub fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        let signal = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, signal.as_str()]);
        self.run_args(&args).map(drop)
    }

    pub fn delete(&self, id: &str, force: bool) -> Result<(), RuntimeError> {
        let mut args = vec!["delete"];
        if force {
            args.push("--force");
        }
        args.push(id);
        self.run_args(&args).map(drop)
    }

    /// The container's processes as host pids (`ps --format json`).
    pub fn pids(&self, id: &str) -> Result<Vec<u32>, RuntimeError> {
        let out = self.run("ps", &["--format", "json", id])?;
        // No processes print `null`, as runc's.
        serde_json::from_slice::<Option<Vec<u32>>>(&out)
            .map(Option::unwrap_or_default)
            .map_err(|e| RuntimeError::Output {
                command: "ps".into(),
                what: "a pid list",
                detail: e.to_string(),
            })
    }

    fn run(&self, command: &str, args: &[&str]) -> Result<Vec<u8>, RuntimeError> {
        let mut all = vec![command];
        all.extend_from_slice(args);
        self.run_args(&all)
    }

    fn run_args(&self, args: &[&str]) -> Result<Vec<u8>, RuntimeError> {
        self.run_input(args, None)
    }

    /// Runs `agentvm <args>` with `input` on its stdin (else none) and
    /// stdout and stderr captured; stdout on success, stderr's message on
    /// failure.
    fn run_input(&self, args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>, RuntimeError> {
        let name = args.first().copied().unwrap_or_default().to_string();
        let mut c = self.command(None);
        c.args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let subscription =
            monitor_subscribe(Topic::Pid).map_err(|e| RuntimeError::Monitor(e.to_string()))?;
        let mut child = c.spawn().map_err(|source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let pid = child.id() as i32;
        // Written by a thread, so that a command that prints before it
        // reads cannot deadlock against us; dropping the pipe is its end
        // of file.
        if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
            let input = input.to_vec();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        // Both pipes are drained at once so that neither fills and blocks
        // the command.
        let stderr_reader = child.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = e.read_to_end(&mut buf);
                buf
            })
        });
        let mut stdout = Vec::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_end(&mut stdout);
        }
        let stderr = stderr_reader
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let code = wait_exit(pid, &subscription.rx, &name)?;
        if code != 0 {
            return Err(RuntimeError::Failed {
                command: name,
                code,
                message: String::from_utf8_lossy(&stderr).trim().to_string(),
            });
        }
        Ok(stdout)
    }

    fn wait(&self, c: &mut Command, name: &str) -> Result<i32, RuntimeError> {
        let subscription =
            monitor_subscribe(Topic::Pid).map_err(|e| RuntimeError::Monitor(e.to_string()))?;
        let child = c.spawn().map_err(|source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        wait_exit(child.id() as i32, &subscription.rx, name)
    }
}

/// The exit status of `pid` as the framework's reaper announces it.
fn wait_exit(
    pid: i32,
    rx: &std::sync::mpsc::Receiver<containerd_shim::monitor::ExitEvent>,
    name: &str,
) -> Result<i32, RuntimeError> {
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(event) => {
                if matches!(event.subject, Subject::Pid(p) if p == pid) {
                    return Ok(event.exit_code);
                }
            }
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                return Err(RuntimeError::Timeout {
                    command: name.to_string(),
                })
            }
        }
    }
}

/// The message of the last error line agentvm wrote to its JSON log.
fn last_error(log: &Path) -> String {
    let mut text = String::new();
    if File::open(log)
        .and_then(|mut f| f.read_to_string(&mut text))
        .is_err()
    {
        return format!("no log at {}", log.display());
    }
    text.lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v.get("level").and_then(|l| l.as_str()) == Some("error"))
        .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or_else(|| format!("see {}", log.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_line_of_the_log_is_the_message() {
        let dir = std::env::temp_dir().join(format!("agentvm-shim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join("log.json");
        std::fs::write(
            &log,
            "{\"level\":\"debug\",\"msg\":\"starting\"}\nnot json\n\
             {\"level\":\"error\",\"msg\":\"no such file: /x\"}\n{\"level\":\"info\",\"msg\":\"bye\"}\n",
        )
        .expect("write log");
        assert_eq!(last_error(&log), "no such file: /x");
        assert!(last_error(&dir.join("missing")).starts_with("no log at"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
