//! The agent's single-threaded event loop: poll(2) over the control port,
//! a signalfd for SIGCHLD, and every process's stdio.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::boot::Booted;
use super::port::Port;
use super::stream::{Exited, Read, Stream};
use super::{sys, GuestError};
use crate::context::Context;
use crate::protocol::{Frame, GuestMessage, HostMessage, Kind, Reply, INIT_STREAM, VERSION};

/// How long the agent waits, after a process was reaped, for its output to
/// reach EOF before it reports the exit anyway (a background descendant
/// may hold the pipe open). What is readable by then is still sent.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// Size of one stdout/stderr read, and so of the largest data frame the
/// agent sends (well under MAX_PAYLOAD).
const OUTPUT_CHUNK: usize = 64 * 1024;

pub struct Agent {
    pub(super) port: Port,
    sigchld: SignalFd,
    pub(super) ctx: Context,
    /// Why the virtio-fs share is missing, if it is.
    pub(super) share_error: Option<String>,
    /// Processes by stream id: 0 the container's init, N exec N.
    pub(super) streams: BTreeMap<u32, Stream>,
    /// The container's network namespace, once `Network` configured it.
    pub(super) netns: Option<std::path::PathBuf>,
    /// The pod's further containers: their init's stream id and their id
    /// in the container tier here.
    pub(super) members: BTreeMap<u32, String>,
    /// The cgroup directory of the container's init, once created: its
    /// OOM-kill count goes with its Exit.
    pub(super) init_cgroup: Option<std::path::PathBuf>,
    /// When to give guest RAM back to the host ([`super::trim`]): a while
    /// after the last request, once.
    trim_at: Option<Instant>,
    buf: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Token {
    Port,
    Sigchld,
    Output(u32, Kind),
    Input(u32),
}

/// What the loop does after a frame.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    PowerOff,
}

impl Agent {
    pub fn new(port: Port, ctx: Context, share_error: Option<String>) -> Result<Agent, GuestError> {
        sys::block_sigchld().map_err(|source| GuestError::Sys {
            what: "cannot block SIGCHLD",
            source,
        })?;
        let sigchld = SignalFd::with_flags(
            &sys::sigchld(),
            SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
        )
        .map_err(|source| GuestError::Sys {
            what: "cannot create a signalfd for SIGCHLD",
            source,
        })?;
        Ok(Agent {
            port,
            sigchld,
            ctx,
            share_error,
            streams: BTreeMap::new(),
            netns: None,
            members: BTreeMap::new(),
            init_cgroup: None,
            trim_at: None,
            buf: vec![0u8; OUTPUT_CHUNK],
        })
    }

