//! `agentvm exec` for a microVM container: a relay process on the host.
//!
//! The process runs in the guest; on the host the relay asks the supervisor
//! to start it, then carries its stdio (or terminal) and signals, and ends
//! with its status. With `--detach` the relay forks into the background and
//! its pid is what `--pid-file` receives, so the shim that waits on an exec
//! pid sees the guest process's life and exit status, as with runc.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::termios::{self, SetArg, Termios};
use signal_hook::consts::signal::*;

use super::client::{self, ExecControl, ExecEvent, SupervisorRequest};
use super::supervisor::tty::{window_size, HostPty};
use super::vmstate::{Status, VmState};
use super::{refused, status_name, MicrovmError, Result};
use crate::context::Context;
use crate::protocol::{Frame, Kind, Reply, MAX_PAYLOAD};

/// Status of an exec whose supervisor went away before the process ended.
const RELAY_LOST_STATUS: i32 = 255;

/// How long `exec --ignore-paused` waits for the supervisor's answer, which
/// comes when the container is resumed: no bound in practice (a socket
/// timeout cannot be "none" and still be set).
const UNTIL_RESUMED: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How the caller wants the exec'd process attached.
pub struct ExecRequest<'a> {
    pub process: &'a oci_spec::runtime::Process,
    pub console_socket: Option<&'a Path>,
    pub pid_file: Option<&'a Path>,
    pub detach: bool,
    pub ignore_paused: bool,
    /// `exec --cgroup`: sub-cgroups of the container's cgroup in the guest.
    pub cgroup: &'a [String],
}

/// Where the relay reads input and writes output.
pub(super) enum Io {
    /// The relay's own stdin/stdout/stderr (pipes from the shim, or the
    /// user's terminal for a foreground `exec -t`).
    Inherited { raw_tty: Option<Termios> },
    /// A pty whose master went to the caller's console socket.
    Pty(HostPty),
}

/// runc's refusals, word for word (`crate::container::exec` says the same).
pub use crate::container::exec::{PAUSED, STOPPED};

/// Runs `process` in container `id`. In the foreground it returns the
/// process's status as runc does (128+n when killed by signal n); with
/// `detach` it returns 0 once the process runs, and the relay in the
/// background ends as the process does.
pub fn exec(ctx: &Context, id: &str, req: ExecRequest) -> Result<u8> {
    let dir = ctx.container_dir(id);
    let state = VmState::load(&dir)?;
    let status = state.effective_status();
    // As runc 1.1: a created container takes an exec (the guest's container
    // exists, its init waits for start); a paused or stopped one does not.
    if status == Status::Stopped {
        return Err(refused(STOPPED.to_string()));
    }
    // runc's --ignore-paused starts the process in the frozen cgroup, where
    // it waits for resume, and exec returns then: the supervisor holds the
    // request until the container is resumed.
    if state.paused && !req.ignore_paused {
        return Err(refused(PAUSED.to_string()));
    }
    if !matches!(status, Status::Created | Status::Running) {
        return Err(refused(format!(
            "cannot exec in container {id}: it is {}",
            status_name(status, state.paused)
        )));
    }
    let terminal = req.process.terminal().unwrap_or(false);
    if req.console_socket.is_some() && !terminal {
        return Err(refused(
            "--console-socket is only meaningful with a terminal (process.terminal is false)",
        ));
    }
    if terminal && req.detach && req.console_socket.is_none() {
        return Err(refused(
            "a detached exec with a terminal needs --console-socket",
        ));
    }
    // The terminal first: if the console socket is bad, nothing has started.
    let io = match req.console_socket {
        Some(sock) if terminal => Io::Pty(HostPty::open_and_send(sock)?),
        _ => Io::Inherited {
            raw_tty: if terminal && !req.detach {
                make_stdin_raw()
            } else {
                None
            },
        },
    };
    start_and_relay(ctx, id, &req, io)
}

