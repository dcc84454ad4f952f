//! The supervisor's running phase: relay stdio, forward signals and CLI
//! requests to the guest, and end with the workload.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oci_spec::runtime::{Process, Spec};
use signal_hook::consts::signal::*;

use super::guest_log::{self, GuestLog};
use super::relays::Relays;
use super::{Args, Booted, SupervisorError, VM_LOST_STATUS};
use crate::microvm::client::{ExecControl, ExecEvent, StartHooks, SupervisorRequest};
use crate::microvm::vmstate::{Status, VmState};
use crate::protocol::{
    Frame, GuestMessage, HostMessage, Kind, MemberRequest, PodNamespace, ProtocolError, Reply,
    INIT_STREAM, MAX_PAYLOAD,
};

/// How long a request to the guest may take before the guest is declared
/// unresponsive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits up to `timeout` for the guest's reply to the oldest request it
/// has not answered yet, on a connection nobody else reads, logging what
/// the guest logs meanwhile. Used before the reader thread runs.
pub fn wait_reply(
    guest: &mut UnixStream,
    timeout: Duration,
    log: &mut GuestLog,
) -> Result<Reply, SupervisorError> {
    let channel = |e: std::io::Error| SupervisorError::Guest(format!("control channel: {e}"));
    guest.set_read_timeout(Some(timeout)).map_err(channel)?;
    let result = loop {
        let frame = match Frame::read_from(guest) {
            Ok(f) => f,
            Err(ProtocolError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break Err(SupervisorError::Guest(format!(
                    "the guest did not answer within {timeout:?}"
                )))
            }
            Err(e) => break Err(e.into()),
        };
        if frame.kind != Kind::Control {
            continue;
        }
        match frame.parse_control::<GuestMessage>() {
            Ok(GuestMessage::Reply(r)) => break Ok(r),
            Ok(GuestMessage::Log { level, message }) => guest_log::emit(log, &level, &message),
            Ok(other) => {
                break Err(SupervisorError::Violation(format!(
                    "unexpected message from the guest: {other:?}"
                )))
            }
            Err(e) => break Err(e.into()),
        }
    };
    guest.set_read_timeout(None).map_err(channel)?;
    result
}