    /// The first message: blocks until the host connects to the port.
    /// Then the boot warnings, as Log events, and when /init started and
    /// was ready (seconds since the kernel started) as a debug Log.
    pub fn hello(&mut self, booted: Booted, init_at: Duration) -> Result<(), GuestError> {
        let ready_at = sys::since_boot();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let version = std::fs::read_to_string("/proc/sys/kernel/version").unwrap_or_default();
        let kernel = format!("Linux {} {}", release.trim(), version.trim());
        self.port.send(&GuestMessage::Hello {
            version: VERSION,
            kernel,
            boot: Some(crate::protocol::GuestBoot {
                init_us: micros(init_at),
                ready_us: micros(ready_at),
            }),
        })?;
        for w in booted.warnings {
            self.port.log("warn", w)?;
        }
        if let Some(e) = self.share_error.clone() {
            self.port.log("error", e)?;
        }
        self.port.log(
            "debug",
            format!(
                "boot: /init started {:.3} s after the kernel, agent ready at {:.3} s ({})",
                init_at.as_secs_f64(),
                ready_at.as_secs_f64(),
                booted
                    .phases
                    .iter()
                    .map(|(name, d)| format!("{name} {} ms", d.as_millis()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )?;
        Ok(())
    }

    /// Serves the host until it asks for Shutdown (`Ok`) or the channel
    /// fails (`Err`); either way the caller ends the VM.
    pub fn serve(&mut self) -> Result<(), GuestError> {
        loop {
            self.reap();
            self.report_exits()?;
            self.trim_if_idle()?;
            for (token, revents) in self.wait()? {
                match token {
                    Token::Port => {
                        if self.on_port(revents)? == Flow::PowerOff {
                            return Ok(());
                        }
                    }
                    Token::Sigchld => while let Ok(Some(_)) = self.sigchld.read_signal() {},
                    Token::Output(id, kind) => self.on_output(id, kind)?,
                    Token::Input(id) => self.on_input(id),
                }
            }
        }
    }

    /// Polls everything the agent waits on; returns what is ready.
    fn wait(&self) -> Result<Vec<(Token, PollFlags)>, GuestError> {
        let mut tokens = vec![Token::Port, Token::Sigchld];
        let mut fds = vec![
            PollFd::new(self.port.fd(), PollFlags::POLLIN),
            PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN),
        ];
        for (&id, stream) in &self.streams {
            for out in &stream.outputs {
                tokens.push(Token::Output(id, out.kind));
                fds.push(PollFd::new(out.fd.as_fd(), PollFlags::POLLIN));
            }
            if let Some(input) = stream.stdin.as_ref().filter(|i| i.wants_write()) {
                tokens.push(Token::Input(id));
                fds.push(PollFd::new(input.fd(), PollFlags::POLLOUT));
            }
        }
        let timeout = match self.next_deadline() {
            None => PollTimeout::NONE,
            Some(d) => {
                let ms = d.saturating_duration_since(Instant::now()).as_millis() + 1;
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
        };
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(Vec::new()),
            Err(source) => {
                return Err(GuestError::Sys {
                    what: "poll failed",
                    source,
                })
            }
        }
        Ok(tokens
            .into_iter()
            .zip(
                fds.iter()
                    .map(|f| f.revents().unwrap_or(PollFlags::empty())),
            )
            .filter(|(_, r)| !r.is_empty())
            .collect())
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|s| s.exit.as_ref().map(|e| e.deadline))
            .chain(self.trim_at)
            .min()
    }

    /// Gives guest RAM back to the host once no request came for
    /// [`super::trim::IDLE`]; says what it did in a debug line.
    fn trim_if_idle(&mut self) -> Result<(), GuestError> {
        if self.trim_at.is_none_or(|at| at > Instant::now()) {
            return Ok(());
        }
        self.trim_at = None;
        let started = Instant::now();
        let line = match super::trim::trim() {
            Ok(t) => format!(
                "trim: page cache {} -> {} KiB in {} ms",
                t.cached_before_kib,
                t.cached_after_kib,
                started.elapsed().as_millis()
            ),
            Err(e) => format!("trim: {e}"),
        };
        self.port.log("debug", line)?;
        Ok(())
    }

    /// Reaps every child that ended. As PID 1 the agent also inherits the
    /// orphans of the whole VM; only the processes it started are reported.
    fn reap(&mut self) {
        while let Some(status) = sys::reap_one() {
            let Some((pid, code)) = sys::exit_status(status) else {
                continue;
            };
            if let Some(stream) = self
                .streams
                .values_mut()
                .find(|s| s.pid == pid && s.running())
            {
                stream.exit = Some(Exited {
                    status: code,
                    deadline: Instant::now() + EXIT_GRACE,
                });
            }
        }
    }

    /// Sends Exit for every process that was reaped and whose output is
    /// drained (or whose grace period ran out), and forgets it.
    fn report_exits(&mut self) -> Result<(), GuestError> {
        let now = Instant::now();
        let done: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.finished() || s.exit.as_ref().is_some_and(|e| e.deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in done {
            self.drain(id)?;
            if let Some(stream) = self.streams.remove(&id) {
                let status = stream.exit.map(|e| e.status).unwrap_or_default();
                let oom_kills = match (id, &self.init_cgroup) {
                    (INIT_STREAM, Some(dir)) => Some(super::requests::oom_kills(dir)),
                    _ => None,
                };
                self.port.send(&GuestMessage::Exit {
                    id,
                    status,
                    oom_kills,
                })?;
            }
        }
        Ok(())
    }

    /// Sends whatever output of stream `id` is readable right now.
    fn drain(&mut self, id: u32) -> Result<(), GuestError> {
        for kind in [Kind::Stdout, Kind::Stderr] {
            loop {
                let Some(stream) = self.streams.get_mut(&id) else {
                    return Ok(());
                };
                match stream.read_output(kind, &mut self.buf) {
                    Read::Data(n) => self.port.send_data(kind, id, &self.buf[..n])?,
                    Read::Eof | Read::WouldBlock => break,
                }
            }
        }
        Ok(())
    }

    fn on_output(&mut self, id: u32, kind: Kind) -> Result<(), GuestError> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if let Read::Data(n) = stream.read_output(kind, &mut self.buf) {
            self.port.send_data(kind, id, &self.buf[..n])?;
        }
        Ok(())
    }

    fn on_input(&mut self, id: u32) {
        if let Some(stream) = self.streams.get_mut(&id) {
            if let Some(input) = stream.stdin.as_mut() {
                if !input.flush() {
                    stream.stdin = None;
                }
            }
        }
    }

    fn on_port(&mut self, revents: PollFlags) -> Result<Flow, GuestError> {
        if !revents.intersects(PollFlags::POLLIN) {
            // POLLHUP alone: the host side is not connected any more.
            return Err(GuestError::HostGone);
        }
        if !self.port.fill()? {
            return Err(GuestError::HostGone);
        }
        while let Some(frame) = self.port.next_frame()? {
            if self.on_frame(frame)? == Flow::PowerOff {
                return Ok(Flow::PowerOff);
            }
        }
        Ok(Flow::Continue)
    }

    fn on_frame(&mut self, frame: Frame) -> Result<Flow, GuestError> {
        match frame.kind {
            Kind::Control => {
                let msg = frame.parse_control::<HostMessage>();
                // What a pool VM's warm-up read stays until its container
                // comes: a trim would undo it (super::warm).
                if !matches!(msg, Ok(HostMessage::Warm)) {
                    self.trim_at = Some(Instant::now() + super::trim::IDLE);
                }
                let (reply, flow) = match msg {
                    Ok(HostMessage::Shutdown) => {
                        self.shutdown();
                        (Reply::Ok, Flow::PowerOff)
                    }
                    Ok(msg) => (self.handle(msg), Flow::Continue),
                    Err(e) => (
                        Reply::Error {
                            message: format!("guest agent: {e}"),
                        },
                        Flow::Continue,
                    ),
                };
                self.port.send(&GuestMessage::Reply(reply))?;
                if flow == Flow::PowerOff {
                    self.port.flush();
                }
                // A request may have started or ended processes.
                self.reap();
                Ok(flow)
            }
            Kind::Stdin => {
                self.on_stdin(frame.stream, &frame.payload)?;
                Ok(Flow::Continue)
            }
            Kind::StdinClose => {
                if let Some(stream) = self.streams.get_mut(&frame.stream) {
                    if let Some(input) = stream.stdin.as_mut() {
                        input.request_close();
                        if !input.flush() {
                            stream.stdin = None;
                        }
                    }
                }
                Ok(Flow::Continue)
            }
            Kind::Stdout | Kind::Stderr => {
                self.port.log(
                    "warn",
                    format!(
                        "guest agent: ignored a {:?} frame from the host (stream {})",
                        frame.kind, frame.stream
                    ),
                )?;
                Ok(Flow::Continue)
            }
        }
    }

    fn on_stdin(&mut self, id: u32, bytes: &[u8]) -> Result<(), GuestError> {
        let problem = match self.streams.get_mut(&id) {
            Some(stream) => match stream.stdin.as_mut() {
                Some(input) => {
                    let kept = input.push(bytes);
                    if !input.flush() {
                        stream.stdin = None;
                    }
                    (!kept).then(|| {
                        format!(
                            "dropped {} bytes of stdin for stream {id}: the process is not reading",
                            bytes.len()
                        )
                    })
                }
                None => Some(format!("stdin for stream {id}, whose stdin is closed")),
            },
            None => Some(format!("stdin for stream {id}, which has no process")),
        };
        if let Some(p) = problem {
            self.port.log("warn", format!("guest agent: {p}"))?;
        }
        Ok(())
    }

    /// Kills every process of the VM and syncs, for Shutdown.
    fn shutdown(&mut self) {
        sys::kill_everything(Duration::from_secs(3));
        self.streams.clear();
        sys::flush_dirty();
    }

    /// After a fatal error: tell the host if the channel still works, then
    /// stop everything.
    pub fn fail(&mut self, err: &GuestError) {
        if err.reportable() {
            let _ = self.port.log(
                "error",
                format!("guest agent stops: {err}; the VM powers off"),
            );
        }
        self.shutdown();
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
