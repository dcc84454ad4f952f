//! terminal: true with --console-socket, for the init process and for exec.

use std::io::{IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use oci_validation::expect::{Check, Expectations};
use oci_validation::CHECKER_PATH;
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::runtime::{Pending, TIMEOUT};

pub const CASES: &[(&str, CaseFn)] = &[
    ("console", console),
    ("console-user", console_user),
    ("exec-tty", exec_tty),
    ("console-socket-missing", console_socket_missing),
];

/// `terminal: true` without `--console-socket` for a container that
/// detaches (`create`, `run -d`), and a console socket without a terminal:
/// refused in runc's words, the runtime's name aside, and nothing left.
fn console_socket_missing(ctx: &mut Ctx) -> Result<()> {
    for (check, detach) in [("create", false), ("run -d", true)] {
        let mut b = ctx.bundle()?;
        b.args(&["/bin/true"]);
        b.set("/process/terminal", serde_json::json!(true));
        b.write()?;
        let id = ctx.id();
        let mut args = vec![if detach { "run" } else { "create" }];
        if detach {
            args.push("-d");
        }
        let dir = b.dir_str();
        args.extend(["--bundle", dir.as_str(), id.as_str()]);
        let out = ctx.rt.run(&args)?;
        ctx.check(
            format!("{check} with a terminal and no console socket: refused as runc"),
            out.code == Some(1)
                && out.stderr.contains("cannot allocate tty if ")
                && out
                    .stderr
                    .contains(" will detach without setting console socket"),
            || out.describe(),
        );
        let left = ctx.rt.run(&["state", &id])?;
        ctx.check(
            format!("{check} with a terminal and no console socket: nothing left"),
            !left.success(),
            || left.describe(),
        );
    }
    let mut b = ctx.bundle()?;
    b.args(&["/bin/true"]);
    b.write()?;
    let id = ctx.id();
    let socket = ctx.scratch("console-socket-missing")?.join("socket");
    let out = ctx.rt.run(&[
        "create",
        "--console-socket",
        &socket.to_string_lossy(),
        "--bundle",
        &b.dir_str(),
        &id,
    ])?;
    ctx.check(
        "a console socket without a terminal: refused as runc",
        out.code == Some(1)
            && out.stderr.contains("cannot use console socket if ")
            && out.stderr.contains(" will not detach or allocate tty"),
        || out.describe(),
    );
    Ok(())
}

/// Accepts the runtime's connection on `listener` and receives one fd,
/// giving up when `pending` exits first or after the timeout.
pub(super) fn recv_pty(listener: &UnixListener, pending: &mut Pending) -> Result<OwnedFd> {
    listener
        .set_nonblocking(true)
        .context("nonblocking console socket")?;
    let deadline = Instant::now() + TIMEOUT;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if pending.child.try_wait()?.is_some() {
                    bail!("the runtime exited without connecting to the console socket");
                }
                if Instant::now() >= deadline {
                    bail!("no connection on the console socket");
                }
                crate::reaper::tick(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("accept on the console socket"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let mut buf = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .context("recvmsg on the console socket")?;
    for c in msg.cmsgs().context("read control messages")? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(fd) = fds.first() {
                // SAFETY: SCM_RIGHTS just installed this fd in our table and
                // nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(*fd) });
            }
        }
    }
    Err(anyhow!("the console socket message carried no fd"))
}

/// Reads the pty master until the slave side is closed (EIO) or 20 s pass.
fn read_pty(master: OwnedFd) -> String {
    read_pty_for(master, Duration::from_secs(20))
}

/// Reads the pty master until the slave side is closed (EIO) or `time`
/// passes.
pub(super) fn read_pty_for(master: OwnedFd, time: Duration) -> String {
    let mut f = std::fs::File::from(master);
    let mut out = Vec::new();
    let deadline = Instant::now() + time;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        crate::reaper::reap_orphans();
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => break,
        }
        match f.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn tty_expectations(rows: u16, cols: u16) -> Expectations {
    let mut e = Expectations::default();
    for fd in 0..3 {
        e.push(format!("fd {fd} is a tty"), Check::Tty { fd, tty: true });
    }
    e.push("consoleSize applied", Check::WinSize { rows, cols });
    e.push(
        "controlling terminal (/dev/tty opens)",
        Check::Open {
            path: "/dev/tty".into(),
            write: true,
            errno: None,
        },
    );
    e
}

fn is_tty(fd: &OwnedFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd.as_raw_fd()) == 1 }
}