fn start_and_relay(ctx: &Context, id: &str, req: &ExecRequest, io: Io) -> Result<u8> {
    let started = std::time::Instant::now();
    let state = VmState::load(&ctx.container_dir(id))?;
    let (dir, target, request) = super::route(
        ctx,
        &state,
        SupervisorRequest::Exec {
            process: Box::new(req.process.clone()),
            cgroup: req.cgroup.to_vec(),
            ignore_paused: req.ignore_paused,
        },
    );
    // A paused container may stay paused for as long as its owner likes:
    // an exec that waits for resume waits as long.
    let timeout = match req.ignore_paused {
        true => UNTIL_RESUMED,
        false => Duration::from_secs(60),
    };
    let (conn, reply) = client::request(&dir, &target, &request, timeout)?;
    match reply {
        Reply::Started { .. } => {}
        Reply::Error { message } => {
            restore_tty(&io);
            return Err(MicrovmError::Guest(message));
        }
        other => {
            restore_tty(&io);
            return Err(refused(format!("unexpected reply to exec: {other:?}")));
        }
    }
    // The relay sees the end of the process in the guest: it writes the
    // audit line, in the foreground and detached alike.
    let audit = |outcome: &std::result::Result<i32, String>| {
        let (exit, error) = match outcome {
            Ok(status) => (Some(super::supervisor::exit_code(*status)), None),
            Err(why) => (None, Some(why.as_str())),
        };
        crate::audit::exec::append_or_warn(
            &ctx.config.audit.path(),
            id,
            crate::audit::exec::event(req.process, exit, error, Some(started.elapsed())),
        );
    };
    if !req.detach {
        let outcome = relay(conn, &io);
        restore_tty(&io);
        audit(&outcome);
        // A status outside 0..=255 is not one a process can have: the
        // relay reports it as lost, as the detached relay does.
        let status = outcome.unwrap_or(RELAY_LOST_STATUS);
        return Ok(u8::try_from(status).unwrap_or(RELAY_LOST_STATUS as u8));
    }
    // SAFETY: the CLI is single-threaded here (no thread has been started),
    // so the child may run arbitrary code after fork.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(MicrovmError::Io {
            what: "fork the exec relay".into(),
            source: e.into(),
        }),
        Ok(nix::unistd::ForkResult::Child) => {
            // A session of its own: the relay outlives this command and,
            // with a pty, takes it as its controlling terminal so resizes
            // arrive as SIGWINCH.
            let _ = nix::unistd::setsid();
            if matches!(io, Io::Pty(_)) {
                // The process's stdio is the pty: let go of the caller's
                // pipes, which it reads until EOF (containerd's shim does).
                detach_stdio();
            }
            let outcome = relay(conn, &io);
            audit(&outcome);
            super::exit_like(outcome.unwrap_or(RELAY_LOST_STATUS))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(conn);
            if let Some(path) = req.pid_file {
                super::write_pid_file(path, child.as_raw() as u32)?;
            }
            Ok(0)
        }
    }
}

