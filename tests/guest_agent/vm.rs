//! A real microVM running the guest agent: QEMU microvm (TCG here), the
//! kernel from kernels/build.sh, an initramfs holding only the release
//! `agentvm` as /init, a busybox rootfs shared with virtiofsd, and the
//! control port as a unix socket. The test talks to the agent in frames.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentvm::protocol::{
    self, Frame, GuestMessage, HostMessage, Kind, Reply, SHARE_MOUNT, SHARE_TAG,
};

use crate::common::guest::{kernel, VIRTIOFSD};

/// Longest wait for any one thing the guest does (TCG is slow, and the
/// machine may be busy building).
pub const WAIT: Duration = Duration::from_secs(120);

/// What booting needs; `Err(why)` means the test is skipped.
pub struct Assets {
    kernel: PathBuf,
    agent: PathBuf,
    tsc_khz: Option<u64>,
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn assets() -> Result<Assets, String> {
    if let Some(why) = crate::common::guest::unavailable() {
        return Err(why);
    }
    if !Path::new("/bin/busybox").exists() {
        return Err("/bin/busybox not found (Debian package busybox-static)".into());
    }
    let kernel = kernel()?;
    Ok(Assets {
        kernel,
        agent: agent_binary(),
        tsc_khz: tsc_khz(),
    })
}

/// The release agentvm (static; a debug build is far too slow under TCG):
/// $AGENTVM_GUEST_BINARY, this test's own binary when the tests run in
/// release, else `cargo build --release` (a no-op when up to date).
fn agent_binary() -> PathBuf {
    if let Ok(p) = std::env::var("AGENTVM_GUEST_BINARY") {
        return PathBuf::from(p);
    }
    let own = PathBuf::from(env!("CARGO_BIN_EXE_agentvm"));
    if !cfg!(debug_assertions) {
        return own;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "agentvm", "--bin", "agentvm"])
        .current_dir(manifest_dir())
        .status()
        .expect("run cargo build --release");
    assert!(status.success(), "cargo build --release failed");
    // .../target/<triple>/debug/agentvm -> .../target/<triple>/release/agentvm
    let release = own
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("release/agentvm"))
        .expect("target dir");
    assert!(release.is_file(), "{} missing", release.display());
    release
}

/// Under TCG the guest cannot calibrate the TSC quickly: pass the host's
/// frequency (as kernels/smoke-boot.sh does).
fn tsc_khz() -> Option<u64> {
    if let Some(k) = std::env::var("AGENTVM_TSC_KHZ")
        .ok()
        .and_then(|k| k.parse().ok())
    {
        return Some(k);
    }
    let dmesg = Command::new("dmesg").output().ok()?;
    let text = String::from_utf8_lossy(&dmesg.stdout);
    let mhz = |marker: &str| {
        text.lines().rev().find_map(|l| {
            let rest = &l[l.find(marker)? + marker.len()..];
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
    };
    let from_dmesg = mhz("Refined TSC clocksource calibration: ").or_else(|| mhz("tsc: Detected "));
    let mhz = match from_dmesg {
        Some(m) => m,
        None => {
            let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
            if !info.contains("constant_tsc") {
                return None;
            }
            info.lines()
                .find(|l| l.starts_with("cpu MHz"))?
                .split(':')
                .nth(1)?
                .trim()
                .parse()
                .ok()?
        }
    };
    Some((mhz * 1000.0).round() as u64)
}

/// An initramfs (newc cpio) holding /dev/console and the agent as /init.
fn write_initramfs(path: &Path, agent: &Path) {
    fn entry(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let fields = [
            ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        out.extend_from_slice(b"070701");
        for f in fields {
            out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.resize(out.len().next_multiple_of(4), 0);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(4), 0);
    }
    let init = std::fs::read(agent).expect("read agentvm");
    let mut out = Vec::with_capacity(init.len() + 1024);
    entry(&mut out, 1, "dev", 0o040755, (0, 0), b"");
    entry(&mut out, 2, "dev/console", 0o020600, (5, 1), b"");
    entry(&mut out, 3, "init", 0o100755, (0, 0), &init);
    entry(&mut out, 0, "TRAILER!!!", 0, (0, 0), b"");
    std::fs::write(path, out).expect("write initramfs");
}

/// A busybox rootfs: /bin/busybox and a link per applet.
fn write_rootfs(root: &Path) {
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "root"] {
        std::fs::create_dir_all(root.join(d)).expect("rootfs dir");
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("copy busybox");
    let list = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\n").expect("group");
}

/// A runc-like spec (`runc spec` defaults) for `args` on the shared rootfs.
pub fn spec(args: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
                "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": format!("{SHARE_MOUNT}/rootfs"), "readonly": false},
        "hostname": "guest-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
        ],
        "linux": {
            "cgroupsPath": "/agentvm-test",
            "resources": {"devices": [{"allow": false, "access": "rwm"}], "pids": {"limit": 200}},
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}
            ],
            "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/proc/scsi"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                "/proc/sysrq-trigger"]
        }
    })
}

