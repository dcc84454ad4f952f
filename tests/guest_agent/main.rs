//! The guest agent booted for real: QEMU microvm (TCG on our machines) with
//! the kernel from kernels/build.sh, the release `agentvm` as /init of an
//! initramfs, a busybox rootfs over virtio-fs, and the control protocol on
//! a virtio-serial port. Each test boots its own VM; VMs run one at a time
//! so that the printed boot timings mean something.
//!
//! Needs qemu-system-x86_64, /usr/local/libexec/agentvm/virtiofsd, a static
//! /bin/busybox and a kernel; without them each test prints `skipped: <why>`.
//! Environment: AGENTVM_KERNEL, AGENTVM_GUEST_BINARY, AGENTVM_TSC_KHZ;
//! AGENTVM_TEST_CONSOLE=1 prints each guest's serial console;
//! AGENTVM_TEST_APPEND adds kernel command-line words (`loglevel=7`).

mod vm;

use std::sync::Mutex;

use agentvm::protocol::{Frame, HostMessage, Kind, Reply};
use agentvm_test_support as common;
use serde::de::DeserializeOwned;
use vm::Vm;

static ONE_VM_AT_A_TIME: Mutex<()> = Mutex::new(());

macro_rules! boot {
    () => {{
        let assets = match vm::assets() {
            Ok(a) => a,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        let guard = ONE_VM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        (Vm::boot(&assets), guard)
    }};
}

fn created_pid(vm: &Vm, reply: Reply) -> i32 {
    match reply {
        Reply::Created { pid } | Reply::Started { pid } if pid > 1 => pid,
        other => vm.fail(&format!("expected Created/Started, got {other:?}")),
    }
}

fn expect_ok(vm: &Vm, reply: Reply) {
    if reply != Reply::Ok {
        vm.fail(&format!("expected Ok, got {reply:?}"));
    }
}

/// The typed OCI value (`Spec`, `Process`) a request carries, from the
/// JSON the tests write and edit.
fn typed<T: DeserializeOwned>(json: serde_json::Value) -> Box<T> {
    match serde_json::from_value(json) {
        Ok(v) => Box::new(v),
        Err(e) => panic!("not a valid {}: {e}", std::any::type_name::<T>()),
    }
}

fn exec_process(args: &[&str]) -> serde_json::Value {
    let mut p = vm::spec(args)["process"].clone();
    p["noNewPrivileges"] = serde_json::Value::Bool(false);
    p
}

/// Create, Start, the workload's output over the port, Exit{0, 0}, files
/// written through virtio-fs, then Shutdown ends QEMU cleanly.
#[test]
fn echo_hello_reaches_the_host_and_exits_zero() {
    let (mut vm, _guard) = boot!();
    let spec = vm::spec(&[
        "sh",
        "-c",
        "echo hello; hostname; echo written-in-guest > /tmp/from-guest",
    ]);
    let reply = vm.request(&HostMessage::Create { spec: typed(spec) });
    let created_at = vm.started.elapsed();
    created_pid(&vm, reply);
    let reply = vm.request(&HostMessage::Start);
    let started_at = vm.started.elapsed();
    expect_ok(&vm, reply);
    let status = vm.wait_exit(0);
    let first_output = vm.first_output_at;
    let exited_at = vm.started.elapsed();
    assert_eq!(status, 0, "stderr: {}", vm.output(0, Kind::Stderr));
    assert_eq!(vm.output(0, Kind::Stdout), "hello\nguest-test\n");
    let written = std::fs::read_to_string(vm.dir.path().join("share/rootfs/tmp/from-guest"))
        .expect("the guest's file on the host");
    assert_eq!(written, "written-in-guest\n");
    let reply = vm.request(&HostMessage::Shutdown);
    expect_ok(&vm, reply);
    let status = vm.wait_qemu();
    assert!(status.success(), "QEMU ended with {status}");
    eprintln!(
        "timing (TCG) from QEMU start: Hello {:?}, Created {created_at:?}, Start done \
         {started_at:?}, first output {first_output:?}, Exit {exited_at:?}",
        vm.hello_at
    );
}

/// While the init (a shell trapping SIGTERM, looping on `sleep`) runs:
/// execs with stdout/stderr and exit codes, another user, stdin, a
/// terminal with resize, SIGKILL of an exec, Ps, Stats; then SIGTERM to the
/// init runs its trap, which exits 42.
#[test]
fn exec_signal_and_exit_codes_while_the_init_runs() {
    let (mut vm, _guard) = boot!();
    let init = "trap 'echo got-term; exit 42' TERM; echo ready; while true; do sleep 0.2; done";
    let reply = vm.request(&HostMessage::Create {
        spec: typed(vm::spec(&["sh", "-c", init])),
    });
    let init_pid = created_pid(&vm, reply);
    let reply = vm.request(&HostMessage::Start);
    expect_ok(&vm, reply);
    vm.wait_stdout(0, "ready");

    let process = exec_process(&["sh", "-c", "echo from-exec; echo to-stderr >&2; exit 7"]);
    let reply = vm.request(&HostMessage::Exec {
        id: 1,
        process: typed(process),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    assert_eq!(vm.wait_exit(1), 7);
    assert_eq!(vm.output(1, Kind::Stdout), "from-exec\n");
    assert_eq!(vm.output(1, Kind::Stderr), "to-stderr\n");

    let mut process = exec_process(&["id", "-u"]);
    process["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    let reply = vm.request(&HostMessage::Exec {
        id: 2,
        process: typed(process),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    assert_eq!(vm.wait_exit(2), 0);
    assert_eq!(vm.output(2, Kind::Stdout), "1000\n");

    let reply = vm.request(&HostMessage::Exec {
        id: 3,
        process: typed(exec_process(&["cat"])),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    vm.stdin(3, b"ping\n");
    vm.send_frame(&Frame::data(Kind::StdinClose, 3, b""));
    assert_eq!(vm.wait_exit(3), 0);
    assert_eq!(vm.output(3, Kind::Stdout), "ping\n");

    let mut process = exec_process(&["sh", "-c", "read line; stty size; echo tty:$line"]);
    process["terminal"] = serde_json::Value::Bool(true);
    let reply = vm.request(&HostMessage::Exec {
        id: 4,
        process: typed(process),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    let reply = vm.request(&HostMessage::Resize {
        id: 4,
        rows: 33,
        cols: 77,
    });
    expect_ok(&vm, reply);
    vm.stdin(4, b"go\n");
    assert_eq!(vm.wait_exit(4), 0);
    let tty = vm.output(4, Kind::Stdout);
    assert!(
        tty.contains("33 77\r\n") && tty.contains("tty:go"),
        "{tty:?}"
    );

    // More output than a pipe, a port write and a frame hold.
    let reply = vm.request(&HostMessage::Exec {
        id: 6,
        process: typed(exec_process(&[
            "sh",
            "-c",
            "yes 0123456789abcdef | head -c 3000000",
        ])),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    assert_eq!(vm.wait_exit(6), 0);
    let big = vm.output(6, Kind::Stdout);
    assert_eq!(big.len(), 3_000_000);
    assert!(big.starts_with("0123456789abcdef\n0123"));

    // A background child keeps stdout open: Exit still comes.
    let reply = vm.request(&HostMessage::Exec {
        id: 7,
        process: typed(exec_process(&["sh", "-c", "sleep 1000 & echo bg-started"])),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    assert_eq!(vm.wait_exit(7), 0);
    assert_eq!(vm.output(7, Kind::Stdout), "bg-started\n");

    let reply = vm.request(&HostMessage::Exec {
        id: 5,
        process: typed(exec_process(&["sleep", "1000"])),
        cgroup: Vec::new(),
    });
    let sleep_pid = created_pid(&vm, reply);
    match vm.request(&HostMessage::Ps) {
        Reply::Pids { pids, .. } => {
            assert!(
                pids.contains(&init_pid) && pids.contains(&sleep_pid),
                "{pids:?}"
            );
        }
        other => vm.fail(&format!("Ps: {other:?}")),
    }
    match vm.request(&HostMessage::Stats) {
        Reply::Stats { stats, .. } => {
            assert!(stats.memory_total_bytes > 64 << 20, "{stats:?}");
            assert!(stats.memory_available_bytes > 0, "{stats:?}");
            assert!(stats.memory_usage_bytes > 0, "{stats:?}");
            assert!(stats.cpu_usage_ns > 0, "{stats:?}");
            assert!(stats.pids >= 2, "{stats:?}");
        }
        other => vm.fail(&format!("Stats: {other:?}")),
    }
    let reply = vm.request(&HostMessage::Signal {
        id: 5,
        signal: 9,
        all: false,
    });
    expect_ok(&vm, reply);
    assert_eq!(vm.wait_exit(5), 128 + 9);

    let reply = vm.request(&HostMessage::Signal {
        id: 0,
        signal: 15,
        all: false,
    });
    expect_ok(&vm, reply);
    assert_eq!(vm.wait_exit(0), 42);
    assert!(vm.output(0, Kind::Stdout).contains("got-term"));
    match vm.request(&HostMessage::Signal {
        id: 0,
        signal: 15,
        all: false,
    }) {
        Reply::Error { message } => assert!(message.contains("not running"), "{message}"),
        other => vm.fail(&format!("signal after exit: {other:?}")),
    }
    let reply = vm.request(&HostMessage::Shutdown);
    expect_ok(&vm, reply);
    assert!(vm.wait_qemu().success());
}

/// Bad requests get Reply::Error and the agent keeps serving; bytes that
/// are not a frame at all end the VM cleanly (Log first, then QEMU exits
/// 0), because the stream cannot be resynchronised.
#[test]
fn bad_requests_are_errors_and_garbage_ends_the_vm_cleanly() {
    let (mut vm, _guard) = boot!();
    for payload in [&b"{nonsense"[..], br#"{"type":"reboot_host"}"#, b"\xff\x00"] {
        vm.send_frame(&Frame {
            kind: Kind::Control,
            stream: 0,
            payload: payload.to_vec(),
        });
        match vm.reply() {
            Reply::Error { message } => assert!(message.contains("malformed"), "{message}"),
            other => vm.fail(&format!("malformed request: {other:?}")),
        }
    }
    let reply = vm.request(&HostMessage::Exec {
        id: 0,
        process: typed(exec_process(&["true"])),
        cgroup: Vec::new(),
    });
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    let reply = vm.request(&HostMessage::Exec {
        id: 1,
        process: typed(exec_process(&[])),
        cgroup: Vec::new(),
    });
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    let reply = vm.request(&HostMessage::Signal {
        id: 9,
        signal: 99,
        all: false,
    });
    assert!(matches!(reply, Reply::Error { .. }), "{reply:?}");
    vm.stdin(77, b"to nobody");
    // Still serving.
    match vm.request(&HostMessage::Stats) {
        Reply::Stats { stats, .. } => assert!(stats.memory_total_bytes > 0),
        other => vm.fail(&format!("Stats after bad requests: {other:?}")),
    }
    assert!(
        vm.got
            .logs
            .iter()
            .any(|(l, m)| l == "warn" && m.contains("stream 77")),
        "{:?}",
        vm.got.logs
    );
    // A header announcing a 4 GiB payload of an unknown kind.
    vm.send_raw(&[0xff; 64]);
    vm.drain_until_closed();
    assert!(
        vm.got
            .logs
            .iter()
            .any(|(l, m)| l == "error" && m.contains("exceeds")),
        "{:?}",
        vm.got.logs
    );
    let status = vm.wait_qemu();
    assert!(status.success(), "QEMU ended with {status}");
}

/// A failed Create (missing executable) is an error with the container
/// tier's text and leaves nothing behind: the next Create works. A terminal
/// init gets a pty, resizes, reads stdin; `all` signals the whole
/// container; Shutdown with processes still running ends QEMU cleanly.
#[test]
fn terminal_init_signal_all_and_shutdown_with_live_processes() {
    let (mut vm, _guard) = boot!();
    match vm.request(&HostMessage::Create {
        spec: typed(vm::spec(&["/no/such/binary"])),
    }) {
        Reply::Error { message } => {
            eprintln!("create with a missing executable: {message}");
            assert!(
                message.contains("/no/such/binary")
                    && message.contains("no such file or directory"),
                "{message}"
            )
        }
        other => vm.fail(&format!("create with a missing executable: {other:?}")),
    }
    let mut spec = vm::spec(&[
        "sh",
        "-c",
        "read x; tty; stty size; echo got:$x; sleep 1000",
    ]);
    spec["process"]["terminal"] = serde_json::Value::Bool(true);
    let reply = vm.request(&HostMessage::Create { spec: typed(spec) });
    created_pid(&vm, reply);
    let reply = vm.request(&HostMessage::Start);
    expect_ok(&vm, reply);
    let reply = vm.request(&HostMessage::Resize {
        id: 0,
        rows: 40,
        cols: 100,
    });
    expect_ok(&vm, reply);
    vm.stdin(0, b"hi\n");
    vm.wait_stdout(0, "got:hi");
    let out = vm.output(0, Kind::Stdout);
    assert!(
        out.contains("/dev/pts/0") && out.contains("40 100"),
        "{out:?}"
    );
    let reply = vm.request(&HostMessage::Exec {
        id: 1,
        process: typed(exec_process(&["sleep", "1000"])),
        cgroup: Vec::new(),
    });
    created_pid(&vm, reply);
    let reply = vm.request(&HostMessage::Signal {
        id: 0,
        signal: 9,
        all: true,
    });
    expect_ok(&vm, reply);
    assert_eq!(vm.wait_exit(0), 128 + 9);
    assert_eq!(vm.wait_exit(1), 128 + 9);

    // A second container in the same VM is refused.
    let reply = vm.request(&HostMessage::Create {
        spec: typed(vm::spec(&["true"])),
    });
    assert!(
        matches!(&reply, Reply::Error { message } if message.contains("already exists")),
        "{reply:?}"
    );
    let reply = vm.request(&HostMessage::Shutdown);
    expect_ok(&vm, reply);
    assert!(vm.wait_qemu().success());
}