fn console(ctx: &mut Ctx) -> Result<()> {
    console_as(ctx, None, (33, 101))
}

/// The console of a process running as uid 1000 belongs to uid 1000, as
/// runc makes it.
fn console_user(ctx: &mut Ctx) -> Result<()> {
    console_as(ctx, Some(1000), (41, 132))
}

fn console_as(ctx: &mut Ctx, uid: Option<u32>, (rows, cols): (u16, u16)) -> Result<()> {
    let dir = ctx.scratch("console")?;
    let sock = dir.join("console.sock");
    let listener = UnixListener::bind(&sock).context("bind console socket")?;
    let mut b = ctx.bundle()?;
    b.set("/process/terminal", json!(true));
    b.set(
        "/process/consoleSize",
        json!({"height": rows, "width": cols}),
    );
    if let Some(uid) = uid {
        b.set("/process/user", json!({"uid": uid, "gid": uid}));
    }
    let mut e = tty_expectations(rows, cols);
    e.push(
        match uid {
            Some(_) => "/dev/console is the pty slave, owned by the process's uid",
            None => "/dev/console is the pty slave",
        },
        Check::Node {
            path: "/dev/console".into(),
            node_type: 'c',
            major: Some(136),
            minor: None,
            mode: None,
            uid,
            gid: None,
        },
    );
    b.write_expect(&e)?;
    b.write()?;
    let id = ctx.id();
    let mut pending = ctx.rt.spawn(&[
        "create",
        "--bundle",
        &b.dir_str(),
        "--console-socket",
        &sock.to_string_lossy(),
        &id,
    ])?;
    let master = recv_pty(&listener, &mut pending);
    let res = pending.wait(TIMEOUT)?;
    let master = match master {
        Ok(m) => m,
        Err(err) => {
            ctx.check("console socket receives the pty master", false, || {
                format!("{err:#}; create: {}", res.describe())
            });
            bail!("no pty master");
        }
    };
    ctx.record(
        "console socket receives the pty master",
        crate::report::Outcome::Ok,
    );
    ctx.check("received fd is a terminal", is_tty(&master), || {
        "isatty is false".into()
    });
    ctx.check_ok("create with a console socket succeeds", &res);
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_ok("start succeeds", &res);
    let text = read_pty(master);
    ctx.record_lines(
        &e,
        &text,
        &format!("pty output: {}", crate::runtime::tail(&text, 200)),
    );
    Ok(())
}

fn exec_tty(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("console")?;
    let sock = dir.join("console.sock");
    let listener = UnixListener::bind(&sock).context("bind console socket")?;
    let mut b = ctx.bundle()?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let e = tty_expectations(41, 132);
    let expect = "/oci-expect-tty.json";
    b.write_expect_at(expect, &e)?;
    let process = json!({
        "terminal": true,
        "consoleSize": {"height": 41, "width": 132},
        "user": {"uid": 0, "gid": 0},
        "args": [CHECKER_PATH, expect],
        "env": ["PATH=/bin", "TERM=xterm"],
        "cwd": "/",
        "noNewPrivileges": true
    });
    let pfile = dir.join("process.json");
    std::fs::write(&pfile, serde_json::to_vec(&process)?).context("write process.json")?;
    let pidfile = dir.join("exec.pid");
    let mut pending = ctx.rt.spawn(&[
        "exec",
        "--detach",
        "--tty",
        "--console-socket",
        &sock.to_string_lossy(),
        "--pid-file",
        &pidfile.to_string_lossy(),
        "--process",
        &pfile.to_string_lossy(),
        &id,
    ])?;
    let master = recv_pty(&listener, &mut pending);
    let res = pending.wait(TIMEOUT)?;
    let master = match master {
        Ok(m) => m,
        Err(err) => {
            ctx.check("exec --tty sends the pty master", false, || {
                format!("{err:#}; exec: {}", res.describe())
            });
            bail!("no pty master");
        }
    };
    ctx.record(
        "exec --tty sends the pty master",
        crate::report::Outcome::Ok,
    );
    ctx.check_ok("exec --detach --tty succeeds", &res);
    let pid = std::fs::read_to_string(&pidfile).unwrap_or_default();
    ctx.check(
        "exec --pid-file written",
        pid.trim().parse::<i32>().is_ok_and(|p| p > 0),
        || format!("pid file {pid:?}"),
    );
    let text = read_pty(master);
    ctx.record_lines(
        &e,
        &text,
        &format!("pty output: {}", crate::runtime::tail(&text, 200)),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);
    Ok(())
}
