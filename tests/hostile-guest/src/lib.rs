//! A guest agent that breaks the control protocol on purpose, to test what
//! the host does with a hostile guest (tests/microvm_hostile.rs).
//!
//! Each binary of this crate is booted as a microVM's `/init` through
//! agentvm's `guest_agent` setting. As PID 1 it mounts devtmpfs and sysfs,
//! opens the control port the way the real agent does (by name, under
//! `/sys/class/virtio-ports`), behaves like the agent up to a point, and
//! then sends what its [`Mode`] says. Afterwards it keeps the port open and
//! never powers off: ending the VM is the host's job. Everything it does is
//! written to the serial console (the container's `console.log`).

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentvm_protocol::{self as protocol, Frame, GuestMessage, HostMessage, Kind, Reply};
use agentvm_protocol::{PORT_NAME, VERSION};

/// What the guest does wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Text instead of a frame, before any Hello.
    NotAFrame,
    /// A valid Hello; then, as the answer to Create, a frame header with an
    /// unknown kind.
    BadKindAtCreate,
    /// Plays the agent through Create and Start, then sends a frame header
    /// announcing a u32::MAX-byte payload.
    OversizedWhileRunning,
    /// Plays the agent through Start, then sends a Reply nobody asked for.
    UnaskedReply,
    /// Plays the agent through Start, then reports the exit of a stream the
    /// host never started.
    UnknownExit,
    /// Plays the agent through Start, then sends a control frame whose
    /// payload is not JSON.
    BadJson,
    /// Not hostile, only slow: sends Hello in pieces with pauses between
    /// them, then plays the agent of a workload that exits with status 7
    /// right after Start, and powers off on Shutdown.
    SlowHello,
    /// Booted from the share, tries to change its own init there — the
    /// host's file: write it, truncate it, chmod it, rename it, unlink it,
    /// hard-link it. Then plays the agent of a workload whose exit status
    /// has a bit set per attempt that succeeded (0: all refused; 64: the
    /// init was not found there to attack).
    TamperInit,
}

/// PID 1's entry point.
pub fn main(mode: Mode) -> ! {
    say(&format!("hostile guest up, mode {mode:?}"));
    match misbehave(mode) {
        Ok(port) => {
            say("done; draining the port until the host ends the VM");
            drain(port);
        }
        Err(e) => say(&format!("failed: {e}")),
    }
    // PID 1 must not exit (that panics the kernel, which would end the VM
    // for the host): stay, so that only the host can end it.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Each way to change the init file in the share; a bit of the result per
/// one that worked.
fn tamper_with_init() -> i32 {
    use std::os::unix::fs::PermissionsExt;
    let init = Path::new("/").join(protocol::SHARE_INIT);
    let moved = init.with_extension("moved");
    let attempts: [(&str, &dyn Fn() -> std::io::Result<()>); 6] = [
        ("write", &|| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&init)?
                .write_all(b"\x7fELF tampered")
        }),
        ("truncate", &|| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&init)?
                .set_len(0)
        }),
        ("chmod", &|| {
            std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o4777))
        }),
        ("rename", &|| std::fs::rename(&init, &moved)),
        ("unlink", &|| std::fs::remove_file(&init)),
        ("link", &|| std::fs::hard_link(&init, &moved)),
    ];
    // The attempts mean something only if the file is there to attack.
    let mut head = [0u8; 4];
    let readable = File::open(&init).and_then(|mut f| f.read_exact(&mut head));
    if readable.is_err() || head != *b"\x7fELF" {
        say(&format!(
            "tamper: {} is not this ELF binary ({readable:?})",
            init.display()
        ));
        return 1 << attempts.len();
    }
    let mut worked = 0;
    for (i, (what, attempt)) in attempts.iter().enumerate() {
        match attempt() {
            Ok(()) => {
                say(&format!("tamper {what}: WORKED"));
                worked |= 1 << i;
            }
            Err(e) => say(&format!("tamper {what}: refused ({e})")),
        }
    }
    worked
}

