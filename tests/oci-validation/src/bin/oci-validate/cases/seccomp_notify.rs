//! `SCMP_ACT_NOTIFY` with `seccomp.listenerPath`: the runtime connects to
//! the listener's unix socket and sends the container's process state
//! (runc's `ContainerProcessState`) with the notify fd in `SCM_RIGHTS`.

use std::io::{IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use serde_json::{json, Value};

use super::{CaseFn, Ctx};

pub const CASES: &[(&str, CaseFn)] = &[
    ("seccomp-notify", notify),
    ("seccomp-notify-exec", notify_exec),
];

/// What the listener got: the message and the one fd it carried.
struct Received {
    message: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// Accepts one connection on `listener` (up to 30 s) and reads the
/// message and its fds until the runtime closes the connection.
fn receive(listener: &UnixListener) -> Result<Received> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!("no connection on the listener socket");
                }
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("accept on the listener socket"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; 65536];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .context("recvmsg on the listener socket")?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().context("read control messages")? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: SCM_RIGHTS just installed this fd in our table and
                // nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let n = msg.bytes;
    let mut message = buf[..n].to_vec();
    // The rest of the message, if it came in more than one piece.
    let _ = stream.read_to_end(&mut message);
    Ok(Received { message, fds })
}

/// A bundle whose profile notifies on mkdir, with its listener.
fn notify_bundle(ctx: &mut Ctx) -> Result<(crate::bundle::Bundle, UnixListener, String)> {
    let dir = ctx.scratch("seccomp-notify")?;
    let sock = dir.join("listener.sock");
    let listener = UnixListener::bind(&sock).context("bind the listener socket")?;
    let meta = format!("{}-metadata", ctx.env.tag);
    let mut b = ctx.bundle()?;
    b.set(
        "/linux/seccomp",
        json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "listenerPath": sock.to_string_lossy(),
            "listenerMetadata": meta,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_NOTIFY"}]
        }),
    );
    Ok((b, listener, meta))
}

fn notify(ctx: &mut Ctx) -> Result<()> {
    let (mut b, listener, meta) = notify_bundle(ctx)?;
    // With the listener gone, a notified syscall fails with ENOSYS.
    b.args(&[
        "/bin/sh",
        "-c",
        "mkdir /notified 2>/dev/null; echo mkdir=$?",
    ]);
    b.write()?;
    let id = ctx.id();
    let listening = thread::spawn(move || receive(&listener));
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    let received = listening
        .join()
        .map_err(|_| anyhow!("the listener thread panicked"))?;
    ctx.check_ok("create with a notify listener succeeds", &out);
    let received = match received {
        Ok(r) => r,
        Err(e) => {
            ctx.check("the listener receives one fd", false, || {
                format!("{e:#}; create: {}", out.describe())
            });
            return Ok(());
        }
    };
    ctx.check(
        "the listener receives one fd",
        received.fds.len() == 1,
        || format!("{} fds", received.fds.len()),
    );
    let target = received
        .fds
        .first()
        .and_then(|fd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok());
    ctx.check(
        "the fd is a seccomp notify fd",
        target
            .as_ref()
            .is_some_and(|t| t.to_string_lossy() == "anon_inode:seccomp notify"),
        || format!("fd is {target:?}"),
    );
    let state: Value = serde_json::from_slice(&received.message).unwrap_or(Value::Null);
    let raw = String::from_utf8_lossy(&received.message).into_owned();
    ctx.check(
        "the message is the container process state",
        state["ociVersion"].is_string()
            && state["fds"] == json!(["seccompFd"])
            && state["pid"].as_i64().is_some_and(|p| p > 0),
        || format!("message {raw:?}"),
    );
    ctx.check(
        "the message carries listenerMetadata",
        state["metadata"] == meta.as_str(),
        || format!("metadata {}", state["metadata"]),
    );
    ctx.check(
        "the message carries the container's state, creating",
        state["state"]["id"] == id.as_str()
            && state["state"]["bundle"].as_str() == Some(&b.dir_str())
            && state["state"]["status"] == "creating",
        || format!("state {}", state["state"]),
    );
    let init = ctx.state(&id).ok().and_then(|s| s["pid"].as_i64());
    ctx.check(
        "the message's pid is the init's",
        init.is_some() && state["pid"].as_i64() == init && state["state"]["pid"].as_i64() == init,
        || {
            format!(
                "message pid {}, state pid {}, init {init:?}",
                state["pid"], state["state"]["pid"]
            )
        },
    );
    // The listener lets go of the fd: the workload's mkdir gets ENOSYS.
    drop(received);
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_ok("start succeeds", &res);
    let st = ctx.wait_status(&id, "stopped");
    ctx.check(
        "the notified syscall fails once the listener is gone",
        st.is_ok() && !b.rootfs().join("notified").exists(),
        || super::show(&st),
    );
    Ok(())
}