/// Runs the spec's hooks of the given kinds on the host, with the
/// supervisor as the container's pid.
pub fn run_hooks(spec: &Spec, state: &VmState, kinds: &[&str]) -> Result<(), String> {
    let Some(hooks) = spec.hooks() else {
        return Ok(());
    };
    let status = match state.status {
        Status::Creating => libcontainer::container::ContainerStatus::Creating,
        Status::Created => libcontainer::container::ContainerStatus::Created,
        Status::Running => libcontainer::container::ContainerStatus::Running,
        Status::Stopped => libcontainer::container::ContainerStatus::Stopped,
    };
    let mut lc_state = libcontainer::container::state::State::new(
        &state.id,
        status,
        state.supervisor_pid,
        state.bundle.clone(),
    );
    lc_state.annotations = Some(state.annotations.clone());
    let oci_state = oci_spec::runtime::State::try_from(&lc_state).map_err(|e| e.to_string())?;
    let state_json = serde_json::to_vec(&oci_state).map_err(|e| e.to_string())?;
    for kind in kinds {
        let list = match *kind {
            "prestart" => hooks.prestart(),
            "createRuntime" => hooks.create_runtime(),
            "createContainer" => hooks.create_container(),
            "poststart" => hooks.poststart(),
            "poststop" => hooks.poststop(),
            _ => &None,
        };
        // runc's words: `error running hook #1: error running hook: exit
        // status 3, stdout: ..., stderr: ...`.
        if let Some(list) = list {
            crate::container::hooks::run(list, &state_json).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

enum Event {
    /// The container's init ended: its status, and its cgroup's OOM-kill
    /// count as the guest gave it.
    InitExit(i32, Option<u64>),
    /// The VM cannot be trusted or reached any more (a protocol violation,
    /// a broken channel, an unanswered request).
    GuestGone(String),
    Signal(i32),
}

/// How the container ended.
enum End {
    /// The workload exited with this status (and OOM-kill count); the
    /// guest still answers.
    Exited(i32, Option<u64>),
    /// The VM died or the control channel is broken or untrusted.
    Lost,
}

/// What the reader thread and request handlers share.
struct Shared {
    writer: Mutex<UnixStream>,
    /// The reply slot of the one request in flight.
    pending: Mutex<Option<Sender<Reply>>>,
    /// Serialises requests: the guest answers in order.
    request_lock: Mutex<()>,
    /// Exec relays by stream.
    relays: Relays<UnixStream>,
    guest_log: Mutex<GuestLog>,
    /// Where stream 0's output goes.
    stdout: Mutex<Box<dyn Write + Send>>,
    stderr: Mutex<Box<dyn Write + Send>>,
    events: Sender<Event>,
    /// The state directory, as logs name it.
    dir: std::path::PathBuf,
    /// The same directory as the jailed supervisor reaches it.
    state_dir: StateDir,
    /// The container's startContainer hooks, read from its bundle before
    /// the jail.
    start_hooks: Option<StartHooks>,
    /// `agentvm start/kill/ps…` requests being answered (not execs, which
    /// last as long as their process): the supervisor lets them finish
    /// before it ends, so that the workload's end never cuts a reply off
    /// (a `start` whose workload was killed at once saw "control channel
    /// closed") nor lands a `start`'s "running" after the final "stopped".
    answering: (Mutex<usize>, std::sync::Condvar),
    /// The balloon's side of `update`, where the VM has one to change.
    guest_ram: Mutex<Option<super::GuestRam>>,
    /// The pod's further containers in this VM, by host id.
    members: Mutex<std::collections::HashMap<String, Member>>,
    /// Which containers of this VM are paused, and whether the workload
    /// ended; `thawed` wakes the execs that wait for a resume.
    paused: Mutex<Paused>,
    thawed: std::sync::Condvar,
    /// The VMM's own counters, where it keeps them, and the guest's names
    /// of its NICs in order.
    counters: Option<Arc<dyn crate::microvm::vmm::Counters>>,
    nic_names: Vec<String>,
}

/// A further container of the pod in this VM.
struct Member {
    /// The guest stream of its init.
    stream: u32,
    /// Its startContainer hooks, as its relay read them at create.
    start_hooks: Option<StartHooks>,
}

/// The container's state directory through a descriptor opened before the
/// jail. The jailed supervisor has no `CAP_DAC_READ_SEARCH`: as uid 0 it
/// still needs search permission on each directory above its own to walk
/// a path there, and a parent made by another program may not give it
/// (`/run/containerd` made `0600` by a Go shim's `MkdirAll`). Through
/// `/proc/self/fd/<fd>` the kernel starts from the directory itself.
struct StateDir {
    fd: std::os::fd::OwnedFd,
}

impl StateDir {
    fn open(dir: &std::path::Path) -> std::io::Result<StateDir> {
        Ok(StateDir {
            fd: crate::container::sys::open_dir_path(dir)?,
        })
    }

    fn path(&self) -> std::path::PathBuf {
        use std::os::fd::AsRawFd;
        format!("/proc/self/fd/{}", self.fd.as_raw_fd()).into()
    }
}

/// Counts one CLI request in [`Shared::answering`] while it lives.
struct Answering(Arc<Shared>);

impl Answering {
    fn begin(shared: &Arc<Shared>) -> Answering {
        if let Ok(mut n) = shared.answering.0.lock() {
            *n += 1;
        }
        Answering(shared.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.answering.0.lock() {
            *n = n.saturating_sub(1);
        }
        self.0.answering.1.notify_all();
    }
}

/// What an exec that waits for a resume watches.
#[derive(Default)]
struct Paused {
    /// The paused containers, by the stream of their init (the VM's own is
    /// [`INIT_STREAM`]), as the guest answered pause and resume.
    streams: std::collections::HashSet<u32>,
    /// The workload ended: nothing is resumed any more.
    ended: bool,
}

impl Shared {
    /// Records that the container whose init is stream `init` was paused
    /// or resumed, and wakes the execs waiting for a resume.
    fn set_paused(&self, init: u32, paused: bool) {
        if let Ok(mut state) = self.paused.lock() {
            if paused {
                state.streams.insert(init);
            } else {
                state.streams.remove(&init);
            }
        }
        self.thawed.notify_all();
    }

    /// The workload ended: no exec waits for a resume any longer.
    fn end(&self) {
        if let Ok(mut state) = self.paused.lock() {
            state.ended = true;
        }
        self.thawed.notify_all();
    }

    /// Waits, at most `limit`, until no CLI request is being answered.
    fn wait_for_answers(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let Ok(mut n) = self.answering.0.lock() else {
            return;
        };
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.answering.1.wait_timeout(n, left) {
                Ok((guard, _)) => n = guard,
                Err(_) => return,
            }
        }
    }

    /// The VMM's counters now, its NICs under the guest's names; `None`
    /// from a VMM that keeps none. Whatever the guest put in its own reply
    /// is never passed on in their place.
    fn vmm_counters(&self) -> Option<crate::protocol::VmmCounters> {
        let mut counters = self.counters.as_ref()?.read();
        for (nic, name) in counters.nics.iter_mut().zip(&self.nic_names) {
            nic.name.clone_from(name);
        }
        Some(counters)
    }

    fn send(&self, frame: &Frame) -> Result<(), String> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| "writer poisoned".to_string())?;
        frame.write_to(&mut *w).map_err(|e| e.to_string())
    }

    fn request(&self, msg: &HostMessage) -> Result<Reply, String> {
        let _one = self
            .request_lock
            .lock()
            .map_err(|_| "request lock poisoned".to_string())?;
        let (tx, rx) = mpsc::channel();
        *self.pending.lock().map_err(|_| "pending poisoned")? = Some(tx);
        self.send(&Frame::control(msg))?;
        rx.recv_timeout(REQUEST_TIMEOUT).map_err(|_| {
            // A late reply would answer the next request: the channel can
            // no longer be trusted.
            let why = format!("the guest did not answer within {REQUEST_TIMEOUT:?}");
            let _ = self.events.send(Event::GuestGone(why.clone()));
            why
        })
    }
}

pub fn serve(args: &Args, booted: Booted) -> i32 {
    let Booted {
        mut vm,
        guest,
        terminal,
        mut state,
        cli,
        guest_log,
        dns,
        ndp,
        egress,
        guest_ram,
        nic_names,
        start_hooks,
    } = booted;
    let state_dir = match StateDir::open(&args.dir) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("container {}: {}: {e}", state.id, args.dir.display());
            vm.kill();
            return VM_LOST_STATUS;
        }
    };
    // From here on the supervisor only relays: jail it before any thread
    // exists, so all of them inherit the jail.
    let children = vm.host_pids();
    if let Err(e) = super::jail::enter(&children) {
        tracing::error!("container {}: {e}", state.id);
        vm.kill();
        return VM_LOST_STATUS;
    }
    if let Some(relay) = dns {
        relay.spawn();
    }
    for proxy in ndp {
        proxy.spawn();
    }
    let (events_tx, events) = mpsc::channel();
    let writer = match guest.try_clone() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("control channel: {e}");
            vm.kill();
            return VM_LOST_STATUS;
        }
    };
    let (out, err): (Box<dyn Write + Send>, Box<dyn Write + Send>) = match &terminal {
        Some(t) => match (t.writer(), t.writer()) {
            (Ok(a), Ok(b)) => (Box::new(a), Box::new(b)),
            _ => (Box::new(std::io::stdout()), Box::new(std::io::stderr())),
        },
        None => (Box::new(std::io::stdout()), Box::new(std::io::stderr())),
    };
    let shared = Arc::new(Shared {
        writer: Mutex::new(writer),
        pending: Mutex::new(None),
        request_lock: Mutex::new(()),
        relays: Relays::new(),
        guest_log: Mutex::new(guest_log),
        stdout: Mutex::new(out),
        stderr: Mutex::new(err),
        events: events_tx.clone(),
        dir: args.dir.clone(),
        state_dir,
        start_hooks,
        answering: Default::default(),
        guest_ram: Mutex::new(guest_ram),
        members: Default::default(),
        paused: Default::default(),
        thawed: Default::default(),
        counters: vm.counters(),
        nic_names,
    });
    spawn_reader(shared.clone(), guest);
    spawn_stdin(
        shared.clone(),
        terminal.as_ref().and_then(|t| t.reader().ok()),
    );
    spawn_cli(shared.clone(), cli);
    spawn_signals(events_tx.clone());
    // A resize made before the handler was installed was not seen.
    if terminal.as_ref().and_then(|t| t.size()).is_some() {
        let _ = events_tx.send(Event::Signal(SIGWINCH));
    }

    let mut oom_kills = None;
    let end = wait_for_end(&shared, &events, vm.as_mut(), terminal.as_ref());
    shared.end();
    let status = match end {
        End::Exited(status, ooms) => {
            // The workload is gone. Its cgroup's OOM-kill count came with
            // its exit and is kept for `events`, which must report a kill
            // that ended the container (the guest's count goes with the VM).
            oom_kills = ooms;
            // Power the guest off. The agent answers once every process
            // of the VM is gone and its dirty pages are written to the
            // share (`guest::Agent::shutdown`); all it does after that is
            // reboot(2), which under TCG takes the kernel's device
            // shutdown and QEMU's own exit (30-40 ms) for nothing, so an
            // answered shutdown is followed by the kill below at once.
            // Without an answer the guest gets its time to go down.
            let answered = matches!(shared.request(&HostMessage::Shutdown), Ok(Reply::Ok));
            let deadline = Instant::now() + Duration::from_secs(3);
            while !answered && Instant::now() < deadline && vm.exited().is_none() {
                std::thread::sleep(Duration::from_millis(2));
            }
            status
        }
        // Nothing would answer a shutdown request (or nothing may be
        // trusted to): the VM is killed at once.
        End::Lost => VM_LOST_STATUS,
    };
    shared.wait_for_answers(Duration::from_secs(2));
    vm.kill();
    if let Some(daemon) = egress {
        daemon.end();
    }
    if let Ok(mut log) = shared.guest_log.lock() {
        guest_log::flush(&mut log);
    }
    let dir = shared.state_dir.path();
    let saved = match VmState::load(&dir) {
        Ok(mut s) => {
            s.status = Status::Stopped;
            s.exit_status = Some(status);
            s.oom_kills = oom_kills;
            s.save(&dir)
        }
        Err(_) => {
            state.status = Status::Stopped;
            state.exit_status = Some(status);
            state.oom_kills = oom_kills;
            state.save(&dir)
        }
    };
    if let Err(e) = saved {
        tracing::error!(
            "container {}: exit status {status} not recorded: {e}",
            state.id
        );
    }
    status
}