/// Carries stdio and signals between this process and the guest process
/// until it exits; returns its status, or why its end was not seen.
pub(super) fn relay(conn: UnixStream, io: &Io) -> std::result::Result<i32, String> {
    // Signals first, so a resize or a signal sent as soon as the pid is
    // known is not lost.
    let signals = signal_hook::iterator::Signals::new([
        SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT, SIGALRM,
    ]);
    let writer = match conn.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => {
            tracing::error!("exec relay: {e}");
            return Err(format!("exec relay: {e}"));
        }
    };
    let size_source: Option<std::fs::File> = match io {
        Io::Pty(pty) => {
            pty.take_as_controlling();
            pty.reader().ok()
        }
        Io::Inherited { raw_tty: Some(_) } => std::fs::File::open("/dev/tty").ok(),
        Io::Inherited { raw_tty: None } => None,
    };
    let send_size = {
        let writer = writer.clone();
        move |f: &std::fs::File| {
            if let Some((rows, cols)) = window_size(f.as_fd()) {
                let frame = Frame::control(&ExecControl::Resize { rows, cols });
                if let Ok(mut w) = writer.lock() {
                    let _ = frame.write_to(&mut *w);
                }
            }
        }
    };
    if let Some(f) = &size_source {
        send_size(f);
    }
    match signals {
        Ok(mut signals) => {
            let writer = writer.clone();
            std::thread::spawn(move || {
                for sig in signals.forever() {
                    if sig == SIGWINCH {
                        if let Some(f) = &size_source {
                            send_size(f);
                        }
                        continue;
                    }
                    let frame = Frame::control(&ExecControl::Signal { signal: sig });
                    let Ok(mut w) = writer.lock() else { return };
                    if frame.write_to(&mut *w).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("exec relay: signals will not be forwarded: {e}"),
    }
    let (input, mut out, mut err): (Box<dyn Read + Send>, Box<dyn Write>, Box<dyn Write>) = match io
    {
        Io::Pty(pty) => match (pty.reader(), pty.writer(), pty.writer()) {
            (Ok(r), Ok(w), Ok(e)) => (Box::new(r), Box::new(w), Box::new(e)),
            _ => {
                tracing::error!("exec relay: cannot use the pty");
                return Err("exec relay: cannot use the pty".into());
            }
        },
        Io::Inherited { .. } => (
            Box::new(std::io::stdin()),
            Box::new(std::io::stdout()),
            Box::new(std::io::stderr()),
        ),
    };
    spawn_input(input, writer);
    let mut conn = conn;
    loop {
        let frame = match Frame::read_from(&mut conn) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("exec relay: the supervisor went away: {e}");
                return Err(format!("exec relay: the supervisor went away: {e}"));
            }
        };
        match frame.kind {
            Kind::Stdout => {
                let _ = out.write_all(&frame.payload).and_then(|_| out.flush());
            }
            Kind::Stderr => {
                let _ = err.write_all(&frame.payload).and_then(|_| err.flush());
            }
            Kind::Control => match frame.parse_control::<ExecEvent>() {
                Ok(ExecEvent::Exit { status }) => return Ok(status),
                Err(e) => {
                    tracing::error!("exec relay: bad message from the supervisor: {e}");
                    return Err(format!("exec relay: bad message from the supervisor: {e}"));
                }
            },
            Kind::Stdin | Kind::StdinClose => {}
        }
    }
}

/// Pumps input to the guest process; end of input closes its stdin.
fn spawn_input(mut input: Box<dyn Read + Send>, writer: Arc<Mutex<UnixStream>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; MAX_PAYLOAD.min(64 * 1024)];
        loop {
            let frame = match input.read(&mut buf) {
                Ok(0) | Err(_) => Frame::data(Kind::StdinClose, 0, b""),
                Ok(n) => Frame::data(Kind::Stdin, 0, &buf[..n]),
            };
            let last = frame.kind == Kind::StdinClose;
            let Ok(mut w) = writer.lock() else { return };
            if frame.write_to(&mut *w).is_err() || last {
                return;
            }
        }
    });
}

/// Points fds 0-2 at /dev/null.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors, which this
            // process owns; `null` stays open for the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Puts our stdin in raw mode when it is a terminal (a foreground `exec -t`
/// without a console socket): the guest's pty does the line editing.
fn make_stdin_raw() -> Option<Termios> {
    let stdin = std::io::stdin();
    let saved = termios::tcgetattr(stdin.as_fd()).ok()?;
    let mut raw = saved.clone();
    termios::cfmakeraw(&mut raw);
    termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).ok()?;
    Some(saved)
}

fn restore_tty(io: &Io) {
    if let Io::Inherited {
        raw_tty: Some(saved),
    } = io
    {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
    }
}