fn say(line: &str) {
    // stdout of PID 1 is /dev/console, the serial console.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "hostile-guest: {line}");
    let _ = out.flush();
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}")]
    Setup(String),
    #[error("control port: {0}")]
    Protocol(#[from] protocol::ProtocolError),
    #[error("control port: {0}")]
    Io(#[from] std::io::Error),
}

fn misbehave(mode: Mode) -> Result<File, Error> {
    mount("devtmpfs", "/dev", "devtmpfs")?;
    mount("sysfs", "/sys", "sysfs")?;
    let tampered = if mode == Mode::TamperInit {
        tamper_with_init()
    } else {
        0
    };
    let mut port = open_port()?;
    if mode == Mode::NotAFrame {
        // "GET " read as a little-endian length is 542393671 bytes.
        port.write_all(b"GET /control HTTP/1.1\r\nHost: agentvm\r\n\r\n")?;
        return Ok(port);
    }
    let hello = Frame::control(&GuestMessage::Hello {
        version: VERSION,
        kernel: "hostile-guest".into(),
        boot: None,
    })
    .encode()?;
    if mode == Mode::SlowHello {
        // Longer pauses than the host's poll interval, splitting the header.
        for piece in [&hello[..3], &hello[3..11], &hello[11..]] {
            port.write_all(piece)?;
            port.flush()?;
            std::thread::sleep(Duration::from_millis(400));
        }
    } else {
        port.write_all(&hello)?;
    }
    expect(&mut port, "create")?;
    if mode == Mode::BadKindAtCreate {
        let mut header = 2u32.to_le_bytes().to_vec();
        header.push(0x7f);
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(b"{}");
        port.write_all(&header)?;
        return Ok(port);
    }
    send(&mut port, &GuestMessage::Reply(Reply::Created { pid: 1 }))?;
    expect(&mut port, "start")?;
    send(&mut port, &GuestMessage::Reply(Reply::Ok))?;
    match mode {
        Mode::OversizedWhileRunning => {
            let mut header = u32::MAX.to_le_bytes().to_vec();
            header.push(Kind::Stdout as u8);
            header.extend_from_slice(&0u32.to_le_bytes());
            port.write_all(&header)?;
        }
        Mode::UnaskedReply => send(&mut port, &GuestMessage::Reply(Reply::Ok))?,
        Mode::UnknownExit => send(
            &mut port,
            &GuestMessage::Exit {
                id: 4242,
                status: 0,
                oom_kills: None,
            },
        )?,
        Mode::BadJson => {
            Frame::data(Kind::Control, 0, br#"{"type":"exit","id":"#).write_to(&mut port)?;
        }
        Mode::SlowHello | Mode::TamperInit => {
            let status = if mode == Mode::SlowHello { 7 } else { tampered };
            send(
                &mut port,
                &GuestMessage::Exit {
                    id: 0,
                    status,
                    oom_kills: Some(u64::MAX),
                },
            )?;
            expect(&mut port, "shutdown")?;
            send(&mut port, &GuestMessage::Reply(Reply::Ok))?;
            say("powering off");
            // SAFETY: reboot(2) with a valid command; QEMU runs with
            // -no-reboot, so this ends the VM.
            unsafe { libc::reboot(libc::RB_AUTOBOOT) };
        }
        Mode::NotAFrame | Mode::BadKindAtCreate => {}
    }
    Ok(port)
}

fn mount(source: &str, target: &str, fstype: &str) -> Result<(), Error> {
    // Booted from the share, the root has no /dev or /sys of its own (the
    // share is the test's throwaway state directory).
    std::fs::create_dir_all(target).map_err(|e| Error::Setup(format!("mkdir {target}: {e}")))?;
    let c = |s: &str| CString::new(s).map_err(|e| Error::Setup(e.to_string()));
    let (source_c, target_c, fstype_c) = (c(source)?, c(target)?, c(fstype)?);
    // SAFETY: three valid NUL-terminated strings that outlive the call, no
    // flags, no data.
    let rc = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            fstype_c.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    let err = std::io::Error::last_os_error();
    // EBUSY: the kernel mounted it already.
    if rc != 0 && err.raw_os_error() != Some(libc::EBUSY) {
        return Err(Error::Setup(format!("mount {fstype} on {target}: {err}")));
    }
    Ok(())
}

/// The control port's device node, found by name as the real agent does.
fn open_port() -> Result<File, Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(dev) = find_port(Path::new("/sys/class/virtio-ports")) {
            say(&format!("control port is {}", dev.display()));
            return Ok(std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&dev)?);
        }
        if Instant::now() > deadline {
            return Err(Error::Setup(format!("no virtio port named {PORT_NAME}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn find_port(class: &Path) -> Option<PathBuf> {
    std::fs::read_dir(class).ok()?.flatten().find_map(|e| {
        let name = std::fs::read_to_string(e.path().join("name")).ok()?;
        (name.trim() == PORT_NAME).then(|| Path::new("/dev").join(e.file_name()))
    })
}

fn send(port: &mut File, msg: &GuestMessage) -> Result<(), Error> {
    Frame::control(msg).write_to(port)?;
    Ok(())
}

/// Waits for the host's next request and checks it is `want` (its type).
fn expect(port: &mut File, want: &str) -> Result<(), Error> {
    let frame = loop {
        let frame = Frame::read_from(port)?;
        if frame.kind == Kind::Control {
            break frame;
        }
    };
    let msg: HostMessage = frame.parse_control()?;
    let got = serde_json::to_value(&msg)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .unwrap_or_default();
    say(&format!("host sent {got}"));
    if got != want {
        return Err(Error::Setup(format!(
            "expected {want} from the host, got {got}"
        )));
    }
    Ok(())
}

/// Reads and logs what the host still sends, until it closes the port.
fn drain(mut port: File) {
    let mut buf = [0u8; 4096];
    loop {
        match port.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => say(&format!("host sent {n} more bytes")),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                say(&format!("port: {e}"));
                return;
            }
        }
    }
}