fn wait_for_end(
    shared: &Arc<Shared>,
    events: &Receiver<Event>,
    vm: &mut dyn super::Vm,
    terminal: Option<&super::tty::HostPty>,
) -> End {
    loop {
        match events.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::InitExit(status, ooms)) => return End::Exited(status, ooms),
            Ok(Event::GuestGone(why)) => {
                // A channel that closes is most often the VMM dying: name
                // that when it is so.
                let deadline = Instant::now() + Duration::from_millis(500);
                while vm.exited().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(2));
                }
                match vm.exited() {
                    Some(end) => vm_lost(shared, &end),
                    None => tracing::error!("container stopped: {why}"),
                }
                return End::Lost;
            }
            Ok(Event::Signal(SIGWINCH)) => {
                if let Some((rows, cols)) = terminal.and_then(|t| t.size()) {
                    let s = shared.clone();
                    std::thread::spawn(move || {
                        let _ = s.request(&HostMessage::Resize {
                            id: INIT_STREAM,
                            rows,
                            cols,
                        });
                    });
                }
            }
            Ok(Event::Signal(sig)) => {
                let s = shared.clone();
                std::thread::spawn(move || forward_signal(&s, sig));
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(end) = vm.exited() {
                    vm_lost(shared, &end);
                    return End::Lost;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return End::Lost,
        }
    }
}

/// A signal the supervisor received goes to the container's init in the
/// guest, as runc's init would have received it (to a paused container's
/// frozen init it stays pending until resume, as under runc; `kill -9`
/// ends the supervisor itself).
fn forward_signal(shared: &Shared, sig: i32) {
    let msg = HostMessage::Signal {
        id: INIT_STREAM,
        signal: sig,
        all: false,
    };
    match shared.request(&msg) {
        Ok(Reply::Ok) => {}
        Ok(other) => tracing::warn!("cannot forward signal {sig}: {other:?}"),
        Err(e) => tracing::warn!("cannot forward signal {sig}: {e}"),
    }
}

fn vm_lost(shared: &Shared, end: &crate::microvm::vmm::Exited) {
    tracing::error!(
        "container stopped: {} exited unexpectedly ({}); guest console: {}",
        end.part,
        end.how,
        shared
            .dir
            .join(crate::microvm::vmstate::CONSOLE_LOG)
            .display()
    );
}

fn spawn_reader(shared: Arc<Shared>, mut guest: UnixStream) {
    std::thread::spawn(move || loop {
        // A guest that breaks the protocol is not trusted further: the
        // container ends (the error is logged once, by wait_for_end).
        let frame = match Frame::read_from(&mut guest) {
            Ok(f) => f,
            Err(e) => {
                let why = if e.is_violation() {
                    format!("guest protocol violation: {e}")
                } else {
                    format!("control channel: {e}")
                };
                let _ = shared.events.send(Event::GuestGone(why));
                return;
            }
        };
        if let Err(why) = dispatch(&shared, frame) {
            let _ = shared
                .events
                .send(Event::GuestGone(format!("guest protocol violation: {why}")));
            return;
        }
    });
}

fn dispatch(shared: &Shared, frame: Frame) -> Result<(), String> {
    match frame.kind {
        Kind::Control => match frame
            .parse_control::<GuestMessage>()
            .map_err(|e| e.to_string())?
        {
            GuestMessage::Reply(r) => {
                let slot = shared.pending.lock().map_err(|_| "poisoned")?.take();
                match slot {
                    Some(tx) => {
                        let _ = tx.send(r);
                    }
                    None => return Err("a reply nobody asked for".into()),
                }
            }
            GuestMessage::Exit {
                id,
                status,
                oom_kills,
            } if id == INIT_STREAM => {
                if let Ok(mut o) = shared.stdout.lock() {
                    let _ = o.flush();
                }
                let _ = shared.events.send(Event::InitExit(status, oom_kills));
            }
            GuestMessage::Exit { id, status, .. } => {
                // A stream whose relay is gone already (killed, hung up)
                // has nobody to tell.
                let bytes = encode(&Frame::control(&ExecEvent::Exit { status }));
                shared
                    .relays
                    .deliver("an exit", id, &bytes, true)
                    .map_err(|e| e.to_string())?;
            }
            GuestMessage::Log { level, message } => {
                if let Ok(mut log) = shared.guest_log.lock() {
                    guest_log::emit(&mut log, &level, &message);
                }
            }
            GuestMessage::Hello { .. } => return Err("a second hello".into()),
        },
        Kind::Stdout | Kind::Stderr if frame.stream == INIT_STREAM => {
            let sink = if frame.kind == Kind::Stdout {
                &shared.stdout
            } else {
                &shared.stderr
            };
            if let Ok(mut w) = sink.lock() {
                let _ = w.write_all(&frame.payload).and_then(|_| w.flush());
            }
        }
        Kind::Stdout | Kind::Stderr => {
            let bytes = encode(&Frame::data(frame.kind, 0, &frame.payload));
            shared
                .relays
                .deliver("output", frame.stream, &bytes, false)
                .map_err(|e| e.to_string())?;
        }
        Kind::Stdin | Kind::StdinClose => return Err("stdin frames go to the guest".into()),
    }
    Ok(())
}

/// One frame as the bytes a relay reads.
fn encode(frame: &Frame) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(frame.payload.len() + crate::protocol::HEADER_LEN);
    // Writing to a Vec cannot fail.
    let _ = frame.write_to(&mut bytes);
    bytes
}

/// Pumps our stdin (or the host pty) into the guest as stream 0.
fn spawn_stdin(shared: Arc<Shared>, pty: Option<std::fs::File>) {
    std::thread::spawn(move || {
        let mut input: Box<dyn Read> = match pty {
            Some(f) => Box::new(f),
            None => Box::new(std::io::stdin()),
        };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match input.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = shared.send(&Frame::data(Kind::StdinClose, INIT_STREAM, b""));
                    return;
                }
                Ok(n) => {
                    if shared
                        .send(&Frame::data(Kind::Stdin, INIT_STREAM, &buf[..n]))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
}

fn spawn_signals(events: Sender<Event>) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new([
        SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT,
    ]) else {
        tracing::warn!("cannot install signal handlers; signals will not be forwarded");
        return;
    };
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if events.send(Event::Signal(sig)).is_err() {
                return;
            }
        }
    });
}

/// Serves `agentvm start/kill/ps/exec` on the supervisor socket.
fn spawn_cli(shared: Arc<Shared>, listener: UnixListener) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let s = shared.clone();
            std::thread::spawn(move || handle_cli(s, conn));
        }
    });
}