/// What the guest sent that no request consumed yet.
#[derive(Default)]
pub struct Received {
    pub output: HashMap<(u32, u8), Vec<u8>>,
    pub exits: HashMap<u32, i32>,
    pub logs: Vec<(String, String)>,
}

pub struct Vm {
    pub dir: tempfile::TempDir,
    qemu: Child,
    virtiofsd: Child,
    writer: UnixStream,
    frames: mpsc::Receiver<Result<Frame, String>>,
    pub started: Instant,
    pub hello_at: Duration,
    pub first_output_at: Option<Duration>,
    pub got: Received,
}

fn wait_for_path(path: &Path, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < WAIT,
            "{what} never created {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Vm {
    /// Boots a VM and waits for Hello.
    pub fn boot(assets: &Assets) -> Vm {
        let dir = tempfile::Builder::new()
            .prefix("agentvm-guest-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        write_rootfs(&d.join("share/rootfs"));
        write_initramfs(&d.join("initramfs.cpio"), &assets.agent);
        let fs_sock = d.join("fs.sock");
        let virtiofsd = Command::new(VIRTIOFSD)
            .arg("--socket-path")
            .arg(&fs_sock)
            .arg("--shared-dir")
            .arg(d.join("share"))
            .args(["--cache", "auto", "--sandbox", "namespace"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("virtiofsd.log")).expect("log"))
            .spawn()
            .expect("start virtiofsd");
        wait_for_path(&fs_sock, "virtiofsd");
        let mut append =
            "console=ttyS0 reboot=t panic=-1 quiet no_timer_check tsc=reliable".to_string();
        if let Some(khz) = assets.tsc_khz {
            append.push_str(&format!(" tsc_early_khz={khz}"));
        }
        if let Ok(extra) = std::env::var("AGENTVM_TEST_APPEND") {
            append.push(' ');
            append.push_str(&extra);
        }
        let ctl = d.join("ctl.sock");
        let started = Instant::now();
        let qemu = Command::new("qemu-system-x86_64")
            .args(["-M", "microvm,acpi=off,memory-backend=mem", "-accel", "tcg"])
            .args([
                "-cpu",
                "max",
                "-m",
                "512",
                "-smp",
                "2",
                "-nographic",
                "-no-reboot",
            ])
            .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
            .arg("-kernel")
            .arg(&assets.kernel)
            .arg("-initrd")
            .arg(d.join("initramfs.cpio"))
            .args(["-append", &append])
            .arg("-chardev")
            .arg(format!("socket,id=fs0,path={}", fs_sock.display()))
            .args([
                "-device",
                &format!("vhost-user-fs-device,chardev=fs0,tag={SHARE_TAG}"),
            ])
            .args(["-device", "virtio-serial-device", "-chardev"])
            .arg(format!(
                "socket,id=ctl,path={},server=on,wait=off",
                ctl.display()
            ))
            .args([
                "-device",
                "virtserialport,chardev=ctl,name=org.agentvm.control",
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(d.join("console.log")).expect("console"))
            .stderr(std::fs::File::create(d.join("qemu.err")).expect("qemu.err"))
            .spawn()
            .expect("start qemu");
        // QEMU binds the socket a moment before it listens on it.
        let stream = loop {
            match UnixStream::connect(&ctl) {
                Ok(s) => break s,
                Err(_) if started.elapsed() < WAIT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("cannot connect to {}: {e}", ctl.display()),
            }
        };
        let mut reader = stream.try_clone().expect("clone");
        let (tx, frames) = mpsc::channel();
        std::thread::spawn(move || loop {
            let frame = Frame::read_from(&mut reader).map_err(|e| e.to_string());
            let end = frame.is_err();
            if tx.send(frame).is_err() || end {
                return;
            }
        });
        let mut vm = Vm {
            dir,
            qemu,
            virtiofsd,
            writer: stream,
            frames,
            started,
            hello_at: Duration::ZERO,
            first_output_at: None,
            got: Received::default(),
        };
        let first = vm.next_frame();
        match first.parse_control::<GuestMessage>() {
            Ok(GuestMessage::Hello {
                version, kernel, ..
            }) => {
                assert_eq!(version, protocol::VERSION);
                assert!(kernel.starts_with("Linux "), "{kernel}");
            }
            other => vm.fail(&format!("expected Hello first, got {other:?}")),
        }
        vm.hello_at = vm.started.elapsed();
        vm
    }

    pub fn fail(&self, why: &str) -> ! {
        let console =
            std::fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default();
        let qemu = std::fs::read_to_string(self.dir.path().join("qemu.err")).unwrap_or_default();
        let fsd =
            std::fs::read_to_string(self.dir.path().join("virtiofsd.log")).unwrap_or_default();
        panic!(
            "{why}\n--- guest console ---\n{console}\n--- qemu stderr ---\n{qemu}\n--- virtiofsd ---\n{fsd}\n--- logs from the agent: {:?}",
            self.got.logs
        );
    }

    fn next_frame(&mut self) -> Frame {
        match self.frames.recv_timeout(WAIT) {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => self.fail(&format!("control channel ended: {e}")),
            Err(_) => self.fail(&format!("nothing from the guest in {WAIT:?}")),
        }
    }

    /// Reads one frame; returns a Reply, files everything else.
    fn pump(&mut self) -> Option<Reply> {
        let f = self.next_frame();
        match f.kind {
            Kind::Stdout | Kind::Stderr => {
                if f.kind == Kind::Stdout && self.first_output_at.is_none() {
                    self.first_output_at = Some(self.started.elapsed());
                }
                self.got
                    .output
                    .entry((f.stream, f.kind as u8))
                    .or_default()
                    .extend_from_slice(&f.payload);
                None
            }
            Kind::Control => match f.parse_control::<GuestMessage>() {
                Ok(GuestMessage::Reply(r)) => Some(r),
                Ok(GuestMessage::Exit { id, status, .. }) => {
                    if self.got.exits.insert(id, status).is_some() {
                        self.fail(&format!("second Exit for stream {id}"));
                    }
                    None
                }
                Ok(GuestMessage::Log { level, message }) => {
                    eprintln!("guest log [{level}]: {message}");
                    self.got.logs.push((level, message));
                    None
                }
                other => self.fail(&format!("unexpected message from the guest: {other:?}")),
            },
            other => self.fail(&format!("guest sent a {other:?} frame")),
        }
    }

    pub fn send_frame(&mut self, f: &Frame) {
        f.write_to(&mut self.writer).expect("write to the guest");
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to the guest");
    }

    pub fn request(&mut self, msg: &HostMessage) -> Reply {
        self.send_frame(&Frame::control(msg));
        self.reply()
    }

    /// The next Reply.
    pub fn reply(&mut self) -> Reply {
        loop {
            if let Some(r) = self.pump() {
                return r;
            }
        }
    }

    pub fn stdin(&mut self, id: u32, bytes: &[u8]) {
        self.send_frame(&Frame::data(Kind::Stdin, id, bytes));
    }

    pub fn output(&self, id: u32, kind: Kind) -> String {
        let bytes = self.got.output.get(&(id, kind as u8)).cloned();
        String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned()
    }

    /// Waits for stream `id`'s Exit; its status.
    pub fn wait_exit(&mut self, id: u32) -> i32 {
        loop {
            if let Some(&s) = self.got.exits.get(&id) {
                return s;
            }
            if let Some(r) = self.pump() {
                self.fail(&format!(
                    "unexpected reply {r:?} while waiting for exit {id}"
                ));
            }
        }
    }

    /// Waits until stream `id`'s stdout contains `needle`.
    pub fn wait_stdout(&mut self, id: u32, needle: &str) {
        while !self.output(id, Kind::Stdout).contains(needle) {
            if self.got.exits.contains_key(&id) {
                self.fail(&format!(
                    "stream {id} exited without printing {needle:?}: {:?}",
                    self.output(id, Kind::Stdout)
                ));
            }
            if let Some(r) = self.pump() {
                self.fail(&format!("unexpected reply {r:?} while waiting for output"));
            }
        }
    }

    /// Waits for QEMU to end (the guest rebooted); its exit status.
    pub fn wait_qemu(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.qemu.try_wait().expect("wait qemu") {
                return status;
            }
            if start.elapsed() > WAIT {
                self.fail("QEMU did not exit after the guest was told to stop");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Drains what the guest still sends until the channel closes.
    pub fn drain_until_closed(&mut self) {
        while let Ok(Ok(f)) = self.frames.recv_timeout(WAIT) {
            if let Ok(GuestMessage::Log { level, message }) = f.parse_control::<GuestMessage>() {
                eprintln!("guest log [{level}]: {message}");
                self.got.logs.push((level, message));
            }
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if std::env::var_os("AGENTVM_TEST_CONSOLE").is_some() {
            let console = std::fs::read_to_string(self.dir.path().join("console.log"));
            eprintln!("--- guest console ---\n{}", console.unwrap_or_default());
        }
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
        let _ = self.virtiofsd.kill();
        let _ = self.virtiofsd.wait();
    }
}