/// `exec` into a container whose profile notifies hands the exec'd
/// process's notify fd to the listener too, with its own pid and the
/// container's state (running, the init's pid), as runc does.
fn notify_exec(ctx: &mut Ctx) -> Result<()> {
    let (mut b, listener, meta) = notify_bundle(ctx)?;
    let listener = std::sync::Arc::new(listener);
    let l = listener.clone();
    let listening = thread::spawn(move || receive(&l));
    let (id, init) = ctx.start_sleeper(&mut b)?;
    let first = listening
        .join()
        .map_err(|_| anyhow!("the listener thread panicked"))?;
    if let Err(e) = first {
        bail!("the init's notify fd never came: {e:#}");
    }
    let l = listener.clone();
    let listening = thread::spawn(move || receive(&l));
    let dir = ctx.scratch("exec-pid")?;
    let pid_file = dir.join("pid");
    let out = ctx.rt.run(&[
        "exec",
        "-d",
        "--pid-file",
        &pid_file.to_string_lossy(),
        &id,
        "/bin/sh",
        "-c",
        "mkdir /exec-notified 2>/dev/null; exec sleep 600",
    ])?;
    let received = listening
        .join()
        .map_err(|_| anyhow!("the listener thread panicked"))?;
    ctx.check_ok("exec into a notifying container succeeds", &out);
    let received = match received {
        Ok(r) => r,
        Err(e) => {
            ctx.check("exec hands a notify fd to the listener", false, || {
                format!("{e:#}; exec: {}", out.describe())
            });
            return Ok(());
        }
    };
    let target = received
        .fds
        .first()
        .and_then(|fd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok());
    ctx.check(
        "exec hands a notify fd to the listener",
        received.fds.len() == 1
            && target
                .as_ref()
                .is_some_and(|t| t.to_string_lossy() == "anon_inode:seccomp notify"),
        || format!("{} fds, first {target:?}", received.fds.len()),
    );
    let state: Value = serde_json::from_slice(&received.message).unwrap_or(Value::Null);
    let exec_pid = super::wait_file(&pid_file).and_then(|s| s.trim().parse::<i64>().ok());
    ctx.check(
        "exec's message: the exec'd pid, listenerMetadata",
        state["fds"] == json!(["seccompFd"])
            && exec_pid.is_some()
            && state["pid"].as_i64() == exec_pid
            && state["metadata"] == meta.as_str(),
        || {
            format!(
                "message {}, exec pid {exec_pid:?}",
                String::from_utf8_lossy(&received.message)
            )
        },
    );
    ctx.check(
        "exec's message: the container running, the init's pid",
        state["state"]["id"] == id.as_str()
            && state["state"]["status"] == "running"
            && state["state"]["pid"].as_i64() == Some(i64::from(init)),
        || format!("state {}", state["state"]),
    );
    drop(received);
    ctx.rt.quiet(&["delete", "--force", &id]);
    Ok(())
}