fn handle_cli(shared: Arc<Shared>, mut conn: UnixStream) {
    let req: SupervisorRequest = match Frame::read_from(&mut conn).and_then(|f| f.parse_control()) {
        Ok(r) => r,
        Err(e) => {
            let _ = Frame::control(&Reply::Error {
                message: format!("bad request: {e}"),
            })
            .write_to(&mut conn);
            return;
        }
    };
    let _answering = match &req {
        SupervisorRequest::Exec { .. } | SupervisorRequest::CreateMember { .. } => None,
        SupervisorRequest::Member { request, .. }
            if matches!(**request, SupervisorRequest::Exec { .. }) =>
        {
            None
        }
        _ => Some(Answering::begin(&shared)),
    };
    let reply = match req {
        SupervisorRequest::Exec {
            process,
            cgroup,
            ignore_paused,
        } => {
            return exec(shared, conn, process, cgroup, None, ignore_paused);
        }
        SupervisorRequest::CreateMember {
            id,
            spec,
            join,
            start_hooks,
        } => {
            return create_member(shared, conn, id, spec, join, start_hooks);
        }
        SupervisorRequest::Member { id, request } => match member_stream(&shared, &id) {
            Err(message) => Ok(Reply::Error { message }),
            Ok(stream) => match *request {
                SupervisorRequest::Exec {
                    process,
                    cgroup,
                    ignore_paused,
                } => {
                    return exec(shared, conn, process, cgroup, Some(stream), ignore_paused);
                }
                request => answer_member(&shared, &id, stream, &request),
            },
        },
        SupervisorRequest::DeleteMember { id } => delete_member(&shared, &id),
        request => answer(&shared, &request),
    };
    let reply = reply.unwrap_or_else(|message| Reply::Error { message });
    let _ = Frame::control(&reply).write_to(&mut conn);
}

/// A CLI request about the VM's own (sandbox) container.
fn answer(shared: &Shared, req: &SupervisorRequest) -> Result<Reply, String> {
    match req {
        SupervisorRequest::Start => {
            let r = match &shared.start_hooks {
                None => shared.request(&HostMessage::Start),
                Some(StartHooks { hooks, state }) => match shared.request(&HostMessage::RunHooks {
                    hooks: hooks.clone(),
                    state: state.clone(),
                }) {
                    Ok(Reply::Ok) => shared.request(&HostMessage::Start),
                    other => other,
                },
            };
            if matches!(r, Ok(Reply::Ok)) {
                let dir = shared.state_dir.path();
                let saved = VmState::load(&dir).and_then(|mut s| {
                    s.status = Status::Running;
                    s.save(&dir)
                });
                if let Err(e) = saved {
                    tracing::warn!("started, but not recorded: {e}");
                }
            }
            r
        }
        SupervisorRequest::Signal { signal, all } => shared.request(&HostMessage::Signal {
            id: INIT_STREAM,
            signal: *signal,
            all: *all,
        }),
        // The guest freezes the container's cgroup: the VM runs on, and
        // answers ps, stats and update as runc answers for a paused one.
        SupervisorRequest::Pause => paused(shared, INIT_STREAM, true, HostMessage::Pause),
        SupervisorRequest::Resume => paused(shared, INIT_STREAM, false, HostMessage::Resume),
        SupervisorRequest::Ps => shared.request(&HostMessage::Ps),
        SupervisorRequest::Stats => match shared.request(&HostMessage::Stats)? {
            Reply::Stats { stats, .. } => Ok(Reply::Stats {
                stats,
                vmm: shared.vmm_counters(),
            }),
            other => Ok(other),
        },
        SupervisorRequest::Update { resources } => update(shared, resources),
        other => Err(format!("unexpected request {other:?}")),
    }
}

/// Asks the guest to pause or resume (`msg`) the container whose init is
/// stream `init`, and records it when the guest did.
fn paused(shared: &Shared, init: u32, pause: bool, msg: HostMessage) -> Result<Reply, String> {
    let reply = shared.request(&msg)?;
    if reply == Reply::Ok {
        shared.set_paused(init, pause);
    }
    Ok(reply)
}

/// Before an exec into the container whose init is stream `init`: while
/// it is paused, refused in runc's words, or, with `--ignore-paused`, held
/// until it is resumed (runc's process waits frozen in the container's
/// cgroup till then, and its exec returns then). The wait ends with an
/// error if the workload ends or the caller hangs up first.
fn wait_while_paused(
    shared: &Shared,
    conn: &UnixStream,
    init: u32,
    ignore_paused: bool,
) -> Result<(), String> {
    let mut paused = shared
        .paused
        .lock()
        .map_err(|_| "paused poisoned".to_string())?;
    if !paused.streams.contains(&init) {
        return Ok(());
    }
    if !ignore_paused {
        return Err(crate::container::exec::PAUSED.to_string());
    }
    loop {
        if paused.ended {
            return Err("the container stopped while the exec waited for it to be resumed".into());
        }
        if hung_up(conn) {
            return Err("the exec's caller went away while it waited for resume".into());
        }
        if !paused.streams.contains(&init) {
            return Ok(());
        }
        paused = shared
            .thawed
            .wait_timeout(paused, Duration::from_millis(200))
            .map_err(|_| "paused poisoned".to_string())?
            .0;
    }
}

