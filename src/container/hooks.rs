//! OCI hooks run the way runc 1.1 runs them, so that a failing hook reads
//! the same: the state on stdin, stdout and stderr kept, and a failure
//! named by the hook's index in its list:
//!
//! - `error running hook #1: error running hook: exit status 3, stdout: out\n, stderr: err\n`
//! - `error running hook #0: error running hook: signal: killed, stdout: , stderr: `
//! - `error running hook #0: hook ran past specified timeout of 1.0s`
//! - `error running hook #0: fork/exec /no/such/hook: no such file or directory`
//!
//! libcontainer 0.7 runs the create-time hooks itself (throwing their
//! stdout away and forgetting which one failed), from its main process and
//! its init. So [`wrap`] turns each prestart, createRuntime, createContainer
//! and poststart hook of the spec libcontainer is handed into a call of this
//! binary ([`wrapper_main`], dispatched from `main` on [`WRAPPER_ARG`]),
//! which runs the real hook with [`run_one`] and, when it fails, leaves
//! runc's message in a file the caller reads ([`message_file`],
//! [`take_message`]). poststop hooks, which `delete` runs itself, go
//! through [`run`] directly. startContainer hooks run in the container
//! after its seccomp filter and user switch, where this binary has no
//! business running; libcontainer keeps them.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use oci_spec::runtime::{Hook, HookBuilder, Spec};

/// `agentvm WRAPPER_ARG INDEX TIMEOUT MESSAGE_FILE PATH [ARGV...]`.
pub const WRAPPER_ARG: &str = "--agentvm-run-hook";

/// A hook of a list that failed, as runc's `HookList.RunHooks` says it.
#[derive(Debug, thiserror::Error)]
#[error("error running hook #{index}: {error}")]
pub struct HookError {
    pub index: usize,
    pub error: RunError,
}

/// One hook's failure, in the words of runc's `Command.Run` (Go's
/// `exec.Cmd` errors included).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("fork/exec {path}: {errno}")]
    Spawn { path: String, errno: String },
    #[error("error running hook: {status}, stdout: {stdout}, stderr: {stderr}")]
    Failed {
        status: String,
        stdout: String,
        stderr: String,
    },
    #[error("hook ran past specified timeout of {secs:.1}s")]
    Timeout { secs: f64 },
    #[error("cannot wait for hook {path}: {errno}")]
    Wait { path: String, errno: String },
}

/// Runs the hooks in order, each with `state` (the OCI state's JSON) on
/// stdin, stopping at the first that fails.
pub fn run(hooks: &[Hook], state: &[u8]) -> Result<(), HookError> {
    for (index, hook) in hooks.iter().enumerate() {
        run_one(hook, state).map_err(|error| HookError { index, error })?;
    }
    Ok(())
}

/// Runs one hook: its `args` (the path as argv[0] when there are none),
/// only its `env`, the state on stdin, killed past its `timeout`.
pub fn run_one(hook: &Hook, state: &[u8]) -> Result<(), RunError> {
    let path = hook.path();
    let mut cmd = Command::new(path);
    match hook.args().as_deref() {
        Some([arg0, rest @ ..]) => {
            cmd.arg0(arg0).args(rest);
        }
        _ => {
            cmd.arg0(path);
        }
    }
    cmd.env_clear();
    for var in hook.env().iter().flatten() {
        match var.split_once('=') {
            Some((k, v)) => cmd.env(k, v),
            None => cmd.env(var, ""),
        };
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let path_text = path.display().to_string();
    let mut child = cmd.spawn().map_err(|e| RunError::Spawn {
        path: path_text.clone(),
        errno: go_errno(e),
    })?;
    // As Go's exec: the state is copied in while the hook runs, and a hook
    // that does not read it is no error.
    let stdin = child.stdin.take().map(|mut pipe| {
        let state = state.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&state);
        })
    });
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = hook
        .timeout()
        .map(|t| (Instant::now() + Duration::from_secs(t.max(0) as u64), t));
    let wait_error = |e: std::io::Error| RunError::Wait {
        path: path_text.clone(),
        errno: go_errno(e),
    };
    let status = loop {
        if let Some(status) = child.try_wait().map_err(wait_error)? {
            break Ok(status);
        }
        if let Some((at, secs)) = deadline {
            if Instant::now() >= at {
                let _ = child.kill();
                let _ = child.wait();
                break Err(RunError::Timeout { secs: secs as f64 });
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // As runc: the output is read to its end, also after a timeout.
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if let Some(t) = stdin {
        let _ = t.join();
    }
    let status = status?;
    if status.success() {
        return Ok(());
    }
    Err(RunError::Failed {
        status: go_exit_status(status),
        stdout,
        stderr,
    })
}

/// Go's `ExitError` text: `exit status 3`, `signal: killed`,
/// `signal: aborted (core dumped)`.
fn go_exit_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let core = if status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            };
            format!("signal: {}{core}", go_signal_name(sig))
        }
        None => format!("{status}"),
    }
}

/// Go's `syscall.Signal.String()` on Linux.
fn go_signal_name(sig: i32) -> String {
    const NAMES: [&str; 31] = [
        "hangup",
        "interrupt",
        "quit",
        "illegal instruction",
        "trace/breakpoint trap",
        "aborted",
        "bus error",
        "floating point exception",
        "killed",
        "user defined signal 1",
        "segmentation fault",
        "user defined signal 2",
        "broken pipe",
        "alarm clock",
        "terminated",
        "stack fault",
        "child exited",
        "continued",
        "stopped (signal)",
        "stopped",
        "stopped (tty input)",
        "stopped (tty output)",
        "urgent I/O condition",
        "CPU time limit exceeded",
        "file size limit exceeded",
        "virtual timer expired",
        "profiling timer expired",
        "window changed",
        "I/O possible",
        "power failure",
        "bad system call",
    ];
    usize::try_from(sig)
        .ok()
        .and_then(|s| s.checked_sub(1))
        .and_then(|i| NAMES.get(i))
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("signal {sig}"))
}

/// Go's `syscall.Errno` text: the C library's, lower-cased first letter
/// (`no such file or directory`, `permission denied`).
pub(crate) fn go_errno(e: impl Into<std::io::Error>) -> String {
    let e: std::io::Error = e.into();
    let text = match e.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_string(),
        None => e.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// Where a wrapped hook of container `id` leaves runc's message: beside
/// the state directories (a dot file, which `list` skips), since a failed
/// `create` has its directory removed.
pub fn message_file(root: &Path, id: &str) -> PathBuf {
    root.join(format!(".{id}.hook-error"))
}

/// The message a wrapped hook left, if any, removing the file.
pub fn take_message(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok();
    let _ = std::fs::remove_file(file);
    text.filter(|t| !t.is_empty())
}

/// Replaces the spec's prestart, createRuntime, createContainer and
/// poststart hooks with calls of `exe` (this binary) that run them as
/// runc does and leave a failure's message in `message_file`.
pub fn wrap(spec: &mut Spec, exe: &Path, message_file: &Path) {
    let Some(mut hooks) = spec.hooks().clone() else {
        return;
    };
    let wrap_list = |list: &Option<Vec<Hook>>| -> Option<Vec<Hook>> {
        list.as_ref().map(|l| {
            l.iter()
                .enumerate()
                .map(|(i, h)| wrap_one(h, i, exe, message_file))
                .collect()
        })
    };
    let prestart = wrap_list(hooks.prestart());
    hooks.set_prestart(prestart);
    let create_runtime = wrap_list(hooks.create_runtime());
    hooks.set_create_runtime(create_runtime);
    let create_container = wrap_list(hooks.create_container());
    hooks.set_create_container(create_container);
    let poststart = wrap_list(hooks.poststart());
    hooks.set_poststart(poststart);
    spec.set_hooks(Some(hooks));
}

fn wrap_one(hook: &Hook, index: usize, exe: &Path, message_file: &Path) -> Hook {
    let path = hook.path().to_string_lossy().into_owned();
    let mut args = vec![
        "agentvm".to_string(),
        WRAPPER_ARG.to_string(),
        index.to_string(),
        hook.timeout().map_or("-".to_string(), |t| t.to_string()),
        message_file.to_string_lossy().into_owned(),
        path.clone(),
    ];
    match hook.args().as_deref() {
        Some(a) if !a.is_empty() => args.extend(a.iter().cloned()),
        _ => args.push(path),
    }
    let mut b = HookBuilder::default().path(exe).args(args);
    if let Some(env) = hook.env() {
        b = b.env(env.clone());
    }
    // The wrapper keeps the time itself: a timeout of libcontainer's
    // would kill it before it says anything.
    b.build().unwrap_or_else(|_| hook.clone())
}

/// The wrapper: `args` are the arguments after [`WRAPPER_ARG`]. Its
/// environment is the hook's (libcontainer hands it the hook's `env`),
/// its stdin the state. Exits 0 when the hook succeeded, else 1 with the
/// message in the file.
pub fn wrapper_main(args: Vec<OsString>) -> std::process::ExitCode {
    let mut it = args.into_iter();
    let (Some(index), Some(timeout), Some(file), Some(path)) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        eprintln!("agentvm: {WRAPPER_ARG}: INDEX TIMEOUT MESSAGE_FILE PATH [ARGV...]");
        return std::process::ExitCode::from(2);
    };
    let argv: Vec<String> = it.map(|a| a.to_string_lossy().into_owned()).collect();
    let env: Vec<String> = std::env::vars_os()
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    let index: usize = index.to_string_lossy().parse().unwrap_or(0);
    let timeout: Option<i64> = timeout.to_string_lossy().parse().ok();
    let mut state = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut state);
    let mut b = HookBuilder::default()
        .path(PathBuf::from(&path))
        .args(argv)
        .env(env);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    let result = match b.build() {
        Ok(hook) => run_one(&hook, &state),
        Err(e) => Err(RunError::Spawn {
            path: path.to_string_lossy().into_owned(),
            errno: e.to_string(),
        }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let msg = HookError { index, error }.to_string();
            if std::fs::write(&file, &msg).is_err() {
                eprintln!("{msg}");
            }
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(args: &[&str], timeout: Option<i64>) -> Hook {
        let mut b = HookBuilder::default()
            .path("/bin/sh")
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        b.build().expect("hook")
    }

    #[test]
    fn failure_in_runcs_words() {
        let ok = hook(&["sh", "-c", "cat >/dev/null"], None);
        let bad = hook(&["sh", "-c", "echo out; echo err >&2; exit 3"], None);
        let err = run(&[ok, bad], b"{}").expect_err("second hook fails");
        assert_eq!(
            err.to_string(),
            "error running hook #1: error running hook: exit status 3, stdout: out\n, stderr: err\n"
        );
    }

    #[test]
    fn signal_timeout_and_missing_binary() {
        let killed = hook(&["sh", "-c", "kill -9 $$"], None);
        assert_eq!(
            run_one(&killed, b"").expect_err("killed").to_string(),
            "error running hook: signal: killed, stdout: , stderr: "
        );
        let slow = hook(&["sh", "-c", "exec sleep 5"], Some(1));
        assert_eq!(
            run_one(&slow, b"").expect_err("timeout").to_string(),
            "hook ran past specified timeout of 1.0s"
        );
        let missing = HookBuilder::default()
            .path("/nonexistent/hook")
            .build()
            .expect("hook");
        assert_eq!(
            run_one(&missing, b"").expect_err("missing").to_string(),
            "fork/exec /nonexistent/hook: no such file or directory"
        );
    }

    #[test]
    fn state_on_stdin_and_env() {
        let h = HookBuilder::default()
            .path("/bin/sh")
            .args(vec![
                "sh".to_string(),
                "-c".to_string(),
                "test \"$(cat)\" = state && test \"$V\" = x && test -z \"$HOME\"".to_string(),
            ])
            .env(vec!["V=x".to_string()])
            .build()
            .expect("hook");
        run_one(&h, b"state").expect("hook sees its stdin and env only");
    }

    #[test]
    fn wrap_keeps_path_args_env_and_index() {
        let mut spec = Spec::default();
        let hooks = oci_spec::runtime::HooksBuilder::default()
            .create_runtime(vec![
                hook(&["sh"], None),
                HookBuilder::default()
                    .path("/x")
                    .env(vec!["A=1".to_string()])
                    .timeout(7)
                    .build()
                    .expect("hook"),
            ])
            .poststop(vec![hook(&["sh"], None)])
            .build()
            .expect("hooks");
        spec.set_hooks(Some(hooks));
        wrap(&mut spec, Path::new("/agentvm"), Path::new("/m"));
        let hooks = spec.hooks().as_ref().expect("hooks");
        let cr = hooks.create_runtime().as_ref().expect("createRuntime");
        assert_eq!(cr[1].path(), Path::new("/agentvm"));
        assert_eq!(
            cr[1].args().as_deref(),
            Some(
                &[
                    "agentvm".to_string(),
                    WRAPPER_ARG.to_string(),
                    "1".to_string(),
                    "7".to_string(),
                    "/m".to_string(),
                    "/x".to_string(),
                    "/x".to_string()
                ][..]
            )
        );
        assert_eq!(cr[1].env().as_deref(), Some(&["A=1".to_string()][..]));
        assert!(cr[1].timeout().is_none());
        // poststop is run by `delete` itself.
        let ps = hooks.poststop().as_ref().expect("poststop");
        assert_eq!(ps[0].path(), Path::new("/bin/sh"));
    }

    #[test]
    fn go_words() {
        assert_eq!(go_signal_name(15), "terminated");
        assert_eq!(go_signal_name(64), "signal 64");
        let e = std::io::Error::from_raw_os_error(13);
        assert_eq!(go_errno(e), "permission denied");
        assert_eq!(go_errno(nix::errno::Errno::EINVAL), "invalid argument");
    }
}