/// Whether the other end of `conn` closed it.
fn hung_up(conn: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; no wait.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// The guest stream of member `id`'s init.
fn member_stream(shared: &Shared, id: &str) -> Result<u32, String> {
    shared
        .members
        .lock()
        .map_err(|_| "members poisoned".to_string())?
        .get(id)
        .map(|m| m.stream)
        .ok_or_else(|| format!("container {id} is not a member of this pod's VM"))
}

/// A CLI request about member `id` (init stream `stream`); the CLI keeps
/// the member's state file.
fn answer_member(
    shared: &Shared,
    id: &str,
    stream: u32,
    req: &SupervisorRequest,
) -> Result<Reply, String> {
    let member = |request| HostMessage::Member {
        id: stream,
        request,
    };
    match req {
        SupervisorRequest::Start => {
            let hooks = shared
                .members
                .lock()
                .map_err(|_| "members poisoned".to_string())?
                .get(id)
                .and_then(|m| m.start_hooks.clone());
            match hooks {
                None => shared.request(&member(MemberRequest::Start)),
                Some(StartHooks { hooks, state }) => {
                    match shared.request(&member(MemberRequest::RunHooks { hooks, state })) {
                        Ok(Reply::Ok) => shared.request(&member(MemberRequest::Start)),
                        other => other,
                    }
                }
            }
        }
        SupervisorRequest::Signal { signal, all } => shared.request(&HostMessage::Signal {
            id: stream,
            signal: *signal,
            all: *all,
        }),
        SupervisorRequest::Ps => shared.request(&member(MemberRequest::Ps)),
        // The VM's counters belong to the pod's sandbox container.
        SupervisorRequest::Stats => match shared.request(&member(MemberRequest::Stats))? {
            Reply::Stats { stats, .. } => Ok(Reply::Stats { stats, vmm: None }),
            other => Ok(other),
        },
        SupervisorRequest::Update { resources } => shared.request(&member(MemberRequest::Update {
            resources: resources.clone(),
        })),
        SupervisorRequest::Pause => paused(shared, stream, true, member(MemberRequest::Pause)),
        SupervisorRequest::Resume => paused(shared, stream, false, member(MemberRequest::Resume)),
        other => Err(format!("not a request about a pod member: {other:?}")),
    }
}

/// Removes member `id` from the guest and forgets it.
fn delete_member(shared: &Shared, id: &str) -> Result<Reply, String> {
    let stream = member_stream(shared, id)?;
    let reply = shared.request(&HostMessage::Member {
        id: stream,
        request: MemberRequest::Delete,
    })?;
    if matches!(reply, Reply::Ok) {
        if let Ok(mut members) = shared.members.lock() {
            members.remove(id);
        }
        // Gone, not paused: an exec waiting for its resume goes on, to the
        // guest's refusal.
        shared.set_paused(stream, false);
    }
    Ok(reply)
}

/// A pod member's relay asks for its container: the connection becomes the
/// stream of the member's init, as an exec's connection does.
fn create_member(
    shared: Arc<Shared>,
    mut conn: UnixStream,
    id: String,
    spec: Box<Spec>,
    join: Vec<PodNamespace>,
    start_hooks: Option<StartHooks>,
) {
    let known = shared
        .members
        .lock()
        .map(|m| m.contains_key(&id))
        .unwrap_or(true);
    if known {
        let message = format!("container {id} is a member of this pod's VM already");
        let _ = Frame::control(&Reply::Error { message }).write_to(&mut conn);
        return;
    }
    let reserved = conn
        .try_clone()
        .map_err(|e| e.to_string())
        .and_then(|c| shared.relays.reserve(c).map_err(|e| e.to_string()));
    let stream = match reserved {
        Ok(stream) => stream,
        Err(message) => {
            let _ = Frame::control(&Reply::Error { message }).write_to(&mut conn);
            return;
        }
    };
    let reply = match shared.request(&HostMessage::CreateMember {
        id: stream,
        spec,
        join,
    }) {
        Ok(r @ Reply::Created { .. }) | Ok(r @ Reply::Error { .. }) => r,
        Ok(other) => Reply::Error {
            message: format!("the guest answered create with {other:?}"),
        },
        Err(message) => Reply::Error { message },
    };
    if !matches!(reply, Reply::Created { .. }) {
        shared.relays.remove(stream);
        let _ = Frame::control(&reply).write_to(&mut conn);
        return;
    }
    if let Ok(mut members) = shared.members.lock() {
        members.insert(
            id,
            Member {
                stream,
                start_hooks,
            },
        );
    }
    let written = Frame::control(&reply).write_to(&mut conn);
    shared.relays.started(stream);
    if written.is_err() {
        relay_gone(&shared, stream, true);
        return;
    }
    pump_from_relay(&shared, conn, stream, true);
}

/// `update`: the container's limits change in the guest; a memory limit
/// that needs more RAM than the guest has gets it from the balloon first,
/// one that needs less gives it back after the guest's limit is lower (so
/// the balloon never takes pages the container is still allowed to use).
fn update(shared: &Shared, resources: &oci_spec::runtime::LinuxResources) -> Result<Reply, String> {
    let mut ram = shared.guest_ram.lock().unwrap_or_else(|e| e.into_inner());
    let change = ram.as_ref().and_then(|r| {
        crate::microvm::spec::guest_ram_for(resources, r.vm_mib).map(|t| (t, r.current_mib))
    });
    let set = |ram: &mut Option<super::GuestRam>, mib: u64| -> Result<(), String> {
        if let Some(r) = ram.as_mut() {
            r.control.set_guest_ram(mib).map_err(|e| e.to_string())?;
            r.current_mib = mib;
        }
        Ok(())
    };
    if let Some((target, current)) = change.filter(|(t, c)| t > c) {
        set(&mut ram, target)?;
        let reply = shared.request(&HostMessage::Update {
            resources: Box::new(resources.clone()),
        });
        if !matches!(reply, Ok(Reply::Ok)) {
            let _ = set(&mut ram, current);
        }
        return reply;
    }
    let reply = shared.request(&HostMessage::Update {
        resources: Box::new(resources.clone()),
    })?;
    if let (Reply::Ok, Some((target, _))) = (&reply, change.filter(|(t, c)| t < c)) {
        set(&mut ram, target)?;
    }
    Ok(reply)
}

/// Starts an exec'd process and turns the connection into its stream: in
/// the sandbox container, or in the member whose init is stream `member`.
fn exec(
    shared: Arc<Shared>,
    mut conn: UnixStream,
    process: Box<Process>,
    cgroup: Vec<String>,
    member: Option<u32>,
    ignore_paused: bool,
) {
    if let Err(message) =
        wait_while_paused(&shared, &conn, member.unwrap_or(INIT_STREAM), ignore_paused)
    {
        let _ = Frame::control(&Reply::Error { message }).write_to(&mut conn);
        return;
    }
    let reserved = conn
        .try_clone()
        .map_err(|e| e.to_string())
        .and_then(|c| shared.relays.reserve(c).map_err(|e| e.to_string()));
    let id = match reserved {
        Ok(id) => id,
        Err(message) => {
            let _ = Frame::control(&Reply::Error { message }).write_to(&mut conn);
            return;
        }
    };
    let msg = match member {
        None => HostMessage::Exec {
            id,
            process,
            cgroup,
        },
        Some(m) => HostMessage::Member {
            id: m,
            request: MemberRequest::Exec {
                stream: id,
                process,
                cgroup,
            },
        },
    };
    let reply = match shared.request(&msg) {
        Ok(r @ Reply::Started { .. }) | Ok(r @ Reply::Error { .. }) => r,
        Ok(other) => Reply::Error {
            message: format!("the guest answered exec with {other:?}"),
        },
        Err(message) => Reply::Error { message },
    };
    let started = matches!(reply, Reply::Started { .. });
    if !started {
        shared.relays.remove(id);
    }
    let written = Frame::control(&reply).write_to(&mut conn);
    if !started {
        return;
    }
    // Only now may the stream's output and exit follow the reply.
    shared.relays.started(id);
    if written.is_err() {
        relay_gone(&shared, id, false);
        return;
    }
    pump_from_relay(&shared, conn, id, false);
}

/// Relay → guest: stdin and control of stream `id`, until the relay goes
/// (then its process, or with `all` its whole container, is killed).
fn pump_from_relay(shared: &Shared, mut conn: UnixStream, id: u32, all: bool) {
    loop {
        let frame = match Frame::read_from(&mut conn) {
            Ok(f) => f,
            Err(_) => {
                relay_gone(shared, id, all);
                return;
            }
        };
        let result = match frame.kind {
            Kind::Stdin | Kind::StdinClose if frame.payload.len() <= MAX_PAYLOAD => {
                shared.send(&Frame::data(frame.kind, id, &frame.payload))
            }
            Kind::Control => match frame.parse_control::<ExecControl>() {
                Ok(ExecControl::Signal { signal }) => shared
                    .request(&HostMessage::Signal {
                        id,
                        signal,
                        all: false,
                    })
                    .map(|_| ()),
                Ok(ExecControl::Resize { rows, cols }) => shared
                    .request(&HostMessage::Resize { id, rows, cols })
                    .map(|_| ()),
                Err(e) => Err(e.to_string()),
            },
            _ => Err("unexpected frame from exec relay".into()),
        };
        if let Err(e) = result {
            tracing::warn!("exec {id}: {e}");
            return;
        }
    }
}

/// The relay is gone (killed, or its caller hung up): its process (with
/// `all`, a pod member's whole container) must not live on unseen in the
/// guest.
fn relay_gone(shared: &Shared, id: u32, all: bool) {
    if shared.relays.remove(id) {
        tracing::info!("stream {id}: relay gone, killing its process");
        let _ = shared.request(&HostMessage::Signal {
            id,
            signal: SIGKILL,
            all,
        });
    }
}

#[cfg(test)]
mod tests {
    //! The running phase against a fake guest on a socket pair: requests
    //! and replies, signal forwarding, exec relays, hostile input.

    use super::*;

    /// Output sink the test can read.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Fixture {
        shared: Arc<Shared>,
        guest: UnixStream,
        events: Receiver<Event>,
        stdout: Sink,
    }

    fn fixture() -> Fixture {
        fixture_with(None, Vec::new())
    }

    fn fixture_with(
        counters: Option<Arc<dyn crate::microvm::vmm::Counters>>,
        nic_names: Vec<String>,
    ) -> Fixture {
        let (host, guest) = UnixStream::pair().unwrap();
        let (tx, events) = mpsc::channel();
        let stdout = Sink::default();
        let shared = Arc::new(Shared {
            writer: Mutex::new(host.try_clone().unwrap()),
            pending: Mutex::new(None),
            request_lock: Mutex::new(()),
            relays: Relays::new(),
            guest_log: Mutex::new(GuestLog::new(Instant::now())),
            stdout: Mutex::new(Box::new(stdout.clone())),
            stderr: Mutex::new(Box::new(Sink::default())),
            events: tx,
            dir: std::env::temp_dir(),
            state_dir: StateDir::open(&std::env::temp_dir()).unwrap(),
            start_hooks: None,
            answering: Default::default(),
            guest_ram: Mutex::new(None),
            members: Default::default(),
            paused: Default::default(),
            thawed: Default::default(),
            counters,
            nic_names,
        });
        spawn_reader(shared.clone(), host);
        Fixture {
            shared,
            guest,
            events,
            stdout,
        }
    }

    impl Fixture {
        /// The next request the host sent the guest.
        fn next_request(&mut self) -> HostMessage {
            let f = Frame::read_from(&mut self.guest).unwrap();
            assert_eq!(f.kind, Kind::Control);
            f.parse_control().unwrap()
        }

        fn send(&mut self, msg: &GuestMessage) {
            Frame::control(msg).write_to(&mut self.guest).unwrap();
        }

        fn gone(&self) -> Option<String> {
            match self.events.recv_timeout(Duration::from_secs(5)) {
                Ok(Event::GuestGone(why)) => Some(why),
                _ => None,
            }
        }
    }

    /// A balloon that records its targets in `log`, as `ram <MiB>`.
    struct FakeRam(Arc<Mutex<Vec<String>>>);

    impl crate::microvm::vmm::GuestRam for FakeRam {
        fn set_guest_ram(&mut self, mib: u64) -> Result<(), crate::microvm::vmm::VmmError> {
            self.0.lock().unwrap().push(format!("ram {mib}"));
            Ok(())
        }
    }

    /// Runs `update` with a memory `limit` (bytes) on a VM of 1024 MiB whose
    /// guest has 192 MiB, the guest answering `answer`; returns the order
    /// of what happened (balloon targets and the guest's update).
    fn update_order(limit: i64, answer: Reply) -> (Vec<String>, Result<Reply, String>) {
        let mut f = fixture();
        let log = Arc::new(Mutex::new(Vec::new()));
        *f.shared.guest_ram.lock().unwrap() = Some(super::super::GuestRam {
            control: Box::new(FakeRam(log.clone())),
            current_mib: 192,
            vm_mib: 1024,
        });
        let mut memory = oci_spec::runtime::LinuxMemory::default();
        memory.set_limit(Some(limit));
        let mut resources = oci_spec::runtime::LinuxResources::default();
        resources.set_memory(Some(memory));
        let shared = f.shared.clone();
        let asker = std::thread::spawn(move || update(&shared, &resources));
        assert!(matches!(f.next_request(), HostMessage::Update { .. }));
        log.lock().unwrap().push("guest".into());
        f.send(&GuestMessage::Reply(answer));
        let reply = asker.join().unwrap();
        let order = log.lock().unwrap().clone();
        (order, reply)
    }

    #[test]
    fn update_raises_the_balloon_before_the_limit_and_lowers_it_after() {
        let (order, reply) = update_order(512 << 20, Reply::Ok);
        assert!(matches!(reply, Ok(Reply::Ok)));
        assert_eq!(order, ["ram 576", "guest"]);
        let (order, _) = update_order(64 << 20, Reply::Ok);
        assert_eq!(order, ["guest", "ram 128"]);
        // Unlimited: the whole VM.
        let (order, _) = update_order(-1, Reply::Ok);
        assert_eq!(order, ["ram 1024", "guest"]);
        // The guest refused the higher limit: the balloon goes back.
        let refused = Reply::Error {
            message: "no".into(),
        };
        let (order, _) = update_order(512 << 20, refused.clone());
        assert_eq!(order, ["ram 576", "guest", "ram 192"]);
        // ... and a lower limit refused leaves the guest its RAM.
        let (order, _) = update_order(64 << 20, refused);
        assert_eq!(order, ["guest"]);
    }

    #[test]
    fn a_forwarded_signal_reaches_the_init_in_the_guest() {
        let mut f = fixture();
        let shared = f.shared.clone();
        let forwarder = std::thread::spawn(move || forward_signal(&shared, SIGTERM));
        assert_eq!(
            f.next_request(),
            HostMessage::Signal {
                id: INIT_STREAM,
                signal: SIGTERM,
                all: false
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        forwarder.join().unwrap();
    }

    #[test]
    fn the_init_s_output_and_exit_reach_the_supervisor() {
        let mut f = fixture();
        Frame::data(Kind::Stdout, INIT_STREAM, b"hello\n")
            .write_to(&mut f.guest)
            .unwrap();
        f.send(&GuestMessage::Exit {
            id: INIT_STREAM,
            status: 128 + libc::SIGSEGV,
            oom_kills: Some(2),
        });
        match f.events.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::InitExit(status, ooms)) => assert_eq!((status, ooms), (139, Some(2))),
            _ => panic!("no exit event"),
        }
        assert_eq!(f.stdout.0.lock().unwrap().as_slice(), b"hello\n");
    }

    /// Starts `create_member` for `id` on a socket pair; returns the
    /// relay's end.
    fn member_relay(f: &Fixture, id: &str) -> (UnixStream, std::thread::JoinHandle<()>) {
        member_relay_with(f, id, None)
    }

    fn member_relay_with(
        f: &Fixture,
        id: &str,
        hooks: Option<StartHooks>,
    ) -> (UnixStream, std::thread::JoinHandle<()>) {
        let (relay, supervisor_end) = UnixStream::pair().unwrap();
        let shared = f.shared.clone();
        let id = id.to_string();
        let handler = std::thread::spawn(move || {
            create_member(
                shared,
                supervisor_end,
                id,
                Box::default(),
                Vec::new(),
                hooks,
            )
        });
        (relay, handler)
    }

    /// A member's startContainer hooks come with its create (its relay
    /// read them from its bundle) and run in the guest at its start,
    /// before its init: the jailed supervisor reads no bundle.
    #[test]
    fn a_member_s_start_hooks_come_with_its_create_and_run_at_its_start() {
        let mut f = fixture();
        let mut hook = oci_spec::runtime::Hook::default();
        hook.set_path("/bin/hook".into());
        let hooks = StartHooks {
            hooks: vec![hook],
            state: crate::protocol::OciState {
                oci_version: "1.0.2".into(),
                id: "app".into(),
                status: "created".into(),
                pid: Some(77),
                bundle: "/bundles/app".into(),
                annotations: Default::default(),
            },
        };
        let (mut relay, handler) = member_relay_with(&f, "app", Some(hooks.clone()));
        let stream = match f.next_request() {
            HostMessage::CreateMember { id, .. } => id,
            other => panic!("{other:?}"),
        };
        f.send(&GuestMessage::Reply(Reply::Created { pid: 9 }));
        let _created = Frame::read_from(&mut relay).unwrap();
        let shared = f.shared.clone();
        let starter = std::thread::spawn(move || {
            answer_member(&shared, "app", stream, &SupervisorRequest::Start)
        });
        assert_eq!(
            f.next_request(),
            HostMessage::Member {
                id: stream,
                request: MemberRequest::RunHooks {
                    hooks: hooks.hooks,
                    state: hooks.state
                }
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(
            f.next_request(),
            HostMessage::Member {
                id: stream,
                request: MemberRequest::Start
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(starter.join().unwrap(), Ok(Reply::Ok));
        // A failing hook: the member is not started, and the hook's error
        // is the answer.
        let shared = f.shared.clone();
        let starter = std::thread::spawn(move || {
            answer_member(&shared, "app", stream, &SupervisorRequest::Start)
        });
        assert!(matches!(
            f.next_request(),
            HostMessage::Member {
                request: MemberRequest::RunHooks { .. },
                ..
            }
        ));
        let failed = Reply::Error {
            message: "error running hook #0".into(),
        };
        f.send(&GuestMessage::Reply(failed.clone()));
        assert_eq!(starter.join().unwrap(), Ok(failed));
        drop(relay);
        assert!(matches!(f.next_request(), HostMessage::Signal { .. }));
        f.send(&GuestMessage::Reply(Reply::Ok));
        handler.join().unwrap();
    }

    #[test]
    fn a_member_s_stdio_and_exit_reach_its_relay_and_later_requests_name_it() {
        let mut f = fixture();
        let (mut relay, handler) = member_relay(&f, "app");
        let stream = match f.next_request() {
            HostMessage::CreateMember { id, .. } => id,
            other => panic!("{other:?}"),
        };
        assert_ne!(stream, INIT_STREAM);
        f.send(&GuestMessage::Reply(Reply::Created { pid: 9 }));
        let reply: Reply = Frame::read_from(&mut relay)
            .unwrap()
            .parse_control()
            .unwrap();
        assert_eq!(reply, Reply::Created { pid: 9 });
        Frame::data(Kind::Stdout, stream, b"from the member\n")
            .write_to(&mut f.guest)
            .unwrap();
        let out = Frame::read_from(&mut relay).unwrap();
        assert_eq!(
            (out.kind, out.payload.as_slice()),
            (Kind::Stdout, &b"from the member\n"[..])
        );
        assert!(f.stdout.0.lock().unwrap().is_empty(), "not the sandbox's");
        // A request about the member names its stream.
        let shared = f.shared.clone();
        let asker = std::thread::spawn(move || {
            let stream = member_stream(&shared, "app").unwrap();
            answer_member(&shared, "app", stream, &SupervisorRequest::Ps)
        });
        assert_eq!(
            f.next_request(),
            HostMessage::Member {
                id: stream,
                request: MemberRequest::Ps
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(asker.join().unwrap(), Ok(Reply::Ok));
        assert!(member_stream(&f.shared, "other").is_err());
        f.send(&GuestMessage::Exit {
            id: stream,
            status: 7,
            oom_kills: None,
        });
        let exit: ExecEvent = Frame::read_from(&mut relay)
            .unwrap()
            .parse_control()
            .unwrap();
        assert_eq!(exit, ExecEvent::Exit { status: 7 });
        drop(relay);
        handler.join().unwrap();
    }

    #[test]
    fn a_member_the_guest_answers_with_nonsense_is_refused() {
        let mut f = fixture();
        let (mut relay, handler) = member_relay(&f, "app");
        assert!(matches!(f.next_request(), HostMessage::CreateMember { .. }));
        f.send(&GuestMessage::Reply(Reply::Pids {
            pids: vec![1],
            processes: Vec::new(),
        }));
        let reply: Reply = Frame::read_from(&mut relay)
            .unwrap()
            .parse_control()
            .unwrap();
        assert!(
            matches!(&reply, Reply::Error { message } if message.contains("answered create")),
            "{reply:?}"
        );
        handler.join().unwrap();
        assert!(member_stream(&f.shared, "app").is_err(), "not registered");
    }

    #[test]
    fn a_member_whose_relay_goes_away_is_killed_whole() {
        let mut f = fixture();
        let (relay, handler) = member_relay(&f, "app");
        let stream = match f.next_request() {
            HostMessage::CreateMember { id, .. } => id,
            other => panic!("{other:?}"),
        };
        f.send(&GuestMessage::Reply(Reply::Created { pid: 9 }));
        drop(relay);
        assert_eq!(
            f.next_request(),
            HostMessage::Signal {
                id: stream,
                signal: SIGKILL,
                all: true
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        handler.join().unwrap();
    }

    #[test]
    fn an_exit_for_a_stream_never_started_is_a_violation() {
        let mut f = fixture();
        f.send(&GuestMessage::Exit {
            id: 42,
            status: 0,
            oom_kills: None,
        });
        let why = f.gone().expect("the guest must be given up");
        assert!(why.contains("never started"), "{why}");
    }

    /// pause and resume freeze and thaw the container in the guest: the
    /// supervisor asks the agent, for the VM's own container and for a
    /// member of its pod, and passes the agent's answer on.
    #[test]
    fn pause_and_resume_are_asked_of_the_guest() {
        let mut f = fixture();
        let shared = f.shared.clone();
        let asker = std::thread::spawn(move || answer(&shared, &SupervisorRequest::Pause));
        assert_eq!(f.next_request(), HostMessage::Pause);
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(asker.join().unwrap(), Ok(Reply::Ok));
        let shared = f.shared.clone();
        let asker = std::thread::spawn(move || answer(&shared, &SupervisorRequest::Resume));
        assert_eq!(f.next_request(), HostMessage::Resume);
        let refusal = Reply::Error {
            message: crate::tier::NOT_PAUSED.into(),
        };
        f.send(&GuestMessage::Reply(refusal.clone()));
        assert_eq!(asker.join().unwrap(), Ok(refusal));
        let shared = f.shared.clone();
        let asker =
            std::thread::spawn(move || answer_member(&shared, "app", 3, &SupervisorRequest::Pause));
        assert_eq!(
            f.next_request(),
            HostMessage::Member {
                id: 3,
                request: MemberRequest::Pause
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(asker.join().unwrap(), Ok(Reply::Ok));
    }

    /// Starts `exec` of `true` on a socket pair (into the VM's own
    /// container); returns the CLI's end.
    fn exec_of_true(f: &Fixture, ignore_paused: bool) -> (UnixStream, std::thread::JoinHandle<()>) {
        let (cli, supervisor_end) = UnixStream::pair().unwrap();
        let shared = f.shared.clone();
        let mut process = Process::default();
        process.set_args(Some(vec!["true".into()]));
        let handler = std::thread::spawn(move || {
            exec(
                shared,
                supervisor_end,
                Box::new(process),
                Vec::new(),
                None,
                ignore_paused,
            )
        });
        (cli, handler)
    }

    fn reply_on(conn: &mut UnixStream) -> Reply {
        Frame::read_from(conn).unwrap().parse_control().unwrap()
    }

    /// Pauses (or resumes) the VM's own container, the guest agreeing.
    fn set_paused_in(f: &mut Fixture, pause: bool) {
        let shared = f.shared.clone();
        let req = if pause {
            SupervisorRequest::Pause
        } else {
            SupervisorRequest::Resume
        };
        let asker = std::thread::spawn(move || answer(&shared, &req));
        let asked = f.next_request();
        assert_eq!(
            asked,
            if pause {
                HostMessage::Pause
            } else {
                HostMessage::Resume
            }
        );
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(asker.join().unwrap(), Ok(Reply::Ok));
    }

    /// An exec into a paused container is refused in runc's words without
    /// `--ignore-paused`; with it, nothing reaches the guest until the
    /// container was resumed, and then the exec does (as runc's process
    /// waits frozen until resume). A caller that hangs up, or the end of
    /// the workload, ends the wait with nothing run.
    #[test]
    fn an_exec_into_a_paused_container_waits_for_resume_only_when_asked() {
        let mut f = fixture();
        set_paused_in(&mut f, true);
        let (mut cli, handler) = exec_of_true(&f, false);
        handler.join().unwrap();
        assert_eq!(
            reply_on(&mut cli),
            Reply::Error {
                message: crate::container::exec::PAUSED.into()
            }
        );
        // Held: the next thing the guest hears is the resume, then the exec.
        let (mut cli, handler) = exec_of_true(&f, true);
        let (gone, gone_handler) = exec_of_true(&f, true);
        std::thread::sleep(Duration::from_millis(300));
        assert!(!handler.is_finished() && !gone_handler.is_finished());
        drop(gone);
        gone_handler.join().unwrap();
        set_paused_in(&mut f, false);
        match f.next_request() {
            HostMessage::Exec { process, .. } => {
                assert_eq!(process.args().as_deref(), Some(&["true".to_string()][..]))
            }
            other => panic!("{other:?}"),
        }
        f.send(&GuestMessage::Reply(Reply::Started { pid: 5 }));
        assert_eq!(reply_on(&mut cli), Reply::Started { pid: 5 });
        // The caller that hung up got nothing run: the guest hears of its
        // exec only when this one's caller goes too (its process killed).
        drop(cli);
        assert!(matches!(
            f.next_request(),
            HostMessage::Signal {
                signal: SIGKILL,
                ..
            }
        ));
        f.send(&GuestMessage::Reply(Reply::Ok));
        handler.join().unwrap();
        // Paused again, and the workload ends: the waiting exec is refused.
        set_paused_in(&mut f, true);
        let (mut cli, handler) = exec_of_true(&f, true);
        std::thread::sleep(Duration::from_millis(300));
        f.shared.end();
        handler.join().unwrap();
        assert!(
            matches!(reply_on(&mut cli), Reply::Error { message } if message.contains("stopped")),
        );
    }

    /// A VMM that counts: one NIC, which the guest calls `net1`.
    struct Counted;
    impl crate::microvm::vmm::Counters for Counted {
        fn read(&self) -> crate::protocol::VmmCounters {
            crate::protocol::VmmCounters {
                vcpu_exits: 7,
                nics: vec![crate::protocol::NicCounters {
                    name: "eth0".into(),
                    rx_packets: 3,
                    ..Default::default()
                }],
                ..Default::default()
            }
        }
    }

    /// `stats` carries the VMM's counters, never what the guest claimed
    /// them to be; without counters of the VMM's own, none.
    #[test]
    fn stats_carry_the_vmm_s_counters_not_the_guest_s() {
        let forged = crate::protocol::VmmCounters {
            vcpu_exits: 1 << 40,
            ..Default::default()
        };
        for (counters, want) in [
            (None, None),
            (
                Some(Arc::new(Counted) as Arc<dyn crate::microvm::vmm::Counters>),
                Some((7, "net1".to_string(), 3)),
            ),
        ] {
            let mut f = fixture_with(counters, vec!["net1".into()]);
            let shared = f.shared.clone();
            let asker = std::thread::spawn(move || answer(&shared, &SupervisorRequest::Stats));
            assert_eq!(f.next_request(), HostMessage::Stats);
            f.send(&GuestMessage::Reply(Reply::Stats {
                stats: Default::default(),
                vmm: Some(forged.clone()),
            }));
            let Ok(Reply::Stats { vmm, .. }) = asker.join().unwrap() else {
                panic!("no stats reply");
            };
            let got = vmm.map(|c| (c.vcpu_exits, c.nics[0].name.clone(), c.nics[0].rx_packets));
            assert_eq!(got, want);
        }
    }

    #[test]
    fn an_unasked_reply_is_a_violation() {
        let mut f = fixture();
        f.send(&GuestMessage::Reply(Reply::Ok));
        let why = f.gone().expect("the guest must be given up");
        assert!(why.contains("nobody asked"), "{why}");
    }

    #[test]
    fn stdin_frames_from_the_guest_are_a_violation() {
        let mut f = fixture();
        Frame::data(Kind::Stdin, INIT_STREAM, b"x")
            .write_to(&mut f.guest)
            .unwrap();
        let why = f.gone().expect("the guest must be given up");
        assert!(why.contains("protocol violation"), "{why}");
    }

    #[test]
    fn a_log_flood_is_absorbed_and_requests_still_work() {
        let mut f = fixture();
        let line = GuestMessage::Log {
            level: "error".into(),
            message: "x".repeat(64 * 1024),
        };
        for _ in 0..2000 {
            f.send(&line);
        }
        let shared = f.shared.clone();
        let asker = std::thread::spawn(move || shared.request(&HostMessage::Stats));
        assert_eq!(f.next_request(), HostMessage::Stats);
        f.send(&GuestMessage::Reply(Reply::Ok));
        assert_eq!(asker.join().unwrap(), Ok(Reply::Ok));
        let log = f.shared.guest_log.lock().unwrap();
        assert!(log.dropped_total() >= 1000, "{}", log.dropped_total());
    }

    /// The supervisor's end waits for a CLI reply being written, and no
    /// longer than its limit for one that never ends.
    #[test]
    fn the_end_waits_for_replies_in_flight() {
        let f = fixture();
        let start = Instant::now();
        f.shared.wait_for_answers(Duration::from_secs(5));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "nothing in flight"
        );
        let shared = f.shared.clone();
        let (held_tx, held_rx) = mpsc::channel();
        let replier = std::thread::spawn(move || {
            let _a = Answering::begin(&shared);
            held_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        held_rx.recv().unwrap();
        let start = Instant::now();
        f.shared.wait_for_answers(Duration::from_secs(5));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(4), "{waited:?}");
        replier.join().unwrap();
        let _stuck = Answering::begin(&f.shared);
        let start = Instant::now();
        f.shared.wait_for_answers(Duration::from_millis(200));
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
